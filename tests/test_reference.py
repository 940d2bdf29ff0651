"""z-lab's reference package (`dflash==0.1.0` on PyPI) beside this engine: the same drafts block for
block, DFlash and DFlash2, and `bench --peer reference` reporting it.

The package pins torch 2.13.0 and transformers 5.15.0, so it runs in its own venv (`bash
scripts/setup.sh --reference` makes `.venv-reference`; `$DFLASH_REFERENCE_VENV` names another),
driven through `scripts/reference_generate.py` in a subprocess (`dflash_core/bench/reference_peer.py`);
where that venv does not exist these tests are skipped.
"""

import json
import random
from pathlib import Path

import pytest
import torch
from tiny import build_dflash2_drafter, build_qwen3_target

from dflash_core import DFlashDrafter, Target, run
from dflash_core.bench.reference_peer import REFERENCE, ReferenceUnavailable, reference_generate
from dflash_core.loading.pair import fetch_target
from dflash_core.loading.prompting import encode_prompt

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "assets" / "drafters"

pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not (REFERENCE.venv() / "bin" / "python").exists(),
        reason=f"no reference venv at {REFERENCE.venv()}: `bash scripts/setup.sh --reference` builds .venv-reference "
        "(CI does not, see .ci/run)",
    ),
]


def assert_same_cycles(summary, theirs, block_size):
    """The package's drafts equal ours in every cycle it drafted a full block (near the token budget
    it shrinks the block, and with it the drafts), and so do the accepted lengths, the last aside."""
    ours = [list(b.draft_ids) for b in summary.blocks]
    full = [d for d in theirs["draft_blocks"] if len(d) == block_size - 1]
    assert full and full == ours[: len(full)]
    lengths = theirs["acceptance_lengths"][: len(full)]
    assert lengths[:-1] == summary.acceptance_lengths[: len(lengths) - 1]


@pytest.mark.parametrize("block_size", [8, 4])
def test_reference_drafts_equal_ours_on_the_reference_pair(golden_dir, golden_pair, golden_expected, block_size,
                                                           tmp_path):
    target, drafter = golden_pair
    prompts = [p["prompt_ids"] for p in golden_expected["prompts"]]
    n = golden_expected["max_new_tokens"]
    result = reference_generate(golden_dir / "target", prompts, golden_dir / "drafter", block_size=block_size,
                                max_new_tokens=n, threads=1, workdir=tmp_path)
    for ids, theirs in zip(prompts, result["outputs"], strict=True):
        summary = run(target, ids, drafter, max_new_tokens=n, block_size=block_size)
        assert theirs["token_ids"] == list(summary.output_ids)
        assert_same_cycles(summary, theirs, block_size)
    assert any(1 < length < block_size for o in result["outputs"] for length in o["acceptance_lengths"])


def test_reference_dflash2_drafts_equal_ours(tmp_path):
    target_dir = build_qwen3_target(tmp_path / "target", vocab_size=12)
    drafter_dir = build_dflash2_drafter(tmp_path / "drafter", target_dir, input_embedding_scale=1.25,
                                        output_multiplier=0.75, final_logit_softcapping=6.0, random_norms=True)
    target, drafter = Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)
    rng = random.Random(0)
    prompts = [[rng.randrange(11) for _ in range(rng.randint(2, 10))] for _ in range(3)]
    result = reference_generate(target_dir, prompts, drafter_dir, max_new_tokens=30, threads=1, workdir=tmp_path)
    for ids, theirs in zip(prompts, result["outputs"], strict=True):
        summary = run(target, ids, drafter, max_new_tokens=30)
        assert theirs["token_ids"] == list(summary.output_ids)
        assert_same_cycles(summary, theirs, 8)
    assert any(length > 1 for o in result["outputs"] for length in o["acceptance_lengths"])


@pytest.fixture(scope="module")
def default_target():
    directory = fetch_target("default:smollm2")  # converted once into ~/.cache/dflash-studio
    target = Target.from_pretrained(directory, dtype=torch.float32)
    rows = [json.loads(line) for line in (ROOT / "assets" / "prompts" / "natural.jsonl").read_text().splitlines()]
    by_id = {row["id"]: row["prompt"] for row in rows}
    return directory, target, [encode_prompt(target.tokenizer, by_id[i]) for i in ("natural:math-01", "natural:code-01")]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct-dflash", "smollm2-135m-instruct-dflash-b16"])
def test_reference_runs_the_shipped_drafters_losslessly(default_target, name, tmp_path):
    directory, target, prompts = default_target
    eos = target.tokenizer.eos_token_id
    result = reference_generate(directory, prompts, SHIPPED / name, max_new_tokens=48, threads=1, stop_ids=[eos],
                                workdir=tmp_path)
    for ids, theirs in zip(prompts, result["outputs"], strict=True):
        assert theirs["token_ids"] == list(run(target, ids, max_new_tokens=48, stop_ids=[eos]).output_ids)
    # It drafts over the target's whole head (the draft vocabulary is not read), and still accepts drafts.
    assert result["summary"]["tau"] > 1.3


def test_reference_refuses_the_autoregressive_drafter(golden_dir, tmp_path):
    with pytest.raises(ReferenceUnavailable, match="DFlashARDraftModel"):
        reference_generate(golden_dir / "target", [[1, 2, 3]], SHIPPED / "smollm2-135m-instruct-ar", max_new_tokens=4,
                           workdir=tmp_path)


def test_bench_peer_reference_reports_it_beside_this_engine(tiny_dirs, capsys):
    from dflash_core.bench.run import main

    target_dir, drafter_dir = tiny_dirs
    assert main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--drafter-dtype", "float32",
                 "--prompt-set", "natural", "--num-prompts", "2", "--max-new-tokens", "24", "--no-peers",
                 "--threads", "1", "--peer", "reference"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    reference = result["reference"]
    assert reference["engine"] == "dflash 0.1.0 (reference)" and reference["transformers"] == "5.15.0"
    assert reference["plain"]["identical"] == 1.0 and reference["dflash"]["identical"] == 1.0
    assert reference["dflash"]["same_drafts"] == 1.0 and reference["dflash"]["same_cycles"] == 1.0
    assert reference["ours_over_peer"]["dflash"] == pytest.approx(result["dflash_tok_s"] / reference["dflash"]["tok_s"])
    assert "dflash 0.1.0 (reference)" in out and "same drafter and numerics" in out
