"""The DFlash2 drafter: its released config and keys, its convolution and path selector, and
decoding with it (lossless at T=0, repeatable when seeded), plus the block-by-block comparison
with vLLM's DFlash2 when a vLLM venv is at hand."""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build_dflash2_drafter, build_drafter, build_qwen3_target, build_target
from transformers import AutoModelForCausalLM

from dflash_core import DFlashDrafter, SamplingParams, Target, run
from dflash_core.diagnostics.oracle import OracleDrafter, expected_lengths
from dflash_core.errors import CheckpointError, ConfigError
from dflash_core.models.config import DFlash2Options, parse_drafter_config
from dflash_core.models.dflash2 import BlockConv, PathSelector
from dflash_core.sampling import probabilities

ROOT = Path(__file__).resolve().parents[1]
SCALARS = {"input_embedding_scale": 1.25, "output_multiplier": 0.75, "final_logit_softcapping": 6.0}


@pytest.fixture(scope="module")
def dflash2_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash2")
    target_dir = build_qwen3_target(root / "target", vocab_size=12)
    return target_dir, build_dflash2_drafter(root / "drafter", target_dir, **SCALARS)


@pytest.fixture(scope="module")
def dflash2_pair(dflash2_dirs):
    target_dir, drafter_dir = dflash2_dirs
    return Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)


def released_config(dflash2_dirs) -> dict:
    return json.loads((dflash2_dirs[1] / "config.json").read_text())


def test_released_config_and_keys_round_trip(dflash2_dirs, dflash2_pair, tmp_path):
    raw = released_config(dflash2_dirs)
    assert raw["architectures"] == ["DFlash2DraftModel"]
    assert {k: raw["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")} == {
        "conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 4, "selector_top_k": 4}
    assert parse_drafter_config(raw).dflash2 == DFlash2Options(3, 8, 4, 4, **SCALARS)
    keys = set(load_file(dflash2_dirs[1] / "model.safetensors"))
    per_layer = {
        "attention_conv.base_kernel", "attention_conv.kernel_projection.weight", "mlp_conv.base_kernel",
        "mlp_conv.kernel_projection.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "self_attn.q_norm.weight",
        "self_attn.k_norm.weight", *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
    }
    assert keys == {f"layers.{i}.{k}" for i in range(2) for k in per_layer} | {
        "fc.weight", "hidden_norm.weight", "norm.weight", "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook", "candidate_selector.hidden_projection.weight"}
    state = load_file(dflash2_dirs[1] / "model.safetensors")
    assert state["layers.0.attention_conv.base_kernel"].shape == (2, 3, 32)  # [sides, taps, hidden]
    assert state["layers.0.mlp_conv.kernel_projection.weight"].shape == (2 * 3 * 4, 32)  # 2 sides * taps * groups
    assert state["candidate_selector.predecessor_codebook"].shape == (12, 4)  # [vocab, rank]
    assert state["candidate_selector.hidden_projection.weight"].shape == (4, 32)

    target, drafter = dflash2_pair
    drafter.save_pretrained(tmp_path / "copy", dtype=torch.float32)
    again = DFlashDrafter.from_pretrained(tmp_path / "copy")
    assert json.loads((tmp_path / "copy" / "config.json").read_text())["dflash_config"] == raw["dflash_config"]
    prompt = [1, 4, 2, 9]
    assert [b.draft_ids for b in run(target, prompt, again, max_new_tokens=16).blocks] == [
        b.draft_ids for b in run(target, prompt, drafter, max_new_tokens=16).blocks]


def _set(key, value):
    return lambda raw: raw["dflash_config"].__setitem__(key, value)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda raw: raw["dflash_config"].pop("selector_top_k"), "DFlash2DraftModel config has no selector_top_k"),
        (_set("conv_group_size", 5), "conv_group_size 5 does not divide hidden_size 32"),
        (_set("selector_top_k", 13), "selector_top_k 13 exceeds the vocabulary of size 12"),
        (_set("conv_kernel_size", 0), "conv_kernel_size must be a positive integer, got 0"),
        (_set("selector_rank", 2.5), "selector_rank must be a positive integer, got 2.5"),
        (_set("conv_kernel_size", True), "conv_kernel_size must be a positive integer, got True"),
        (_set("output_multiplier", 0), "output_multiplier must be positive"),
        (_set("input_embedding_scale", "big"), "input_embedding_scale must be a number, got 'big'"),
        (_set("draft_vocab_size", 6), "draft_vocab_size is not supported"),
        (lambda raw: raw.update(architectures=["DFlashDraftModel"]),
         r"gives the DFlash2 keys \['conv_kernel_size', .*architecture is DFlashDraftModel"),
        (lambda raw: raw.update(architectures=["LiLiCorrDraftModel"]),
         r"names architectures \['LiLiCorrDraftModel'\]; this engine loads DFlashDraftModel, DFlash2DraftModel, DFlashARDraftModel"),
    ],
)
def test_bad_dflash2_configs_are_named(dflash2_dirs, edit, message):
    raw = released_config(dflash2_dirs)
    edit(raw)
    with pytest.raises(ConfigError, match=message):
        parse_drafter_config(raw)


