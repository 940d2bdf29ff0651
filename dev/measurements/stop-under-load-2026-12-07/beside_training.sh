#!/usr/bin/env bash
# The stop probe beside the suite's heaviest neighbours: torchrun's two-rank training tests and the
# compiled steps' tests, as `-n auto --dist loadfile` can run them on the other worker.
#   bash dev/measurements/stop-under-load-2026-12-07/beside_training.sh LABEL > OUT.txt
set -u
cd "$(dirname "$0")/../../.."
.venv/bin/python -m pytest -q tests/test_train_strategies.py tests/test_compiled_steps.py >/dev/null 2>&1 &
neighbours=$!
sleep 10
.venv/bin/python dev/measurements/stop-under-load-2026-12-07/stop_probe.py 6 2>/dev/null | grep '^load' | sed "s/^/${1:-run} /"
kill "$neighbours" 2>/dev/null; pkill -f "pytest -q tests/test_train_strategies.py"; wait
