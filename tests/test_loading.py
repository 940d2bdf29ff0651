"""Loading released-format drafters and targets, and every bad input the engine must name."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build_drafter

from dflash_core import DFlashDrafter, Target, load_pair, run, validate_pair
from dflash_core.errors import CheckpointError, ConfigError, GenerationInputError, PairMismatchError
from dflash_core.models.config import default_target_layer_ids, parse_drafter_config


def test_default_target_layer_ids_match_spec_examples():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    assert default_target_layer_ids(30, 1) == [15]
    # Python's round: halves go to even (1 + 1.5 = 2.5 -> 2).
    assert default_target_layer_ids(7, 3) == [1, 2, 4]


def test_dflash_keys_prefer_dflash_config_over_top_level(golden_dir):
    raw = json.loads((golden_dir / "drafter" / "config.json").read_text())
    raw["block_size"] = 4
    raw["dflash_config"]["block_size"] = 16
    config = parse_drafter_config(raw)
    assert (config.block_size, config.mask_token_id, config.target_layer_ids) == (16, 511, [1, 3, 5])
    del raw["dflash_config"]["target_layer_ids"]
    assert parse_drafter_config(raw).target_layer_ids == default_target_layer_ids(8, 2)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r["dflash_config"].pop("mask_token_id"), "mask_token_id"),
        (lambda r: r.pop("block_size"), "block_size"),
        (lambda r: r["dflash_config"].update(mask_token_id=10**6), "outside the vocabulary"),
    ],
)
def test_bad_drafter_configs_are_named(golden_dir, edit, message):
    raw = json.loads((golden_dir / "drafter" / "config.json").read_text())
    edit(raw)
    with pytest.raises(ConfigError, match=message):
        parse_drafter_config(raw)


def test_tiny_pair_uses_defaults_from_config(tiny_pair):
    target, drafter = tiny_pair
    assert drafter.block_size == 8  # read from dflash_config
    assert drafter.target_layer_ids == default_target_layer_ids(target.num_layers, 2)
    assert not target.model.config.tie_word_embeddings


def test_save_and_reload_round_trip(tmp_path, golden_dir, golden_pair):
    target, drafter = golden_pair
    drafter.save_pretrained(tmp_path / "copy", dtype=torch.float32)
    again = DFlashDrafter.from_pretrained(tmp_path / "copy")
    prompt = [447, 130, 441]
    assert run(target, prompt, again, max_new_tokens=16).output_ids == run(target, prompt, drafter, max_new_tokens=16).output_ids


def copy_drafter(src, dst, mutate):
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    mutate(state)
    save_file(state, dst / "model.safetensors")
    return dst


def test_missing_and_unexpected_keys_are_listed(tmp_path, golden_dir):
    def mutate(state):
        state.pop("layers.1.mlp.up_proj.weight")
        state["model.extra.weight"] = torch.zeros(1)

    bad = copy_drafter(golden_dir / "drafter", tmp_path / "bad", mutate)
    with pytest.raises(CheckpointError, match=r"missing keys \['layers.1.mlp.up_proj.weight'\].*unexpected keys \['model.extra.weight'\]"):
        DFlashDrafter.from_pretrained(bad)


def test_wrong_shape_is_named(tmp_path, golden_dir):
    def mutate(state):
        state["fc.weight"] = torch.zeros(64, 128)

    bad = copy_drafter(golden_dir / "drafter", tmp_path / "bad", mutate)
    with pytest.raises(CheckpointError, match=r"fc.weight has shape \(64, 128\).*\(64, 192\)"):
        DFlashDrafter.from_pretrained(bad)


def test_missing_files_and_dirs(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        DFlashDrafter.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="missing config.json, model.safetensors"):
        DFlashDrafter.from_pretrained(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="not found"):
        Target.from_pretrained(tmp_path / "nowhere")


def test_mismatched_pairs_name_both_values(golden_pair, tiny_pair, tiny_dirs, tmp_path):
    golden_target, golden_drafter = golden_pair
    tiny_target, tiny_drafter = tiny_pair
    with pytest.raises(PairMismatchError, match="hidden_size 64 does not match the target's hidden_size 32"):
        validate_pair(tiny_target, golden_drafter)
    with pytest.raises(PairMismatchError, match=r"block_size 9 must be between 1 and the drafter's trained block size 8"):
        validate_pair(golden_target, golden_drafter, block_size=9)
    target_dir, _ = tiny_dirs
    deep = build_drafter(tmp_path / "deep", target_dir, dflash_config={"mask_token_id": 3, "block_size": 8, "target_layer_ids": [1, 6]})
    with pytest.raises(PairMismatchError, match=r"target_layer_ids \[1, 6\] include \[6\], outside the target's 6 layers"):
        load_pair(target_dir, deep, block_size=None)
    other = build_drafter(tmp_path / "other", target_dir, num_target_layers=12)
    with pytest.raises(PairMismatchError, match="trained on a target with 12 layers; this target has 6"):
        load_pair(target_dir, other)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt=[]), "prompt is empty"),
        (dict(prompt=[1, 99999]), r"outside the target vocabulary of size 512"),
        (dict(max_new_tokens=0), "max_new_tokens must be at least 1"),
        (dict(block_size=0), "block_size 0 must be between 1 and"),
        (dict(block_size=9), "block_size 9 must be between 1 and the drafter's trained block size 8"),
        (dict(prompt=[1] * 500), "exceeds the target's context of 512 positions"),
        (dict(draft_mode="beam"), "draft_mode"),
    ],
)
def test_bad_generation_inputs_are_named(golden_pair, kwargs, message):
    target, drafter = golden_pair
    prompt = kwargs.pop("prompt", [1, 2, 3])
    with pytest.raises(GenerationInputError, match=message):
        run(target, prompt, drafter, **{"max_new_tokens": 8, **kwargs})


def test_sliding_window_layers_limit_what_the_block_sees(tmp_path, tiny_dirs):
    """A `sliding_attention` layer sees only the last `sliding_window` positions; a window wider
    than the context changes nothing."""
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    prompt = list(range(5, 45))
    drafts = {}
    for name, window in (("full", None), ("wide", 4096), ("narrow", 4)):
        extra = {} if window is None else {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": window}
        path = build_drafter(tmp_path / name, target_dir, seed=7, **extra)
        drafter = DFlashDrafter.from_pretrained(path)
        assert drafter.layers[0].self_attn.sliding_window == window
        drafts[name] = [b.draft_ids for b in run(target, prompt, drafter, max_new_tokens=6).blocks]
    assert drafts["wide"] == drafts["full"]
    assert drafts["narrow"] != drafts["full"]


def test_draft_vocabulary_round_trips_and_stays_lossless(tmp_path, tiny_dirs, tiny_pair):
    """A drafter restricted to a few ids keeps them through a bf16 save, drafts only them, and
    decoding stays token-identical to plain decoding."""
    target_dir, _ = tiny_dirs
    target, _ = tiny_pair
    vocab = list(range(target.vocab_size - 2, 3, -7))
    src = build_drafter(tmp_path / "src", target_dir, draft_vocab=vocab)
    DFlashDrafter.from_pretrained(src).save_pretrained(tmp_path / "bf16")  # the shipped dtype
    drafter = DFlashDrafter.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    assert drafter.draft_vocab.dtype == torch.int64 and drafter.draft_vocab.tolist() == vocab
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["draft_vocab_size"] == len(vocab)
    for prompt in ([5, 9, 11], [40, 2]):
        fast = run(target, prompt, drafter, max_new_tokens=24)
        assert fast.output_ids == run(target, prompt, max_new_tokens=24).output_ids
        assert {t for b in fast.blocks for t in b.draft_ids} <= set(vocab)


def test_draft_vocabulary_is_stored_as_vllm_reads_it(tmp_path, tiny_dirs, tiny_pair):
    """EAGLE-3's form, as vLLM 0.32's DFlash loader reads it: draft index i proposes target id
    i + d2t[i], scored by row i of lm_head.weight (the target's row for that id); the size is a
    top-level key. No tensor of the older form is left."""
    target_dir, _ = tiny_dirs
    target, _ = tiny_pair
    vocab = [9, 3, target.vocab_size - 1, 4]
    d = build_drafter(tmp_path / "d", target_dir, draft_vocab=vocab)
    state = load_file(d / "model.safetensors")
    assert "draft_vocab" not in state and state["d2t"].dtype == torch.int64
    assert (state["d2t"] + torch.arange(len(vocab))).tolist() == vocab
    assert torch.equal(state["lm_head.weight"], target.head.weight.detach()[vocab])
    raw = json.loads((d / "config.json").read_text())
    assert raw["draft_vocab_size"] == len(vocab) and "draft_vocab_size" not in raw["dflash_config"]


def test_draft_vocabulary_of_the_older_form_still_loads(tmp_path, tiny_dirs, tiny_pair):
    """Files written before vLLM support (a `draft_vocab` tensor of target ids, the size in
    dflash_config) load unchanged and save in the new form once the target's head is given."""
    target_dir, _ = tiny_dirs
    target, _ = tiny_pair
    vocab = [7, 2, 30, 11]
    d = build_drafter(tmp_path / "d", target_dir, draft_vocab=vocab)
    state = load_file(d / "model.safetensors")
    state["draft_vocab"] = state.pop("d2t") + torch.arange(len(vocab))
    del state["lm_head.weight"]
    save_file(state, d / "model.safetensors")
    raw = json.loads((d / "config.json").read_text())
    raw["dflash_config"]["draft_vocab_size"] = raw.pop("draft_vocab_size")
    (d / "config.json").write_text(json.dumps(raw))
    old = DFlashDrafter.from_pretrained(d)
    assert old.draft_vocab.tolist() == vocab and old.head_copy is None
    validate_pair(target, old)
    with pytest.raises(CheckpointError, match="pass lm_head=target.head"):
        old.save_pretrained(tmp_path / "new")
    old.save_pretrained(tmp_path / "new", dtype=torch.float32, lm_head=target.head)
    new = DFlashDrafter.from_pretrained(tmp_path / "new")
    assert new.draft_vocab.tolist() == vocab and torch.equal(new.head_copy, target.head.weight.detach()[vocab])
    prompt = [5, 9, 11]
    assert [b.draft_ids for b in run(target, prompt, new, max_new_tokens=12).blocks] == [
        b.draft_ids for b in run(target, prompt, old, max_new_tokens=12).blocks
    ]


def test_draft_vocabulary_head_of_another_target_is_named(tmp_path, tiny_dirs, tiny_pair):
    target_dir, _ = tiny_dirs
    target, _ = tiny_pair
    d = build_drafter(tmp_path / "d", target_dir, draft_vocab=[1, 2, 3])
    state = load_file(d / "model.safetensors")
    state["lm_head.weight"] = state["lm_head.weight"] * 1.1
    save_file(state, d / "model.safetensors")
    with pytest.raises(PairMismatchError, match="saved for another target"):
        validate_pair(target, DFlashDrafter.from_pretrained(d))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.update(d2t=s["d2t"][:2]), "d2t of shape"),
        (lambda s: s.update(d2t=s["d2t"] - 100), "outside 0"),
        (lambda s: s.update({"lm_head.weight": s["lm_head.weight"][:2]}), "lm_head.weight of shape"),
    ],
)
def test_bad_draft_vocabulary_tensors_are_named(tmp_path, tiny_dirs, edit, message):
    target_dir, _ = tiny_dirs
    d = build_drafter(tmp_path / "d", target_dir, draft_vocab=[1, 2, 3])
    state = load_file(d / "model.safetensors")
    edit(state)
    save_file(state, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=message):
        DFlashDrafter.from_pretrained(d)


def test_draft_vocabulary_larger_than_the_vocabulary_is_named(tmp_path, tiny_dirs):
    target_dir, _ = tiny_dirs
    d = build_drafter(tmp_path / "d", target_dir, draft_vocab=[1, 2])
    raw = json.loads((d / "config.json").read_text())
    raw["draft_vocab_size"] = raw["vocab_size"] + 1
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        DFlashDrafter.from_pretrained(d)


def test_a_pair_carries_what_its_callers_need(tiny_dirs):
    from dflash_core.loading import encode_prompt

    pair = load_pair(*tiny_dirs)
    tokenizer = pair.tokenizer
    assert tokenizer.eos_token_id is not None and pair.stop_ids == [tokenizer.eos_token_id]
    assert pair.trained_block_size == pair.drafter.block_size
    assert pair.context_length == pair.target.model.config.max_position_embeddings
    assert pair.numerics.startswith(str(pair.target.dtype).removeprefix("torch."))
    assert pair.encode("Hi") == encode_prompt(tokenizer, "Hi") != pair.encode("Hi", chat=False)
    with pytest.raises(GenerationInputError, match="no enable_thinking switch"):
        pair.encode("Hi", "on")
    assert load_pair(tiny_dirs[0], None).trained_block_size is None
