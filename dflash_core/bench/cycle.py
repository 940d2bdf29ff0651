"""Per-cycle timing: what one DFlash cycle costs, split into its parts, against one plain step.

For a loaded pair (e.g. the offline default) or for random-weight models in the released Qwen3
shapes (`--synthetic SHAPE`, no download), at a fixed context:
  - draft: one drafter forward (new context of a typical accepted run + the block), LM head on the
    block slots, argmax;
  - verify: one target forward over the B block tokens, with the feature taps on;
  - bookkeeping: acceptance (`kernels.greedy_verify` + the cycle's one host sync), target cache
    crop, slicing the accepted positions' features;
  - plain: one target forward of one token plus its argmax (no taps).
The implied speedup at mean acceptance length tau is tau * t_plain / t_cycle: each cycle emits
tau tokens, plain decoding spends t_plain per token. Only times are measured here, never
acceptance (random weights and random context ids).

    python -m dflash_core.bench cycle --block-sizes 4,8,16         # the default pair, CPU
    python -m dflash_core.bench cycle --synthetic qwen3-8b --device cuda --dtype bfloat16

`--cost-profile FILE` also writes the block schedule's cost profile of the largest block
(`schedule.CostProfile`: the verify at every length, and the rest of a cycle), which
`generate --block-size auto --cost-profile FILE` then uses instead of measuring its own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ..loading.cli import load_pair_of
from ..models.config import default_target_layer_ids, parse_drafter_config
from ..models.drafter import DFlashDrafter
from ..models.target import Target, default_attention
from ..sampling import SamplingParams
from ..schedule import CostProfile, measure_costs
from ..speed import kernels
from ..speed.cpu_linear import single_row_library
from .run import add_pair_args, parse

# Target and drafter shapes of the released Qwen3 DFlash pairs (docs/design.md §3); "tiny" runs on a CPU.
SHAPES = {
    "qwen3-8b": dict(hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128,
                     vocab=151936, draft_layers=5, block=16, context=384),
    "qwen3-4b": dict(hidden=2560, intermediate=9728, layers=36, heads=32, kv_heads=8, head_dim=128,
                     vocab=151936, draft_layers=5, block=16, context=384),
    "tiny": dict(hidden=256, intermediate=768, layers=8, heads=4, kv_heads=2, head_dim=64,
                 vocab=4099, draft_layers=2, block=16, context=256),
}
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}
TAUS = (4, 6, 8)
# Per-cycle cost targets on an H200 in bf16 at Qwen3-8B shapes (docs/benchmarks.md).
TARGETS = {"draft/verify": 0.15, "bookkeeping/cycle": 0.03, "verify/plain": 1.3}
ACCEPTED_RUN = 7  # new context per cycle in steady state (a + 1 accepted positions)


def _qwen3_dict(s: dict, layers: int) -> dict:
    return dict(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=layers, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"], max_position_embeddings=8192, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )


def build_pair(shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> tuple[Target, DFlashDrafter]:
    """Random-weight target (Qwen3ForCausalLM) and drafter (DFlashDrafter) of `shape`, on `device`."""
    s = SHAPES[shape]
    torch.manual_seed(seed)
    config = Qwen3Config(**_qwen3_dict(s, s["layers"]))
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype, attn_implementation=default_attention(device))
    raw = _qwen3_dict(s, s["draft_layers"])
    raw.update(block_size=s["block"], num_target_layers=s["layers"],
               dflash_config=dict(mask_token_id=s["vocab"] - 1,
                                  target_layer_ids=default_target_layer_ids(s["layers"], s["draft_layers"])))
    with torch.device(device):
        drafter = DFlashDrafter(parse_drafter_config(raw)).to(dtype)
    # Weights at PyTorch's default init are fine for timing; keep activations bounded anyway.
    drafter.fc.weight.data.mul_(0.1)
    return Target(model.eval()), drafter.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_cycle(target: Target, drafter: DFlashDrafter, context: int, block: int, iters: int = 20,
               taus=TAUS) -> dict:
    """Median milliseconds of each part of one cycle at `block` after `context` random tokens,
    and the speedup they imply at each of `taus` (those a block of this size can reach)."""
    dev = target.device
    gen = torch.Generator().manual_seed(1)
    vocab = target.vocab_size
    prompt = torch.randint(0, vocab - 1, (1, context), generator=gen).to(dev)
    block_ids = torch.randint(0, vocab - 1, (1, block), generator=gen).to(dev)
    accepted_run = min(ACCEPTED_RUN, block)
    warmup = 3

    def timed(fn, setup=None) -> float:
        samples = []
        for i in range(warmup + iters):
            if setup is not None:
                setup()
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(samples)

    # A static cache holds only what the measurement needs: by default it would hold the model's
    # whole context, and its attention would read all of it every step.
    capacity = context + block
    # Plain decoding: no feature taps, one token after the context.
    target.reset(capacity)
    target.tap_layers(())
    target.forward(prompt, last_logits_only=True)
    one = block_ids[:, :1]

    def plain_step():
        target.crop(context)
        logits, _ = target.forward(one)
        int(logits[-1].argmax())  # plain decoding needs the token on the host too

    t_plain = timed(plain_step)

    # DFlash: taps on, prefill, then the drafter cache holds all but the last accepted run.
    target.reset(capacity)
    target.tap_layers(drafter.target_layer_ids)
    _, features = target.forward(prompt, last_logits_only=True)
    cache = drafter.new_cache()
    first_block = torch.full((1, block), drafter.mask_token_id, device=dev)
    drafter(target.embed(first_block).to(drafter.dtype), features[:, : context - accepted_run].to(drafter.dtype),
            torch.arange(0, context - accepted_run + block, device=dev)[None], cache=cache)
    base = cache.length
    new_context = features[:, context - accepted_run :].to(drafter.dtype)
    positions = torch.arange(base, context + block, device=dev)[None]
    draft_block = first_block.clone()
    draft_block[0, 0] = int(block_ids[0, 0])
    state = {}

    def draft_step():
        cache.crop(base)
        hidden = drafter(target.embed(draft_block).to(drafter.dtype), new_context, positions, cache=cache)
        drafted = drafter.draft_logits(hidden[0, 1:], target.head, anchor_ids=draft_block[0, :1])
        state["draft"], _ = drafter.propose(drafted, SamplingParams(), None, False, target.vocab_size)

    t_draft = timed(draft_step)
    t_draft_graph, graph_error = None, None
    if dev.type == "cuda":
        # Same draft step replayed from a CUDA graph: shapes and cache offset are fixed here because
        # every step starts from the same cache length (see kernels/cuda_paths.py for why decoding
        # cannot do this yet). Shows how much of t_draft is launch overhead.
        try:
            from ..speed.kernels.cuda_paths import capture_graph

            def step_from_base():
                draft_step()
                return state["draft"]

            t_draft_graph = timed(capture_graph(step_from_base))
        except Exception as exc:  # noqa: BLE001 - report, don't abort the benchmark
            graph_error = f"{type(exc).__name__}: {exc}"

    def verify_step():
        target.crop(context)
        state["logits"], state["features"] = target.forward(block_ids)

    t_verify = timed(verify_step)

    def bookkeeping():
        accepted, _bonus = kernels.greedy_verify(state["draft"], state["logits"]).tolist()
        target.crop(context + accepted + 1)
        state["context"] = state["features"][:, : accepted + 1]

    t_book = timed(bookkeeping, setup=verify_step)
    t_cycle = t_draft + t_verify + t_book
    target.reset(capacity)
    return {
        "device": str(dev), "dtype": str(target.dtype).removeprefix("torch."),
        "drafter_dtype": str(drafter.dtype).removeprefix("torch."),
        "hardware": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "kernels": kernels.describe_backend(dev),
        "cpu_single_row": single_row_library(target.model),
        "context": context, "block_size": block, "iters": iters,
        "plain_ms": t_plain, "draft_ms": t_draft, "verify_ms": t_verify, "bookkeeping_ms": t_book,
        "cycle_ms": t_cycle, "draft_cuda_graph_ms": t_draft_graph, "draft_cuda_graph_error": graph_error,
        "ratios": {"draft/verify": t_draft / t_verify, "bookkeeping/cycle": t_book / t_cycle,
                   "verify/plain": t_verify / t_plain},
        "speedup": {tau: tau * t_plain / t_cycle for tau in taus if tau <= block},
    }


def print_table(r: dict) -> None:
    name = f"synthetic {r['shape']}" if "shape" in r else r.get("target", "pair")
    one_row = f", one-row matmuls by {r['cpu_single_row']}" if r.get("cpu_single_row") else ""
    print(f"{name} on {r['hardware']} ({r['device']}, {r['dtype']}, {r['threads']} threads, kernels={r['kernels']}{one_row}), "
          f"context {r['context']}, block {r['block_size']}, median of {r['iters']}")
    print(f"  {'part':<22}{'ms':>10}{'% cycle':>10}")
    for label, key in [("draft forward", "draft_ms"), (f"verify ({r['block_size']} tokens)", "verify_ms"),
                       ("bookkeeping", "bookkeeping_ms"), ("cycle", "cycle_ms")]:
        print(f"  {label:<22}{r[key]:>10.3f}{100 * r[key] / r['cycle_ms']:>9.1f}%")
    print(f"  {'plain decoding step':<22}{r['plain_ms']:>10.3f}")
    if r.get("draft_cuda_graph_ms") is not None:
        print(f"  {'draft, CUDA graph':<22}{r['draft_cuda_graph_ms']:>10.3f}   (fixed shapes; not used by decoding)")
    elif r.get("draft_cuda_graph_error"):
        print(f"  draft CUDA graph failed: {r['draft_cuda_graph_error']}")
    for ratio, value in r["ratios"].items():
        # The cycle's cost targets (TARGETS) are for the released shapes on an H200; other pairs just get the ratio.
        verdict = f"   (target <= {TARGETS[ratio]}: {'met' if value <= TARGETS[ratio] else 'missed'})" if "shape" in r else ""
        print(f"  {ratio:<22}{value:>10.3f}{verdict}")
    print("  implied speedup: " + ", ".join(f"tau={tau}: {x:.2f}x" for tau, x in r["speedup"].items()))


def cycle_times(args, pair) -> dict:
    """`time_cycle` for the loaded (target, drafter) at each block size; prints one table per size."""
    target, drafter = pair
    result = {"target": str(args.target), "drafter": str(args.drafter), "per_block_size": {}}
    for b in args.block_sizes or [drafter.block_size]:
        r = time_cycle(target, drafter, args.context, b, taus=(2, 3, 4, 6, 8, 12, 16))
        print_table({"target": result["target"], **r})
        result["per_block_size"][b] = r
    return result


def write_profile(target: Target, drafter: DFlashDrafter, timed: dict, path: str) -> CostProfile:
    """The cost profile of `timed` (one `time_cycle` result), written to `path` as JSON."""
    target.tap_layers(drafter.target_layer_ids)
    verify_s = measure_costs(target, timed["block_size"], timed["context"]).verify_s
    target.reset()
    profile = CostProfile(verify_s, (timed["draft_ms"] + timed["bookkeeping_ms"]) / 1000, timed["draft_ms"] / 1000)
    with open(path, "w") as f:
        json.dump(profile.to_dict(), f)
    return profile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_core.bench cycle", description=__doc__.splitlines()[0])
    add_pair_args(parser)
    parser.add_argument("--context", type=int, default=200, help="context length before the timed cycle")
    parser.add_argument("--synthetic", metavar="SHAPE", choices=sorted(SHAPES),
                        help="time random-weight models of this shape instead of the pair (qwen3-8b, qwen3-4b, tiny)")
    parser.add_argument("--cost-profile", metavar="FILE",
                        help="also write the block schedule's cost profile of the largest block here (JSON)")
    args = parse(parser, argv)
    if args.synthetic:
        s = SHAPES[args.synthetic]
        pair = build_pair(args.synthetic, args.device, DTYPES[args.dtype])
        result = {"shape": args.synthetic, **time_cycle(*pair, s["context"], s["block"])}
        print_table(result)
        timed = result
    else:
        pair = load_pair_of(args)
        pair = (pair.target, pair.drafter)
        result = cycle_times(args, pair)
        timed = result["per_block_size"][max(result["per_block_size"])]
    if args.cost_profile:
        profile = write_profile(*pair, timed, args.cost_profile)
        result["cost_profile"] = profile.to_dict()
    print(json.dumps(result))
    return 0
