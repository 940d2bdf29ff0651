"""The Gradio Blocks: one layout function per tab and for the race area, and the wiring.

The handlers live in `serve/` by role: pair loading (`loading.py`), the live race (`live.py`),
replay (`playback.py`), Pause / Step (`stepping.py`) and "Why this tau?" (`diagnosis.py`); `App`
puts them together. This is the one module that wires Gradio components to handlers. torch and the
models are imported only when a live race needs them, so a replay-only app (`python app.py --replay
FILE`) starts without them.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from gradio.utils import abspath as gradio_abspath
from gradio.utils import get_cache_folder, get_upload_folder, is_in_or_equal
from starlette.middleware import Middleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from dflash_core.trace import MAX_BYTES

from .guard.http_guard import MULTIPART_SLACK, HttpGuard, UploadBudget, refuse_url_inputs
from .guard.limits import Limits
from .guard.queue_bounds import bound_queue
from .guard.readers import Readers
from .guard.request_rate import DIRECT_ROUTES, RequestRate
from .guard.traces import TraceStore
from .pairs.registry import PairSpec, unavailable_here
from .race.control import Controls
from .race.lanes import CHOICES, CYCLE_LANES, LABELS, LANES, MAX_TREE_BUDGET, RESEARCH_LANES, TREE_BUDGET
from .race.thinking import DEFAULT
from .serve.diagnosis import Diagnosis
from .serve.examples import EXAMPLES
from .serve.lecture import Lecture
from .serve.lessons import LESSONS, Lessons
from .serve.live import LiveRace
from .serve.loading import PairLoading
from .serve.pinning import TABS, Pinning
from .serve.playback import MAX_SPEED, MIN_SPEED, Playback
from .serve.replay import ReplayError, load_trace, shipped_traces
from .serve.serving import LEVELS, Serving
from .serve.stepping import Stepping
from .view import charts, lecture, render, texts
from .view.cycle_view import cycle_html
from .view.frames import FRAME_FIELDS
from .view.howto import howto_html
from .view.pinned import PINNED_CSS
from .view.serving import serving_figure, serving_table_html
from .view.speedup import FORMULA_MD, speedup_figure
from .view.tips import TIP_CSS, TIP_JS

COMPILE_TICK_S = 3  # how often the status line counts the compiled steps while a pair's lanes compile


class App:
    """The app's event handlers, one object per role, and the state they share."""

    def __init__(
        self,
        pairs: list[PairSpec],
        default_id: str,
        cache,
        limits: Limits | None = None,
        traces: TraceStore | None = None,
        recorded: dict[str, str] | None = None,
    ):
        """recorded: the recorded runs the Replay tab offers, name -> file (None: `replay` takes any path)."""
        limits = limits or Limits()
        # each session's Pause / Step / Continue and what it has on screen
        self.limits = limits
        self.controls = Controls(max_pause_s=limits.max_pause_s, max_run_s=limits.max_race_s)
        self.readers = Readers()  # each session's open event streams: a run nobody reads ends
        self.traces = traces or TraceStore()
        self.loading = PairLoading(pairs, default_id, cache)
        self.live = LiveRace(self.loading, self.controls, limits, self.traces, self.readers)
        self.playback = Playback(self.controls, limits, self.traces, recorded, self.readers)
        self.stepping = Stepping(self.controls)
        self.diagnosis = Diagnosis(self.loading, limits, self.readers, self.live.runs_in_process)
        self.serving = Serving(self.loading.pairs, limits, self.readers)
        self.lecture = Lecture(self.controls)
        self.lessons = Lessons(self.controls)
        self.pinning = Pinning(self.controls)
        self.pairs, self.default_id, self.cache = self.loading.pairs, self.loading.default_id, cache

    def end_session(self, request: gr.Request = None) -> None:
        """The visitor closed the page: their race ends, then their trace files go, and their pause
        state (a paused race of theirs is released and ends)."""
        session = getattr(request, "session_hash", None)
        # A race that has just finished may still be sending its last frame, which names its trace
        # files: Gradio reads them after the frame leaves the race, so they go once it has ended.
        self.live.stop(request)
        self.traces.end_session(session)
        self.controls.drop(session)


def _trace_choices(extra: str | None = None) -> list[tuple[str, str]]:
    """(label, name) of the shipped traces, plus `extra` (a --replay file) first; the name is the
    file's stem, what a visitor (or the API) picks, never a path (`recorded_runs` maps it back)."""
    return [(label, name) for label, name, _ in _recorded(extra)]


def recorded_runs(extra: str | None = None) -> dict[str, str]:
    """The recorded runs offered, name -> file."""
    return {name: path for _, name, path in _recorded(extra)}


