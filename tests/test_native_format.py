"""transformers' native DFlash format, both ways: `export_native` writes a drafter that transformers'
own `generate(..., speculation_type="dflash")` runs, and this engine loads such a checkpoint.

The reference pair (tests/golden) carries the reference implementation's drafts and accepted lengths,
so both directions are checked against them block for block, not only for lossless output.
"""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import build_dflash2_drafter, build_drafter, build_target

from dflash_core import DFlashDrafter, Target, load_pair, run
from dflash_core.errors import ConfigError
from dflash_core.loading import export_native as export_module
from dflash_core.loading.export_native import export_native, main
from dflash_core.models.native_format import from_native_state, released_config, to_native_state

ROOT = Path(__file__).resolve().parents[1]
transformers = pytest.importorskip("transformers")
needs_native = pytest.mark.skipif(
    not hasattr(transformers, "MuseGlimmerAssistantModel"),
    reason=f"transformers {transformers.__version__} has no native DFlash (MuseGlimmerAssistantModel, 5.25 on)",
)


class CycleSizes(transformers.generation.streamers.BaseStreamer):
    """Tokens per `put`: the prompt, the prefill's token, then each cycle's accepted drafts + 1."""

    def __init__(self):
        self.sizes = []

    def put(self, value):
        self.sizes.append(value.shape[-1])

    def end(self):
        pass


def native_generate(target, draft, prompt_ids, max_new_tokens, eos=None):
    """transformers' greedy `generate` of `target`, plain (draft None) or native DFlash; the new ids
    and the accepted length of every DFlash cycle."""
    ids = torch.tensor([prompt_ids])
    sizes = CycleSizes()
    extra = {} if draft is None else {"assistant_model": draft, "speculation_type": "dflash", "streamer": sizes}
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=eos, pad_token_id=eos, **extra)
    return out[0, len(prompt_ids):].tolist(), sizes.sizes[2:]


def load_native(directory):
    draft, info = transformers.AutoModel.from_pretrained(directory, output_loading_info=True)
    assert type(draft).__name__ == "MuseGlimmerAssistantModel"
    assert not any(info.values()), info  # no missing, unexpected or mismatched key
    return draft.eval()


@pytest.fixture(scope="module")
def golden_native(golden_dir, tmp_path_factory):
    """The reference pair's drafter (the released z-lab layout) exported to the native format."""
    out = tmp_path_factory.mktemp("native") / "golden"
    export_native(golden_dir / "drafter", out)
    return out


@needs_native
def test_exported_reference_drafter_runs_in_transformers_with_the_reference_acceptance(golden_dir, golden_expected,
                                                                                       golden_native):
    target = transformers.AutoModelForCausalLM.from_pretrained(golden_dir / "target", dtype=torch.float32).eval()
    draft = load_native(golden_native)
    n = golden_expected["max_new_tokens"]
    for prompt in golden_expected["prompts"]:
        plain, _ = native_generate(target, None, prompt["prompt_ids"], n)
        fast, lengths = native_generate(target, draft, prompt["prompt_ids"], n)
        assert fast == plain == prompt["target_greedy_ids"]
        reference = next(r for r in prompt["runs"] if r["block_size"] == 8)["acceptance_lengths"]
        # transformers cuts its last cycle at the token budget; every earlier cycle accepts what the reference did.
        assert lengths[:-1] == reference[: len(lengths) - 1]
    assert any(1 < length < 8 for r in golden_expected["prompts"] for length in r["runs"][0]["acceptance_lengths"])


@pytest.mark.parametrize("block_size", [8, 4])
def test_native_checkpoint_decodes_here_with_the_reference_drafts(golden_dir, golden_expected, golden_native, block_size):
    target = Target.from_pretrained(golden_dir / "target")
    drafter = DFlashDrafter.from_pretrained(golden_native)
    assert drafter.config.draft_vocab_size is None and drafter.block_size == 8
    for prompt in golden_expected["prompts"]:
        ref = next(r for r in prompt["runs"] if r["block_size"] == block_size)
        summary = run(target, prompt["prompt_ids"], drafter, max_new_tokens=golden_expected["max_new_tokens"],
                      block_size=block_size)
        assert list(summary.output_ids) == ref["output_ids"] == prompt["target_greedy_ids"]
        assert summary.acceptance_lengths == ref["acceptance_lengths"]
        assert [list(b.draft_ids) for b in summary.blocks][:-1] == ref["draft_blocks"][:-1]


