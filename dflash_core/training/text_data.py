"""Text the target did not write, laid out as chat turns, for target-labelled training (`train --text-data`).

One target forward over such a sequence gives the drafter's features and, at every position, the
target's greedy next token; the labels are those greedy tokens where the text follows them
(`objective.greedy_path_labels`). No generation is needed, so a CPU gets many more labelled tokens per
hour than from `datagen`. The sources ship offline with Python and the train requirements:

- ``chatterbot``: the ChatterBot corpus's first exchanges (question -> its answer).
- ``pydoc``: the Python language reference topics of ``pydoc_data`` in sections of up to 1,500 characters.
- ``stdlib``: the source of pure-Python standard-library functions, as the answer to "write it" from
  their docstring. Functions a held-out prompt names are left out.

Shards have datagen's format (``prompt_ids`` are ``text-SOURCE:sha1``):

    python -m dflash_core.training.text_data --out assets/data/smollm2-135m-instruct-text
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import random
import textwrap
import warnings
from pathlib import Path

from .prompts import _STDLIB_MODULES, HELDOUT_JSONL, NATURAL_JSONL, _doc_paragraph, _pkg_dir


def _chatterbot():
    d = _pkg_dir("chatterbot")
    if d is None:
        return
    import yaml

    for f in sorted((d / "data" / "english").glob("*.yml")):
        for conv in (yaml.safe_load(f.read_text(encoding="utf-8")) or {}).get("conversations", []) or []:
            if len(conv) >= 2 and all(isinstance(t, str) and t.strip() for t in conv[:2]):
                yield conv[0].strip(), conv[1].strip()


def _pydoc(max_chars: int = 1500):
    from pydoc_data.topics import topics

    for key in sorted(topics):
        part, parts = "", []
        for para in topics[key].strip().split("\n\n"):
            if part and len(part) + len(para) > max_chars:
                parts.append(part)
                part = ""
            part = f"{part}\n\n{para}" if part else para
        parts.append(part)
        for i, text in enumerate(parts):
            ask = f"Explain the Python topic '{key}'" + (f" (part {i + 1})" if len(parts) > 1 else "") + "."
            yield ask, text.strip()


def _stdlib(held_out: str):
    import importlib

    seen = set()
    for modname in _STDLIB_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(modname)
        except Exception:
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != mod.__name__:
                continue
            para = _doc_paragraph(obj)
            if len(para) < 25 or f"`{name}`" in held_out or (mod.__name__, name) in seen:
                continue
            seen.add((mod.__name__, name))
            try:
                src = textwrap.dedent(inspect.getsource(obj))
            except (OSError, TypeError):
                continue
            if 80 <= len(src) <= 3000:
                yield f"Write a Python function `{name}` that does the following: {para}", f"```python\n{src.rstrip()}\n```"


SOURCES = ("chatterbot", "pydoc", "stdlib")


def text_pairs(seed: int = 0) -> list[tuple[str, str, str]]:
    """(source, user message, assistant text) of every source, shuffled with `seed`."""
    held_out = "\n".join(json.loads(line)["prompt"] for path in (HELDOUT_JSONL, NATURAL_JSONL)
                         for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    pairs = [("chatterbot", u, a) for u, a in _chatterbot()] + [("pydoc", u, a) for u, a in _pydoc()] \
        + [("stdlib", u, a) for u, a in _stdlib(held_out)]
    random.Random(seed).shuffle(pairs)
    return pairs


def encode_pair(tok, user: str, assistant: str, eos_id: int) -> tuple[list[int], int]:
    """(ids, prompt length): the user turn through the chat template, then the text and the end of turn."""
    from ..loading.prompting import encode_prompt

    prompt = encode_prompt(tok, user)
    return prompt + tok.encode(assistant, add_special_tokens=False) + [eos_id], len(prompt)


def main(argv=None) -> None:
    from transformers import AutoTokenizer

    from ..loading.default_target import resolve_target
    from .datagen import _eos_pad, _write_shard

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", default="default:smollm2", help="the target whose tokenizer lays the text out")
    ap.add_argument("--max-len", type=int, default=512, help="tokens per sequence, prompt included")
    ap.add_argument("--shard-size", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    model_dir = resolve_target(a.target)
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos, _ = _eos_pad(tok)
    samples, counts = [], {}
    for source, user, assistant in text_pairs(a.seed):
        ids, plen = encode_pair(tok, user, assistant, eos)
        if len(ids) - plen < 8:
            continue
        digest = hashlib.sha1(f"{user}\n{assistant}".encode()).hexdigest()[:12]
        samples.append({"pid": f"text-{source}:{digest}", "ids": ids[: a.max_len], "plen": plen,
                        "finished": len(ids) <= a.max_len})
        counts[source] = counts.get(source, 0) + 1
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"model": str(model_dir), "labels": "target", "sources": counts, "seed": a.seed, "max_len": a.max_len}
    for i in range(0, len(samples), a.shard_size):
        _write_shard(a.out / f"shard-{i // a.shard_size:05d}.npz", samples[i:i + a.shard_size], meta)
    tokens = sum(len(s["ids"]) - s["plen"] for s in samples)
    print(json.dumps({"sequences": len(samples), "response_tokens": tokens, "sources": counts}))


if __name__ == "__main__":
    main()
