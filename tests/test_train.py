"""Training pipeline: the training mask reproduces inference, a tiny drafter overfits, resume works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_core import DFlashDrafter, Target, run
from dflash_core.errors import ConfigError
from dflash_core.training.data import frequent_tokens, load_sequences, shard_range
from dflash_core.training.drafter_init import add_feature_layers, grow_drafter, init_from_target
from dflash_core.training.objective import (
    DrafterTrainer,
    acceptance_lengths,
    decode_walk,
    default_gamma,
    dense_block_mask,
    evaluate,
    slot_weights,
    walk_anchors,
)
from dflash_core.training.train import main, parse_args

PROMPTS = ["What is the capital of France?", "def add(a, b):"]


def _prompt_ids(target: Target, text: str) -> list[int]:
    out = target.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def _target_samples(target: Target, prompts, max_new_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt + the target's own greedy response, prompt length) per prompt: the datagen sample."""
    samples = []
    for text in prompts:
        prompt = _prompt_ids(target, text)
        samples.append((prompt + list(run(target, prompt, None, max_new_tokens=max_new_tokens).output_ids), len(prompt)))
    return samples


def overfit_setup(target_dir, data) -> tuple[Target, list[tuple[list[int], int]], list[str]]:
    """What the overfit tests share: the tiny target, its own greedy answers to PROMPTS (the samples,
    written to `data` as a shard), and the `train.py` arguments of a 1-layer block-4 drafter on them
    (full precision, no held-out split, every step logged); each test adds --out, its drafter's kind
    and its steps."""
    target = Target.from_pretrained(target_dir)
    samples = _target_samples(target, PROMPTS, 40)
    _write_shard(data, samples)
    return target, samples, [
        "--target", str(target_dir), "--data", str(data), "--layers", "1", "--block-size", "4",
        "--anchors-per-seq", "64", "--lr", "3e-3", "--warmup", "0.05", "--grad-accum", "2", "--heldout-frac", "0",
        "--amp", "none", "--save-every", "1000", "--log-every", "1", "--no-progress",
    ]


