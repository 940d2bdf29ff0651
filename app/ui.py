"""The Gradio Blocks: controls, the two race panes, live charts, summary and trace download.

Handlers here only wire inputs to the engine's `generate`, feed its events to `race`, and pass
the snapshots to the renderers; they translate every `DFlashError` into a message for the user.
"""

from __future__ import annotations

import json
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

import gradio as gr

from dflash_core import SamplingParams, generate
from dflash_core.errors import explain
from dflash_core.lossless import compare as lossless_check

from . import charts, render
from .examples import EXAMPLES
from .models import PairCache
from .pairs import PairSpec, availability
from .race import SideView, Snapshot, race
from .report import race_report, trace
from .tokens import TokenPieces

MAX_PROMPT_CHARS = 16_000
MAX_NEW_TOKENS = 512
CHART_EVERY_S = 0.4  # plotly figures are heavy to ship; text frames go out more often
PROGRESS_EVERY_S = 0.25  # download progress lines at most this often

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

    def __init__(self, pairs: list[PairSpec], default_id: str, cache: PairCache):
        self.pairs = {p.id: p for p in pairs}
        self.default_id = default_id if default_id in self.pairs else pairs[0].id
        self.cache = cache

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
        reason = availability(spec, self.cache.device)
        if reason:
            yield f"⚠ **Unavailable:** {reason}", gr.skip()
            return
        loading = f"Loading **{spec.label}** on {self.cache.device} (first time only)"
        if not self.cache.is_loaded(spec):
            yield f"{loading}…", gr.skip()
        try:
            pair = yield from self.loading(spec, lambda line: (f"{loading}: {line}…", gr.skip()))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, the app keeps serving
            yield f"⚠ **Could not load {spec.label}:** {explain(exc, self.cache.device)}", gr.skip()
            return
        trained = pair.trained_block_size
        freed = f" Freed {', '.join(self.cache.freed)} to make room." if self.cache.freed else ""
        status = (
            f"✓ **{spec.label}** ready on {self.cache.device} (loaded in {pair.load_s:.1f} s); "
            f"target in {pair.numerics}; drafter trained with block size {trained}; "
            f"prompts through {pair.chat_template}.{freed}"
        )
        yield status, gr.update(maximum=trained, value=trained)

    # --- the race --------------------------------------------------------------------------------
    def compare(self, prompt, max_new_tokens, block_size, temperature, top_p, seed, pair_id=None):
        """Stream a DFlash vs plain race; the last update carries the JSON summary and the trace."""
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
        loading = f"Loading {spec.label}… (first time only)"
        yield self._frame_start(loading if not self.cache.is_loaded(spec) else "Racing…")
        try:
            pair = yield from self.loading(spec, lambda line: self._frame_start(f"{loading} {line}"))
            prompt_ids = pair.encode(prompt)
            common = {"max_new_tokens": max_new_tokens, "sampling": sampling, "stop_ids": pair.stop_ids}
            dflash_events = generate(pair.target, prompt_ids, pair.drafter, block_size=block_size, **common)
            plain_events = generate(pair.plain, prompt_ids, None, **common)
            pieces = {"dflash": TokenPieces(pair.tokenizer), "plain": TokenPieces(pair.tokenizer)}
            text_of = _single_token_text(pair.tokenizer)
            # The first frames carry text only, so the first tokens are not held up by figures.
            last_chart = time.perf_counter()
            snapshot = None
            for snapshot in race(dflash_events, plain_events, dflash_block_size=block_size):
                now = time.perf_counter()
                with_charts = snapshot.done or now - last_chart >= CHART_EVERY_S
                if with_charts:
                    last_chart = now
                if not snapshot.done:
                    yield self._frame(snapshot, pieces, text_of, None, with_charts)
            d_sum, p_sum = snapshot.dflash.summary, snapshot.plain.summary
            verdict = lossless_check(pair.plain, prompt_ids, d_sum.output_ids, p_sum.output_ids) if sampling.greedy else None
        except Exception as exc:  # noqa: BLE001 - OOM, CUDA errors, missing files: all reach the visitor
            raise gr.Error(explain(exc, self.cache.device)) from None
        report = race_report(d_sum, p_sum, sampling.temperature, block_size, verdict)
        settings = {
            "pair": spec.id,
            "target": spec.target,
            "drafter": spec.drafter,
            "prompt": prompt,
            "max_new_tokens": max_new_tokens,
            "block_size": block_size,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,
            "device": self.cache.device,
            "chat_template": pair.chat_template,
        }
        path = Path(tempfile.mkdtemp(prefix="dflash-trace-")) / "dflash_trace.json"
        path.write_text(json.dumps(trace(snapshot.dflash.summary, snapshot.plain.summary, report, settings), indent=1))
        yield self._frame(snapshot, pieces, text_of, report, True, str(path))

    # --- frames ----------------------------------------------------------------------------------
    def _frame_start(self, text: str) -> tuple:
        waiting = render.tokens_html([], [], str)
        # Charts are kept (skipped) until the first chart frame: rebuilding them now would cost time.
        return Frame(
            summary=render.summary_html(None, text), dflash_stats="", dflash_tokens=waiting, dflash_strip="",
            plain_stats="", plain_tokens=waiting, report=gr.update(value=None), trace_file=gr.update(value=None),
        ).values()

    def _frame(self, snap: Snapshot, pieces, text_of, report, with_charts: bool, trace_path=None):
        diff = None if report is None else report["first_difference"]
        d, p = snap.dflash, snap.plain
        d_html = render.tokens_html(render.dflash_marks(d), pieces["dflash"].extend(d.output_ids), text_of, diff)
        p_html = render.tokens_html(render.plain_marks(p), pieces["plain"].extend(p.output_ids), text_of, diff)
        note = (
            ""
            if report is None
            else (
                "Times are each side's own compute time: the two runs were interleaved in one worker, "
                "so neither slowed the other down."
            )
        )
        frame = Frame(
            summary=render.summary_html(report, note) if report else render.summary_html(None, "Racing…"),
            dflash_stats=render.side_stats_html(d, f"DFlash (block {d.block_size})"),
            dflash_tokens=d_html,
            dflash_strip=render.draft_strip_html(d, text_of),
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


def build_demo(pairs: list[PairSpec], default_id: str, cache: PairCache | None = None) -> gr.Blocks:
    app = App(pairs, default_id, cache or PairCache())
    with gr.Blocks(title="DFlash Studio", analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
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
        gr.HTML(render.legend_html())
        summary = gr.HTML(render.summary_html(None), elem_id="summary")
        with gr.Row(equal_height=False):
            with gr.Column():
                d_stats = gr.HTML(elem_id="dflash-stats")
                d_tokens = gr.HTML(elem_id="dflash-tokens")
                d_strip = gr.HTML(elem_id="dflash-strip")
            with gr.Column():
                p_stats = gr.HTML(elem_id="plain-stats")
                p_tokens = gr.HTML(elem_id="plain-tokens")
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
            "report": report_json,
            "trace_file": trace_file,
        }
        outputs = [components[name] for name in FRAME_FIELDS]
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
    return demo
