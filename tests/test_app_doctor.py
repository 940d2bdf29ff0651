"""The "Why this tau?" panel: the doctor's report rendered as text, never as markup; the
handler's run on the tiny pair, bounded and in the race queue; a vLLM pair and a replay-only app
refused with their messages."""

from __future__ import annotations

import html
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from app.guard.limits import Limits
from app.guard.readers import Readers
from app.serve.diagnosis import Ask, cli_command
from app.ui import App, build_demo
from app.view import doctor_panel, texts
from dflash_core.doctor import Check, Report

HOSTILE = '<img src=x onerror=alert(1)>'


def hand_built() -> Report:
    return Report({"target": "t", "drafter": "d"}, (
        Check("load", "pair loads", "PASS", "DFlash drafter, block 4", "The files are read first."),
        Check("wiring.rope", f"RoPE {HOSTILE}", "WARN", f"theta {HOSTILE} in one field", "RoPE <b>rotates</b>.",
              "RoPE written twice"),
        Check("template", "chat template (thinking)", "SKIP", "no thinking switch", "Thinking on or off."),
        Check("wiring.layer_shift", "target_layer_ids probe", "FAIL", "tau 1.2 at [1]; 3.9 shifted by +1",
              "Layers probed one off.", f"target_layer_ids off by one {HOSTILE}"),
        Check("acceptance", "measured acceptance", "PASS", "tau 1.20 over 40 cycles", "tau is ...",
              numbers={"tau": 1.2}),
    ))


def test_the_report_shows_every_check_and_cause_as_text():
    report = hand_built()
    page = doctor_panel.report_html(report, "tiny pair", "3 prompts", f"python -m dflash_core doctor {HOSTILE}")
    assert "<img" not in page and "<b>rotates" not in page
    assert page.count(html.escape(HOSTILE)) == 5  # title, summary, cause (row and verdict), command
    for check in report.checks:
        assert f'data-check="{check.id}" data-status="{check.status}"' in page
        assert html.escape(check.title) in page and html.escape(check.summary) in page
        assert html.escape(check.explanation) in page
    # the causes, failures first, in the verdict; each also beside its check
    verdict = doctor_panel.verdict_html(report)
    causes = re.findall(r'class="doctor-cause"[^>]*>([^<]*)<', verdict)
    assert causes == [html.escape(c) for c in report.causes] == [html.escape(f"target_layer_ids off by one {HOSTILE}"),
                                                                "RoPE written twice"]
    assert page.count('class="doctor-cause"') == 4
    assert 'data-status="FAIL"' in verdict and html.escape("tau 1.20 on the doctor's prompts") in verdict
    assert "tiny pair" in page and "3 prompts" in page


def test_a_pair_with_nothing_wrong_is_told_so():
    healthy = Report({}, tuple(c for c in hand_built().checks if c.status in ("PASS", "SKIP")))
    verdict = doctor_panel.verdict_html(healthy)
    assert 'data-status="PASS"' in verdict and "Nothing found that lowers tau" in verdict
    assert "doctor-cause" not in doctor_panel.report_html(healthy)


# --- the handler ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_app(tiny_dirs, one_thread):
    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair

    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    app = App([spec], spec.id, PairCache("cpu"))
    app.diagnosis.ask = Ask(prompts=1, max_new_tokens=4)
    return app


def test_the_doctor_runs_on_the_selected_pair_and_renders_its_report(tiny_app):
    shown = list(tiny_app.diagnosis.diagnose("cli"))
    assert all("The doctor is at work" in page and data is None for page, data in shown[:-1])
    assert any("decoding 1 prompts (4 new tokens each)" in page for page, _ in shown)
    page, data = shown[-1]
    assert data["format"] == "dflash-doctor/1" and data["pair"]["drafter"] == tiny_app.pairs["cli"].drafter
    assert data["pair"]["max_new_tokens"] == 4 and len(data["pair"]["prompts"]) == 1
    ids = [c["id"] for c in data["checks"]]
    assert {"load", "acceptance", "wiring.layer_shift"} <= set(ids)
    assert re.findall(r'data-check="([^"]+)"', page) == ids
    assert "1 prompts of natural.jsonl, 4 new tokens each" in page
    assert html.escape(cli_command(tiny_app.pairs["cli"])) in page
    assert not tiny_app.cache.get(tiny_app.pairs["cli"]).lock.locked()


