"""The Gradio Blocks: controls, the two race panes, live charts, summary and trace download.

Handlers here only wire inputs to the engine's `generate` (or a recorded trace, `replay.py`), feed
its events to `race`, and pass the snapshots to the renderers; they translate every `DFlashError`
into a message for the user. torch and the models are imported only when a live race needs them,
so a replay-only app (`python app.py --replay FILE`) starts without them.
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from dataclasses import field, make_dataclass
from pathlib import Path

import gradio as gr
from gradio.utils import abspath as gradio_abspath
from gradio.utils import get_upload_folder

from . import charts, render
from .control import Controls
from .cycle_view import cycle_html
from .examples import EXAMPLES
from .failures import failure_message
from .howto import howto_html
from .limits import Limits, check_prompt_tokens, check_request
from .pairs import PairSpec, availability
from .race import SideView, Snapshot, race
from .replay import RecordedPieces, ReplayError, load_trace, shipped_traces
from .space import explain_gpu_errors, gpu_task
from .speedup import FORMULA_MD, speedup_figure
from .stopping import StopRequests
from .tips import TIP_CSS, TIP_JS
from .tokens import TokenPieces
from .traces import TraceStore

CHART_EVERY_S = 0.4  # plotly figures are heavy to ship; text frames go out more often
PROGRESS_EVERY_S = 0.25  # download progress lines at most this often
EXPLAIN_TOP_K = 5  # every cycle is explained (top-5 of drafter and target) for the views and the trace
STOP_WAIT_S = 30.0  # a race ends within one engine step of Stop; this only bounds a stuck one

INTRO = """# ⚡ DFlash Studio
Speculative decoding with a **block-diffusion drafter**: the drafter proposes a whole block of tokens
in one pass, the target verifies it in one pass and keeps the longest agreeing prefix plus one token of
its own. Both panes decode the same prompt with the same target; the race is paced on each side's own
compute time, so what you see matches the measured speeds.