def test_first_release_configs_are_unchanged(golden_dir):
    config = parse_drafter_config(json.loads((golden_dir / "drafter" / "config.json").read_text()))
    assert config.architecture == "DFlashDraftModel" and config.dflash2 is None


def test_checkpoint_that_does_not_match_the_dflash2_config(dflash2_dirs, tiny_dirs, tmp_path):
    _, drafter_dir = dflash2_dirs
    bad = shutil.copytree(drafter_dir, tmp_path / "bad")
    state = load_file(bad / "model.safetensors")
    state.pop("layers.1.mlp_conv.base_kernel")
    state["candidate_selector.successor_codebook"] = torch.zeros(12, 5)
    save_file(state, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing keys \['layers.1.mlp_conv.base_kernel'\]"):
        DFlashDrafter.from_pretrained(bad)
    state["layers.1.mlp_conv.base_kernel"] = torch.zeros(2, 3, 32)
    save_file(state, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"candidate_selector.successor_codebook has shape \(12, 5\).*\(12, 4\)"):
        DFlashDrafter.from_pretrained(bad)
    # First-release weights under a DFlash2 config: every DFlash2 tensor is named as missing.
    target_dir, _ = dflash2_dirs
    plain = build_drafter(tmp_path / "plain", target_dir)
    (plain / "config.json").write_text((drafter_dir / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"missing keys \['candidate_selector.hidden_projection.weight', "):
        DFlashDrafter.from_pretrained(plain)


def test_block_conv_follows_its_definition():
    torch.manual_seed(0)
    conv = BlockConv(hidden_size=8, taps=3, group_size=4)
    with torch.no_grad():
        conv.base_kernel.normal_()
    x, delta = torch.randn(1, 5, 8), torch.randn(1, 5, 3, 2)
    out = conv.convolve(x, delta, side=1)
    # out[j, c] = sum over taps t <= j of (base[1, t, c] + delta[j, t, group(c)]) * x[j - t, c]
    expected = torch.zeros(5, 8)
    for j in range(5):
        for t in range(min(3, j + 1)):
            for c in range(8):
                expected[j, c] += (conv.base_kernel[1, t, c] + delta[0, j, t, c // 4]) * x[0, j - t, c]
    torch.testing.assert_close(out[0], expected.detach())
    # Causal within the block: changing slot 2 leaves slots 0 and 1 alone.
    changed = x.clone()
    changed[0, 2] += 1.0
    again = conv.convolve(changed, delta, side=1)
    assert torch.equal(again[0, :2], out[0, :2]) and not torch.equal(again[0, 2:], out[0, 2:])
    # A fresh convolution is the identity on both sides: the layer starts as its DFlash one.
    fresh = BlockConv(hidden_size=8, taps=3, group_size=4)
    sublayer = torch.nn.Linear(8, 8)
    torch.testing.assert_close(fresh.around(sublayer, x), sublayer(x))


def test_path_scores_and_walks():
    torch.manual_seed(1)
    selector = PathSelector(hidden_size=6, vocab_size=10, rank=3, top_k=3)
    hidden, anchor = torch.randn(4, 6), torch.tensor([7])
    candidates = torch.stack([torch.randperm(10)[:3] for _ in range(4)])
    unary = torch.randn(4, 3)
    path = selector(hidden, candidates, unary, anchor)
    h = selector.hidden_projection(hidden)
    for slot in range(4):
        before = [7] * 3 if slot == 0 else candidates[slot - 1].tolist()
        for i, a in enumerate(before):
            for j, b in enumerate(candidates[slot].tolist()):
                edge = unary[slot, j] + (selector.predecessor_codebook[a] * h[slot] * selector.successor_codebook[b]).sum()
                torch.testing.assert_close(path.scores[slot, i, j], edge.detach())
    # Greedy: each slot takes the best edge out of the previous slot's choice.
    ids, probs = PathSelector.propose(path, 10)
    previous, expected = 0, []
    for slot in range(4):
        previous = int(path.scores[slot, previous].argmax())
        expected.append(int(candidates[slot, previous]))
    assert ids.tolist() == expected and probs is None
    realized = PathSelector.realized_logits(path, 10)
    assert realized.argmax(dim=-1).tolist() == expected and torch.isinf(realized).sum() == 4 * 7
    # Sampled: slot l draws from the sampling distribution of the edges out of slot l-1's draw.
    sampling = SamplingParams(temperature=0.7, top_k=2, seed=3)
    draws = [PathSelector.propose(path, 10, sampling, torch.Generator().manual_seed(s)) for s in range(20)]
    assert len({tuple(d[0].tolist()) for d in draws}) > 1
    for ids, probs in draws:
        previous = 0
        for slot in range(4):
            row = probabilities(path.scores[slot, previous][None], sampling)[0]
            torch.testing.assert_close(probs[slot, candidates[slot]], row)
            assert probs[slot].sum().item() == pytest.approx(1.0) and probs[slot, ids[slot]] > 0
            previous = int((candidates[slot] == ids[slot]).nonzero())
    first, again = (PathSelector.propose(path, 10, sampling, torch.Generator().manual_seed(5)) for _ in range(2))
    assert torch.equal(first[0], again[0])


def random_prompts(vocab, n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(vocab - 1) for _ in range(rng.randint(2, 10))] for _ in range(n)]


@pytest.mark.parametrize("block_size", [8, 4, 2])
def test_greedy_dflash2_equals_plain_decoding(dflash2_pair, block_size):
    target, drafter = dflash2_pair
    lengths = []
    for prompt in random_prompts(target.vocab_size, 3, seed=block_size):
        plain = run(target, prompt, max_new_tokens=30)
        fast = run(target, prompt, drafter, max_new_tokens=30, block_size=block_size)
        assert fast.output_ids == plain.output_ids
        lengths += fast.acceptance_lengths
    assert any(1 < n < block_size for n in lengths) or (block_size == 2 and 2 in lengths), (
        "no partial acceptance: the test would not exercise rollback after a DFlash2 draft")


@pytest.fixture(scope="module")
def bigram_pair(dflash2_dirs, tmp_path_factory):
    """The tiny target with its layers silenced (each next token a fixed function `f` of the last
    one), and a DFlash2 drafter whose pairwise scores encode `f` except after a few tokens, where
    they point at another one. The greedy walk then drafts that chain, so every cycle's drafts and
    acceptance length are known in advance, and the lengths range from 1 to B. (With silenced
    layers the caches do not matter here; the oracle test and the random pair cover them.)"""
    target_dir, _ = dflash2_dirs
    drafter_dir = build_dflash2_drafter(tmp_path_factory.mktemp("bigram") / "drafter", target_dir, selector_top_k=12,
                                        selector_rank=12, **SCALARS)
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir)
    vocab = model.config.vocab_size
    with torch.no_grad():
        for layer in [*model.model.layers, *drafter.layers]:
            (layer.self_attn.o_proj.weight.zero_(), layer.mlp.down_proj.weight.zero_())
        f = model.lm_head(model.model.norm(model.model.embed_tokens.weight)).argmax(-1).tolist()
        wrong = {0, 5}
        walk = [(f[a] + 1) % vocab if a in wrong else f[a] for a in range(vocab)]
        # Every mask slot then has the same final state h; map it to ones, so edge a -> b scores
        # unary(b) + successor_codebook[b, a] with one-hot predecessor codes.
        target = Target(model)
        h = drafter.norm(target.embed(torch.tensor([drafter.mask_token_id])) * SCALARS["input_embedding_scale"])[0]
        selector = drafter.candidate_selector
        selector.hidden_projection.weight.copy_((h / h.dot(h)).expand(vocab, -1))
        selector.predecessor_codebook.copy_(torch.eye(vocab))
        selector.successor_codebook.zero_()
        selector.successor_codebook[walk, range(vocab)] = 100.0  # far above the soft-capped unary logits
    return target, drafter, walk, wrong


def test_every_acceptance_length_through_the_walk(bigram_pair):
    target, drafter, walk, wrong = bigram_pair
    lengths = set()
    for prompt in ([1], [2], [4], [5], [7], [3, 10]):
        plain = run(target, prompt, max_new_tokens=40)
        fast = run(target, prompt, drafter, max_new_tokens=40)
        assert fast.output_ids == plain.output_ids
        tokens = [*prompt, *plain.output_ids]
        for block in fast.blocks[:-1]:
            chain = [tokens[block.position]]
            for _ in range(drafter.block_size - 1):
                chain.append(walk[chain[-1]])
            assert list(block.draft_ids) == chain[1:]
            # A draft is right exactly when the token before it is not one the walk was bent after.
            expected = next((i for i, t in enumerate(chain[:-1]) if t in wrong), drafter.block_size - 1)
            assert block.accepted == expected
            lengths.add(block.accepted + 1)
    assert len(lengths) >= 4 and drafter.block_size in lengths and 1 in lengths


def test_seeded_sampling_repeats(dflash2_pair):
    target, drafter = dflash2_pair
    for draft_mode in ("sample", "argmax"):
        def once(seed):
            sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
            return run(target, [3, 1, 4], drafter, max_new_tokens=30, sampling=sampling, draft_mode=draft_mode)

        a, b, c = once(11), once(11), once(12)
        assert a.output_ids == b.output_ids and [x.draft_ids for x in a.blocks] == [x.draft_ids for x in b.blocks]
        assert a.output_ids != c.output_ids


def test_explain_reports_the_walk(dflash2_pair):
    target, drafter = dflash2_pair
    out = run(target, [5, 2, 8], drafter, max_new_tokens=10, explain=3)
    for block in out.blocks:
        draft_topk = block.explain.draft_topk
        # Greedy: each draft is the mode of the distribution reported for its slot.
        assert [rows[0][0] for rows in draft_topk] == list(block.draft_ids)
        assert all(len(rows) == 3 for rows in draft_topk)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95, seed=7)],
                         ids=["greedy", "sampled"])
