"""Stop during the browser test's 512-token race, timed as `tests/browser.py`'s `stop_during_long_race` times it.

Serves the app on the tiny test pair (a 1,024-position target), races 512 tokens in chromium, clicks
Stop at 128 DFlash tokens and prints one line per run: the 1-minute load average, and the seconds
from the click event to "Stopped" in the page (`page_s`), for playwright's click to land
(`click_s`) and until the race's last frame (`stopped_s`).

    .venv/bin/python dev/measurements/stop-under-load-2026-12-07/stop_probe.py 6
"""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import torch  # noqa: E402

torch.set_num_threads(1)

from browser import stop_during_long_race  # noqa: E402
from serve import launch_app  # noqa: E402
from tiny import build_drafter, build_target  # noqa: E402

if __name__ == "__main__":
    root = Path(tempfile.mkdtemp())
    target = build_target(root / "target", max_positions=1024)
    demo, url = launch_app(target, build_drafter(root / "drafter", target))
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
        seen = stop_during_long_race(url, max_new_tokens=512)
        print(f"load {os.getloadavg()[0]:.1f}", {k: v for k, v in seen.items() if k != "summary"}, flush=True)
    demo.close()