def _write_shard(directory, samples, index=0):
    """A shard in the datagen format (see dflash_core/training/datagen.py)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens = np.concatenate([np.asarray(ids) for ids, _ in samples]).astype(np.uint16)
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in samples])]).astype(np.int64)
    np.savez_compressed(
        directory / f"shard-{index:05d}.npz",
        tokens=tokens,
        offsets=offsets,
        prompt_lens=np.asarray([pl for _, pl in samples], dtype=np.int32),
        prompt_ids=np.asarray([f"test-{100 * index + i}" for i in range(len(samples))], dtype=np.str_),
        finished=np.ones(len(samples), dtype=bool),
        meta=np.asarray("{}"),
    )


def test_mask_and_weights():
    mask = dense_block_mask(torch.tensor([3, 5]), 8, 2)
    assert mask.shape == (4, 12)
    assert mask[0, :3].all() and not mask[0, 3:8].any()  # context strictly before the anchor
    assert mask[2, :5].all() and not mask[2, 5:8].any()
    assert mask[0, 8:10].all() and not mask[0, 10:].any()  # own block both ways, not the other block
    assert mask[3, 10:].all() and not mask[3, 8:10].any()
    assert default_gamma(16) == 7 and default_gamma(10) == 5 and default_gamma(8) == 4
    assert torch.allclose(slot_weights(4, 4.0), torch.exp(-torch.arange(3) / 4.0))


def test_training_forward_equals_inference(tiny_dirs, one_thread):
    target_dir, drafter_dir = tiny_dirs
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir)
    B = drafter.block_size
    torch.manual_seed(0)
    ids = torch.randint(4, target.vocab_size - 1, (40,))
    anchors = torch.tensor([10, 17, 25, 33, 38])  # the last block runs past the end of the sequence
    trainer = DrafterTrainer(target, drafter, B, default_gamma(B), amp_dtype=None)
    with torch.no_grad():
        out = trainer.forward(ids, anchors, dense=True)
    target.tap_layers(drafter.target_layer_ids)
    for j, a in enumerate(anchors.tolist()):
        target.reset()
        _, context = target.forward(ids[None, :a])
        block = torch.full((1, B), drafter.mask_token_id)
        block[0, 0] = ids[a]
        with torch.no_grad():
            hidden = drafter(target.embed(block), context, torch.arange(0, a + B)[None], cache=drafter.new_cache())
            ref = target.head(hidden[0, 1:])
        torch.testing.assert_close(out.logits[j], ref, atol=1e-5, rtol=1e-5)
    # Labels past the end of the sequence are skipped, the others are the next tokens.
    assert out.valid[-1].tolist() == [True] + [False] * (B - 2)
    assert out.labels[0].tolist() == ids[11 : 10 + B].tolist()


def test_soft_labels_are_the_targets_own_distribution(tiny_dirs, one_thread):
    target_dir, drafter_dir = tiny_dirs
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir)
    B, V = drafter.block_size, target.vocab_size
    torch.manual_seed(1)
    ids = torch.randint(4, V - 1, (30,))
    anchors = torch.tensor([5, 12, 26])  # the last block runs past the end
    hard = DrafterTrainer(target, drafter, B, 2.0)
    # Top-V soft labels are the full distribution, so the soft term is exactly -sum p log q.
    soft = DrafterTrainer(target, drafter, B, 2.0, soft_top_k=V, soft_weight=0.25)
    with torch.no_grad():
        h, s = hard.forward(ids, anchors, dense=True), soft.forward(ids, anchors, dense=True)
        p_target = target.model(input_ids=ids[None]).logits[0].float().softmax(-1)
    logq = s.logits.log_softmax(-1)
    src = (anchors[:, None] + torch.arange(B - 1)).clamp(max=len(ids) - 1)
    soft_ce = -(p_target[src] * logq).sum(-1)
    w = slot_weights(B, 2.0)[None].expand_as(s.labels) * (s.labels >= 0)
    expected = ((0.75 * -logq.gather(-1, s.labels.clamp(min=0)[..., None])[..., 0] + 0.25 * soft_ce) * w).sum() / w.sum()
    torch.testing.assert_close(s.loss, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.ce, h.loss)  # the greedy-label term alone is the plain loss
    assert not torch.allclose(s.loss, h.loss)


def test_overfit_save_load_and_resume(tiny_dirs, tmp_path, one_thread):
    target_dir, _ = tiny_dirs
    data, out = tmp_path / "data", tmp_path / "out"
    target, samples, common = overfit_setup(target_dir, data)
    common = [*common, "--out", str(out), "--init-from-target"]
    summary = main([*common, "--max-steps", "40"])
    assert summary["step"] == 40
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r["kind"] == "train"]
    assert losses[-1] < 0.5 * losses[0]

    drafter = DFlashDrafter.from_pretrained(out)  # the released format, as shipped
    assert drafter.block_size == 4 and drafter.mask_token_id not in {t for ids, _ in samples for t in ids}
    prompt, plen = samples[0][0][: samples[0][1]], samples[0][1]
    result = run(target, prompt, drafter, max_new_tokens=40)
    assert list(result.output_ids) == samples[0][0][plen:]  # lossless
    assert result.tau > 1.5
    trainer = DrafterTrainer(target, drafter, 4, default_gamma(4))
    est = evaluate(trainer, [(torch.tensor(samples[0][0]), plen, "x")], 64)
    assert est["val_tau"] > 1.5
    # Walking the teacher-forced lengths meets the blocks decoding ran, wherever a block's drafts
    # lie inside the sequence (past its end decoding verifies tokens the data does not have).
    seq = torch.tensor(samples[0][0])
    with torch.no_grad():
        every = trainer.forward(seq, torch.arange(plen, len(seq) - 1))
    walk = decode_walk(acceptance_lengths(every.logits, every.labels, every.valid)).tolist()
    inside = [b.accepted + 1 for b in result.blocks if b.position + 3 < len(seq)]
    assert walk[: len(inside)] == inside and max(inside) > 1 and len(walk) - len(inside) <= 1
    assert est["val_tau_decode"] == pytest.approx(sum(walk) / len(walk))
    # --walk-weight: those blocks weigh 3x the other anchors' in the loss.
    with torch.no_grad():
        weighted = trainer.forward(seq, torch.arange(plen, len(seq) - 1), walk_weight=3.0)
    per_anchor = torch.ones(every.labels.shape[0])
    per_anchor[walk_anchors(acceptance_lengths(every.logits, every.labels, every.valid))] = 3.0
    w = trainer.weights[None, :] * (every.labels >= 0) * per_anchor[:, None]
    hard = -every.logits.log_softmax(-1).gather(-1, every.labels.clamp(min=0)[..., None])[..., 0]
    assert float(weighted.loss) == pytest.approx(float((hard * w).sum() / w.sum()), rel=1e-5)
    assert float(weighted.loss) != pytest.approx(float(every.loss), rel=1e-3)

    summary = main([*common, "--max-steps", "45", "--resume"])
    assert summary["step"] == 45
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    resumed = [r["step"] for r in log if r["kind"] == "train"][len(losses):]
    assert resumed[0] == 41

    # A warm start from the shipped drafter begins where it ended, not from scratch.
    warm_out = tmp_path / "warm"
    warm_args = [a for a in common if a != "--init-from-target"]
    warm_args[warm_args.index(str(out))] = str(warm_out)
    main([*warm_args, "--init-from", str(out), "--max-steps", "2", "--walk-weight", "2"])
    warm_log = [json.loads(line) for line in (warm_out / "train_log.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in warm_log if r["kind"] == "train"][0] < 0.5 * losses[0]

    # The same warm start restricted to the 24 most frequent response tokens, learning the
    # target's top-8 distribution as well: the drafter ships them, drafts only them, and stays lossless.
    small_out = tmp_path / "small-vocab"
    warm_args[warm_args.index(str(warm_out))] = str(small_out)
    main([*warm_args, "--init-from", str(out), "--max-steps", "2", "--draft-vocab", "24", "--soft-labels", "8"])
    small = DFlashDrafter.from_pretrained(small_out)
    seqs = [(torch.tensor(ids), plen, "x") for ids, plen in samples]
    expected = frequent_tokens(seqs, 24, target.vocab_size, always=[target.tokenizer.eos_token_id])
    assert small.draft_vocab.tolist() == expected.tolist()
    result = run(target, prompt, small, max_new_tokens=40)
    assert list(result.output_ids) == samples[0][0][plen:]
    assert {t for b in result.blocks for t in b.draft_ids} <= set(small.draft_vocab.tolist())

    # A warm start that training only makes worse ships the warm drafter: step 0 is evaluated too.
    # Early stopping waits for the schedule's midpoint (step 3 of 6), not the first bad evaluation.
    data8, worse = tmp_path / "data8", tmp_path / "worse"
    _write_shard(data8, samples * 4)  # ids test-3, -4, -7 of these 8 fall in a held-out half
    worse_args = [a for a in common if a != "--init-from-target"]
    worse_args[worse_args.index(str(data))], worse_args[worse_args.index(str(out))] = str(data8), str(worse)
    main([*worse_args, "--init-from", str(out), "--max-steps", "6", "--heldout-frac", "0.5", "--lr", "1.0",
          "--warmup", "0", "--eval-every", "1", "--patience", "1"])
    records = [json.loads(line) for line in (worse / "train_log.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1, 2, 3] and [r["best"] for r in evals] == [True, False, False, False]
    assert records[-1]["kind"] == "done" and records[-1]["stop_reason"] == "early_stopping"
    shipped, warm = DFlashDrafter.from_pretrained(worse).state_dict(), DFlashDrafter.from_pretrained(out).state_dict()
    assert all(torch.equal(shipped[k], warm[k]) for k in warm)


def test_shards_option_picks_shard_files_by_position(tmp_path):
    for index in (3, 7, 12):  # gaps in the numbering: positions, not numbers, count
        _write_shard(tmp_path, [([1, 2, 3, 4], 1), ([5, 6, 7], 2)], index=index)
    shard_numbers = lambda shards: sorted({int(k.split("-")[1]) // 100 for _, _, k in load_sequences(tmp_path, 64, shards=shards)})
    assert shard_numbers(None) == [3, 7, 12]
    assert shard_numbers(shard_range("1:")) == [7, 12]
    assert shard_numbers(shard_range(":1")) == [3]
    assert shard_numbers(shard_range("2:,0:3:2")) == [3, 12]  # a union, each shard once
    assert shard_numbers(shard_range("::2,1:2")) == [3, 7, 12]
    for bad in ("40", "1:2:3:4", "a:", "1:,", "::0", "1:9:00"):  # argparse's exit on a malformed range
        with pytest.raises(SystemExit):
            parse_args(["--target", "t", "--data", str(tmp_path), "--out", "o", "--shards", bad])


def test_decode_walk_starts_each_block_after_the_previous_bonus():
    assert decode_walk(torch.tensor([2, 1, 3, 1, 1, 4, 1, 1, 2])).tolist() == [2, 3, 4]
    assert decode_walk(torch.tensor([1, 1, 1])).tolist() == [1, 1, 1]
    assert walk_anchors(torch.tensor([2, 1, 3, 1, 1, 4, 1, 1, 2])).tolist() == [0, 2, 5]


@pytest.mark.parametrize("flags", [["--walk-weight", "0"], ["--soft-labels", "8", "--soft-weight", "1.5"]])
def test_bad_loss_weights_stop_before_anything_loads(flags, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--target", "t", "--data", "d", "--out", "o", *flags])
    assert flags[-2] in capsys.readouterr().err


def test_frequent_tokens_ranks_response_tokens_only():
    seqs = [(torch.tensor([9, 9, 9, 5, 5, 7]), 3, "a"), (torch.tensor([8, 7, 5]), 1, "b")]
    # responses: [5, 5, 7] and [7, 5]: 5 x3, 7 x2; 9 and 8 are prompt tokens only.
    assert frequent_tokens(seqs, 2, 10).tolist() == [5, 7]
    assert frequent_tokens(seqs, 3, 10, always=[9]).tolist() == [9, 5, 7]
    assert frequent_tokens(seqs, 4, 10).tolist() == [5, 7, 0, 1]  # zero counts in id order


@pytest.mark.filterwarnings("ignore")
def test_flex_block_mask_equals_dense(tiny_dirs, one_thread):
    """The GPU path (Flex Attention BlockMask) computes what the dense CPU mask does (eager here)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    target_dir, drafter_dir = tiny_dirs
    assert_flex_equals_dense(Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir))


