"""Drive the app in a real browser (Debian chromium via playwright): run one race, time it, screenshot it.

Used by the browser test and to make the README screenshot::

    python app.py --target ... --drafter ... --port 7861 &
    python tests/browser.py http://127.0.0.1:7861 assets/screenshot.png --max-new-tokens 96

Playwright is imported only here, never by the app; it must not download a browser.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--headless",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
DEFAULT_PROMPT = "Write a Python function `is_prime(n)` that returns True when n is a prime number."


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


def run_race_in_browser(
    url: str, prompt: str, screenshot: Path, max_new_tokens: int | None = None, timeout_s: float = 120.0
) -> dict:
    """Open the page, wait for the models, race `prompt`, and save a full-page screenshot.

    Returns what the page showed, plus `first_token_s`: seconds from the click to the first
    colored token on screen.
    """
    from playwright.sync_api import sync_playwright

    timeout_ms = timeout_s * 1000
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.wait_for_selector("#pair-status :text('ready')", timeout=timeout_ms)
            if max_new_tokens is not None:
                box = page.locator("input[type=number]").first  # the max-new-tokens slider's box
                box.fill(str(max_new_tokens))
                box.press("Enter")
            page.locator("#prompt textarea").fill(prompt)
            clicked = time.perf_counter()
            page.locator("#run").click()
            page.wait_for_selector("#dflash-tokens .tok", timeout=timeout_ms)
            first_token_s = time.perf_counter() - clicked
            page.wait_for_selector("#summary :text('speedup')", timeout=timeout_ms)
            page.wait_for_selector("#chart-acceptance .js-plotly-plot .bars path", timeout=timeout_ms)
            page.wait_for_timeout(500)  # let the last chart frame paint
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            return {
                "first_token_s": round(first_token_s, 3),
                "target_tokens": page.locator("#dflash-tokens .tok-bonus, #dflash-tokens .tok-first").count(),
                "plain_tokens": page.locator("#plain-tokens .tok-plain").count(),
                "plots": page.locator(".js-plotly-plot").count(),
                "bars": page.locator("#chart-acceptance .js-plotly-plot .bars path").count(),
                "summary": page.locator("#summary").inner_text(),
                "report": page.locator("#report").inner_text(),
                "token_background": page.locator("#dflash-tokens .tok").first.evaluate(
                    "el => getComputedStyle(el).backgroundColor"
                ),
            }
        finally:
            browser.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("output", type=Path)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int)
    args = parser.parse_args(argv)
    seen = run_race_in_browser(args.url, args.prompt, args.output, args.max_new_tokens)
    print(json.dumps({k: seen[k] for k in ("first_token_s", "target_tokens", "plain_tokens", "plots", "summary")}))


if __name__ == "__main__":
    main()