def _recorded(extra: str | None) -> list[tuple[str, str, str]]:
    """(label, name, path) of each recorded run; a file is read only when it is replayed."""
    runs = []
    if extra:
        try:
            label = load_trace(extra).label()
        except ReplayError as exc:
            label = f"{Path(extra).name} (cannot be replayed: {exc})"
        runs.append((label, Path(extra).stem, str(extra)))
    for path, label in shipped_traces():
        if not extra or path.resolve() != Path(extra).resolve():
            name = path.stem if path.stem not in {n for _, n, _ in runs} else f"{path.stem} (shipped)"
            runs.append((label, name, str(path)))
    return runs


def private_trace_root() -> Path:
    """A new private folder for trace files, outside every folder Gradio serves."""
    root = Path(tempfile.mkdtemp(prefix="dflash-traces-"))
    served = [Path(get_upload_folder()), get_cache_folder()]
    if any(is_in_or_equal(root, folder) for folder in served):
        root.rmdir()
        raise RuntimeError(
            f"Gradio serves {tempfile.gettempdir()} (GRADIO_TEMP_DIR={get_upload_folder()}): trace files kept there "
            "could be fetched by anyone. Set GRADIO_TEMP_DIR to a folder of its own."
        )
    return root


def launch_options(demo: gr.Blocks) -> dict:
    """The `demo.launch` arguments every server of the app needs, beside host and port: uploads
    bounded per file, per request and per visitor, no URL fetched through the file route, a
    visitor's requests to the queue bounded in rate, each
    session's event streams counted (a race nobody reads ends), the sessions kept in memory
    bounded, and every trace file deleted when the server stops."""
    app = demo.dflash_app
    traces, limits = app.traces, app.limits

    @contextlib.asynccontextmanager
    async def lifespan(_server):
        try:
            yield
        finally:
            traces.close()

    budget = UploadBudget(per_request=MAX_BYTES + MULTIPART_SLACK, per_hour=limits.upload_mb_per_hour * 1_000_000)
    rates = (RequestRate(limits.queue_requests_per_min),
             RequestRate(limits.direct_requests_per_min, DIRECT_ROUTES, "outside its queue", "--direct-requests-per-min"))
    middleware = [Middleware(HttpGuard, budget=budget, rates=rates), Middleware(app.readers.middleware)]
    if limits.trusted_proxy:  # outermost: every bound below sees the visitor the proxy names
        middleware.insert(0, Middleware(ProxyHeadersMiddleware, trusted_hosts=limits.trusted_proxy))
    return {"max_file_size": MAX_BYTES, "state_session_capacity": limits.session_capacity,
            "app_kwargs": {"lifespan": lifespan, "middleware": middleware}}


def forget_served(json_path: str, files) -> None:
    """A deleted trace (JSON and its CSV) leaves the file components' served lists too."""
    for path in (json_path, str(Path(json_path).with_suffix(".csv"))):
        for component in files:
            component.temp_files.discard(str(gradio_abspath(path)))


@dataclass
class LiveTab:
    pair_state: gr.State
    pair_choice: gr.Dropdown
    status: gr.Markdown
    inputs: list  # the `compare` inputs but the pair: prompt, max new tokens, block size, temperature, top-p, seed, lanes
    block_size: gr.Slider
    thinking: gr.Radio  # the chat template's thinking switch; shown where the pair's template has one
    run_button: gr.Button
    stop_button: gr.Button
    start_paused: gr.Checkbox | None = None  # the race starts paused before cycle 1
    lane_picks: tuple = ()  # the visible lane checkboxes (basics, "More lanes"), gathered into `lanes`
    tree_budget: gr.Slider | None = None  # the tree lane's draft nodes per cycle


@dataclass
class ReplayTab:
    inputs: list  # the `replay` inputs: the recorded run, an uploaded trace, the speed
    replay_button: gr.Button
    start_paused: gr.Checkbox | None = None
    lessons: dict | None = None  # lesson key -> its button
    lesson_parts: tuple = ()  # the callout, Previous, Next, the lesson's state


@dataclass
class ServingTab:
    inputs: list  # the sweep's inputs but the pair: the levels, max new tokens
    run_button: gr.Button
    outputs: list  # the figure, the table, the status line


@dataclass
class DoctorPanel:
    button: gr.Button  # "Why this tau?"
    accordion: gr.Accordion
    html: gr.HTML  # the report, rendered
    json: gr.JSON  # the report as data


@dataclass
class RaceArea:
    outputs: dict  # the race's outputs by frame field
    pause_button: gr.Button
    step_button: gr.Button
    resume_button: gr.Button
    follow: gr.Checkbox
    doctor: DoctorPanel | None  # only where pairs race live
    cycle_lane: gr.Radio  # whose cycles "Inside a cycle" lays out
    column: gr.Column | None = None  # the whole area, hidden under the tabs that have no race
    cycle_prev: gr.Button | None = None  # the cycle view one cycle back / on
    cycle_next: gr.Button | None = None
    cycle_panel: gr.Accordion | None = None
    cycle_extremes: tuple = ()  # the cycle view at the best / the worst cycle
    pin_button: gr.Button | None = None  # "Pin this race"
    pinned: tuple = ()  # the pinned race's column, its panel, its Unpin button


