"""The reference benchmark's datasets: prompt text per dataset, MT-Bench's turn order, the reasoning
switch per template kind, and clear errors, all on the fixtures of tests/fixtures/datasets (each in
its Hub repo's layout, read by the same `load_dataset` call as the Hub)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import CHATML, THINKING_CHATML, build_tokenizer

from dflash_core import DFlashError
from dflash_core.bench import datasets as bench_datasets
from dflash_core.bench import paper_table
from dflash_core.bench.__main__ import main
from dflash_core.bench.datasets import SETS, load_samples, seen_in_training
from dflash_core.loading.chat_template import describe_template, reasoning_args
from dflash_core.loading.prompting import encode_chat

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = str(ROOT / "tests" / "fixtures" / "datasets")
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """The datasets cache in this test's folder, and torch's thread count restored after `--threads`."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def turns(name: str, **kwargs) -> dict[int, tuple[str, ...]]:
    samples, where = load_samples(name, source=FIXTURES, **kwargs)
    assert where.startswith("local:") and where.endswith(SETS[name].hub_id)
    return {s.row: s.turns for s in samples}


def test_each_dataset_is_worded_as_the_reference_words_it():
    assert turns("gsm8k")[0] == ("A baker fills 4 trays with 6 rolls each. How many rolls does she bake?" + BOXED,)
    assert turns("math500")[1] == ("How many positive divisors does 12 have?" + BOXED,)
    stub = 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n    >>> add(2, 3)\n    5\n    """\n'
    assert turns("humaneval")[0] == (
        f"Write a solution to the following problem and make sure that it passes the tests:\n```python\n{stub}\n```",)
    # The sanitized config's `prompt`, as is (the full config has `text` instead).
    assert turns("mbpp") == {0: ("Write a function to reverse a string.",),
                             1: ("Write a python function to find the largest of three numbers.",)}
    assert turns("mt-bench")[1] == ("What is 12 times 12?", "Divide your answer by 4 and explain each step.")


def reference_rows(rows: list, max_samples: int | None) -> list:
    """The rows the reference's transformers path races, restated: it seeds Python's global generator
    with 0, and only when asked for fewer rows than the file holds does it shuffle them (once, in place)
    and keep the first ones; otherwise every row, in file order."""
    random.seed(0)
    if max_samples is None or max_samples >= len(rows):
        return rows
    rows = list(rows)
    random.shuffle(rows)
    return rows[:max_samples]


@pytest.mark.parametrize("name", list(SETS))
def test_samples_are_the_references_choice(name):
    rows, _ = bench_datasets.load_rows(SETS[name], FIXTURES)
    state = random.getstate()
    try:
        for count in (1, 2, None):
            chosen = [SETS[name].turns(row) for row in reference_rows(rows, count)]
            assert [list(s.turns) for s in load_samples(name, count, FIXTURES)[0]] == chosen
        # On a split the size of HumanEval's, 128 rows as the reference picks them.
        assert bench_datasets.select(list(range(164)), 128) == reference_rows(list(range(164)), 128)
    finally:
        random.setstate(state)
    if len(rows) == 3:  # seed 0 shuffles 3 rows to 0, 2, 1 (seed 42 gave 1, 0, 2); all 3 asked: file order
        assert [s.row for s in load_samples(name, 2, FIXTURES)[0]] == [0, 2]
        assert [s.row for s in load_samples(name, 3, FIXTURES)[0]] == [0, 1, 2]


def test_a_short_split_is_an_error():
    with pytest.raises(DFlashError, match=r"gsm8k: its test split has 3 rows, fewer than the 4 asked for"):
        load_samples("gsm8k", 4, FIXTURES)
    with pytest.raises(DFlashError, match="--max-samples must be at least 1, got 0"):
        load_samples("gsm8k", 0, FIXTURES)


def test_unknown_and_unsupported_datasets_are_named(capsys):
    with pytest.raises(DFlashError, match=r"unknown dataset\(s\) 'gsm9k'; choose from gsm8k, math500, humaneval, "
                                          r"mbpp, mt-bench"):
        load_samples("gsm9k")
    for name, label in (("aime25", "AIME25"), ("livecodebench", "LiveCodeBench")):
        with pytest.raises(DFlashError, match=rf"dataset '{name}' \({label}\) is not supported: .* no prompt format"):
            load_samples(name)
    with pytest.raises(SystemExit) as stop:
        main(["--dataset", "gsm8k,nope"])
    assert stop.value.code == 2 and "unknown dataset(s) 'nope'" in capsys.readouterr().err


def test_a_dataset_the_hub_cannot_serve_offline_is_a_clear_error(tmp_path):
    """Offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) with an empty cache, in a fresh process: both are
    read when `datasets` is imported."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    code = ("from dflash_core.bench.datasets import load_samples\n"
            "try:\n    load_samples('mt-bench', 1)\nexcept Exception as exc:\n    print(type(exc).__name__, exc)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.stdout.startswith("DatasetError mt-bench: could not reach HuggingFaceH4/mt_bench_prompts on the Hub, "
                                  "and the datasets cache has no copy"), done.stdout + done.stderr
    assert "--datasets-from DIR" in done.stdout


