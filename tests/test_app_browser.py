"""A real browser (Debian's chromium through Python playwright) runs a race in the app.

Skips only when chromium or playwright is missing; CI installs both (no browser download).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]

if not CHROMIUM.exists() and not shutil.which("chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed (pip install playwright)")

from test_app_api import launch_app, one_thread  # noqa: E402,F401


@pytest.fixture(scope="module")
def app_url(tiny_dirs, one_thread):
    demo, url = launch_app(*tiny_dirs)
    yield url
    demo.close()


def run_race_in_browser(url: str, prompt: str, screenshot: Path, max_tokens: int | None = None, timeout_ms=60_000):
    """Open the page, type `prompt`, click Race and wait for the summary; saves a full-page screenshot."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium")),
                                    args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.wait_for_selector("#pair-status :text('ready')", timeout=timeout_ms)
            if max_tokens is not None:
                box = page.locator("input[type=number]").first
                box.fill(str(max_tokens))
                box.press("Enter")
            page.locator("#prompt textarea").fill(prompt)
            page.locator("#run").click()
            page.wait_for_selector("#dflash-tokens .tok", timeout=timeout_ms)
            page.wait_for_selector("#summary :text('speedup')", timeout=timeout_ms)
            page.wait_for_selector("#chart-acceptance .js-plotly-plot", timeout=timeout_ms)
            page.wait_for_timeout(500)  # let the last chart frame paint
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            return {
                "accepted_or_bonus": page.locator("#dflash-tokens .tok-bonus, #dflash-tokens .tok-first").count(),
                "plain": page.locator("#plain-tokens .tok-plain").count(),
                "plots": page.locator(".js-plotly-plot").count(),
                "bars": page.locator("#chart-acceptance .js-plotly-plot .bars path").count(),
                "summary": page.locator("#summary").inner_text(),
                "background": page.locator("#dflash-tokens .tok").first.evaluate(
                    "el => getComputedStyle(el).backgroundColor"
                ),
            }
        finally:
            browser.close()


def test_browser_runs_a_race_and_shows_colored_tokens_and_charts(app_url):
    shot = ARTIFACTS / "app-race.png"
    seen = run_race_in_browser(app_url, "What is the capital of France?", shot, max_tokens=24)
    assert seen["accepted_or_bonus"] >= 1 and seen["plain"] >= 1
    assert seen["background"] not in ("rgba(0, 0, 0, 0)", "transparent")  # the token really is colored
    assert seen["plots"] >= 4 and seen["bars"] >= 1
    assert "identical" in seen["summary"]
    assert shot.stat().st_size > 10_000
