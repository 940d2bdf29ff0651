"""Tree verification (`tree.py`): lossless at greedy, exact when sampling, the accepted path kept.

The golden pair's real drafter grows natural trees; `SiblingOracle` (plain decoding's continuation
with one slot per cycle wrong, the right token its second choice) makes trees whose walk must take
a sibling, so the ancestor mask and the compaction of the walked path's keys and values decide the
output. Targets whose layers cannot verify a tree are refused, as are the drafters and settings a
tree does not combine with.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from families import FAMILIES, build_family_target
from test_sampling import CHI_SQUARE_RUNS, chi_square_ok, exact_joint, tiny_vocab_pair  # noqa: F401 (a fixture)
from tiny import build_dflash2_drafter, build_drafter, build_qwen3_target, build_target
from transformers import DynamicCache

from dflash_core import DFlashDrafter, SamplingParams, Target, run
from dflash_core.diagnostics.oracle import CONFIDENT, OracleDrafter
from dflash_core.errors import GenerationInputError
from dflash_core.prompt_lookup import PromptLookup
from dflash_core.trace import TraceFieldError, build_trace, settings_of, validate_trace
from dflash_core.tree import ancestor_mask, grow, walk

BUDGETS = (1, 4, 8, 16, 32)
BLOCK = 8
SCHEDULE = [3, 1, 6, 2, 8, 4]  # the oracle's first wrong slot per cycle (8: none)
FULL_ATTENTION = ("llama", "qwen3", "qwen3_moe")


class SiblingOracle(OracleDrafter):
    """The oracle, with the right token kept as the second choice of its wrong slot: a chain
    rejects that slot, a tree holding the sibling walks through it and on down its children."""

    def before_draft(self, start: int) -> None:
        super().before_draft(start)
        first = start - self._prompt_len + 1
        self._right = self.plan[first : first + self.block_size - 1]

    def draft_logits(self, hidden, lm_head, anchor_ids=None) -> torch.Tensor:
        logits = super().draft_logits(hidden, lm_head, anchor_ids)
        right = self._right[: hidden.shape[0], None]
        score = torch.where(logits.gather(1, right) == CONFIDENT, CONFIDENT, CONFIDENT - 1.0).to(logits.dtype)
        return logits.scatter(1, right, score)


def took_a_sibling(summary) -> bool:
    """Whether some cycle's walk went through a node that is not its parent's first child."""
    for block in summary.blocks:
        tree = block.tree
        for node in tree.path[1:]:
            if any(tree.parents[other] == tree.parents[node] for other in range(1, node)):
                return True
    return False


# --- the tree itself ---------------------------------------------------------------------------
def test_grow_is_best_first_by_cumulative_log_probability():
    ids = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    logq = [[math.log(0.6), math.log(0.3), math.log(0.1)], [math.log(0.9), math.log(0.05), math.log(0.05)],
            [math.log(0.5), math.log(0.4), math.log(0.1)]]
    tree = grow(7, ids, logq, 5)
    # 10 (.6), 10-20 (.54), 11 (.3), 10-20-30 (.27), 11-20 (.27): ties pop in push order
    assert tree.tokens == (7, 10, 20, 11, 30, 20)
    assert tree.parents == (-1, 0, 1, 0, 2, 3)
    assert tree.depths == (0, 1, 2, 1, 3, 2)
    assert grow(7, ids, logq, 1).tokens == (7, 10)  # budget 1: the chain's first slot
    assert len(grow(7, ids, logq, 100)) == 1 + 3 + 9 + 27  # every path of the top-3s, and no more


def test_ancestor_mask_and_walk():
    tree = grow(7, [[10, 11], [20, 21]], [[-0.1, -1.0], [-0.2, -2.0]], 4)  # 10, 10-20, 11, 11-20
    assert tree.parents == (-1, 0, 1, 0, 3)
    mask = ancestor_mask(tree, "cpu")
    assert mask.tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [True, True, True, False, False],
        [True, False, False, True, False],
        [True, False, False, True, True],
    ]
    # the target picks 11 at the root, then 20 after it, then 5 (no child): bonus 5
    assert walk(tree, [11, 99, 99, 20, 5]) == ([0, 3, 4], 5)
    assert walk(tree, [12, 0, 0, 0, 0]) == ([0], 12)


def path_to(tree, node: int) -> list[int]:
    """The tokens from the root to `node`, both included."""
    tokens = []
    while node != -1:
        tokens.append(tree.tokens[node])
        node = tree.parents[node]
    return tokens[::-1]


@pytest.mark.parametrize("static_cache", [False, True])
def test_every_node_row_is_the_row_plain_decoding_computes_after_its_path(tiny_dirs, static_cache):
    """The ancestor mask and the depth positions: each node's scores in the one tree forward equal a
    plain forward's over the prompt and that node's path, whatever its siblings and cousins hold."""
    target = Target.from_pretrained(tiny_dirs[0], static_cache=static_cache)
    prompt = [5, 6, 7, 8, 9]
    tree = grow(4, [[10, 11, 12], [20, 21, 22], [30, 31, 32]], [[-0.1, -0.5, -0.9]] * 3, 16)
    assert max(tree.depths) == 3 and tree.parents.count(0) == 3  # branching at every depth
    target.reset(64)
    target.forward(torch.tensor([prompt]), last_logits_only=True)
    logits, _ = target.forward_tree(torch.tensor([tree.tokens]), torch.tensor(tree.depths), ancestor_mask(tree, "cpu"))
    for node in range(len(tree)):
        expected = target.model(input_ids=torch.tensor([prompt + path_to(tree, node)])).logits[0, -1]
        torch.testing.assert_close(logits[node], expected, rtol=0, atol=1e-4)


# --- greedy: token-identical to plain decoding ----------------------------------------------------
@pytest.mark.parametrize("budget", BUDGETS)
def test_golden_pair_trees_decode_as_plain(golden_pair, golden_expected, budget):
    target, drafter = golden_pair
    n, siblings = golden_expected["max_new_tokens"], False
    for prompt in golden_expected["prompts"]:
        plain = run(target, prompt["prompt_ids"], max_new_tokens=n).output_ids
        out = run(target, prompt["prompt_ids"], drafter, max_new_tokens=n, tree_budget=budget)
        assert out.output_ids == plain
        assert all(b.verify_len == len(b.tree.tokens) == budget + 1 for b in out.blocks)  # the budget is spent
        siblings |= took_a_sibling(out)
    assert siblings == (budget > 1), "a budget above 1 should walk through a sibling somewhere on these prompts"


@pytest.fixture(scope="module", params=FULL_ATTENTION)
def full_attention(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tree-{request.param}")
    target_dir = build_family_target(root / "target", request.param)
    drafter_dir = build_drafter(root / "drafter", target_dir, block_size=BLOCK)
    return Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)


def oracle_run(target, drafter, budget, prompt=(5, 6, 7, 8), n=40):
    plan = list(run(target, list(prompt), max_new_tokens=n + BLOCK).output_ids)
    oracle = SiblingOracle(drafter, plan, SCHEDULE, target.vocab_size)
    return plan[:n], run(target, list(prompt), oracle, max_new_tokens=n, tree_budget=budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_every_full_attention_family_decodes_as_plain_through_siblings(full_attention, budget):
    target, drafter = full_attention
    plain, out = oracle_run(target, drafter, budget)
    assert list(out.output_ids) == plain
    if budget >= BLOCK:  # the chain's 7 nodes, then the right sibling first
        assert took_a_sibling(out)
        assert out.tau > 1 + sum(min(s, BLOCK) - 1 for s in SCHEDULE) / len(SCHEDULE)  # above the chain's


@pytest.mark.parametrize("static_cache", [False, True])
def test_the_cache_keeps_exactly_the_walked_path(tmp_path, static_cache):
    """After a run whose walks took siblings, every cached key and value is the one a plain forward
    over the output computes at its position: the walked nodes were moved into place."""
    target_dir = build_family_target(tmp_path / "target", "llama")
    drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "drafter", target_dir, block_size=BLOCK))
    target = Target.from_pretrained(target_dir, static_cache=static_cache)
    prompt = [5, 6, 7, 8]
    plain, out = oracle_run(target, drafter, 16, prompt)
    assert list(out.output_ids) == plain and took_a_sibling(out)
    kept = target.cache_length
    seq = torch.tensor([(prompt + plain)[:kept]])
    reference = DynamicCache(config=target.model.config)
    target.model(input_ids=seq, past_key_values=reference, use_cache=True)
    for ours, theirs in zip(target.cache.layers, reference.layers):
        torch.testing.assert_close(ours.keys[:, :, :kept], theirs.keys, rtol=0, atol=1e-4)
        torch.testing.assert_close(ours.values[:, :, :kept], theirs.values, rtol=0, atol=1e-4)


# --- sampling: exact ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def context_pair(tmp_path_factory):
    """A 4-token target whose attention carries the context (values x4, queries x2): a row computed
    after the wrong tokens (a broken mask, keys left in the wrong slots) then often has another top-3,
    and emits tokens the exact distribution never does."""
    root = tmp_path_factory.mktemp("tree-vocab4")
    target_dir = build_target(root / "target", vocab_size=4, logit_scale=1.0, hidden=16, num_layers=2, seed=3)
    target = Target.from_pretrained(target_dir)
    with torch.no_grad():
        for layer in target.layers:
            layer.self_attn.v_proj.weight.mul_(4.0)
            layer.self_attn.q_proj.weight.mul_(2.0)
    drafter_dir = build_drafter(root / "drafter", target_dir, num_layers=1, block_size=4, seed=4)
    return target, DFlashDrafter.from_pretrained(drafter_dir)


@pytest.mark.slow
@pytest.mark.parametrize("budget,block_size,length", [(4, 2, 4), (8, 3, 3)])
def test_sampled_trees_follow_the_exact_target_distribution(context_pair, budget, block_size, length):
    """Blocks of 2 make every token a child of the root (siblings only): a cycle keeps at most 2
    tokens, so the 4th token comes from a cycle after the walk's path was moved into place. Blocks
    of 3 grow two levels."""
    target, drafter = context_pair
    prompt = [1, 2, 0]
    exact = exact_joint(target, prompt, length, SamplingParams(temperature=1.3, top_k=3)).flatten()
    counts, accepted, siblings = torch.zeros_like(exact), 0, 0
    for seed in range(CHI_SQUARE_RUNS):
        out = run(target, prompt, drafter, max_new_tokens=length, block_size=block_size, tree_budget=budget,
                  sampling=SamplingParams(1.3, top_k=3, seed=seed))
        counts[sum(t * 4 ** i for i, t in enumerate(reversed(out.output_ids)))] += 1
        accepted += sum(blk.accepted for blk in out.blocks)
        siblings += took_a_sibling(out)
    assert accepted > CHI_SQUARE_RUNS // 5, "drafts were rarely accepted: the test would not exercise the walk"
    assert siblings > CHI_SQUARE_RUNS // 10, "walks rarely took a sibling: the trees would not branch"
    assert chi_square_ok(counts, exact)


# --- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in FULL_ATTENTION])
def test_targets_beyond_full_attention_are_refused_naming_their_layers(tmp_path, family):
    target_dir = build_family_target(tmp_path / "target", family)
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "drafter", target_dir, block_size=4))
    with pytest.raises(GenerationInputError, match="tree verification needs full attention in every layer, and .* has"):
        run(target, [5, 6], drafter, max_new_tokens=4, tree_budget=4)


def test_settings_a_tree_does_not_combine_with_are_refused(golden_pair, tiny_vocab_pair):  # noqa: F811
    target, drafter = golden_pair
    for kwargs, message in [
        (dict(tree_budget=-1), "tree_budget must be 0 .* got -1"),
        (dict(tree_budget=True), "tree_budget must be 0 .* got True"),
        (dict(tree_budget=4, block_size="auto"), 'tree_budget=4 and block_size="auto" both choose'),
        (dict(tree_budget=4, explain=3), "explain=3 describes a chain's slots"),
        (dict(tree_budget=4, block_size=1), "needs a block of at least 2 slots"),
    ]:
        with pytest.raises(GenerationInputError, match=message):
            run(target, [1, 2, 3], drafter, max_new_tokens=4, **kwargs)
    with pytest.raises(GenerationInputError, match="lookup drafting has no form of"):
        run(target, [1, 2, 3], PromptLookup(block_size=4), max_new_tokens=4, tree_budget=4)
    vocab_target, ar = tiny_vocab_pair(None, "ar")
    with pytest.raises(GenerationInputError, match="ar drafting has no form of"):
        run(vocab_target, [1, 2, 3], ar, max_new_tokens=4, tree_budget=4)


def test_dflash2_is_refused(tmp_path):
    target_dir = build_qwen3_target(tmp_path / "target", vocab_size=12)
    drafter = DFlashDrafter.from_pretrained(build_dflash2_drafter(tmp_path / "drafter", target_dir))
    with pytest.raises(GenerationInputError, match="dflash2 drafting has no form of .* DFlash2 conditions each slot"):
        run(Target.from_pretrained(target_dir), [1, 2, 3], drafter, max_new_tokens=4, tree_budget=4)


# --- the trace ---------------------------------------------------------------------------------
def test_the_trace_records_each_cycle_tree_and_checks_it(golden_pair, golden_expected):
    target, drafter = golden_pair
    prompt = golden_expected["prompts"][0]["prompt_ids"]
    out = run(target, prompt, drafter, max_new_tokens=24, tree_budget=8)
    trace = build_trace(settings=settings_of(None, prompt, 24, out.block_size, SamplingParams()),
                        pair={"id": None, "target": "t", "drafter": "d", "trained_block_size": drafter.block_size},
                        runs={"dflash": out}, vocab_size=target.vocab_size, text_of=None, device=target.device)
    data = validate_trace(json.dumps(trace).encode())
    side = data["runs"]["dflash"]
    assert side["tree_budget"] == 8
    first, block = side["blocks"][0]["tree"], out.blocks[0]
    assert first["tokens"] == list(block.tree.tokens) and first["path"] == list(block.tree.path)
    assert side["blocks"][0]["verify_len"] == 9
    block0 = side["blocks"][0]
    block0["bonus_id"] = (block0["bonus_id"] + 1) % target.vocab_size
    block0["committed_ids"][-1] = block0["bonus_id"]
    with pytest.raises(TraceFieldError, match="bonus_id must be the target's token at the path's last node"):
        validate_trace(json.dumps(data).encode())