def test_the_doctor_waits_for_a_race_on_the_pair_within_the_time_limit(tiny_app):
    pair = tiny_app.cache.get(tiny_app.pairs["cli"])
    tiny_app.diagnosis.limits = Limits(max_race_s=1)
    try:
        with pair.lock:  # a race holds the pair's caches
            shown = list(tiny_app.diagnosis.diagnose("cli"))
    finally:
        tiny_app.diagnosis.limits = tiny_app.limits
    assert any(texts.DOCTOR_WAITING in page for page, _ in shown)
    page, data = shown[-1]
    assert data is None and html.escape(texts.DOCTOR_BUSY.format(seconds=1)) in page


def test_the_doctor_waiting_for_a_compiling_step_names_it(tiny_app):
    from app.pairs.compiled import CompiledLanes, Step

    pair = tiny_app.cache.get(tiny_app.pairs["cli"])
    tiny_app.diagnosis.limits = Limits(max_race_s=1)
    pair.compiled = CompiledLanes(pair.target, pair.drafter)  # never started
    step = Step("plain", 1)
    try:
        with pair.lock:  # what the compile thread holds while it compiles `step`
            pair.compiled.current = step
            shown = list(tiny_app.diagnosis.diagnose("cli"))
    finally:
        tiny_app.diagnosis.limits, pair.compiled = tiny_app.limits, None
    waiting = html.escape(texts.DOCTOR_WAITING_STEP.format(step=step.describe()))
    assert any(waiting in page for page, _ in shown), shown[0][0]
    assert not pair.races_waiting()  # the doctor's place in the queue went with it


def test_the_doctor_stops_once_nobody_reads_the_page(tiny_app):
    readers = Readers(grace_s=0)
    readers.opened("gone"), readers.closed("gone")
    tiny_app.diagnosis.readers = readers
    try:
        page, data = list(tiny_app.diagnosis.diagnose("cli", SimpleNamespace(session_hash="gone")))[-1]
    finally:
        tiny_app.diagnosis.readers = tiny_app.readers
    assert data is None and "the visitor left" in page
    assert not tiny_app.cache.get(tiny_app.pairs["cli"]).lock.locked()


def test_a_vllm_pair_gets_the_command_that_asks_its_server():
    from app.pairs.models import PairCache
    from app.pairs.registry import vllm_pair

    app = App([vllm_pair("http://127.0.0.1:9", None, 4)], "vllm", PairCache("cpu"))
    [(page, data)] = list(app.diagnosis.diagnose("vllm"))
    assert data is None and html.escape(texts.DOCTOR_VLLM) in page
    assert "python -m dflash_core doctor --target TARGET --drafter DRAFTER --server http://127.0.0.1:9" in page


def test_no_model_and_unknown_pairs_are_errors(tiny_app):
    with pytest.raises(gr.Error) as caught:
        list(App([], "", None).diagnosis.diagnose("cli"))
    assert caught.value.message == html.escape(texts.NO_MODEL, quote=False)
    with pytest.raises(gr.Error) as caught:
        list(tiny_app.diagnosis.diagnose(HOSTILE))
    assert "<img" not in caught.value.message and "Unknown model pair" in caught.value.message


def test_the_button_runs_in_the_race_queue_and_only_where_pairs_race_live(tiny_app):
    demo = build_demo(list(tiny_app.pairs.values()), "cli", tiny_app.cache, Limits(concurrency=2))
    fns = {f.api_name: f for f in demo.fns.values()}
    assert fns["diagnose"].concurrency_id == fns["compare"].concurrency_id == "race"
    assert fns["diagnose"].concurrency_limit == fns["compare"].concurrency_limit == 2
    replay_only = build_demo([], "", live=False)
    assert "diagnose" not in {f.api_name for f in replay_only.fns.values()}


def test_a_doctor_whose_visitor_left_frees_the_pair_within_a_cycle_not_a_step(tiny_app, monkeypatch):
    import time

    import dflash_core.decoding as decoding
    import dflash_core.doctor.measure as measure

    real = decoding.generate

    def slow(*args, **kwargs):  # a cycle of a big pair: each of the step's 48 x 2 cycles takes 50 ms
        for event in real(*args, **kwargs):
            time.sleep(0.05)
            yield event

    monkeypatch.setattr(decoding, "generate", slow)
    monkeypatch.setattr(measure, "generate", slow, raising=False)
    monkeypatch.setattr(tiny_app.diagnosis, "ask", Ask(prompts=2, max_new_tokens=48))
    pair = tiny_app.cache.get(tiny_app.pairs["cli"])
    shown = tiny_app.diagnosis.diagnose("cli")
    next(page for page, _ in shown if "decoding 2 prompts" in page)  # the first step has started
    time.sleep(0.2)
    assert pair.lock.locked()
    shown.close()  # the visitor left
    left = time.perf_counter()
    while pair.lock.locked() and time.perf_counter() - left < 10:
        time.sleep(0.01)
    assert time.perf_counter() - left < 0.5  # the step alone takes about 5 s