def pair_choices(pairs: list[PairSpec], device_for) -> list[tuple[str, str]]:
    """(label, id) of the pairs, those this machine cannot race last and marked with why (`device_for`:
    a pair's device, None where nothing is loaded here)."""
    usable, marked = [], []
    for p in pairs:
        why = None if device_for is None else unavailable_here(p, device_for(p))
        (usable if why is None else marked).append((p.label if why is None else f"⊘ {p.label} ({why})", p.id))
    return usable + marked


def live_tab(pairs: list[PairSpec], default_id: str, limits: Limits, device_for=None) -> LiveTab:
    """The prompt and Race first, the pair beside them; the settings and the added lanes folded."""
    pair_state = gr.State(default_id)
    with gr.Row(equal_height=False):
        with gr.Column(scale=5):
            # Filled with the first example, so that a first visitor's Race ▶ races at once.
            prompt = gr.Textbox(EXAMPLES[0][0], label="Prompt", lines=2, placeholder="Ask something…",
                                elem_id="prompt")
        with gr.Column(scale=1, min_width=170):
            run_button = gr.Button("Race ▶", variant="primary", elem_id="run")
            with gr.Row():
                stop_button = gr.Button("Stop ■", variant="stop", elem_id="stop", size="sm", min_width=60)
                start_paused = gr.Checkbox(False, label=texts.START_PAUSED, elem_id="start-paused", min_width=90)
    with gr.Row(equal_height=False, elem_id="pair-row"):
        pair_choice = gr.Dropdown(choices=pair_choices(pairs, device_for), value=default_id, label="Model pair",
                                  scale=2, elem_id="pair-choice")
        status = gr.Markdown(texts.PAIRS_LOADING, elem_id="pair-status")
    basics = [(label, lane) for label, lane in CHOICES if lane not in RESEARCH_LANES]
    research = [(label, lane) for label, lane in CHOICES if lane in RESEARCH_LANES]
    with gr.Accordion(texts.SETTINGS_PANEL, open=False, elem_id="settings"):
        gr.Examples(EXAMPLES, inputs=[prompt], label="Examples: math, code, chat, story")
        with gr.Column(elem_id="lanes-choice"):
            basic_lanes = gr.CheckboxGroup(basics, value=[], label=texts.LANES_CHOICE, elem_id="lanes-basic")
            with gr.Accordion(texts.MORE_LANES, open=False, elem_id="more-lanes"):
                more_lanes = gr.CheckboxGroup(research, value=[], show_label=False, elem_id="lanes-more")
                tree_budget = gr.Slider(1, MAX_TREE_BUDGET, value=TREE_BUDGET, step=1, label=texts.TREE_BUDGET,
                                        elem_id="tree-budget")
        with gr.Row():
            max_new_tokens = gr.Slider(
                1, limits.max_new_tokens, value=min(128, limits.max_new_tokens), step=1, label="Max new tokens",
                elem_id="max-new-tokens",
            )
            block_size = gr.Slider(1, 16, value=16, step=1, label="Block size (1 = no drafting)", elem_id="block-size")
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
            seed = gr.Number(value=0, precision=0, label="Seed (sampling only)")
        thinking = gr.Radio(texts.THINKING_CHOICES, value=DEFAULT, label=texts.THINKING_CHOICE, visible=False,
                            elem_id="thinking-choice")
    # What `compare` reads: both groups' ticks, gathered in the page (`_wire_lecture`).
    lanes = gr.CheckboxGroup(CHOICES, value=[], visible=False, elem_id="lanes-all")
    inputs = [prompt, max_new_tokens, block_size, temperature, top_p, seed, lanes]
    return LiveTab(pair_state, pair_choice, status, inputs, block_size, thinking, run_button, stop_button,
                   start_paused, (basic_lanes, more_lanes), tree_budget)


def replay_tab(recorded: list[tuple[str, str]]) -> ReplayTab:
    offered = {name for _, name in recorded}
    lessons = {}
    with gr.Row(elem_id="lessons", equal_height=True):
        gr.Markdown(texts.LESSONS, elem_id="lessons-intro")
        for lesson in LESSONS:
            if lesson.trace in offered:
                lessons[lesson.key] = gr.Button(lesson.title, elem_id=f"lesson-{lesson.key}", size="sm", scale=0,
                                                min_width=150)
    with gr.Row(elem_id="lesson-row", equal_height=True):
        callout = gr.Markdown("", elem_id="lesson-callout")
        lesson_prev = gr.Button("◀ Previous", elem_id="lesson-prev", size="sm", scale=0, min_width=110)
        lesson_next = gr.Button("Next ▶", elem_id="lesson-next", size="sm", scale=0, min_width=110)
    gr.Markdown(texts.REPLAY_TAB)
    with gr.Row():
        trace_choice = gr.Dropdown(
            choices=recorded, value=recorded[0][1] if recorded else None, label="Recorded run", scale=3,
            elem_id="trace-choice",
        )
        trace_upload = gr.File(
            label="…or upload a trace (.json)", file_types=[".json"], scale=2, height=110, elem_id="trace-upload"
        )
    with gr.Row():
        speed = gr.Slider(MIN_SPEED, MAX_SPEED, value=1.0, step=0.05, label="Replay speed (× real time)",
                          elem_id="replay-speed")
        with gr.Column(min_width=170):
            replay_button = gr.Button("Replay ▶", variant="primary", elem_id="replay-run")
            start_paused = gr.Checkbox(False, label=texts.START_PAUSED, elem_id="replay-start-paused")
    return ReplayTab([trace_choice, trace_upload, speed], replay_button, start_paused, lessons,
                     (callout, lesson_prev, lesson_next, gr.State(None)))


