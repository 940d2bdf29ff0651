"""A loaded pair's lanes on compiled steps, compiled in the background while races run eagerly.

Each lane that can run compiled (DFlash, plain decoding, prompt lookup, DFlash with the block
schedule, DFlash verifying trees) gets a target of its own with static caches and compiled steps
(`dflash_core.precompile`); the lanes that draft each draft with a twin of the pair's drafter that
holds its own static cache. A thread compiles the steps those lanes take, the default race's first
(the one-token step, then the draft and verify steps at the trained block size), then the scheduled
lane's (which also measure its cost profile on its compiled target), and the tree lane's last,
each on its lane's target while it holds the pair's lock; a step that traces the graph another
lane's target compiled reuses that code. The tree lane's steps are planned at the app's default
tree budget (`TREE_BUDGET`); a tree of another size is a step of its own, which the thread compiles
after the plan when a race first asks for it (that race runs eagerly), for up to `MORE_TREES` sizes
besides the default. The scheduled
lane drafts fewer slots than its block with the eager draft step (the engine compiles a whole
block's). A race runs compiled only when every step each of its lanes takes is compiled, otherwise
all its lanes run the eager steps: a race never compares a compiled lane with an eager one, and no
lane changes path within a race. The drafter lanes (DFlash2, input fusion, AR) run eagerly.

Costs: the compiled steps use the same weights (`library` GEMMs: no packed copy per shape), and
each lane's static KV caches hold `positions` tokens whatever a race's length. Each compiled step is
saved under the project's cache folder (`dflash_core.speed.saved_steps`), so a second launch loads
the lanes' steps instead of tracing them again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from dflash_core import Target, compile_draft, compile_schedule, compile_verify, size_caches, tree_refusal
from dflash_core.loading import compiled_steps_folder

from ..race.lanes import LABELS, MAX_TREE_BUDGET, TREE_BUDGET

COMPILED_LANES = ("dflash", "plain", "lookup", "scheduled", "tree")
# The compiled lanes that draft, each with a drafter twin of its own: they race side by side.
DRAFTING_LANES = ("dflash", "scheduled", "tree")
# Positions the compiled lanes' static KV caches hold: a race of up to this many less the longest
# verify (a block, or the largest tree's nodes; prompt and new tokens) runs compiled. The target's
# and the drafter's attention skip the unused ones (the masked-attention kernel), so the capacity
# costs memory, not speed (docs/benchmarks.md, "Compiled lanes in the app").
POSITIONS = 1024
# `library`: the linears stay the engine's (the CPU rows kernel and oneDNN's packed weights), so a
# compiled step holds no copy of the weights and compiles in seconds. `template` runs faster steps,
# but each compiled shape packs its own copy of the target's weights and takes minutes to compile,
# and a second launch still repacks them (docs/benchmarks.md, "Compiled lanes in the app").
GEMMS = "library"
# A loaded machine can take many minutes per step (template GEMMs: more): past this, compiling stops.
BUDGET_S = 30 * 60
# Tree budgets compiled on a race's request besides the default, per pair: compiling one holds the
# pair's lock for seconds, during which every visitor's race of the pair waits.
MORE_TREES = 3
YIELD_POLL_S = 0.05  # how often the compile thread looks whether the races waiting have the pair's lock


@dataclass(frozen=True)
class Step:
    """A step to compile on `lane`'s target: the verify step of `length` tokens, or with `draft`, the
    drafter's draft step at block size `length` and the verify step DFlash takes with it: a chain's,
    with `tree` the verify of a tree of that many drafts, with `schedule` the verifies of 1 to
    `length` tokens and the schedule's cost profile."""

    lane: str
    length: int
    draft: bool = False
    tree: int = 0
    schedule: bool = False

    def describe(self) -> str:
        if self.schedule:
            return f"{self.lane} lane's draft step at block {self.length} and its verify steps of 1 to {self.length} tokens"
        if self.tree:
            return f"{self.lane} lane's draft step at block {self.length} and its tree of {self.tree} drafts"
        if self.draft:
            return f"{self.lane} lane's draft and verify steps at block {self.length}"
        return f"{self.lane} lane's verify step of {self.length} token{'s' if self.length > 1 else ''}"


