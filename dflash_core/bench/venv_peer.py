"""A benchmark peer that lives in a venv of its own: finding that venv's python, and running the
peer's driver script there in a subprocess that reads prompt ids from a file and writes JSON back.

vLLM (`vllm_peer.py`) and z-lab's reference package (`reference_peer.py`) each pin their own torch
and transformers, so neither can be imported here; `scripts/setup.sh --vllm` / `--reference` build
their venvs, and an environment variable names another.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import DFlashError

ROOT = Path(__file__).resolve().parents[2]


class PeerUnavailable(DFlashError):
    """No venv to run a peer in, or the peer failed in it."""


@dataclass(frozen=True)
class PeerVenv:
    label: str  # the peer's name in messages: "vLLM"
    variable: str  # the environment variable that names another venv
    default: str  # the venv's folder in the repository root
    setup_flag: str  # the `scripts/setup.sh` flag that builds it
    error: type[PeerUnavailable]  # what a missing venv or a failed run raises

    def venv(self) -> Path:
        """The venv the peer runs in: `$variable`, else `default` in the repository root."""
        return Path(os.environ.get(self.variable) or ROOT / self.default).expanduser()

    def python(self) -> Path:
        """That venv's python; an error that says how to make the venv where there is none."""
        python = self.venv() / "bin" / "python"
        if not python.exists():
            raise self.error(
                f"{self.label} is not set up: {python} does not exist. {self.label} runs in a venv of its own: "
                f"`bash scripts/setup.sh {self.setup_flag}` makes {self.default}, or set {self.variable} to a venv "
                f"with {self.label}."
            )
        return python

    def run(self, script: Path, prompts: list[list[int]], args: list[str], env: dict[str, str], timeout_s: float,
            workdir: str | Path | None = None) -> dict:
        """Run `script` with this venv's python on `prompts` (token ids, given as `--prompts FILE`) and
        `args`, and return the JSON it wrote to `--out FILE`; its log's end goes into any error."""
        python = self.python()
        with tempfile.TemporaryDirectory(prefix=f"dflash-{self.default.strip('.')}-", dir=workdir) as tmp:
            prompts_file, out, log = Path(tmp, "prompts.json"), Path(tmp, "out.json"), Path(tmp, "peer.log")
            prompts_file.write_text(json.dumps([[int(t) for t in ids] for ids in prompts]))
            cmd = [str(python), str(script), "--prompts", str(prompts_file), "--out", str(out), *args]
            with open(log, "w") as f:
                try:
                    done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, check=False)
                except subprocess.TimeoutExpired:
                    raise self.error(f"{self.label} did not finish within {timeout_s} s: {' '.join(cmd)}") from None
            if done.returncode != 0 or not out.exists():
                raise self.error(f"{self.label} failed ({exit_status(done.returncode)}): {' '.join(cmd)}\n"
                                 f"{log_tail(log.read_text())}")
            return json.loads(out.read_text())


def exit_status(returncode: int) -> str:
    """'exit 1', or for a process a signal ended, 'killed by SIGKILL'."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit {returncode}"


def clean_env() -> dict[str, str]:
    """This process's environment less what belongs to it alone: its import path, and the tests'
    Triton interpreter mode."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}


def log_tail(text: str, lines: int = 40, width: int = 600) -> str:
    """The end of a peer's log, each line cut to `width`: errors name the cause at a line's start
    (an unsupported architecture comes before the list of every supported one)."""
    return "\n".join(line if len(line) <= width else line[:width] + " ..." for line in text.splitlines()[-lines:])
