"""The app's race of its four examples in this process, without the server: compiled lanes, then the
same pair on its eager steps, example by example, for `reps` passes.

Loads the offline default pair as the app does (`PairCache`, `library` GEMMs), waits for its lanes to
compile, then runs each example's `RaceSession` (greedy, 128 new tokens, block 4) with the compiled
lanes and again with none, and prints each lane's tok/s. Compared with the served app's figures
(`dev/measurements/compiled-lanes-drafter-attention-2026-12-07/app-interleaved/ratios.txt`), it
says whether the server's part changes compiled over eager.

    .venv/bin/python dev/measurements/app-lanes-in-process-2026-12-07/in_process_race.py 2
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from app.pairs.models import PairCache  # noqa: E402
from app.pairs.registry import load_pairs  # noqa: E402
from app.race.request import RaceRequest  # noqa: E402
from app.race.session import RaceSession  # noqa: E402
from app.serve.examples import EXAMPLES  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)  # what the app takes on a 2-core machine served on loopback
    pairs, _ = load_pairs()
    spec = next(p for p in pairs if p.id == "smollm2-135m")
    pair = PairCache("cpu", compile_gemms="library").get(spec)
    started = time.perf_counter()
    while not pair.compiled.finished:
        time.sleep(1)
    print(f"compiled after {time.perf_counter() - started:.0f} s: {pair.compiled.status()}", flush=True)
    compiled = pair.compiled
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
        for (prompt,) in EXAMPLES:
            row = {}
            for mode in ("compiled", "eager"):
                pair.compiled = compiled if mode == "compiled" else None
                race = RaceSession(pair, "cpu", RaceRequest(spec.id, prompt, 128, 4), pair.encode(prompt))
                for _snapshot in race.snapshots():
                    pass
                lanes = race.result().summaries
                row[mode] = (round(lanes["plain"].tokens_per_s, 1), round(lanes["dflash"].tokens_per_s, 1))
            (cp, cd), (ep, ed) = row["compiled"], row["eager"]
            print(f"{prompt[:30]:32} plain {cp} / {ep} = {cp / ep:.2f}x   DFlash {cd} / {ed} = {cd / ed:.2f}x", flush=True)
