"""The trace file, schema "dflash-trace/1": one or both sides of a run with everything a replay needs.

`build_trace` is the one builder (the CLI and the app's `compare` use it); `validate_trace` checks a
file without importing or executing anything from it; `trace_csv` flattens per-block metrics.

    schema     "dflash-trace/1"
    settings   prompt, prompt_ids, max_new_tokens, block_size, temperature, top_p, top_k, seed, ...
    pair       id, target, drafter, trained_block_size
    hardware   device, cpu, threads, gpu
    versions   dflash-studio, torch, transformers, python
    vocab_size every token id in the file is below it
    runs       {"dflash": Summary.to_trace(), "plain": ...}, either may be absent
    report     the race report when both sides ran, else absent
    tokens     {str(id): text} for every id in the runs, so a replay needs no tokenizer
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DFlashError
from .events import Summary

if TYPE_CHECKING:
    from .sampling import SamplingParams

# torch is imported only by the builders: validating and replaying a trace must not load it
# (the app's --replay serves a recorded race within seconds, without torch).

SCHEMA = "dflash-trace/1"
MAX_BYTES = 20_000_000  # 20 MB: far above any real race (the shipped 128-token ones are listed in docs/benchmarks.md)
SIDES = ("dflash", "plain")
CSV_COLUMNS = ["side", "index", "position", "accepted", "acceptance_length", "bonus_id", "draft_s", "verify_s", "elapsed_s"]


class TraceError(DFlashError):
    """A trace file that cannot be replayed; each subclass is one kind of fault."""


class TraceNotJSONError(TraceError):
    """The bytes are not a JSON object."""


class TraceSchemaError(TraceError):
    """The "schema" field is missing or names another format."""


class TraceFieldError(TraceError):
    """A required field is missing or has the wrong type."""


class TraceVocabError(TraceError):
    """A token id outside [0, vocab_size)."""


class TraceTimingError(TraceError):
    """A negative or non-finite time."""


class TraceSizeError(TraceError):
    """A file over MAX_BYTES."""


# --- building ------------------------------------------------------------------------------------
def settings_of(prompt: str | None, prompt_ids, max_new_tokens: int, block_size: int, sampling: SamplingParams,
                *, target_dtype=None, drafter_dtype=None, **extra) -> dict:
    """A trace's settings; the dtypes are torch dtypes or their names (drafter None: plain decoding)."""
    return {
        "target_dtype": _dtype_name(target_dtype),
        "drafter_dtype": _dtype_name(drafter_dtype),
        "prompt": prompt,
        "prompt_ids": [int(t) for t in prompt_ids],
        "max_new_tokens": max_new_tokens,
        "block_size": block_size,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": sampling.seed,
        **extra,
    }


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(device) -> dict:
    import torch

    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"device": str(device), "cpu": _cpu_model(), "threads": torch.get_num_threads(), "gpu": gpu}