def serving_tab(serving: Serving) -> ServingTab:
    """Throughput and latency against concurrency on a vLLM pair's servers (the how-to where there is none)."""
    gr.Markdown(serving.intro(), elem_id="serving-intro")
    with gr.Row():
        levels = gr.CheckboxGroup(list(LEVELS), value=list(LEVELS), label=texts.SERVING_LEVELS, elem_id="serving-levels",
                                  scale=2)
        tokens = gr.Slider(1, serving.bounds.max_new_tokens, value=min(32, serving.bounds.max_new_tokens), step=1,
                           label=texts.SERVING_TOKENS, elem_id="serving-tokens", scale=2)
        run_button = gr.Button(texts.SERVING_RUN, variant="primary", elem_id="serving-run", scale=1)
    status = gr.Markdown("", elem_id="serving-status")
    plot = gr.Plot(serving_figure([]), label="Throughput and latency against concurrency", elem_id="serving-chart")
    table = gr.HTML(serving_table_html([]), elem_id="serving-table")
    return ServingTab([levels, tokens], run_button, [plot, table, status])


def howto_tab() -> None:
    gr.Markdown(texts.INTRO, elem_id="intro")
    gr.HTML(howto_html(), elem_id="howto")


def race_area(doctor_intro: str | None = None) -> RaceArea:
    """Under the tabs: the controls, the summary and the lanes' panes first (in view while they race),
    then the legend, the cycle view, the charts, the what-if model and the downloads; beside the
    summary, with `doctor_intro` (live pairs only), the "Why this tau?" panel."""
    with gr.Column(elem_id="race-area") as column:
        with gr.Row(elem_id="race-controls", equal_height=True):
            pause_button = gr.Button("Pause (space)", elem_id="pause", size="sm", scale=0, min_width=120)
            step_button = gr.Button("Step one cycle (→)", elem_id="step", size="sm", scale=0, min_width=150)
            resume_button = gr.Button("Continue", elem_id="continue", size="sm", scale=0, min_width=100)
            control_status = gr.Markdown("", elem_id="control-status")
        panes = {}
        with gr.Row(equal_height=False, elem_id="lanes"):
            for lane in LANES:  # every lane's pane exists; a race shows those it races (`frames.start_frame`)
                with gr.Column(visible=lane in ("dflash", "plain"), elem_id=f"{lane}-pane", min_width=280) as pane:
                    panes[f"{lane}_column"] = pane
                    panes[f"{lane}_stats"] = gr.HTML(elem_id=f"{lane}-stats")
                    panes[f"{lane}_tokens"] = gr.HTML(elem_id=f"{lane}-tokens", css_template=TIP_CSS + render.TOKEN_CSS,
                                                      js_on_load=TIP_JS)
                    panes[f"{lane}_strip"] = gr.HTML(elem_id=f"{lane}-strip", css_template=TIP_CSS + render.STRIP_CSS, js_on_load=TIP_JS,
                                                     visible=lane != "plain")
            # Beside the lanes: a finished race pinned there (`serve/pinning.py`), kept while the next ones race.
            with gr.Column(visible=False, elem_id="pinned-pane", min_width=280) as pinned_column:
                pinned = gr.HTML(elem_id="pinned", css_template=PINNED_CSS + render.TOKEN_CSS)
                unpin_button = gr.Button(texts.UNPIN, elem_id="unpin", size="sm")
        # Under the lanes, so that they stay where they are when the finished race's numbers arrive.
        doctor = None
        with gr.Row(equal_height=False):
            summary = gr.HTML(render.summary_html(None), elem_id="summary", scale=6)
            pin_button = gr.Button(texts.PIN, elem_id="pin", size="sm", scale=0, min_width=140)
            if doctor_intro is not None:
                button = gr.Button(texts.DOCTOR_BUTTON, elem_id="doctor-run", size="sm", scale=0, min_width=140)
        gr.HTML(render.legend_html())
        if doctor_intro is not None:
            with gr.Accordion(texts.DOCTOR_PANEL, open=False, elem_id="doctor-panel") as accordion:
                report_html = gr.HTML(doctor_intro, elem_id="doctor")
                with gr.Accordion(texts.DOCTOR_JSON, open=False):
                    doctor = DoctorPanel(button, accordion, report_html, gr.JSON(show_label=False, elem_id="doctor-json"))
        with gr.Accordion(texts.CYCLE_PANEL, open=False, elem_id="cycle-panel") as cycle_panel:
            with gr.Row():
                cycle_prev = gr.Button("◀ cycle (←)", elem_id="cycle-prev", size="sm", scale=0, min_width=100)
                cycle_pick = gr.Slider(1, 2, value=1, step=1, label="Cycle", elem_id="cycle-pick", scale=3)
                cycle_next = gr.Button("cycle ▶", elem_id="cycle-next", size="sm", scale=0, min_width=100)
                cycle_best = gr.Button("best cycle", elem_id="cycle-best", size="sm", scale=0, min_width=100)
                cycle_worst = gr.Button("worst cycle", elem_id="cycle-worst", size="sm", scale=0, min_width=100)
                follow = gr.Checkbox(value=True, label="Follow the current cycle", elem_id="cycle-follow", scale=1)
                cycle_lane = gr.Radio([(LABELS[lane], lane) for lane in CYCLE_LANES], value="dflash", label="Lane",
                                      elem_id="cycle-lane", scale=2)
            cycle_view = gr.HTML(cycle_html(None, None, None, str), elem_id="cycle-view", js_on_load=None)
            gr.Markdown(texts.GLOSSARY, elem_id="glossary")
        # Empty figures at page load also make the browser fetch plotly before the first race.
        with gr.Row():
            acc_plot = gr.Plot(charts.acceptance_figure({}), label="Acceptance length", elem_id="chart-acceptance")
            speed_plot = gr.Plot(charts.speed_figure({}), label="Tokens/s", elem_id="chart-speed")
        with gr.Row():
            hist_plot = gr.Plot(charts.histogram_figure({}), label="Histogram", elem_id="chart-histogram")
            pos_plot = gr.Plot(charts.position_figure({}), label="Per-position acceptance", elem_id="chart-positions")
        speedup_plot = gr.Plot(speedup_figure(None, None), label="Speedup model", elem_id="chart-speedup")
        gr.Markdown(FORMULA_MD, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
        gr.HTML(lecture.whatif_html(), elem_id="whatif", js_on_load=lecture.WHATIF_JS)
        with gr.Row():
            report_json = gr.JSON(label="Summary (JSON)", elem_id="report")
            trace_file = gr.File(label="Trace download (JSON)", elem_id="trace")
            trace_csv = gr.File(label="Per-block metrics (CSV)", elem_id="trace-csv")
    outputs = {
        "summary": summary, **panes, "acceptance_chart": acc_plot, "speed_chart": speed_plot,
        "histogram_chart": hist_plot, "positions_chart": pos_plot, "speedup_chart": speedup_plot,
        "cycle_pick": cycle_pick, "cycle_view": cycle_view, "control_status": control_status,
        "report": report_json, "trace_file": trace_file, "trace_csv": trace_csv,
    }
    return RaceArea(outputs, pause_button, step_button, resume_button, follow, doctor, cycle_lane, column,
                    cycle_prev, cycle_next, cycle_panel, (cycle_best, cycle_worst), pin_button,
                    (pinned_column, pinned, unpin_button))


def build_demo(
    pairs: list[PairSpec], default_id: str, cache=None, limits: Limits | None = None, *,
    replay: str | None = None, live: bool = True,
) -> gr.Blocks:
    """The app's Blocks, its queue configured from `limits` (launch it without calling `queue`
    again, with `launch_options(demo)`); its `App` is `demo.dflash_app`.

    live=False: no model pairs and no live race (started with --replay; torch is never imported).
    replay: a trace file preselected in the Replay tab and played when the page loads.
    """
    limits = limits or Limits()
    # Gradio serves files from its upload folder but creates it only on a first upload: a fresh
    # machine has none yet. Trace files are kept outside it; the copies handed out go into it.
    uploads = Path(get_upload_folder())
    uploads.mkdir(parents=True, exist_ok=True)
    traces = TraceStore(private_trace_root(), served=uploads)
    if live and cache is None:
        from .pairs.models import PairCache

        cache = PairCache()
    app = App(pairs, default_id, cache if live else None, limits, traces, recorded_runs(replay))
    recorded = _trace_choices(replay)
    # Uploads (and the copies of traces handed out) older than an hour go, checked every 10 minutes,
    # and all of them at shutdown.
    with gr.Blocks(title="DFlash Studio", analytics_enabled=False, delete_cache=(600, 3600)) as demo:
        gr.HTML(lecture.page_head_html(), elem_id="page-head", js_on_load=lecture.PAGE_JS, padding=False)
        with gr.Row(elem_id="header", equal_height=True):
            gr.Markdown(texts.HEADER, elem_id="headline")
            large_text = gr.Checkbox(False, label=texts.LARGE_TEXT, elem_id="large-text", scale=0, min_width=220)
            block_bars = gr.Checkbox(True, label=texts.BLOCK_BARS, elem_id="block-bars", scale=0, min_width=130)
        first_tab = "live" if live and not replay else "replay"
        with gr.Tabs(selected=first_tab, elem_id="source-tabs"):
            tabs = {}
            if live:
                with gr.Tab("Live race", id="live") as tabs["live"]:
                    device_for = getattr(cache, "device_for", None)
                    live_inputs = live_tab(pairs, app.default_id, limits, device_for)
            with gr.Tab("Replay a recorded run", id="replay") as tabs["replay"]:
                replay_inputs = replay_tab(recorded)
            if live:
                with gr.Tab(texts.SERVING_TAB, id="serving") as tabs["serving"]:
                    serving = serving_tab(app.serving)
            with gr.Tab("How it works", id="howto") as tabs["howto"]:
                howto_tab()
        area = race_area(app.diagnosis.intro() if live else None)
        shown = _wire_before_runs(app, live_inputs if live else None, replay_inputs, area)
        _wire(demo, app, limits, live_inputs if live else None, replay_inputs, area, play_on_load=bool(replay))
        if live:
            _wire_serving(app, limits, live_inputs, serving)
        _wire_lecture(app, live_inputs if live else None, replay_inputs, area, tabs, (large_text, block_bars), shown)
        _wire_pins(app, area, tabs, first_tab)
    # A queued function runs only through the queue, where the bounds per visitor apply; Gradio
    # would otherwise run it on /gradio_api/run/<name> as well, up to its first frame.
    demo.queue(api_open=False)
    bound_queue(demo, limits)  # per queue and per visitor: one client cannot fill it for everyone
    refuse_url_inputs(demo)  # no input makes the server fetch a URL
    files = (area.outputs["trace_file"], area.outputs["trace_csv"])
    app.traces.on_delete = lambda path: forget_served(path, files)
    demo.dflash_app = app
    return demo


def _wire(demo: gr.Blocks, app: App, limits: Limits, live: LiveTab | None, replay: ReplayTab, area: RaceArea,
          play_on_load: bool) -> None:
    """The events: each button and page event to its handler."""
    outputs = [area.outputs[name] for name in FRAME_FIELDS]
    race_event = _wire_live(demo, app, limits, live, outputs, area.outputs["summary"]) if live is not None else None
    if live is not None:
        _wire_doctor(app, limits, live, area.doctor)
    # The events that fill the race's outputs: a new one cancels the others.
    runs = [race_event] if race_event is not None else []
    # Replays have slots of their own (`Playback.slots`), so Gradio starts every one at once.
    replaying = {"concurrency_limit": None, "concurrency_id": "replay", "show_progress": "hidden"}
    if play_on_load:
        # Named, so that the button's endpoint keeps the name `replay`.
        runs.append(demo.load(
            app.playback.replay, inputs=replay.inputs, outputs=outputs, api_name="replay_on_load", api_visibility="private",
            **replaying,
        ))
    # Callable by name, left out of the API page and so of the MCP tools (each MCP call is a session
    # of its own, and a replay takes a file): `compare` is the one tool.
    replay_event = replay.replay_button.click(
        app.playback.replay, inputs=replay.inputs, outputs=outputs, api_name="replay", api_visibility="undocumented",
        cancels=list(runs), **replaying,
    )
    runs.append(replay_event)
    if live is not None:
        # A race started while a replay plays replaces it (both fill the same panes).
        live.run_button.click(None, cancels=[e for e in runs if e is not race_event], queue=False, api_visibility="private")
    # The controls act on a running race at once: they skip the queue the race is waiting in.
    control_status = area.outputs["control_status"]
    area.pause_button.click(app.stepping.pause, outputs=[control_status], queue=False, api_visibility="private")
    # Every click is one more cycle: with Gradio's default ("once"), a click made while the previous
    # Step's reply is still on its way (a busy CPU sends the stream's frame first) would be dropped.
    # No timer over the status line and the follow checkbox while the reply is on its way.
    area.step_button.click(
        app.stepping.step, outputs=[control_status, area.follow], queue=False, api_visibility="private",
        trigger_mode="multiple", show_progress="hidden",
    )
    area.resume_button.click(app.stepping.resume, outputs=[control_status, area.follow], queue=False,
                             api_visibility="private", show_progress="hidden")
    # Every cycle picker answers with the follow checkbox and the race's outputs (`stepping.look_at`):
    # in a paused or finished run the panes go back to the cycle picked.
    looked = [area.follow, *outputs]
    cycle_pick = area.outputs["cycle_pick"]
    now = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}
    for event in (cycle_pick.release, cycle_pick.input):
        event(app.stepping.pick_cycle, inputs=[cycle_pick], outputs=looked, **now)
    area.follow.input(app.stepping.follow_latest, inputs=[area.follow], outputs=looked, **now)
    area.cycle_lane.input(app.stepping.pick_lane, inputs=[area.cycle_lane], outputs=looked, **now)
    demo.unload(app.end_session)


