"""Training DFlash2 drafters: the training forward reproduces the decoding draft step block by block,
the selector's loss follows its definition, a DFlash drafter turned DFlash2 drafts what it drafted,
and a tiny DFlash2 overfits, saves, reloads, resumes and decodes losslessly (in vLLM too, when a vLLM
venv is at hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_dflash2 import SCALARS, assert_drafts_equal_vllm, vllm_python
from test_sampling import assert_samples_follow_the_target
from test_train import PROMPTS, _prompt_ids, _write_shard, overfit_setup
from tiny import build_dflash2_drafter, build_drafter, build_qwen3_target, build_target

from dflash_core import DFlashDrafter, Target, run
from dflash_core.errors import ConfigError
from dflash_core.models.config import parse_drafter_config
from dflash_core.models.dflash2 import BlockConv, PathSelector
from dflash_core.training.drafter_init import to_dflash2
from dflash_core.training.objective import (
    DrafterTrainer,
    acceptance_lengths,
    decode_walk,
    default_gamma,
    evaluate,
    slot_weights,
)
from dflash_core.training.train import main


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    """A Qwen3 target over 12 ids and a random DFlash2 drafter keeping 6 candidates a slot: labels
    fall both inside and outside the candidates, so the selector's loss meets both cases."""
    root = tmp_path_factory.mktemp("dflash2-train")
    target_dir = build_qwen3_target(root / "target", vocab_size=12)
    drafter_dir = build_dflash2_drafter(root / "drafter", target_dir, selector_top_k=6, **SCALARS)
    return Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)


def _draft_step(target, drafter, ids, anchor):
    """What decoding's draft step computes for the block at `anchor` after the context ids[:anchor]:
    the final states of the drafted slots and their path scores."""
    B = drafter.block_size
    target.reset()
    _, context = target.forward(ids[None, :anchor])
    block = torch.full((1, B), drafter.mask_token_id)
    block[0, 0] = ids[anchor]
    hidden = drafter(target.embed(block), context, torch.arange(0, anchor + B)[None], cache=drafter.new_cache())[0, 1:]
    return hidden, drafter.draft_logits(hidden, target.head, anchor_ids=ids[anchor : anchor + 1])


def test_block_conv_keeps_to_each_block():
    """Training lays many blocks along one sequence; each must be filtered as if it were alone."""
    torch.manual_seed(0)
    conv = BlockConv(hidden_size=8, taps=3, group_size=4)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x, sublayer = torch.randn(1, 3 * 4, 8), torch.nn.Linear(8, 8)
    together = conv.around(sublayer, x, block=4)
    alone = torch.cat([conv.around(sublayer, x[:, i : i + 4]) for i in (0, 4, 8)], dim=1)
    torch.testing.assert_close(together, alone)
    assert not torch.allclose(conv.around(sublayer, x), alone)  # one long block would leak across