def _project_version() -> str:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        for line in pyproject.read_text().splitlines():
            if line.startswith("version"):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def versions() -> dict:
    import torch
    import transformers

    return {
        "dflash-studio": _project_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _block_ids(block: dict):
    yield block["bonus_id"]
    yield from block["draft_ids"]
    yield from block["committed_ids"]
    info = block.get("explain")
    if info:
        yield info["slot0_id"]
        if info["mask_id"] is not None:
            yield info["mask_id"]
        for row in info["draft_topk"] + info["target_topk"]:
            yield from (token for token, _ in row)
        for slot in info["decision"]["slots"]:
            yield slot["draft"]
            if slot["target"] is not None:
                yield slot["target"]


def token_ids(runs: dict) -> set[int]:
    """Every token id the runs of a trace mention."""
    ids: set[int] = set()
    for run in runs.values():
        ids.update(run["output_ids"])
        ids.add(run["prefill"]["token_id"])
        for block in run["blocks"]:
            ids.update(_block_ids(block))
    return ids


def _rounded(info: dict, digits: int) -> dict:
    """An explain record with probabilities and ratios rounded (they dominate the file size)."""
    def r(x):
        return None if x is None else round(x, digits)

    return {
        **info,
        "draft_topk": [[[t, r(p)] for t, p in row] for row in info["draft_topk"]],
        "target_topk": [[[t, r(p)] for t, p in row] for row in info["target_topk"]],
        "decision": {
            **info["decision"],
            "slots": [{**s, **{f: r(s[f]) for f in ("p", "q", "ratio", "u")}} for s in info["decision"]["slots"]],
        },
    }


def build_trace(
    *,
    settings: dict,
    pair: dict,
    runs: dict[str, Summary],
    vocab_size: int,
    text_of: Callable[[int], str] | None,
    device,
    report: dict | None = None,
    digits: int = 4,
) -> dict:
    """The dflash-trace/1 dict of one run or a race.

    runs: {"dflash": Summary, "plain": Summary}, at least one. text_of: one token's text (None when
    there is no tokenizer: tokens then read "<id>"). digits: rounding of explain probabilities.
    """
    unknown = sorted(set(runs) - set(SIDES))
    if not runs or unknown:
        raise TraceFieldError(f"runs must be some of {SIDES}, got {sorted(runs)}")
    sides = {}
    for name, summary in runs.items():
        side = summary.to_trace()
        for block in side["blocks"]:
            if "explain" in block:
                block["explain"] = _rounded(block["explain"], digits)
        sides[name] = side
    trace = {
        "schema": SCHEMA,
        "settings": settings,
        "pair": pair,
        "hardware": hardware(device),
        "versions": versions(),
        "vocab_size": int(vocab_size),
        "runs": sides,
    }
    if report is not None:
        trace["report"] = report
    text = text_of or (lambda token: f"<{token}>")
    trace["tokens"] = {str(t): text(t) for t in sorted(token_ids(sides))}
    return trace


def trace_csv(trace: dict) -> str:
    """Per-block metrics of every side: one row per block."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for side in SIDES:
        for b in trace["runs"].get(side, {}).get("blocks", []):
            row = [side, b["index"], b["position"], b["accepted"], b["accepted"] + 1, b["bonus_id"]]
            writer.writerow(row + [f"{b[f]:.6f}" for f in ("draft_s", "verify_s", "elapsed_s")])
    return out.getvalue()


def write_trace(trace: dict, path: str | os.PathLike) -> tuple[Path, Path]:
    """Write the JSON at `path` and the per-block CSV beside it (same name, .csv); return both paths."""
    path = Path(path)
    path.write_text(json.dumps(trace, ensure_ascii=False, separators=(",", ":")))
    csv_path = path.with_suffix(".csv")
    csv_path.write_text(trace_csv(trace))
    return path, csv_path


# --- validating ----------------------------------------------------------------------------------
def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _load(source) -> dict:
    if isinstance(source, (bytes, bytearray)):
        size, where = len(source), "the trace"
    else:
        path = Path(source)
        if not path.is_file():
            raise TraceFieldError(f"trace file not found: {path}")
        size, where = path.stat().st_size, str(path)
    if size > MAX_BYTES:  # checked before reading a file: a huge upload is never loaded
        raise TraceSizeError(f"{where} is {size} bytes; the limit is {MAX_BYTES} bytes ({MAX_BYTES / 1e6:g} MB)")
    data = bytes(source) if isinstance(source, (bytes, bytearray)) else path.read_bytes()
    try:
        trace = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise TraceNotJSONError(f"{where} is not JSON: {exc}") from None
    if not isinstance(trace, dict):
        raise TraceNotJSONError(f"{where} is JSON but not an object (got {type(trace).__name__})")
    return trace


def _field(obj: dict, name: str, kind, where: str):
    if not isinstance(obj, dict) or name not in obj:
        raise TraceFieldError(f"missing field {where}.{name}")
    value = obj[name]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float, (int, float)))
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise TraceFieldError(f"field {where}.{name} must be {names}, got {type(value).__name__}: {value!r:.60}")
    return value


def _ints(obj: dict, name: str, where: str) -> list:
    values = _field(obj, name, list, where)
    for i, v in enumerate(values):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TraceFieldError(f"field {where}.{name}[{i}] must be an int, got {v!r:.60}")
    return values


def _seconds(obj: dict, name: str, where: str) -> None:
    value = _field(obj, name, (int, float), where)
    if not math.isfinite(value) or value < 0:
        raise TraceTimingError(f"{where}.{name} is {value}: times must be finite and >= 0")


def _topk(rows, where: str) -> None:
    if not isinstance(rows, list):
        raise TraceFieldError(f"field {where} must be a list of top-k lists")
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise TraceFieldError(f"field {where}[{i}] must be a list of [token_id, probability]")
        for pair in row:
            ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int) and not isinstance(pair[0], bool)
            if not ok or not isinstance(pair[1], (int, float)) or not 0 <= pair[1] <= 1:
                raise TraceFieldError(f"{where}[{i}] holds {pair!r:.60}; expected [token_id, probability in 0..1]")


def _explain(info: dict, where: str) -> None:
    _field(info, "slot0_id", int, where)
    if info.get("mask_id") is not None:
        _field(info, "mask_id", int, where)
    _ints(info, "positions", where)
    injected = _field(info, "injected", dict, where)
    _field(injected, "positions", int, f"{where}.injected")
    _ints(injected, "target_layers", f"{where}.injected")
    _topk(_field(info, "draft_topk", list, where), f"{where}.draft_topk")
    _topk(_field(info, "target_topk", list, where), f"{where}.target_topk")
    decision = _field(info, "decision", dict, where)
    rule = _field(decision, "rule", str, f"{where}.decision")
    if rule not in ("greedy", "match", "rejection"):
        raise TraceFieldError(f"{where}.decision.rule is {rule!r}; expected greedy, match or rejection")
    _field(decision, "resampled", bool, f"{where}.decision")
    for i, slot in enumerate(_field(decision, "slots", list, f"{where}.decision")):
        at = f"{where}.decision.slots[{i}]"
        _field(slot, "slot", int, at)
        _field(slot, "draft", int, at)
        _field(slot, "accepted", bool, at)
        for name in ("target", "p", "q", "ratio", "u"):
            if name not in slot:
                raise TraceFieldError(f"missing field {at}.{name}")
        if slot["target"] is not None:
            _field(slot, "target", int, at)
    cache = _field(info, "cache", dict, where)
    for name in ("target_before", "target_after", "drafter_before", "drafter_after"):
        _field(cache, name, int, f"{where}.cache")
    times = _field(info, "time", dict, where)
    for name in ("draft_s", "verify_s", "other_s"):
        _seconds(times, name, f"{where}.time")


def _run(run: dict, where: str) -> None:
    _ints(run, "output_ids", where)
    _field(run, "prompt_len", int, where)
    _field(run, "block_size", int, where)
    _ints(run, "acceptance_lengths", where)
    _seconds(run, "total_s", where)
    prefill = _field(run, "prefill", dict, where)
    _field(prefill, "token_id", int, f"{where}.prefill")
    _seconds(prefill, "seconds", f"{where}.prefill")
    for i, block in enumerate(_field(run, "blocks", list, where)):
        at = f"{where}.blocks[{i}]"
        for name in ("index", "position", "accepted", "bonus_id"):
            _field(block, name, int, at)
        _ints(block, "draft_ids", at)
        _ints(block, "committed_ids", at)
        for name in ("draft_s", "verify_s", "elapsed_s"):
            _seconds(block, name, at)
        if block.get("explain") is not None:
            _explain(_field(block, "explain", dict, at), f"{at}.explain")


def validate_trace(source: str | os.PathLike | bytes) -> dict:
    """Parse and check a trace file (path) or its bytes; return the trace dict.

    Only `json.loads` reads the data: nothing in it is imported, executed or used as a path.
    Raises one `TraceError` subclass per fault, naming the field and the value.
    """
    trace = _load(source)
    if "schema" not in trace:
        raise TraceSchemaError(f'missing field "schema": expected "{SCHEMA}"')
    if trace["schema"] != SCHEMA:
        raise TraceSchemaError(f'schema is {trace["schema"]!r:.60}; this version reads "{SCHEMA}"')
    for name in ("settings", "pair", "hardware", "versions", "runs", "tokens"):
        _field(trace, name, dict, "trace")
    vocab = _field(trace, "vocab_size", int, "trace")
    if vocab < 1:
        raise TraceFieldError(f"trace.vocab_size must be >= 1, got {vocab}")
    _ints(trace["settings"], "prompt_ids", "trace.settings")
    runs = trace["runs"]
    sides = sorted(runs)
    if not sides or set(sides) - set(SIDES):
        raise TraceFieldError(f"trace.runs must hold some of {SIDES}, got {sides}")
    for side in sides:
        _run(_field(runs, side, dict, "trace.runs"), f"trace.runs.{side}")
    used = token_ids(runs) | set(trace["settings"]["prompt_ids"])
    outside = sorted(t for t in used if not 0 <= t < vocab)
    if outside:
        raise TraceVocabError(f"token ids {outside[:5]} are outside the vocabulary of size {vocab}")
    tokens = trace["tokens"]
    missing = sorted(t for t in token_ids(runs) if str(t) not in tokens)
    if missing:
        raise TraceFieldError(f"trace.tokens has no text for token ids {missing[:5]}")
    bad = [k for k, v in tokens.items() if not isinstance(v, str)]
    if bad:
        raise TraceFieldError(f"trace.tokens[{bad[0]!r}] must be a string")
    return trace
