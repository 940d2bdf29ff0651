"""The "DFlash, tree" lane: the pair's DFlash drafter verifying a draft tree each cycle
(`generate(..., tree_budget=B)`), raced through the app's handlers on the tiny pair.

At temperature 0 the lane decodes what plain decoding does at every budget; its trace records each
cycle's tree and replays it; a bad budget and a target that cannot verify trees are refused with the
reason, and the app keeps serving. "Inside a cycle" draws a tree lane's cycle as its tree: every node
by depth with its token and draft probability, the walk, the bonus, and a sibling's save.
"""

from __future__ import annotations

import html
import re
from collections import Counter

import pytest
from families import build_family_target
from tiny import build_dflash2_drafter, build_drafter

from app.pairs.models import PairCache
from app.pairs.registry import cli_pair
from app.race.lanes import MAX_TREE_BUDGET
from app.ui import App
from app.view.cycle_view import cycle_html
from app.view.frames import FRAME_FIELDS
from app.view.tips import why
from app.view.tree_view import chain_kept, tree_cycle_html
from dflash_core import Target, run
from dflash_core.events import Block, TreeCycle
from dflash_core.loading.prompting import encode_prompt
from dflash_core.speed.batch_invariant import MAX_BLOCK
from dflash_core.trace import validate_trace

PROMPT = "What is the capital of France? Paris is the capital of France. What is"
BLOCK = 8  # the tiny drafter's trained block: trees up to 7 deep
NEW = 24


@pytest.fixture(scope="module")
def app(tiny_dirs, tmp_path_factory, one_thread):
    """The tiny target with a drafter that proposes only the three tokens the target emits most on
    the prompt: its trees branch three ways and the target's walk keeps some drafts (a random
    drafter over the whole vocabulary keeps almost none)."""
    target_dir = tiny_dirs[0]
    target = Target.from_pretrained(target_dir)
    plain = run(target, encode_prompt(target.tokenizer, PROMPT), None, max_new_tokens=NEW).output_ids
    vocab = [token for token, _ in Counter(plain).most_common(3)]
    drafter_dir = build_drafter(tmp_path_factory.mktemp("tree") / "drafter", target_dir, draft_vocab=vocab)
    spec = cli_pair(str(target_dir), str(drafter_dir))
    return App([spec], spec.id, PairCache("cpu"))


def picked(answer) -> tuple[str, object]:
    """A cycle picker's cycle view and slider update (`stepping.look_at`: the follow checkbox, then
    the race's outputs)."""
    outputs = dict(zip(FRAME_FIELDS, answer[1:]))
    return outputs["cycle_view"], outputs["cycle_pick"]


def race(app, lanes, tree_budget=None, block=BLOCK, temperature=0.0) -> dict:
    """Every output as the page shows it at the end: the last value each frame set (a frame may keep one)."""
    shown = {}
    for frame in app.live.compare(PROMPT, NEW, block, temperature, 1.0, 0, lanes, tree_budget=tree_budget):
        shown.update((name, value) for name, value in zip(FRAME_FIELDS, frame)
                     if isinstance(value, (str, dict)) or hasattr(value, "to_plotly_json"))
    return shown


@pytest.fixture(scope="module")
def raced(app):
    return race(app, ["tree"], tree_budget=8)


@pytest.mark.parametrize("budget", [1, None, 16])
def test_the_tree_lane_decodes_as_plain_decoding_at_every_budget(app, budget):
    out = race(app, ["tree"], tree_budget=budget)
    report = out["report"]["lanes"]
    assert list(report) == ["dflash", "tree", "plain"]
    assert report["tree"]["identical"] is True and report["tree"]["lossless"] == "identical"
    assert report["tree"]["draft_passes_per_cycle"] == 1 and out["tree_tokens"].count('class="tok ') == NEW
    assert "DFlash, tree (block 8: 1 pass per cycle, a tree of its drafts verified in 1 target pass)" in out["tree_stats"]
    run = validate_trace(out["trace_file"])["runs"]["tree"]
    expected = 4 if budget is None else budget  # the slider's default: the best budget measured on this CPU
    assert run["tree_budget"] == expected and run["method"] == "dflash"
    assert all(1 <= len(b["tree"]["tokens"]) - 1 <= expected for b in run["blocks"])
    if budget == 16:  # a budget past the block's depth branches
        assert any(len(set(b["tree"]["depths"])) < len(b["tree"]["depths"]) for b in run["blocks"])


