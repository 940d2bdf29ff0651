"""One race-session factory per pair kind: how the app prepares, labels and opens the race of a pair.

A pair's `kind` (`app/pairs/pairs.json`) picks its factory in `race_kinds`: `LocalRaces` for models
that load in this process (`RaceSession`), `VllmRaces` for a pair served by two vLLM servers
(`VllmRaceSession`). Each factory answers the same five questions, so the handlers hold no branch
on the kind, and a new kind of pair (another peer engine, a serving view) is one new class here.
"""

from __future__ import annotations

import gradio as gr

from ..guard.limits import check_prompt_tokens
from ..race.lanes import DRAFTER_LANES, LABELS
from ..race.request import RaceRequest
from ..race.session import RaceSession, check_race
from ..view import texts
from ..view.frames import start_frame
from .failures import failure_message, visitor_error


class LocalRaces:
    """Pairs whose models load here: loaded (with progress) before the race, raced as `RaceSession`."""

    running_note = None  # said under the panes while racing

    def __init__(self, loading):
        self.loading = loading  # the `PairLoading` whose cache holds the models

    def device(self, spec) -> str:
        return self.loading.cache.device_for(spec)

    def status(self, spec):
        """The pair selector's status lines for `spec`, with the block-size slider (`PairLoading.load_status`)."""
        yield from self.loading.load_status(spec)

    def prepare(self, spec, req: RaceRequest, limits):
        """Generator: checks the lanes, loads the pair (yielding start frames with its progress),
        checks `req` against it (the engine's own checks) and returns the prompt's token ids,
        checked against `limits` and the target's context."""
        pairs, cache, names = self.loading.pairs, self.loading.cache, req.lanes
        for lane in (name for name in names if name in DRAFTER_LANES):
            why = spec.lane_missing(lane)
            if why:
                offered = [p.label for p in pairs.values() if p.kind == "local" and not p.lane_missing(lane)]
                raise visitor_error(texts.NO_LANE_DRAFTER.format(
                    label=spec.label, lane=LABELS[lane], why=why, pairs="; ".join(offered) or "none"))
        if req.block_size == 1:
            gr.Warning(texts.NO_DRAFTING)
        # Clear the previous race at once, so old tokens and numbers never mix with new ones.
        loading = texts.RACE_LOADING.format(label=spec.label)
        yield start_frame(loading if not cache.is_loaded(spec) else texts.RACING, names).values()
        try:
            pair = yield from self.loading.load(spec, lambda line: start_frame(f"{loading} {line}", names).values())
            prompt_ids = pair.encode(req.prompt, req.thinking)  # one prompt for every lane
        except Exception as exc:  # noqa: BLE001 - bad input, OOM, CUDA errors, missing files: all reach the visitor
            raise visitor_error(failure_message(exc, cache.device_for(spec))) from None
        try:
            check_prompt_tokens(len(prompt_ids), limits, pair.context_length)
        except ValueError as exc:  # the visitor's prompt, said as it is
            raise visitor_error(str(exc)) from None
        try:
            check_race(req, pair)
        except ValueError as exc:  # GenerationInputError: the engine's checks, in the lane's words
            raise visitor_error(str(exc)) from None
        return prompt_ids

    def open(self, spec, device, req: RaceRequest, prompt_ids: list[int]) -> RaceSession:
        return RaceSession(self.loading.cache.get(spec), device, req, prompt_ids)


class VllmRaces:
    """Pairs served by vLLM: nothing loads here; the servers' DFlash (at the block they serve)
    races their plain decoding, with DFlash and plain decoding as the only lanes."""

    def __init__(self, loading):
        self.loading = loading

    @property
    def running_note(self) -> str:
        from ..race.vllm_session import WHAT_IS_NOT_REPORTED

        return WHAT_IS_NOT_REPORTED

    def device(self, spec) -> str:
        return "vLLM server"

    def status(self, spec):
        from ..race.vllm_session import servers_of

        yield servers_of(spec).status(), gr.update(maximum=spec.block_size, value=spec.block_size)

    def prepare(self, spec, req: RaceRequest, limits):
        """Generator: refuses what the servers cannot honour (vLLM fixes the speculative block per
        server and templates the prompt itself), then yields the start frame; returns no token ids."""
        if req.block_size != spec.block_size:
            raise visitor_error(texts.VLLM_BLOCK.format(served=spec.block_size, asked=req.block_size))
        if req.lanes != ("dflash", "plain"):
            raise visitor_error(texts.VLLM_LANES)
        if req.thinking is not None:
            raise visitor_error(texts.VLLM_THINKING.format(choice=req.thinking))
        yield start_frame(texts.RACING, req.lanes).values()
        return []  # the servers tokenize the prompt themselves

    def open(self, spec, device, req: RaceRequest, prompt_ids: list[int]):
        from ..race.vllm_session import VllmRaceSession, servers_of

        return VllmRaceSession(servers_of(spec), req)


def race_kinds(loading) -> dict[str, LocalRaces | VllmRaces]:
    """The factory of each pair kind, over the pairs and models of `loading`."""
    return {"local": LocalRaces(loading), "vllm": VllmRaces(loading)}
