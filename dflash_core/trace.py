"""The trace file, schema "dflash-trace/2": the runs of a race with everything a replay needs.

`build_trace` is the one builder (the CLI and the app's `compare` use it); `validate_trace` checks a
file without importing or executing anything from it; `trace_csv` flattens per-block metrics.

    schema     "dflash-trace/2" ("dflash-trace/1", with only the dflash and plain runs, is still read)
    settings   prompt, prompt_ids, max_new_tokens, block_size, temperature, top_p, top_k, seed, ...;
               thinking ("on" / "off") where the chat template has that switch
    pair       id, target, drafter, trained_block_size; chat_template (in words), trained_thinking
               ("on" / "off") where the drafter's setting is recorded
    hardware   device, cpu, threads, gpu
    versions   dflash-studio, torch, transformers, python
    vocab_size every token id in the file is below it
    runs       {lane: Summary.to_trace()} for some of the lanes dflash, scheduled (DFlash with the block
               schedule), tree (DFlash verifying draft trees), dflash2 and fusion (a pair's DFlash2 and input-fusion drafters), ar, lookup
               and plain; each run names its `method` (dflash, dflash2, fusion, ar, lookup or plain)
               and its `block_schedule` (fixed or auto), each block its `verify_len` (files from
               before the block schedule have neither: every block verified its whole draft); a
               DFlash2 block's explanation adds "path", its selector's walk (`events.SelectorPath`); a
               run that verified draft trees names its "tree_budget", and each of its blocks holds its
               "tree" (`events.TreeCycle`: nodes, parents, depths, draft probabilities, the target's
               token at every node, the walked path, host seconds); its draft_ids are the walked drafts
    report     the race report when a race ran, else absent
    tokens     {str(id): text} for every id in the runs, so a replay needs no tokenizer
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DFlashError
from .events import Summary
from .loading.chat_template import THINKING_CHOICES

if TYPE_CHECKING:
    from .sampling import SamplingParams

# torch is imported only by the builders: validating and replaying a trace must not load it
# (the app's --replay serves a recorded race within seconds, without torch).

SCHEMA = "dflash-trace/2"
READS = (SCHEMA, "dflash-trace/1")  # /1: the same fields, only the dflash and plain runs, no run methods
MAX_BYTES = 20_000_000  # 20 MB: far above any real race (the shipped 128-token ones are listed in docs/benchmarks.md)
# The lanes a race may hold, in the order they are shown: DFlash, DFlash with the per-cycle block
# schedule (block_size="auto"), the pair's DFlash2 drafter, its input-fusion drafter, the
# autoregressive drafter with DFlash's KV injection, prompt lookup, plain decoding. A file holds
# some of them, so files from before a lane was added still read.
RUNS = ("dflash", "scheduled", "tree", "dflash2", "fusion", "ar", "lookup", "plain")
METHODS = ("dflash", "dflash2", "fusion", "ar", "lookup", "plain")
SCHEDULES = ("fixed", "auto")
CSV_COLUMNS = ["lane", "index", "position", "accepted", "acceptance_length", "bonus_id", "draft_s", "verify_s",
               "elapsed_s", "verify_len"]


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
        if info.get("path") is not None:
            for row in info["path"]["candidates"]:
                yield from row
    tree = block.get("tree")
    if tree:
        yield from tree["tokens"]
        yield from tree["targets"]


def lane_of(method: str) -> str:
    """The lane a run of `method` sits in: a DFlash2 or input-fusion drafter races in DFlash's lane."""
    return "dflash" if method in ("dflash2", "fusion") else method


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
        **({"path": {**info["path"], "probs": [[r(p) for p in row] for row in info["path"]["probs"]]}}
           if info.get("path") is not None else {}),
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
    """The dflash-trace/2 dict of one run or a race.

    runs: {lane: Summary} for at least one of `RUNS`. text_of: one token's text (None when
    there is no tokenizer: tokens then read "<id>"). digits: rounding of explain probabilities.
    """
    unknown = sorted(set(runs) - set(RUNS))
    if not runs or unknown:
        raise TraceFieldError(f"runs must be some of {RUNS}, got {sorted(runs)}")
    sides = {}
    for name, summary in runs.items():
        side = summary.to_trace()
        for block in side["blocks"]:
            if "explain" in block:
                block["explain"] = _rounded(block["explain"], digits)
            if "tree" in block:
                block["tree"]["probs"] = [round(p, digits) for p in block["tree"]["probs"]]
        sides[name] = side
    trace = {
        "schema": SCHEMA,
        "settings": settings,
        "pair": pair,
        "hardware": hardware(device),
        "versions": versions(),
        "vocab_size": int(vocab_size),
        "runs": {name: sides[name] for name in RUNS if name in sides},
    }
    if report is not None:
        trace["report"] = report
    text = text_of or (lambda token: f"<{token}>")
    trace["tokens"] = {str(t): text(t) for t in sorted(token_ids(sides))}
    return trace