def assert_flex_equals_dense(target, drafter):
    """The training forward's logits under the Flex Attention mask equal those under the dense one."""
    trainer = DrafterTrainer(target, drafter, drafter.block_size, 4.0)
    ids = torch.randint(4, target.vocab_size - 1, (40,), generator=torch.Generator().manual_seed(3))
    anchors = torch.tensor([10, 20, 30, 38])
    with torch.no_grad():
        dense = trainer.forward(ids, anchors, dense=True).logits
        flex = trainer.forward(ids, anchors, dense=False).logits
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_init_from_target_copies_layers_and_calibrates_qk_gains(tiny_dirs, one_thread):
    """A Llama target has no q/k norms: the drafter's gains must be the target's measured q/k RMS,
    so the copied heads keep their attention logit scale instead of attending almost uniformly."""
    target_dir, drafter_dir = tiny_dirs
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir)
    samples = [torch.randint(4, target.vocab_size - 1, (30,)) for _ in range(3)]
    n, first = len(drafter.layers), target.num_layers - len(drafter.layers)
    src = target.layers[first + n - 1].self_attn
    with torch.no_grad():
        src.q_proj.weight.mul_(50.0)  # a trained target's queries are large; random ones are tiny
    init_from_target(drafter, target, samples)
    assert torch.equal(drafter.layers[-1].self_attn.k_proj.weight, src.k_proj.weight)
    assert torch.equal(drafter.hidden_norm.weight, target.layers[first].input_layernorm.weight)
    # The expected gain, computed independently: per-element RMS of the last layer's queries.
    captured = []
    hook = src.q_proj.register_forward_hook(lambda _m, _i, out: captured.append(out.flatten()))
    with torch.no_grad():
        for ids in samples:
            target.model(input_ids=ids[None])
    hook.remove()
    expected = torch.cat(captured).pow(2).mean().sqrt()
    gain = drafter.layers[-1].self_attn.q_norm.weight
    torch.testing.assert_close(gain, expected.expand_as(gain), rtol=1e-4, atol=1e-6)
    assert float(expected) > 1.5  # well above the floor of 1, so the test tells the two apart
    # Tiny random queries would give gains below 1; those are floored at 1 (no flatter than unit RMS).
    assert torch.equal(drafter.layers[0].self_attn.q_norm.weight, torch.ones_like(gain))


