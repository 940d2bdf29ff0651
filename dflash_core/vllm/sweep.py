"""Throughput across concurrency on two vLLM servers: plain and DFlash with 1, 2, 4, ... requests at once.

`sweep` sends, at each level c, c requests at a time (c client threads over `vllm_client.complete`,
each sending `rounds` greedy chat completions one after another) to the DFlash server and c to the
plain server, both at once (`together=False`: DFlash's, then plain's), and yields one `Level` as each
level finishes: total output tokens per second, the mean and p90 latency of a request, vLLM's
acceptance length over the level (from the DFlash server's `/metrics` counters, read before and
after), the speedup of DFlash over plain, and how many DFlash outputs equal plain's for the same
request. `python -m dflash_core.bench --peer vllm --concurrency LIST` prints it
(`bench/concurrency.py`); the app's serving view draws it live.

The servers are the two of `scripts/serve_vllm.sh` (started with `MAX_NUM_SEQS` at least the
highest level, or vLLM queues what is beyond its batch), or any pair of OpenAI-compatible URLs.
Both at once is the default because serve_vllm.sh binds each server to cores of its own: on a
machine shared with other jobs, the two sides then decode under the same load, where one after the
other each meets whatever load its own minutes bring. Servers that share their cores (or one GPU)
need `together=False`.

Everything is bounded (`Bounds`): the number of levels and the highest, the requests per level,
the tokens per request and the seconds of the whole sweep; a level the time budget or a stop left
out is still reported, with the reason.
"""

from __future__ import annotations

import json
import math
import queue
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from ..errors import DFlashError
from .client import ServedModel, VllmServerError, complete, plain_url_of, served_model, spec_counters

NATURAL = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "natural.jsonl"


class SweepError(DFlashError):
    """A concurrency sweep asked for outside its bounds, or servers that cannot run it."""


@dataclass(frozen=True)
class Bounds:
    """What one sweep may ask for. The command line's are wide; the app's serving view passes its own."""

    max_level: int = 64  # simultaneous requests at one level
    max_levels: int = 8
    max_requests: int = 256  # requests per level and server (level x rounds)
    max_new_tokens: int = 512
    max_seconds: float = 3600.0  # the whole sweep, both servers


@dataclass(frozen=True)
class Settings:
    levels: tuple[int, ...]
    max_new_tokens: int = 64
    rounds: int = 2  # requests each client sends, one after another, at every level
    max_seconds: float = 900.0
    together: bool = True  # both servers' requests at once; False: DFlash's, then plain's


def _whole(value, what: str) -> int:
    """`value` as an int where it is a whole number (an int, an integral float, or digits), else SweepError."""
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,18}\s*", value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise SweepError(f"{what} must be a whole number, got {str(value)[:40]!r}")


def parse_levels(levels, bounds: Bounds = Bounds()) -> tuple[int, ...]:
    """The levels in ascending order from "1,2,4" or a list; SweepError naming a bad one (not a whole
    number, below 1, over `bounds.max_level`, repeated, or more levels than `bounds.max_levels`)."""
    items = [x.strip() for x in levels.split(",")] if isinstance(levels, str) else list(levels or ())
    items = [x for x in items if x != ""]
    if not items:
        raise SweepError("no concurrency level given: pass levels such as 1,2,4,8")
    if len(items) > bounds.max_levels:
        raise SweepError(f"{len(items)} concurrency levels given; a sweep runs at most {bounds.max_levels}")
    numbers = [_whole(x, "a concurrency level") for x in items]
    for n in numbers:
        if not 1 <= n <= bounds.max_level:
            raise SweepError(f"concurrency level {n} is out of range: levels are 1 to {bounds.max_level}")
    repeated = sorted({n for n in numbers if numbers.count(n) > 1})
    if repeated:
        raise SweepError(f"concurrency level {repeated[0]} is given twice")
    return tuple(sorted(numbers))