Block size is a hardware trade-off: a bigger block lets more tokens be accepted per cycle, but on a
CPU verifying 16 tokens costs several plain steps (4 cost one to one and a half), so here the block-4 pair is the
faster one; on a GPU a 16-token verify costs about what one token does, the setting of the paper."""


# Where no model can run, the page still shows a real race.
REPLAY_HINT = "The *Replay a recorded run* tab plays races recorded on the default pair, with no model."


# The race's outputs by name, in the order of the `compare` endpoint's outputs.
FRAME_FIELDS = (
    "summary", "dflash_stats", "dflash_tokens", "dflash_strip", "plain_stats", "plain_tokens",
    "acceptance_chart", "speed_chart", "histogram_chart", "positions_chart",
    "speedup_chart", "cycle_pick", "cycle_view", "control_status", "trace_csv", "report", "trace_file",
)


def _frame_values(frame) -> tuple:
    return tuple(getattr(frame, name) for name in FRAME_FIELDS)


# One update of the race's outputs; a field left at its default (`gr.skip()`) keeps what is shown.
Frame = make_dataclass(
    "Frame", [(name, object, field(default_factory=gr.skip)) for name in FRAME_FIELDS], namespace={"values": _frame_values}
)
Frame.__module__ = __name__  # frames cross process boundaries (ZeroGPU) by pickle


class App:
    """Holds the pair registry and the model cache; its methods are the event handlers."""

    def __init__(
        self,
        pairs: list[PairSpec],
        default_id: str,
        cache,
        limits: Limits | None = None,
        traces: TraceStore | None = None,
    ):
        self.pairs = {p.id: p for p in pairs}
        self.default_id = default_id if default_id in self.pairs else (pairs[0].id if pairs else "")
        self.cache = cache  # a PairCache; None in a replay-only app
        self.controls = Controls()  # each session's Pause / Step / Continue
        self.limits = limits or Limits()
        self.traces = traces or TraceStore()
        self.stops = StopRequests()
        # On ZeroGPU the model work of GPU pairs runs in a GPU worker process, for a time computed per request.
        self.race_stream, self.runs_in_process = gpu_task(self.race_frames, pairs)

    # --- pair selection and loading -----------------------------------------------------------
    def loading(self, spec: PairSpec, frame):
        """Generator: loads `spec` in a worker and yields `frame(line)` for each progress line
        (Hub downloads in bytes and files); returns the loaded pair or raises what the load raised."""
        updates: queue.Queue = queue.Queue()
        result = {}

        def work():
            try:
                result["pair"] = self.cache.get(spec, progress=updates.put)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which explains it
                result["error"] = exc
            finally:
                updates.put(None)

        threading.Thread(target=work, daemon=True).start()
        last = float("-inf")
        while (update := updates.get()) is not None:
            now = time.perf_counter()
            if now - last >= PROGRESS_EVERY_S:  # a download reports many times a second
                last = now
                yield frame(update.message())
        if "error" in result:
            raise result["error"]
        return result["pair"]

    def load_selected(self, pair_id: str):
        """Generator for the status line: loading (with download progress), then ready or why not."""
        spec = self.pairs.get(pair_id)
        if spec is None:
            yield f"⚠ Unknown pair {pair_id!r}.", gr.skip()
            return
        device = self.cache.device_for(spec)
        reason = availability(spec, device)
        if reason:
            yield f"⚠ **Unavailable:** {reason} {REPLAY_HINT}", gr.skip()
            return
        loading = f"Loading **{spec.label}** on {device} (first time only)"
        if not self.cache.is_loaded(spec):
            yield f"{loading}…", gr.skip()
        try:
            pair = yield from self.loading(spec, lambda line: (f"{loading}: {line}…", gr.skip()))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, the app keeps serving
            yield f"⚠ **Could not load {spec.label}:** {failure_message(exc, device)} {REPLAY_HINT}", gr.skip()
            return
        trained = pair.trained_block_size
        freed = f" Freed {', '.join(self.cache.freed)} to make room." if self.cache.freed else ""
        status = (
            f"✓ **{spec.label}** ready on {device} (loaded in {pair.load_s:.1f} s); "
            f"target in {pair.numerics}; drafter trained with block size {trained}; "
            f"prompts through {pair.chat_template}.{freed}"
        )
        yield status, gr.update(maximum=trained, value=trained)

    def select_pair(self, pair_id: str):
        """The pair selector (also the `select_pair` endpoint): this session races `pair_id` from now on,
        once it loads; yields (pair for the session, status line, block-size slider) like `load_selected`."""
        keep = pair_id if pair_id in self.pairs else gr.skip()
        for status, block_size in self.load_selected(pair_id):
            yield keep, status, block_size

    # --- the race --------------------------------------------------------------------------------
    def compare(self, prompt, max_new_tokens, block_size, temperature, top_p, seed, pair_id=None, request: gr.Request = None):
        """Race DFlash speculative decoding against plain decoding of the same target on one prompt.

        Both sides decode the same prompt (sent through the target's chat template) with the same
        target model; DFlash drafts a block of tokens per cycle and the target verifies it in one
        pass. Updates stream while the race runs; the last one carries the summary and the trace.

        Args:
            prompt: the user message to answer (plain text, not empty); the server wraps it in the target's chat template.
            max_new_tokens: tokens each side generates at most (a whole number from 1 to the server's limit).
            block_size: tokens DFlash verifies per cycle, 1 to the drafter's trained block size (1 = no drafting).
            temperature: 0 for greedy decoding, where both outputs must be identical; above 0 samples.
            top_p: nucleus sampling mass in (0, 1]; 1 keeps the whole distribution.
            seed: random seed for sampling (a whole number >= 0).

        Returns:
            The race's outputs; the `report` one is a JSON summary: `tau` (mean tokens accepted per
            DFlash cycle, the target's own bonus token included), `speedup` (plain seconds per token
            over DFlash seconds per token, each side on its own compute clock), `identical` (at
            temperature 0, whether both outputs are the same tokens; null when sampling or stopped
            before both sides reached the same length), `first_difference`, `dflash_tok_s`,
            `plain_tok_s`, the times to first token, token counts, `cycles`, `stopped`, the
            acceptance histogram and per-position acceptance. `trace_file` is the full trace (JSON).
        """
        if self.cache is None:
            raise gr.Error("This app was started with --replay: no model is loaded. Replay a recorded run instead.")
        spec = self.pairs.get(pair_id or self.default_id)
        if spec is None:
            raise gr.Error(f"Unknown model pair {pair_id!r}.")
        try:
            req = check_request(self.limits, prompt, max_new_tokens, block_size, temperature, top_p, seed)
        except ValueError as exc:  # DFlashError is a ValueError too
            raise gr.Error(str(exc)) from None
        if req.block_size == 1:
            gr.Warning("Block size 1 means no drafting: both sides decode plainly, one token per step.")
        session = getattr(request, "session_hash", None)
        # Clear the previous race at once, so old tokens and numbers never mix with new ones.
        loading = f"Loading {spec.label}… (first time only)"
        yield self._frame_start(loading if not self.cache.is_loaded(spec) else "Racing…")
        try:
            pair = yield from self.loading(spec, lambda line: self._frame_start(f"{loading} {line}"))
            prompt_ids = pair.encode(req.prompt)
            check_prompt_tokens(len(prompt_ids), self.limits, pair.context_length)
        except Exception as exc:  # noqa: BLE001 - bad input, OOM, CUDA errors, missing files: all reach the visitor
            raise gr.Error(failure_message(exc, self.cache.device_for(spec))) from None
        sampling = req.sampling
        args = (spec.id, prompt_ids, req.max_new_tokens, req.block_size, sampling.temperature, sampling.top_p, sampling.seed)
        in_process = self.runs_in_process(spec.id)
        with self.stops.running(session) as stop:
            # Where the race runs in another process (ZeroGPU), the flag cannot reach it: the race is
            # closed from here instead, and the summary can only say that it stopped.
            # Pause / Step reach the race only where it runs in this process.
            control = self._control(request) if in_process else None
            kwargs = {"control": control} if control is not None else {}
            stream = self.race_stream(
                *args, prompt=req.prompt, stop=stop.is_set if in_process else None, **kwargs
            )
            try:
                for frame, data in explain_gpu_errors(stream):
                    if stop.is_set() and not in_process:
                        yield Frame(summary=render.summary_html(None, "Stopped.")).values()
                        return
                    if data is not None:
                        frame.trace_file = self.traces.write(session, data)
                        frame.trace_csv = str(Path(frame.trace_file).with_suffix(".csv"))
                    yield frame.values()
            finally:
                stream.close()

    def race_frames(self, pair_id, prompt_ids, max_new_tokens, block_size, temperature, top_p, seed, prompt=None,
                    stop=None, control=None):
        """The model work of one race: yields (Frame, None) while it runs, then (Frame, trace).

        Takes and yields only plain data, so that it can run in a GPU worker process (ZeroGPU);
        `control` (Pause / Step) is given only when it runs in this process.
        """
        from dflash_core import SamplingParams, generate
        from dflash_core.lossless import compare as lossless_check
        from dflash_core.trace import build_trace, settings_of

        from .report import race_report

        sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
        pair = self.cache.get(self.pairs[pair_id])
        common = {"max_new_tokens": max_new_tokens, "sampling": sampling, "stop_ids": pair.stop_ids,
                  "explain": EXPLAIN_TOP_K}
        pieces = {"dflash": TokenPieces(pair.tokenizer), "plain": TokenPieces(pair.tokenizer)}
        text_of = _single_token_text(pair.tokenizer)
        # The first frames carry text only, so the first tokens are not held up by figures.
        last_chart = time.perf_counter()
        snapshot = None
        if control is not None:
            run = control.reset()
            control.text_of = text_of
            outer_stop = stop or _never
            stop = lambda: outer_stop() or control.superseded(run)  # noqa: E731  (a newer run ends this one)
        try:
            dflash_events = generate(pair.target, prompt_ids, pair.drafter, block_size=block_size, **common)
            plain_events = generate(pair.plain, prompt_ids, None, **common)
            with pair.lock:  # a pair's targets hold the KV caches of one race at a time
                for snapshot in race(
                    dflash_events, plain_events, dflash_block_size=block_size, stop=stop or _never, control=control
                ):
                    now = time.perf_counter()
                    with_charts = snapshot.done or snapshot.paused or now - last_chart >= CHART_EVERY_S
                    if with_charts:
                        last_chart = now
                    if not snapshot.done:
                        yield self._frame(snapshot, pieces, text_of, None, with_charts, control=control), None
        except Exception as exc:  # noqa: BLE001 - OOM and CUDA errors mid-race reach the visitor too
            raise gr.Error(failure_message(exc, self.cache.device_for(self.pairs[pair_id]))) from None

        how = "stopped" if snapshot.stopped else "running"
        d_summary, p_summary = snapshot.dflash.as_summary(how), snapshot.plain.as_summary(how)
        if d_summary is None or p_summary is None:
            yield Frame(summary=render.summary_html(None, "Stopped before both sides had a token.")), None
            return
        verdict = None
        if sampling.greedy and not snapshot.stopped:
            verdict = lossless_check(pair.plain, prompt_ids, d_summary.output_ids, p_summary.output_ids)
        report = race_report(d_summary, p_summary, sampling.temperature, block_size, verdict, stopped=snapshot.stopped)
        trace = build_trace(
            settings=settings_of(prompt, prompt_ids, max_new_tokens, block_size, sampling, explain=EXPLAIN_TOP_K),
            pair={"id": pair_id, "target": pair.spec.target, "drafter": pair.spec.drafter,
                  "trained_block_size": pair.trained_block_size, "chat_template": pair.chat_template},
            runs={"dflash": d_summary, "plain": p_summary},
            vocab_size=pair.target.vocab_size,
            text_of=text_of,
            device=self.cache.device_for(self.pairs[pair_id]),
            report=report,
        )
        # The panes' exact text per token: a replay shows it as it was shown live (a byte-level
        # token that completes a character decodes differently on its own).
        trace["pieces"] = {
            "dflash": pieces["dflash"].extend(d_summary.output_ids), "plain": pieces["plain"].extend(p_summary.output_ids)
        }
        yield self._frame(snapshot, pieces, text_of, report, True, control=control), trace

    def end_session(self, request: gr.Request = None) -> None:
        """The visitor closed the page: their trace files go, and their pause state (a paused race
        of theirs is released and ends)."""
        session = getattr(request, "session_hash", None)
        self.traces.end_session(session)
        self.controls.drop(session)

    def stop(self, request: gr.Request = None) -> None:
        """The Stop button: asks this session's race to end; returns once it has (or after STOP_WAIT_S)."""
        self.stops.request(getattr(request, "session_hash", None), wait_s=STOP_WAIT_S)

    # --- replay ----------------------------------------------------------------------------------
    def replay(self, shipped, uploaded, speed, request: gr.Request = None):
        """Stream a recorded race, paced by its recorded compute clocks at `speed` times real time."""
        source = uploaded or shipped
        try:
            recording = load_trace(source)
            speed = float(speed)
            if not 0.25 <= speed <= 4.0:
                raise ReplayError(f"replay speed must be between 0.25x and 4x, got {speed:g}x")
        except (ReplayError, TypeError, ValueError) as exc:
            raise gr.Error(str(exc)) from None
        control = self._control(request)
        run = control.reset()
        control.text_of = recording.text_of
        yield self._frame_start(f"Replaying {recording.label()} at {speed:g}×")
        pieces = {side: RecordedPieces(recording, side) for side in ("dflash", "plain")}
        last_chart = time.perf_counter()
        snapshot = None
        for snapshot in race(
            recording.events("dflash"), recording.events("plain"), dflash_block_size=recording.block_size,
            speed=speed, control=control, stop=lambda: control.superseded(run),
        ):
            now = time.perf_counter()
            with_charts = snapshot.done or snapshot.paused or now - last_chart >= CHART_EVERY_S
            if with_charts:
                last_chart = now
            if snapshot.stopped:
                return  # a newer replay or race of this viewer took over the panes
            if not snapshot.done:
                yield self._frame(
                    snapshot, pieces, recording.text_of, None, with_charts, control=control,
                    running=f"Replaying {recording.name} at {speed:g}× (recorded compute clocks)…",
                ).values()
        report = recording.report()
        note = f"Replay of a recorded run ({recording.name}); times are the recorded compute clocks."
        yield self._frame(snapshot, pieces, recording.text_of, report, True, None, control=control, note=note).values()

    # --- pause / step / continue, and the cycle view ---------------------------------------------
    def _control(self, request):
        return self.controls.get(getattr(request, "session_hash", None))

    def pause(self, request: gr.Request = None):
        control = self._control(request)
        control.pause(self._shown(control))
        return f"**Paused** after cycle {self._shown(control)}: *Step* shows one more DFlash cycle, *Continue* resumes."

    def step(self, request: gr.Request = None):
        control = self._control(request)
        control.step(self._shown(control))
        return f"**Stepping** to cycle {control.limit} (the plain side is advanced to the same compute time)."

    def resume(self, request: gr.Request = None):
        self._control(request).resume()
        return "**Playing.**"

    @staticmethod
    def _shown(control) -> int:
        latest = getattr(control, "latest", None)
        return len(latest.dflash.blocks) if latest is not None else 0

    def pick_cycle(self, index, request: gr.Request = None):
        """Show the chosen cycle of the run on screen, and stop following the latest one."""
        control = self._control(request)
        control.follow = False
        latest = getattr(control, "latest", None)
        if latest is None:
            return cycle_html(None, None, None, str), False
        return cycle_html(latest.dflash, latest.plain, index, control.text_of), False

    def follow_latest(self, follow, request: gr.Request = None):
        control = self._control(request)
        control.follow = bool(follow)
        latest = getattr(control, "latest", None)
        if latest is None or not follow:
            return gr.skip()
        return cycle_html(latest.dflash, latest.plain, None, control.text_of)

    # --- frames ----------------------------------------------------------------------------------
    def _frame_start(self, text: str) -> tuple:
        waiting = render.tokens_html([], [], str)
        # Charts are kept (skipped) until the first chart frame: rebuilding them now would cost time.
        return Frame(
            summary=render.summary_html(None, text), dflash_stats="", dflash_tokens=waiting, dflash_strip="",
            plain_stats="", plain_tokens=waiting, report=gr.update(value=None), trace_file=gr.update(value=None),
            trace_csv=gr.update(value=None),
        ).values()

    def _frame(
        self, snap: Snapshot, pieces, text_of, report, with_charts: bool, trace_path=None, control=None, note=None,
        running=None,
    ) -> Frame:
        diff = None if report is None else report["first_difference"]
        d, p = snap.dflash, snap.plain
        # Hover boxes with top-k lists are heavy; they go out when the viewer can hover: paused or done.
        tips = snap.paused or report is not None
        d_tips = render.dflash_tips(d, text_of) if tips else None
        p_tips = render.plain_tips(p, text_of) if tips else None
        d_html = render.tokens_html(render.dflash_marks(d), pieces["dflash"].extend(d.output_ids), text_of, diff, d_tips)
        p_html = render.tokens_html(render.plain_marks(p), pieces["plain"].extend(p.output_ids), text_of, diff, p_tips)
        if note is None:
            note = "" if report is None else (
                "Times are each side's own compute time: the two runs were interleaved in one worker, "
                "so neither slowed the other down."
            )
        if report is not None and report.get("stopped"):
            note = f"Stopped: {d.num_tokens} DFlash and {p.num_tokens} plain tokens shown, numbers up to there. " + note
        frame = Frame(
            summary=render.summary_html(report, note) if report else render.summary_html(None, running or "Racing…"),
            dflash_stats=render.side_stats_html(d, f"DFlash (block {d.block_size})"),
            dflash_tokens=d_html,
            dflash_strip=render.draft_strip_html(d, text_of, tips=tips),
            plain_stats=render.side_stats_html(p, "Plain decoding"),
            plain_tokens=p_html,
            report=report,
            trace_file=trace_path,
        )
        if with_charts:
            frame.acceptance_chart = charts.acceptance_figure(d)
            frame.speed_chart = charts.speed_figure(d, p)
            frame.histogram_chart = charts.histogram_figure(d)
            frame.positions_chart = charts.position_figure(d)
        if report is not None or snap.paused:  # a model of the whole run: drawn when it stands still
            frame.speedup_chart = speedup_figure(
                d.as_summary(), p.as_summary(), None if report is None else report["speedup"]
            )
        if control is not None:
            control.latest = snap
            # The cycle view goes out with the charts (a few times a second), not with every frame.
            if getattr(control, "follow", True) and d.blocks and with_charts:
                frame.cycle_view = cycle_html(d, p, None, text_of)
                frame.cycle_pick = gr.update(maximum=max(len(d.blocks) - 1, 1), value=len(d.blocks) - 1)
            if snap.paused:
                frame.control_status = f"**Paused** after cycle {len(d.blocks)}: *Step* shows one more, *Continue* resumes."
            elif report is not None:
                frame.control_status = "**Finished**: pick any cycle under *Inside a cycle* to look inside it."
        return frame


def _never() -> bool:
    return False


def _single_token_text(tokenizer):
    """Text of one token on its own (for draft tokens, which are not part of the output text)."""
    memo: dict[int, str] = {}

    def text_of(token_id: int) -> str:
        if token_id not in memo:
            memo[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return memo[token_id]

    return text_of


def _trace_choices(extra: str | None = None) -> list[tuple[str, str]]:
    """(label, path) of the shipped traces, plus `extra` (a --replay file) first; a file is read
    only when it is replayed."""
    choices = []
    if extra:
        try:
            label = load_trace(extra).label()
        except ReplayError as exc:
            label = f"{Path(extra).name} (cannot be replayed: {exc})"
        choices.append((label, str(extra)))
    for path, label in shipped_traces():
        if not extra or path.resolve() != Path(extra).resolve():
            choices.append((label, str(path)))
    return choices


def forget_served(json_path: str, files) -> None:
    """A deleted trace (JSON and its CSV) leaves the file components' served lists too."""
    for path in (json_path, str(Path(json_path).with_suffix(".csv"))):
        for component in files:
            component.temp_files.discard(str(gradio_abspath(path)))


def build_demo(
    pairs: list[PairSpec], default_id: str, cache=None, limits: Limits | None = None, *,
    replay: str | None = None, live: bool = True,
) -> gr.Blocks:
    """The app's Blocks, its queue configured from `limits` (launch it without calling `queue` again).

    live=False: no model pairs and no live race (started with --replay; torch is never imported).
    replay: a trace file preselected in the Replay tab and played when the page loads.
    """
    limits = limits or Limits()
    # Gradio serves files from its upload folder but creates it only on a first upload: a fresh
    # machine has none yet.
    uploads = Path(get_upload_folder())
    uploads.mkdir(parents=True, exist_ok=True)
    traces = TraceStore(tempfile.mkdtemp(prefix="dflash-traces-", dir=uploads))
    if live and cache is None:
        from .models import PairCache

        cache = PairCache()
    app = App(pairs, default_id, cache if live else None, limits, traces)
    recorded = _trace_choices(replay)
    with gr.Blocks(title="DFlash Studio", analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
        with gr.Tabs(selected="live" if live and not replay else "replay", elem_id="source-tabs"):
            if live:
                with gr.Tab("Live race", id="live"):
                    pair_state = gr.State(app.default_id)
                    with gr.Row():
                        pair_choice = gr.Dropdown(
                            choices=[(p.label, p.id) for p in pairs], value=app.default_id, label="Model pair", scale=2
                        )
                        status = gr.Markdown("Loading models…", elem_id="pair-status")
                    with gr.Row():
                        with gr.Column(scale=3):
                            prompt = gr.Textbox(label="Prompt", lines=3, placeholder="Ask something…", elem_id="prompt")
                            gr.Examples(EXAMPLES, inputs=[prompt], label="Examples: math, code, chat, story")
                        with gr.Column(scale=2):
                            max_new_tokens = gr.Slider(
                                1, limits.max_new_tokens, value=min(128, limits.max_new_tokens), step=1,
                                label="Max new tokens",
                            )
                            block_size = gr.Slider(1, 16, value=16, step=1, label="Block size (1 = no drafting)")
                            with gr.Row():
                                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                            seed = gr.Number(value=0, precision=0, label="Seed (sampling only)")
                            with gr.Row():
                                run_button = gr.Button("Race ▶", variant="primary", elem_id="run", scale=3)
                                stop_button = gr.Button("Stop ■", variant="stop", elem_id="stop", scale=1)
            with gr.Tab("Replay a recorded run", id="replay"):
                gr.Markdown(
                    "No model needed: replay a race recorded on the default pair (or upload a trace a race "
                    "downloaded), paced by its recorded compute clocks. Every view works as in a live race."
                )
                with gr.Row():
                    trace_choice = gr.Dropdown(
                        choices=recorded, value=recorded[0][1] if recorded else None, label="Recorded run", scale=3,
                        elem_id="trace-choice",
                    )
                    trace_upload = gr.File(
                        label="…or upload a trace (.json)", file_types=[".json"], scale=2, height=110, elem_id="trace-upload"
                    )
                with gr.Row():
                    speed = gr.Slider(0.25, 4.0, value=1.0, step=0.25, label="Replay speed (× real time)", elem_id="replay-speed")
                    replay_button = gr.Button("Replay ▶", variant="primary", elem_id="replay-run")
            with gr.Tab("How it works", id="howto"):
                gr.HTML(howto_html(), elem_id="howto")
        with gr.Row(elem_id="race-controls"):
            pause_button = gr.Button("Pause", elem_id="pause", size="sm")
            step_button = gr.Button("Step one cycle", elem_id="step", size="sm")
            resume_button = gr.Button("Continue", elem_id="continue", size="sm")
            control_status = gr.Markdown("", elem_id="control-status")
        gr.HTML(render.legend_html())
        summary = gr.HTML(render.summary_html(None), elem_id="summary")
        with gr.Row(equal_height=False):
            with gr.Column():
                d_stats = gr.HTML(elem_id="dflash-stats")
                d_tokens = gr.HTML(elem_id="dflash-tokens", css_template=TIP_CSS, js_on_load=TIP_JS)
                d_strip = gr.HTML(elem_id="dflash-strip", css_template=TIP_CSS, js_on_load=TIP_JS)
            with gr.Column():
                p_stats = gr.HTML(elem_id="plain-stats")
                p_tokens = gr.HTML(elem_id="plain-tokens", css_template=TIP_CSS, js_on_load=TIP_JS)
        with gr.Accordion(
            "Inside a cycle: what the drafter saw and proposed, what the target decided", open=False, elem_id="cycle-panel"
        ):
            with gr.Row():
                cycle_pick = gr.Slider(0, 1, value=0, step=1, label="Cycle", elem_id="cycle-pick", scale=3)
                follow = gr.Checkbox(value=True, label="Follow the current cycle", elem_id="cycle-follow", scale=1)
            cycle_view = gr.HTML(cycle_html(None, None, None, str), elem_id="cycle-view", js_on_load=None)
        # Empty figures at page load also make the browser fetch plotly before the first race.
        empty = SideView("", None, (), None, 0.0, 16)
        with gr.Row():
            acc_plot = gr.Plot(charts.acceptance_figure(empty), label="Acceptance length", elem_id="chart-acceptance")
            speed_plot = gr.Plot(charts.speed_figure(empty, empty), label="Tokens/s", elem_id="chart-speed")
        with gr.Row():
            hist_plot = gr.Plot(charts.histogram_figure(empty), label="Histogram", elem_id="chart-histogram")
            pos_plot = gr.Plot(
                charts.position_figure(empty), label="Per-position acceptance", elem_id="chart-positions"
            )
        speedup_plot = gr.Plot(speedup_figure(None, None), label="Speedup model", elem_id="chart-speedup")
        gr.Markdown(FORMULA_MD, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
        with gr.Row():
            report_json = gr.JSON(label="Summary (JSON)", elem_id="report")
            trace_file = gr.File(label="Trace download (JSON)", elem_id="trace")
            trace_csv = gr.File(label="Per-block metrics (CSV)", elem_id="trace-csv")

        components = {
            "summary": summary,
            "dflash_stats": d_stats,
            "dflash_tokens": d_tokens,
            "dflash_strip": d_strip,
            "plain_stats": p_stats,
            "plain_tokens": p_tokens,
            "acceptance_chart": acc_plot,
            "speed_chart": speed_plot,
            "histogram_chart": hist_plot,
            "positions_chart": pos_plot,
            "speedup_chart": speedup_plot,
            "cycle_pick": cycle_pick,
            "cycle_view": cycle_view,
            "control_status": control_status,
            "report": report_json,
            "trace_file": trace_file,
            "trace_csv": trace_csv,
        }
        outputs = [components[name] for name in FRAME_FIELDS]
        runs = []  # the events that fill the race's outputs: a new one cancels the others
        if live:
            demo.load(app.load_selected, inputs=[pair_state], outputs=[status, block_size], api_visibility="private")
            pair_choice.change(
                app.select_pair, inputs=[pair_choice], outputs=[pair_state, status, block_size], api_name="select_pair"
            )
            race_event = run_button.click(
                app.compare,
                inputs=[prompt, max_new_tokens, block_size, temperature, top_p, seed, pair_state],
                outputs=outputs,
                api_name="compare",
                # Progress (the queue position while waiting) on the summary only: on the panes an
                # overlay would hide the tokens.
                show_progress="full",
                show_progress_on=[summary],
                concurrency_limit=limits.concurrency,
                concurrency_id="race",
                # Raw values reach `check_request`, which names any bad one; Gradio's own conversion
                # would answer a string or null in a number field with an unexplained error.
                preprocess=False,
            )
            runs.append(race_event)
            # A running race stops itself within one cycle and reports what it showed; the cancel
            # that follows takes a race still waiting in the queue out of it.
            stop_button.click(app.stop, queue=False, api_visibility="private").then(
                None, cancels=[race_event], queue=False, api_visibility="private"
            )
        replay_inputs = [trace_choice, trace_upload, speed]
        if replay:
            runs.append(demo.load(
                app.replay, inputs=replay_inputs, outputs=outputs, api_visibility="private", show_progress="hidden"
            ))
        replay_event = replay_button.click(
            app.replay, inputs=replay_inputs, outputs=outputs, api_name="replay", show_progress="hidden",
            cancels=list(runs),
        )
        runs.append(replay_event)
        if live:
            # A race started while a replay plays replaces it (both fill the same panes).
            run_button.click(None, cancels=[e for e in runs if e is not race_event], queue=False, api_visibility="private")
        # The controls act on a running race at once: they skip the queue the race is waiting in.
        pause_button.click(app.pause, outputs=[control_status], queue=False, api_visibility="private")
        step_button.click(app.step, outputs=[control_status], queue=False, api_visibility="private")
        resume_button.click(app.resume, outputs=[control_status], queue=False, api_visibility="private")
        for event in (cycle_pick.release, cycle_pick.input):
            event(app.pick_cycle, inputs=[cycle_pick], outputs=[cycle_view, follow], queue=False, api_visibility="private")
        follow.input(app.follow_latest, inputs=[follow], outputs=[cycle_view], queue=False, api_visibility="private")
        demo.unload(app.end_session)
    # Beyond max_size waiting requests Gradio answers "busy, try again" without queueing.
    demo.queue(max_size=limits.max_queue)
    app.traces.on_delete = lambda path: forget_served(path, (trace_file, trace_csv))
    return demo
