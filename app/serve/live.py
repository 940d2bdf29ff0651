"""The live race's handlers: `compare` (the Race button and the `compare` endpoint) and Stop.

`compare` checks the page's values once into a `RaceRequest`, has the pair's kind (`sessions.py`)
check it against the pair and prepare it, and streams the
frames of `race_frames`, the race's model work (a race session running it, `view/frames.py`
drawing it), which on ZeroGPU runs in a GPU worker process; it writes the finished race's trace for download. Every `DFlashError` and model
failure reaches the visitor as a message.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ..guard.callers import is_mcp, session_of, visitor_of
from ..guard.limits import Limits, check_request
from ..guard.readers import Readers
from ..guard.traces import TraceStore
from ..hosting.space import gpu_errors_as_messages, gpu_task
from ..race.control import Control, Controls
from ..race.request import RaceRequest
from ..race.stopping import StopRequests
from ..view import texts
from ..view.frames import ChartPacer, Frame, FramePacer, note_frame, race_frame, released_text
from ..view.pinned import run_label
from .failures import failure_message, visitor_error
from .loading import PairLoading

STOP_WAIT_S = 30.0  # a race ends within one engine step of Stop; this only bounds a stuck one


class LiveRace:
    """Races the pairs of `loading` on visitors' prompts, within `limits`; keeps their traces in `traces`."""

    def __init__(self, loading: PairLoading, controls: Controls, limits: Limits, traces: TraceStore,
                 readers: Readers | None = None):
        self.loading = loading
        self.controls = controls  # each session's Pause / Step / Continue
        self.limits = limits
        self.traces = traces
        self.readers = readers or Readers()  # whether anyone still reads a session's stream
        self.stops = StopRequests()
        # On ZeroGPU the model work of GPU pairs runs in a GPU worker process, for a time computed per request.
        self.race_stream, self.runs_in_process = gpu_task(self.race_frames, list(loading.pairs.values()))

    @property
    def pairs(self):
        return self.loading.pairs

    def compare(self, prompt, max_new_tokens, block_size, temperature, top_p, seed, lanes=None, pair_id=None,
                request: gr.Request = None, thinking=None, tree_budget=None):
        """Race DFlash speculative decoding against plain decoding of the same target on one prompt.

        Every lane decodes the same prompt (sent through the target's chat template) with the same
        target model; DFlash drafts a block of tokens per cycle and the target verifies it in one
        pass. `lanes` adds other drafters to the race. Updates stream while the race runs; the last
        one carries the summary and the trace.

        Args:
            prompt: the user message to answer (plain text, not empty); the server wraps it in the target's chat template.
            max_new_tokens: tokens each lane generates at most (a whole number from 1 to the server's limit;
                the lanes raced times this is bounded too).
            block_size: tokens DFlash verifies per cycle, 1 to the drafter's trained block size (1 = no drafting).
            temperature: 0 for greedy decoding, where both outputs must be identical; above 0 samples.
            top_p: nucleus sampling mass in (0, 1]; 1 keeps the whole distribution.
            seed: random seed for sampling (a whole number >= 0).
            lanes: drafters to race beside DFlash and plain decoding, a list of names: "scheduled"
                (DFlash drafting its trained block and verifying, each cycle, the prefix its block
                schedule finds worth the verify cost; block_size does not apply to it), "tree"
                (DFlash verifying, each cycle, a tree of `tree_budget` drafts grown from its one
                pass's per-slot top candidates, in one target pass), "dflash2"
                (a DFlash2 drafter: one pass, then a path through each slot's top candidates),
                "fusion" (a drafter fed the target's features at its input only), "ar" (an
                autoregressive drafter with DFlash's KV injection, one pass per draft) - these three
                only on pairs that ship that drafter - and "lookup" (prompt lookup: copies what
                followed an earlier match in the context, no model). Empty or omitted: DFlash and
                plain decoding only.
            thinking: "on" or "off" turns the chat template's thinking switch (enable_thinking, in
                Qwen3-style templates) for every lane's prompt; "default" or omitted uses the setting
                the pair's drafter was trained with. A pair whose template has no switch refuses "on" and "off".
            tree_budget: the "tree" lane's draft nodes per cycle, 1 to 32 (omitted: 4).

        Returns:
            The race's outputs; the `report` one is a JSON summary: `tau` (mean tokens accepted per
            DFlash cycle, the target's own bonus token included), `speedup` (plain seconds per token
            over DFlash seconds per token, each side on its own compute clock), `identical` (at
            temperature 0, whether both outputs are the same tokens; null when sampling or stopped
            before both sides reached the same length), `first_difference`, `dflash_tok_s`,
            `plain_tok_s`, the times to first token, token counts, `cycles`, `stopped`, the
            acceptance histogram and per-position acceptance, and `lanes`: per lane raced, its
            method, tau, speedup, tok/s, draft passes and milliseconds per cycle, and whether its
            output equals plain decoding's. `trace_file` is the full trace (JSON).
        """
        cache = self.loading.cache
        if cache is None:
            raise visitor_error(texts.NO_MODEL)
        spec = self.pairs.get(pair_id or self.loading.default_id)
        if spec is None:
            raise visitor_error(texts.UNKNOWN_MODEL_PAIR.format(pair_id=pair_id))
        try:
            req = check_request(self.limits, spec.id, prompt, max_new_tokens, block_size, temperature, top_p, seed,
                                lanes, thinking, tree_budget)
        except (ValueError, OverflowError) as exc:  # DFlashError is a ValueError too
            raise visitor_error(str(exc)) from None
        prompt_ids = yield from self.loading.kinds[spec.kind].prepare(spec, req, self.limits)
        yield from self._stream(req, prompt_ids, session_of(request), mcp=is_mcp(request),
                                reader=getattr(request, "session_hash", None), visitor=visitor_of(request))

    def _stream(self, req: RaceRequest, prompt_ids: list[int], session: str | None, mcp: bool = False,
                reader: str | None = None, visitor: str = ""):
        """The frames of the race of a checked request, its trace written once it has finished.

        mcp: an agent's call, in a session of its own for this one race: no Pause / Step.
        reader: the session whose event stream carries the frames; once nobody reads it, the race
        stops (and writes no trace). visitor: who asked (`callers.visitor_of`), whose traces are bounded.
        """
        in_process = self.runs_in_process(req.pair_id)
        gone = self.readers.watch(reader)
        # The frames' HTML streamed so far, in characters (as many bytes but for the rare non-ASCII), and its bound.
        sent, budget = 0, self.limits.max_race_mb * 1_000_000
        with self.stops.running(session) as flag:
            stop = lambda: flag.is_set() or gone() or sent > budget  # noqa: E731  (Stop, the visitor left, or the bytes)
            # Where the race runs in another process (ZeroGPU), the flag cannot reach it: the race is
            # closed from here instead, and the summary can only say that it stopped.
            # Pause / Step reach the race only where it runs in this process.
            # An agent's race gets a control of its own (nobody can pause it), for the same budgets.
            if in_process:
                control = self.controls.get(session) if not mcp else self.controls.detached()
                control.viewer.label = run_label(
                    self.pairs[req.pair_id].label, f"block {req.block_size}, T={req.temperature:g}, "
                    f"at most {req.max_new_tokens} tokens", req.prompt)
                control.viewer.prompt_ids = tuple(prompt_ids)
            kwargs = {"control": control} if in_process else {}
            stream = self.race_stream(req, prompt_ids, stop=stop if in_process else None, **kwargs)
            try:
                for frame, data in gpu_errors_as_messages(stream):
                    over = sent > budget
                    if stop() and not in_process:
                        yield note_frame(texts.RACE_BYTES.format(mb=self.limits.max_race_mb) if over
                                         else texts.STOPPED).values()
                        return
                    if data is not None and not gone():
                        frame.trace_file = self.traces.write(session, data, visitor)
                        frame.trace_csv = str(Path(frame.trace_file).with_suffix(".csv"))
                    if data is not None and over:
                        frame.control_status = texts.RACE_BYTES.format(mb=self.limits.max_race_mb)
                    values = frame.values()
                    sent += sum(len(value) for value in values if isinstance(value, str))
                    yield values
            finally:
                stream.close()

    def race_frames(self, req: RaceRequest, prompt_ids: list[int], stop=None, control: Control | None = None):
        """The model work of one checked race request: yields (Frame, None) while it runs, then (Frame, trace).

        Takes and yields only plain data, so that it can run in a GPU worker process (ZeroGPU);
        `control` (Pause / Step) is given only when it runs in this process. `prompt_ids` went
        through the chat template with `req.thinking` (the trace records it).
        """
        spec = self.pairs[req.pair_id]
        kind = self.loading.kinds[spec.kind]
        device = kind.device(spec)
        try:
            race = kind.open(spec, device, req, prompt_ids)
        except Exception as exc:  # noqa: BLE001 - a server down or serving another model reaches the visitor
            raise visitor_error(failure_message(exc, device)) from None
        viewer = control.viewer if control is not None else None
        pacer, drawn = ChartPacer(), FramePacer()

        def running() -> str | None:
            # Local races: compiled or eager steps, and why (decided again after a wait for the pair).
            steps = getattr(race, "steps", None)
            return " ".join(filter(None, (kind.running_note, steps and texts.STEPS_RUNNING.format(steps=steps)))) or None

        said = None
        try:
            for snapshot in race.snapshots(stop, control):
                waiting = getattr(race, "waiting", None)
                if waiting is not None and waiting != said:  # the pair is busy: say with what, once
                    said = waiting
                    yield note_frame(texts.RACE_WAITING_STEP.format(step=waiting) if waiting else texts.RACE_WAITING), None
                    continue
                if snapshot.idle:  # nothing new: the frame only lets Gradio see a client that left
                    yield Frame(), None
                    continue
                if snapshot.done or not drawn.due(snapshot):  # the browser is still drawing the last frame
                    continue
                charts = pacer.due(snapshot)
                frame = race_frame(snapshot, race.pieces, race.text_of, None, charts, viewer, running=running())
                drawn.sent(frame.html_bytes(), charts=charts)
                yield frame, None
        except Exception as exc:  # noqa: BLE001 - OOM and CUDA errors mid-race reach the visitor too
            raise visitor_error(failure_message(exc, device)) from None
        if race.last is None:
            yield note_frame(texts.STOPPED_WAITING), None
            return
        steps = getattr(race, "steps", None)
        steps = steps and texts.STEPS.format(steps=steps)
        note = kind.running_note
        released = released_text(race.last, control)
        result = race.result()
        if result is None:
            yield note_frame(released or texts.STOPPED_EARLY), None
            return
        if released is not None:
            note = f"{released} {texts.OWN_CLOCKS}"
        # What a replay of its trace says too (`recorded_thinking`); a vLLM pair's servers applied the template.
        thinking = getattr(race, "thinking", None)
        if thinking is not None and thinking.used is not None:
            note = f"{texts.RECORDED_THINKING.format(words=thinking.words())} {note or texts.OWN_CLOCKS}"
        if steps:
            note = f"{note or texts.OWN_CLOCKS} {steps}"
        if result.report.stopped:
            # Stop answers with the text alone first: the hover boxes and the charts double what the
            # browser draws, and they follow once it can have drawn the text (sent together, the
            # page would show both at once).
            text = race_frame(race.last, race.pieces, race.text_of, result.report, False, viewer, note=note, hover=False)
            drawn.sent(text.html_bytes())
            yield text, None
            result.trace  # noqa: B018  (built while the browser draws the text)
            drawn.wait()
        frame = race_frame(race.last, race.pieces, race.text_of, result.report, True, viewer, note=note)
        if released is not None:
            frame.control_status = released
        yield frame, result.trace

    def stop(self, request: gr.Request = None) -> None:
        """The Stop button: asks this session's race to end; returns once it has (or after STOP_WAIT_S)."""
        self.stops.request(session_of(request), wait_s=STOP_WAIT_S)