def _wire_live(demo: gr.Blocks, app: App, limits: Limits, live: LiveTab, outputs: list, summary):
    """The pair selector, Race and Stop; returns the race's event."""
    # The thinking control follows the loaded pair: shown where its template has the switch.
    thinking_control = {"fn": app.loading.thinking_control, "inputs": [live.pair_state], "outputs": [live.thinking],
                        "api_visibility": "private"}
    # While the pair's lanes compile, the status line counts the steps compiled (off once they are).
    compiling = gr.Timer(COMPILE_TICK_S, active=False)
    timer = {"fn": app.loading.compiling, "inputs": [live.pair_state], "outputs": [compiling],
             "queue": False, "api_visibility": "private"}
    compiling.tick(app.loading.compile_status, inputs=[live.pair_state, live.thinking],
                   outputs=[live.status, compiling], queue=False, api_visibility="private")
    demo.load(app.loading.load_selected, inputs=[live.pair_state], outputs=[live.status, live.block_size],
              api_visibility="private").then(**thinking_control).then(**timer)
    # Callable by name, not an MCP tool (see `replay`): a pair chosen in one MCP call would not
    # outlive it.
    live.pair_choice.change(
        app.loading.select_pair, inputs=[live.pair_choice], outputs=[live.pair_state, live.status, live.block_size],
        api_name="select_pair", api_visibility="undocumented",
    ).then(**thinking_control).then(**timer)
    live.thinking.input(app.loading.thinking_status, inputs=[live.pair_state, live.thinking], outputs=[live.status],
                        queue=False, api_visibility="private")
    race = {
        "fn": app.live.compare, "outputs": outputs,
        # Progress (the queue position while waiting) on the summary only: on the panes an
        # overlay would hide the tokens.
        "show_progress": "full", "show_progress_on": [summary],
        "concurrency_limit": limits.concurrency, "concurrency_id": "race",
        # Raw values reach `check_request`, which names any bad one; Gradio's own conversion
        # would answer a string or null in a number field with an unexplained error.
        "preprocess": False,
    }
    # The page sends the pair it shows with every click: the session's pair state may have been
    # dropped (--session-capacity), and the race must not then run on the default pair. The
    # `compare` endpoint (API clients, agents) takes no pair: the session's, else the default.
    api_event = gr.Button(visible=False, elem_id="compare-api").click(
        inputs=[*live.inputs, live.pair_state, live.thinking, live.tree_budget], api_name="compare", **race)
    race_event = live.run_button.click(inputs=[*live.inputs, live.pair_choice, live.thinking, live.tree_budget],
                                       api_name="compare_from_page", api_visibility="private", **race)
    race_event.then(**timer)  # a race may have asked for a tree size to compile: the status line follows it
    # A running race stops itself within one cycle and reports what it showed; the cancel
    # that follows takes a race still waiting in the queue out of it.
    live.stop_button.click(app.live.stop, queue=False, api_visibility="private").then(
        None, cancels=[race_event, api_event], queue=False, api_visibility="private"
    )
    return race_event


