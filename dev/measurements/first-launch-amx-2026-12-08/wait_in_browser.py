"""A race clicked while the app compiles a lane step, in the browser: seconds from the click to the
summary line's "Waiting for the model" note and to the first token, and screenshots of both.

Start an app with no saved steps first, e.g. an empty project cache with the converted target linked in:
    mkdir -p /tmp/cold && ln -s ~/.cache/dflash-studio/smollm2-135m-instruct /tmp/cold/
    DFLASH_CACHE=/tmp/cold .venv/bin/python app.py --port 7861 &
then, once the page answers:
    .venv/bin/python dev/measurements/first-launch-amx-2026-12-08/wait_in_browser.py http://127.0.0.1:7861/ OUT_DIR [STATUS]
STATUS: click once the pair's status line shows this text (e.g. "compiling 1/", while the DFlash step
compiles: the race waits for it, then runs compiled); by default as soon as the pair is ready.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from browser import open_page, set_max_new_tokens  # noqa: E402

url, out = sys.argv[1], Path(sys.argv[2])
status = sys.argv[3] if len(sys.argv) > 3 else None
out.mkdir(parents=True, exist_ok=True)
with open_page(url, 600, height=1000, width=1500) as page:
    page.wait_for_selector("#pair-status :text('ready')")
    set_max_new_tokens(page, 48)
    if status:
        page.wait_for_selector(f"#pair-status :text('{status}')", timeout=300_000)
    clicked = time.perf_counter()
    page.locator("#run").click()
    page.wait_for_selector("#summary :text('Waiting for the model')", timeout=60_000)
    print(f"note {time.perf_counter() - clicked:.1f} s after the click: {page.locator('#summary').inner_text()}")
    page.screenshot(path=str(out / "waiting.png"))
    page.wait_for_selector("#dflash-tokens .tok", timeout=300_000)
    print(f"first token {time.perf_counter() - clicked:.1f} s after the click")
    page.wait_for_selector("#summary :text('speedup')", timeout=300_000)
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "raced.png"))
    print(page.locator("#summary").inner_text())
