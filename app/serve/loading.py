"""Pair selection and loading, the handlers of the pair selector and its status line.

A pair loads in a worker thread while its download progress (Hub bytes and files) streams to the
status line; every failure becomes a message, and the app keeps serving.
"""

from __future__ import annotations

import queue
import threading
import time

import gradio as gr

from dflash_core.loading import describe_template, has_thinking_switch

from ..pairs.registry import PairSpec, availability
from ..race.lanes import LABELS
from ..race.thinking import DEFAULT, check_thinking
from ..view import texts
from .failures import failure_message
from .sessions import race_kinds

PROGRESS_EVERY_S = 0.25  # download progress lines at most this often


class PairLoading:
    """The pair registry and the model cache (a `PairCache`; None in a replay-only app)."""

    def __init__(self, pairs: list[PairSpec], default_id: str, cache):
        self.pairs = {p.id: p for p in pairs}
        self.default_id = default_id if default_id in self.pairs else (pairs[0].id if pairs else "")
        self.cache = cache
        self.kinds = race_kinds(self)  # by pair kind: how its races are prepared and opened

    def load(self, spec: PairSpec, frame):
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
            yield texts.UNKNOWN_PAIR.format(pair_id=pair_id), gr.skip()
            return
        yield from self.kinds[spec.kind].status(spec)

    def load_status(self, spec: PairSpec):
        """The status lines of a pair that loads here, with the block-size slider set to its trained size."""
        device = self.cache.device_for(spec)
        reason = availability(spec, device)
        if reason:
            yield texts.UNAVAILABLE.format(reason=reason), gr.skip()
            return
        loading = texts.LOADING.format(label=spec.label, device=device)
        if not self.cache.is_loaded(spec):
            yield f"{loading}…", gr.skip()
        try:
            pair = yield from self.load(spec, lambda line: (f"{loading}: {line}…", gr.skip()))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, the app keeps serving
            yield texts.NOT_LOADED.format(label=spec.label, why=failure_message(exc, device)), gr.skip()
            return
        trained = pair.trained_block_size
        freed = texts.FREED.format(labels=", ".join(self.cache.freed)) if self.cache.freed else ""
        yield self._ready(pair, device, None, freed), gr.update(maximum=trained, value=trained)

    def _ready(self, pair, device: str, thinking: str | None, freed: str = "") -> str:
        """The status line of a loaded pair whose races use `thinking` ("on", "off", None: its default)."""
        used = pair.thinking(thinking)
        steps = (texts.LANE_STEPS.format(status=pair.compiled.status()) if pair.compiled is not None
                 else texts.LANE_STEPS.format(status=f"eager, since {pair.eager_only}") if pair.eager_only else "")
        return texts.READY.format(
            label=pair.spec.label, device=device, steps=steps, load_s=pair.load_s, numerics=pair.numerics,
            trained=pair.trained_block_size, drafter_dtype=str(pair.drafter.dtype).removeprefix("torch."),
            chat_template=describe_template(pair.tokenizer, used.args), thinking=used.trained_words(),
            size=pair.size.describe() if pair.size else "size not counted", freed=freed,
        ) + "".join(texts.LANE_NOT_OFFERED.format(lane=LABELS[lane], why=pair.spec.lane_missing(lane))
                    for lane in pair.spec.lane_drafters() if pair.spec.lane_missing(lane))

    def _loaded(self, pair_id: str):
        """The loaded pair of a local `pair_id`, else None (not loaded yet, unknown, or served by vLLM)."""
        spec = self.pairs.get(pair_id)
        if spec is None or spec.kind != "local" or self.cache is None or not self.cache.is_loaded(spec):
            return None
        return self.cache.get(spec)

    def thinking_control(self, pair_id: str):
        """The thinking control once `pair_id` has loaded: shown, at the pair's default, only where the
        target's chat template has the switch (the status line says so where it has none)."""
        pair = self._loaded(pair_id)
        return gr.update(visible=pair is not None and has_thinking_switch(pair.tokenizer), value=DEFAULT)

    def thinking_status(self, pair_id: str, thinking):
        """The status line as the visitor sets the thinking control: the setting their races use
        beside the one the drafter was trained with; a bad value is named."""
        pair = self._loaded(pair_id)
        if pair is None:
            return gr.skip()
        try:
            return self._ready(pair, self.cache.device_for(pair.spec), check_thinking(thinking))
        except ValueError as exc:  # DFlashError is a ValueError
            return texts.BAD_THINKING.format(why=str(exc))

    def compiling(self, pair_id: str):
        """The status line's timer: on while `pair_id`'s lanes compile (`pairs/compiled.py`)."""
        pair = self._loaded(pair_id)
        return gr.Timer(active=pair is not None and pair.compiled is not None and not pair.compiled.finished)

    def compile_status(self, pair_id: str, thinking):
        """Each tick of that timer: the status line with how far the compile has come, and the timer
        off once it is over."""
        pair = self._loaded(pair_id)
        if pair is None or pair.compiled is None:
            return gr.skip(), gr.Timer(active=False)
        try:
            used = check_thinking(thinking)
        except ValueError:
            used = None
        return self._ready(pair, self.cache.device_for(pair.spec), used), gr.Timer(active=not pair.compiled.finished)

    def select_pair(self, pair_id: str):
        """The pair selector (also the `select_pair` endpoint): this session races `pair_id` from now on,
        once it loads; yields (pair for the session, status line, block-size slider) like `load_selected`."""
        keep = pair_id if pair_id in self.pairs else gr.skip()
        for status, block_size in self.load_selected(pair_id):
            yield keep, status, block_size
