"""The dflash-trace/2 file: built from runs, validated with one clear error per fault, CSV beside it."""

import copy
import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_core import SamplingParams, run
from dflash_core import trace as tr
from dflash_core.__main__ import main
from dflash_core.errors import DFlashError
from dflash_core.prompt_lookup import PromptLookup

SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "traces" / "math-greedy.json"


@pytest.fixture(scope="module")
def race_trace(golden_pair, golden_expected):
    target, drafter = golden_pair
    prompt = golden_expected["prompts"][0]["prompt_ids"]
    sampling = SamplingParams(temperature=0.7, seed=0)
    runs = {
        "dflash": run(target, prompt, drafter, max_new_tokens=24, block_size=4, sampling=sampling, explain=5),
        "lookup": run(target, prompt, PromptLookup(block_size=4), max_new_tokens=24, sampling=sampling, explain=5),
        "plain": run(target, prompt, None, max_new_tokens=24, sampling=sampling, explain=5),
    }
    return tr.build_trace(
        settings=tr.settings_of(None, prompt, 24, 4, sampling),
        pair={"id": "golden", "target": "t", "drafter": "d", "trained_block_size": drafter.block_size},
        runs=runs,
        vocab_size=target.vocab_size,
        text_of=lambda t: f"tok{t}",
        device="cpu",
        report={"tau": runs["dflash"].tau},
    )


def as_bytes(trace) -> bytes:
    return json.dumps(trace).encode()


def test_a_built_trace_validates_from_bytes_and_from_a_file(race_trace, tmp_path):
    assert race_trace["schema"] == "dflash-trace/2"
    assert [(lane, run["method"]) for lane, run in race_trace["runs"].items()] == [
        ("dflash", "dflash"), ("lookup", "lookup"), ("plain", "plain")]
    assert tr.validate_trace(as_bytes(race_trace)) == race_trace
    json_path, csv_path = tr.write_trace(race_trace, tmp_path / "race.json")
    assert tr.validate_trace(json_path) == race_trace
    assert csv_path == tmp_path / "race.csv"
    assert set(race_trace["hardware"]) == {"device", "cpu", "threads", "gpu"}
    assert set(race_trace["versions"]) == {"dflash-studio", "torch", "transformers", "python"}


def test_a_lookup_run_may_draft_fewer_tokens_than_its_block_and_no_other_may(race_trace):
    lookup = race_trace["runs"]["lookup"]["blocks"]
    assert any(len(b["draft_ids"]) < 3 for b in lookup)  # a cycle with no full match: this trace tests the rule
    assert tr.validate_trace(as_bytes(race_trace))
    broken = copy.deepcopy(race_trace)
    block = broken["runs"]["dflash"]["blocks"][0]
    block["draft_ids"] = block["draft_ids"][: block["accepted"]]
    with pytest.raises(tr.TraceFieldError, match=r"trace.runs.dflash.blocks\[0\].draft_ids holds \d drafts; block_size 4 drafts 3"):
        tr.validate_trace(as_bytes(broken))
    renamed = copy.deepcopy(race_trace)
    renamed["runs"]["lookup"]["method"] = "telepathy"
    with pytest.raises(tr.TraceFieldError, match="trace.runs.lookup.method is 'telepathy'; expected one of"):
        tr.validate_trace(as_bytes(renamed))


def test_a_scheduled_run_with_explanations_validates_and_its_cut_blocks_explain_what_they_verified(golden_pair, golden_expected):
    from dflash_core.schedule import CostProfile

    target, drafter = golden_pair
    prompt = golden_expected["prompts"][0]["prompt_ids"]
    steep = CostProfile(tuple(float(n * n) for n in range(1, drafter.block_size + 1)))  # each extra token costs more
    runs = {
        "dflash": run(target, prompt, drafter, max_new_tokens=16, block_size=4, explain=3),
        "scheduled": run(target, prompt, drafter, max_new_tokens=16, block_size="auto", costs=steep, explain=3),
        "plain": run(target, prompt, None, max_new_tokens=16),
    }
    trace = tr.build_trace(settings=tr.settings_of(None, prompt, 16, 4, SamplingParams()),
                           pair={"id": "golden", "target": "t", "drafter": "d", "trained_block_size": drafter.block_size},
                           runs=runs, vocab_size=target.vocab_size, text_of=lambda t: f"tok{t}", device="cpu")
    blocks = trace["runs"]["scheduled"]["blocks"]
    cut = [b for b in blocks if b["verify_len"] < drafter.block_size]
    assert cut, "no cycle verified less than its block: the test would not exercise the rule"
    assert all(len(b["explain"]["positions"]) == b["verify_len"] for b in blocks)
    assert list(tr.validate_trace(as_bytes(trace))["runs"]) == ["dflash", "scheduled", "plain"]
    assert trace["runs"]["scheduled"]["output_ids"] == trace["runs"]["plain"]["output_ids"]