def _trains_from_the_same_logits(target, warm, changed):
    """Assert that `changed` (a reshaped `warm`) gives warm's training logits; its trainer and batch."""
    ids = torch.randint(4, target.vocab_size - 1, (40,), generator=torch.Generator().manual_seed(5))
    anchors = torch.tensor([10, 20, 30])
    before = DrafterTrainer(target, warm, warm.block_size, 4.0)
    after = DrafterTrainer(target, changed, changed.block_size, 4.0)
    with torch.no_grad():
        torch.testing.assert_close(after.forward(ids, anchors).logits, before.forward(ids, anchors).logits,
                                   atol=1e-6, rtol=1e-6)
    return after, ids, anchors


def test_grown_drafter_computes_what_the_warm_one_did_and_trains_its_new_layers(tiny_dirs, one_thread):
    """Growing appends target-initialised layers whose residual branches start at zero: the same
    drafts as before growth, yet one optimizer step moves the new layers."""
    target_dir, drafter_dir = tiny_dirs
    target, warm = Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)
    have = len(warm.layers)
    grown = grow_drafter(warm, target, have + 2)
    assert len(grown.layers) == have + 2 and grown.config.num_hidden_layers == have + 2
    assert len(grown.config.layer_types) == have + 2
    assert torch.equal(grown.layers[-1].mlp.gate_proj.weight, target.layers[-1].mlp.gate_proj.weight)
    assert not grown.layers[-1].self_attn.o_proj.weight.any() and not grown.layers[-1].mlp.down_proj.weight.any()
    after, ids, anchors = _trains_from_the_same_logits(target, warm, grown)
    prompt = _prompt_ids(target, PROMPTS[0])
    assert run(target, prompt, grown, max_new_tokens=12).output_ids == run(target, prompt, warm, max_new_tokens=12).output_ids

    new_layer = grown.layers[-1]
    loss = after.forward(ids, anchors).loss
    loss.backward()
    assert float(new_layer.self_attn.o_proj.weight.grad.abs().sum()) > 0
    assert float(new_layer.mlp.down_proj.weight.grad.abs().sum()) > 0
    with pytest.raises(ConfigError, match="grow, not shrink"):
        grow_drafter(warm, target, have - 1)


