"""Pause / Step / Continue of the race and replay pacing, on recorded events with a fake clock."""

from __future__ import annotations

import threading

import pytest
from fake_runs import run_events

from app.race.control import Control, Controls
from app.race.interleave import race


def _race(control, speed=None, now=None):
    now = now if now is not None else [0.0]
    return race(
        {
            "dflash": run_events(0.1, 0.2, 3, 6, 4),  # DFlash: 6 cycles of 0.2 s, 3 tokens each
            "plain": run_events(0.1, 0.1, 1, 18, 1),  # plain: 18 steps of 0.1 s
        },
        block_sizes={"dflash": 4},
        frame_s=0.0,
        speed=speed,
        control=control,
        sleep=lambda s: now.__setitem__(0, now[0] + max(s, 1e-3)),
    )


def test_step_shows_one_dflash_cycle_and_the_plain_side_at_the_same_compute_time():
    now = [0.0]
    control = Control(clock=lambda: now[0])
    control.pause(0)  # paused before the first cycle
    paused = []
    for last in _race(control, speed=1.0, now=now):
        snap = last
        if snap.paused:
            paused.append(snap)
            if len(paused) <= 3:
                control.step(len(snap.dflash.blocks))
            else:
                control.resume()
    assert [len(s.dflash.blocks) for s in paused] == [0, 1, 2, 3]
    for k, snap in enumerate(paused[1:], start=1):
        stamp = snap.dflash.blocks[-1].elapsed_s
        assert stamp == pytest.approx(0.1 + 0.2 * k)
        # The plain side shows every step done by that compute time, and none after it.
        assert snap.plain.blocks and snap.plain.blocks[-1].elapsed_s <= stamp + 1e-9
        assert len(snap.plain.blocks) == round((stamp - 0.1) / 0.1)
    assert last.done and len(last.dflash.blocks) == 6  # Continue ran the race to the end
    assert control.paused is False


def test_a_pause_is_not_counted_on_the_clock():
    now = [10.0]
    control = Control(clock=lambda: now[0])
    control.pause(0)
    worker = threading.Thread(target=control.hold, args=(0, 0.001))
    worker.start()
    while not worker.is_alive():
        pass
    now[0] += 100.0  # a long pause
    control.resume()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert control.clock() == pytest.approx(10.0)  # 110 s on the wall, 100 of them paused


def test_replay_speed_paces_the_display_clock():
    for speed in (0.5, 2.0):
        now = [0.0]
        control = Control(clock=lambda: now[0])
        frames = list(_race(control, speed=speed, now=now))
        assert frames[-1].done
        for f in frames[:-1]:
            shown = max(f.dflash.elapsed_s, f.plain.elapsed_s)
            assert shown <= speed * f.wall_s + 1e-9
        # The whole race (1.9 s of plain compute) takes 1.9 / speed seconds of wall time.
        assert frames[-1].wall_s == pytest.approx(1.9 / speed, abs=0.01)


def test_controls_are_per_session_and_bounded():
    controls = Controls(size=2)
    a, b = controls.get("a"), controls.get("b")
    assert controls.get("a") is a and a is not b
    c = controls.get("c")
    assert controls.get("b") is not b  # the least recently used session was dropped
    run = c.run
    controls.drop("c")  # the page closed: a race it paused is released
    assert c.superseded(run) and controls.get("c") is not c


def test_a_newer_run_of_the_same_viewer_ends_the_older_one():
    now = [0.0]
    control = Control(clock=lambda: now[0])
    run = control.reset()
    older = race(
        {"dflash": run_events(0.1, 0.2, 3, 6, 4), "plain": run_events(0.1, 0.1, 1, 18, 1)}, block_sizes={"dflash": 4},
        frame_s=0.0, speed=1.0, control=control, stop=lambda: control.superseded(run),
        sleep=lambda s: now.__setitem__(0, now[0] + max(s, 1e-3)),
    )
    first = next(older)
    assert not first.done and not first.stopped
    control.pause(len(first.dflash.blocks))
    control.reset()  # a new replay starts: the old one ends, paused or not, without blocking
    rest = list(older)
    assert len(rest) == 1 and rest[0].stopped  # its last snapshot, marked stopped
