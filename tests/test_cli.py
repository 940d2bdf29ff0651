"""The `python -m dflash_core generate` command: traces, text prompts, and error exits."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from dflash_core.__main__ import main
from dflash_core.loading.pair import default_drafter_dtype, parse_dtype


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process (subprocesses would re-import torch for every case)."""

    def invoke(*args):
        code = main(["generate", *map(str, args)])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return invoke


def test_module_entry_point_runs(golden_dir):
    done = subprocess.run(
        [sys.executable, "-m", "dflash_core", "generate", "--target", str(golden_dir / "target"),
         "--drafter", str(golden_dir / "drafter"), "--prompt-ids", "1,2,3", "--max-new-tokens", "5"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    target_dtype = parse_dtype("auto", "cpu")  # the CLI's default: bf16 only on CPUs with native bf16
    drafter_dtype = default_drafter_dtype("cpu", target_dtype)
    names = [str(d).removeprefix("torch.") for d in (target_dtype, drafter_dtype)]
    assert done.stdout.startswith(f"[dflash block=8 target {names[0]} drafter {names[1]}] 5 tokens")


def test_trace_json_matches_golden(cli, golden_dir, golden_expected, tmp_path):
    prompt = golden_expected["prompts"][1]
    ref = next(r for r in prompt["runs"] if r["block_size"] == 4)
    trace_path = tmp_path / "trace.json"
    done = cli(
        "--target", golden_dir / "target", "--drafter", golden_dir / "drafter",
        "--prompt-ids", ",".join(map(str, prompt["prompt_ids"])), "--max-new-tokens", 40,
        "--block-size", 4, "--dtype", "float32", "--drafter-dtype", "float32", "--trace-json", trace_path,  # the reference's
    )
    assert done.returncode == 0, done.stderr
    assert "target float32 drafter float32" in done.stdout.splitlines()[-1]
    written = json.loads(trace_path.read_text())
    assert (written["settings"]["target_dtype"], written["settings"]["drafter_dtype"]) == ("float32", "float32")
    trace = written["runs"]["dflash"]
    assert trace["output_ids"] == ref["output_ids"]
    assert trace["acceptance_lengths"] == ref["acceptance_lengths"]
    assert [b["draft_ids"] for b in trace["blocks"]][:-1] == ref["draft_blocks"][:-1]
    assert all(b["accepted"] + 1 == a for b, a in zip(trace["blocks"], trace["acceptance_lengths"]))
    assert all("bonus_id" in b for b in trace["blocks"])


def test_text_prompt_through_chat_template_and_plain_mode(cli, tiny_dirs, tmp_path):
    target_dir, drafter_dir = tiny_dirs
    outputs = []
    for side, extra in (("dflash", ["--drafter", drafter_dir]), ("plain", ["--plain"])):
        trace_path = tmp_path / f"t{len(outputs)}.json"
        done = cli("--target", target_dir, *extra, "--prompt", "What is 2+3?", "--max-new-tokens", 12, "--trace-json", trace_path)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(trace_path.read_text())["runs"][side]["output_ids"])
    assert outputs[0] == outputs[1]


def test_tree_budget_decodes_as_plain_and_traces_the_trees(cli, golden_dir, golden_expected, tmp_path):
    prompt_ids = ",".join(map(str, golden_expected["prompts"][0]["prompt_ids"]))
    runs, lines = {}, {}
    for side, extra in (("dflash", ["--drafter", golden_dir / "drafter", "--tree-budget", 8]), ("plain", ["--plain"])):
        trace_path = tmp_path / f"{side}.json"
        done = cli("--target", golden_dir / "target", *extra, "--prompt-ids", prompt_ids, "--max-new-tokens", 24,
                   "--dtype", "float32", "--trace-json", trace_path)
        assert done.returncode == 0, done.stderr
        runs[side], lines[side] = json.loads(trace_path.read_text())["runs"][side], done.stdout.splitlines()[-1]
    assert lines["dflash"].startswith("[dflash block=8 tree=8 target float32")
    assert runs["dflash"]["output_ids"] == runs["plain"]["output_ids"]
    assert runs["dflash"]["tree_budget"] == 8
    assert all(len(b["tree"]["tokens"]) == 9 and b["verify_len"] == 9 for b in runs["dflash"]["blocks"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drafter", "/nonexistent/drafter", "--prompt-ids", "1,2"], "model directory not found: /nonexistent/drafter"),
        (["--drafter", "{drafter}", "--prompt", "hi"], "this target has no tokenizer"),
        (["--drafter", "{drafter}", "--prompt-ids", "1,2", "--block-size", "12"], "block_size 12 must be between 1 and"),
        (["--drafter", "{drafter}", "--prompt-ids", "1,2", "--temperature", "-3"], "temperature must be in"),
        (["--prompt-ids", "1,2"], "--drafter is required unless --plain"),
    ],
)
def test_errors_exit_nonzero_with_a_message(cli, golden_dir, args, message):
    args = [a.replace("{drafter}", str(golden_dir / "drafter")) for a in args]
    done = cli("--target", golden_dir / "target", *args)
    assert done.returncode != 0
    assert message in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "--plain", "--prompt-ids", "1,2", "--threads", "0"], "--threads must be at least 1, got 0"),
        (["generate", "--plain", "--prompt-ids", "1,2", "--cuda-graphs"], "--cuda-graphs needs --static-cache"),
        (["generate", "--plain", "--prompt-ids", "1,2", "--compile", "--static-cache", "--cuda-graphs"], "choose one"),
        (["doctor", "--drafter", "{drafter}", "--threads", "-1"], "--threads must be at least 1, got -1"),
    ],
)
def test_the_shared_options_are_checked_before_a_model_loads(golden_dir, capsys, args, message):
    args = [a.replace("{drafter}", str(golden_dir / "drafter")) for a in args]
    with pytest.raises(SystemExit) as exited:
        main([args[0], "--target", str(golden_dir / "target"), *args[1:]])
    assert exited.value.code == 2 and message in capsys.readouterr().err
