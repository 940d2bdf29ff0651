"""One prepared device check: what a user with an H200 and the released Qwen3 drafters meets, in one call.

    python -u scripts/gpu_check.py --shape qwen3-8b --device cuda --out $OUT     # the device, < 9 min
    python -u scripts/gpu_check.py --shape qwen3.5-9b --device cuda --out $OUT   # the hybrid, < 9 min
    python scripts/gpu_check.py --shape tiny --device cpu --out DIR             # CPU dry run (test suite)
    python scripts/gpu_check.py --shape tiny-hybrid --device cpu --out DIR      # the hybrid's dry run

Writes DIR/gpu_check.json after every part (so a part that fails or overruns still leaves the
others' results) and exits 0 when every part passed or was skipped as not applicable. Each part
runs under a hard time budget (SIGALRM), and all of them under one deadline. Parts:

- environment: versions, GPU, attention backends (flash-attn probed), kernel mode, compilers;
- golden: the reference traces (tests/golden) reproduced in float32 on the device, kernels on and off;
- kernels: the Triton kernels against their PyTorch references on the device (CUDA only);
- hub_load: a random target and a DFlash drafter in the exact shapes of Qwen3-8B and its released
  drafter (or of Qwen3.5-9B, a gated delta-net hybrid, and a drafter of the same build), written in
  the released formats into a fake offline Hub cache and loaded by Hub id through the app's
  `PairCache` (dtype "auto", the pair's chat template arguments);
- exactness: an oracle drafter (`dflash_core/diagnostics/oracle.py`) proposes plain decoding's continuation
  with slots corrupted on a fixed schedule; in float32 the output must equal plain decoding and
  the acceptance lengths the schedule, kernels on and off, greedy and top-k-1 sampling (both draft
  modes), dynamic and static KV cache (a hybrid must refuse the static one: it rolls back on the
  dynamic cache only); seeded sampling must repeat itself;
- speed: bf16 plain decoding against DFlash with the oracle at tau 4, 6.5 and 8 (speedup, speedup
  over tau, per-cycle draft/verify/bookkeeping from the engine's CUDA-event timings, host syncs per
  cycle, peak memory), the three-way lossless verdict of each run, and `bench.cycle.time_cycle`'s
  split of one cycle against one plain step with its cost targets (the static cache's run:
  not for a hybrid);
- cuda_graphs: the speed part's plain and oracle runs on the static KV cache with CUDA graphs off
  and on (`dflash_core/speed/cuda_graphs.py`): tokens/s, per-cycle draft/verify, host syncs, outputs
  identical either way, a tree of 8 drafts from the pair's drafter decoded identically either way
  and lossless, and no failed capture (CUDA only, not for a hybrid);
- race: the app's race path without the web server (`app.race.interleave`, `app.race.report`, the lossless check);
- datasets: the paper's table (`python -m dflash_core.bench --dataset`, `dflash_core/bench/paper_table.py`)
  on a few samples of each reference-benchmark dataset the machine reaches (the Hub or its datasets
  cache, with the environment this script was started with), each one it cannot reach named with
  why; the datasets it cannot reach are raced on the test fixtures' rows instead (tests/fixtures/
  datasets), so the table's code still runs on the device. The pair is the released Qwen3-8B one
  when `--shape qwen3-8b` and both are in the Hub cache, else the hub_load part's random pair;
- kernel_tests: tests/test_kernels*.py under pytest on the device, with whatever time is left.

Imports only torch, transformers, triton, huggingface_hub and this repository (and, for the datasets
part, Hugging Face datasets where it is installed: requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_ID = "gpu-check/target"
DRAFTER_ID = "gpu-check/drafter"
PROMPT = "Write a quicksort in Python."
SCHEDULE = [1, 16, 3, 9, 2, 16, 5, 12, 7, 16, 4, 11]  # acceptance lengths per cycle, repeated
TAUS = (4, 6.5, 8)
TREE_BUDGET = 8  # the cuda_graphs part's tree run: 8 draft nodes, verified as one captured step
# The paper's pair, raced by the datasets part when both are already in the Hub cache.
RELEASED_PAIR = ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16")
FIXTURES = ROOT / "tests" / "fixtures" / "datasets"
# Samples per dataset (MT-Bench's are two turns each): on the device, and at the tiny shapes on a CPU.
DATASET_SAMPLES = (2, 1)
# Per part: seconds allowed at the released shapes (one H200) and at the tiny shape (a CPU, where a
# busy CI box may run the few seconds of work ten times slower).
BUDGETS = {
    "environment": (40, 60), "golden": (60, 90), "kernels": (60, 10), "hub_load": (170, 90),
    "exactness": (130, 120), "speed": (120, 120), "cuda_graphs": (100, 10), "race": (45, 60),
    "datasets": (150, 120), "kernel_tests": (150, 10),
}
# Tokens per run at each shape: (exactness, speed).
TOKENS = {"qwen3-8b": (96, 128), "qwen3-4b": (96, 128), "tiny": (32, 24), "qwen3.5-9b": (96, 128),
          "tiny-hybrid": (32, 24)}
# Gated delta-net hybrids (transformers' Qwen3_5ForCausalLM: three linear-attention layers to each
# full-attention one), beside the Qwen3 shapes of `dflash_core.bench.cycle.SHAPES`. Their drafter
# is the Qwen3-8B drafter's build at the target's hidden size: `drafter` overrides the target's
# attention shape for it.
HYBRID_SHAPES = {
    "qwen3.5-9b": dict(hidden=4096, intermediate=12288, layers=32, heads=16, kv_heads=4, head_dim=256,
                       linear_key_heads=16, linear_value_heads=32, linear_head_dim=128, vocab=248320,
                       drafter=dict(heads=32, kv_heads=8, head_dim=128), draft_layers=5, block=16, context=384),
    "tiny-hybrid": dict(hidden=256, intermediate=768, layers=8, heads=4, kv_heads=2, head_dim=64,
                        linear_key_heads=2, linear_value_heads=4, linear_head_dim=32, vocab=4099,
                        drafter=dict(heads=4, kv_heads=2, head_dim=64), draft_layers=2, block=16, context=256),
}


class PartTimeout(Exception):
    pass


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("qwen3-8b", "qwen3-4b", "tiny", *HYBRID_SHAPES), default="qwen3-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    parser.add_argument("--work", help="scratch directory for the fake Hub cache (default: a new temp dir)")
    parser.add_argument("--deadline", type=float, help="seconds for the whole run (default: 520 on CUDA, 480 on CPU)")
    parser.add_argument("--parts", help="comma-separated subset of parts to run")
    return parser.parse_args(argv)


# --- the fake Hub --------------------------------------------------------------------------------
def hub_snapshot(cache: Path, repo_id: str) -> Path:
    """The snapshot folder of `repo_id` in a Hub cache laid out as huggingface_hub writes it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def shape_spec(shape: str) -> dict:
    """The sizes of `shape`: a hybrid's here, a Qwen3 one's from `dflash_core.bench.cycle.SHAPES`."""
    from dflash_core.bench.cycle import SHAPES

    return HYBRID_SHAPES.get(shape) or SHAPES[shape]


