"""The figures of this folder's text outputs as one JSON file, figures.json, for docs/benchmarks.md's
tables ("The drafter's attention on the kernel", "One trace for every length"). It reads only the
outputs committed beside it; from the repository root:

    python dev/measurements/compiled-lanes-drafter-attention-2026-12-07/figures_json.py
"""
import ast
import json
import re
from pathlib import Path

HERE = Path(__file__).parent
AB_ROW = re.compile(r"^(\w+)\s+(plain|dflash)\s+([\d.]+) tok/s\s+([\d.]+) CPU ms/token\s+draft\s+([\d.]+) ms, "
                    r"verify\s+([\d.]+) ms")
PASS_ROW = re.compile(r"^pass (\d), drafter attention on (\w+)\s*:\s+([\d.]+) tok/s, draft ([\d.]+) ms, verify ([\d.]+) ms"
                      r".*identical to plain decoding: (\w+)")
CALL_ROW = re.compile(r"^(\d+) of 1280 positions in use: SDPA (\d+) µs, kernel (\d+) µs")
PLAN_ROW = re.compile(r"^(.+): ([\d.]+) s$")


def lines(name: str) -> list[str]:
    return (HERE / name).read_text().splitlines()


def examples(folder: str) -> dict:
    """{launch or pass: the JSON line race_examples.py ended with} of an app run's folder."""
    return {path.stem.removeprefix("examples-"): json.loads(path.read_text().splitlines()[-1])
            for path in sorted((HERE / folder).glob("examples-*.txt"))}


figures = {
    "compiled_ab": {
        name: [{"variant": m[1], "method": m[2], "tok_s": float(m[3]), "cpu_ms_per_token": float(m[4]),
                "median_draft_ms": float(m[5]), "median_verify_ms": float(m[6])}
               for m in map(AB_ROW.match, lines(f"compiled-ab-{name}.txt")) if m]
        for name in ("static-1", "static-2", "dynamic")
    },
    "drafter_attention_ab": [
        {"pass": int(m[1]), "attention": m[2], "tok_s": float(m[3]), "median_draft_ms": float(m[4]),
         "median_verify_ms": float(m[5]), "identical": m[6] == "True"}
        for m in map(PASS_ROW.match, lines("drafter-attention-ab.txt")) if m
    ],
    "drafter_attention_call_us": [
        {"positions_in_use": int(m[1]), "sdpa": int(m[2]), "kernel": int(m[3])}
        for m in map(CALL_ROW.match, lines("drafter-attention-call.txt")) if m
    ],
    "plan_compile_s": {m[1]: float(m[2]) for m in map(PLAN_ROW.match, lines("plan-compile-times.txt")) if m},
    "static_or_dynamic": [
        {"variant": line.split(" ", 1)[0], "lanes": ast.literal_eval(line.split(" ", 1)[1])}
        for line in lines("static-or-dynamic.txt") if line.startswith(("static ", "dynamic "))
    ],
    "static_or_dynamic_compiled_s": [float(line.split()[2]) for line in lines("static-or-dynamic.txt")
                                     if line.startswith("compiled in")],
    "app": {folder: examples(folder) for folder in ("app", "app-dynamic", "app-interleaved")},
}
(HERE / "figures.json").write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
print(f"wrote {HERE / 'figures.json'}")