def trace_csv(trace: dict) -> str:
    """Per-block metrics of every lane: one row per block."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for lane in RUNS:
        for b in trace["runs"].get(lane, {}).get("blocks", []):
            row = [lane, b["index"], b["position"], b["accepted"], b["accepted"] + 1, b["bonus_id"]]
            times = [f"{b[f]:.6f}" for f in ("draft_s", "verify_s", "elapsed_s")]
            writer.writerow(row + times + [b.get("verify_len") or len(b["draft_ids"]) + 1])
    return out.getvalue()


def write_trace(trace: dict, path: str | os.PathLike) -> tuple[Path, Path]:
    """Write the JSON at `path` and the per-block CSV beside it (same name, .csv); return both paths."""
    path = Path(path)
    path.write_text(json.dumps(trace, ensure_ascii=False, separators=(",", ":")))
    csv_path = path.with_suffix(".csv")
    csv_path.write_text(trace_csv(trace))
    return path, csv_path


# --- validating ----------------------------------------------------------------------------------
# Bounds a replay relies on; every count in a trace is also bounded by the file's own size (a list
# of n items takes at least n bytes), and every id by its vocab_size.
MAX_BLOCK_SIZE = 1024  # released drafters use 16: ample room, and the charts' cost stays small
MAX_VOCAB = 2**31
# A token's text and a pane piece are drawn in every pane, draft strip, hover box and cycle view that
# shows the token: their length bounds what one frame of a replay costs. Real BPE tokens are a few to a
# few dozen characters (the default target's longest, of 49,152, is a run of 81 spaces), so 512 is far
# above any real one; a piece is one token's text, plus at most the few bytes of a character it completes.
MAX_TOKEN_CHARS = 512
# All token texts and pieces together: the shipped 128-token races hold at most 10,125 characters,
# a 512-token race of the app about 4 times that; 1,000,000 leaves room for races 100 times longer.
MAX_TEXT_CHARS = 1_000_000
# Integers a replay shows (positions, cache lengths, layers): no model's context or depth comes near.
MAX_LENGTH = 2**31
MAX_LAYERS = 1024  # target layers injected into the drafter: released drafters use 5 or 6
# Candidates per slot of a DFlash2 selector's walk: a replay's cycle view draws a few of them, and
# a longer row only costs the file's bytes; released configs keep well under this.
MAX_TOP_K = 1024
MAX_TREE_NODES = 4096  # nodes of one verified draft tree, the root included: budgets are tens
STOP_REASONS = ("running", "stopped", "max_new_tokens", "stop_token")
_TOKEN_KEY = re.compile(r"0|[1-9][0-9]{0,9}")


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
    except RecursionError:  # the parser recurses once per nesting level
        raise TraceNotJSONError(f"{where} is nested too deeply to be a trace") from None
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
        raise TraceFieldError(f"field {where}.{name} must be {names}, got {type(value).__name__}: {_show(value)}")
    return value


def _show(value) -> str:
    """A value for a message, cut short (repr of a huge or deeply nested value is never built)."""
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"a {len(str(abs(value)))}-digit integer"
    return f"{value!r:.60}"


def _int(obj: dict, name: str, where: str, low: int = 0, high: int | None = None, optional: bool = False):
    """An int field in [low, high], or None where `optional`."""
    if optional and obj.get(name) is None:
        if name not in obj:
            raise TraceFieldError(f"missing field {where}.{name}")
        return None
    value = _field(obj, name, int, where)
    if value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise TraceFieldError(f"{where}.{name} is {_show(value)}; it must be {bounds}")
    return value


def _number(obj: dict, name: str, where: str, low: float, high: float | None = None, optional: bool = False):
    """A finite number field in [low, high], or None where `optional`."""
    if optional and obj.get(name) is None:
        return None
    value = _field(obj, name, (int, float), where)
    try:
        ok = math.isfinite(value) and value >= low and (high is None or value <= high)
    except OverflowError:  # an int too large for a float
        ok = False
    if not ok:
        bounds = f"from {low:g} to {high:g}" if high is not None else f"finite and at least {low:g}"
        raise TraceFieldError(f"{where}.{name} is {_show(value)}; it must be {bounds}")
    return value


def _ints(obj: dict, name: str, where: str, high: int | None = None) -> list:
    """A list of ints, each in [0, high] where `high` is given (token ids are checked against the vocabulary)."""
    values = _field(obj, name, list, where)
    for i, v in enumerate(values):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TraceFieldError(f"field {where}.{name}[{i}] must be an int, got {_show(v)}")
        if high is not None and not 0 <= v <= high:
            raise TraceFieldError(f"{where}.{name}[{i}] is {_show(v)}; it must be from 0 to {high}")
    return values


def _seconds(obj: dict, name: str, where: str) -> float:
    value = _field(obj, name, (int, float), where)
    try:
        ok = math.isfinite(value) and value >= 0
    except OverflowError:
        ok = False
    if not ok:
        raise TraceTimingError(f"{where}.{name} is {_show(value)}: times must be finite and >= 0")
    return value


def _topk(rows, where: str) -> None:
    if not isinstance(rows, list):
        raise TraceFieldError(f"field {where} must be a list of top-k lists")
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise TraceFieldError(f"field {where}[{i}] must be a list of [token_id, probability]")
        for pair in row:
            ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int) and not isinstance(pair[0], bool)
            ok = ok and isinstance(pair[1], (int, float)) and not isinstance(pair[1], bool) and 0 <= pair[1] <= 1
            if not ok:
                raise TraceFieldError(f"{where}[{i}] holds {_show(pair)}; expected [token_id, probability in 0..1]")


def _explain(info: dict, where: str) -> None:
    _field(info, "slot0_id", int, where)
    _int(info, "mask_id", where, high=MAX_VOCAB, optional=True)  # null for plain decoding, never absent
    _ints(info, "positions", where, high=MAX_LENGTH)
    injected = _field(info, "injected", dict, where)
    _int(injected, "positions", f"{where}.injected", high=MAX_LENGTH)
    layers = _ints(injected, "target_layers", f"{where}.injected", high=MAX_LENGTH)
    if len(layers) > MAX_LAYERS:
        raise TraceFieldError(f"{where}.injected.target_layers holds {len(layers)} layers; at most {MAX_LAYERS}")
    _topk(_field(info, "draft_topk", list, where), f"{where}.draft_topk")
    _topk(_field(info, "target_topk", list, where), f"{where}.target_topk")
    decision = _field(info, "decision", dict, where)
    rule = _field(decision, "rule", str, f"{where}.decision")
    if rule not in ("greedy", "match", "rejection"):
        raise TraceFieldError(f"{where}.decision.rule is {_show(rule)}; expected greedy, match or rejection")
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
        for name in ("p", "q", "u"):
            _number(slot, name, at, 0.0, 1.0, optional=True)
        _number(slot, "ratio", at, 0.0, optional=True)
    if info.get("path") is not None:
        _path(_field(info, "path", dict, where), f"{where}.path")
    cache = _field(info, "cache", dict, where)
    for name in ("target_before", "target_after", "drafter_before", "drafter_after"):
        _int(cache, name, f"{where}.cache", high=MAX_LENGTH)
    times = _field(info, "time", dict, where)
    for name in ("draft_s", "verify_s", "other_s"):
        _seconds(times, name, f"{where}.time")


def _path(path: dict, where: str) -> None:
    """A DFlash2 selector's walk: per slot, K candidate ids, K probabilities and the chosen index."""
    candidates = _field(path, "candidates", list, where)
    probs = _field(path, "probs", list, where)
    chosen = _ints(path, "chosen", where)
    if not len(candidates) == len(probs) == len(chosen):
        raise TraceFieldError(f"{where} has {len(candidates)} candidate rows, {len(probs)} probability rows and "
                              f"{len(chosen)} choices; it needs one of each per drafted slot")
    for i, (ids, row, pick) in enumerate(zip(candidates, probs, chosen)):
        at = f"{where}.candidates[{i}]"
        if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_TOP_K:
            raise TraceFieldError(f"{at} must be a list of 1 to {MAX_TOP_K} token ids, got {_show(ids)}")
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool)]
        if bad:
            raise TraceFieldError(f"{at} must hold token ids (ints), got {_show(bad[0])}")
        ok = isinstance(row, list) and len(row) == len(ids)
        if not ok or not all(isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1 for p in row):
            raise TraceFieldError(f"{where}.probs[{i}] must hold one probability in 0..1 per candidate ({len(ids)}), "
                                  f"got {_show(row)}")
        if pick >= len(ids):
            raise TraceFieldError(f"{where}.chosen[{i}] is {_show(pick)}; slot {i + 1} has {len(ids)} candidates (0 to {len(ids) - 1})")