def random_target(shape: str, device: str):
    """A random bf16 target of `shape`: Qwen3ForCausalLM, or Qwen3_5ForCausalLM for a hybrid."""
    import torch

    from dflash_core.bench.cycle import _qwen3_dict

    s = shape_spec(shape)
    if shape not in HYBRID_SHAPES:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        with torch.device(device):  # initialised where it is fast; saved from there
            return Qwen3ForCausalLM._from_config(Qwen3Config(**_qwen3_dict(s, s["layers"])), dtype=torch.bfloat16)
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"], linear_num_key_heads=s["linear_key_heads"],
        linear_num_value_heads=s["linear_value_heads"], linear_key_head_dim=s["linear_head_dim"],
        linear_value_head_dim=s["linear_head_dim"], max_position_embeddings=8192, tie_word_embeddings=False,
    )
    with torch.device(device):
        target = Qwen3_5ForCausalLM._from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for module in target.modules():
            if type(module).__name__.endswith("GatedDeltaNet"):
                # Random initialisation draws most decay rates so high that the state forgets within a
                # token; A = e^-4 keeps most of it, so a rejected draft left behind changes the output.
                module.A_log.fill_(-4.0)
    return target


def write_fake_hub(cache: Path, shape: str, device: str) -> dict:
    """Random target (`random_target`) and drafter of `shape`, saved by Hub id into `cache`."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import THINKING_CHATML, build_tokenizer  # a Qwen3-style template with enable_thinking

    from dflash_core.bench.cycle import _qwen3_dict
    from dflash_core.models.config import default_target_layer_ids, parse_drafter_config
    from dflash_core.models.drafter import DFlashDrafter

    s = shape_spec(shape)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    target = random_target(shape, device)
    target_dir = hub_snapshot(cache, TARGET_ID)
    target.save_pretrained(target_dir)
    build_tokenizer(chat_template=THINKING_CHATML).save_pretrained(target_dir)
    del target
    raw = _qwen3_dict({**s, **s.get("drafter", {})}, s["draft_layers"])
    raw.update(block_size=s["block"], num_target_layers=s["layers"],
               dflash_config=dict(mask_token_id=s["vocab"] - 1,
                                  target_layer_ids=default_target_layer_ids(s["layers"], s["draft_layers"])))
    with torch.device(device):
        drafter = DFlashDrafter(parse_drafter_config(raw))
    drafter.save_pretrained(hub_snapshot(cache, DRAFTER_ID), dtype=torch.bfloat16)
    del drafter
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    sizes = {repo: sum(f.stat().st_size for f in hub_snapshot(cache, repo).glob("*.safetensors"))
             for repo in (TARGET_ID, DRAFTER_ID)}
    return {"write_s": round(time.perf_counter() - t0, 1), "bytes": sizes}


# --- parts ---------------------------------------------------------------------------------------
def part_environment(state) -> dict:
    import huggingface_hub
    import torch
    import transformers

    from dflash_core.speed import kernels
    from dflash_core.speed.fallbacks import attention_report

    device = state["device"]
    info = {
        "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "huggingface_hub": huggingface_hub.__version__,
        "kernel_mode": kernels.mode(), "kernels": kernels.describe_backend(device),
        "attention_bf16": attention_report(device, torch.bfloat16),
        "attention_fp32": attention_report(device, torch.float32),
        "compilers": {name: shutil.which(name) for name in ("cc", "gcc", "nvcc", "ptxas")},
    }
    try:
        import triton

        info["triton"] = triton.__version__
        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        info["compilers"]["triton ptxas"] = str(bundled) if bundled.exists() else None
    except ImportError:
        info["triton"] = None
    if device.startswith("cuda"):
        dev = torch.device(device)
        props = torch.cuda.get_device_properties(dev)
        info["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "capability": f"{props.major}.{props.minor}", "count": torch.cuda.device_count()}
    return info


def part_golden(state) -> dict:
    import torch

    from dflash_core import DFlashDrafter, Target, run

    golden = ROOT / "tests" / "golden" / "zlab-tiny-a"
    expected = json.loads((golden / "expected.json").read_text())
    device = state["device"]
    target = Target.from_pretrained(golden / "target", device=device, dtype=torch.float32)
    drafter = DFlashDrafter.from_pretrained(golden / "drafter", device=device, dtype=torch.float32)
    result, ok = {}, True
    # On CPU "auto" is the PyTorch references already: one pass says it all.
    for mode in ("auto", "torch") if device.startswith("cuda") else ("auto",):
        os.environ["DFLASH_KERNELS"] = mode
        same = differ = 0
        for p in expected["prompts"]:
            plain = run(target, p["prompt_ids"], max_new_tokens=expected["max_new_tokens"])
            checks = [list(plain.output_ids) == p["target_greedy_ids"]]
            for r in p["runs"]:
                s = run(target, p["prompt_ids"], drafter, max_new_tokens=expected["max_new_tokens"],
                        block_size=r["block_size"])
                checks.append(list(s.output_ids) == r["output_ids"] and s.acceptance_lengths == r["acceptance_lengths"])
            same, differ = same + sum(checks), differ + len(checks) - sum(checks)
        result[f"kernels={mode}"] = {"equal_to_reference": same, "different": differ}
        ok = ok and differ == 0
    os.environ.pop("DFLASH_KERNELS", None)
    return {**result, "status": "passed" if ok else "failed"}


def part_kernels(state) -> dict:
    """Triton against the PyTorch references, on the device (CUDA only)."""
    import torch

    from dflash_core.speed import kernels
    from dflash_core.speed.kernels import kv_injection, verify

    device = state["device"]
    if not device.startswith("cuda"):
        return {"status": "skipped", "why": "the Triton kernels run on CUDA; on CPU the test suite runs them interpreted"}
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    worst, checks = {}, []
    for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        b, n, heads, dim, cap, offset = 1, 23, 8, 128, 64, 9
        k = torch.randn(b, n, heads, dim, device=dev, generator=gen).to(dtype)
        v = torch.randn(b, n, heads, dim, device=dev, generator=gen).to(dtype)
        w = torch.randn(dim, device=dev, generator=gen).to(dtype)
        angles = torch.randn(b, n, dim // 2, device=dev, generator=gen)
        cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
        outs = []
        for fn, work_dtype in ((kv_injection.inject_kv_triton, dtype), (kv_injection.inject_kv_reference, torch.float32)):
            ck = torch.zeros(b, heads, cap, dim, device=dev, dtype=work_dtype)
            cv = torch.zeros_like(ck)
            args = [t.to(work_dtype) for t in (k, v, w)]
            fn(args[0], args[1], args[2], 1e-6, cos.to(work_dtype), sin.to(work_dtype), ck, cv, offset)
            outs.append((ck.float(), cv.float()))
        err = max(float((outs[0][i] - outs[1][i]).abs().max()) for i in (0, 1))
        worst[f"kv_injection {dtype}"] = err
        checks.append(err <= bound)
        logits = torch.randn(16, 151936, device=dev, generator=gen).to(dtype)
        choice = logits.argmax(-1)
        for accepted in (0, 7, 15):
            draft = choice[:15].clone()
            if accepted < 15:
                draft[accepted] = (draft[accepted] + 1) % logits.shape[1]
            got = verify.verify_triton(draft, logits).tolist()
            want = verify.greedy_verify_reference(draft, logits).tolist()
            checks.append(got == want == [accepted, int(choice[accepted])])
    return {"max_abs_error": worst, "checks_passed": sum(checks), "checks": len(checks),
            "backend": kernels.describe_backend(dev), "status": "passed" if all(checks) and not kernels.BROKEN else "failed"}


def part_hub_load(state) -> dict:
    import torch

    from app.pairs.models import PairCache
    from app.pairs.registry import PairSpec

    device = state["device"]
    written = write_fake_hub(state["hub"], state["shape"], device)
    spec = PairSpec(id="gpu-check", label=f"{state['shape']} random pair (fake Hub)", target=TARGET_ID,
                    drafter=DRAFTER_ID, needs_gpu=device.startswith("cuda"), dtype="auto",
                    chat_template_args={"enable_thinking": False})
    progress = []
    cache = PairCache(device)
    t0 = time.perf_counter()
    pair = cache.get(spec, progress=progress.append)
    state["pair"] = pair
    prompt = pair.encode(PROMPT)
    state["prompt_ids"] = prompt
    text = pair.tokenizer.decode(prompt)
    expect_dtype = torch.bfloat16 if device.startswith("cuda") else pair.target.dtype
    ok = pair.target.dtype == expect_dtype and text.endswith("<think>\n\n</think>\n\n")
    return {
        **written, "load_s": round(time.perf_counter() - t0, 1), "target_dtype": str(pair.target.dtype),
        "drafter_dtype": str(pair.drafter.dtype), "chat_template": pair.chat_template,
        "progress_reports": len(progress), "layers": pair.target.num_layers, "vocab": pair.target.vocab_size,
        "cache_layers": dict(Counter(pair.target.kv.kinds)),
        "status": "passed" if ok else "failed",
    }


def _oracle_runs(target, drafter, prompt, plan, n, schedule, kernels_mode, **kwargs):
    from dflash_core import run
    from dflash_core.diagnostics.oracle import OracleDrafter, expected_lengths

    os.environ["DFLASH_KERNELS"] = kernels_mode
    try:
        oracle = OracleDrafter(drafter, plan, schedule, target.vocab_size)
        s = run(target, prompt, oracle, max_new_tokens=n, **kwargs)
    finally:
        os.environ.pop("DFLASH_KERNELS", None)
    return s, expected_lengths(schedule, drafter.block_size, len(s.blocks))


def part_exactness(state) -> dict:
    from dflash_core import SamplingParams, Target, load_pair, run
    from dflash_core.errors import ConfigError
    from dflash_core.lossless import compare

    device, n = state["device"], TOKENS[state["shape"]][0]
    fp32 = load_pair(TARGET_ID, DRAFTER_ID, device=device, dtype="float32")
    target, drafter, prompt = fp32.target, fp32.drafter, state["prompt_ids"]
    b = drafter.block_size
    plan = list(run(target, prompt, None, max_new_tokens=n + b).output_ids)
    checks = state["measured"].setdefault("checks", {})  # kept if a later check raises
    greedy = {}
    for mode in ("auto", "torch"):
        s, lengths = _oracle_runs(target, drafter, prompt, plan, n, SCHEDULE, mode)
        greedy[mode] = s
        checks[f"greedy kernels={mode}"] = list(s.output_ids) == plan[:n] and s.acceptance_lengths == lengths
    if state["shape"] in HYBRID_SHAPES:
        try:
            Target(target.model, static_cache=True)
            refused = ""
        except ConfigError as exc:
            refused = str(exc)
        checks["static KV cache refused, the dynamic one used"] = "Use the dynamic cache" in refused
    else:
        static = Target(target.model, static_cache=True)  # the preallocated cache, same weights
        s, lengths = _oracle_runs(static, drafter, prompt, plan, n, SCHEDULE, "auto")
        checks["greedy, static KV cache"] = list(s.output_ids) == plan[:n] and s.acceptance_lengths == lengths
    checks["lossless verdict identical"] = compare(target, prompt, greedy["auto"].output_ids, plan[:n]).kind == "identical"
    point_mass = SamplingParams(temperature=0.7, top_k=1, seed=11)  # the sampled paths, with a known answer
    for draft_mode in ("sample", "argmax"):
        s, lengths = _oracle_runs(target, drafter, prompt, plan, n, SCHEDULE, "auto", sampling=point_mass,
                                  draft_mode=draft_mode)
        checks[f"top-k 1 sampling, {draft_mode} drafts"] = list(s.output_ids) == plan[:n] and s.acceptance_lengths == lengths
    seeded = SamplingParams(temperature=1.0, seed=5)
    runs = [_oracle_runs(target, drafter, prompt, plan, n, SCHEDULE, mode, sampling=seeded)[0] for mode in ("auto", "torch")]
    checks["seeded sampling repeats, kernels on/off"] = runs[0].output_ids == runs[1].output_ids
    plains = [run(target, prompt, None, max_new_tokens=n, sampling=seeded).output_ids for _ in range(2)]
    checks["seeded plain sampling repeats"] = plains[0] == plains[1]
    del fp32, target
    _free(device)
    return {"tokens": n, "schedule": SCHEDULE, "checks": checks, "greedy_tau": greedy["auto"].tau,
            "seeded_tau": runs[0].tau, "status": "passed" if all(checks.values()) else "failed"}


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _decode_rate(summary) -> float:
    """Tokens per second after the first (prefill excluded: both sides pay the same prefill)."""
    seconds = summary.total_s - summary.prefill.seconds
    return (len(summary.output_ids) - 1) / seconds if seconds > 0 else 0.0


def part_speed(state) -> dict:
    import torch

    from dflash_core import Block, Target, generate, run
    from dflash_core.bench.cycle import TARGETS, time_cycle
    from dflash_core.diagnostics.oracle import OracleDrafter, schedule_for_tau
    from dflash_core.diagnostics.syncs import SyncCounter, host_reads_per_cycle
    from dflash_core.lossless import compare

    device, n = state["device"], TOKENS[state["shape"]][1]
    pair, prompt = state["pair"], state["prompt_ids"]
    target, drafter = pair.target, pair.drafter
    b = drafter.block_size
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    run(target, prompt, None, max_new_tokens=8)  # warm-up outside the clock
    plain = run(target, prompt, None, max_new_tokens=n + b)
    plan = list(plain.output_ids)
    plain_rate = _decode_rate(plain)
    sync_bound, sync_path = host_reads_per_cycle(target)
    result = state["measured"]  # kept if a later run raises
    result.update({"tokens": n, "dtype": str(target.dtype), "plain_tok_s": plain_rate,
                   "plain_step_ms": 1000 / plain_rate if plain_rate else None,
                   "syncs_allowed_per_cycle": sync_bound, "sync_path": sync_path, "oracle": {}})
    ok = True
    for tau in TAUS:
        schedule = schedule_for_tau(tau, b)
        oracle = OracleDrafter(drafter, plan, schedule, target.vocab_size)
        run(target, prompt, oracle, max_new_tokens=8)  # warm-up
        s = run(target, prompt, oracle, max_new_tokens=n)
        cycles = len(s.blocks)
        cycle_s = (s.total_s - s.prefill.seconds) / cycles
        draft_s, verify_s = s.draft_s / cycles, s.verify_s / cycles
        with SyncCounter() as counter:
            syncs = []
            for event in generate(target, prompt, oracle, max_new_tokens=n):
                count = counter.take()
                if isinstance(event, Block):
                    syncs.append(count)
        verdict = compare(target, prompt, s.output_ids, plan[: len(s.output_ids)])
        rate = _decode_rate(s)
        result["oracle"][str(tau)] = {
            "schedule": schedule, "tau": s.tau, "tok_s": rate, "speedup": rate / plain_rate,
            "speedup_over_tau": rate / plain_rate / s.tau, "cycle_ms": 1000 * cycle_s,
            "draft_ms": 1000 * draft_s, "verify_ms": 1000 * verify_s,
            "bookkeeping_ms": 1000 * (cycle_s - draft_s - verify_s),
            "draft/verify": draft_s / verify_s, "verify/plain_step": verify_s * plain_rate,
            "bookkeeping/cycle": (cycle_s - draft_s - verify_s) / cycle_s,
            "max_syncs_per_cycle": max(syncs), "lossless": verdict.to_dict(),
        }
        ok = ok and max(syncs) <= sync_bound and verdict.kind != "diverged"
    split = time_cycle(target, drafter, shape_spec(state["shape"])["context"], b, iters=10 if cuda else 3, taus=TAUS)
    result["cycle_split"] = {k: split[k] for k in ("plain_ms", "draft_ms", "verify_ms", "bookkeeping_ms", "cycle_ms",
                                                   "ratios", "speedup", "draft_cuda_graph_ms", "kernels")}
    result["targets"] = {ratio: {"value": split["ratios"][ratio], "target": bound, "met": split["ratios"][ratio] <= bound}
                         for ratio, bound in TARGETS.items()}
    six = result["oracle"]["6.5"]["speedup_over_tau"]
    result["targets"]["speedup/tau at tau 6.5"] = {"value": six, "target": 0.8, "met": six >= 0.8}
    # Last: the static cache is the newest path, and a failure here keeps the figures above.
    if state["shape"] in HYBRID_SHAPES:
        result["static_cache_tau_6.5"] = {"skipped": "a hybrid rolls back on the dynamic cache only"}
    else:
        static = Target(target.model, static_cache=True)
        oracle = OracleDrafter(drafter, plan, schedule_for_tau(6.5, b), target.vocab_size)
        run(static, prompt, oracle, max_new_tokens=8)
        s = run(static, prompt, oracle, max_new_tokens=n)
        result["static_cache_tau_6.5"] = {"tau": s.tau, "tok_s": _decode_rate(s),
                                          "speedup": _decode_rate(s) / plain_rate}
    if cuda:
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(torch.device(device)) / 2**30
    return {**result, "status": "passed" if ok else "failed"}


def part_cuda_graphs(state) -> dict:
    """The speed part's runs on the static KV cache, CUDA graphs off and on (CUDA only)."""
    if not state["device"].startswith("cuda"):
        return {"status": "skipped", "why": "CUDA graphs need CUDA; tests/test_cuda_graphs.py checks their logic "
                                            "on CPU through a fake graph backend"}
    if state["shape"] in HYBRID_SHAPES:
        return {"status": "skipped", "why": "CUDA graphs need the static KV cache, and a hybrid rolls back on the "
                                            "dynamic cache only"}
    from dflash_core import Block, Target, generate, run
    from dflash_core.decoding import TREE_METHODS
    from dflash_core.diagnostics.oracle import OracleDrafter, expected_lengths, schedule_for_tau
    from dflash_core.diagnostics.syncs import SyncCounter
    from dflash_core.lossless import compare
    from dflash_core.models.drafter import method_name
    from dflash_core.speed.fallbacks import NOTICES

    n = TOKENS[state["shape"]][1]
    pair, prompt = state["pair"], state["prompt_ids"]
    drafter, b = pair.drafter, pair.drafter.block_size
    seen = len(NOTICES)
    targets = {mode: Target(pair.target.model, static_cache=True, cuda_graphs=mode == "on") for mode in ("off", "on")}
    result, plans, ok = state["measured"], {}, True  # kept if a later run raises
    result.update({"tokens": n, "plain_tok_s": {}, "oracle": {}})
    for mode, target in targets.items():
        run(target, prompt, None, max_new_tokens=8)  # warm-up; with graphs, the one-token verify's capture
        plain = run(target, prompt, None, max_new_tokens=n + b)
        plans[mode], result["plain_tok_s"][mode] = list(plain.output_ids), _decode_rate(plain)
    checks = {"plain outputs identical": plans["on"] == plans["off"]}
    plan = plans["off"]
    for tau in TAUS:
        schedule = schedule_for_tau(tau, b)
        row, runs = {}, {}
        for mode, target in targets.items():
            oracle = OracleDrafter(drafter, plan, schedule, target.vocab_size)
            run(target, prompt, oracle, max_new_tokens=8)  # warm-up; with graphs, the captures
            s = runs[mode] = run(target, prompt, oracle, max_new_tokens=n)
            cycles, rate = len(s.blocks), _decode_rate(s)
            row[mode] = {"tau": s.tau, "tok_s": rate, "speedup": rate / result["plain_tok_s"][mode],
                         "cycle_ms": 1000 * (s.total_s - s.prefill.seconds) / cycles,
                         "draft_ms": 1000 * s.draft_s / cycles, "verify_ms": 1000 * s.verify_s / cycles}
        with SyncCounter() as counter:
            syncs = []
            for event in generate(targets["on"], prompt, oracle, max_new_tokens=n):
                count = counter.take()
                if isinstance(event, Block):
                    syncs.append(count)
        on, off = runs["on"], runs["off"]
        row["on/off tok_s"] = row["on"]["tok_s"] / row["off"]["tok_s"]
        row["max_syncs_per_cycle"] = max(syncs)
        row["lossless"] = compare(targets["on"], prompt, on.output_ids, plan[: len(on.output_ids)]).to_dict()
        checks[f"tau {tau}: on = off, lengths = schedule"] = (
            on.output_ids == off.output_ids and on.acceptance_lengths == off.acceptance_lengths
            == expected_lengths(schedule, b, len(on.blocks)))
        ok = ok and max(syncs) <= 1 and row["lossless"]["kind"] != "diverged"
        result["oracle"][str(tau)] = row
    if method_name(drafter) in TREE_METHODS:  # a tree's verify is a captured step of its own
        trees = {mode: run(target, prompt, drafter, max_new_tokens=n, tree_budget=TREE_BUDGET)
                 for mode, target in targets.items()}
        result["tree"] = {"budget": TREE_BUDGET, "tau": trees["on"].tau, "lossless": compare(
            targets["on"], prompt, trees["on"].output_ids, plan[: len(trees["on"].output_ids)]).to_dict()}
        checks[f"tree {TREE_BUDGET}: on = off"] = trees["on"].output_ids == trees["off"].output_ids
        ok = ok and result["tree"]["lossless"]["kind"] != "diverged"
    graphs = targets["on"].graphs.graphs
    result["graphs"] = {"captured": sum(g is not None for g in graphs.values()),
                        "failed": sum(g is None for g in graphs.values()), "notices": NOTICES[seen:]}
    checks["every capture worked"] = result["graphs"]["failed"] == 0 and result["graphs"]["captured"] > 0
    result["checks"] = checks
    del targets, graphs
    _free(state["device"])
    return {**result, "status": "passed" if ok and all(checks.values()) else "failed"}