def test_native_round_trip_keeps_every_weight(golden_dir, golden_native):
    original = load_file(golden_dir / "drafter" / "model.safetensors")
    native = load_file(golden_native / "model.safetensors")
    assert {"encoder.fc.weight", "encoder.output_norm_enc.weight", "norm.weight"} <= set(native)
    assert not {"fc.weight", "hidden_norm.weight"} & set(native)
    back = from_native_state(native)
    assert set(back) == set(original) and all(torch.equal(back[k], original[k]) for k in original)
    config = json.loads((golden_native / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("muse_glimmer_assistant", ["MuseGlimmerAssistantModel"])
    assert (config["block_size"], config["mask_token_id"], config["target_layer_ids"]) == (8, 511, [1, 3, 5])
    assert config["layer_types"] == ["full_attention"] * 2 and config["vocab_size"] == 512


@pytest.fixture(scope="module")
def vocab_pair(tmp_path_factory):
    """A tiny target, what exporting its drafter (this project's, with a draft vocabulary) printed, and the export."""
    root = tmp_path_factory.mktemp("vocab")
    target_dir = build_target(root / "target")
    vocab = list(range(0, 300, 2))
    drafter_dir = build_drafter(root / "drafter", target_dir, block_size=4, draft_vocab=vocab)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([str(drafter_dir), str(root / "native"), "--target", str(target_dir)]) == 0
    return target_dir, printed.getvalue(), root / "native"


@needs_native
def test_draft_vocabulary_drafter_exports_and_stays_lossless_both_ways(vocab_pair):
    target_dir, printed, native_dir = vocab_pair
    assert "its draft vocabulary of 150 ids was dropped" in printed
    native = load_file(native_dir / "model.safetensors")
    assert not {"d2t", "lm_head.weight", "draft_vocab"} & set(native)
    config = json.loads((native_dir / "config.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir)
    assert config["eos_token_id"] == tokenizer.eos_token_id
    hf_target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = load_native(native_dir)
    pair = load_pair(target_dir, native_dir, drafter_dtype="float32")
    assert pair.drafter.draft_vocab is None and pair.drafter.block_size == 4
    for prompt in ([5, 9, 14, 20], [40, 41, 42], [7] * 6):
        plain, _ = native_generate(hf_target, None, prompt, 24)
        fast, _ = native_generate(hf_target, draft, prompt, 24)
        assert fast == plain
        ours = run(pair.target, prompt, max_new_tokens=24)
        assert list(run(pair.target, prompt, pair.drafter, max_new_tokens=24).output_ids) == list(ours.output_ids)


def test_native_config_without_vocab_size_takes_the_targets(golden_dir, golden_native, tmp_path):
    directory = tmp_path / "no-vocab"
    directory.mkdir()
    raw = json.loads((golden_native / "config.json").read_text())
    del raw["vocab_size"]
    (directory / "config.json").write_text(json.dumps(raw))
    (directory / "model.safetensors").symlink_to(golden_native / "model.safetensors")
    with pytest.raises(ConfigError, match="gives no vocab_size"):
        DFlashDrafter.from_pretrained(directory)
    assert load_pair(golden_dir / "target", directory).drafter.config.vocab_size == 512


def test_native_config_defaults_are_transformers(golden_native):
    raw = json.loads((golden_native / "config.json").read_text())
    for key in ("layer_types", "sliding_window", "rope_parameters"):
        raw.pop(key)
    released = released_config(raw)
    # MuseGlimmerAssistantConfig's defaults: every layer sliding over 2048 positions, rope theta 500000.
    assert released["layer_types"] == ["sliding_attention"] * 2 and released["sliding_window"] == 2048
    assert released["rope_parameters"]["rope_theta"] == 500000.0


def test_export_without_the_native_runtime_writes_the_same_checkpoint(golden_dir, golden_native, tmp_path,
                                                                      monkeypatch):
    # A transformers before 5.25 has no native classes: the export writes the config from the same fields.
    monkeypatch.setattr(export_module, "native_classes", lambda: None)
    export_native(golden_dir / "drafter", tmp_path / "bare")
    bare, full = load_file(tmp_path / "bare" / "model.safetensors"), load_file(golden_native / "model.safetensors")
    assert set(bare) == set(full) and all(torch.equal(bare[k], full[k]) for k in full)
    raw = json.loads((tmp_path / "bare" / "config.json").read_text())
    assert (raw["model_type"], raw["architectures"], raw["dtype"]) == (
        "muse_glimmer_assistant", ["MuseGlimmerAssistantModel"], "float32")
    assert released_config(raw) == released_config(json.loads((golden_native / "config.json").read_text()))
    if hasattr(transformers, "MuseGlimmerAssistantConfig"):
        monkeypatch.undo()
        bare_config, full_config = (transformers.AutoConfig.from_pretrained(d).to_dict()
                                    for d in (tmp_path / "bare", golden_native))
        assert bare_config.pop("_name_or_path") != full_config.pop("_name_or_path")
        assert bare_config == full_config  # transformers reads both as the same model


def test_state_names_map_both_ways():
    state = {"fc.weight": 1, "hidden_norm.weight": 2, "layers.0.mlp.up_proj.weight": 3, "norm.weight": 4, "draft_vocab": 5}
    native = to_native_state(state)
    assert native == {"encoder.fc.weight": 1, "encoder.output_norm_enc.weight": 2, "layers.0.mlp.up_proj.weight": 3,
                      "norm.weight": 4}
    assert from_native_state(native) == {k: v for k, v in state.items() if k != "draft_vocab"}


def test_drafters_without_a_native_form_are_refused(tmp_path, tiny_dirs):
    target_dir, _ = tiny_dirs
    dflash2 = build_dflash2_drafter(tmp_path / "dflash2", target_dir)
    with pytest.raises(ConfigError, match="DFlash2 drafter cannot be exported"):
        export_native(dflash2, tmp_path / "out2")
    with pytest.raises(ConfigError, match="autoregressive drafter cannot be exported"):
        export_native(ROOT / "assets" / "drafters" / "smollm2-135m-instruct-ar", tmp_path / "out-ar")
    biased = build_drafter(tmp_path / "biased", target_dir, attention_bias=True)
    with pytest.raises(ConfigError, match="attention_bias=True"):
        export_native(biased, tmp_path / "out-bias")
    assert not any((tmp_path / name).exists() for name in ("out2", "out-ar", "out-bias"))