def _run(run: dict, where: str) -> None:
    _ints(run, "output_ids", where)
    _field(run, "prompt_len", int, where)
    _field(run, "block_size", int, where)
    _ints(run, "acceptance_lengths", where)
    _seconds(run, "total_s", where)
    if run.get("method") is not None and run["method"] not in METHODS:
        raise TraceFieldError(f"{where}.method is {_show(run['method'])}; expected one of {METHODS}")
    if run.get("stop_reason") is not None and run["stop_reason"] not in STOP_REASONS:
        raise TraceFieldError(f"{where}.stop_reason is {_show(run['stop_reason'])}; expected one of {STOP_REASONS}")
    if run.get("block_schedule") is not None and run["block_schedule"] not in SCHEDULES:
        raise TraceFieldError(f"{where}.block_schedule is {_show(run['block_schedule'])}; expected one of {SCHEDULES}")
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
        if "draft_passes" in block:  # traces before the AR drafter have none
            _int(block, "draft_passes", at)
        if block.get("verify_len") is not None:  # absent before the block schedule
            _int(block, "verify_len", at, low=1)
        if block.get("explain") is not None:
            _explain(_field(block, "explain", dict, at), f"{at}.explain")
        if block.get("tree") is not None:
            _tree(_field(block, "tree", dict, at), f"{at}.tree")
    if run.get("tree_budget") is not None:
        _int(run, "tree_budget", where, high=MAX_TREE_NODES)