def test_dflash2_training_forward_equals_inference(small_vocab_pair, one_thread):
    target, drafter = small_vocab_pair
    B, gamma = drafter.block_size, 3.0
    ids = torch.randint(0, target.vocab_size - 1, (40,), generator=torch.Generator().manual_seed(0))
    anchors = torch.tensor([10, 17, 25, 33, 38])  # the last block runs past the end of the sequence
    trainer = DrafterTrainer(target, drafter, B, gamma, selector_weight=0.5)
    with torch.no_grad():
        out = trainer.forward(ids, anchors, dense=True)
    target.tap_layers(drafter.target_layer_ids)
    selector, weights = drafter.candidate_selector, slot_weights(B, gamma)
    total = norm = 0.0
    kept = skipped = 0
    for j, a in enumerate(anchors.tolist()):
        with torch.no_grad():
            hidden, path = _draft_step(target, drafter, ids, a)
            unary = drafter.unary_scores(target.head(hidden))
        # Same candidates, edge scores and greedy walk as the draft step.
        assert torch.equal(out.paths.candidates[j], path.candidates)
        torch.testing.assert_close(out.paths.scores[j], path.scores, atol=1e-4, rtol=1e-5)
        assert torch.equal(out.drafts[j], PathSelector.propose(path, target.vocab_size)[0])
        torch.testing.assert_close(out.logits[j], unary, atol=1e-5, rtol=1e-5)  # the block loss's scores
        # The selector's loss by its definition: at each slot, the edges from the true previous token.
        for slot in range(B - 1):
            label = int(out.labels[j, slot])
            if label < 0:
                continue
            candidates = path.candidates[slot].tolist()
            if label not in candidates:
                skipped += 1
                continue
            previous = a if slot == 0 else a + slot  # the anchor, or the position of the slot before's label
            code = selector.predecessor_codebook[ids[previous]] * selector.hidden_projection(hidden[slot])
            edges = unary[slot, candidates] + (code * selector.successor_codebook[candidates]).sum(-1)
            total += weights[slot] * -edges.log_softmax(-1)[candidates.index(label)]
            norm += weights[slot]
            kept += 1
    assert kept and skipped, "labels must fall both inside and outside the candidates"
    torch.testing.assert_close(out.selector, (total / norm).detach(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out.loss, out.ce + 0.5 * out.selector)
    assert out.valid[-1].tolist() == [True] + [False] * (B - 2)
    # The block loss is DFlash's, on the unary scores.
    w = weights[None].expand_as(out.labels) * out.valid
    hard = -out.logits.log_softmax(-1).gather(-1, out.labels.clamp(min=0)[..., None])[..., 0]
    torch.testing.assert_close(out.ce, (hard * w).sum() / w.sum())


def test_a_dflash_drafter_turned_dflash2_drafts_what_it_did(tiny_dirs, one_thread, tmp_path):
    target_dir, drafter_dir = tiny_dirs
    target, warm = Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)
    # Half the vocabulary as candidates: random ids then often are one, so the selector's loss counts.
    new = to_dflash2(warm, conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=target.vocab_size // 2)
    assert new.dflash2 is not None and new.config.architecture == "DFlash2DraftModel"
    for text in PROMPTS:
        prompt = _prompt_ids(target, text)
        before, after = (run(target, prompt, d, max_new_tokens=24) for d in (warm, new))
        assert [b.draft_ids for b in after.blocks] == [b.draft_ids for b in before.blocks]
        assert after.output_ids == before.output_ids
    # Identity convolutions: the very same training logits, so the first step starts where DFlash ended.
    ids = torch.randint(4, target.vocab_size - 1, (40,), generator=torch.Generator().manual_seed(5))
    anchors = torch.tensor([10, 20, 30])
    warm_out = DrafterTrainer(target, warm, warm.block_size, 4.0).forward(ids, anchors)
    out = DrafterTrainer(target, new, new.block_size, 4.0).forward(ids, anchors)
    torch.testing.assert_close(out.logits, warm_out.logits.detach(), atol=0, rtol=0)
    assert torch.equal(out.drafts, warm_out.logits.argmax(-1))
    # Every new part gets a gradient at once, but for the codebooks (the zero projection multiplies them).
    out.loss.backward()
    for layer in new.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            assert conv.base_kernel.grad.abs().sum() > 0 and conv.kernel_projection.weight.grad.abs().sum() > 0
    assert new.candidate_selector.hidden_projection.weight.grad.abs().sum() > 0
    assert not new.candidate_selector.successor_codebook.grad.any()
    # A drafter with a draft vocabulary drops it: DFlash2 drafts over the whole vocabulary.
    small = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "small", target_dir, draft_vocab=list(range(4, 40))))
    converted = to_dflash2(small, 2, 8, 4, 5)
    converted.save_pretrained(tmp_path / "converted")
    raw = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert converted.draft_vocab is None and "draft_vocab_size" not in raw and raw["architectures"] == ["DFlash2DraftModel"]
    assert DFlashDrafter.from_pretrained(tmp_path / "converted").dflash2 == converted.dflash2
    with pytest.raises(ConfigError, match="conv_group_size 5 does not divide hidden_size 32"):
        to_dflash2(warm, 2, 5, 4, 5)
    with pytest.raises(ConfigError, match="not a DFlash2DraftModel"):
        to_dflash2(new, 2, 8, 4, 5)


