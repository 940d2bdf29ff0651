"""Draw a concurrency sweep's JSON (`bench --peer vllm --concurrency ... --json`) as a PNG, with the
app's serving-view figure (`app/view/serving.py`), for docs/benchmarks.md.

    PYTHONPATH=. .venv/bin/python dev/scripts/concurrency_chart.py dev/measurements/concurrency-2026-12-06.json \\
        docs/concurrency-2026-12-06.png

The venv has no kaleido, so the figure is written as HTML with plotly.js inline and photographed by
the headless chromium the browser tests use (playwright; no download).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from browser import LAUNCH_ARGS, chromium_path  # noqa: E402

from app.view.serving import serving_figure  # noqa: E402

WIDTH, HEIGHT = 1100, 420


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the sweep's JSON")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    data = json.loads(args.sweep.read_text())
    title = (f"vLLM {data['model']}: DFlash (K = {data['num_speculative_tokens']}) vs plain, "
             f"{data['max_new_tokens']} new tokens, {data['rounds']} requests per client")
    figure = serving_figure(data["levels"], title=title, height=HEIGHT)
    figure.update_layout(width=WIDTH)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        page_file = Path(folder) / "chart.html"
        page_file.write_text(figure.to_html(include_plotlyjs=True, full_html=True, config={"staticPlot": True}))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=LAUNCH_ARGS)
            try:
                page = browser.new_page(viewport={"width": WIDTH + 20, "height": HEIGHT + 20})
                page.goto(page_file.as_uri())
                page.wait_for_selector(".main-svg")
                page.locator(".plotly-graph-div").screenshot(path=str(args.out))
            finally:
                browser.close()
    print(args.out)


if __name__ == "__main__":
    main()
