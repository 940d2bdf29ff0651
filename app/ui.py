"""The Gradio Blocks: controls, the two race panes, live charts, summary and trace download.

Handlers here only wire inputs to the engine's `generate` (or a recorded trace, `replay.py`), feed
its events to `race`, and pass the snapshots to the renderers; they translate every `DFlashError`
into a message for the user. torch and the models are imported only when a live race needs them,
so a replay-only app (`python app.py --replay FILE`) starts without them.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

import gradio as gr

from dflash_core.errors import DFlashError

from . import charts, render
from .control import Controls
from .cycle_view import cycle_html
from .examples import EXAMPLES
from .howto import howto_html
from .pairs import PairSpec, availability
from .race import SideView, Snapshot, race
from .replay import RecordedPieces, ReplayError, load_trace, shipped_traces
from .report import race_report
from .speedup import FORMULA_MD, speedup_figure
from .tips import TIP_CSS
from .tokens import TokenPieces

MAX_PROMPT_CHARS = 16_000
MAX_NEW_TOKENS = 512
CHART_EVERY_S = 0.4  # plotly figures are heavy to ship; text frames go out more often
EXPLAIN_TOP_K = 5  # every cycle is explained (top-5 of drafter and target) for the views and the trace

INTRO = """# ⚡ DFlash Studio
Speculative decoding with a **block-diffusion drafter**: the drafter proposes a whole block of tokens
in one pass, the target verifies it in one pass and keeps the longest agreeing prefix plus one token of
its own. Both panes decode the same prompt with the same target; the race is paced on each side's own
compute time, so what you see matches the measured speeds."""


@dataclass
class Frame:
    """One update of the race's outputs, by name; a field left as `gr.skip()` keeps what is shown.

    The field order is the order of the `compare` endpoint's outputs.
    """

    summary: object = None
    dflash_stats: object = None
    dflash_tokens: object = None
    dflash_strip: object = None
    plain_stats: object = None
    plain_tokens: object = None
    acceptance_chart: object = None
    speed_chart: object = None
    histogram_chart: object = None
    positions_chart: object = None
    speedup_chart: object = None
    cycle_pick: object = None
    cycle_view: object = None
    control_status: object = None
    report: object = None
    trace_file: object = None

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) is None:
                setattr(self, f.name, gr.skip())

    def values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


FRAME_FIELDS = [f.name for f in fields(Frame)]


class App:
    """Holds the pair registry and the model cache; its methods are the event handlers."""

    def __init__(self, pairs: list[PairSpec], default_id: str, cache):
        self.pairs = {p.id: p for p in pairs}
        self.default_id = default_id if default_id in self.pairs else (pairs[0].id if pairs else "")
        self.cache = cache  # a PairCache; None in a replay-only app
        self.controls = Controls()

    # --- pair selection and loading -----------------------------------------------------------
    def load_selected(self, pair_id: str):
        """Generator for the status line: a loading state first, then ready or why not."""
        spec = self.pairs.get(pair_id)
        if spec is None:
            yield f"⚠ Unknown pair {pair_id!r}.", gr.skip()
            return
        reason = availability(spec, self.cache.device)
        if reason:
            yield f"⚠ **Unavailable:** {reason}", gr.skip()
            return
        if not self.cache.is_loaded(spec):
            yield f"Loading **{spec.label}** on {self.cache.device} (first time only)…", gr.skip()
        try:
            pair = self.cache.get(spec)
        except (DFlashError, OSError) as exc:
            yield f"⚠ **Could not load {spec.label}:** {exc}", gr.skip()
            return
        trained = pair.trained_block_size
        status = (
            f"✓ **{spec.label}** ready on {self.cache.device} (loaded in {pair.load_s:.1f} s); "
            f"target in {pair.numerics}; drafter trained with block size {trained}."
        )
        yield status, gr.update(maximum=trained, value=trained)

    # --- the race --------------------------------------------------------------------------------
    def compare(
        self, prompt, max_new_tokens, block_size, temperature, top_p, seed, pair_id=None, request: gr.Request = None
    ):
        """Stream a DFlash vs plain race; the last update carries the JSON summary and the trace."""
        from dflash_core import SamplingParams, generate
        from dflash_core.trace import build_trace, settings_of, write_trace

        if self.cache is None:
            raise gr.Error("This app was started with --replay: no model is loaded. Replay a recorded run instead.")
        spec = self.pairs.get(pair_id or self.default_id)
        if spec is None:
            raise gr.Error(f"Unknown model pair {pair_id!r}.")
        prompt = "" if prompt is None else str(prompt)
        if not prompt.strip():
            raise gr.Error("The prompt is empty: type a message or pick an example.")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise gr.Error(f"The prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}.")
        try:
            max_new_tokens, block_size = _as_int(max_new_tokens, "max_new_tokens"), _as_int(block_size, "block_size")
            seed = None if seed in (None, "") else _as_int(seed, "seed")
            if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
                raise ValueError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got {max_new_tokens}")
            sampling = SamplingParams(temperature=float(temperature), top_p=float(top_p), seed=seed)
        except (TypeError, ValueError) as exc:  # DFlashError is a ValueError too
            raise gr.Error(str(exc)) from None

        if block_size == 1:
            gr.Warning("Block size 1 means no drafting: both sides decode plainly, one token per step.")
        # Clear the previous race at once, so old tokens and numbers never mix with new ones.
        loading = not self.cache.is_loaded(spec)
        control = self._control(request)
        yield self._frame_start(f"Loading {spec.label}… (first time only)" if loading else "Racing…")
        try:
            pair = self.cache.get(spec)
            prompt_ids = pair.encode(prompt)
            common = {
                "max_new_tokens": max_new_tokens, "sampling": sampling, "stop_ids": pair.stop_ids,
                "explain": EXPLAIN_TOP_K,
            }
            dflash_events = generate(pair.target, prompt_ids, pair.drafter, block_size=block_size, **common)
            plain_events = generate(pair.plain, prompt_ids, None, **common)
            pieces = {"dflash": TokenPieces(pair.tokenizer), "plain": TokenPieces(pair.tokenizer)}
            text_of = _single_token_text(pair.tokenizer)
            # The first frames carry text only, so the first tokens are not held up by figures.
            last_chart = time.perf_counter()
            snapshot = None
            control.reset()
            control.text_of = text_of
            for snapshot in race(dflash_events, plain_events, dflash_block_size=block_size, control=control):
                now = time.perf_counter()
                with_charts = snapshot.done or snapshot.paused or now - last_chart >= CHART_EVERY_S
                if with_charts:
                    last_chart = now
                if not snapshot.done:
                    yield self._frame(snapshot, pieces, text_of, None, with_charts, control=control)
        except DFlashError as exc:
            raise gr.Error(str(exc)) from None

        report = race_report(snapshot.dflash.summary, snapshot.plain.summary, sampling.temperature, block_size)
        trace = build_trace(
            settings=settings_of(prompt, prompt_ids, max_new_tokens, block_size, sampling, explain=EXPLAIN_TOP_K),
            pair={"id": spec.id, "target": spec.target, "drafter": spec.drafter,
                  "trained_block_size": pair.trained_block_size},
            runs={"dflash": snapshot.dflash.summary, "plain": snapshot.plain.summary},
            vocab_size=pair.target.vocab_size,
            text_of=text_of,
            device=self.cache.device,
            report=report,
        )
        # The panes' exact text per token: a replay shows it as it was shown live (a byte-level
        # token that completes a character decodes differently on its own).
        d_sum, p_sum = snapshot.dflash.summary, snapshot.plain.summary
        trace["pieces"] = {"dflash": pieces["dflash"].extend(d_sum.output_ids), "plain": pieces["plain"].extend(p_sum.output_ids)}
        # The per-block CSV is written beside the JSON (same folder, same name, .csv).
        path, _ = write_trace(trace, Path(tempfile.mkdtemp(prefix="dflash-trace-")) / "dflash_trace.json")
        yield self._frame(snapshot, pieces, text_of, report, True, str(path), control=control)

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
        control.reset()
        control.text_of = recording.text_of
        yield self._frame_start(f"Replaying {recording.label()} at {speed:g}×")
        pieces = {side: RecordedPieces(recording, side) for side in ("dflash", "plain")}
        last_chart = time.perf_counter()
        snapshot = None
        for snapshot in race(
            recording.events("dflash"), recording.events("plain"), dflash_block_size=recording.block_size,
            speed=speed, control=control,
        ):
            now = time.perf_counter()
            with_charts = snapshot.done or snapshot.paused or now - last_chart >= CHART_EVERY_S
            if with_charts:
                last_chart = now
            if not snapshot.done:
                yield self._frame(
                    snapshot, pieces, recording.text_of, None, with_charts, control=control,
                    running=f"Replaying {recording.name} at {speed:g}× (recorded compute clocks)…",
                )
        report = recording.report()
        note = f"Replay of a recorded run ({recording.name}); times are the recorded compute clocks."
        yield self._frame(snapshot, pieces, recording.text_of, report, True, None, control=control, note=note)

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
        ).values()

    def _frame(
        self, snap: Snapshot, pieces, text_of, report, with_charts: bool, trace_path=None, control=None, note=None,
        running=None,
    ):
        diff = None if report is None else report["first_difference"]
        d, p = snap.dflash, snap.plain
        # Hover boxes with top-k lists are heavy; they go out when the viewer can hover: paused or done.
        tips = snap.paused or report is not None
        d_tips = render.dflash_tips(d, text_of) if tips else None
        p_tips = render.plain_tips(p, text_of) if tips else None
        d_html = render.tokens_html(render.dflash_marks(d), pieces["dflash"].extend(d.output_ids), text_of, diff, d_tips)
        p_html = render.tokens_html(render.plain_marks(p), pieces["plain"].extend(p.output_ids), text_of, diff, p_tips)
        if note is None and report is not None:
            note = (
                "Times are each side's own compute time: the two runs were interleaved in one worker, "
                "so neither slowed the other down."
            )
        note = note or ""
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
        return frame.values()


def _as_int(value, name: str) -> int:
    number = float(value)
    if number != int(number):
        raise ValueError(f"{name} must be a whole number, got {value}")
    return int(number)


def _single_token_text(tokenizer):
    """Text of one token on its own (for draft tokens, which are not part of the output text)."""
    memo: dict[int, str] = {}

    def text_of(token_id: int) -> str:
        if token_id not in memo:
            memo[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return memo[token_id]

    return text_of


def _trace_choices(extra: str | None = None) -> list[tuple[str, str]]:
    """(label, path) of the shipped traces, plus `extra` (a --replay file) first."""
    paths = [Path(extra)] if extra else []
    paths += [p for p in shipped_traces() if not extra or p.resolve() != Path(extra).resolve()]
    choices = []
    for path in paths:
        try:
            label = load_trace(path).label()
        except ReplayError as exc:
            label = f"{path.name} (cannot be replayed: {exc})"
        choices.append((label, str(path)))
    return choices


def build_demo(
    pairs: list[PairSpec], default_id: str, cache=None, *, replay: str | None = None, live: bool = True
) -> gr.Blocks:
    """The app. live=False: no model pairs and no live race (started with --replay; torch is never
    imported); replay: a trace file preselected in the Replay tab and played when the page loads."""
    if live and cache is None:
        from .models import PairCache

        cache = PairCache()
    app = App(pairs, default_id, cache if live else None)
    traces = _trace_choices(replay)
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
                            max_new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=128, step=1, label="Max new tokens")
                            block_size = gr.Slider(1, 16, value=16, step=1, label="Block size (1 = no drafting)")
                            with gr.Row():
                                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                            seed = gr.Number(value=0, precision=0, label="Seed (sampling only)")
                            run_button = gr.Button("Race ▶", variant="primary", elem_id="run")
            with gr.Tab("Replay a recorded run", id="replay"):
                gr.Markdown(
                    "No model needed: replay a race recorded on the default pair (or upload a trace a race "
                    "downloaded), paced by its recorded compute clocks. Every view works as in a live race."
                )
                with gr.Row():
                    trace_choice = gr.Dropdown(
                        choices=traces, value=traces[0][1] if traces else None, label="Recorded run", scale=3,
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
                d_tokens = gr.HTML(elem_id="dflash-tokens", css_template=TIP_CSS)
                d_strip = gr.HTML(elem_id="dflash-strip", css_template=TIP_CSS)
            with gr.Column():
                p_stats = gr.HTML(elem_id="plain-stats")
                p_tokens = gr.HTML(elem_id="plain-tokens", css_template=TIP_CSS)
        with gr.Accordion("Inside a cycle: what the drafter saw and proposed, what the target decided", open=False, elem_id="cycle-panel"):
            with gr.Row():
                cycle_pick = gr.Slider(0, 1, value=0, step=1, label="Cycle", elem_id="cycle-pick", scale=3)
                follow = gr.Checkbox(value=True, label="Follow the current cycle", elem_id="cycle-follow", scale=1)
            cycle_view = gr.HTML(cycle_html(None, None, None, str), elem_id="cycle-view", css_template=TIP_CSS)
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
        }
        outputs = [components[name] for name in FRAME_FIELDS]
        if live:
            demo.load(app.load_selected, inputs=[pair_state], outputs=[status, block_size], api_visibility="private")
            pair_choice.change(lambda pid: pid, inputs=[pair_choice], outputs=[pair_state], api_visibility="private").then(
                app.load_selected, inputs=[pair_state], outputs=[status, block_size], api_visibility="private"
            )
            run_button.click(
                app.compare,
                inputs=[prompt, max_new_tokens, block_size, temperature, top_p, seed, pair_state],
                outputs=outputs,
                api_name="compare",
                show_progress="hidden",  # the panes show their own state; an overlay would hide the tokens
            )
        replay_inputs = [trace_choice, trace_upload, speed]
        replay_button.click(app.replay, inputs=replay_inputs, outputs=outputs, api_name="replay", show_progress="hidden")
        if replay:
            demo.load(app.replay, inputs=replay_inputs, outputs=outputs, api_visibility="private", show_progress="hidden")
        # The controls act on a running race at once: they skip the queue the race is waiting in.
        pause_button.click(app.pause, outputs=[control_status], queue=False, api_visibility="private")
        step_button.click(app.step, outputs=[control_status], queue=False, api_visibility="private")
        resume_button.click(app.resume, outputs=[control_status], queue=False, api_visibility="private")
        for event in (cycle_pick.release, cycle_pick.input):
            event(app.pick_cycle, inputs=[cycle_pick], outputs=[cycle_view, follow], queue=False, api_visibility="private")
        follow.input(app.follow_latest, inputs=[follow], outputs=[cycle_view], queue=False, api_visibility="private")
    return demo