def test_the_trace_records_every_tree_and_a_replay_reads_them_back(raced):
    from app.serve.replay import load_trace

    trace = validate_trace(raced["trace_file"])
    run = trace["runs"]["tree"]
    assert run["output_ids"] == trace["runs"]["plain"]["output_ids"]
    for block in run["blocks"]:
        tree = block["tree"]
        assert block["draft_ids"] == [tree["tokens"][n] for n in tree["path"][1:]]
        assert block["verify_len"] == len(tree["tokens"])
    recording = load_trace(raced["trace_file"])
    assert recording.runs["tree"].tree_budget == 8
    assert [b.tree.path for b in recording.runs["tree"].blocks] == [tuple(b["tree"]["path"]) for b in run["blocks"]]
    replayed = cycle_html(recording.runs["tree"], recording.runs["plain"], 0, str, lane="tree")
    assert f"DFlash, tree lane · Cycle 1 of {len(run['blocks'])}" in replayed and '<svg class="tree"' in replayed


def test_the_speedup_model_leaves_the_tree_lane_out(raced):
    # Its curves model a chain of each block size; a tree's acceptance and verify cost are its budget's.
    names = [trace.name or "" for trace in raced["speedup_chart"].data]
    assert any(name.startswith("DFlash (") for name in names) and not any("tree" in name for name in names)


def test_the_strip_and_hover_name_the_tree(raced):
    trace = validate_trace(raced["trace_file"])
    blocks = trace["runs"]["tree"]["blocks"]
    first = blocks[0]
    label = f"#1 · tree of {len(first['tree']['tokens']) - 1} drafts: {first['accepted']} kept + 1 bonus"
    assert html.escape(label) in raced["tree_strip"]
    assert "no drafts: 1 bonus" not in raced["tree_strip"]  # a cycle that walked no draft still verified its tree


def test_a_bad_tree_budget_or_block_is_named_and_the_app_keeps_serving(app):
    for budget, message in [(0, "tree_budget must be between 1 and 32, got 0"),
                            (33, "tree_budget must be between 1 and 32, got 33"),
                            ("many", "tree_budget must be a number, got 'many'")]:
        with pytest.raises(Exception, match=message):
            race(app, ["tree"], tree_budget=budget)
    with pytest.raises(Exception, match="The tree lane grows its drafts below slot 0 of a block: it needs a block size of "
                                        "at least 2, got 1"):
        race(app, ["tree"], block=1)
    assert race(app, ["tree"], tree_budget=2)["report"]["lanes"]["tree"]["identical"] is True


def test_a_target_that_cannot_verify_trees_gets_the_engines_reason(tmp_path, one_thread):
    target_dir = build_family_target(tmp_path / "target", "gpt_oss")
    spec = cli_pair(str(target_dir), str(build_drafter(tmp_path / "drafter", target_dir, block_size=4)))
    app = App([spec], spec.id, PairCache("cpu"))
    assert "tree" not in app.cache.get(spec).lanes and "scheduled" in app.cache.get(spec).lanes
    with pytest.raises(Exception, match=rf"The tree lane cannot race {re.escape(spec.label)}: tree verification needs "
                                        "full attention in every layer"):
        list(app.live.compare("hi", 8, 4, 0.0, 1.0, 0, ["tree"]))
    *_, last = app.live.compare("hi", 8, 4, 0.0, 1.0, 0, [])
    assert dict(zip(FRAME_FIELDS, last))["report"]["identical"] is True  # the app keeps serving


def test_a_dflash2_pair_offers_no_tree_lane_and_a_request_for_one_is_named(tiny_dirs, tmp_path, one_thread):
    """A pair whose drafter is DFlash2 (each slot picked after the one before) has no per-slot top-k
    to grow a tree from: the lane is not offered, an API call asking for it gets the engine's reason."""
    spec = cli_pair(str(tiny_dirs[0]), str(build_dflash2_drafter(tmp_path / "drafter", tiny_dirs[0], block_size=4)))
    app = App([spec], spec.id, PairCache("cpu"))
    assert "tree" not in app.cache.get(spec).lanes
    with pytest.raises(Exception, match=rf"The tree lane cannot race {re.escape(spec.label)}: a tree grows from one "
                                        "pass's per-slot top-k, which dflash2 drafting has no form of"):
        list(app.live.compare("hi", 8, 4, 0.0, 1.0, 0, ["tree"]))
    *_, last = app.live.compare("hi", 8, 4, 0.0, 1.0, 0, [])
    assert dict(zip(FRAME_FIELDS, last))["report"]["identical"] is True  # the app keeps serving


def test_a_bf16_pair_races_the_largest_tree_the_slider_offers_as_plain_decoding(tiny_dirs, one_thread):
    """A bfloat16 target on a CPU keeps blocks bitwise one-token steps up to MAX_BLOCK rows: the
    slider's largest tree (33 nodes, past the chain's 16) is one of them."""
    spec = cli_pair(*map(str, tiny_dirs), dtype="bfloat16")
    app = App([spec], spec.id, PairCache("cpu"))
    *_, last = app.live.compare("hi", 8, 4, 0.0, 1.0, 0, ["tree"], tree_budget=MAX_TREE_BUDGET)
    assert dict(zip(FRAME_FIELDS, last))["report"]["lanes"]["tree"]["identical"] is True
    assert MAX_TREE_BUDGET + 1 <= MAX_BLOCK