def check_settings(levels, max_new_tokens, rounds, max_seconds, bounds: Bounds = Bounds(), together=True) -> Settings:
    """Clean settings, or SweepError naming the bad value and its bound."""
    parsed = parse_levels(levels, bounds)
    tokens = _whole(max_new_tokens, "max_new_tokens")
    if not 1 <= tokens <= bounds.max_new_tokens:
        raise SweepError(f"max_new_tokens must be between 1 and {bounds.max_new_tokens}, got {tokens}")
    rounds = _whole(rounds, "rounds")
    if rounds < 1:
        raise SweepError(f"rounds must be at least 1, got {rounds}")
    if parsed[-1] * rounds > bounds.max_requests:
        raise SweepError(f"level {parsed[-1]} x {rounds} rounds is {parsed[-1] * rounds} requests per server; "
                         f"a level sends at most {bounds.max_requests}")
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or not (
            0 < max_seconds <= bounds.max_seconds):
        raise SweepError(f"the time budget must be more than 0 and at most {bounds.max_seconds:g} s, got {max_seconds!r}")
    return Settings(parsed, tokens, rounds, float(max_seconds), bool(together))


def natural_prompts(limit: int, path: str | Path | None = None) -> list[str]:
    """`limit` prompt texts spread over a JSON-lines file of {"prompt": ...} (default: the natural set)."""
    rows = [json.loads(line) for line in Path(path or NATURAL).read_text().splitlines() if line.strip()]
    step = max(1, len(rows) // max(1, limit))
    return [row["prompt"] for row in rows[::step][:limit]]


@dataclass(frozen=True)
class ServerRun:
    """One level on one server: `requests` sent, `finished` of them, their output tokens and times."""

    requests: int
    finished: int
    seconds: float  # wall time from the first request sent to the last answer
    output_tokens: int
    tok_s: float
    mean_latency_s: float | None
    p90_latency_s: float | None
    acceptance_length: float | None  # from the server's counters over the level; None for plain decoding
    outputs: tuple = field(default=(), repr=False)  # per request: output ids, or None where not sent


@dataclass(frozen=True)
class Level:
    """One concurrency level, both servers: the event `sweep` yields as each level finishes."""

    level: int
    plain: ServerRun | None
    dflash: ServerRun | None
    note: str | None = None  # why the level was cut or not run

    @property
    def speedup(self) -> float | None:
        """DFlash's total tok/s over plain's."""
        if self.plain is None or self.dflash is None or not self.plain.tok_s:
            return None
        return self.dflash.tok_s / self.plain.tok_s

    @property
    def identical(self) -> tuple[int, int]:
        """(DFlash outputs equal to plain's output of the same request, requests both finished)."""
        if self.plain is None or self.dflash is None:
            return 0, 0
        pairs = [(d, p) for d, p in zip(self.dflash.outputs, self.plain.outputs) if d is not None and p is not None]
        return sum(d == p for d, p in pairs), len(pairs)

    def to_dict(self) -> dict:
        def run(r: ServerRun | None):
            return None if r is None else {k: v for k, v in asdict(r).items() if k != "outputs"}

        same, compared = self.identical
        return {"level": self.level, "plain": run(self.plain), "dflash": run(self.dflash), "speedup": self.speedup,
                "identical": same, "compared": compared, "note": self.note}


def check_servers(dflash_url: str, plain_url: str | None) -> tuple[ServedModel, ServedModel, int]:
    """Both servers' model and the DFlash server's K; SweepError where they do not form a pair."""
    dflash, plain = served_model(dflash_url), served_model(plain_url or plain_url_of(dflash_url))
    if dflash.name != plain.name:
        raise SweepError(f"the two servers serve different models: {dflash.name} at {dflash.url}, "
                         f"{plain.name} at {plain.url}")
    counters = spec_counters(dflash)
    if counters is None:
        raise SweepError(f"{dflash.url} reports no speculative-decoding counters on /metrics: it is not serving "
                         "with --speculative-config (or runs with --disable-log-stats)")
    if spec_counters(plain) is not None:
        raise SweepError(f"{plain.url} speculates too: the plain server must run without --speculative-config")
    return dflash, plain, counters.positions


def _p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def run_level(server: ServedModel, level: int, prompts: list[str], max_new_tokens: int, deadline: float,
              stop: Callable[[], bool] = lambda: False, clock=time.perf_counter) -> ServerRun:
    """`prompts` (one per request) through `level` client threads; no request starts past `deadline`."""
    before = spec_counters(server)
    todo: queue.Queue = queue.Queue()
    for job in enumerate(prompts):
        todo.put(job)
    done: list = [None] * len(prompts)
    errors: list[BaseException] = []

    def client():
        while not errors and not stop() and clock() < deadline:
            try:
                j, prompt = todo.get_nowait()
            except queue.Empty:
                return
            sent = clock()
            try:
                answer = complete(server, prompt, max_new_tokens=max_new_tokens)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                errors.append(exc)
                return
            done[j] = (clock() - sent, answer.output_ids)

    start = clock()
    clients = [threading.Thread(target=client, daemon=True, name=f"sweep-{level}-{i}") for i in range(level)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    seconds = clock() - start
    if errors:
        raise errors[0] if isinstance(errors[0], DFlashError) else VllmServerError(f"{server.url}: {errors[0]}")
    after = spec_counters(server)
    latencies = [d[0] for d in done if d is not None]
    tokens = sum(len(d[1]) for d in done if d is not None)
    return ServerRun(requests=len(prompts), finished=len(latencies), seconds=seconds, output_tokens=tokens,
                     tok_s=tokens / seconds if seconds > 0 else 0.0,
                     mean_latency_s=statistics.fmean(latencies) if latencies else None,
                     p90_latency_s=_p90(latencies) if latencies else None,
                     acceptance_length=after.acceptance_length(before) if before and after else None,
                     outputs=tuple(None if d is None else d[1] for d in done))


def sweep(dflash: ServedModel, plain: ServedModel, settings: Settings, prompts: list[str], *,
          stop: Callable[[], bool] = lambda: False, clock=time.perf_counter) -> Iterator[Level]:
    """One `Level` per level of `settings`, in order, as each finishes: both servers' runs at once
    (`settings.together`), else DFlash's, then plain's.

    Request j of a level sends prompts[j % len(prompts)]: every level sends the same mix of prompts
    where len(prompts) divides level x rounds (`uneven_levels` names the others). Each server first answers one short
    request outside the clock. Past `settings.max_seconds` (or once `stop()`), no request starts:
    the level under way is cut (its note says how far it got) and the rest are yielded unrun.
    """
    if not prompts:
        raise SweepError("the sweep needs at least one prompt")
    start = clock()
    deadline = start + settings.max_seconds
    for server in (dflash, plain):
        complete(server, prompts[0], max_new_tokens=4)  # load and warm up outside the clock
    for level in settings.levels:
        jobs = [prompts[j % len(prompts)] for j in range(level * settings.rounds)]
        if stop() or clock() >= deadline:
            why = "stopped" if stop() else f"the sweep's time budget ({settings.max_seconds:g} s) was spent"
            yield Level(level, None, None, note=f"not run: {why}")
            continue
        run = partial(run_level, level=level, prompts=jobs, max_new_tokens=settings.max_new_tokens,
                      deadline=deadline, stop=stop, clock=clock)
        runs = _run_both({"dflash": dflash, "plain": plain}, settings.together, run)
        cut = [f"{name} {r.finished}/{r.requests}" for name, r in runs.items() if r.finished < r.requests]
        why = "stopped" if stop() else "cut at the time budget"
        note = f"{why}: requests finished {', '.join(cut)}" if cut else None
        yield Level(level, runs["plain"], runs["dflash"], note=note)


def uneven_levels(settings: Settings, num_prompts: int) -> list[int]:
    """The levels whose requests send some prompts more often than others (level x rounds is not a
    multiple of the prompts): their acceptance length and speed are over another mix of prompts."""
    return [level for level in settings.levels if (level * settings.rounds) % num_prompts]


def _run_both(servers: dict[str, ServedModel], together: bool, run: Callable[[ServedModel], ServerRun]) -> dict:
    """`run` on each server, all at once in threads of their own or one after the other; a failure is raised here."""
    if not together:
        return {name: run(server) for name, server in servers.items()}
    results: dict = {}

    def side(name, server):
        try:
            results[name] = run(server)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            results[name] = exc

    threads = [threading.Thread(target=side, args=item, daemon=True) for item in servers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outcome in results.values():
        if isinstance(outcome, BaseException):
            raise outcome
    return {name: results[name] for name in servers}


def stops_paying(levels: list[Level]) -> int | None:
    """The lowest level from which DFlash is slower than plain at that level and every higher one run."""
    measured = [lv for lv in levels if lv.speedup is not None]
    for i, lv in enumerate(measured):
        if all(x.speedup < 1.0 for x in measured[i:]):
            return lv.level
    return None
