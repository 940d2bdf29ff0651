"""The training config file: its checks and messages, the shipped configs, the train command it
stands for, D-PACE's slot weights, and one run from a config to a drafter the engine loads."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train import PROMPTS, _target_samples, _write_shard

from dflash_core import DFlashDrafter, Target, run
from dflash_core.errors import ConfigError
from dflash_core.training.__main__ import main as training_main
from dflash_core.training.config import load_config, parse_override, schema_text, train_argv
from dflash_core.training.data import shard_range
from dflash_core.training.objective import DrafterTrainer, dpace_weights, slot_weights
from dflash_core.training.train import parse_args

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


MINIMAL = '[data]\npath = "{data}"\n[output]\ndir = "{out}"\n'


@pytest.fixture
def minimal(tmp_path):
    data = tmp_path / "data"
    _write_shard(data, [([1, 2, 3, 4], 1)])
    return _write(tmp_path, MINIMAL.format(data=data, out=tmp_path / "out"))


@pytest.mark.parametrize("text, message", [
    ('[optimization]\nlearning_rate = 1e-4\n', "unknown key 'optimization.learning_rate'; [optimization] knows: epochs, "),
    ('[trainer]\nlr = 1e-4\n', "unknown key 'trainer'; the top level knows: target, data, drafter, objective"),
    ('[optimization]\nlr = "fast"\n', "optimization.lr = 'fast': Input should be a valid number"),
    ('[optimization]\nlr = -1.0\n', "optimization.lr = -1.0: Input should be greater than 0"),
    ('[optimization]\ngrad_accum = 2.5\n', "optimization.grad_accum = 2.5: Input should be a valid integer"),
    ('[objective]\nslot_weighting = "uniform"\n', "objective.slot_weighting = 'uniform': Input should be 'decay' or 'dpace'"),
    ('[objective]\ndpace_alpha = 0.0\n', "objective.dpace_alpha = 0.0: Input should be greater than 0"),
    ('[data]\nshards = "a:b"\n', "data.shards = 'a:b': expected START:STOP"),
    ('[drafter]\ninit = "no/such/drafter"\n', "drafter.init = 'no/such/drafter': neither"),
    ('[drafter]\nkind = "dflash2"\ndraft_vocab = 8192\n', "a DFlash2 drafter proposes from the whole vocabulary"),
])
def test_a_bad_key_or_value_is_named_before_anything_loads(minimal, text, message):
    base = minimal.read_text()
    # Tables given twice are a TOML error, so the case's keys go into the file's own tables.
    merged = base
    for table in ("data", "optimization", "objective", "drafter", "trainer"):
        if f"[{table}]" in text and f"[{table}]" in base:
            merged = merged.replace(f"[{table}]\n", text.split("\n", 1)[0] + "\n" + text.split("\n", 1)[1], 1)
            break
    else:
        merged = base + text
    minimal.write_text(merged)
    with pytest.raises(ConfigError) as info:
        load_config(minimal)
    assert message in str(info.value) and str(minimal) in str(info.value)


def test_several_bad_keys_are_all_named(minimal):
    minimal.write_text(minimal.read_text() + "[optimization]\nlr = -1.0\nepochs = \"six\"\n")
    with pytest.raises(ConfigError) as info:
        load_config(minimal)
    assert "optimization.lr" in str(info.value) and "optimization.epochs" in str(info.value)


def test_required_keys_and_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="output is required"):
        load_config(_write(tmp_path, '[data]\npath = "x"\n'))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(_write(tmp_path, "[data\n"))


def test_overrides_are_toml_values_or_strings(minimal):
    config = load_config(minimal, ["optimization.lr=1e-4", "optimization.max_steps=3", "output.dir=runs/x y",
                                   "output.resume=true", 'data.shards="2:"', "target.layer_ids=[1, 3]"])
    assert config.optimization.lr == 1e-4 and config.optimization.max_steps == 3 and config.output.dir == "runs/x y"
    assert config.output.resume is True and config.data.shards == "2:" and config.target.layer_ids == [1, 3]
    assert parse_override("data.shards=132:") == (["data", "shards"], "132:")
    for bad in ("lr=1e-4", "optimization.lr", "a.b.c=1"):
        with pytest.raises(ConfigError, match="expected table.key=value"):
            load_config(minimal, [bad])
    with pytest.raises(ConfigError, match="unknown key 'optimization.lrr'"):
        load_config(minimal, ["optimization.lrr=1"])


def test_schema_lists_every_key_of_every_table():
    text = schema_text()
    for table in ("[target]", "[data]", "[drafter]", "[objective]", "[optimization]", "[evaluation]", "[output]"):
        assert table in text
    assert "lr = 0.0006" in text and 'slot_weighting = "decay"' in text and "path = (required)" in text


def test_the_offline_config_is_the_shipped_drafters_command():
    """configs/smollm2-offline.toml stands for the model card's command, with v9 for its warm start."""
    card = (ROOT / "assets/drafters/smollm2-135m-instruct-dflash/README.md").read_text()
    command = card[card.index("python -m dflash_core.training.train"):]
    command = command[: command.index("```")].replace("\\\n", " ")
    expected = vars(parse_args(shlex.split(command)[3:]))
    config = load_config(CONFIGS / "smollm2-offline.toml", ["drafter.init=assets/drafters/smollm2-135m-instruct-dflash",
                                                             "output.dir=runs/drafter-v10"])
    got = vars(parse_args(train_argv(config)))
    expected["init_from"] = "assets/drafters/smollm2-135m-instruct-dflash"  # v9 is in git history only
    expected["shards"] = shard_range("132:147")  # the card's "132:" before shards 147-149 were added
    assert {k: v for k, v in got.items() if got[k] != expected[k]} == {}