def test_explained_cycles_carry_the_walk_the_selector_took(dflash2_pair, sampling, monkeypatch):
    """Each block's `explain.path` is the step's candidates, the selector's distribution along the
    walk, and the walk itself: recomputed here from the path scores the drafter handed the walk."""
    target, drafter = dflash2_pair
    scored = []
    propose = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda path, *a: scored.append(path) or propose(path, *a))
    out = run(target, [5, 2, 8], drafter, max_new_tokens=24, sampling=sampling, explain=3)
    assert len(scored) == len(out.blocks) and any(b.explain.path.chosen[0] != 0 for b in out.blocks), (
        "the selector never left the head's first candidate: the test would not tell the walk from the head")
    for block, path in zip(out.blocks, scored):
        walked = block.explain.path
        assert walked.candidates == tuple(map(tuple, path.candidates.tolist()))
        assert [row[i] for row, i in zip(walked.candidates, walked.chosen)] == list(block.draft_ids)
        if sampling.greedy:
            assert walked.chosen == tuple(PathSelector.walk(path)[0].tolist())
        previous = 0
        for slot, chosen in enumerate(walked.chosen):
            row = path.scores[slot, previous][None]
            expected = row.softmax(-1) if sampling.greedy else probabilities(row, sampling)
            assert walked.probs[slot] == pytest.approx(expected[0].tolist(), abs=1e-6)
            previous = chosen
    # A DFlash drafter's explanation has no walk, and its trace block no "path".
    assert all(b.explain.path is None for b in run(target, [5, 2, 8], None, max_new_tokens=4, explain=3).blocks)