def test_a_first_format_trace_is_still_read_with_its_two_runs(race_trace):
    old = copy.deepcopy(race_trace)
    old["schema"] = "dflash-trace/1"
    for run_ in old["runs"].values():
        del run_["method"]
    with pytest.raises(tr.TraceFieldError, match=r"trace.runs must hold some of \('dflash', 'plain'\)"):
        tr.validate_trace(as_bytes(old))  # /1 had no lookup lane
    del old["runs"]["lookup"]
    assert tr.validate_trace(as_bytes(old))["runs"].keys() == {"dflash", "plain"}


def test_tokens_cover_every_id_and_probabilities_are_rounded(race_trace):
    used = tr.token_ids(race_trace["runs"])
    assert {int(t) for t in race_trace["tokens"]} == used
    assert race_trace["tokens"][str(race_trace["runs"]["plain"]["output_ids"][0])].startswith("tok")
    block = race_trace["runs"]["dflash"]["blocks"][0]["explain"]
    probs = [p for row in block["draft_topk"] + block["target_topk"] for _, p in row]
    probs += [s[f] for s in block["decision"]["slots"] for f in ("p", "q", "u") if s[f] is not None]
    assert probs and all(p == round(p, 4) for p in probs)
    assert block["decision"]["rule"] == "rejection"


def test_csv_has_one_row_per_block_per_lane(race_trace):
    rows = list(csv.DictReader(io.StringIO(tr.trace_csv(race_trace))))
    runs = race_trace["runs"]
    assert len(rows) == sum(len(run["blocks"]) for run in runs.values())
    assert list(rows[0]) == tr.CSV_COLUMNS
    first = runs["dflash"]["blocks"][0]
    assert rows[0]["lane"] == "dflash" and int(rows[0]["acceptance_length"]) == first["accepted"] + 1
    assert float(rows[0]["elapsed_s"]) == pytest.approx(first["elapsed_s"], abs=1e-6)
    assert [row["lane"] for row in rows].count("lookup") == len(runs["lookup"]["blocks"])
    assert rows[-1]["lane"] == "plain" and rows[-1]["acceptance_length"] == "1"


def broken(trace, edit):
    trace = copy.deepcopy(trace)
    edit(trace)
    return as_bytes(trace)


def d_block(t, i=0):
    return t["runs"]["dflash"]["blocks"][i]


