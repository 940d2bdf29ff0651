"""The input-fusion drafter (`context_fusion` "input"), DFlash's ablation: the target's features enter
once, as rows of the drafter's sequence, and no layer sees them in its keys and values. Its config,
the training forward against decoding over several cycles, its keys' and values' sources, training
and resuming, and lossless decoding (greedy identity, chi-square with sampling)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_train import assert_flex_equals_dense, overfit_setup
from tiny import build_fusion_drafter, build_target

from dflash_core import DFlashDrafter, SamplingParams, Target, run
from dflash_core.errors import ConfigError
from dflash_core.models.config import parse_drafter_config
from dflash_core.models.drafter import method_name
from dflash_core.models.native_format import native_config
from dflash_core.training.objective import DrafterTrainer, default_gamma, dense_block_mask
from dflash_core.training.train import main


@pytest.fixture(scope="module")
def fusion_pair(tiny_dirs, tmp_path_factory):
    """The tiny target, its input-fusion drafter, and the same weights as a DFlash (KV injection) drafter."""
    target_dir, _ = tiny_dirs
    root = tmp_path_factory.mktemp("fusion")
    fusion = DFlashDrafter.from_pretrained(build_fusion_drafter(root / "input", target_dir))
    kv = DFlashDrafter.from_pretrained(build_fusion_drafter(root / "kv", target_dir, context_fusion="kv"))
    assert all(torch.equal(a, b) for a, b in zip(fusion.state_dict().values(), kv.state_dict().values()))
    return Target.from_pretrained(target_dir), fusion, kv


def test_config_round_trip_and_refusals(tiny_dirs, tmp_path, fusion_pair):
    _, drafter_dir = tiny_dirs
    _, fusion, _ = fusion_pair
    assert fusion.input_fusion and method_name(fusion) == "fusion"
    fusion.save_pretrained(tmp_path / "saved")
    raw = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert raw["dflash_config"]["context_fusion"] == "input" and raw["architectures"] == ["DFlashInputFusionDraftModel"]
    assert DFlashDrafter.from_pretrained(tmp_path / "saved").input_fusion
    # A DFlash drafter's config is written as released: no context_fusion key.
    DFlashDrafter.from_pretrained(drafter_dir).save_pretrained(tmp_path / "dflash")
    raw = json.loads((tmp_path / "dflash" / "config.json").read_text())
    assert "context_fusion" not in raw["dflash_config"] and "context_fusion" not in raw
    assert parse_drafter_config(raw).context_fusion == "kv"

    def config(**dflash):
        return {**raw, "dflash_config": {**raw["dflash_config"], **dflash}}

    with pytest.raises(ConfigError, match=r"context_fusion must be one of \('kv', 'input'\), got 'inputs'"):
        parse_drafter_config(config(context_fusion="inputs"))
    with pytest.raises(ConfigError, match="'input' is implemented for DFlashDraftModel drafters only; .*DFlashAR"):
        parse_drafter_config({**config(context_fusion="input"), "architectures": ["DFlashARDraftModel"]})
    # The architecture alone says input fusion; it may not say KV injection too.
    named = {**raw, "architectures": ["DFlashInputFusionDraftModel"]}
    assert parse_drafter_config(named).context_fusion == "input"
    with pytest.raises(ConfigError, match="DFlashInputFusionDraftModel drafter fuses the context at its input"):
        parse_drafter_config({**named, "dflash_config": {**raw["dflash_config"], "context_fusion": "kv"}})
    with pytest.raises(ConfigError, match="input-fusion drafter .* cannot be exported"):
        native_config(fusion.config)


def test_training_forward_equals_decoding_across_cycles(fusion_pair, one_thread):
    """The training forward's block at each anchor gives the logits of the draft step that decoding
    runs there, with the drafter cache grown cycle by cycle (context committed, blocks not)."""
    target, drafter, kv = fusion_pair
    B = drafter.block_size
    ids = torch.randint(4, target.vocab_size - 1, (40,), generator=torch.Generator().manual_seed(0))
    anchors = torch.tensor([10, 11, 15, 22, 23, 30, 38])  # cycles of 1 to 8 new positions; the last runs past the end
    trainer = DrafterTrainer(target, drafter, B, default_gamma(B))
    with torch.no_grad():
        out = trainer.forward(ids, anchors, dense=True)
        kv_out = DrafterTrainer(target, kv, B, default_gamma(B)).forward(ids, anchors, dense=True)
    target.tap_layers(drafter.target_layer_ids)
    target.reset()
    _, features = target.forward(ids[None])
    cache, seen = drafter.new_cache(), 0
    for j, a in enumerate(anchors.tolist()):
        block = torch.full((1, B), drafter.mask_token_id)
        block[0, 0] = ids[a]
        with torch.no_grad():
            hidden = drafter(target.embed(block), features[:, seen:a], torch.arange(seen, a + B)[None], cache=cache)
        assert cache.length == a  # the new context is kept, the block is not
        torch.testing.assert_close(out.logits[j], target.head(hidden[0, 1:]), atol=1e-5, rtol=1e-5)
        seen = a
    # The same weights with KV injection compute something else: the test tells the two apart.
    assert not torch.allclose(out.logits, kv_out.logits, atol=1e-3)


def test_training_mask_of_the_context_rows():
    mask = dense_block_mask(torch.tensor([3, 5]), 8, 2, fused=True)
    assert mask.shape == (12, 12)
    assert torch.equal(mask[:8, :8], torch.ones(8, 8, dtype=torch.bool).tril()) and not mask[:8, 8:].any()
    assert torch.equal(mask[8:], dense_block_mask(torch.tensor([3, 5]), 8, 2))


@pytest.mark.filterwarnings("ignore")
def test_flex_mask_equals_dense(fusion_pair, one_thread):
    """The GPU path's Flex Attention mask with the context rows computes what the dense one does (eager here)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    target, drafter, _ = fusion_pair
    assert_flex_equals_dense(target, drafter)


