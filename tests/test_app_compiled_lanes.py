"""The app's lanes on compiled steps (`app/pairs/compiled.py`): compiled in the background, the
default race's steps first, a race running them only when every step of every lane is compiled,
and then decoding token for token and cycle for cycle as the eager lanes do; the status line and
the race's note say which steps ran, and why a race stayed eager."""

from __future__ import annotations

import html
import itertools
import threading

import pytest
import torch
from tiny import build_drafter
from torch._dynamo.utils import counters

from app.pairs import compiled as compiled_module
from app.pairs.compiled import COMPILED_LANES, MORE_TREES, CompiledLanes, Step, needed, plan
from app.pairs.models import PairCache
from app.pairs.registry import cli_pair
from app.race.lanes import MAX_TREE_BUDGET, TREE_BUDGET
from app.ui import App
from app.view import texts
from app.view.frames import FRAME_FIELDS
from dflash_core import schedule
from dflash_core.trace import validate_trace


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo keeps a bounded number of compiled versions per function for the whole process (the
    suite's earlier compiles count): each test here compiles from none."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def unsaved_steps(monkeypatch):
    """The lanes compile without saving their steps: saving and loading them is
    tests/test_saved_steps.py's (every kind of step the lanes take), and a saved step's compile
    skips inductor's code cache, which would double this module's minutes."""
    monkeypatch.setattr(compiled_module, "compiled_steps_folder", lambda: None)


PROMPT = "What is the capital of France? Paris is the capital of France. What is"
BLOCK = 4
NEW = 20


@pytest.mark.parametrize("trained", [1, 4, 16])
def test_the_plan_holds_every_step_of_every_race_once_the_default_races_first(trained):
    steps = plan(trained)
    assert len(steps) == len(set(steps))
    races = [needed(lanes, block, trained) for block in range(1, trained + 1)
             for n in range(1, len(COMPILED_LANES) + 1) for lanes in itertools.combinations(COMPILED_LANES, n)]
    assert set(steps) == set().union(*races)
    default = needed(("dflash", "plain"), trained, trained)
    assert set(steps[:len(default)]) == default
    if trained > 1:
        assert Step("dflash", trained, draft=True) in default and Step("plain", 1) in default
        assert steps[len(default)] == Step("scheduled", trained, draft=True, schedule=True)  # a basic lane next
    trees = [step for step in steps if step.lane == "tree"]
    assert trees == [Step("tree", block, draft=True, tree=TREE_BUDGET) for block in range(trained, 1, -1)]
    assert steps[len(steps) - len(trees):] == trees  # the research lane's steps come last
    assert "tree" not in {step.lane for step in plan(trained, ("dflash", "plain", "lookup"))}


def test_a_race_needs_the_steps_its_lanes_take():
    assert needed(("dflash", "plain"), 4, 4) == {Step("dflash", 4, draft=True), Step("plain", 1)}
    assert needed(("lookup",), 3, 4) == {Step("lookup", 1), Step("lookup", 2), Step("lookup", 3)}
    assert needed(("dflash", "lookup"), 1, 4) == {Step("dflash", 1), Step("lookup", 1)}
    assert needed(("tree", "plain"), 3, 4) == {Step("tree", 3, draft=True, tree=TREE_BUDGET), Step("plain", 1)}
    assert needed(("tree",), 4, 4, tree_budget=7) == {Step("tree", 4, draft=True, tree=7)}
    assert needed(("tree",), 1, 4) == set()  # refused before it races: a tree grows below slot 0
    # The scheduled lane races at the trained block, whatever the race's.
    assert needed(("scheduled",), 2, 4) == needed(("scheduled",), 4, 4) == {Step("scheduled", 4, draft=True, schedule=True)}


@pytest.fixture(scope="module")
def pair_dirs(tiny_dirs, tmp_path_factory):
    """The tiny target and a block-4 drafter that drafts only the target's three most frequent
    tokens on the prompt (it keeps some drafts, so its features matter)."""
    from collections import Counter

    from dflash_core import Target, run
    from dflash_core.loading.prompting import encode_prompt

    target_dir = tiny_dirs[0]
    target = Target.from_pretrained(target_dir)
    plain = run(target, encode_prompt(target.tokenizer, PROMPT), None, max_new_tokens=NEW).output_ids
    vocab = [token for token, _ in Counter(plain).most_common(3)]
    drafter = build_drafter(tmp_path_factory.mktemp("compiled-lanes") / "drafter", target_dir, draft_vocab=vocab,
                            block_size=BLOCK)
    return target_dir, drafter


def race(app, lanes, block=BLOCK, tree_budget=None) -> dict:
    """Every output as the page shows it at the end."""
    shown = {}
    for frame in app.live.compare(PROMPT, NEW, block, 0.0, 1.0, 0, lanes, tree_budget=tree_budget):
        shown.update((name, value) for name, value in zip(FRAME_FIELDS, frame) if isinstance(value, (str, dict)))
    return shown


def trace_runs(shown) -> dict:
    """The race's runs, from its trace."""
    return validate_trace(shown["trace_file"])["runs"]


def cycles(shown) -> dict:
    """Each lane's tokens and acceptance lengths, from the race's trace."""
    return {name: (run["output_ids"], [block["accepted"] for block in run["blocks"]])
            for name, run in trace_runs(shown).items()}


def test_compiled_lanes_race_as_the_eager_ones_and_say_so(pair_dirs, one_thread):
    spec = cli_pair(*map(str, pair_dirs))
    eager_app = App([spec], spec.id, PairCache("cpu"))
    app = App([spec], spec.id, PairCache("cpu", compile_gemms="library"))
    lanes = ["lookup"]
    pair = app.loading.cache.get(spec)
    compiled = pair.compiled
    assert isinstance(compiled, CompiledLanes)
    assert compiled.wait(600)
    assert compiled.failed is None and compiled.finished, compiled.status()
    assert compiled.status().startswith("compiled (in ")
    status = app.loading.compile_status(spec.id, "default")
    # Right after "ready": the status box shows four lines, and the pair's details follow.
    assert status[0].startswith(f"✓ **{spec.label}** ready on cpu. Lane steps: compiled (in "), status[0]

    graphs = counters["stats"]["unique_graphs"]
    frames = [dict(zip(FRAME_FIELDS, frame)) for frame in app.live.compare(PROMPT, NEW, BLOCK, 0.0, 1.0, 0, lanes)]
    assert any(texts.STEPS_RUNNING.format(steps="compiled steps") in str(frame["summary"]) for frame in frames)
    shown = race(app, lanes)
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled during the race: all of it before
    assert texts.STEPS.format(steps="compiled steps") in shown["summary"]
    report = shown["report"]["lanes"]
    assert report["dflash"]["identical"] is True and report["lookup"]["identical"] is True
    eager = race(eager_app, lanes)
    assert texts.STEPS.format(steps="eager steps") in eager["summary"]
    shown_cycles = cycles(shown)  # read now: the app keeps only a session's newest trace files
    assert shown_cycles == cycles(eager)  # the same tokens, and the same drafts kept in every cycle
    assert any(accepted for _, kept in shown_cycles.values() for accepted in kept)

    # The tree lane races compiled beside DFlash, each on a drafter of its own, as its eager twin does.
    graphs = counters["stats"]["unique_graphs"]
    tree = race(app, ["tree"])
    assert counters["stats"]["unique_graphs"] == graphs
    assert texts.STEPS.format(steps="compiled steps") in tree["summary"]
    assert tree["report"]["lanes"]["tree"]["identical"] is True
    eager_tree = race(eager_app, ["tree"])
    assert cycles(tree) == cycles(eager_tree) and cycles(tree)["dflash"] == shown_cycles["dflash"]
    assert [b["tree"]["path"] for b in trace_runs(tree)["tree"]["blocks"]] == [
        b["tree"]["path"] for b in trace_runs(eager_tree)["tree"]["blocks"]]

    # A tree of another size is a step of its own: the first race asking for it runs every lane
    # eagerly and says why, the thread compiles it after, and the races after it run compiled.
    other = race(app, ["tree"], tree_budget=MAX_TREE_BUDGET)
    assert html.escape(texts.STEPS.format(
        steps=f"eager steps (the tree lane's draft step at block {BLOCK} and its tree of {MAX_TREE_BUDGET} drafts "
              "compiles after this race, for the races after it)")) in other["summary"]
    eager_cycles = cycles(other)  # read now: the app keeps only a session's newest trace files
    assert compiled.wait(600) and compiled.failed is None and compiled.status().startswith("compiled (in ")
    graphs = counters["stats"]["unique_graphs"]
    again = race(app, ["tree"], tree_budget=MAX_TREE_BUDGET)
    assert counters["stats"]["unique_graphs"] == graphs
    assert texts.STEPS.format(steps="compiled steps") in again["summary"]
    assert cycles(again) == eager_cycles and again["report"]["lanes"]["tree"]["identical"] is True
    assert max(len(b["tree"]["tokens"]) for b in trace_runs(again)["tree"]["blocks"]) == MAX_TREE_BUDGET + 1
    # The scheduled lane races compiled on the cost profile measured on its compiled target.
    measured = dict(schedule._MEASURED[compiled.targets["scheduled"]])
    assert [key[0] for key in measured] == [BLOCK]  # measured once, while compiling: verifies of 1 to 4 tokens
    scheduled = race(app, ["scheduled"])
    assert counters["stats"]["unique_graphs"] == graphs and schedule._MEASURED[compiled.targets["scheduled"]] == measured
    assert texts.STEPS.format(steps="compiled steps") in scheduled["summary"]
    assert scheduled["report"]["lanes"]["scheduled"]["identical"] is True
    assert cycles(scheduled)["dflash"] == shown_cycles["dflash"]




def test_a_race_stays_eager_until_its_steps_are_compiled_or_when_too_long(pair_dirs):
    from dflash_core import DFlashDrafter, Target

    target, drafter = Target.from_pretrained(pair_dirs[0]), DFlashDrafter.from_pretrained(pair_dirs[1])
    compiled = CompiledLanes(target, drafter, positions=64 + MAX_TREE_BUDGET + 1)  # the largest tree: the longest verify
    assert all(target.graphs.backend.saved is None for target in compiled.targets.values())  # unsaved_steps
    assert compiled.status() == f"compiling 0/{len(compiled.steps)}"
    assert compiled.lanes_for(("dflash", "plain"), BLOCK, 40) == (None, f"eager steps (compiling 0/{len(compiled.steps)})")
    compiled.done.update(needed(("dflash", "plain"), BLOCK, BLOCK))
    assert compiled.status() == (f"compiling 2/{len(compiled.steps)}; DFlash at block {BLOCK} and plain decoding run "
                                 "compiled already")
    targets, steps = compiled.lanes_for(("dflash", "plain"), BLOCK, 40)
    assert steps == "compiled steps" and set(targets) == {"dflash", "plain"}
    assert targets["dflash"] is not targets["plain"] and targets["dflash"].graphs is not None
    assert compiled.lanes_for(("dflash", "plain"), BLOCK, 65) == (
        None, "eager steps (65 positions, past the 64 the compiled steps hold)")
    assert compiled.lanes_for(("dflash", "plain", "lookup"), BLOCK, 40)[0] is None  # lookup's steps are not done
    assert compiled.lanes_for(("dflash", "fusion", "ar"), BLOCK, 40) == (
        None, "eager steps (the input fusion and AR drafter lanes run them only)")


def test_the_lanes_save_their_steps_in_the_projects_folder(pair_dirs, tmp_path, monkeypatch):
    from dflash_core import DFlashDrafter, Target

    monkeypatch.setattr(compiled_module, "compiled_steps_folder", lambda: tmp_path / "project")
    target, drafter = Target.from_pretrained(pair_dirs[0]), DFlashDrafter.from_pretrained(pair_dirs[1])
    for lanes, folder in ((CompiledLanes(target, drafter), tmp_path / "project"),
                          (CompiledLanes(target, drafter, steps_folder=tmp_path / "given"), tmp_path / "given")):
        assert {target.graphs.backend.saved.root for target in lanes.targets.values()} == {folder}


@pytest.mark.parametrize("why", ["target", "drafter"])
def test_a_pair_that_cannot_verify_trees_compiles_no_tree_lane(pair_dirs, tmp_path, monkeypatch, why):
    """Where the target refuses trees (a sliding window, a recurrent state) or the drafter cannot
    grow them (DFlash2 picks each slot after the one before), the pair has no tree lane: nothing of
    it is planned or held, and its caches leave room for a block only."""
    from tiny import build_dflash2_drafter

    from dflash_core import DFlashDrafter, Target, tree_refusal

    target = Target.from_pretrained(pair_dirs[0])
    if why == "target":
        monkeypatch.setattr(Target, "tree_refusal", lambda self: "a sliding window")
        drafter = DFlashDrafter.from_pretrained(pair_dirs[1])
        assert tree_refusal(target, drafter) == "a sliding window"
    else:
        drafter = DFlashDrafter.from_pretrained(build_dflash2_drafter(tmp_path / "dflash2", pair_dirs[0], block_size=BLOCK))
        assert "dflash2 drafting has no form of" in tree_refusal(target, drafter)
    compiled = CompiledLanes(target, drafter, positions=64 + BLOCK)
    assert "tree" not in compiled.targets and not [step for step in compiled.steps if step.lane == "tree"]
    assert compiled.positions == 64 and set(compiled.targets) == {"dflash", "plain", "lookup", "scheduled"}
    assert compiled.lanes_for(("tree",), BLOCK, 40) == (None, "eager steps (the DFlash, tree lane runs them only)")


def test_tree_sizes_compile_on_request_up_to_their_bound(pair_dirs):
    """Each tree budget a race asks for joins the steps to compile, after those queued before it;
    past MORE_TREES sizes besides the default, a race at another size stays eager and says why."""
    from dflash_core import DFlashDrafter, Target

    target, drafter = Target.from_pretrained(pair_dirs[0]), DFlashDrafter.from_pretrained(pair_dirs[1])
    compiled = CompiledLanes(target, drafter)  # not started: nothing compiles here
    planned = list(compiled.steps)
    sizes = [TREE_BUDGET + 1 + n for n in range(MORE_TREES)]
    for size in sizes:
        assert compiled.lanes_for(("tree",), BLOCK, 40, size)[1].endswith("compiles after this race, for the races after it)")
        assert compiled.lanes_for(("tree",), BLOCK, 40, size)[0] is None  # asked again: queued once
    assert compiled.steps == planned + [Step("tree", BLOCK, draft=True, tree=size) for size in sizes]
    assert compiled.lanes_for(("tree",), BLOCK - 1, 40, sizes[0])[0] is None  # a known size at another block
    assert compiled.steps[-1] == Step("tree", BLOCK - 1, draft=True, tree=sizes[0])
    assert compiled.lanes_for(("tree",), BLOCK, 40, MAX_TREE_BUDGET) == (None, (
        f"eager steps (the tree lane's draft step at block {BLOCK} and its tree of {MAX_TREE_BUDGET} drafts is not "
        f"compiled: the app compiles trees of {TREE_BUDGET} drafts and of {MORE_TREES} other sizes at most, "
        f"{', '.join(map(str, sizes))} on this server)"))


def test_compiling_stops_at_its_bound_and_says_what_compiled(pair_dirs):
    import threading

    from dflash_core import DFlashDrafter, Target

    target, drafter = Target.from_pretrained(pair_dirs[0]), DFlashDrafter.from_pretrained(pair_dirs[1])
    compiled = CompiledLanes(target, drafter, budget_s=0)
    compiled.start(threading.Lock())
    assert compiled.wait(600)  # the first step starts at once; the bound stops the second
    assert compiled.done == {compiled.steps[0]} and compiled.finished
    assert compiled.status() == (f"1/{len(compiled.steps)} compiled, the others eager: compiling stopped at its "
                                 "bound of 0 minutes")
    assert compiled.lanes_for(("plain",), BLOCK, 40)[1] == "compiled steps"
    assert compiled.lanes_for(("dflash", "plain"), BLOCK, 40)[0] is None


def test_a_target_compiled_steps_cannot_run_loads_with_eager_lanes_and_the_status_line_says_why(pair_dirs, monkeypatch):
    """A target whose attention compiled steps cannot run (`Target.steps_refusal`) loads all the
    same, its lanes eager, and the page and the race say why."""
    from dflash_core import Target

    why = "they need sdpa or eager attention, and this model uses flex_attention"
    monkeypatch.setattr(Target, "steps_refusal", lambda self: why)
    spec = cli_pair(*map(str, pair_dirs))
    app = App([spec], spec.id, PairCache("cpu", compile_gemms="library"))
    pair = app.loading.cache.get(spec)
    assert pair.compiled is None and pair.eager_only == why
    assert texts.LANE_STEPS.format(status=f"eager, since {why}") in app.loading._ready(pair, "cpu", None)
    shown = race(app, ["lookup"])
    assert texts.STEPS.format(steps=f"eager steps ({why})") in shown["summary"]
    report = shown["report"]["lanes"]
    assert report["dflash"]["identical"] is True and report["lookup"]["identical"] is True


def test_template_gemms_leave_a_batch_invariant_targets_lanes_eager_and_say_why(pair_dirs, one_thread):
    """A bf16 CPU target verifies batch-invariantly, and its compiled steps take library GEMMs only:
    asked for template GEMMs, the app loads the pair with eager lanes and says why."""
    spec = cli_pair(*map(str, pair_dirs), dtype="bfloat16")
    pair = PairCache("cpu", compile_gemms="template").get(spec)
    assert pair.compiled is None
    assert pair.eager_only.startswith("a batch-invariant target compiles with library GEMMs")


def test_a_race_waiting_for_a_compiling_step_says_so_and_stop_ends_the_wait(pair_dirs):
    from types import SimpleNamespace

    spec = cli_pair(*map(str, pair_dirs))
    app = App([spec], spec.id, PairCache("cpu"))
    pair = app.loading.cache.get(spec)
    pair.compiled = CompiledLanes(pair.target, pair.drafter)  # never started: its steps stay eager
    step = Step("dflash", BLOCK, draft=True)
    waiting = html.escape(texts.RACE_WAITING_STEP.format(step=step.describe()))

    def compiling():  # what the compile thread does while it compiles `step`
        pair.lock.acquire()
        pair.compiled.current = step

    def done():
        pair.compiled.current = None
        pair.lock.release()

    compiling()
    frames = app.live.compare(PROMPT, NEW, BLOCK, 0.0, 1.0, 0, [])
    try:
        summaries = [dict(zip(FRAME_FIELDS, next(frames)))["summary"] for _ in range(3)]
        assert any(waiting in str(s) for s in summaries), summaries
    finally:
        done()
    shown = {}
    for frame in frames:  # the step done, the race runs as any other
        shown.update((name, value) for name, value in zip(FRAME_FIELDS, frame) if isinstance(value, (str, dict)))
    assert shown["report"]["identical"] is True and waiting not in shown["summary"]

    # Stop while waiting, whatever holds the pair: the race ends at once, having raced nothing.
    visitor = SimpleNamespace(session_hash="waiting-visitor")
    pair.lock.acquire()
    try:
        frames = app.live.compare(PROMPT, NEW, BLOCK, 0.0, 1.0, 0, [], request=visitor)
        summaries = [dict(zip(FRAME_FIELDS, next(frames)))["summary"] for _ in range(3)]
        assert any(html.escape(texts.RACE_WAITING) in str(s) for s in summaries), summaries
        stopping = threading.Thread(target=app.live.stop, args=(visitor,))  # the Stop button, another worker
        stopping.start()
        rest = [dict(zip(FRAME_FIELDS, frame))["summary"] for frame in frames]
        stopping.join()
    finally:
        pair.lock.release()
    assert html.escape(texts.STOPPED_WAITING) in str(rest[-1]) and not pair.lock.locked()


def test_the_compile_thread_lets_a_waiting_race_have_the_pair_before_its_next_step(pair_dirs):
    import time

    from dflash_core import DFlashDrafter, Target

    target, drafter = Target.from_pretrained(pair_dirs[0]), DFlashDrafter.from_pretrained(pair_dirs[1])
    compiled = CompiledLanes(target, drafter, positions=64 + MAX_TREE_BUDGET + 1)
    order, waiting = [], []

    def compile(step):  # a step that takes a while, holding the pair's lock
        order.append(step)
        time.sleep(0.2)

    compiled.compile = compile
    lock = threading.Lock()
    compiled.start(lock, lambda: bool(waiting))
    while not order:
        time.sleep(0.01)
    waiting.append("a race")  # what `LoadedPair.queued` counts
    with lock:  # the race: it has the pair once the step in progress is done, before the next one
        order.append("race")
        waiting.clear()
    assert compiled.wait(60) and compiled.failed is None, compiled.status()
    assert order.index("race") == 1 and len(order) == len(compiled.steps) + 1


def test_a_race_that_waited_for_the_pair_takes_the_steps_compiled_meanwhile(pair_dirs):
    from app.guard.limits import Limits, check_request
    from app.race.session import RaceSession

    spec = cli_pair(*map(str, pair_dirs))
    pair = PairCache("cpu").get(spec)
    pair.compiled = CompiledLanes(pair.target, pair.drafter)  # never started
    req = check_request(Limits(), spec.id, PROMPT, NEW, BLOCK, 0.0, 1.0, 0, [], None, None)
    pair.lock.acquire()  # the compile thread, compiling the default race's last step
    session = RaceSession(pair, "cpu", req, pair.encode(PROMPT))
    assert session.steps.startswith("eager steps (compiling 0/")
    snapshots = session.snapshots()
    try:
        assert next(snapshots).idle and session.waiting == ""
        pair.compiled.done.update(needed(("dflash", "plain"), BLOCK, BLOCK))  # ... and done
        pair.lock.release()
        next(snapshots)  # the race has the pair now
        assert session.steps == "compiled steps" and session.waiting is None
        assert session.lanes["dflash"].target is pair.compiled.targets["dflash"]
    finally:
        snapshots.close()  # not raced: the compiled targets' steps were never compiled
    assert not pair.lock.locked()
