"""Drive the app in a real browser (Debian chromium via playwright): run one race, time it, screenshot it.

Used by the browser test and to make the README screenshot::

    python app.py --port 7861 &   # the offline default pair, which has every lane
    python tests/browser.py http://127.0.0.1:7861 assets/screenshot.png --max-new-tokens 96 --lanes ar,lookup
    python app.py --port 7861 --pair smollm2-135m-b16 &   # the block-16 drafter, fixed and scheduled
    python tests/browser.py http://127.0.0.1:7861 assets/scheduled-lane.png --max-new-tokens 96 --lanes scheduled
    python app.py --replay assets/traces/math-greedy.json --port 7862 &
    python tests/browser.py http://127.0.0.1:7862 assets --replay-shots   # replay.png, inside-a-cycle.png
    python tests/browser.py http://127.0.0.1:7861 assets/doctor-panel.png --doctor-shot   # "Why this tau?"
    python tests/browser.py http://127.0.0.1:7861 assets --lecture-shots   # lecture-1920x1080.png, lecture-1280x720.png
    python app.py --vllm-url http://127.0.0.1:8765 --port 7863 &   # bash scripts/serve_vllm.sh
    python tests/browser.py http://127.0.0.1:7863 assets/serving-view.png --serving-shot   # the serving view
    python app.py --port 7867 --target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash \
        --dflash2-drafter PATH &   # a DFlash2 lane; its cycle view beside the race's screenshot
    python tests/browser.py http://127.0.0.1:7867 race.png --lanes dflash2 --cycle-lane dflash2   # + race-cycle.png

Playwright is imported only here, never by the app; it must not download a browser.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from dflash_core.trace import RUNS as LANES

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
LANE_LABELS = {"scheduled": "DFlash, scheduled block", "tree": "DFlash, tree", "dflash2": "DFlash2", "fusion": "input fusion", "ar": "AR drafter",
               "lookup": "prompt lookup"}  # the start of each checkbox's label
RESEARCH = ("tree", "dflash2", "fusion")  # under "More lanes"


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


@contextmanager
def open_page(url: str, timeout_s: float, height: int = 1000, width: int = 1400):
    """A chromium page `width` wide (default 1400) at `url`, every wait on it bounded by `timeout_s` (a busy shared
    CPU can hold up a click for seconds); the browser is closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_s * 1000)
            page.goto(url)
            yield page
        finally:
            browser.close()


def open_panel(page, panel: str, inside: str) -> None:
    """Open the folded panel `panel` (a selector) unless `inside` (a selector in it) already shows."""
    if not page.locator(inside).first.is_visible():
        page.locator(f"{panel} > button").first.click()
        page.locator(inside).first.wait_for(state="visible")


