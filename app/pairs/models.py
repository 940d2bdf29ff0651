"""Loading model pairs once and keeping them: one cached `LoadedPair` per registry entry.

Every lane of a race but DFlash's gets its own `Target` wrapper around the same weights, so the
lanes keep separate KV caches while sharing memory.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
from dataclasses import dataclass, field

import torch

from dflash_core import DFlashDrafter, DFlashError, Target, load_pair, resolve_model_dir, run, tree_refusal
from dflash_core.errors import ConfigError
from dflash_core.loading import (
    DEFAULT_TARGET,
    MARGIN,
    DefaultTargetError,
    ModelPair,
    PairSize,
    check_fits,
    default_drafter_dtype,
    describe_template,
    fetch_target,
    keep_compiled_code,
    load_drafter,
    load_lane_drafter,
    pair_size,
    parse_dtype,
    resolve_target,
    template_args,
)
from dflash_core.trace import RUNS as LANES

from ..race.lanes import DRAFTER_LANES
from ..race.thinking import Thinking, race_thinking
from .compiled import CompiledLanes
from .registry import PairSpec, availability


class PairUnavailable(DFlashError):
    """The chosen pair cannot run here (no GPU, offline, drafter not trained yet)."""


@dataclass
class LoadedPair(ModelPair):
    """A pair of the registry, loaded: the engine's `ModelPair` with the app's lanes and settings."""

    spec: PairSpec
    plain: Target  # same model object as `target`, separate cache
    load_s: float
    template_args: dict = field(default_factory=dict)  # for apply_chat_template (chat_template.py)
    size: PairSize | None = None  # its weights and what they need (dflash_core/loading/memory_need.py)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # held by the race using the caches
    # {lane: its drafter} for the lanes that race a drafter of their own (`race.lanes.DRAFTER_LANES`):
    # those the pair names and whose folders are there.
    lane_drafters: dict = field(default_factory=dict)
    compiled: CompiledLanes | None = None  # the lanes on compiled steps, where the app compiles them
    eager_only: str = ""  # why the lanes run eager steps only, where the app would compile them
    _lane_targets: dict = field(default_factory=dict, repr=False)
    # Races waiting for `lock` now: the compile thread lets them have it before its next step.
    _waiting: list = field(default_factory=list, repr=False)

    @contextlib.contextmanager
    def queued(self):
        """Counts the caller among the races waiting for `lock` while it waits for it."""
        mark = object()
        self._waiting.append(mark)  # list.append and .remove are atomic: no lock to order them
        try:
            yield
        finally:
            self._waiting.remove(mark)

    def races_waiting(self) -> bool:
        return bool(self._waiting)

    @property
    def ar_drafter(self) -> DFlashDrafter | None:
        """The autoregressive drafter of `spec.ar_drafter`, if the pair has one."""
        return self.lane_drafters.get("ar")

    @property
    def lanes(self) -> tuple[str, ...]:
        """The lanes this pair can race (dflash_core.trace.RUNS order): a drafter lane where the pair
        has its drafter, the tree lane where its target and drafter can verify trees."""
        trees = tree_refusal(self.target, self.drafter) is None
        return tuple(lane for lane in LANES if (lane not in DRAFTER_LANES or lane in self.lane_drafters)
                     and (lane != "tree" or trees))

    def busy_with(self) -> str | None:
        """The lane step compiling now (`Step.describe()`), holding the pair's lock; None when none is
        (the lock is then free, or a race or the doctor holds it)."""
        step = self.compiled.current if self.compiled is not None else None
        return step.describe() if step is not None else None

    def lane_target(self, lane: str) -> Target:
        """The target instance `lane` decodes with: DFlash the pair's own, plain its second, every
        other lane one of its own over the same weights (each holds its own KV caches)."""
        if lane == "dflash":
            return self.target
        if lane == "plain":
            return self.plain
        if lane not in self._lane_targets:
            self._lane_targets[lane] = Target(self.target.model, self.target.tokenizer)
        return self._lane_targets[lane]

    def compiled_lanes(self, lanes, block_size: int, positions: int, tree_budget: int) -> tuple[dict | None, str]:
        """({lane: compiled target} and "compiled steps", or None and "eager steps" with why a race of
        `lanes` at `block_size` over `positions` tokens (prompt and new), its tree lane verifying
        trees of `tree_budget` drafts, runs them)."""
        if self.compiled is None:
            return None, f"eager steps ({self.eager_only})" if self.eager_only else "eager steps"
        return self.compiled.lanes_for(lanes, block_size, positions, tree_budget)

    @property
    def chat_template(self) -> str:
        """The template prompts go through, in words (the status line names it)."""
        return describe_template(self.tokenizer, self.template_args)

    def thinking(self, choice: str | None = None) -> Thinking:
        """The thinking setting of a race with `choice` ("on", "off", None for the pair's default),
        beside the drafter's trained one (`race/thinking.py`)."""
        return race_thinking(self.tokenizer, choice, self.spec.chat_template_args, self.spec.label)

    def encode(self, prompt: str, thinking: str | None = None) -> list[int]:
        """Prompt ids through the chat template, with thinking as `thinking` asks (None: the pair's default)."""
        args = self.template_args if thinking is None else self.thinking(thinking).args
        return super().encode(prompt, template_args=args)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def default_threads(host: str, cores: int) -> int | None:
    """Threads to use when --threads is not given; None keeps torch's default (all cores).

    Served on loopback, the browser runs on the same CPU and repaints while both sides decode, so
    one core is left to it (docs/benchmarks.md has the figures). Remote viewers (a Space, --host
    0.0.0.0) leave the whole CPU to the app.
    """
    if host in LOOPBACK and cores > 1:
        return cores - 1
    return None


def _target_location(spec: PairSpec) -> str:
    if spec.target != DEFAULT_TARGET:
        return spec.target
    try:
        return resolve_target(spec.target)
    except DefaultTargetError as exc:  # a RuntimeError in the engine; the UI shows DFlashErrors
        raise PairUnavailable(str(exc)) from exc


def _warm_up(pair: LoadedPair) -> None:
    """One tiny run per side: the first forward pays one-off costs (kernel selection, allocator
    growth) that would otherwise land on the user's first click and delay the first tokens."""
    prompt_ids = pair.encode("Hi")
    run(pair.target, prompt_ids, pair.drafter, max_new_tokens=2)
    run(pair.plain, prompt_ids, None, max_new_tokens=2)
    for lane, drafter in pair.lane_drafters.items():
        run(pair.lane_target(lane), prompt_ids, drafter, max_new_tokens=2)


@dataclass(frozen=True)
class LoadNote:
    """A line for the status line while a pair loads (beside `DownloadProgress`)."""

    text: str

    def message(self) -> str:
        return self.text


def gpu_memory(device: str) -> tuple[int, int] | None:
    """(free, total) bytes on a CUDA device; None elsewhere (CPU pairs share the host's memory)."""
    if not str(device).startswith("cuda"):
        return None
    return torch.cuda.mem_get_info(torch.device(device))


class PairCache:
    """Loads each pair on first use; later calls return the same objects.

    Pairs with the same target at the same device and dtype (a target's block-4 and block-16
    drafters) share one copy of its weights, each with caches of its own. On a GPU a new pair is loaded beside the others only if free memory allows both; otherwise the
    loaded pairs are freed first (`freed` names them, for the status line). `memory` replaces the
    query of (free, total) device bytes (tests).
    """

    def __init__(
        self, device: str | None = None, warm_up: bool = True, cpu_for_cpu_pairs: bool = False, memory=None,
        hub_api=None, compile_gemms: str | None = None,
    ):
        """warm_up: run each pair once after loading (off where no compute is allowed at load: ZeroGPU).

        compile_gemms: once a pair has loaded on the CPU, compile its lanes' steps in the background
        with these GEMMs (`compiled.py`; None: never); its races run them once they are ready.

        cpu_for_cpu_pairs: pairs that do not need a GPU load on the CPU whatever `device` is (on
        ZeroGPU they then race without GPU quota).

        hub_api: replaces huggingface_hub's `HfApi` for the size query (tests).
        """
        self.device = device or default_device()
        self.warm_up = warm_up
        self.cpu_for_cpu_pairs = cpu_for_cpu_pairs
        self.memory = memory or (lambda: gpu_memory(self.device))
        self.hub_api = hub_api
        self.compile_gemms = compile_gemms
        if compile_gemms:
            keep_compiled_code()
        self.freed: list[str] = []  # labels of the pairs the last load freed
        self._pairs: dict[str, LoadedPair] = {}
        self._targets: dict[tuple, Target] = {}  # (target dir, device, dtype) -> the first pair's target
        self._lock = threading.Lock()

    def device_for(self, spec: PairSpec) -> str:
        return "cpu" if self.cpu_for_cpu_pairs and not spec.needs_gpu else self.device

    def is_loaded(self, spec: PairSpec) -> bool:
        return spec.id in self._pairs

    def get(self, spec: PairSpec, progress=None) -> LoadedPair:
        """The loaded pair; `progress` sees Hub downloads (`dflash_core.models.hub.DownloadProgress`)."""
        # A loaded pair is returned without the lock: ZeroGPU forks its GPU worker from whatever
        # thread calls first, and a lock held by another thread at the fork stays held in the child.
        loaded = self._pairs.get(spec.id)
        if loaded is not None:
            return loaded
        with self._lock:  # two sessions clicking at once must not load the weights twice
            if spec.id in self._pairs:
                return self._pairs[spec.id]
            reason = availability(spec, self.device_for(spec))
            if reason:
                raise PairUnavailable(reason)
            t0 = time.perf_counter()
            device = self.device_for(spec)
            self.freed = []
            target, drafter = _target_location(spec), spec.drafter_location()
            itemsize = parse_dtype(spec.dtype, device).itemsize
            on_device = device == self.device  # a pair moved to the CPU takes no device memory
            # Before any download: a GPU too small for the pair is told apart from a broken pair.
            size = pair_size(target, drafter, itemsize, self.hub_api)
            if progress:
                progress(LoadNote(size.describe()))
            self.check_fits(size, spec, on_device)
            target_dir = fetch_target(target, progress)
            drafter_dir = resolve_model_dir(drafter, ("config.json", "model.safetensors"), progress=progress)
            if size.need is None:  # the Hub could not say: the downloaded files can
                size = pair_size(target_dir, str(drafter_dir), itemsize)
                self.check_fits(size, spec, on_device)
            key = (str(target_dir), device, parse_dtype(spec.dtype, device))
            shared = self._targets.get(key)
            if on_device:  # beside a loaded copy of its target, a pair needs room for its drafter only
                drafter_need = int((size.drafter.bytes or 0) * (1 + MARGIN))
                self.make_room(drafter_need if shared is not None else size.need or 0)
                shared = self._targets.get(key)  # None once the loaded pairs were freed to make room
            if shared is not None:  # another pair holds this target at these numerics: one copy serves both
                shared_target = Target(shared.model, shared.tokenizer)
                pair = ModelPair(shared_target, load_drafter(shared_target, str(drafter_dir),
                                                             default_drafter_dtype(device, shared.dtype)))
            else:
                pair = load_pair(target_dir, str(drafter_dir), device=device, dtype=spec.dtype)
                self._targets[key] = pair.target
            if pair.tokenizer is None:
                raise PairUnavailable(f"the target {spec.target!r} has no tokenizer, so the app cannot encode prompts")
            plain = Target(pair.target.model, pair.target.tokenizer)
            args = template_args(pair.tokenizer, None, spec.chat_template_args)
            lane_drafters = {}
            for lane, name in spec.lane_drafters().items():
                if spec.lane_missing(lane):  # said in the status line; the pair races without the lane
                    continue
                lane_dir = resolve_model_dir(spec.location(name), ("config.json", "model.safetensors"), progress=progress)
                lane_drafters[lane] = load_lane_drafter(pair.target, lane, str(lane_dir), pair.drafter.dtype)
            loaded = LoadedPair(pair.target, pair.drafter, spec, plain, time.perf_counter() - t0, args, size,
                                lane_drafters=lane_drafters)
            if self.warm_up or device == "cpu":
                _warm_up(loaded)
            if self.compile_gemms and device == "cpu":
                try:
                    if why := loaded.target.steps_refusal():
                        raise ConfigError(why)
                    loaded.compiled = CompiledLanes(loaded.target, loaded.drafter, gemms=self.compile_gemms)
                    loaded.compiled.start(loaded.lock, loaded.races_waiting)
                except ConfigError as exc:  # e.g. template GEMMs for a batch-invariant target
                    loaded.eager_only = str(exc)
            self._pairs[spec.id] = loaded
            return loaded

    def load_in_background(self, spec: PairSpec, log=functools.partial(print, flush=True)) -> threading.Thread:
        """Load `spec` on a daemon thread, so that the first visitor finds it ready and, on a CPU, its
        lanes compiled or compiling; a visitor who comes sooner waits for this load, not a second one.
        A failure is logged, and a visitor's own load then reports it."""

        def work():
            try:
                pair = self.get(spec)
            except Exception as exc:  # noqa: BLE001 - logged; the app serves on, and says why when asked
                log(f"DFlash Studio: {spec.label} did not load at start-up: {exc}")
                return
            steps = (", its lanes compiling in the background" if pair.compiled is not None
                     else f", its lanes on eager steps: {pair.eager_only}" if pair.eager_only else "")
            log(f"DFlash Studio: {spec.label} loaded in {pair.load_s:.1f} s{steps}")

        thread = threading.Thread(target=work, name=f"load {spec.id}", daemon=True)
        thread.start()
        return thread

    def check_fits(self, size: PairSize, spec: PairSpec, on_device: bool) -> None:
        """Refuse (`DoesNotFitError`) a pair that cannot fit even once the loaded pairs are freed."""
        memory = self.memory() if on_device else None
        if memory is None:
            return
        held = sum(p.size.weights or 0 for p in self._pairs.values() if p.size and self.device_for(p.spec) == self.device)
        check_fits(size, spec.label, self.device, *memory, reclaimable=held)

    def make_room(self, need: int) -> None:
        """Free every loaded pair unless free device memory holds `need` bytes (weights and margin)."""
        self.freed = []
        memory = self.memory()
        if memory is None or not self._pairs or memory[0] >= need:
            return
        self.freed = [p.spec.label for p in self._pairs.values()]
        self._pairs.clear()
        self._targets.clear()
        gc.collect()  # the pairs' tensors go when their last reference does
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
