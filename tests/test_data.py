"""Training data: held-out prompts stay out of the committed data, and datagen refuses a partial prompt pool."""

from __future__ import annotations

import json

import pytest

from dflash_core.training import datagen, prompts

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


def test_datagen_can_answer_only_some_sources():
    natural = datagen.pending_prompts(set(), sources={"natural"})
    assert len(natural) > 500 and {p.source for p in natural} == {"natural"}
    everything = datagen.pending_prompts(set())
    assert [p for p in everything if p.source == "natural"] == natural  # same order as the full run
    done = {p.id for p in natural[::2]}
    assert datagen.pending_prompts(done, sources={"natural"}) == natural[1::2]
    with pytest.raises(SystemExit, match=r"no prompts from source\(s\) nope; known: .*natural"):
        datagen.pending_prompts(set(), sources={"natural", "nope"})


def test_user_turn_prefix_and_prompt_filter(tiny_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dirs[0])
    assert datagen.user_turn_prefix(tok) == "<|im_start|>user\n"
    keep = datagen.keep_user_prompt
    assert keep("  How do volcanoes form on other planets?\n", True) == "How do volcanoes form on other planets?"
    assert keep("How do volcanoes form on other planets?", False) is None  # cut off by the token limit
    assert keep("Hi there", True) is None  # too short to be a task
    assert keep("Tell me a joke<|im_start|>assistant", True) is None
    assert keep("- a list item, not a request", True) is None


def test_self_written_prompts_are_a_source_with_a_split(tmp_path, monkeypatch, tiny_dirs):
    path = tmp_path / "self-written.jsonl"
    # A random tiny model seldom ends a message, so keep whatever it writes.
    monkeypatch.setattr(datagen, "keep_user_prompt", lambda text, finished: text.strip() or None)
    write = lambda n: datagen.write_self_prompts(path, n, batch_size=4, model_dir=str(tiny_dirs[0]), max_new_tokens=12)
    assert write(3) == 3 and write(2) == 2  # the second call resumes: new samples, appended
    written = prompts.read_self_written(path)
    assert len(written) == len(set(written)) == 5
    texts = [f"Please explain topic number {i} in two sentences." for i in range(200)]
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    monkeypatch.setattr(prompts, "SELF_WRITTEN_JSONL", path)
    prompts.all_prompts.cache_clear()
    try:
        own = [p for p in prompts.all_prompts() if p.source == "self"]
    finally:
        prompts.all_prompts.cache_clear()
    assert sorted(p.text for p in own) == sorted(texts)
    assert {p.split for p in own} == {"train", "heldout"}  # the usual 5% hash split applies


@pytest.mark.parametrize("source", ["math", "story"])
def test_growing_a_generated_source_keeps_every_prompt_the_data_was_made_from(source):
    # Generators draw from one seeded stream, so raising their count only appends prompts; a
    # change that reshuffled them would orphan committed samples and could move prompts
    # across the held-out split.
    if source in prompts.missing_sources():
        pytest.skip(f"{source} needs {prompts.SOURCE_PACKAGES[source][1]}")
    pool = {p.id for p in prompts.SOURCES[source]()}
    used = {i for i in datagen.done_prompt_ids(DATA_DIR) if i.startswith(source + ":")}
    assert len(used) > 1000 and used <= pool


def test_stdlib_method_prompts_follow_the_function_prompts():
    texts = [p.text for p in prompts._stdlib()]
    is_method = [" method `" in t or t.startswith("Implement the method") for t in texts]
    first = is_method.index(True)
    assert first > 100 and all(is_method[first:])  # appended: the function prompts keep their ids
    assert any("`str." in t for t in texts[first:])  # built-in types count too


def test_no_natural_evaluation_prompt_is_in_the_training_pool(monkeypatch):
    natural = [json.loads(line)["prompt"] for line in prompts.NATURAL_JSONL.read_text().splitlines() if line.strip()]
    assert len(natural) >= 48
    held_out = {prompts.normalized(t) for t in natural}
    prompts.all_prompts.cache_clear()
    # A source that offers one (the target may well write "why is the sky blue" itself) loses it.
    leak = lambda: [prompts._mk("leak", "chat", "  " + natural[0].upper()), prompts._mk("leak", "chat", "A new one?")]
    monkeypatch.setitem(prompts.SOURCES, "leak", leak)
    try:
        pool = prompts.all_prompts()
    finally:
        prompts.all_prompts.cache_clear()
    assert not {prompts.normalized(p.text) for p in pool} & held_out
    assert [p.text for p in pool if p.source == "leak"] == ["A new one?"]
    assert any(p.source == "natural" for p in pool)  # the hand-written training prompts are a source
    # Nor is one answered in the committed data, whatever source it came from.
    hashes = {prompts._h(t.strip())[:12] for t in natural}
    assert not {key.split(":", 1)[1] for key in datagen.done_prompt_ids(DATA_DIR)} & hashes


def test_text_pairs_lay_out_text_the_target_did_not_write_as_chat_turns(tiny_dirs):
    from transformers import AutoTokenizer

    from dflash_core.loading.prompting import encode_prompt
    from dflash_core.training import text_data

    pairs = text_data.text_pairs(seed=0)
    # ChatterBot's corpus comes with requirements-train.txt; the other sources ship with Python.
    expected = set(text_data.SOURCES) - (set() if prompts._pkg_dir("chatterbot") else {"chatterbot"})
    assert {source for source, _, _ in pairs} == expected
    assert len(pairs) > (1000 if "chatterbot" in expected else 500)
    held_out = prompts.HELDOUT_JSONL.read_text() + prompts.NATURAL_JSONL.read_text()
    for source, user, _ in pairs:
        if source == "stdlib":  # no function a held-out prompt asks for
            assert f"`{user.split('`')[1]}`" not in held_out
    tok = AutoTokenizer.from_pretrained(tiny_dirs[0])
    ids, plen = text_data.encode_pair(tok, "Hi?", "Hello there.", 2)
    assert ids[:plen] == encode_prompt(tok, "Hi?") and ids[-1] == 2
    assert tok.decode(ids[plen:-1]) == "Hello there."
