"""transformers' own decoding as a benchmark peer: plain `generate`, and its native DFlash,
`generate(..., assistant_model=draft, speculation_type="dflash")`, with the drafter exported to the
native format (`export_native.py`), in this process and venv.

The target is loaded the way a user of transformers loads it (`AutoModelForCausalLM`, no packed
linears), in the benchmark's dtype; the native drafter runs in that dtype too (it takes the target's
embeddings as they come) and drafts over the target's whole LM head. transformers reports no
acceptance counts, but its loop hands every cycle's accepted tokens to a streamer at once, so
`CycleSizes` reads tau off them.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

from ..loading.export_native import export_native
from ..loading.pair import parse_dtype


class CycleSizes(BaseStreamer):
    """Tokens per `put` of a greedy `generate`: the prompt, then (native DFlash) the prefill's token,
    then one put per cycle holding its accepted drafts and the target's bonus token."""

    def __init__(self):
        self.sizes: list[int] = []

    def put(self, value):
        self.sizes.append(value.shape[-1])

    def end(self):
        pass

    @property
    def acceptance_lengths(self) -> list[int]:
        """Accepted drafts + 1 per DFlash cycle, as this engine counts them."""
        return self.sizes[2:]


def timed_hf_generate(model, prompt_ids, max_new_tokens, eos_id, **kwargs):
    """Wall time and new ids of transformers' own `generate` (greedy)."""
    ids = torch.tensor([prompt_ids], device=model.device)
    start = time.perf_counter()
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=eos_id, pad_token_id=eos_id, **kwargs,
    )
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out[0, len(prompt_ids) :].tolist()


def transformers_rows(target_dir, drafter, encoded: list[list[int]], ours: list[dict], *, max_new_tokens: int,
                      dtype: str, eos: int | None, device="cpu", workdir=None) -> dict:
    """transformers plain and native DFlash (with `drafter`, exported) on the prompt ids `encoded`,
    against this engine's runs `ours` (per prompt: "plain_ids", its plain output, and "lengths", its
    DFlash accepted lengths per cycle): tok/s, outputs identical to ours, tau, and the share of
    prompts whose cycles accepted what ours did."""
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM

    torch_dtype = parse_dtype(dtype)
    with tempfile.TemporaryDirectory(prefix="dflash-native-", dir=workdir) as tmp:
        native_dir = Path(tmp) / "drafter"
        export_native(drafter, native_dir, dtype=dtype)
        start = time.perf_counter()
        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch_dtype).to(device).eval()
        draft = AutoModel.from_pretrained(native_dir, dtype=torch_dtype).to(device).eval()
        load_s = time.perf_counter() - start
    dflash = {"assistant_model": draft, "speculation_type": "dflash"}
    warm = encoded[0][:8]
    timed_hf_generate(target, warm, 8, eos)  # kernels and allocator outside the clock
    timed_hf_generate(target, warm, 8, eos, **dflash)
    runs = {"plain": [], "dflash": []}
    for ids in encoded:
        runs["plain"].append(timed_hf_generate(target, ids, max_new_tokens, eos) + (None,))
        sizes = CycleSizes()
        runs["dflash"].append(timed_hf_generate(target, ids, max_new_tokens, eos, streamer=sizes, **dflash)
                              + (sizes.acceptance_lengths,))

    def row(name) -> dict:
        seconds = sum(r[0] for r in runs[name])
        outputs = [r[1] for r in runs[name]]
        return {"tok_s": sum(len(o) for o in outputs) / seconds,
                "identical": sum(o == p["plain_ids"] for o, p in zip(outputs, ours, strict=True)) / len(ours)}

    plain, spec = row("plain"), row("dflash")
    lengths = [r[2] for r in runs["dflash"]]
    spec.update(
        speedup=spec["tok_s"] / plain["tok_s"],
        tau=statistics.fmean(n for one in lengths for n in one),
        # The last cycle is cut at the token budget differently by each loop; every other must match.
        same_cycles=sum(mine[:-1] == p["lengths"][: len(mine) - 1] for mine, p in zip(lengths, ours, strict=True))
        / len(ours),
    )
    return {"engine": f"transformers {transformers.__version__}", "dtype": dtype,
            "drafter_dtype": dtype, "drafts_over": "the target's whole head", "load_s": load_s,
            "plain": plain, "dflash": spec}