def set_max_new_tokens(page, value: int) -> None:
    """The max-new-tokens slider's box, in the folded settings panel."""
    open_panel(page, "#settings", "#max-new-tokens input[type=number]")
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def set_tree_budget(page, value: int) -> None:
    """The tree lane's budget slider's box, under "More lanes" (the tree lane ticked)."""
    open_panel(page, "#settings", "#lanes-basic")
    open_panel(page, "#more-lanes", "#tree-budget input[type=number]")
    box = page.locator("#tree-budget input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def tick_lane(page, lane: str) -> None:
    """Tick an added lane: the basics in the settings panel, the research lanes under "More lanes"."""
    open_panel(page, "#settings", "#lanes-basic")
    if lane in RESEARCH:
        open_panel(page, "#more-lanes", "#lanes-more label")
    page.locator("#lanes-choice label", has_text=LANE_LABELS[lane]).first.click()


def screenshot_between(page, first: str, last: str, out: Path) -> None:
    """Save the page's full width from the top of element `first` to the bottom of `last` (out, a PNG)."""
    page.evaluate("window.scrollTo(0, 0)")  # boxes are measured from the viewport, the clip from the page
    top, bottom = page.locator(first).bounding_box(), page.locator(last).bounding_box()
    page.screenshot(path=str(out), full_page=True, clip={
        "x": 0, "y": top["y"] - 12, "width": 1400, "height": bottom["y"] + bottom["height"] - top["y"] + 24})


def run_race_in_browser(
    url: str, prompt: str, screenshot: Path, max_new_tokens: int | None = None, timeout_s: float = 120.0,
    lanes: tuple[str, ...] = (), cycle_lane: str | None = None, cycle: int | None = None,
    tree_budget: int | None = None,
) -> dict:
    """Open the page, wait for the models, tick the added `lanes` (scheduled, tree, dflash2, fusion, ar, lookup),
    race `prompt` (the tree lane's trees of `tree_budget` drafts, where given), and save a full-page
    screenshot; with `cycle_lane`, then open "Inside a cycle", pick
    that lane and save the view of its last cycle (or of `cycle`) beside it (<screenshot>-cycle.png).

    Returns what the page showed, plus `first_token_s`: seconds from the click to the first
    colored token on screen, and `lane_tokens`: the tokens in each lane's pane.
    """
    with open_page(url, timeout_s) as page:
        page.wait_for_selector("#pair-status :text('ready')")
        if max_new_tokens is not None:
            set_max_new_tokens(page, max_new_tokens)
        for lane in lanes:
            tick_lane(page, lane)
        if tree_budget is not None:
            set_tree_budget(page, tree_budget)
        page.locator("#prompt textarea").fill(prompt)
        clicked = time.perf_counter()
        page.locator("#run").click()
        page.wait_for_selector("#dflash-tokens .tok")
        first_token_s = time.perf_counter() - clicked
        page.wait_for_selector("#summary :text('speedup')")
        # One lane draws bars and a running mean, several only their running means. A flat line
        # is a path of zero height, never "visible" to playwright: attached is what is waited for.
        page.wait_for_selector("#chart-acceptance .js-plotly-plot .scatterlayer path", state="attached")
        page.wait_for_timeout(500)  # let the last chart frame paint
        raced = [lane for lane in LANES if lane in ("dflash", *lanes, "plain")]
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
        cycle_title = None
        if cycle_lane is not None:
            page.locator("#cycle-panel").get_by_text("Inside a cycle").first.click()
            page.locator("#cycle-lane label", has_text=LANE_LABELS.get(cycle_lane, "DFlash")).first.click()
            page.wait_for_selector("#cycle-view .cycle h4")
            if cycle is not None:
                box = page.locator("#cycle-pick input[type=number]")
                box.fill(str(cycle))
                box.press("Enter")
                page.wait_for_selector(f"#cycle-view .cycle h4:has-text('Cycle {cycle} of')")
            page.wait_for_timeout(500)
            cycle_title = page.locator("#cycle-view .cycle h4").first.inner_text()
            page.locator("#cycle-view").screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-cycle.png")))
        return {
            "cycle_title": cycle_title,
            "first_token_s": round(first_token_s, 3),
            "target_tokens": page.locator("#dflash-tokens .tok-bonus, #dflash-tokens .tok-first").count(),
            "plain_tokens": page.locator("#plain-tokens .tok-plain").count(),
            "lane_tokens": {lane: page.locator(f"#{lane}-tokens .tok").count() for lane in raced},
            "lanes_visible": [lane for lane in LANES
                              if page.locator(f"#{lane}-pane").is_visible()],
            "plots": page.locator(".js-plotly-plot").count(),
            "bars": page.locator("#chart-acceptance .js-plotly-plot .bars path").count(),
            "summary": page.locator("#summary").inner_text(),
            "report": page.locator("#report").inner_text(),
            "token_background": page.locator("#dflash-tokens .tok").first.evaluate(
                "el => getComputedStyle(el).backgroundColor"
            ),
            "first_token_below_top": page.evaluate(FIRST_TOKEN_BELOW_TOP),
        }


# For each lane's pane: px from the box's top to its first token's (a short text starts at the top).
FIRST_TOKEN_BELOW_TOP = """() => Object.fromEntries([...document.querySelectorAll('[id$="-tokens"] .dflash-pane')]
  .filter(box => box.querySelector('.tok'))
  .map(box => [box.closest('[id$="-tokens"]').id.replace('-tokens', ''),
               Math.round(box.querySelector('.tok').getBoundingClientRect().top - box.getBoundingClientRect().top)]))"""


def stop_during_long_race(url: str, max_new_tokens: int = 512, after_tokens: int = 128, timeout_s: float = 180.0) -> dict:
    """Race `max_new_tokens` tokens, click Stop once DFlash's pane shows `after_tokens` tokens, and time
    the click (`click_s`: until playwright's click has landed), the stop (`stopped_s`: from the click
    until the race's last frame is on screen, as playwright sees it) and, timed in the page,
    `page_s`: from the click event to the summary saying "Stopped". Returns those, the tokens on
    screen when Stop was clicked and after, the summary (stopped, or finished first), and `newest`:
    whether DFlash's pane and strip scroll and show their newest token and row."""
    with open_page(url, timeout_s) as page:
        page.wait_for_selector("#pair-status :text('ready')")
        set_max_new_tokens(page, max_new_tokens)
        page.locator("#prompt textarea").fill("What is the capital of France?")
        page.locator("#run").click()
        page.wait_for_function(f"document.querySelectorAll('#dflash-tokens .tok').length >= {after_tokens}",
                               polling=100)
        shown = page.evaluate("document.querySelectorAll('#dflash-tokens .tok').length")
        page.evaluate("""() => {
          window.__stopTimes = {};
          document.querySelector('#stop').addEventListener('click', () => { window.__stopTimes.click = performance.now(); }, true);
          // The whole body: Gradio may replace the #summary node itself, which an observer on it would miss.
          new MutationObserver(() => {
            const summary = document.querySelector('#summary');
            if (!window.__stopTimes.shown && summary && summary.innerText.includes('Stopped')) {
              window.__stopTimes.shown = performance.now();
            }
          }).observe(document.body, {subtree: true, childList: true, characterData: true});
        }""")
        clicked = time.perf_counter()
        page.locator("#stop").click()  # waits for the button to take clicks, as a busy page makes a visitor wait
        click_s = time.perf_counter() - clicked
        page.wait_for_selector("#summary :text('speedup')")  # the race's last frame: stopped, or finished first
        stopped_s = time.perf_counter() - clicked
        times = page.evaluate("window.__stopTimes")
        return {"page_s": round((times.get("shown", 0) - times.get("click", 0)) / 1000, 3),"click_s": round(click_s, 3), "stopped_s": round(stopped_s, 3), "tokens_at_click": shown,
                "tokens_after": page.evaluate("document.querySelectorAll('#dflash-tokens .tok').length"),
                "summary": page.locator("#summary").inner_text(), "newest": page.evaluate(NEWEST_IN_VIEW)}


# For DFlash's pane and strip: whether its box scrolls (more than it shows), and whether its newest
# token or row is inside the box.
NEWEST_IN_VIEW = """() => Object.fromEntries([['pane', '#dflash-tokens .dflash-pane', '.tok'],
                                            ['strip', '#dflash-strip .strip-rows', '.strip-head']].map(([name, box, item]) => {
  const outer = document.querySelector(box), items = outer.querySelectorAll(item);
  const b = outer.getBoundingClientRect(), last = items[items.length - 1].getBoundingClientRect();
  return [name, {scrolls: outer.scrollHeight > outer.clientHeight + 1,
                 in_view: last.top >= b.top - 1 && last.bottom <= b.bottom + 1}];
}))"""


def _bonus_count(page) -> int:
    """DFlash cycles on screen: each commits exactly one bonus token (the last may be cut at the limit)."""
    return page.locator("#dflash-tokens .tok-bonus").count()


def replay_in_browser(url: str, artifacts: Path, steps: int = 3, timeout_s: float = 60.0) -> dict:
    """In an app without models: replay the recorded run offered first at real time, Pause, Step `steps`
    cycles, open "Inside a cycle", hover a rejected draft token; screenshots (replay, cycle view,
    hover box) go to `artifacts`. Returns what the page showed at each point."""
    artifacts.mkdir(parents=True, exist_ok=True)
    seen: dict = {}
    with open_page(url, timeout_s) as page:
        page.wait_for_selector("#replay-run")
        # The panes are rewritten every frame while a replay plays, so they are waited for by
        # counting in the page, never by holding on to one token element.
        page.locator("#replay-run").click()
        page.wait_for_selector("#summary :text('at 1×')")
        page.wait_for_function("document.querySelectorAll('#dflash-tokens .tok-bonus').length >= 1")
        page.locator("#pause").click()
        page.wait_for_selector("#control-status :text('Paused')")
        page.wait_for_timeout(600)  # the paused frame (with hover boxes) arrives
        seen["paused_at"] = paused = _bonus_count(page)
        page.wait_for_timeout(800)
        seen["still_paused_at"] = _bonus_count(page)  # nothing moves while paused
        counts = []
        for k in range(1, steps + 1):
            page.locator("#step").click()
            page.wait_for_function(f"document.querySelectorAll('#dflash-tokens .tok-bonus').length >= {paused + k}")
            page.wait_for_selector("#control-status :text('Paused')")
            counts.append(_bonus_count(page))
        seen["after_steps"] = counts
        page.wait_for_timeout(500)
        seen["plain_stats"] = page.locator("#plain-stats").inner_text()
        seen["dflash_stats"] = page.locator("#dflash-stats").inner_text()
        page.screenshot(path=str(artifacts / "replay-paused.png"), full_page=True)
        page.locator("#cycle-panel").get_by_text("Inside a cycle").first.click()
        page.wait_for_selector("#cycle-view .cycle h4")
        seen["cycle_title"] = page.locator("#cycle-view .cycle h4").first.inner_text()
        seen["cycle_text"] = page.locator("#cycle-view").inner_text()
        page.locator("#cycle-view").screenshot(path=str(artifacts / "inside-a-cycle.png"))
        # The first rejected draft (the one the target replaced) in the strip.
        chip = page.locator("#dflash-strip .chip-rejected").filter(has=page.locator(".tip", has_text="Rejected:")).last
        chip.scroll_into_view_if_needed()
        chip.hover()
        tip = chip.locator(".tip")
        tip.wait_for(state="visible")
        seen["tip_text"] = tip.inner_text()
        seen["tip_rows"] = tip.locator("tr").count()
        boxes = [chip.bounding_box(), tip.bounding_box()]
        left, top = min(b["x"] for b in boxes) - 12, min(b["y"] for b in boxes) - 12
        right = max(b["x"] + b["width"] for b in boxes) + 12
        bottom = max(b["y"] + b["height"] for b in boxes) + 12
        seen["tip_inside_window"] = 0 <= boxes[1]["y"] and boxes[1]["y"] + boxes[1]["height"] <= 1000
        page.screenshot(
            path=str(artifacts / "hover-rejected.png"),
            clip={"x": max(left, 0), "y": max(top, 0), "width": right - max(left, 0), "height": bottom - max(top, 0)},
        )
        page.mouse.move(0, 0)
        page.locator("#continue").click()
        # Continue: the replay moves on by itself
        page.wait_for_function(f"document.querySelectorAll('#dflash-tokens .tok-bonus').length > {counts[-1]}")
        seen["control_status"] = page.locator("#control-status").inner_text()
        return seen


def _status(page) -> str:
    """The control status line, without the timer Gradio shows over it while a Step is answered
    ("0.0s", "1.2/3.0s", "processing | 0.2s"; it may come before the line or after it)."""
    lines = [line.strip() for line in page.locator("#control-status").inner_text().splitlines() if line.strip()]
    lines = [line for line in lines if not re.fullmatch(r"(processing \|\s*)?[\d.]+(/[\d.]+)?s", line)]
    return lines[-1] if lines else ""


def _numbers(page) -> dict:
    """Every place that numbers the cycles on screen: the control status, DFlash's bonus tokens (one
    per cycle), the strip's newest row, the cycle view's title and the cycle picker; and the text of
    the DFlash and plain decoding panes."""
    strip = page.locator("#dflash-strip .strip-head")
    return {
        "status": _status(page),
        "bonus": _bonus_count(page),
        "strip": strip.last.inner_text() if strip.count() else "",  # the newest row is drawn last
        "title": page.locator("#cycle-view .cycle h4").first.inner_text() if page.locator("#cycle-view .cycle h4").count() else "",
        "picker": page.locator("#cycle-pick input[type=number]").input_value(),
        "dflash_text": page.locator("#dflash-tokens").inner_text(),
        "plain_text": page.locator("#plain-tokens").inner_text(),
    }


def _key(page, key: str) -> None:
    """A key pressed on the page, nothing focused (a focused field keeps its keys)."""
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.keyboard.press(key)


def step_replay_with_keys(url: str, timeout_s: float = 90.0) -> list[dict]:
    """In an app without models: Replay with "Start paused", then right arrow three times (Step),
    left arrow twice (back to cycles 2 and 1), right arrow three times (on to 2, to 3 where the replay
    paused, then Step to 4) and space. Returns what numbered the cycles after each key (`_numbers`),
    the first entry before any key."""
    seen = []
    with open_page(url, timeout_s) as page:
        page.wait_for_selector("#replay-run")
        page.locator("#replay-start-paused label").click()
        page.locator("#replay-run").click()
        page.wait_for_selector("#control-status :text('before cycle 1')")
        page.locator("#cycle-panel > button").first.click()  # "Inside a cycle" open
        seen.append(_numbers(page))

        def at(k: int, of: int, status: str) -> None:
            page.wait_for_selector(f"#control-status :text('{status}')")
            page.wait_for_selector(f"#cycle-view .cycle h4:has-text('Cycle {k} of {of} ')")
            page.wait_for_function(f"document.querySelector('#cycle-pick input[type=number]').value === '{k}'")
            page.wait_for_function(f"document.querySelectorAll('#dflash-tokens .tok-bonus').length === {k}")
            seen.append(_numbers(page))

        for k in (1, 2, 3):
            _key(page, "ArrowRight")
            at(k, k, f"after cycle {k}:")
        for k in (2, 1):
            _key(page, "ArrowLeft")
            at(k, 3, f"Back at cycle {k} of 3")
        _key(page, "ArrowRight")
        at(2, 3, "Back at cycle 2 of 3")
        _key(page, "ArrowRight")
        at(3, 3, "after cycle 3:")
        _key(page, "ArrowRight")
        at(4, 4, "after cycle 4:")
        _key(page, " ")
        page.wait_for_selector("#control-status :text('Playing')")
        seen.append(_numbers(page))
    return seen


_TAB_SELECT = re.compile(r'"event_data":\{"value":"[^"]*","index":\d+\}')


def move_whatif(url: str, timeout_s: float = 60.0) -> dict:
    """The what-if model: its DFlash curve (speedup at B = 1..16) before and after moving the
    acceptance and verify-cost sliders and clicking the GPU preset, and the requests the page sent
    meanwhile."""
    with open_page(url, timeout_s) as page:
        sent = []
        # What the page asks of the server (fonts drawn for the first time load as files, not calls).
        page.on("request", lambda request: sent.append(f"{request.url} {(request.post_data or '')[:160]}".strip())
                if request.resource_type in ("xhr", "fetch", "eventsource", "websocket") else None)
        page.wait_for_selector("#whatif svg polyline#wi-dflash", state="attached")
        # The page's own start-up calls are over: a second with none, within 15 s.
        for _ in range(30):
            seen_before = len(sent)
            page.wait_for_timeout(1000)
            if len(sent) == seen_before:
                break
        sent.clear()
        curve = lambda: page.locator("#whatif svg").get_attribute("data-dflash")  # noqa: E731
        seen = {"start": curve()}
        for name, value in (("wi-a", "0.8"), ("wi-v", "4")):
            page.locator(f"#{name}").evaluate(
                "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }", value)
            seen[name] = curve()
        page.locator("#whatif button[data-preset=gpu]").click()
        seen["gpu"] = curve()
        seen["readout"] = page.locator("#whatif .readout").inner_text()
        seen["sliders"] = {name: page.locator(f"#{name}").input_value() for name in ("wi-a", "wi-v", "wi-c")}
        page.wait_for_timeout(500)
        # The selected tab's start-up `select` event can leave later still on a loaded machine (a CI
        # run saw it after a quiet second); it names a tab, which the what-if panel never does.
        seen["requests"] = [r for r in sent if not _TAB_SELECT.search(r)]
    return seen


def _replay_to_end(page, choice: str) -> None:
    """Pick the recorded run whose label starts with `choice`, replay it at 4x and wait for its end."""
    page.locator("#trace-choice input").click()
    page.get_by_role("option").filter(has_text=choice).first.click()
    box = page.locator("#replay-speed input[type=number]")
    box.fill("4")
    box.press("Enter")
    page.locator("#replay-run").click()
    page.wait_for_selector("#summary :text('Replaying')")
    page.wait_for_selector("#control-status :text('Finished')", timeout=120_000)


def pin_and_race_again(url: str, out: Path | None = None, timeout_s: float = 180.0) -> dict:
    """In an app without models: replay the block-4 recording of the code prompt to its end, pin it,
    replay the block-16 one beside it (a screenshot of the first screen to `out`), then unpin.
    Returns the pinned panel's text, the new race's DFlash stats and text, and what showed when."""
    seen = {}
    with open_page(url, timeout_s, height=1080, width=1920) as page:
        page.wait_for_selector("#replay-run")
        seen["pin_before"] = page.locator("#pin").is_visible()  # nothing has finished: nothing to pin
        _replay_to_end(page, "code, T=0")
        seen["first_summary"] = page.locator("#summary").inner_text()
        seen["first_text"] = page.locator("#dflash-tokens").inner_text()
        page.locator("#pin").click()  # shown once the run has ended
        page.wait_for_selector("#pinned :text('Pinned race')")
        _replay_to_end(page, "code-greedy-b16")
        page.evaluate("window.scrollTo(0, 0)")
        if out is not None:
            page.screenshot(path=str(out))
        seen["pinned"] = page.locator("#pinned").inner_text()
        seen["pinned_text"] = page.locator("#pinned .dflash-pane").inner_text()
        seen["dflash_stats"] = page.locator("#dflash-stats").inner_text()
        seen["dflash_text"] = page.locator("#dflash-tokens").inner_text()
        seen["cycles"] = (page.locator("#pinned .tok-bonus").count(), _bonus_count(page))  # pinned, new
        seen["side_by_side"] = all(page.locator(selector).is_visible() for selector in ("#pinned", "#dflash-tokens"))
        page.locator("#unpin").click()
        page.wait_for_selector("#pinned-pane", state="hidden")
        seen["pinned_after_unpin"] = page.locator("#pinned-pane").is_visible()
    return seen


def tabs_own_outputs(url: str, timeout_s: float = 90.0) -> dict:
    """In an app with a live pair: replay the first recorded run to its end and pin it, open "How it
    works", then "Replay", "Live race" and "Replay" again. Returns whether the race area and the pin
    show under each, and what the area holds; and the prompt the page opened with."""
    seen = {}
    with open_page(url, timeout_s) as page:
        page.wait_for_selector("#pair-status :text('ready')")
        seen["prompt"] = page.locator("#prompt textarea").input_value()
        page.get_by_role("tab", name="Replay a recorded run").click()
        box = page.locator("#replay-speed input[type=number]")
        box.fill("4")
        box.press("Enter")
        page.locator("#replay-run").click()
        page.wait_for_selector("#summary :text('speedup')")
        seen["replayed_tokens"] = page.locator("#dflash-tokens .tok").count()
        page.wait_for_selector("#control-status :text('Finished')")
        page.locator("#pin").click()
        page.wait_for_selector("#pinned :text('Pinned race')")
        page.get_by_role("tab", name="How it works").click()
        page.wait_for_selector("#race-area", state="hidden")
        seen["area_under_howto"] = page.locator("#race-area").is_visible()
        page.get_by_role("tab", name="Replay a recorded run").click()
        page.wait_for_selector("#race-area", state="visible")
        page.wait_for_timeout(800)
        seen["kept_under_replay"] = page.locator("#dflash-tokens .tok").count()
        seen["pin_under_replay"] = page.locator("#pinned-pane").is_visible()
        page.get_by_role("tab", name="Live race").click()
        page.wait_for_selector("#summary :text('Run a prompt')")
        seen["live_tokens"] = page.locator("#dflash-tokens .tok").count()
        seen["live_summary"] = page.locator("#summary").inner_text()
        seen["live_status"] = _status(page)
        seen["pin_under_live"] = page.locator("#pinned-pane").is_visible()
        page.get_by_role("tab", name="Replay a recorded run").click()  # its run went, its pin stays
        page.wait_for_selector("#pinned-pane", state="visible")
        seen["pin_back_under_replay"] = page.locator("#pinned").inner_text().startswith("Pinned race · recording ")
    return seen


def lecture_screenshots(url: str, out: Path, sizes=((1920, 1080), (1280, 720)), timeout_s: float = 300.0) -> dict:
    """For each window size: race the default prompt and, while both lanes are still decoding, save the
    first screen (out/lecture-WxH.png). Returns, per size, whether the prompt, Race and both lanes'
    first tokens lay inside the window then."""
    seen = {}
    for width, height in sizes:
        with open_page(url, timeout_s, height=height, width=width) as page:
            page.wait_for_selector("#pair-status :text('ready')")
            page.locator("#prompt textarea").fill(DEFAULT_PROMPT)
            page.locator("#run").click()
            page.wait_for_function("document.querySelectorAll('#dflash-tokens .tok').length >= 16"
                                   " && document.querySelectorAll('#plain-tokens .tok').length >= 8")
            page.screenshot(path=str(out / f"lecture-{width}x{height}.png"))
            inside = {}
            for name, selector in (("prompt", "#prompt textarea"), ("race", "#run"),
                                   ("dflash", "#dflash-tokens .tok"), ("plain", "#plain-tokens .tok")):
                box = page.locator(selector).first.bounding_box()
                inside[name] = box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height
            inside["running"] = "running" in page.locator("#plain-stats").inner_text()
            seen[f"{width}x{height}"] = inside
    return seen


def open_lessons(url: str, keys: tuple[str, ...], timeout_s: float = 120.0) -> dict:
    """For each lesson, on a fresh page: one click on its button, then wait for its recording to be
    held at its first stop (or to finish, where that stop is the end). Returns each one's callout,
    control status and DFlash cycles on screen."""
    seen = {}
    with open_page(url, timeout_s) as page:
        for key in keys:
            page.goto(url)
            page.wait_for_selector("#replay-run")
            page.locator(f"#lesson-{key}").click()
            page.wait_for_selector("#lesson-callout :text('Lesson:')")
            page.wait_for_selector("#control-status :text-matches('Paused after|Finished')")
            seen[key] = {"callout": page.locator("#lesson-callout").inner_text(),
                         "status": _status(page), "bonus": _bonus_count(page)}
    return seen


def step_when_idle_and_switches(url: str, timeout_s: float = 90.0) -> dict:
    """In an app without models: Step with nothing playing, Step again, then the large-text and
    block-bar switches and the "How it works" tab. Returns what each showed."""
    seen = {}
    with open_page(url, timeout_s) as page:
        page.wait_for_selector("#replay-run")
        page.locator("#step").click()
        # Not the "Starting paused before cycle 1…" shown while the replay loads: the paused line itself.
        page.wait_for_selector("#control-status :text-matches('^Paused before cycle 1:')")
        seen["idle_step"] = (_status(page), _bonus_count(page))
        page.locator("#step").click()
        page.wait_for_selector("#control-status :text('after cycle 1')")
        seen["step"] = (_status(page), _bonus_count(page))
        page.locator("#large-text label").click()
        page.wait_for_function("document.body.classList.contains('large-text')")
        pane = page.locator("#dflash-tokens .dflash-pane")
        seen["token_px"] = float(pane.evaluate("e => getComputedStyle(e).fontSize")[:-2])
        seen["bar"] = page.locator("#dflash-tokens .tok-bonus").first.evaluate("e => getComputedStyle(e).boxShadow")
        page.locator("#block-bars label").click()
        page.wait_for_function("document.body.classList.contains('no-block-bars')")
        page.get_by_role("tab", name="How it works").click()
        page.wait_for_selector("#race-area", state="hidden")
        seen["area_under_howto"] = page.locator("#race-area").is_visible()
    return seen


def replay_screenshots(url: str, out: Path, cycles: int = 16, timeout_s: float = 180.0) -> None:
    """The README's pictures: a replay paused after `cycles` DFlash cycles with a rejected draft's
    hover box open (out/replay.png), and that cycle's "inside a cycle" view (out/inside-a-cycle.png)."""
    with open_page(url, timeout_s, height=1250) as page:
        page.wait_for_selector("#summary :text('Replaying')")
        box = page.locator("#replay-speed input[type=number]")
        box.fill("1")
        box.press("Enter")
        # The run the page started on loading has drawn `shown` tokens, and its last frame can arrive
        # after the restart emptied the pane: the restarted run is the one with fewer tokens.
        shown = page.locator("#dflash-tokens .tok").count()
        page.locator("#replay-run").click()
        page.wait_for_function(
            f"document.querySelectorAll('#dflash-tokens .tok').length < {shown}"
            f" && document.querySelectorAll('#dflash-tokens .tok-bonus').length >= {cycles}"
        )
        page.locator("#pause").click()
        page.wait_for_selector("#control-status :text('Paused')")
        page.wait_for_timeout(1500)
        page.locator("#cycle-panel").get_by_text("Inside a cycle").first.click()
        page.wait_for_selector("#cycle-view .cycle h4")
        page.wait_for_timeout(500)
        page.locator("#cycle-view").screenshot(path=str(out / "inside-a-cycle.png"))
        page.locator("#cycle-panel").get_by_text("Inside a cycle").first.click()  # closed again
        page.evaluate("window.scrollTo(0, 0)")
        token = page.locator("#dflash-tokens .tok-bonus").nth(6)  # a bonus token: the target replaced a draft
        token.hover()
        token.locator(".tip").wait_for(state="visible")
        page.wait_for_timeout(300)
        page.screenshot(path=str(out / "replay.png"))


def doctor_screenshot(url: str, out: Path, max_new_tokens: int = 48, timeout_s: float = 600.0) -> dict:
    """A short race, then "Why this tau?": waits for the doctor's report, opens the explanation of the
    measured-acceptance check, and saves the summary with the panel under it (out, a PNG). Returns
    the panel's text and the seconds from the click to the report."""
    with open_page(url, timeout_s) as page:
        page.wait_for_selector("#pair-status :text('ready')")
        set_max_new_tokens(page, max_new_tokens)
        page.locator("#prompt textarea").fill(DEFAULT_PROMPT)
        page.locator("#run").click()
        page.wait_for_selector("#summary :text('speedup')")
        clicked = time.perf_counter()
        page.locator("#doctor-run").click()
        page.wait_for_selector("#doctor .doctor-running")
        page.wait_for_selector("#doctor .doctor-report")
        seconds = time.perf_counter() - clicked
        page.locator('#doctor [data-check="acceptance"] summary').click()
        page.wait_for_timeout(300)
        screenshot_between(page, "#summary", "#doctor-panel", out)
        return {"seconds": round(seconds, 1), "panel": page.locator("#doctor").inner_text()}


def serving_screenshot(url: str, out: Path, max_new_tokens: int = 24, timeout_s: float = 600.0) -> dict:
    """The "Serving (vLLM)" tab: runs the sweep at its default levels with `max_new_tokens`, waits for
    its last status line, and saves the tab from its intro to the table (out, a PNG). Returns the
    status line, the table's text and the seconds from the click to the end."""
    with open_page(url, timeout_s) as page:
        page.get_by_role("tab", name="Serving (vLLM)").click()
        box = page.locator("#serving-tokens input[type=number]")
        box.fill(str(max_new_tokens))
        box.press("Enter")
        clicked = time.perf_counter()
        page.locator("#serving-run").click()
        page.wait_for_selector("#serving-status :text('running')")
        page.wait_for_selector("#serving-status :text-matches('Done|stopped')")
        seconds = time.perf_counter() - clicked
        page.wait_for_timeout(1000)  # the last figure drawn
        screenshot_between(page, "#serving-intro", "#serving-table", out)
        return {"seconds": round(seconds, 1), "status": page.locator("#serving-status").inner_text(),
                "table": page.locator("#serving-table").inner_text()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("output", type=Path)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--lanes", default="", help="lanes to add to DFlash and plain decoding, e.g. scheduled,ar,lookup")
    parser.add_argument("--cycle-lane", help="after the race, save the last cycle of this lane's \"Inside a cycle\" "
                        "view as OUTPUT's name with -cycle.png (dflash, tree, dflash2, fusion, ar, lookup)")
    parser.add_argument("--cycle", type=int, help="with --cycle-lane: that cycle rather than the last")
    parser.add_argument("--tree-budget", type=int, help="with --lanes tree: drafts per tree (the slider's value)")
    parser.add_argument(
        "--replay-shots", action="store_true",
        help="the app serves a replay (python app.py --replay FILE): save replay.png and inside-a-cycle.png in OUTPUT (a folder)",
    )
    parser.add_argument(
        "--lecture-shots", action="store_true",
        help="race the default prompt at 1920x1080 and 1280x720 and save the first screens in OUTPUT (a folder)",
    )
    parser.add_argument(
        "--doctor-shot", action="store_true",
        help="after a short race, click \"Why this tau?\" and save the summary and the doctor's panel as OUTPUT "
        "(a PNG)",
    )
    parser.add_argument(
        "--serving-shot", action="store_true",
        help="the app serves a vLLM pair (--vllm-url): run the serving view's sweep and save the tab as OUTPUT (a PNG)",
    )
    args = parser.parse_args(argv)
    if args.serving_shot:
        print(json.dumps(serving_screenshot(args.url, args.output, args.max_new_tokens or 24)))
        return
    if args.lecture_shots:
        args.output.mkdir(parents=True, exist_ok=True)
        print(json.dumps(lecture_screenshots(args.url, args.output)))
        return
    if args.doctor_shot:
        print(json.dumps(doctor_screenshot(args.url, args.output)))
        return
    if args.replay_shots:
        args.output.mkdir(parents=True, exist_ok=True)
        replay_screenshots(args.url, args.output)
        return
    lanes = tuple(name for name in args.lanes.split(",") if name)
    seen = run_race_in_browser(args.url, args.prompt, args.output, args.max_new_tokens, lanes=lanes,
                               cycle_lane=args.cycle_lane, cycle=args.cycle, tree_budget=args.tree_budget)
    print(json.dumps({k: seen[k] for k in ("first_token_s", "lane_tokens", "lanes_visible", "plots", "summary",
                                           "cycle_title")}))


if __name__ == "__main__":
    main()