def test_a_dflash2_cycle_reads_the_host_once_when_nobody_asks_for_the_walk(dflash2_pair):
    from dflash_core import Block, generate
    from dflash_core.diagnostics.syncs import SyncCounter

    target, drafter = dflash2_pair
    per_cycle = []
    with SyncCounter(cuda_debug=False) as counter:
        for event in generate(target, [1, 2, 3, 4], drafter, max_new_tokens=24):
            count = counter.take()
            if isinstance(event, Block):
                per_cycle.append(count)
    assert len(per_cycle) >= 3 and per_cycle == [1] * len(per_cycle)


def test_oracle_schedule_with_a_dflash2_drafter(dflash2_pair):
    target, drafter = dflash2_pair
    n, schedule = 30, [1, 8, 3, 5, 2]
    plan = list(run(target, [4, 5, 6], max_new_tokens=n + drafter.block_size).output_ids)
    out = run(target, [4, 5, 6], OracleDrafter(drafter, plan, schedule, target.vocab_size), max_new_tokens=n)
    assert list(out.output_ids) == plan[:n]
    assert out.acceptance_lengths == expected_lengths(schedule, 8, len(out.blocks))


def test_cuda_graph_steps_replay_dflash2_drafts(dflash2_pair):
    from test_cuda_graphs import FakeGraphs, graphed

    target, drafter = dflash2_pair
    fake = FakeGraphs()
    on = graphed(target, fake)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, seed=4)):
        a, b = (run(t, [2, 7, 1, 3], drafter, max_new_tokens=24, sampling=sampling) for t in (target, on))
        assert b.output_ids == a.output_ids and [x.draft_ids for x in b.blocks] == [x.draft_ids for x in a.blocks]
    assert sum(fake.replays.values()) > 20


