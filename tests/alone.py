"""The `alone` marker: under xdist, a test marked `alone` runs while no other test does, so that what
it times is the app, not the test beside it.

Each test holds a lock file of the run (in the folder its workers' temporary folders share) from
its fixtures' setup to their teardown: shared, or exclusive for an `alone` test, which first takes a
gate that keeps new tests from starting while it waits for the running ones. Without xdist nothing
runs beside a test, and nothing is locked.
"""

from __future__ import annotations

import fcntl
from contextlib import ExitStack
from pathlib import Path

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    basetemp = getattr(item.config.option, "basetemp", None)
    if not hasattr(item.config, "workerinput") or not basetemp:
        yield
        return
    run = Path(basetemp).parent
    alone = item.get_closest_marker("alone") is not None
    with ExitStack() as held:
        gate, lock = (held.enter_context(open(run / name, "a")) for name in ("alone.gate", "alone.lock"))
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases the locks
