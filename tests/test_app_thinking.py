"""The thinking switch in the app: a tiny pair whose chat template reads `enable_thinking` races with
thinking on or off, every lane on the same prompt ids; the status line says which setting is used
beside the drafter's trained one, the trace records both and a replay says them; a template without
the switch hides the control and refuses a forced setting; bad values are named; a vLLM pair, whose
servers apply the template, refuses a setting and races to its end without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import THINKING_CHATML, build_drafter, build_target

import dflash_core
from app.pairs.models import PairCache
from app.pairs.registry import PairSpec, cli_pair
from app.serve.replay import load_trace
from app.ui import App
from app.view.frames import FRAME_FIELDS
from dflash_core.loading.chat_template import template_args
from dflash_core.loading.prompting import encode_prompt
from dflash_core.trace import TraceFieldError, validate_trace

PROMPT = "What is the capital of France?"
EMPTY_THINK = "<think>\n\n</think>\n\n"
TRAINED_OFF = "the drafter was trained with thinking off"
DIFFERS = "⚠ the drafter was trained with thinking off: acceptance drops when the template differs from training"


@pytest.fixture(scope="module")
def thinking_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("app-thinking")
    target = build_target(root / "target", chat_template=THINKING_CHATML)
    return target, build_drafter(root / "drafter", target, block_size=4)


TRAINED = {"enable_thinking": False}  # the tiny pair's drafter, as pairs.json would record it


def thinking_app(dirs, trained: dict | None = None) -> tuple[App, PairSpec]:
    spec = PairSpec(id="tiny-thinking", label="tiny thinking pair", target=str(dirs[0]), drafter=str(dirs[1]),
                    chat_template_args=trained)
    return App([spec], spec.id, PairCache("cpu")), spec


@pytest.fixture(scope="module")
def app(thinking_dirs, one_thread):
    app, _ = thinking_app(thinking_dirs, TRAINED)
    return app


def race(app, thinking, monkeypatch) -> tuple[dict, dict[str, list[int]]]:
    """The race's last frame by field, and the prompt ids each lane's `generate` was given."""
    seen = {}
    generate = dflash_core.generate

    def recording(target, prompt_ids, drafter=None, **kwargs):
        seen[len(seen)] = list(prompt_ids)
        return generate(target, prompt_ids, drafter, **kwargs)

    monkeypatch.setattr(dflash_core, "generate", recording)
    *_, last = app.live.compare(PROMPT, 6, 4, 0.0, 1.0, 0, ["lookup"], thinking=thinking)
    return dict(zip(FRAME_FIELDS, last)), seen


def test_the_switch_changes_the_prompt_every_lane_races_on(app, monkeypatch):
    tokenizer = app.cache.get(app.pairs["tiny-thinking"]).tokenizer
    ids = {}
    for choice in ("on", "off", "default"):
        out, seen = race(app, choice, monkeypatch)
        assert len(seen) == 3  # DFlash, prompt lookup, plain decoding: one prompt for all three
        assert all(lane == seen[0] for lane in seen.values())
        ids[choice] = seen[0]
        trace = validate_trace(out["trace_file"])
        assert trace["settings"]["prompt_ids"] == seen[0]
        assert trace["report"]["lanes"]["dflash"]["identical"] is True
    expected_on = encode_prompt(tokenizer, PROMPT, template_args=template_args(tokenizer, "on"))
    assert ids["on"] == expected_on and not tokenizer.decode(ids["on"]).endswith(EMPTY_THINK)
    assert tokenizer.decode(ids["off"]).endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    assert ids["default"] == ids["off"]  # the pair's drafter was trained with thinking off


def test_the_trace_records_the_setting_and_a_replay_says_it(app, monkeypatch):
    out, _ = race(app, "on", monkeypatch)
    trace = validate_trace(out["trace_file"])
    assert trace["settings"]["thinking"] == "on" and trace["pair"]["trained_thinking"] == "off"
    assert trace["pair"]["chat_template"] == "the target's chat template, thinking on (enable_thinking=True)"
    assert load_trace(out["trace_file"]).thinking.words() == f"thinking on; {DIFFERS}"
    assert f"Raced with thinking on; {DIFFERS}." in out["summary"]  # the live summary says what a replay says
    *_, replayed = app.playback.replay(out["trace_file"], None, 4.0)
    assert f"Raced with thinking on; {DIFFERS}." in dict(zip(FRAME_FIELDS, replayed))["summary"]
    off, _ = race(app, None, monkeypatch)  # omitted: the pair's default
    assert validate_trace(off["trace_file"])["settings"]["thinking"] == "off"
    assert load_trace(off["trace_file"]).thinking.words() == f"thinking off; {TRAINED_OFF}"


def test_a_trace_with_a_bad_thinking_setting_is_named(app, monkeypatch, tmp_path):
    out, _ = race(app, "off", monkeypatch)
    trace = json.loads(Path(out["trace_file"]).read_text())
    for where, key in (("settings", "thinking"), ("pair", "trained_thinking")):
        bad = json.loads(json.dumps(trace))
        bad[where][key] = "sometimes"
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(TraceFieldError, match=rf"trace\.{where}\.{key} is 'sometimes'; expected one of \('on', 'off'\)"):
            validate_trace(path)


def test_the_status_line_says_the_setting_used_and_the_trained_one(app):
    *_, (status, _) = app.loading.load_selected("tiny-thinking")
    assert f"thinking off (enable_thinking=False) — {TRAINED_OFF};" in status and "⚠" not in status
    assert app.loading.thinking_control("tiny-thinking")["visible"] is True
    on = app.loading.thinking_status("tiny-thinking", "on")
    assert f"thinking on (enable_thinking=True) — {DIFFERS};" in on
    assert app.loading.thinking_status("tiny-thinking", "off") == app.loading.thinking_status("tiny-thinking", "default") == status
    assert app.loading.thinking_status("tiny-thinking", "maybe") == (
        "⚠ thinking must be one of default, on, off, got 'maybe'.")


def test_bad_values_are_named(app):
    for value, shown in (("maybe", "'maybe'"), (1, "'int'"), (["on"], "'list'")):
        with pytest.raises(Exception, match=rf"thinking must be one of default, on, off, got {shown}\."):
            list(app.live.compare(PROMPT, 4, 4, 0.0, 1.0, 0, [], None, thinking=value))


def test_a_pair_whose_setting_is_not_recorded_says_so(thinking_dirs, one_thread):
    app, spec = thinking_app(thinking_dirs, trained={})  # the template's own default: this one thinks
    *_, (status, _) = app.loading.load_selected(spec.id)
    assert "prompts through the target's chat template — the drafter's thinking setting is not recorded;" in status
    assert app.cache.get(spec).thinking().used == "on"
    assert "thinking off (enable_thinking=False) — the drafter's thinking setting is not recorded;" in (
        app.loading.thinking_status(spec.id, "off"))


def test_a_template_without_the_switch_hides_the_control_and_refuses_a_setting(tiny_dirs, one_thread):
    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))  # a ChatML template with no enable_thinking
    app = App([spec], spec.id, PairCache("cpu"))
    assert app.loading.thinking_control(spec.id)["visible"] is False  # not loaded yet
    *_, (status, _) = app.loading.load_selected(spec.id)
    assert "prompts through the target's chat template — the chat template has no thinking switch;" in status
    assert app.loading.thinking_control(spec.id)["visible"] is False
    for choice in ("on", "off"):
        with pytest.raises(Exception, match=rf"its chat template has no thinking switch \(enable_thinking\), so a "
                                            rf"race on it cannot turn thinking {choice}; leave thinking at the pair's default"):
            list(app.live.compare(PROMPT, 4, 4, 0.0, 1.0, 0, [], None, thinking=choice))
    *_, last = app.live.compare(PROMPT, 4, 4, 0.0, 1.0, 0, [], None, thinking="default")
    trace = validate_trace(dict(zip(FRAME_FIELDS, last))["trace_file"])
    assert "thinking" not in trace["settings"] and "trained_thinking" not in trace["pair"]
    assert "Raced with" not in dict(zip(FRAME_FIELDS, last))["summary"]


def test_a_vllm_pair_refuses_a_thinking_setting_before_asking_its_servers():
    from app.pairs.registry import vllm_pair

    spec = vllm_pair("http://127.0.0.1:9/v1", None, 4)  # nothing listens there: the refusal comes first
    app = App([spec], spec.id, PairCache("cpu"))
    assert app.loading.thinking_control(spec.id)["visible"] is False
    with pytest.raises(Exception, match="A vLLM pair's servers wrap the prompt in the chat template themselves, so this "
                                        "app cannot turn thinking off for them"):
        list(app.live.compare(PROMPT, 4, 4, 0.0, 1.0, 0, [], None, thinking="off"))


def test_a_vllm_pairs_race_ends_with_its_trace_and_no_thinking_note(tiny_dirs):
    """The servers apply the chat template themselves, so the trace records no settings; the race
    still ends with its final frame and trace (fake servers in this process, serving the tiny target)."""
    from fake_vllm import FakeVllm

    from app.pairs.registry import vllm_pair

    served = {"root": str(tiny_dirs[0]), "vocab_size": 300}
    dflash, plain = FakeVllm(k=3, accepted=1, **served), FakeVllm(**served)
    try:
        spec = vllm_pair(dflash.url, plain.url, 4)
        app = App([spec], spec.id, PairCache("cpu"))
        *_, last = app.live.compare(PROMPT, 8, 4, 0.0, 1.0, 0)
    finally:
        dflash.close(), plain.close()
    named = dict(zip(FRAME_FIELDS, last))
    trace = json.loads(Path(named["trace_file"]).read_text())
    assert trace["format"] == "vllm-race" and "settings" not in trace
    assert sum(len(b["committed_ids"]) for b in trace["runs"]["dflash"]["blocks"]) + 1 == 8  # + the prefill's id
    assert "Raced with" not in named["summary"]