def test_local_copies_must_exist_and_have_the_hubs_columns(tmp_path):
    with pytest.raises(DFlashError, match=r"gsm8k: no local copy of openai/gsm8k at .*missing/openai/gsm8k"):
        load_samples("gsm8k", 1, str(tmp_path / "missing"))
    wrong = tmp_path / "HuggingFaceH4" / "MATH-500"
    wrong.mkdir(parents=True)
    (wrong / "test.jsonl").write_text(json.dumps({"question": "1 + 1?"}) + "\n")
    with pytest.raises(DFlashError, match=r"math500: row 0 of .* has no column 'problem'; its columns are question"):
        load_samples("math500", 1, str(tmp_path))


def test_humaneval_from_the_package_that_ships_it(tmp_path, monkeypatch):
    """`--datasets-from pypi` reads the package's gzipped JSON lines (human-eval's layout) through
    `load_dataset("json")`; a stand-in package keeps the test offline and independent of installs."""
    package = tmp_path / "fake_human_eval"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    rows = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n", "entry_point": f"f{i}",
             "canonical_solution": "    pass\n", "test": ""} for i in range(3)]
    with gzip.open(package / "data" / "HumanEval.jsonl.gz", "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = SETS["humaneval"]
    monkeypatch.setitem(SETS, "humaneval", dataclasses.replace(
        spec, package=("fake_human_eval", "data/HumanEval.jsonl.gz", "fake-human-eval==1")))
    samples, where = load_samples("humaneval", 2, "pypi")
    assert where == "pypi:fake-human-eval==1" and [s.row for s in samples] == [0, 2]  # seed 0 on 3 rows
    assert samples[1].turns[0].endswith("```python\ndef f2():\n\n```")
    monkeypatch.setitem(SETS, "humaneval", dataclasses.replace(spec, package=("no_such_pkg", "x", "no-such-pkg==1")))
    with pytest.raises(DFlashError, match=r"humaneval from PyPI needs the package no-such-pkg==1: pip install"):
        load_samples("humaneval", 1, "pypi")
    with pytest.raises(DFlashError, match="no PyPI package ships gsm8k's rows"):
        load_samples("gsm8k", 1, "pypi")


def test_humaneval_figures_of_the_shipped_drafters_are_marked_as_seen_in_training(tmp_path):
    shipped = ROOT / "assets" / "drafters" / "smollm2-135m-instruct-dflash"
    assert "trained on HumanEval" in seen_in_training("humaneval", shipped)
    assert seen_in_training("humaneval", tmp_path / "my-drafter") is None
    assert seen_in_training("gsm8k", shipped) is None
    assert bench_datasets.SHIPPED_DRAFTERS.is_dir()


LEVEL_TEMPLATE = CHATML.replace(
    "<|im_start|>assistant\n{% endif %}",
    "{% if reasoning_effort is defined %}<|im_start|>system\nReasoning: {{ reasoning_effort }}<|im_end|>\n{% endif %}"
    "<|im_start|>assistant\n{% endif %}",
)


@pytest.mark.parametrize("kind, template, thinking, args, prompt_end", [
    ("enable_thinking", THINKING_CHATML, None, {"enable_thinking": False}, "assistant\n<think>\n\n</think>\n\n"),
    ("enable_thinking", THINKING_CHATML, "on", {"enable_thinking": True}, "<|im_start|>assistant\n"),
    ("reasoning_effort", LEVEL_TEMPLATE, "high", {"reasoning_effort": "high"},
     "Reasoning: high<|im_end|>\n<|im_start|>assistant\n"),
    ("reasoning_strength", LEVEL_TEMPLATE.replace("reasoning_effort", "reasoning_strength"), "low",
     {"reasoning_strength": "low"}, "Reasoning: low<|im_end|>\n<|im_start|>assistant\n"),
    ("none", CHATML, None, {}, "Hi<|im_end|>\n<|im_start|>assistant\n"),
])
def test_the_reasoning_switch_follows_the_template_kind(kind, template, thinking, args, prompt_end):
    tok = build_tokenizer(chat_template=template)
    assert reasoning_args(tok, thinking) == args
    assert tok.decode(encode_chat(tok, [{"role": "user", "content": "Hi"}], args)).endswith(prompt_end)


def test_a_reasoning_level_the_template_cannot_take_is_an_error():
    with pytest.raises(DFlashError, match=r"reasoning level 'high' .* reads neither reasoning_strength nor "
                                          r"reasoning_effort: it has only the enable_thinking switch \(on or off\)"):
        reasoning_args(build_tokenizer(chat_template=THINKING_CHATML), "high")
    with pytest.raises(DFlashError, match="it has no reasoning switch"):
        reasoning_args(build_tokenizer(), "medium")
    with pytest.raises(DFlashError, match="no enable_thinking switch"):
        reasoning_args(build_tokenizer(chat_template=LEVEL_TEMPLATE), "on")
    tok = build_tokenizer(chat_template=LEVEL_TEMPLATE)
    assert describe_template(tok, {"reasoning_effort": "high"}) == "the target's chat template, reasoning_effort='high'"


def test_mt_bench_asks_turn_two_after_the_targets_own_answer(tiny_dirs, monkeypatch, capsys):
    """The whole table on the tiny pair, every dataset from its fixture; MT-Bench's prompts recorded."""
    target_dir, drafter_dir = tiny_dirs
    seen = []

    def recording(tokenizer, messages, template_args=None):
        seen.append([dict(m) for m in messages])
        return encode_chat(tokenizer, messages, template_args)

    monkeypatch.setattr(paper_table, "encode_chat", recording)
    assert main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--dataset", "gsm8k,mt-bench,humaneval",
                 "--max-samples", "2", "--datasets-from", FIXTURES, "--max-new-tokens", "10", "--block-sizes", "4",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    rows = result["datasets"]
    assert list(rows) == ["gsm8k", "mt-bench", "humaneval"] and result["block_size"] == 4
    assert {n: (r["samples"], r["turns"]) for n, r in rows.items()} == {
        "gsm8k": (2, 2), "mt-bench": (2, 4), "humaneval": (2, 2)}
    for r in rows.values():
        assert r["identical"] == 1.0 and r["lossless"] == {"identical": r["turns"], "near_tie": 0, "diverged": 0}
        assert len(r["histogram"]) == 4 and abs(sum(r["histogram"]) - 1) < 1e-9
        assert r["tau"] >= 1.0 and r["speedup"] > 0 and r["seen_in_training"] is None
    assert rows["mt-bench"]["source"].endswith("HuggingFaceH4/mt_bench_prompts")
    # The warm-up, then per turn: gsm8k x2, then MT-Bench's rows 0 and 1 (both of its 2: file order)
    # with two turns each.
    mt = seen[3:7]
    first, second = ("What is 12 times 12?", "Divide your answer by 4 and explain each step.")
    assert mt[0][0]["content"] == "Write a short poem about the sea."
    assert [m["content"] for m in mt[2]] == [first]
    assert [m["role"] for m in mt[3]] == ["user", "assistant", "user"]
    assert mt[3][0]["content"] == first and mt[3][2]["content"] == second
    # The assistant message is the target's own (plain, greedy) answer to turn 1, special tokens dropped.
    from dflash_core import Target, run

    target = Target.from_pretrained(target_dir)
    ids = encode_chat(target.tokenizer, mt[2])
    plain = run(target, ids, max_new_tokens=10, stop_ids=[target.tokenizer.eos_token_id])
    assert mt[3][1]["content"] == target.tokenizer.decode(plain.output_ids, skip_special_tokens=True)
    assert any(line.startswith("mt-bench") for line in out) and any("histogram" in line for line in out)


def test_the_dataset_table_refuses_the_other_races(tiny_dirs, capsys):
    target_dir, drafter_dir = tiny_dirs
    with pytest.raises(SystemExit):
        main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--dataset", "gsm8k",
              "--methods", "plain,dflash"])
    assert "--dataset races plain decoding and DFlash" in capsys.readouterr().err