def part_race(state) -> dict:
    from app.race.interleave import race
    from app.race.report import race_report
    from dflash_core import SamplingParams, generate
    from dflash_core.lossless import compare

    pair, prompt = state["pair"], state["prompt_ids"]
    b = pair.trained_block_size
    common = {"max_new_tokens": 48, "sampling": SamplingParams(), "stop_ids": pair.stop_ids}
    snapshot = None
    frames = 0
    lanes = {"dflash": generate(pair.target, prompt, pair.drafter, block_size=b, **common),
             "plain": generate(pair.plain, prompt, None, **common)}
    for snapshot in race(lanes, block_sizes={"dflash": b}, pace=False):
        frames += 1
    d, p = snapshot.dflash.summary, snapshot.plain.summary
    verdict = compare(pair.plain, prompt, d.output_ids, p.output_ids)
    report = race_report(d, p, 0.0, b, verdict).to_dict()
    ok = snapshot.done and report["lossless"]["kind"] != "diverged" and report["speedup"] > 0
    return {"frames": frames, "report": {k: report[k] for k in ("tau", "speedup", "identical", "lossless",
                                                                 "dflash_tokens", "plain_tokens")},
            "status": "passed" if ok else "failed"}


def _hub_reachable(env: dict) -> str | None:
    """None when the Hub can be asked, else why not (offline by the environment, or no name resolution)."""
    import socket
    from urllib.parse import urlparse

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if env.get(name, "").lower() in ("1", "true", "yes", "on"):
            return f"{name}={env[name]}"
    host = urlparse(env.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        return f"{host} does not resolve ({exc})"
    return None


def _released_pair_cached(env: dict) -> bool:
    """Whether the released pair's configs are in the Hub cache this script was started with."""
    from huggingface_hub import try_to_load_from_cache

    cache = env.get("HF_HUB_CACHE") or (Path(env["HF_HOME"]) / "hub" if env.get("HF_HOME") else None)
    return all(isinstance(try_to_load_from_cache(repo, "config.json", cache_dir=cache), str) for repo in RELEASED_PAIR)


def _bench_table(state, env: dict, target: str, drafter: str, names: list[str], source: str, timeout: float) -> dict:
    """`python -m dflash_core.bench --dataset` in a fresh process with `env`; its JSON line and exit code."""
    cuda = state["device"].startswith("cuda")
    cmd = [sys.executable, "-m", "dflash_core.bench", "--target", target, "--drafter", drafter,
           "--device", state["device"], "--dtype", "bfloat16" if cuda else "float32", "--dataset", ",".join(names),
           "--max-samples", str(DATASET_SAMPLES[state["shape"].startswith("tiny")]), "--max-new-tokens", str(TOKENS[state["shape"]][1] // 2),
           "--datasets-from", source, "--skip-unavailable"] + ([] if cuda else ["--threads", "1"])
    done = subprocess.run(cmd, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=timeout, check=False)
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
        raise RuntimeError(f"the benchmark ended with code {done.returncode} and no JSON: {tail}") from None
    return {"returncode": done.returncode, "command": " ".join(cmd[1:]), **result}


def part_datasets(state) -> dict:
    """The paper's table on a few samples per reachable dataset; the others on the fixtures' rows."""
    import importlib.util

    from dflash_core.bench.datasets import DATASETS_PIP, SETS

    if importlib.util.find_spec("datasets") is None:
        return {"status": "skipped", "why": f"Hugging Face datasets is not installed here: pip install '{DATASETS_PIP}'"}
    env = state["original_env"]
    state.pop("pair", None)  # the benchmark loads its own copy in its own process
    _free(state["device"])
    offline = _hub_reachable(env)
    if offline:  # cached copies only, without the Hub client's retries
        env = {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    released = state["shape"] == "qwen3-8b" and _released_pair_cached(env)
    target, drafter = RELEASED_PAIR if released else (str(hub_snapshot(state["hub"], r)) for r in (TARGET_ID, DRAFTER_ID))
    result = state["measured"]
    result.update({"hub": f"unreachable ({offline}): cached copies only" if offline else "reachable",
                   "pair": "released (Hub cache)" if released else "hub_load's random pair (the released pair is "
                           "not in the Hub cache)" if state["shape"] == "qwen3-8b" else "hub_load's random pair"})
    started = time.perf_counter()
    real = _bench_table(state, env, target, drafter, list(SETS), "hub", state["budget"] - 10)
    result["table"] = {k: real[k] for k in ("returncode", "command", "datasets", "unavailable", "mean") if k in real}
    unreachable = list(real.get("unavailable", {}))
    ok = real["returncode"] in (0, 3)  # 3: no dataset reachable
    if unreachable:
        left = state["budget"] - (time.perf_counter() - started) - 5
        fixtures = _bench_table(state, env, target, drafter, unreachable, str(FIXTURES), left)
        result["fixture_table"] = {"note": "the fixtures' test rows, not the datasets: the code path only",
                                   **{k: fixtures[k] for k in ("returncode", "datasets", "mean") if k in fixtures}}
        ok = ok and fixtures["returncode"] == 0
    ran = {**result.get("fixture_table", {}).get("datasets", {}), **result["table"].get("datasets", {})}
    ok = ok and set(ran) == set(SETS) and all(r["lossless"]["diverged"] == 0 for r in ran.values())
    return {**result, "status": "passed" if ok else "failed"}


def part_kernel_tests(state) -> dict:
    if not state["device"].startswith("cuda"):
        return {"status": "skipped", "why": "CUDA only (the CPU test suite runs these interpreted)"}
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "why": "pytest is not installed here; the kernels part compared them in-process"}
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DFLASH_KERNELS")}
    env["PYTHONPATH"] = str(ROOT)
    tests = ["tests/test_kernels.py", "tests/test_kernels_compile.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(5, state["budget"] - 5))
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    return {"returncode": done.returncode, "tail": tail, "status": "passed" if done.returncode == 0 else "failed"}


PARTS = {
    "environment": part_environment, "golden": part_golden, "kernels": part_kernels, "hub_load": part_hub_load,
    "exactness": part_exactness, "speed": part_speed, "cuda_graphs": part_cuda_graphs, "race": part_race,
    "datasets": part_datasets, "kernel_tests": part_kernel_tests,
}
NEEDS = {"exactness": "hub_load", "speed": "hub_load", "cuda_graphs": "hub_load", "race": "hub_load",
         "datasets": "hub_load"}


# --- running the parts ---------------------------------------------------------------------------
def _raise_timeout(signum, frame):
    raise PartTimeout("over its time budget")


def run_part(name: str, state: dict, budget: float) -> dict:
    print(f"=== {name} (budget {budget:.0f} s)", flush=True)
    need = NEEDS.get(name)
    if need and state["results"]["parts"].get(need, {}).get("status") != "passed":
        return {"status": "failed", "error": f"needs the {need} part, which did not pass", "seconds": 0.0}
    state["budget"] = budget
    # A part records its figures here as it goes: a failure midway keeps them beside the error.
    measured = state["measured"] = {}
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, budget)
    t0 = time.perf_counter()
    try:
        result = PARTS[name](state)
        result.setdefault("status", "passed")
    except PartTimeout:
        result = {**measured, "status": "timeout", "error": f"stopped after its budget of {budget:.0f} s"}
    except Exception as exc:  # noqa: BLE001 - one part's failure must not lose the others
        result = {**measured, "status": "failed", "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=12).splitlines()[-24:]}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def write_json(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp.replace(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_"))
    original_env = dict(os.environ)  # the datasets part's benchmark runs with the user's Hub settings
    # Before anything imports huggingface_hub: a private, offline Hub cache.
    os.environ["HF_HUB_CACHE"] = str(work / "hub")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.pop("DFLASH_KERNELS", None)
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, str(ROOT))
    cuda = args.device.startswith("cuda")
    t_import = time.perf_counter()
    # The heavy imports happen here, outside every part's budget: an alarm must never land inside
    # an import (it would leave a half-initialised module behind for the later parts).
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import app.pairs.models  # noqa: F401
    import dflash_core.bench.cycle  # noqa: F401
    import dflash_core.lossless  # noqa: F401

    print(f"=== imports: {time.perf_counter() - t_import:.1f} s", flush=True)
    if not cuda:
        torch.set_num_threads(1)  # tiny models gain nothing from threads, and a shared CI box stalls them
    deadline = time.perf_counter() + (args.deadline or (520 if cuda else 480))
    state = {"device": args.device, "shape": args.shape, "hub": work / "hub", "original_env": original_env}
    results = state["results"] = {
        "shape": args.shape, "device": args.device, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "parts": {},
    }
    path = out / "gpu_check.json"
    names = args.parts.split(",") if args.parts else list(PARTS)
    try:
        for name in names:
            left = deadline - time.perf_counter()
            budget = min(BUDGETS[name][1 if args.shape.startswith("tiny") else 0], left)
            if budget < 5:
                result = {"status": "timeout", "error": "no time left before the deadline", "seconds": 0.0}
            else:
                result = run_part(name, state, budget)
            results["parts"][name] = result
            print(f"=== {name}: {result['status']} in {result['seconds']} s"
                  + (f" ({result['error']})" if "error" in result else ""), flush=True)
            print(json.dumps({k: v for k, v in result.items() if k != "traceback"}, default=str)[:2000], flush=True)
            write_json(path, results)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    failed = [n for n, r in results["parts"].items() if r["status"] not in ("passed", "skipped")]
    results["failed"] = failed
    results["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_json(path, results)
    print(f"=== done: {'all parts passed' if not failed else 'FAILED: ' + ', '.join(failed)}; {path}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
