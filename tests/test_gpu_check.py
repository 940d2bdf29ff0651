"""The device script's CPU dry run: every part of scripts/gpu_check.py at the tiny shape, on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dry_run(out: Path, shape: str, *args: str):
    """scripts/gpu_check.py at `shape` on CPU: (the finished process, its JSON's parts). Offline with
    an empty Hub home, so the datasets part reaches no dataset whatever this machine has cached."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HOME": str(out / "hf-home"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-u", "scripts/gpu_check.py", "--shape", shape, "--device", "cpu", "--out", str(out), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    result = json.loads((out / "gpu_check.json").read_text())
    parts = result["parts"]
    assert done.returncode == 0, {n: p.get("error") for n, p in parts.items() if p["status"] != "passed"}
    assert result["failed"] == [] and "=== done: all parts passed" in done.stdout
    return done, parts


def test_gpu_check_dry_run_on_cpu(tmp_path):
    done, parts = dry_run(tmp_path, "tiny")
    assert {n: p["status"] for n, p in parts.items()} == {
        "environment": "passed", "golden": "passed", "kernels": "skipped", "hub_load": "passed",
        "exactness": "passed", "speed": "passed", "cuda_graphs": "skipped", "race": "passed",
        "datasets": "passed", "kernel_tests": "skipped",
    }
    assert parts["cuda_graphs"]["why"].startswith("CUDA graphs need CUDA")
    assert parts["golden"]["kernels=auto"]["different"] == 0
    hub = parts["hub_load"]
    assert hub["layers"] == 8 and hub["chat_template"].endswith("thinking off (enable_thinking=False)")
    exact = parts["exactness"]["checks"]
    assert len(exact) == 8 and all(exact.values())
    speed = parts["speed"]
    assert set(speed["oracle"]) == {"4", "6.5", "8"}
    # The one-sync rule is CUDA's; on CPU `auto` picks bf16 with batch invariance only where AMX runs it
    # (Intel Xeon), whose row-wise attention reads each layer's mask on the host.
    bf16 = speed["dtype"] == "torch.bfloat16"
    assert speed["syncs_allowed_per_cycle"] == (1 + hub["layers"] if bf16 else 1)
    assert speed["sync_path"].startswith("cpu batch-invariant" if bf16 else "cpu: the accepted count")
    for tau, figures in speed["oracle"].items():
        assert figures["tau"] == float(tau) and figures["max_syncs_per_cycle"] == speed["syncs_allowed_per_cycle"]
        assert figures["lossless"]["kind"] == "identical"
    assert speed["static_cache_tau_6.5"]["tau"] == 6.5
    assert set(speed["targets"]) == {"draft/verify", "bookkeeping/cycle", "verify/plain", "speedup/tau at tau 6.5"}
    assert parts["race"]["report"]["lossless"]["kind"] in ("identical", "near_tie")
    # Offline, every dataset is named as unreachable and raced on the fixtures' rows instead.
    data = parts["datasets"]
    assert data["hub"] == "unreachable (HF_HUB_OFFLINE=1): cached copies only"
    assert data["table"]["returncode"] == 3 and data["table"]["datasets"] == {}
    names = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench"]
    assert list(data["table"]["unavailable"]) == names
    assert all("could not reach" in why for why in data["table"]["unavailable"].values())
    fixtures = data["fixture_table"]["datasets"]
    assert list(fixtures) == names and fixtures["mt-bench"]["turns"] == 2
    for r in fixtures.values():
        assert r["source"].startswith("local:") and r["identical"] == 1.0 and r["lossless"]["diverged"] == 0


def test_gpu_check_dry_run_of_the_hybrid_on_cpu(tmp_path):
    """The Qwen3.5 shape at tiny size: every part that depends on the target, on the dynamic cache."""
    _, parts = dry_run(tmp_path, "tiny-hybrid", "--parts", "hub_load,exactness,speed,cuda_graphs,race")
    assert {n: p["status"] for n, p in parts.items()} == {
        "hub_load": "passed", "exactness": "passed", "speed": "passed", "cuda_graphs": "skipped", "race": "passed",
    }
    assert parts["hub_load"]["cache_layers"] == {"gated delta-net": 6, "full attention": 2}
    exact = parts["exactness"]["checks"]
    assert len(exact) == 8 and all(exact.values()) and "static KV cache refused, the dynamic one used" in exact
    speed = parts["speed"]
    for tau, figures in speed["oracle"].items():
        assert figures["tau"] == float(tau) and figures["lossless"]["kind"] == "identical"
        assert figures["max_syncs_per_cycle"] == speed["syncs_allowed_per_cycle"]
    assert speed["static_cache_tau_6.5"] == {"skipped": "a hybrid rolls back on the dynamic cache only"}
    assert parts["race"]["report"]["lossless"]["kind"] in ("identical", "near_tie")


def test_a_part_that_fails_midway_keeps_what_it_measured(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)

    def speed(state):
        state["measured"]["plain_tok_s"] = 12.5
        raise AttributeError("'StaticLayer' object has no attribute 'crop'")

    monkeypatch.setitem(gpu_check.PARTS, "speed", speed)
    state = {"results": {"parts": {"hub_load": {"status": "passed"}}}}
    result = gpu_check.run_part("speed", state, budget=30)
    assert result["status"] == "failed" and result["plain_tok_s"] == 12.5
    assert result["error"] == "AttributeError: 'StaticLayer' object has no attribute 'crop'"
