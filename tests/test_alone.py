"""The `alone` marker (`tests/alone.py`): under xdist a marked test's run overlaps no other test's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

RECORDED = """
import json, time
import pytest

def record(name, seconds):
    start = time.time()
    time.sleep(seconds)
    with open({log!r}, "a") as log:
        log.write(json.dumps([name, start, time.time()]) + "\\n")
"""


@pytest.mark.slow
@pytest.mark.parametrize("marked", [True, False])
def test_a_test_marked_alone_runs_while_no_other_test_does(pytester, monkeypatch, marked):
    log = pytester.path / "intervals.jsonl"
    header = RECORDED.format(log=str(log))
    pytester.makepyfile(
        test_timed=header + ("@pytest.mark.alone\n" if marked else "") + "def test_timed():\n    record('timed', 1.0)\n",
        test_others=header + "".join(f"\ndef test_other_{i}():\n    record('other', 0.25)\n" for i in range(8)),
    )
    pytester.makeini("[pytest]\nmarkers =\n    alone: runs alone\n")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent))  # where `alone.py` is
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-p", "alone", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    intervals = [json.loads(line) for line in log.read_text().splitlines()]
    [(_, start, end)] = [i for i in intervals if i[0] == "timed"]
    beside = [i for i in intervals if i[0] == "other" and i[1] < end and i[2] > start]
    # Unmarked, the two workers run the files at once, and the other file's tests overlap the timed one.
    assert (beside == []) == marked, (beside, start, end)