def _key_value_sources(drafter, target, ids) -> list[dict]:
    """Per layer, in one draft step with a cache: the layer's input rows, and the rows its k_proj and
    v_proj projected; and the layer's output."""
    seen = [{} for _ in drafter.layers]
    hooks = []
    for i, layer in enumerate(drafter.layers):
        hooks += [
            layer.register_forward_pre_hook(lambda _m, args, i=i: seen[i].update(x=args[0])),
            layer.register_forward_hook(lambda _m, _args, out, i=i: seen[i].update(out=out)),
            layer.self_attn.k_proj.register_forward_pre_hook(lambda _m, args, i=i: seen[i].update(k=args[0])),
            layer.self_attn.v_proj.register_forward_pre_hook(lambda _m, args, i=i: seen[i].update(v=args[0])),
        ]
    target.tap_layers(drafter.target_layer_ids)
    target.reset()
    _, features = target.forward(ids[None])
    block = torch.full((1, drafter.block_size), drafter.mask_token_id)
    try:
        with torch.no_grad():
            drafter(target.embed(block), features, torch.arange(len(ids) + drafter.block_size)[None],
                    cache=drafter.new_cache())
    finally:
        for hook in hooks:
            hook.remove()
    return seen, features


def _keys_and_values_are_the_layers_own(drafter, seen) -> list[bool]:
    """Per layer: whether every row k_proj and v_proj projected is the layer's own input row, normed."""
    own = []
    for layer, s in zip(drafter.layers, seen):
        with torch.no_grad():
            normed = layer.input_layernorm(s["x"])
        own.append(s["k"].shape == normed.shape and torch.equal(s["k"], normed) and torch.equal(s["v"], normed))
    return own


def test_the_layers_keys_and_values_never_see_the_context_features(fusion_pair, one_thread):
    """Input fusion: every layer's keys and values come from its own input rows, and the features are
    in the input of layer 0 only (later layers take the layer before's output). DFlash's KV
    injection fails the first check at every layer: its keys and values also project `c` directly."""
    target, drafter, kv = fusion_pair
    ids = torch.randint(4, target.vocab_size - 1, (12,), generator=torch.Generator().manual_seed(2))
    seen, features = _key_value_sources(drafter, target, ids)
    assert _keys_and_values_are_the_layers_own(drafter, seen) == [True] * len(drafter.layers)
    with torch.no_grad():
        context = drafter.hidden_norm(drafter.fc(features))
    assert torch.equal(seen[0]["x"][:, : len(ids)], context)
    assert all(seen[i]["x"] is seen[i - 1]["out"] for i in range(1, len(seen)))
    kv_seen, _ = _key_value_sources(kv, target, ids)
    assert _keys_and_values_are_the_layers_own(kv, kv_seen) == [False] * len(kv.layers)


def random_prompts(vocab, n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(vocab - 1) for _ in range(rng.randint(1, 12))] for _ in range(n)]


def test_greedy_decoding_is_token_identical_to_plain(fusion_pair, one_thread):
    target, drafter, _ = fusion_pair
    for prompt in random_prompts(target.vocab_size, 2):
        plain = run(target, prompt, max_new_tokens=20).output_ids
        for block_size in (4, 8):
            fast = run(target, prompt, drafter, max_new_tokens=20, block_size=block_size)
            assert fast.output_ids == plain and fast.method == "fusion"


def test_a_fusion_run_is_explained_and_traced_in_dflashs_lane(fusion_pair, one_thread):
    from dflash_core import trace as tr

    target, drafter, _ = fusion_pair
    summary = run(target, [3, 9, 4], drafter, max_new_tokens=12, block_size=4, explain=2)
    assert summary.method == "fusion" and tr.lane_of(summary.method) == "dflash"
    trace = tr.build_trace(settings=tr.settings_of(None, [3, 9, 4], 12, 4, SamplingParams()),
                           pair={"id": None, "target": "t", "drafter": "d", "trained_block_size": drafter.block_size},
                           runs={tr.lane_of(summary.method): summary}, vocab_size=target.vocab_size,
                           text_of=lambda t: f"tok{t}", device="cpu")
    read = tr.validate_trace(json.dumps(trace).encode())
    assert read["runs"]["dflash"]["method"] == "fusion"
    assert read["runs"]["dflash"]["output_ids"] == list(run(target, [3, 9, 4], max_new_tokens=12).output_ids)