def _tree(tree: dict, where: str) -> None:
    """A verified draft tree's fields: one entry per node in each list, a path of node numbers."""
    nodes = _ints(tree, "tokens", where)
    if not 1 <= len(nodes) <= MAX_TREE_NODES:
        raise TraceFieldError(f"{where}.tokens holds {len(nodes)} nodes; a tree has 1 to {MAX_TREE_NODES}")
    parents = _field(tree, "parents", list, where)
    if not parents or parents[0] != -1:
        raise TraceFieldError(f"{where}.parents must start with -1, the root's")
    _ints({"parents": parents[1:]}, "parents", where)
    for name in ("depths", "targets", "path"):
        _ints(tree, name, where)
    probs = _field(tree, "probs", list, where)
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1 for p in probs):
        raise TraceFieldError(f"{where}.probs must hold probabilities in 0..1")
    for name in ("parents", "depths", "probs", "targets"):
        if len(tree[name]) != len(nodes):
            raise TraceFieldError(f"{where}.{name} holds {len(tree[name])} entries for {len(nodes)} nodes")
    _seconds(tree, "host_s", where)


def _settings(settings: dict) -> None:
    where = "trace.settings"
    if settings.get("prompt") is not None:
        _field(settings, "prompt", str, where)
    _ints(settings, "prompt_ids", where)
    _int(settings, "max_new_tokens", where, low=1)
    _int(settings, "block_size", where, low=1, high=MAX_BLOCK_SIZE)
    _number(settings, "temperature", where, 0.0)
    _number(settings, "top_p", where, 0.0, 1.0)
    _int(settings, "top_k", where, optional=True)
    _int(settings, "seed", where, optional=True)
    if "explain" in settings:
        _int(settings, "explain", where, optional=True)
    _thinking(settings, "thinking", where)


