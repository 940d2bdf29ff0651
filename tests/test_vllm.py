"""vLLM loads every shipped drafter unchanged, and its greedy DFlash output equals this engine's plain decoding.

vLLM runs in its own venv (`bash scripts/setup.sh --vllm` makes `.venv-vllm`), driven through
`scripts/vllm_generate.py` in a subprocess; where that venv does not exist these tests are skipped.
CI does not build it (see `.ci/run`). About a minute per drafter on a 2-core CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from dflash_core import Target, run
from dflash_core.pair import fetch_target
from dflash_core.prompting import encode_prompt

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
DRAFTERS = sorted(path.parent.name for path in (ROOT / "assets" / "drafters").glob("*/config.json"))
PROMPT_IDS = ("natural:math-01", "natural:code-01", "natural:writing-01", "natural:knowledge-01")
MAX_NEW_TOKENS = 48

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason="no .venv-vllm in the repository root: `bash scripts/setup.sh --vllm` builds it (CI does not, see .ci/run)",
    ),
]


@pytest.fixture(scope="module")
def default_target() -> tuple[str, Target]:
    directory = fetch_target("default:smollm2")  # converted once into ~/.cache/dflash-studio
    return directory, Target.from_pretrained(directory, dtype=torch.float32)


@pytest.fixture(scope="module")
def prompts(default_target) -> list[list[int]]:
    _, target = default_target
    rows = [json.loads(line) for line in (ROOT / "assets" / "prompts" / "natural.jsonl").read_text().splitlines()]
    by_id = {row["id"]: row["prompt"] for row in rows}
    return [encode_prompt(target.tokenizer, by_id[i]) for i in PROMPT_IDS]


def vllm_generate(tmp_path: Path, target_dir: str, drafter: Path, prompts: list[list[int]]) -> dict:
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    out, log = tmp_path / "vllm.json", tmp_path / "vllm.log"
    # The test process's settings are not vLLM's: the Triton interpreter mode (conftest) and this
    # venv's import path would both leak into the other interpreter.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    cmd = [str(VLLM_PYTHON), str(ROOT / "scripts" / "vllm_generate.py"), "--target", target_dir, "--drafter",
           str(drafter), "--prompts", str(tmp_path / "prompts.json"), "--max-tokens", str(MAX_NEW_TOKENS),
           "--dtype", "float32", "--max-model-len", "1024", "--eager", "--out", str(out)]
    with open(log, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=900, check=False)
    assert done.returncode == 0 and out.exists(), f"vLLM failed ({' '.join(cmd)}):\n{log.read_text()[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", DRAFTERS)
def test_vllm_loads_the_shipped_drafter_and_matches_plain_decoding(tmp_path, default_target, prompts, name):
    target_dir, target = default_target
    drafter = ROOT / "assets" / "drafters" / name
    result = vllm_generate(tmp_path, target_dir, drafter, prompts)
    eos = target.tokenizer.eos_token_id
    for ids, out in zip(prompts, result["outputs"], strict=True):
        plain = run(target, ids, max_new_tokens=MAX_NEW_TOKENS, stop_ids=[eos]).output_ids
        assert out["token_ids"] == list(plain)
    # vLLM drafted with the drafter, through its d2t map: a wrong map would propose ids the target
    # almost never picks, and accept about nothing.
    steps = sum(o["spec_decode"]["num_spec_steps"] for o in result["outputs"])
    accepted = sum(o["spec_decode"]["num_accepted_draft_tokens"] for o in result["outputs"])
    assert steps > 0 and 1 + accepted / steps > 1.3, result["outputs"][0]["spec_decode"]