def _wire_doctor(app: App, limits: Limits, live: LiveTab, doctor: DoctorPanel) -> None:
    """The doctor's button opens its panel at once, then runs the doctor in the race queue (never
    beside a race); selecting another pair empties the panel."""
    doctor.button.click(lambda: gr.Accordion(open=True), outputs=[doctor.accordion], queue=False,
                        api_visibility="private")
    # Callable by name, not an MCP tool (see `replay`); on the pair the page shows (see `_wire_live`).
    doctor.button.click(
        app.diagnosis.diagnose, inputs=[live.pair_choice], outputs=[doctor.html, doctor.json], api_name="diagnose",
        api_visibility="undocumented", show_progress="minimal", show_progress_on=[doctor.html],
        concurrency_limit=limits.concurrency, concurrency_id="race",
    )
    live.pair_choice.change(lambda: (app.diagnosis.intro(), None), outputs=[doctor.html, doctor.json], queue=False,
                            api_visibility="private")


def _wire_serving(app: App, limits: Limits, live: LiveTab, serving: ServingTab) -> None:
    """The sweep runs in the race queue: one at a time with races, and the per-visitor bounds apply."""
    # Callable by name, not an MCP tool (see `replay`).
    serving.run_button.click(
        app.serving.sweep, inputs=[*serving.inputs, live.pair_choice], outputs=serving.outputs, api_name="serving_sweep",
        api_visibility="undocumented", show_progress="minimal", show_progress_on=[serving.outputs[2]],
        concurrency_limit=limits.concurrency, concurrency_id="race",
    )


