"""The "Why this tau?" handler: the acceptance doctor (`dflash_core.doctor`) on the session's pair.

`Diagnosis.diagnose` loads the selected pair (its progress shown in the panel), then runs
`diagnose` in a worker thread that holds the pair's lock (the pair's targets hold one race's KV
caches at a time), streaming the doctor's progress lines and the seconds spent; it ends with the
report rendered (`view/doctor_panel.py`) and as JSON (`dflash-doctor/1`).

It is bounded as a race is: wired in the race queue (concurrency_id "race"), so it never runs
beside a race; it ends at `limits.max_race_s` and once nobody reads the page (both checked between
the doctor's steps). It decodes less than the command line does (`ON_DEMAND`), and the panel
gives the command of the full run. A vLLM pair has no target here, nor a GPU pair where races run
in a ZeroGPU worker: the panel then gives the command that runs the doctor elsewhere.
"""

from __future__ import annotations

import queue
import shlex
import threading
import time
from dataclasses import dataclass

import gradio as gr

from ..guard.limits import Limits
from ..guard.readers import Readers
from ..view import doctor_panel, texts
from .failures import failure_message, visitor_error
from .loading import PairLoading

TICK_S = 1.0  # the panel's seconds count moves this often while a step runs


@dataclass(frozen=True)
class Ask:
    """How much the doctor decodes on demand: prompts (spread over the drafter card's set, else the
    natural set) and new tokens per prompt. The command line's defaults are 6 and 64."""

    prompts: int = 3
    max_new_tokens: int = 48


ON_DEMAND = Ask()


class Stopped(Exception):
    """Raised from the doctor's callbacks (between its steps, after each cycle): the time is up or the visitor left."""


class Diagnosis:
    """Runs the doctor for the pairs of `loading`, within `limits`."""

    def __init__(self, loading: PairLoading, limits: Limits, readers: Readers | None = None,
                 in_process=lambda pair_id: True, ask: Ask = ON_DEMAND):
        """in_process: whether a pair's models run in this process (not in a ZeroGPU worker)."""
        self.loading, self.limits = loading, limits
        self.readers = readers or Readers()
        self.in_process = in_process
        self.ask = ask

    def intro(self) -> str:
        """The panel before a run."""
        return doctor_panel.intro_html(self.ask.prompts, self.ask.max_new_tokens)

    def diagnose(self, pair_id: str | None = None, request: gr.Request = None):
        """Generator of (panel HTML, report JSON or None): the doctor's progress, then its report on `pair_id`."""
        if self.loading.cache is None:
            raise visitor_error(texts.NO_MODEL)
        spec = self.loading.pairs.get(pair_id or self.loading.default_id)
        if spec is None:
            raise visitor_error(texts.UNKNOWN_MODEL_PAIR.format(pair_id=pair_id))
        if spec.kind == "vllm":
            yield doctor_panel.notice_html(texts.DOCTOR_VLLM, vllm_command(spec)), None
            return
        if not self.in_process(spec.id):
            yield doctor_panel.notice_html(texts.DOCTOR_GPU_WORKER, cli_command(spec)), None
            return
        started = time.perf_counter()
        lines = [texts.DOCTOR_LOADING.format(label=spec.label)]

        def shown(line: str | None = None):
            if line:
                lines.append(line)
            return doctor_panel.progress_html(lines, time.perf_counter() - started), None

        yield shown()
        try:
            pair = yield from self.loading.load(spec, lambda line: shown(line))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, the app keeps serving
            yield self._failed(spec, exc), None
            return
        gone = self.readers.watch(getattr(request, "session_hash", None))
        deadline = started + self.limits.max_race_s
        updates: queue.Queue = queue.Queue()
        cancel = threading.Event()
        result = {}

        def check() -> None:  # between the doctor's steps and after each of its decoding cycles
            if cancel.is_set() or gone():
                raise Stopped("the visitor left")
            if time.perf_counter() > deadline:
                raise Stopped(texts.DOCTOR_TIME_UP.format(seconds=self.limits.max_race_s))

        def log(line: str) -> None:
            check()
            updates.put(line)

        def work():
            try:
                with pair.queued():  # the compile thread lets it have the pair before its next step
                    if pair.lock.locked():
                        step = pair.busy_with()
                        updates.put(texts.DOCTOR_WAITING_STEP.format(step=step) if step else texts.DOCTOR_WAITING)
                    if not pair.lock.acquire(timeout=max(0.0, deadline - time.perf_counter())):
                        raise Stopped(texts.DOCTOR_BUSY.format(seconds=self.limits.max_race_s))
                try:
                    result["report"] = run_doctor(pair, spec, self.ask, log, check)
                finally:
                    pair.lock.release()
            except BaseException as exc:  # noqa: BLE001 - handed to the generator, which explains it
                result["error"] = exc
            finally:
                updates.put(None)

        threading.Thread(target=work, daemon=True, name="doctor").start()
        try:
            while True:
                try:
                    line = updates.get(timeout=TICK_S)
                except queue.Empty:
                    yield shown()
                    continue
                if line is None:
                    break
                yield shown(line)
        finally:
            cancel.set()  # a closed generator (the visitor left, a cancel) stops the doctor at its next step
        yield self._outcome(spec, result, time.perf_counter() - started)

    def _outcome(self, spec, result: dict, seconds: float):
        error = result.get("error")
        if isinstance(error, Stopped):
            return doctor_panel.notice_html(str(error), cli_command(spec)), None
        if error is not None:
            return self._failed(spec, error), None
        report, source = result["report"]
        note = texts.DOCTOR_RAN.format(prompts=len(report.pair.get("prompts", [])), source=source,
                                       tokens=self.ask.max_new_tokens, seconds=seconds)
        data = report.to_dict()
        data["pair"]["drafter"] = spec.drafter  # as the registry names it, not this server's path
        return doctor_panel.report_html(report, spec.label, note, cli_command(spec)), data

    def _failed(self, spec, exc: BaseException) -> str:
        why = failure_message(exc, self.loading.cache.device_for(spec))
        return doctor_panel.notice_html(texts.DOCTOR_FAILED.format(label=spec.label, why=why))