def test_cuda_graph_steps_replay_input_fusion_drafts(fusion_pair, one_thread):
    """The static cache (CUDA graphs' padded context rows, here on the CPU stand-in) drafts what the
    dynamic one does."""
    from test_cuda_graphs import FakeGraphs, graphed

    target, drafter, _ = fusion_pair
    fake = FakeGraphs()
    on = graphed(target, fake)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, seed=4)):
        a, b = (run(t, [2, 7, 1, 3], drafter, max_new_tokens=16, sampling=sampling) for t in (target, on))
        assert b.output_ids == a.output_ids and [x.draft_ids for x in b.blocks] == [x.draft_ids for x in a.blocks]
    assert sum(fake.replays.values()) > 10


def test_overfit_save_load_resume_and_warm_start(tiny_dirs, tmp_path, one_thread):
    target_dir, _ = tiny_dirs
    out = tmp_path / "out"
    target, samples, common = overfit_setup(target_dir, tmp_path / "data")
    fresh = [*common, "--init-from-target", "--context-fusion", "input"]
    assert main([*fresh, "--out", str(out), "--max-steps", "30"])["step"] == 30
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r["kind"] == "train"]
    assert losses[-1] < 0.5 * losses[0]

    drafter = DFlashDrafter.from_pretrained(out)
    assert drafter.input_fusion and drafter.block_size == 4
    prompt, plen = samples[0][0][: samples[0][1]], samples[0][1]
    result = run(target, prompt, drafter, max_new_tokens=40)
    assert list(result.output_ids) == samples[0][0][plen:] and result.tau > 1.5
    # The shipped (bf16) drafter is the trained one: the float32 checkpoint --resume reads, rounded,
    # drafts exactly what it drafts.
    resumable = DFlashDrafter.from_pretrained(out / "checkpoint")
    assert resumable.input_fusion
    with torch.no_grad():
        for param in resumable.parameters():
            param.copy_(param.to(torch.bfloat16))
    again = run(target, prompt, resumable, max_new_tokens=40)
    assert [b.draft_ids for b in again.blocks] == [b.draft_ids for b in result.blocks]

    assert main([*fresh, "--out", str(out), "--max-steps", "34", "--resume"])["step"] == 34
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    resumed = [r for r in log if r["kind"] == "train"][len(losses):]
    assert resumed[0]["step"] == 31 and resumed[0]["loss"] < 0.5 * losses[0]  # where it stopped, not anew
    with pytest.raises(ConfigError, match="--context-fusion kv does not match the checkpoint"):
        main([*common, "--out", str(out), "--max-steps", "35", "--resume", "--context-fusion", "kv"])
    with pytest.raises(ConfigError, match="first-release DFlash drafter only, not the autoregressive drafter"):
        main([*fresh, "--out", str(tmp_path / "ar"), "--max-steps", "1", "--drafter-kind", "ar"])

    # Both kinds start from the same weights: from the target's layers with the same seed, and from a
    # DFlash drafter (with a learning rate of 0 the shipped drafter is its start).
    starts = {}
    for fusion in ("kv", "input"):
        main([*common, "--init-from-target", "--context-fusion", fusion, "--out", str(tmp_path / f"start-{fusion}"),
              "--max-steps", "1", "--lr", "0"])
        starts[fusion] = DFlashDrafter.from_pretrained(tmp_path / f"start-{fusion}")
    assert starts["input"].input_fusion and not starts["kv"].input_fusion
    kv_start, input_start = (starts[k].state_dict().values() for k in ("kv", "input"))
    assert all(torch.equal(a, b) for a, b in zip(kv_start, input_start))
    warm = tmp_path / "warm"
    main([*common, "--init-from", str(tmp_path / "start-kv"), "--context-fusion", "input", "--out", str(warm),
          "--max-steps", "1", "--lr", "0"])
    warmed = DFlashDrafter.from_pretrained(warm)
    assert warmed.input_fusion
    assert all(torch.equal(a, b) for a, b in zip(starts["kv"].state_dict().values(), warmed.state_dict().values()))


@pytest.mark.slow
def test_sampling_matches_exact_target_distribution(tmp_path):
    """Sampled drafts and the rejection rule: the output follows the target's exact distribution
    (chi-square, as test_sampling does for the other drafters)."""
    from test_sampling import assert_samples_follow_the_target

    target_dir = build_target(tmp_path / "target", vocab_size=4, logit_scale=1.0, hidden=16, num_layers=2, seed=3)
    drafter_dir = build_fusion_drafter(tmp_path / "drafter", target_dir, num_layers=1, block_size=4, seed=4)
    assert_samples_follow_the_target(Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir))