FAULTS = {
    "not json": (lambda t: b'{"schema": "dflash-trace/1", ', tr.TraceNotJSONError, "is not JSON"),
    "not an object": (lambda t: b"[1, 2]", tr.TraceNotJSONError, "not an object (got list)"),
    "nan": (lambda t: as_bytes(t).replace(b'"total_s": ', b'"total_s": NaN, "x": ', 1), tr.TraceNotJSONError,
            "NaN is not a JSON number"),
    "no schema": (lambda t: broken(t, lambda x: x.pop("schema")), tr.TraceSchemaError, 'missing field "schema"'),
    "wrong schema": (lambda t: broken(t, lambda x: x.update(schema="dflash-trace/9")), tr.TraceSchemaError,
                     "schema is 'dflash-trace/9'"),
    "no runs": (lambda t: broken(t, lambda x: x.pop("runs")), tr.TraceFieldError, "missing field trace.runs"),
    "unknown side": (lambda t: broken(t, lambda x: x["runs"].update(eagle={})), tr.TraceFieldError,
                     "trace.runs must hold some of"),
    "no bonus": (lambda t: broken(t, lambda x: d_block(x).pop("bonus_id")), tr.TraceFieldError,
                 "missing field trace.runs.dflash.blocks[0].bonus_id"),
    "wrong type": (lambda t: broken(t, lambda x: d_block(x).update(accepted="2")), tr.TraceFieldError,
                   "trace.runs.dflash.blocks[0].accepted must be int, got str"),
    "bad top-k": (lambda t: broken(t, lambda x: d_block(x)["explain"]["target_topk"][0].append([3, 1.5])),
                  tr.TraceFieldError, "expected [token_id, probability in 0..1]"),
    "bad rule": (lambda t: broken(t, lambda x: d_block(x)["explain"]["decision"].update(rule="magic")),
                 tr.TraceFieldError, "decision.rule is 'magic'"),
    "output id": (lambda t: broken(t, lambda x: x["runs"]["plain"]["output_ids"].append(x["vocab_size"])),
                  tr.TraceVocabError, "outside the vocabulary of size"),
    "top-k id": (lambda t: broken(t, lambda x: d_block(x)["explain"]["draft_topk"][0][0].__setitem__(0, -4)),
                 tr.TraceVocabError, "token ids [-4] are outside"),
    "untexted id": (lambda t: broken(t, lambda x: x["tokens"].pop(str(x["runs"]["plain"]["output_ids"][0]))),
                    tr.TraceFieldError, "trace.tokens has no text for token ids"),
    "negative time": (lambda t: broken(t, lambda x: d_block(x, 1).update(verify_s=-0.5)), tr.TraceTimingError,
                      "trace.runs.dflash.blocks[1].verify_s is -0.5"),
    "negative split": (lambda t: broken(t, lambda x: d_block(x)["explain"]["time"].update(other_s=-1e-3)),
                       tr.TraceTimingError, "explain.time.other_s is -0.001"),
    # Each of these once reached the replay unchecked and failed there with no message at all.
    "no mask_id": (lambda t: broken(t, lambda x: d_block(x)["explain"].pop("mask_id")), tr.TraceFieldError,
                   "missing field trace.runs.dflash.blocks[0].explain.mask_id"),
    "no positions": (lambda t: broken(t, lambda x: d_block(x)["explain"].update(positions=[])), tr.TraceFieldError,
                     "trace.runs.dflash.blocks[0].explain.positions must be the block's positions"),
    "draft_passes 'x'": (lambda t: broken(t, lambda x: d_block(x).update(draft_passes="x")), tr.TraceFieldError,
                         "field trace.runs.dflash.blocks[0].draft_passes must be int, got str: 'x'"),
    "draft_passes [1]": (lambda t: broken(t, lambda x: d_block(x).update(draft_passes=[1])), tr.TraceFieldError,
                         "field trace.runs.dflash.blocks[0].draft_passes must be int, got list: a list of 1"),
    "draft_passes 10**4000": (lambda t: broken(t, lambda x: d_block(x).update(draft_passes=10**4000)),
                              tr.TraceFieldError,
                              "trace.runs.dflash.blocks[0].draft_passes is a 4001-digit integer; it must be from 0 to 3"),
    "a million layers": (lambda t: broken(t, lambda x: d_block(x)["explain"]["injected"].update(
        target_layers=list(range(10**6)))), tr.TraceFieldError,
                         "trace.runs.dflash.blocks[0].explain.injected.target_layers holds 1000000 layers; at most"),
    "a 4001-digit cache length": (lambda t: broken(t, lambda x: d_block(x)["explain"]["cache"].update(
        target_after=10**4000)), tr.TraceFieldError, "explain.cache.target_after is a 4001-digit integer; it must be"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_every_fault_has_its_own_error_and_message(race_trace, fault):
    make, error, message = FAULTS[fault]
    with pytest.raises(error, match=None) as caught:
        tr.validate_trace(make(race_trace))
    assert message in str(caught.value)
    assert isinstance(caught.value, DFlashError)
    # One class per fault: no fault is reported as another kind.
    assert type(caught.value) is error


def test_token_texts_and_pieces_are_bounded_each_and_in_all(race_trace):
    """A token's text is drawn in every pane, strip, hover box and cycle view that shows
    it, so a few long texts made every frame of a replay huge; now each text and the sum are bounded."""
    most = tr.MAX_TOKEN_CHARS
    token = str(race_trace["runs"]["plain"]["output_ids"][0])
    longest = copy.deepcopy(race_trace)
    longest["tokens"][token] = "x" * most
    assert tr.validate_trace(as_bytes(longest))  # the bound itself is allowed
    longest["tokens"][token] += "x"
    with pytest.raises(tr.TraceFieldError) as caught:
        tr.validate_trace(as_bytes(longest))
    assert str(caught.value) == (f"trace.tokens['{token}'] is {most + 1} characters long; a token's text may be at most "
                                 f"{most} characters")
    shipped = json.loads(SHIPPED.read_text())
    shipped["pieces"]["ar"][5] = "y" * (most + 1)
    with pytest.raises(tr.TraceFieldError, match=rf"trace.pieces.ar\[5\] \(token {shipped['runs']['ar']['output_ids'][5]}\) "
                                                 rf"is {most + 1} characters long; a piece may be at most {most}"):
        tr.validate_trace(as_bytes(shipped))
    padded = json.loads(SHIPPED.read_text())
    fill = tr.MAX_TEXT_CHARS // most + 1  # ids no run uses, each with a text at the bound
    padded["tokens"].update({str(padded["vocab_size"] - 1 - i): "z" * most for i in range(fill)})
    with pytest.raises(tr.TraceFieldError, match=rf"trace.tokens and trace.pieces hold \d+ characters of text; "
                                                 rf"a trace may hold at most {tr.MAX_TEXT_CHARS}"):
        tr.validate_trace(as_bytes(padded))


def test_size_limit_is_checked_before_reading(tmp_path, monkeypatch):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(tr.MAX_BYTES + 1)  # sparse: the validator must refuse it from its size alone
    with pytest.raises(tr.TraceSizeError, match=f"{tr.MAX_BYTES + 1} bytes; the limit is {tr.MAX_BYTES} bytes"):
        tr.validate_trace(huge)
    monkeypatch.setattr(tr, "MAX_BYTES", 10)
    with pytest.raises(tr.TraceSizeError, match="the trace is 12 bytes; the limit is 10 bytes"):
        tr.validate_trace(b'{"a": 12345}')
    with pytest.raises(tr.TraceFieldError, match="trace file not found"):
        tr.validate_trace(tmp_path / "missing.json")


def test_cli_explain_round_trip_validates(golden_dir, tmp_path, capsys):
    path = tmp_path / "cli.json"
    code = main(["generate", "--target", str(golden_dir / "target"), "--drafter", str(golden_dir / "drafter"),
                 "--prompt-ids", "5,6,7", "--max-new-tokens", "12", "--block-size", "4", "--explain", "3",
                 "--trace-json", str(path)])
    out = SimpleNamespace(code=code, err=capsys.readouterr().err)
    assert out.code == 0, out.err
    trace = tr.validate_trace(path)
    assert list(trace["runs"]) == ["dflash"] and "report" not in trace
    assert trace["settings"]["prompt_ids"] == [5, 6, 7] and trace["settings"]["explain"] == 3
    blocks = trace["runs"]["dflash"]["blocks"]
    assert all(len(row) == 3 for b in blocks for row in b["explain"]["target_topk"])
    assert trace["tokens"][str(blocks[0]["bonus_id"])] == f"<{blocks[0]['bonus_id']}>"  # no tokenizer
    assert path.with_suffix(".csv").read_text().count("\n") == len(blocks) + 1


def test_shipped_traces_validate_and_cover_every_example_at_both_temperatures():
    from pathlib import Path

    from app.serve.examples import EXAMPLES

    folder = Path(__file__).resolve().parent.parent / "assets" / "traces"
    index = json.loads((folder / "index.json").read_text())["traces"]
    prompts = [prompt for (prompt,) in EXAMPLES]
    assert sorted((e["prompt"], e["temperature"]) for e in index) == sorted((p, t) for p in prompts for t in (0.0, 0.7))
    for entry in index:
        path = folder / entry["file"]
        assert path.stat().st_size < 1_000_000
        trace = tr.validate_trace(path)
        settings = trace["settings"]
        assert (settings["prompt"], settings["temperature"], settings["block_size"]) == (entry["prompt"], entry["temperature"], 4)
        assert settings["max_new_tokens"] == 128 and settings["seed"] == 0
        assert list(trace["runs"]) == ["dflash", "ar", "lookup", "plain"]  # every lane, in the order shown
        assert all(run["method"] == lane for lane, run in trace["runs"].items())
        assert all("explain" in b for run in trace["runs"].values() for b in run["blocks"])
        assert trace["report"]["tau"] == entry["tau"]
        if entry["temperature"] == 0.0:  # lossless: a replay shows the same text in every pane
            assert trace["report"]["identical"] is True
            plain = trace["runs"]["plain"]["output_ids"]
            assert all(run["output_ids"] == plain for run in trace["runs"].values())
            assert all(lane["identical"] is True for lane in trace["report"]["lanes"].values())
            assert trace["runs"]["dflash"]["output_ids"] == trace["runs"]["plain"]["output_ids"]


@pytest.fixture(scope="module")
def dflash2_trace(tmp_path_factory):
    """A race of a tiny DFlash2 drafter in its own lane, beside plain decoding, explained."""
    from tiny import build_dflash2_drafter, build_qwen3_target

    from dflash_core import DFlashDrafter, Target

    root = tmp_path_factory.mktemp("dflash2-trace")
    target_dir = build_qwen3_target(root / "target", vocab_size=12)
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(build_dflash2_drafter(root / "drafter", target_dir))
    prompt = [5, 2, 8]
    runs = {"dflash2": run(target, prompt, drafter, max_new_tokens=20, block_size=4, explain=3),
            "plain": run(target, prompt, None, max_new_tokens=20, explain=3)}
    return tr.build_trace(settings=tr.settings_of(None, prompt, 20, 4, SamplingParams()),
                          pair={"id": "tiny", "target": "t", "drafter": "d", "dflash2_drafter": "d2",
                                "trained_block_size": 8},
                          runs=runs, vocab_size=target.vocab_size, text_of=lambda t: f"tok{t}", device="cpu"), runs


def test_a_dflash2_lane_round_trips_with_its_selector_walk(dflash2_trace):
    from dflash_core.events import CycleExplanation

    trace, runs = dflash2_trace
    back = tr.validate_trace(as_bytes(trace))
    assert list(back["runs"]) == ["dflash2", "plain"] and back["runs"]["dflash2"]["method"] == "dflash2"
    for recorded, block in zip(back["runs"]["dflash2"]["blocks"], runs["dflash2"].blocks):
        path = CycleExplanation.from_dict(recorded["explain"]).path
        assert path.candidates == block.explain.path.candidates and path.chosen == block.explain.path.chosen
        assert [p for row in path.probs for p in row] == pytest.approx(
            [p for row in block.explain.path.probs for p in row], abs=5e-5)  # rounded to 4 digits
        assert all(str(t) in back["tokens"] for row in path.candidates for t in row)
    assert "path" not in back["runs"]["plain"]["blocks"][0]["explain"]


def d2_path(t, i=0):
    return t["runs"]["dflash2"]["blocks"][i]["explain"]["path"]


PATH_FAULTS = {
    "choice past the candidates": (lambda p: p["chosen"].__setitem__(0, 4), tr.TraceFieldError,
                                   "explain.path.chosen[0] is 4; slot 1 has 4 candidates (0 to 3)"),
    "a walk that drafted other tokens": (
        lambda p: p["chosen"].__setitem__(0, (p["chosen"][0] + 1) % 4), tr.TraceFieldError,
        "explain.path chose"),
    "a probability above 1": (lambda p: p["probs"][1].__setitem__(0, 1.5), tr.TraceFieldError,
                              "explain.path.probs[1] must hold one probability in 0..1 per candidate (4)"),
    "a short probability row": (lambda p: p["probs"][0].pop(), tr.TraceFieldError,
                                "explain.path.probs[0] must hold one probability in 0..1 per candidate (4)"),
    "a missing row": (lambda p: p["candidates"].pop(), tr.TraceFieldError,
                      "explain.path has 2 candidate rows, 3 probability rows and 3 choices"),
    "a candidate outside the vocabulary": (lambda p: p["candidates"][0].__setitem__(0, 99), tr.TraceVocabError,
                                           "token ids [99] are outside the vocabulary of size 12"),
    "a text candidate": (lambda p: p["candidates"][0].__setitem__(0, "x"), tr.TraceFieldError,
                         "explain.path.candidates[0] must hold token ids (ints), got 'x'"),
    "a million candidates": (lambda p: p["candidates"].__setitem__(0, [0] * 10**6), tr.TraceFieldError,
                             f"explain.path.candidates[0] must be a list of 1 to {tr.MAX_TOP_K} token ids, got a list of 1000000"),
    "no choices": (lambda p: p.pop("chosen"), tr.TraceFieldError, "missing field trace.runs.dflash2.blocks[0].explain.path.chosen"),
}


@pytest.mark.parametrize("fault", PATH_FAULTS)
def test_a_crafted_selector_walk_is_refused_by_name(dflash2_trace, fault):
    edit, error, message = PATH_FAULTS[fault]
    with pytest.raises(error) as caught:
        tr.validate_trace(broken(dflash2_trace[0], lambda t: edit(d2_path(t))))
    assert message in str(caught.value) and type(caught.value) is error