def test_dflash2_overfit_save_load_and_resume(tiny_dirs, tmp_path, one_thread):
    target_dir, _ = tiny_dirs
    source, out = tmp_path / "dflash", tmp_path / "dflash2"
    target, samples, common = overfit_setup(target_dir, tmp_path / "data")
    main([*common, "--out", str(source), "--init-from-target", "--max-steps", "10"])
    dflash2 = [*common, "--out", str(out), "--init-from", str(source), "--dflash2", "--conv-group-size", "8",
               "--selector-rank", "8", "--selector-top-k", "6", "--walk-weight", "2"]
    assert main([*dflash2, "--max-steps", "40"])["step"] == 40
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r["kind"] == "train"]
    assert losses[-1] < 0.5 * losses[0]

    shipped = DFlashDrafter.from_pretrained(out)  # the released format, bf16, as shipped
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["DFlash2DraftModel"] and raw["dflash_config"]["selector_top_k"] == 6
    assert shipped.candidate_selector.hidden_projection.weight.any()  # the selector was trained
    # The checkpoint's float32 files hold exactly the trained state.
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=False)["drafter"]
    trained = DFlashDrafter(parse_drafter_config(raw))
    trained.load_state_dict(state)
    reloaded = DFlashDrafter.from_pretrained(out / "checkpoint")
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in state.items())
    prompt, plen = samples[0][0][: samples[0][1]], samples[0][1]
    result = run(target, prompt, trained.eval(), max_new_tokens=40)
    assert [b.draft_ids for b in run(target, prompt, reloaded, max_new_tokens=40).blocks] == [b.draft_ids for b in result.blocks]
    for drafter in (trained, shipped):
        result = run(target, prompt, drafter, max_new_tokens=40)
        assert list(result.output_ids) == samples[0][0][plen:]  # lossless
        assert result.tau > 2.0
    # The teacher-forced walk meets the blocks decoding ran: acceptance goes by the selector's drafts.
    trainer = DrafterTrainer(target, trained, 4, default_gamma(4))
    seq = torch.tensor(samples[0][0])
    with torch.no_grad():
        every = trainer.forward(seq, torch.arange(plen, len(seq) - 1))
    walk = decode_walk(acceptance_lengths(every.logits, every.labels, every.valid, every.drafts)).tolist()
    inside = [b.accepted + 1 for b in result.blocks if b.position + 3 < len(seq)]
    assert walk[: len(inside)] == inside and len(walk) - len(inside) <= 1
    est = evaluate(trainer, [(seq, plen, "x")], 64)
    assert est["val_tau_decode"] == pytest.approx(sum(walk) / len(walk))
    assert est["val_tau_unary"] > 1 and est["val_selector_loss"] > 0

    assert main([*dflash2, "--max-steps", "45", "--resume"])["step"] == 45
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["kind"] == "train"][len(losses):][0] == 41
    assert DFlashDrafter.from_pretrained(out).dflash2 == shipped.dflash2
    # A DFlash2 warm start continues as DFlash2, without the flag.
    again = tmp_path / "again"
    main([*common, "--out", str(again), "--init-from", str(out), "--max-steps", "1"])
    assert DFlashDrafter.from_pretrained(again).dflash2 == shipped.dflash2