def run_doctor(pair, spec, ask: Ask, log, checkpoint=None):
    """(the doctor's `Report` on a loaded pair, the name of the prompt file it decoded); the caller holds the lock.
    checkpoint: called after every decoding cycle; it raises to stop the doctor there."""
    from dflash_core import resolve_model_dir
    from dflash_core.doctor import DoctorSettings, default_prompts, diagnose

    # The card (README.md) states the tau to compare with: fetched beside the weights for a Hub drafter.
    drafter_dir = resolve_model_dir(spec.drafter_location(), ("config.json", "model.safetensors"),
                                    patterns=("config.json", "model.safetensors", "README.md"))
    prompts, source = default_prompts(drafter_dir, limit=ask.prompts)
    settings = DoctorSettings(max_new_tokens=ask.max_new_tokens, trained_template=spec.chat_template_args)
    report = diagnose(pair.target, drafter_dir, prompts, drafter=pair.drafter, settings=settings,
                      target_name=spec.target, log=log, checkpoint=checkpoint)
    return report, source.name


def cli_command(spec) -> str:
    """The shell command of the doctor's full run on a local pair."""
    words = ["python", "-m", "dflash_core", "doctor", "--target", spec.target, "--drafter", spec.drafter,
             "--dtype", spec.dtype]
    thinking = (spec.chat_template_args or {}).get("enable_thinking")
    if thinking is not None:
        words += ["--thinking", "on" if thinking else "off"]
    return shlex.join(words)


def vllm_command(spec) -> str:
    """The doctor's command against a vLLM pair's server; TARGET is the served model where the app knows it."""
    from ..race.vllm_session import servers_of

    models = servers_of(spec).models
    served = models["dflash"] if models else None
    target = (served.root or served.name) if served else "TARGET"
    words = ["python", "-m", "dflash_core", "doctor", "--target", target, "--drafter", "DRAFTER", "--server", spec.vllm_url]
    return shlex.join(words)