def test_drafter_given_more_target_layers_computes_what_it_did_and_learns_to_read_them(tiny_dirs, one_thread, tmp_path):
    """A target layer added between the warm drafter's own gets zero `fc` columns: the same logits
    and drafts as before (the old columns moved to their new places), a gradient on the new
    columns, and a checkpoint that the engine loads reading the new layer."""
    target_dir, drafter_dir = tiny_dirs
    target, warm = Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)
    first, last = warm.target_layer_ids
    assert last - first >= 2
    layer_ids = [first, first + 1, last]
    wider = add_feature_layers(warm, layer_ids)
    h = warm.config.hidden_size
    assert wider.target_layer_ids == layer_ids and wider.fc.weight.shape == (h, 3 * h)
    assert not wider.fc.weight[:, h:2 * h].any()
    after, ids, anchors = _trains_from_the_same_logits(target, warm, wider)
    after.forward(ids, anchors).loss.backward()
    assert float(wider.fc.weight.grad[:, h:2 * h].abs().sum()) > 0

    wider.save_pretrained(tmp_path / "wider", dtype=torch.float32)
    reloaded = DFlashDrafter.from_pretrained(tmp_path / "wider")
    assert reloaded.target_layer_ids == layer_ids
    prompt = _prompt_ids(target, PROMPTS[0])
    assert run(target, prompt, reloaded, max_new_tokens=12).output_ids == run(target, prompt, warm, max_new_tokens=12).output_ids
    with pytest.raises(ConfigError, match="keep the warm drafter's"):
        add_feature_layers(warm, [first, first + 1])
    with pytest.raises(ConfigError, match="each layer once"):
        add_feature_layers(warm, [first, first, last])