def _wire_before_runs(app: App, live: LiveTab | None, replay: ReplayTab, area: RaceArea) -> gr.State:
    """Race and Replay first clear what an earlier run left (an error then stands alone), with
    "Start paused" ticked hold the run they start before cycle 1, bring the lanes into view and note
    which source's run the area shows (returned). Wired before the runs themselves: the page sends a
    button's events in the order they were wired, each once the one before has ended."""
    outputs = [area.outputs[name] for name in FRAME_FIELDS]
    now = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}
    shown = gr.State(None)
    sources = [("replay", replay.replay_button, replay.start_paused)]
    if live is not None:
        sources.append(("live", live.run_button, live.start_paused))
    for name, button, start_paused in sources:
        button.click(None, js=lecture.SCROLL_TO_LANES_JS, **now)
        button.click(lambda name=name: name, outputs=[shown], **now)
        button.click(app.lecture.before_run, inputs=[start_paused], outputs=outputs, **now)
    return shown


def _shown():
    return gr.Column(visible=True)


def _hidden():
    return gr.Column(visible=False)


def _wire_lecture(app: App, live: LiveTab | None, replay: ReplayTab, area: RaceArea, tabs: dict, switches,
                  shown: gr.State) -> None:
    """What a class needs beside the race's own events (and `_wire_before_runs`): the lane checkboxes
    gathered, Step with nothing playing starting a paused run, the cycle view stepped back and on
    and to the best / worst cycle, the race area only under the tabs that race (emptied when the
    source, `shown`, or the pair changes), the lessons, and the page's switches. Every event here
    answers at once (no queue) or runs in the browser only."""
    outputs = [area.outputs[name] for name in FRAME_FIELDS]
    now = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}
    if live is not None:
        basic, more = live.lane_picks
        lanes = live.inputs[-1]
        for group in (basic, more):
            group.input(None, inputs=[basic, more], outputs=[lanes], js="(a, b) => [[...a, ...b]]", **now)
        live.pair_choice.change(app.lecture.clear, outputs=outputs, **now)
    control_status = area.outputs["control_status"]
    area.step_button.click(app.lecture.step_when_idle, outputs=[control_status], **now).then(
        None, inputs=[control_status], js=lecture.START_PAUSED_JS, **now)
    cycle_outputs = [area.follow, *outputs]  # `stepping.look_at`
    for button, shift in ((area.cycle_prev, app.lecture.previous_cycle), (area.cycle_next, app.lecture.next_cycle)):
        button.click(lambda: gr.Accordion(open=True), outputs=[area.cycle_panel], **now)
        button.click(shift, inputs=[area.outputs["cycle_pick"]], outputs=cycle_outputs, **now)
    for button, jump in zip(area.cycle_extremes, (app.lecture.best_cycle, app.lecture.worst_cycle)):
        button.click(jump, outputs=cycle_outputs, **now)
    # The area shows the run of one source (Live race or Replay): under the other, it starts empty.
    for name, tab in tabs.items():
        races = name in ("live", "replay")
        tab.select(_shown if races else _hidden, outputs=[area.column], **now)
        if races:
            tab.select(app.lecture.switcher(name), inputs=[shown], outputs=[shown, *outputs], **now)
    _wire_lessons(app, replay, area)
    large_text, block_bars = switches
    large_text.input(None, inputs=[large_text], js=lecture.toggle_js("large-text"), **now)
    block_bars.input(None, inputs=[block_bars], js=lecture.toggle_js("no-block-bars", when_on=False), **now)


