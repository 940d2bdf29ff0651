"""The serving view's handler: throughput across concurrency on a vLLM pair's two servers, live.

`Serving.sweep` runs the engine's sweep (`dflash_core.vllm.sweep.sweep`) at the levels a
visitor picks and yields the figure, the table and a status line after each level. It is bounded
as a race is, and tighter: wired in the race queue (one at a time with races, `--per-visitor` and
`--max-queue` apply), at most `MAX_LEVEL` requests at once and `ROUNDS` per client, at most
`MAX_NEW_TOKENS` tokens each, and `--max-race-s` for the whole sweep; it stops sending once nobody
reads the page. Where the app has no vLLM pair, the view says how to start one.
"""

from __future__ import annotations

from dflash_core.vllm import (
    Bounds,
    SweepError,
    VllmServerError,
    check_servers,
    check_settings,
    natural_prompts,
    plain_url_of,
    stops_paying,
    sweep,
)

from ..guard.limits import Limits
from ..guard.readers import Readers
from ..pairs.registry import PairSpec
from ..view import texts
from ..view.serving import serving_figure, serving_table_html
from .failures import visitor_error

LEVELS = (1, 2, 4, 8)  # offered; a sweep in the app sends at most MAX_LEVEL requests at once
MAX_LEVEL = 8
ROUNDS = 4  # requests each client sends at a level: level 8 sends 32 to each server
MAX_NEW_TOKENS = 64
# One prompt per category of the natural set (math, code, chat, writing): with ROUNDS a multiple of
# it, every level sends each prompt equally often, so the levels differ in concurrency alone.
NUM_PROMPTS = 4


class Serving:
    """The sweep on the vLLM pairs among `pairs`, within `limits`."""

    def __init__(self, pairs: dict[str, PairSpec], limits: Limits, readers: Readers | None = None):
        self.pairs, self.limits = pairs, limits
        self.readers = readers or Readers()
        self.bounds = Bounds(max_level=MAX_LEVEL, max_levels=len(LEVELS), max_requests=MAX_LEVEL * ROUNDS,
                             max_new_tokens=min(MAX_NEW_TOKENS, limits.max_new_tokens),
                             max_seconds=float(limits.max_race_s))

    def pair(self, pair_id: str | None) -> PairSpec | None:
        """The vLLM pair `pair_id` names, else the first vLLM pair; None where the app has none."""
        chosen = self.pairs.get(pair_id or "")
        if chosen is not None and chosen.kind == "vllm":
            return chosen
        return next((p for p in self.pairs.values() if p.kind == "vllm"), None)

    def intro(self) -> str:
        """The view's text before a sweep: which servers it asks, or how to start them."""
        spec = self.pair(None)
        if spec is None:
            return texts.SERVING_NO_VLLM
        plain = spec.vllm_plain_url or plain_url_of(spec.vllm_url)
        return texts.SERVING_INTRO.format(dflash=spec.vllm_url, plain=plain, rounds=ROUNDS,
                                          seconds=self.limits.max_race_s)

    def sweep(self, levels, max_new_tokens, pair_id: str | None = None, request=None):
        """Generator of (figure, table HTML, status markdown): before the first level, then after each."""
        spec = self.pair(pair_id)
        if spec is None:
            raise visitor_error(texts.SERVING_NO_VLLM)
        try:
            settings = check_settings(levels, max_new_tokens, ROUNDS, self.bounds.max_seconds, self.bounds)
        except SweepError as exc:
            raise visitor_error(str(exc)) from None
        done = []  # the `Level`s finished

        def frame(status: str):
            shown = [level.to_dict() for level in done]
            return serving_figure(shown), serving_table_html(shown), status

        try:
            dflash, plain, k = check_servers(spec.vllm_url, spec.vllm_plain_url or None)
        except (SweepError, VllmServerError) as exc:
            yield frame(texts.SERVING_FAILED.format(why=exc))
            return
        running = texts.SERVING_RUNNING.format(k=k, tokens=settings.max_new_tokens, rounds=ROUNDS)
        yield frame(f"{running} {texts.SERVING_LEVEL.format(level=settings.levels[0])}")
        gone = self.readers.watch(getattr(request, "session_hash", None))
        prompts = natural_prompts(NUM_PROMPTS)
        try:
            for level in sweep(dflash, plain, settings, prompts, stop=gone):
                done.append(level)
                rest = settings.levels[len(done):]
                yield frame(f"{running} {texts.SERVING_LEVEL.format(level=rest[0])}" if rest else _verdict(done))
        except (SweepError, VllmServerError) as exc:
            yield frame(texts.SERVING_FAILED.format(why=exc))


def _verdict(levels) -> str:
    """The status line once every level is in: where speculation stopped paying, if it did."""
    where = stops_paying(levels)
    if where is not None:
        return texts.SERVING_STOPS_PAYING.format(level=where)
    return texts.SERVING_PAYS if any(level.speedup is not None for level in levels) else texts.SERVING_NONE
