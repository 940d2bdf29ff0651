"""Chat template arguments: Qwen3 pairs prompt without thinking, and every front end says which template it used."""

from __future__ import annotations

import json

import pytest
from tiny import THINKING_CHATML, build_drafter, build_target, build_tokenizer

from app.pairs.models import PairCache
from app.pairs.registry import PairSpec, load_pairs
from app.ui import App
from dflash_core import DFlashError
from dflash_core.__main__ import main as cli_main
from dflash_core.bench.__main__ import main as bench_main
from dflash_core.loading.chat_template import describe_template, has_thinking_switch, template_args
from dflash_core.loading.prompting import encode_prompt

EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def thinking_tokenizer():
    return build_tokenizer(chat_template=THINKING_CHATML)


@pytest.fixture(scope="module")
def thinking_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("thinking")
    target = build_target(root / "target", chat_template=THINKING_CHATML)
    return target, build_drafter(root / "drafter", target)


def prompt_text(tokenizer, args):
    return tokenizer.decode(encode_prompt(tokenizer, "Hi", template_args=args))


def test_thinking_off_opens_the_answer_with_an_empty_think_block(thinking_tokenizer):
    tok = thinking_tokenizer
    assert has_thinking_switch(tok) and not has_thinking_switch(build_tokenizer())
    assert template_args(tok) == {"enable_thinking": False}  # what the released drafters were trained with
    assert prompt_text(tok, template_args(tok)).endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    assert prompt_text(tok, None) == prompt_text(tok, template_args(tok))  # the Python API's default
    assert prompt_text(tok, {}).endswith("<|im_start|>assistant\n")  # the template's own default: thinking on
    on = template_args(tok, "on")
    assert on == {"enable_thinking": True}
    assert prompt_text(tok, on).endswith("<|im_start|>assistant\n")
    assert describe_template(tok, on) == "the target's chat template, thinking on (enable_thinking=True)"


def test_templates_without_the_switch_get_no_arguments_and_refuse_thinking():
    tok = build_tokenizer()
    assert template_args(tok) == {} and template_args(tok, None, {"enable_thinking": False}) == {}
    assert describe_template(tok, {}) == "the target's chat template"
    with pytest.raises(DFlashError, match="no enable_thinking switch"):
        template_args(tok, "on")


def test_qwen3_pairs_carry_non_thinking_arguments():
    pairs, _ = load_pairs()
    by_id = {p.id: p for p in pairs}
    assert by_id["qwen3-8b"].chat_template_args == {"enable_thinking": False}
    assert by_id["qwen3-4b"].chat_template_args == {"enable_thinking": False}
    assert by_id["smollm2-135m"].chat_template_args is None


def test_app_encodes_with_the_pairs_arguments_and_names_the_template(thinking_dirs):
    target, drafter = thinking_dirs
    statuses = {}
    for thinking in (False, True):
        spec = PairSpec(id=f"t{thinking}", label="tiny thinking", target=str(target), drafter=str(drafter),
                        chat_template_args={"enable_thinking": thinking})
        app = App([spec], spec.id, PairCache("cpu"))
        *_, (status, _) = app.loading.load_selected(spec.id)
        pair = app.cache.get(spec)
        statuses[thinking] = status
        assert pair.tokenizer.decode(pair.encode("Hi")).endswith(EMPTY_THINK) is not thinking
    assert "thinking off (enable_thinking=False)" in statuses[False]
    assert "thinking on (enable_thinking=True)" in statuses[True]


def test_cli_thinking_flag(thinking_dirs, capsys):
    target, drafter = thinking_dirs
    for flag, expected in ((None, "thinking off"), ("on", "thinking on"), ("off", "thinking off")):
        args = ["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "Hi",
                "--max-new-tokens", "3"] + (["--thinking", flag] if flag else [])
        assert cli_main(args) == 0
        assert f"[prompt: the target's chat template, {expected}" in capsys.readouterr().err


def test_cli_thinking_on_a_template_without_the_switch_is_a_clear_error(tiny_dirs, capsys):
    target, drafter = tiny_dirs
    code = cli_main(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "Hi",
                     "--thinking", "on"])
    assert code == 1 and "no enable_thinking switch" in capsys.readouterr().err


def test_bench_thinking_flag_reaches_the_prompts(thinking_dirs, tmp_path, capsys):
    target, drafter = thinking_dirs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hi"}))
    common = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--num-prompts", "1",
              "--max-new-tokens", "4", "--block-sizes", "4"]
    results = {}
    for flag in ("on", "off"):
        assert bench_main([*common, "--thinking", flag]) == 0
        results[flag] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert results["on"]["chat_template"].endswith("thinking on (enable_thinking=True)")
    assert results["off"]["chat_template"].endswith("thinking off (enable_thinking=False)")