@pytest.mark.parametrize("flags, error", [
    (["--draft-vocab", "8"], "a DFlash2 drafter proposes from the whole vocabulary: --draft-vocab 8 does not apply"),
    (["--drafter-kind", "ar"], None),
])
def test_dflash2_training_refuses_what_dflash2_has_not(tiny_dirs, tmp_path, flags, error, capsys):
    target_dir, drafter_dir = tiny_dirs
    _write_shard(tmp_path / "data", [([1, 2, 3, 4, 5, 6], 2)])
    argv = ["--target", str(target_dir), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
            "--init-from", str(drafter_dir), "--dflash2", "--heldout-frac", "0", "--no-progress", *flags]
    if error is None:
        with pytest.raises(SystemExit):
            main(argv)
        assert "--dflash2 trains a block-diffusion drafter; it does not go with --drafter-kind ar" in capsys.readouterr().err
    else:
        with pytest.raises(ConfigError, match=error):
            main(argv)


def _trained_tiny_dflash2(target_dir: Path, out: Path, steps: int, seed: int = 0, num_layers: int = 1,
                          **sizes) -> DFlashDrafter:
    """A DFlash drafter of block 4 for the target in `target_dir`, turned DFlash2 and trained for
    `steps` steps on the target's greedy continuations of random prompts; saved to `out` (bf16)."""
    target = Target.from_pretrained(target_dir)
    warm_dir = build_drafter(out.parent / "warm", target_dir, num_layers=num_layers, block_size=4, seed=seed)
    warm = DFlashDrafter.from_pretrained(warm_dir)
    drafter = to_dflash2(warm, **sizes)
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(6):
        prompt = torch.randint(0, target.vocab_size - 1, (3,), generator=gen).tolist()
        seqs.append(torch.tensor(prompt + list(run(target, prompt, max_new_tokens=24).output_ids)))
    trainer = DrafterTrainer(target, drafter, 4, 2.0)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for step in range(steps):
        opt.zero_grad()
        seq = seqs[step % len(seqs)]
        trainer.forward(seq, torch.arange(3, len(seq) - 1)).loss.backward()
        opt.step()
    drafter.save_pretrained(out)
    return DFlashDrafter.from_pretrained(out)


@pytest.mark.slow
def test_a_trained_dflash2_is_lossless(tmp_path, one_thread):
    """Greedy output token-identical to plain decoding, and sampled output distributed as the target's
    (chi-square, as test_sampling), with a DFlash2 drafter trained here rather than a random one."""
    target_dir = build_target(tmp_path / "target", vocab_size=4, logit_scale=1.0, hidden=16, num_layers=2, seed=3)
    drafter = _trained_tiny_dflash2(target_dir, tmp_path / "drafter", 30, conv_kernel_size=2, conv_group_size=8,
                                    selector_rank=2, selector_top_k=3)
    target = Target.from_pretrained(target_dir)
    for prompt in ([1, 2, 0], [3], [0, 0, 1, 2]):
        assert run(target, prompt, drafter, max_new_tokens=20).output_ids == run(target, prompt, max_new_tokens=20).output_ids
    assert_samples_follow_the_target(target, drafter)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM venv (.venv-vllm or $DFLASH_VLLM_VENV)")
def test_a_trained_dflash2_loads_in_vllm_and_drafts_the_same(tmp_path):
    """Two layers, as the shipped drafter has several: training moves each layer's norms apart, and the
    comparison must then apply every layer's own K norm to the context keys."""
    target_dir = build_qwen3_target(tmp_path / "target", vocab_size=12, hidden=64, num_layers=4, seed=3)
    drafter = _trained_tiny_dflash2(target_dir, tmp_path / "drafter", 30, num_layers=2, conv_kernel_size=2,
                                    conv_group_size=16, selector_rank=8, selector_top_k=4)
    k_norms = [layer.self_attn.k_norm.weight for layer in drafter.layers]
    assert not torch.equal(k_norms[0], k_norms[1])
    assert_drafts_equal_vllm(tmp_path, "--target", str(target_dir), "--drafter", str(tmp_path / "drafter"), min_blocks=20)