def _thinking(obj: dict, name: str, where: str) -> None:
    """An optional thinking setting: "on" or "off"."""
    if obj.get(name) is not None and obj[name] not in THINKING_CHOICES:
        raise TraceFieldError(f"{where}.{name} is {_show(obj[name])}; expected one of {THINKING_CHOICES}")


def _consistent_run(run: dict, where: str, prompt_len: int, plain: bool) -> None:
    """A run whose counts agree with each other: what sizes a replay's work is checked against
    what the file holds (every block holds its block_size - 1 drafts, or up to that many for
    prompt lookup and a block schedule, the output is the prefill token and every block's committed tokens)."""
    if run["prompt_len"] != prompt_len:
        raise TraceFieldError(f"{where}.prompt_len is {_show(run['prompt_len'])}, but the prompt has {prompt_len} ids")
    size = run["block_size"]
    high = 1 if plain else MAX_BLOCK_SIZE
    if not 1 <= size <= high:
        raise TraceFieldError(f"{where}.block_size is {_show(size)}; it must be from 1 to {high}")
    lookup = run.get("method") == "lookup"  # a cycle drafts what the context's match offers, maybe nothing
    trees = bool(run.get("tree_budget"))  # a cycle's draft_ids are its walked path: up to size - 1
    scheduled = run.get("block_schedule") == "auto"  # a cycle drafts the length its schedule set, 0 when paused
    blocks = run["blocks"]
    output = [run["prefill"]["token_id"]]
    clock = run["prefill"]["seconds"]
    for i, block in enumerate(blocks):
        at = f"{where}.blocks[{i}]"
        drafts = len(block["draft_ids"])
        if block["index"] != i:
            raise TraceFieldError(f"{at}.index is {_show(block['index'])}; blocks are numbered from 0 in order")
        if drafts != size - 1 and not ((lookup or scheduled or trees) and drafts < size):
            most = f"up to {size - 1}" if lookup or scheduled or trees else f"{size - 1}"
            raise TraceFieldError(f"{at}.draft_ids holds {drafts} drafts; block_size {size} drafts {most}")
        verified = drafts if block.get("verify_len") is None else block["verify_len"] - 1
        if block.get("tree") is not None or trees:
            _consistent_tree(block, at, size, trees)
        elif verified > drafts:
            raise TraceFieldError(f"{at}.verify_len is {_show(block['verify_len'])}; a block of {drafts} drafts verifies at most {drafts + 1} tokens")
        if not 0 <= block["accepted"] <= verified:
            raise TraceFieldError(f"{at}.accepted is {_show(block['accepted'])}; a block of {verified} verified drafts accepts 0 to {verified}")
        if block["position"] != prompt_len + len(output) - 1:
            raise TraceFieldError(
                f"{at}.position is {_show(block['position'])}; after {len(output)} tokens it is {prompt_len + len(output) - 1}"
            )
        kept = [*block["draft_ids"][: block["accepted"]], block["bonus_id"]]
        committed = block["committed_ids"]
        if committed != kept[: len(committed)]:
            raise TraceFieldError(f"{at}.committed_ids must be the accepted drafts, then the bonus token (possibly cut short)")
        passes = block.get("draft_passes", 0)
        if passes > max(drafts, 1):  # one DFlash pass, or one per draft (the AR drafter)
            raise TraceFieldError(f"{at}.draft_passes is {_show(passes)}; it must be from 0 to {max(drafts, 1)}")
        if block["elapsed_s"] < clock:
            raise TraceTimingError(f"{at}.elapsed_s is {block['elapsed_s']}, earlier than the cycle before it ({clock})")
        clock = block["elapsed_s"]
        output.extend(committed)
        if block.get("explain") is not None:
            # The cycle explained what it verified: slot 0 and the verified drafts (all, at a fixed block).
            _consistent_explain(block["explain"], f"{at}.explain", size, block["position"], verified,
                                block["draft_ids"])
    if run["total_s"] < clock:
        raise TraceTimingError(f"{where}.total_s is {run['total_s']}, earlier than its last cycle ({clock})")
    if run["output_ids"] != output:
        raise TraceFieldError(f"{where}.output_ids must be the prefill token, then every block's committed_ids")
    if run["acceptance_lengths"] != [b["accepted"] + 1 for b in blocks]:
        raise TraceFieldError(f"{where}.acceptance_lengths must be each block's accepted + 1")


