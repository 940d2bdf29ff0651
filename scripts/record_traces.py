"""Record the shipped traces: each app example raced on the offline default pair, greedy and T=0.7.

Runs the app's own `compare` (the same code path as a click on "Race") with every lane (DFlash, the
AR drafter, prompt lookup, plain decoding) and every cycle explained, validates each trace and
writes it to assets/traces/ with an index.json that lists them. Re-record after replacing a
drafter with one command:

    .venv/bin/python scripts/record_traces.py

The traces keep each lane's compute clock, so other jobs on the machine slow their replay; on a
shared machine run it at a high priority (`nice -n -19 ...`, as the shipped ones were).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from app.pairs.models import PairCache  # noqa: E402
from app.pairs.registry import load_pairs  # noqa: E402
from app.serve.examples import EXAMPLES  # noqa: E402
from app.ui import App  # noqa: E402
from app.view.frames import FRAME_FIELDS  # noqa: E402
from dflash_core.trace import validate_trace  # noqa: E402

CATEGORIES = ("math", "code", "chat", "story")  # the order of app/serve/examples.py
TEMPERATURES = {"greedy": 0.0, "t0.7": 0.7}
SIZE_LIMIT = 1_000_000  # shipped files stay small; a bigger one means the format grew


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "assets" / "traces"))
    parser.add_argument("--pair", help="pair id from app/pairs/pairs.json (default: the registry's default)")
    parser.add_argument("--dtype", default="float32", help="target dtype (the shipped traces: float32)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as the app on a 2-core loopback)")
    parser.add_argument("--lanes", default="ar,lookup", help="lanes added to DFlash and plain decoding (comma-separated)")
    parser.add_argument("--only", default="", help="record only these, e.g. code-greedy (comma-separated); "
                        "index.json is then left as it is")
    parser.add_argument("--suffix", default="", help="added to each file's name, e.g. -b16 (a lesson's trace)")
    args = parser.parse_args(argv)
    if len(EXAMPLES) != len(CATEGORIES):
        raise SystemExit(f"app/serve/examples.py has {len(EXAMPLES)} examples; this script names {len(CATEGORIES)}")
    torch.set_num_threads(args.threads)

    pairs, default_id = load_pairs()
    pair_id = args.pair or default_id
    pairs = [dataclasses.replace(p, dtype=args.dtype) if p.id == pair_id else p for p in pairs]
    app = App(pairs, pair_id, PairCache("cpu"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index = []
    only = {name for name in args.only.split(",") if name}
    for category, (prompt,) in zip(CATEGORIES, EXAMPLES):
        for label, temperature in TEMPERATURES.items():
            if only and f"{category}-{label}" not in only:
                continue
            t0 = time.perf_counter()
            frame = None
            lanes = [name for name in args.lanes.split(",") if name]
            for frame in app.live.compare(prompt, args.max_new_tokens, args.block_size, temperature, 1.0, args.seed, lanes,
                                     pair_id):
                pass
            source = frame[FRAME_FIELDS.index("trace_file")]
            trace = validate_trace(source)
            name = f"{category}-{label}{args.suffix}.json"
            shutil.copyfile(source, out / name)
            size = (out / name).stat().st_size
            if size > SIZE_LIMIT:
                raise SystemExit(f"{name} is {size} bytes, over the {SIZE_LIMIT}-byte budget for shipped traces")
            report = trace["report"]
            index.append({
                "file": name, "category": category, "prompt": prompt, "temperature": temperature,
                "seed": args.seed, "tau": report["tau"], "speedup": report["speedup"],
                "identical": report["identical"], "bytes": size,
                "lanes": {lane: {k: r[k] for k in ("tau", "speedup", "draft_passes_per_cycle", "draft_ms_per_cycle",
                                                  "identical")} for lane, r in report["lanes"].items()},
            })
            lanes_text = ", ".join(f"{lane} {r['tau']:.2f} {r['speedup']:.2f}x" for lane, r in report["lanes"].items())
            print(f"{name}: {lanes_text}; {size} bytes, {time.perf_counter() - t0:.0f} s", flush=True)
    if not only:
        (out / "index.json").write_text(json.dumps({"pair": pair_id, "traces": index}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
