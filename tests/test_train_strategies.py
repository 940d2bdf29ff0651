"""Training under torchrun (two gloo processes on CPU, tiny models): DDP and FSDP compute what one
process computes on the same global batch, and a killed FSDP run resumes to the same weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import PROMPTS, _target_samples, _write_shard

from dflash_core import DFlashDrafter, Target, run
from dflash_core.training.train import main

ROOT = Path(__file__).resolve().parent.parent
STEPS = 16
# Long enough that the test sees the first checkpoint and kills the run well before its end.
KILLED_STEPS = 60


def _args(target_dir, data, out, grad_accum: int, steps: int = STEPS, save_every: int = 2) -> list[str]:
    # 8 sequences, 3 held out at 0.5 (test-3, -4, -7): 5 train, 2 per global step, 2 steps per epoch.
    return ["--target", str(target_dir), "--data", str(data), "--out", str(out), "--layers", "2",
            "--block-size", "4", "--anchors-per-seq", "16", "--grad-accum", str(grad_accum), "--max-steps", str(steps),
            "--heldout-frac", "0.5", "--eval-every", "4", "--patience", "1000", "--save-every", str(save_every), "--amp", "none",
            "--lr", "3e-3", "--warmup", "0.1", "--no-progress", "--log-every", "1", "--init-from-target", "--threads", "1"]


def _torchrun(args: list[str], **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "dflash_core.training.train", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen,
    )


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process under it: torchrun starts each worker in a session of its own,
    so killing its process group would leave the workers training."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for p in reversed(tree):  # the workers before their launcher, which would otherwise see them fail
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _finish(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-4000:]
    return err


def _log(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "train_log.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "checkpoint" / "model.safetensors")


@pytest.fixture(scope="module")
def data(tiny_dirs, tmp_path_factory):
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    samples = _target_samples(target, PROMPTS * 4, 30)
    directory = tmp_path_factory.mktemp("strategies") / "data"
    _write_shard(directory, samples)
    return target, samples, directory


def _single(target_dir, data, out, **kwargs) -> Path:
    """One process taking both ranks' sequences per step (grad_accum 2 = 2 ranks x 1)."""
    before = torch.get_num_threads()
    try:
        main(_args(target_dir, data, out, grad_accum=2, **kwargs))
    finally:
        torch.set_num_threads(before)
    return out


@pytest.fixture(scope="module")
def single(tiny_dirs, data, tmp_path_factory):
    return _single(tiny_dirs[0], data[2], tmp_path_factory.mktemp("single") / "out")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_match_one_process_and_the_result_loads(strategy, tiny_dirs, data, single, tmp_path):
    target_dir, _ = tiny_dirs
    target, samples, directory = data
    out = tmp_path / strategy
    err = _finish(_torchrun([*_args(target_dir, directory, out, grad_accum=1), "--strategy", strategy]))
    assert f"2 ranks ({strategy})" in err and "2 steps per epoch" in err
    one, two = _log(single, "train"), _log(out, "train")
    assert [r["step"] for r in two] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-4)
    assert two[-1]["loss"] < 0.6 * two[0]["loss"]  # it learnt, so equal losses are not two flat lines
    assert [r["val_tau"] for r in _log(out, "eval")] == pytest.approx([r["val_tau"] for r in _log(single, "eval")])
    expected, got = _weights(single), _weights(out)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-3, atol=1e-5, msg=name)
    # The shipped result is the released format and drafts losslessly in this engine.
    drafter = DFlashDrafter.from_pretrained(out)
    prompt, plen = samples[0][0][: samples[0][1]], samples[0][1]
    assert list(run(target, prompt, drafter, max_new_tokens=30).output_ids) == samples[0][0][plen:]


@pytest.mark.slow
def test_killed_fsdp_run_resumes_to_the_same_weights(tiny_dirs, data, tmp_path):
    target_dir, _ = tiny_dirs
    out = tmp_path / "killed"
    long = {"steps": KILLED_STEPS, "save_every": 10}
    args = [*_args(target_dir, data[2], out, grad_accum=1, **long), "--strategy", "fsdp"]
    proc = _torchrun(args)
    state = out / "checkpoint" / "state.pt"
    deadline = time.monotonic() + 240
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _kill_tree(proc.pid)
    proc.communicate()
    killed_at = torch.load(state, weights_only=False)["state"]["step"]
    assert 0 < killed_at < KILLED_STEPS, f"the run was not stopped midway (checkpoint at step {killed_at})"
    err = _finish(_torchrun([*args, "--resume"]))
    assert f"resuming from step {killed_at}" in err
    steps = [r["step"] for r in _log(out, "train")]
    assert steps[-1] == KILLED_STEPS and steps.count(killed_at + 1) >= 1
    # The same run uninterrupted: the resumed one took the same steps from the checkpoint on.
    whole = tmp_path / "whole"
    _finish(_torchrun([*_args(target_dir, data[2], whole, grad_accum=1, **long), "--strategy", "fsdp"]))
    # The log has the killed run's steps past its checkpoint too; the resumed run's come after them.
    resumed = {r["step"]: r["loss"] for r in _log(out, "train")}
    uninterrupted = {r["step"]: r["loss"] for r in _log(whole, "train")}
    assert resumed == pytest.approx(uninterrupted, rel=1e-5)
    expected, got = _weights(whole), _weights(out)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7)