@pytest.mark.slow
def test_sampled_dflash2_matches_exact_target_distribution(tmp_path):
    """Sampled drafts walk the chain, so slot l's q depends on slot l-1's draw; the rejection rule
    must see that conditional q for the output to follow the target (chi-square, as test_sampling)."""
    target_dir = build_target(tmp_path / "target", vocab_size=4, logit_scale=1.0, hidden=16, num_layers=2, seed=3)
    drafter_dir = build_dflash2_drafter(tmp_path / "drafter", target_dir, num_layers=1, block_size=4, seed=4,
                                        conv_group_size=8, selector_rank=2, selector_top_k=3)
    from test_sampling import assert_samples_follow_the_target

    assert_samples_follow_the_target(Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir))


def vllm_python() -> Path | None:
    """The vLLM venv's python: $DFLASH_VLLM_VENV, else the project's `.venv-vllm`."""
    venv = Path(os.environ.get("DFLASH_VLLM_VENV") or ROOT / ".venv-vllm")
    python = venv / "bin" / "python"
    return python if python.is_file() else None


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM venv (.venv-vllm or $DFLASH_VLLM_VENV)")
def test_drafts_equal_vllm_dflash2_block_by_block(tmp_path):
    assert_drafts_equal_vllm(tmp_path, min_blocks=50)


def assert_drafts_equal_vllm(tmp_path, *pair: str, min_blocks: int) -> None:
    """dev/scripts/compare_dflash2_vllm.py, run in the vLLM venv on its random pair or on `pair`
    (--target DIR --drafter DIR): more than `min_blocks` blocks, all equal, some accepted, lossless."""
    report = tmp_path / "compare.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run(
        [str(vllm_python()), str(ROOT / "dev" / "scripts" / "compare_dflash2_vllm.py"), "--json", str(report), *pair],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(report.read_text())
    blocks = result["blocks"]
    assert len(blocks) > min_blocks and all(b["equal"] for b in blocks) and result["lossless"]
    assert any(b["accepted"] for b in blocks)
    print(result["verdict"], file=sys.stderr)


def test_cycle_timing_runs_a_dflash2_draft_step(dflash2_pair):
    from dflash_core.bench.cycle import time_cycle

    target, drafter = dflash2_pair
    result = time_cycle(target, drafter, 16, 8, iters=1)
    assert result["draft_ms"] > 0 and result["block_size"] == 8
