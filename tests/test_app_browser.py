"""A real browser (Debian's chromium through Python playwright) runs a race in the app.

Skips only when chromium or playwright is missing; CI installs both (no browser download).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import chromium_path, run_race_in_browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

if chromium_path() is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed (pip install playwright)")

from test_app_api import launch_app, one_thread  # noqa: F401  (fixture used by name)


@pytest.fixture(scope="module")
def app_url(tiny_dirs, request):
    request.getfixturevalue("one_thread")
    demo, url = launch_app(*tiny_dirs)
    yield url
    demo.close()


@pytest.mark.slow
def test_browser_runs_a_race_and_shows_colored_tokens_and_charts(app_url):
    shot = ARTIFACTS / "app-race.png"
    seen = run_race_in_browser(app_url, "What is the capital of France?", shot, max_new_tokens=24, timeout_s=60)
    assert seen["target_tokens"] >= 1 and seen["plain_tokens"] >= 1
    assert seen["token_background"] not in ("rgba(0, 0, 0, 0)", "transparent")  # the token really is colored
    assert seen["plots"] >= 4 and seen["bars"] >= 1
    assert "identical" in seen["summary"] and '"tau"' in seen["report"]
    assert shot.stat().st_size > 10_000