def needed(lanes, block_size: int, trained: int, tree_budget: int = TREE_BUDGET) -> set[Step]:
    """The steps a race of `lanes` at `block_size` takes, its scheduled lane at the drafter's
    `trained` block, its tree lane verifying trees of `tree_budget` drafts (a block of one slot grows
    no tree: such a race is refused)."""
    steps = set()
    for lane in lanes:
        if lane == "scheduled":
            steps.update([Step(lane, trained, draft=True, schedule=True)] if trained > 1 else [])
        elif lane == "tree":
            steps.update([Step(lane, block_size, draft=True, tree=tree_budget)] if block_size > 1 else [])
        elif lane == "plain" or block_size == 1:
            steps.add(Step(lane, 1))
        elif lane == "dflash":
            steps.add(Step(lane, block_size, draft=True))
        elif lane == "lookup":  # it verifies the prefix of its block that it found in the context
            steps.update(Step(lane, n) for n in range(1, block_size + 1))
    return steps


def plan(trained: int, lanes=COMPILED_LANES) -> list[Step]:
    """Every step of races of `lanes` at block sizes 1 to `trained` (trees at the default budget;
    others join on request, `CompiledLanes.want`): the default race's (DFlash at the trained block
    size against plain decoding) first, then the scheduled lane's (a basic lane), the tree lane's (a
    research lane) last."""
    first = sorted(needed(("plain", "dflash"), trained, trained), key=lambda step: step.draft)
    rest = {step for block in range(trained, 0, -1) for step in needed(lanes, block, trained)} - set(first)
    return first + sorted(rest, key=lambda step: (step.lane == "tree", step.lane != "scheduled", step.lane != "lookup",
                                                   -step.length if step.draft else step.length))


class _Stopped(Exception):
    """Compiling stops, for the reason given (the status line says it)."""