def test_inside_a_cycle_draws_the_tree_lanes_cycle_from_its_real_tree(app):
    trace = validate_trace(race(app, ["tree"], tree_budget=8)["trace_file"])
    blocks = trace["runs"]["tree"]["blocks"]
    view, slider = picked(app.stepping.pick_lane("tree"))
    assert f"DFlash, tree lane · Cycle {len(blocks)} of {len(blocks)}" in view and slider["maximum"] == len(blocks)
    best = max(range(len(blocks)), key=lambda i: (blocks[i]["accepted"], len(blocks[i]["tree"]["tokens"])))
    view, _ = picked(app.stepping.pick_cycle(best + 1))
    block, tree = blocks[best], blocks[best]["tree"]
    nodes = len(tree["tokens"]) - 1
    assert f"Cycle {best + 1} of {len(blocks)}" in view and f"one pass of {nodes + 1} rows" in view
    # Every node has a box (the root and the bonus too), the walked ones filled, each with its token and q.
    assert view.count('<g class="node') == nodes + 2
    assert view.count('<g class="node walked"') == block["accepted"]
    titles = re.findall(r"<title>node (\d+) · depth (\d+) · draft (.*?) · drafter q = ([0-9.]+)", view)
    assert sorted(int(n) for n, *_ in titles) == list(range(1, nodes + 1))
    for node, depth, token, q in titles:
        assert int(depth) == tree["depths"][int(node)]
        assert html.unescape(token) == repr(trace["tokens"][str(tree["tokens"][int(node)])])
        assert float(q) == pytest.approx(tree["probs"][int(node)], abs=1e-3)
    bonus = trace["tokens"][str(tree["targets"][tree["path"][-1]])]
    assert html.escape(f"bonus {bonus!r}: the target's own token") in view
    assert f"it kept <b>{block['accepted']}</b> draft" in view
    # The hover box of the lane's tokens explains a tree cycle's tokens too.
    recorded = TreeCycle.from_dict(tree)
    assert block["accepted"] > 0, "no cycle kept a draft: the walk's highlight would not be tested"
    assert f"this cycle's tree of {nodes} drafts holds the target's own token" in why(_block(recorded, block["accepted"]), 1, str)


def _block(tree: TreeCycle, accepted: int) -> Block:
    drafts = tuple(tree.tokens[n] for n in tree.path[1:])
    return Block(index=0, position=10, draft_ids=drafts, accepted=accepted, bonus_id=tree.bonus_id,
                 committed_ids=(*drafts, tree.bonus_id), draft_s=0.01, verify_s=0.02, elapsed_s=0.05, draft_passes=1,
                 verify_len=len(tree.tokens), tree=tree)


class _View:
    def __init__(self, blocks):
        self.blocks, self.prefill = blocks, type("P", (), {"seconds": 0.01})()


def test_a_sibling_the_walk_took_is_starred_and_counted_against_the_chain():
    # Root 'r'; depth 1: 'a' (first choice) and 'b'; 'a' -> 'c', 'b' -> 'd'. The target says 'b' after the
    # root and 'd' after 'b': the chain (r, a, c) keeps nothing, the tree keeps 'b' and 'd'. Under 'a' it
    # says 'c', so the off-walk node 'c' would have been accepted had the walk reached 'a'.
    tree = TreeCycle(tokens=(0, 1, 2, 3, 4), parents=(-1, 0, 0, 1, 2), depths=(0, 1, 1, 2, 2),
                     probs=(1.0, 0.6, 0.3, 0.5, 0.4), targets=(2, 3, 4, 7, 9), path=(0, 2, 4), host_s=0.001)
    assert chain_kept(tree) == 0
    text = {0: "r", 1: "a", 2: "b", 3: "c", 4: "d", 7: "x", 9: "z"}.get
    view = tree_cycle_html(_View([_block(tree, 2)]), 0, text, "tree", plain_step=0.02)
    assert view.count('<g class="node walked"') == 2 and view.count("★ q") == 2  # 'b' and 'd' are both siblings
    assert view.count('class="node agrees"') == 1 and "would have been accepted had the walk reached it" in view
    assert "alone would have kept <b>0</b>: the tree's siblings gained <b>2</b> tokens" in view
    assert html.escape("bonus 'z'") in view and "The cycle cost <b>2.00</b> plain steps" in view
    assert "a sibling: the drafter's first choice here, 'a', was not the target's" in why(_block(tree, 2), 1, text)
    assert "no child of the last node walked held its own next token 'z'" in why(_block(tree, 2), 3, text)