def _consistent_tree(block: dict, where: str, size: int, trees: bool) -> None:
    """A tree block agrees with itself: each node's parent comes before it, one depth up, at most
    size - 1 deep; the path walks down from the root; its drafts are the block's accepted drafts,
    and the target's token at its last node is the bonus."""
    tree = block.get("tree")
    if tree is None or not trees:
        raise TraceFieldError(f"{where}: a run with a tree_budget has a tree in every block, and only such a run")
    parents, depths, path, nodes = tree["parents"], tree["depths"], tree["path"], len(tree["tokens"])
    if depths[0] != 0 or any(not (0 <= parents[i] < i and depths[i] == depths[parents[i]] + 1 <= size - 1)
                             for i in range(1, nodes)):
        raise TraceFieldError(f"{where}.tree: every node's parent must come before it, one depth up, and no node may "
                              f"be deeper than {size - 1}")
    if not path or path[0] != 0 or any(not (0 <= b < nodes and parents[b] == a) for a, b in zip(path, path[1:])):
        raise TraceFieldError(f"{where}.tree.path must walk from the root (node 0) to a child at each step")
    if block["draft_ids"] != [tree["tokens"][n] for n in path[1:]] or block["accepted"] != len(path) - 1:
        raise TraceFieldError(f"{where}.draft_ids and accepted must be the tree path's drafts, all accepted")
    if block["bonus_id"] != tree["targets"][path[-1]]:
        raise TraceFieldError(f"{where}.bonus_id must be the target's token at the path's last node")
    if block.get("verify_len") != nodes:
        raise TraceFieldError(f"{where}.verify_len is {_show(block.get('verify_len'))}; the tree verified {nodes} nodes")


def _consistent_explain(info: dict, where: str, size: int, position: int, drafts: int, drafted: list) -> None:
    """An explanation no larger than its block: its positions are the block's (slot 0, then one
    per verified draft), B target rows, B - 1 draft rows and verdicts; a selector's walk chose the
    block's drafts `drafted`, one slot each."""
    if info["positions"] != list(range(position, position + drafts + 1)):
        raise TraceFieldError(
            f"{where}.positions must be the block's positions {position} to {position + drafts} (slot 0, then one per "
            f"verified draft), got {_show(info['positions'])}"
        )
    for name, most in (("target_topk", size), ("draft_topk", size - 1)):
        if len(info[name]) > most:
            raise TraceFieldError(f"{where}.{name} has {len(info[name])} entries; a block of size {size} has at most {most}")
    slots = info["decision"]["slots"]
    if len(slots) > size - 1 or any(not 1 <= s["slot"] <= size - 1 for s in slots):
        raise TraceFieldError(f"{where}.decision.slots must name draft slots 1 to {size - 1}")
    path = info.get("path")
    if path is not None and len(path["chosen"]) != len(drafted):
        raise TraceFieldError(f"{where}.path walks {len(path['chosen'])} slots; the block drafted {len(drafted)}")
    if path is not None:
        walked = [row[pick] for row, pick in zip(path["candidates"], path["chosen"])]
        if walked != drafted:
            raise TraceFieldError(f"{where}.path chose {_show(walked)}, but the block drafted {_show(drafted)}: the walk "
                                  "must name the block's drafts")