@pytest.mark.slow
def test_two_process_ddp_run(tiny_dirs, tmp_path):
    """The documented torchrun path, on CPU with gloo: ranks take equal shares of the data (5 train
    sequences: 2 each, so both run 2 steps per epoch), rank 0 alone evaluates, logs and saves, and
    every rank exits (an uneven split or a late DDP teardown would leave a rank hanging)."""
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    samples = _target_samples(target, PROMPTS * 4, 30)
    data, out = tmp_path / "data", tmp_path / "out"
    _write_shard(data, samples)  # ids test-3, -4, -7 are held out at --heldout-frac 0.5
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "dflash_core.training.train",
         "--target", str(target_dir), "--data", str(data), "--out", str(out), "--layers", "1", "--block-size", "4",
         "--anchors-per-seq", "16", "--grad-accum", "1", "--epochs", "2", "--heldout-frac", "0.5", "--eval-every", "2",
         "--amp", "none", "--no-progress", "--log-every", "1", "--init-from-target", "--threads", "1"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "5 train / 3 held-out" in proc.stderr and "2 steps per epoch, up to 4 steps" in proc.stderr
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["kind"] == "train"] == [1, 2, 3, 4]  # one writer: rank 0
    assert [r["step"] for r in log if r["kind"] == "eval"] == [0, 2, 4]
    assert log[-1]["kind"] == "done" and log[-1]["step"] == 4 and log[-1]["epoch"] == 1
    drafter = DFlashDrafter.from_pretrained(out)
    prompt = samples[0][0][: samples[0][1]]
    assert list(run(target, prompt, drafter, max_new_tokens=30).output_ids) == samples[0][0][samples[0][1]:]


def test_text_data_is_trained_on_with_target_labels_and_never_evaluated(tiny_dirs, tmp_path, one_thread, monkeypatch):
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    prompt = _prompt_ids(target, PROMPTS[0])
    own = list(run(target, prompt, None, max_new_tokens=24).output_ids)
    torch.manual_seed(3)
    text = prompt + torch.randint(4, target.vocab_size - 1, (24,)).tolist()  # not what the target writes
    data, text_dir, out = tmp_path / "data", tmp_path / "text", tmp_path / "out"
    _write_shard(data, [(prompt + own, len(prompt))] * 4)
    _write_shard(text_dir, [(text, len(prompt))] * 2, index=5)  # keys test-500, test-501
    calls = []
    forward = DrafterTrainer.forward

    def spy(self, ids, anchors, *args, key=None, target_labels=False, **kwargs):
        calls.append((key, target_labels))
        return forward(self, ids, anchors, *args, key=key, target_labels=target_labels, **kwargs)

    monkeypatch.setattr(DrafterTrainer, "forward", spy)
    summary = main([
        "--target", str(target_dir), "--data", str(data), "--text-data", str(text_dir), "--out", str(out),
        "--layers", "1", "--block-size", "4", "--init-from-target", "--amp", "none", "--grad-accum", "3",
        "--heldout-frac", "0.5", "--max-steps", "4", "--eval-every", "2", "--no-progress",
    ])
    assert summary["step"] == 4 and summary["best_val_tau"] > 0
    text_calls = {flag for key, flag in calls if key in ("test-500", "test-501")}
    assert text_calls == {True}  # trained on, always labelled by the target, never evaluated
    assert {flag for key, flag in calls if key not in ("test-500", "test-501")} == {False}
