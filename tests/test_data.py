"""Training data: held-out prompts stay out of the committed data, and datagen refuses a partial prompt pool."""

from __future__ import annotations

import json

import pytest

from dflash_core import datagen, prompts

DATA_DIR = prompts.REPO_ROOT / "assets" / "data" / "smollm2-135m-instruct"


def test_committed_data_holds_no_benchmark_prompt():
    bench_ids = {json.loads(line)["id"] for line in prompts.HELDOUT_JSONL.read_text().splitlines()}
    data_ids = datagen.done_prompt_ids(DATA_DIR)
    assert len(bench_ids) >= 100 and len(data_ids) > 10_000
    assert not bench_ids & data_ids


def test_datagen_refuses_a_partial_prompt_pool(tmp_path, monkeypatch):
    monkeypatch.setitem(prompts.SOURCE_PACKAGES, "fake", ("no_such_module_for_dflash", "no-such-package"))
    with pytest.raises(SystemExit, match=r"fake.*requirements-train\.txt"):
        datagen.run(tmp_path, limit=0)
    datagen.run(tmp_path, limit=0, allow_missing_sources=True)  # the escape hatch: nothing to do, no error
    assert not list(tmp_path.iterdir())