def _pieces(pieces, runs: dict) -> int:
    """The app's per-token pane text: one string per output token of a lane, each at most
    MAX_TOKEN_CHARS long; returns their characters in all."""
    if not isinstance(pieces, dict) or set(pieces) - set(RUNS):
        raise TraceFieldError(f"trace.pieces must map some of the lanes {RUNS} to lists of strings")
    chars = 0
    for side, texts in pieces.items():
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TraceFieldError(f"trace.pieces.{side} must be a list of strings")
        if side in runs and len(texts) != len(runs[side]["output_ids"]):
            raise TraceFieldError(
                f"trace.pieces.{side} has {len(texts)} entries for {len(runs[side]['output_ids'])} output tokens"
            )
        for i, text in enumerate(texts):
            if len(text) > MAX_TOKEN_CHARS:
                token = runs[side]["output_ids"][i] if side in runs else "?"
                raise TraceFieldError(f"trace.pieces.{side}[{i}] (token {token}) is {len(text)} characters long; "
                                      f"a piece may be at most {MAX_TOKEN_CHARS} characters")
            chars += len(text)
    return chars


def validate_trace(source: str | os.PathLike | bytes) -> dict:
    """Parse and check a trace file (path) or its bytes; return the trace dict.

    Only `json.loads` reads the data: nothing in it is imported, executed or used as a path.
    Every field a replay reads is checked for its type and range, and every count against the
    rest of the file (so the work a replay does is bounded by the file's size). Raises one
    `TraceError` subclass per fault, naming the field and the value.
    """
    trace = _load(source)
    if "schema" not in trace:
        raise TraceSchemaError(f'missing field "schema": expected "{SCHEMA}"')
    if trace["schema"] not in READS:
        raise TraceSchemaError(f'schema is {_show(trace["schema"])}; this version reads "{SCHEMA}" and "{READS[1]}"')
    for name in ("settings", "pair", "hardware", "versions", "runs", "tokens"):
        _field(trace, name, dict, "trace")
    vocab = _field(trace, "vocab_size", int, "trace")
    if not 1 <= vocab <= MAX_VOCAB:
        raise TraceFieldError(f"trace.vocab_size must be from 1 to {MAX_VOCAB}, got {_show(vocab)}")
    _settings(trace["settings"])
    _thinking(trace["pair"], "trained_thinking", "trace.pair")
    runs = trace["runs"]
    sides = sorted(runs)
    lanes = RUNS if trace["schema"] == SCHEMA else ("dflash", "plain")
    if not sides or set(sides) - set(lanes):
        raise TraceFieldError(f"trace.runs must hold some of {lanes}, got {_show(sides)}")
    for side in sides:
        _run(_field(runs, side, dict, "trace.runs"), f"trace.runs.{side}")
    used = token_ids(runs) | set(trace["settings"]["prompt_ids"])
    outside = sorted(t for t in used if not 0 <= t < vocab)
    if outside:
        shown = [t if abs(t) < 10**18 else _show(t) for t in outside[:5]]
        raise TraceVocabError(f"token ids {shown} are outside the vocabulary of size {vocab}")
    prompt_len = len(trace["settings"]["prompt_ids"])
    for side in sides:
        _consistent_run(runs[side], f"trace.runs.{side}", prompt_len, plain=side == "plain")
    tokens = trace["tokens"]
    for key, text in tokens.items():
        if not _TOKEN_KEY.fullmatch(key) or int(key) >= vocab:
            raise TraceFieldError(f"trace.tokens key {_show(key)} is not a token id (a whole number below {vocab})")
        if not isinstance(text, str):
            raise TraceFieldError(f"trace.tokens[{key!r}] must be a string")
        if len(text) > MAX_TOKEN_CHARS:
            raise TraceFieldError(f"trace.tokens[{key!r}] is {len(text)} characters long; a token's text may be at "
                                  f"most {MAX_TOKEN_CHARS} characters")
    missing = sorted(t for t in token_ids(runs) if str(t) not in tokens)
    if missing:
        raise TraceFieldError(f"trace.tokens has no text for token ids {missing[:5]}")
    chars = sum(map(len, tokens.values())) + (_pieces(trace["pieces"], runs) if "pieces" in trace else 0)
    if chars > MAX_TEXT_CHARS:
        raise TraceFieldError(f"trace.tokens and trace.pieces hold {chars} characters of text; a trace may hold at most "
                              f"{MAX_TEXT_CHARS}")
    if "report" in trace and not isinstance(trace["report"], dict):
        raise TraceFieldError(f"trace.report must be an object, got {type(trace['report']).__name__}")
    return trace
