"""What each frame of a running race costs chromium: its long tasks (over 50 ms of main thread) beside
the frames the server sent, with and without charts.

Serves the app on the tiny test pair (a 1,024-position target), races 512 tokens in chromium, and
prints, in seconds from the click on Race, the page's long tasks (start, milliseconds) and the
frames sent (time, with charts, bytes of HTML) until 128 DFlash tokens are on screen and 1.5 s after.

    .venv/bin/python dev/measurements/stop-under-load-2026-12-07/long_tasks.py
"""

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import torch  # noqa: E402

torch.set_num_threads(1)

from browser import open_page, set_max_new_tokens  # noqa: E402
from serve import launch_app  # noqa: E402
from tiny import build_drafter, build_target  # noqa: E402

import app.serve.live as live  # noqa: E402

OBSERVE = """() => {
  window.__long = [];
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) window.__long.push([performance.timeOrigin + e.startTime, e.duration]);
  }).observe({type: 'longtask', buffered: true});
}"""

if __name__ == "__main__":
    sent = []
    race_frame = live.race_frame

    def recorded(snapshot, pieces, text_of, report, charts, *args, **kwargs):
        frame = race_frame(snapshot, pieces, text_of, report, charts, *args, **kwargs)
        sent.append((time.time(), bool(charts), frame.html_bytes()))
        return frame

    live.race_frame = recorded
    root = Path(tempfile.mkdtemp())
    target = build_target(root / "target", max_positions=1024)
    demo, url = launch_app(target, build_drafter(root / "drafter", target))
    with open_page(url, 120) as page:
        page.wait_for_selector("#pair-status :text('ready')")
        set_max_new_tokens(page, 512)
        page.evaluate(OBSERVE)
        page.locator("#prompt textarea").fill("What is the capital of France?")
        t0 = time.time()
        page.locator("#run").click()
        page.wait_for_function("document.querySelectorAll('#dflash-tokens .tok').length >= 128", polling=100)
        page.wait_for_timeout(1500)
        long_tasks = page.evaluate("window.__long")
    print("long tasks (s, ms):", [(round(s / 1000 - t0, 2), round(d)) for s, d in long_tasks if s / 1000 >= t0])
    print("frames (s, charts, bytes):", [(round(t - t0, 2), c, b) for t, c, b in sent])
    demo.close()