class CompiledLanes:
    """The compiled targets of a pair's lanes and the thread that compiles their steps."""

    def __init__(self, target: Target, drafter, positions: int = POSITIONS, gemms: str = GEMMS,
                 budget_s: float = BUDGET_S, steps_folder=None):
        """positions: what the static caches hold, at most the target's context; races of up to that
        less the longest verify (the drafter's block, or the default tree's nodes; prompt and new
        tokens) run compiled. budget_s: no step but the first starts to compile after this many
        seconds; races that need the steps left run eagerly. steps_folder: where the compiled steps
        are saved and a later launch loads them (None: the project's, `compiled_steps_folder`)."""
        # No tree lane where the pair cannot verify trees (`LoadedPair.lanes`), nor for a drafter of one slot.
        trees = drafter.block_size > 1 and tree_refusal(target, drafter) is None
        lanes = [lane for lane in COMPILED_LANES if lane != "tree" or trees]
        context = getattr(target.model.config, "max_position_embeddings", None) or positions
        # The tree lane's caches hold the largest tree the slider offers: each budget compiles at one capacity.
        self.positions = min(positions, context) - max(drafter.block_size, MAX_TREE_BUDGET + 1 if trees else 0)
        self.gemms, self.budget_s = gemms, budget_s
        self.steps_folder = steps_folder or compiled_steps_folder()
        # Twins of the pair's drafter: the eager lanes' keeps its static cache, and the compiled lanes
        # that draft, which race side by side, each draft from caches of their own.
        self.drafters = {lane: drafter.with_own_cache() for lane in DRAFTING_LANES}
        self.block_size = drafter.block_size
        self.targets = {lane: self._compiled(target, lane) for lane in lanes}
        self.steps = plan(drafter.block_size, lanes)
        self.done: set[Step] = set()
        self.current: Step | None = None  # the step compiling now, holding the pair's lock
        self.failed: str | None = None
        self.seconds = 0.0
        self._lock: threading.Lock | None = None  # the pair's, once started
        self._races_waiting = lambda: False
        self._queue = threading.Lock()  # guards `steps` and `_idle`
        self._idle = threading.Event()  # set while no thread compiles
        self._idle.set()

    def drafter_of(self, lane: str):
        """The drafter `lane` races on its compiled target (plain decoding and prompt lookup draft
        with none; their caches are sized as DFlash's)."""
        return self.drafters.get(lane, self.drafters["dflash"])

    def _compiled(self, target: Target, lane: str) -> Target:
        compiled = Target(target.model, target.tokenizer, static_cache=True, compiled=True, compile_gemms=self.gemms,
                          steps_folder=self.steps_folder)
        size_caches(compiled, self.drafter_of(lane), self.positions, MAX_TREE_BUDGET + 1 if lane == "tree" else None)
        return compiled

    def start(self, lock: threading.Lock, races_waiting=lambda: False) -> None:
        """Compile every step in a background thread, each while holding `lock`, the pair's: a step
        compiles on a lane's own target, and the targets over one model share its layers' feature
        taps, so no race of the pair may run meanwhile. Before each step the thread waits while
        `races_waiting()`: a visitor's race waits for one step at most, not for the whole plan."""
        with self._queue:
            if self._lock is None:
                self._lock, self._races_waiting = lock, races_waiting
                self._spawn()

    def want(self, steps: set[Step]) -> str | None:
        """Compile `steps`, trees of a budget the plan does not hold, after the steps before them
        (the thread runs again if it had finished); None, or why they will not compile."""
        with self._queue:
            sizes = {step.tree for step in self.steps} - {0, TREE_BUDGET}
            if len(sizes | {step.tree for step in steps}) > MORE_TREES:
                return (f"the app compiles trees of {TREE_BUDGET} drafts and of {MORE_TREES} other sizes at most, "
                        f"{', '.join(map(str, sorted(sizes)))} on this server")
            self.steps += sorted(steps - set(self.steps), key=lambda step: -step.length)
            if self._lock is not None and self._idle.is_set() and self.failed is None:
                self._spawn()
        return None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the thread has nothing left to compile (or compiling stopped); False on a timeout."""
        return self._idle.wait(timeout)

    def _spawn(self) -> None:  # the caller holds `_queue`
        self._idle.clear()
        threading.Thread(target=self._compile_all, name="compile-lanes", daemon=True).start()

    def _next(self) -> Step | None:
        """The next step to compile; None (and the thread ends) when all are done or compiling stopped."""
        with self._queue:
            step = next((step for step in self.steps if step not in self.done), None)
            if step is None or self.failed is not None:
                self._idle.set()
                return None
            return step

    def _compile_all(self) -> None:
        while (step := self._next()) is not None:
            while self._races_waiting():  # a Lock is not fair: this thread would take it back at once
                time.sleep(YIELD_POLL_S)
            began = time.perf_counter()
            try:
                if self.done and self.seconds > self.budget_s:
                    raise _Stopped(f"compiling stopped at its bound of {self.budget_s / 60:.0f} minutes")
                with self._lock:
                    self.current = step
                    try:
                        self.compile(step)
                    finally:
                        self.current = None
                if any(entry is None for entry in self.targets[step.lane].graphs.graphs.values()):
                    raise _Stopped(f"the {step.describe()} did not compile (its warning says why)")
            except _Stopped as exc:
                self.failed = str(exc)
            except Exception as exc:  # noqa: BLE001 - those races stay eager, and the status line says why
                self.failed = f"compiling the {step.describe()} failed ({type(exc).__name__}: {exc})"
            else:
                self.done.add(step)
            self.seconds += time.perf_counter() - began

    def compile(self, step: Step) -> None:
        """Compile `step` on its lane's target, with its lane's drafter (the caller holds the pair's lock)."""
        target, drafter = self.targets[step.lane], self.drafter_of(step.lane)
        if step.schedule:
            compile_schedule(target, drafter)
        elif step.draft:
            compile_draft(target, drafter, step.length, step.tree)
        else:
            compile_verify(target, step.length)

    @property
    def finished(self) -> bool:
        return self.failed is not None or len(self.done) == len(self.steps)

    def status(self) -> str:
        """`compiled`, `compiling k/n`, or what compiled and why the rest did not."""
        done, total = len(self.done), len(self.steps)
        if self.failed:
            return f"{done}/{total} compiled, the others eager: {self.failed}"
        if done == total:
            return f"compiled (in {self.seconds:.0f} s)"
        first = needed(("dflash", "plain"), self.block_size, self.block_size)
        ready = f"; DFlash at block {self.block_size} and plain decoding run compiled already" if (
            first <= self.done) else ""
        return f"compiling {done}/{total}{ready}"

    def lanes_for(self, lanes, block_size: int, positions: int,
                  tree_budget: int = TREE_BUDGET) -> tuple[dict | None, str]:
        """({lane: compiled target} and "compiled steps", or None and "eager steps" with why)."""
        if extra := [LABELS[lane] for lane in lanes if lane not in self.targets]:
            return None, f"eager steps (the {' and '.join(extra)} lane{'s run' if len(extra) > 1 else ' runs'} them only)"
        if positions > self.positions:
            return None, f"eager steps ({positions} positions, past the {self.positions} the compiled steps hold)"
        missing = needed(lanes, block_size, self.block_size, tree_budget) - self.done
        if unplanned := missing - set(self.steps):
            first = min(unplanned, key=Step.describe)
            if (refusal := self.want(unplanned)) is not None:
                return None, f"eager steps (the {first.describe()} is not compiled: {refusal})"
            return None, f"eager steps (the {first.describe()} compiles after this race, for the races after it)"
        if missing:
            return None, f"eager steps ({self.status()})"
        return {lane: self.targets[lane] for lane in lanes}, "compiled steps"