def _wire_pins(app: App, area: RaceArea, tabs: dict, first_tab: str) -> None:
    """Pin / Unpin, and each racing tab showing its own pin: the tab on screen and the pins (tab ->
    panel) are the page's session state."""
    now = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}
    tab, pins = gr.State(first_tab), gr.State({})
    column, panel, unpin = area.pinned
    area.pin_button.click(app.pinning.pin, inputs=[tab, pins], outputs=[pins, panel, column], **now)
    unpin.click(app.pinning.unpin, inputs=[tab, pins], outputs=[pins, panel, column], **now)
    for name in TABS:
        if name in tabs:
            tabs[name].select(lambda held, name=name: (name, *Pinning.show(name, held)), inputs=[pins],
                              outputs=[tab, panel, column], **now)


def _wire_lessons(app: App, replay: ReplayTab, area: RaceArea) -> None:
    """A lesson's button picks its recording and replays it, held at its first stop (one click);
    Previous / Next go between its stops."""
    outputs = [area.outputs[name] for name in FRAME_FIELDS]
    callout, previous, following, state = replay.lesson_parts
    trace_choice, _, speed = replay.inputs
    for key, button in (replay.lessons or {}).items():
        button.click(app.lessons.opener(key), outputs=[trace_choice, speed, callout, state], queue=False,
                     api_visibility="private", show_progress="hidden").then(
            app.lecture.before_run, inputs=[gr.State(False)], outputs=outputs, queue=False, api_visibility="private",
            show_progress="hidden").then(
            app.playback.replay, inputs=replay.inputs, outputs=outputs, api_visibility="private",
            concurrency_limit=None, concurrency_id="replay", show_progress="hidden")
    moved = [callout, state, area.cycle_panel, area.follow, *outputs]  # `Lessons.move`
    for button, move in ((previous, app.lessons.previous), (following, app.lessons.next)):
        button.click(move, inputs=[state], outputs=moved, queue=False, api_visibility="private", show_progress="hidden")