def test_the_paper_config_is_the_papers_recipe():
    config = load_config(CONFIGS / "qwen3-8b-paper.toml")
    args = parse_args(train_argv(config))
    assert (args.block_size, args.layers, args.gamma, args.epochs, args.lr, args.warmup) == (16, 5, 7.0, 6, 6e-4, 0.04)
    assert args.slot_weighting == "decay" and not args.init_from_target and args.init_from is None
    assert config.target.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match="no shard-\\*.npz files there \\(run `python -m dflash_core.training regenerate`"):
        training_main(["run", str(CONFIGS / "qwen3-8b-paper.toml")])


def test_dpace_weights_follow_the_formula_and_differ_from_the_decay():
    # Slot confidences exp(-ce) of 0.9, 0.5, 0.2 and an invalid fourth slot, alpha 0.5.
    ce = -torch.log(torch.tensor([[0.9, 0.5, 0.2, 0.7]]))
    valid = torch.tensor([[True, True, True, False]])
    q = [0.5 * 0.9 + 0.5, 0.5 * 0.5 + 0.5, 0.5 * 0.2 + 0.5]
    prefix = [q[0], q[0] * q[1], q[0] * q[1] * q[2]]
    expected = torch.tensor([[sum(prefix), prefix[1] + prefix[2], prefix[2], 0.0]])
    got = dpace_weights(ce, valid, alpha=0.5)
    torch.testing.assert_close(got, expected)
    # Normalised, they are not the decay's: the decay does not see that slot 3 is rarely reached.
    decay = slot_weights(5, 2.0)[None] * valid
    assert not torch.allclose(got / got.sum(), decay / decay.sum(), atol=1e-2)
    # A perfectly confident drafter weighs slot j by the slots from j on; alpha 1 ignores confidence.
    torch.testing.assert_close(dpace_weights(torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)), torch.tensor([[3.0, 2, 1]]))
    torch.testing.assert_close(dpace_weights(ce, valid, alpha=1.0), torch.tensor([[3.0, 2, 1, 0]]))
    with pytest.raises(ValueError, match="alpha must be in"):
        dpace_weights(ce, valid, alpha=0.0)


def test_the_trainer_weighs_slots_by_dpace_when_asked(tiny_pair, one_thread):
    target, drafter = tiny_pair
    ids = torch.tensor(_target_samples(target, PROMPTS[:1], 24)[0][0])
    anchors = torch.arange(len(ids) - 20, len(ids) - 1)
    B = drafter.block_size
    with torch.no_grad():
        decay = DrafterTrainer(target, drafter, B, 2.0).forward(ids, anchors)
        dpace = DrafterTrainer(target, drafter, B, 2.0, slot_weighting="dpace").forward(ids, anchors)
    hard = -decay.logits.log_softmax(-1).gather(-1, decay.labels.clamp(min=0)[..., None])[..., 0]
    w = dpace_weights(hard, decay.labels >= 0)
    assert float(dpace.loss) == pytest.approx(float((hard * w).sum() / w.sum()), rel=1e-5)
    assert not math.isclose(float(dpace.loss), float(decay.loss), rel_tol=1e-3)


def test_mask_token_may_not_be_the_pad_token(tiny_dirs, tmp_path, one_thread):
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    data = tmp_path / "data"
    _write_shard(data, _target_samples(target, PROMPTS[:1], 8))
    pad = target.tokenizer.pad_token_id
    config = _write(tmp_path, MINIMAL.format(data=data, out=tmp_path / "out")
                    + f'[target]\nmodel = "{target_dir}"\n[drafter]\nmask_token_id = {pad}\nlayers = 1\n')
    with pytest.raises(ConfigError, match=f"mask token id {pad} is the target's pad token"):
        training_main(["run", str(config), "optimization.max_steps=1"])


def test_a_config_trains_a_drafter_the_cli_loads(tiny_dirs, tmp_path, one_thread):
    """`python -m dflash_core.training run CONFIG key=value` end to end on the tiny pair: the drafter
    it writes drafts losslessly in this engine and `python -m dflash_core generate` loads it."""
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    samples = _target_samples(target, PROMPTS, 40)
    data, out = tmp_path / "data", tmp_path / "out"
    _write_shard(data, samples)
    config = _write(tmp_path, f"""
[target]
model = "{target_dir}"
[data]
path = "{data}"
heldout_frac = 0.0
[drafter]
layers = 1
block_size = 4
[objective]
anchors_per_seq = 64
slot_weighting = "dpace"
[optimization]
lr = 3e-3
grad_accum = 2
amp = "none"
[output]
dir = "{out}"
log_every = 1
progress = false
""")
    summary = training_main(["run", str(config), "optimization.max_steps=30"])
    assert summary["step"] == 30
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r["kind"] == "train"]
    assert losses[-1] < 0.5 * losses[0]
    drafter = DFlashDrafter.from_pretrained(out)
    prompt, plen = samples[0][0][: samples[0][1]], samples[0][1]
    result = run(target, prompt, drafter, max_new_tokens=40)
    assert list(result.output_ids) == samples[0][0][plen:] and result.tau > 1.3
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_core", "generate", "--target", str(target_dir), "--drafter", str(out),
         "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "16"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
