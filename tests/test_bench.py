"""The benchmark runs every method on the same prompts and ends with one JSON line."""

import json
from pathlib import Path

import pytest
import torch

from dflash_core.bench.__main__ import main
from dflash_core.speed.cpu_linear import packing_wanted
from dflash_core.speed.kernels import cpu_rows


@pytest.fixture(autouse=True)
def keep_threads():
    """`--threads` sets torch's process-wide thread count; later tests must not inherit it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_bench_reports_headline_figures(tiny_dirs, tmp_path, capsys):
    target_dir, drafter_dir = tiny_dirs
    prompts = tmp_path / "prompts.jsonl"
    records = [{"prompt": "What is 2+3?", "category": "math"}, {"prompt": "def add(a, b):", "category": "code"},
               {"prompt": "Once upon", "category": "story"}]
    prompts.write_text("\n".join(json.dumps(r) for r in records))
    torch.set_num_threads(2)  # so that the flag, not the environment, is what makes it 1
    assert main([
        "--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts),
        "--num-prompts", "2", "--max-new-tokens", "12", "--block-sizes", "8,4,auto", "--threads", "1",
    ]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["num_prompts"] == 2 and result["block_size"] == 8 and result["threads"] == 1
    assert result["identical"] == 1.0 and result["per_block_size"]["4"]["identical"] == 1.0
    assert result["lossless"] == {"identical": 2, "near_tie": 0, "diverged": 0}
    assert result["per_block_size"]["4"]["differences"] == []
    assert result["tau"] >= 1.0 and len(result["per_position_acceptance"]) == 7
    for key in ("speedup", "dflash_tok_s", "plain_tok_s", "speedup_prompt_lookup", "speedup_hf_generate"):
        assert result[key] > 0
    assert any("DFlash block 4" in line for line in lines)
    # The block schedule races beside the fixed sizes, with its verified length and per-set figures.
    auto = result["per_block_size"]["auto"]
    assert auto["identical"] == 1.0 and 1 <= auto["mean_verify_len"] <= 8
    assert result["per_block_size"]["8"]["mean_verify_len"] == 8.0
    assert set(auto["per_set"]) == {"prompts"} and auto["per_set"]["prompts"]["num_prompts"] == 2
    # ... and per prompt, by its text where it has no id.
    assert {key: r["num_prompts"] for key, r in auto["per_prompt"].items()} == {"What is 2+3?": 1, "def add(a, b):": 1}
    assert any(line.startswith("DFlash block auto") for line in lines)
    # The tiny target fits in a cache, so its one-row path is never timed: the rows kernel where it
    # builds, else the packed weights.
    expected = ("rows kernel" if cpu_rows.available() else "oneDNN") if packing_wanted() else None
    assert result["cpu_single_row"] == expected
    # The first two prompts are picked; the headline tau is the block-weighted mean of theirs.
    per_category = result["tau_per_category"]
    assert set(per_category) == {"math", "code"} and min(per_category.values()) >= 1.0
    assert min(per_category.values()) <= result["tau"] <= max(per_category.values())


def test_block_sizes_auto_is_for_the_dflash_races_only(capsys):
    with pytest.raises(SystemExit):
        main(["--block-sizes", "4,auto", "--methods", "plain,dflash"])
    assert "--block-sizes auto races the engine's DFlash only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cycle", "--block-sizes", "auto"])
    assert "--block-sizes auto is for the benchmark's DFlash races" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--block-sizes", "4,x"])
    assert "--block-sizes must be whole numbers or auto" in capsys.readouterr().err


def test_cycle_times_split_a_cycle_of_the_loaded_pair(tiny_dirs, capsys):
    target_dir, drafter_dir = tiny_dirs
    assert main(["cycle", "--target", str(target_dir), "--drafter", str(drafter_dir),
                 "--block-sizes", "4,2", "--context", "24", "--threads", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert set(result["per_block_size"]) == {"4", "2"}
    for b, r in result["per_block_size"].items():
        assert r["block_size"] == int(b) and r["context"] == 24 and r["threads"] == 1
        parts = r["draft_ms"] + r["verify_ms"] + r["bookkeeping_ms"]
        assert min(r["draft_ms"], r["verify_ms"], r["bookkeeping_ms"], r["plain_ms"]) > 0
        assert abs(r["cycle_ms"] - parts) < 1e-9
        assert list(r["speedup"]) == [t for t in ("2", "3", "4") if int(t) <= int(b)]
        for tau, x in r["speedup"].items():
            assert abs(x - int(tau) * r["plain_ms"] / r["cycle_ms"]) < 1e-9
    # One table per block size, without the H200 target verdicts (those are for the released shapes).
    assert sum(line.startswith(str(target_dir)) for line in out) == 2
    assert not any("target <=" in line for line in out)


def test_cycle_times_a_static_cache_sized_to_the_measurement(tiny_pair):
    """A static cache of the model's whole context would make every step read all of it."""
    from dflash_core import Target
    from dflash_core.bench.cycle import time_cycle

    target, drafter = tiny_pair
    static = Target(target.model, static_cache=True)
    time_cycle(static, drafter, context=24, block=4, iters=1)
    assert 24 + 4 <= static._capacity < target.model.config.max_position_embeddings
    # which is where the cache would have been: a reset with no size takes the model's context
    static.reset()
    assert static._capacity == target.model.config.max_position_embeddings


def test_synthetic_tiny_prints_its_table_once(capsys):
    assert main(["cycle", "--synthetic", "tiny", "--threads", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["shape"] == "tiny" and result["block_size"] == 16 and set(result["speedup"]) == {"4", "6", "8"}
    assert sum(line.startswith("synthetic tiny") for line in out) == 1
    assert sum("target <=" in line for line in out) == 3


def test_bench_explain_reports_the_overhead_per_side_and_mode(tiny_dirs, tmp_path, capsys):
    target_dir, drafter_dir = tiny_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 2+3?"}))
    assert main(["explain-cost", "--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts),
                 "--num-prompts", "1", "--max-new-tokens", "10", "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["explain_k"] == 3 and result["num_prompts"] == 1
    assert set(result["modes"]) == {"dflash greedy", "plain greedy", "dflash T=0.7", "plain T=0.7"}
    for r in result["modes"].values():
        assert r["identical_outputs"] is True
        assert r["ms_per_cycle_off"] > 0 and r["ms_per_cycle_on"] > 0
        assert r["overhead_pct"] == pytest.approx(100 * (r["ms_per_cycle_on"] / r["ms_per_cycle_off"] - 1))
        assert r["in_cycle_overhead_pct"] > 0  # building an explanation takes time, and it is counted
        assert r["cpu_ms_per_cycle_off"] > 0 and r["cpu_ms_per_cycle_on"] > 0
    assert "overhead" in out


def test_bench_reports_the_natural_set_beside_the_generated_split(tiny_dirs, tmp_path, monkeypatch, capsys):
    from dflash_core.bench import run as bench

    target_dir, drafter_dir = tiny_dirs
    sets = {"natural": [("math", "whats 15% of 80"), ("code", "reverse a string in python"), ("app", "Tell me a story.")],
            "generated": [("chat", "What is a cloud?"), ("math", "Calculate 3 + 4."), ("chat", "Hello there."),
                          ("math", "What is 2 * 9?"), ("story", "Write a poem."), ("math", "Solve x + 1 = 3.")]}
    for name, records in sets.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(json.dumps({"category": c, "prompt": p}) for c, p in records))
        monkeypatch.setitem(bench.PROMPT_SETS, name, path)
    monkeypatch.setattr(bench, "DEFAULT_PROMPTS", bench.PROMPT_SETS["generated"])
    assert main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--prompt-set", "both",
                 "--num-prompts", "3", "--max-new-tokens", "8", "--block-sizes", "4", "--no-peers"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    # The natural set is used whole (3 <= 3); the generated one is spread over its file.
    natural, generated = result["per_set"]["natural"], result["per_set"]["generated"]
    assert result["num_prompts"] == 6 and natural["num_prompts"] == 3 and generated["num_prompts"] == 3
    assert set(natural["per_category"]) == {"math", "code", "app"}
    assert set(generated["per_category"]) == {"chat", "story"}  # every 2nd of 6: chat, chat, story
    for figures in (natural, generated, *natural["per_category"].values(), *generated["per_category"].values()):
        assert figures["identical"] == 1.0 and figures["tau"] >= 1.0 and figures["speedup"] > 0
    assert sum(r["num_prompts"] for r in natural["per_category"].values()) == 3
    assert "natural/app" in result["tau_per_category"] and "generated/chat" in result["tau_per_category"]
    assert result["speedup_prompt_lookup"] is None and result["speedup_hf_generate"] is None
    assert any(line.startswith("natural") for line in out) and any(line.startswith("  app") for line in out)


def test_versus_races_a_second_drafter_against_the_same_plain_runs(tiny_dirs, tmp_path, capsys):
    target_dir, drafter_dir = tiny_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": c, "prompt": p})
                                 for c, p in [("math", "What is 2+3?"), ("code", "def add(a, b):")]))
    assert main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts),
                 "--versus", str(drafter_dir), "--num-prompts", "2", "--max-new-tokens", "10",
                 "--block-sizes", "4,8", "--no-peers"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    versus = result["versus"]
    # The same weights at the first block size accept exactly what the headline run accepted.
    assert versus["drafter"] == str(drafter_dir) and versus["tau"] == result["per_block_size"]["4"]["tau"]
    assert versus["tau"] != result["per_block_size"]["8"]["tau"] or result["tau"] == 1.0
    assert versus["lossless"] == {"identical": 2, "near_tie": 0, "diverged": 0} and versus["speedup"] > 0
    assert set(versus["per_set"]["prompts"]["per_category"]) == {"math", "code"}
    assert any(line.startswith(f"versus: {drafter_dir.name}") for line in out)
    assert any(line.startswith(f"versus ({drafter_dir.name}), at block 4") for line in out)


def test_versus_must_fit_the_target(tiny_dirs):
    from dflash_core.errors import PairMismatchError

    target_dir, drafter_dir = tiny_dirs
    shipped = Path(__file__).parents[1] / "assets/drafters/smollm2-135m-instruct-dflash"
    with pytest.raises(PairMismatchError, match="drafter hidden_size 576 does not match"):
        main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--versus", str(shipped),
              "--num-prompts", "1", "--max-new-tokens", "4", "--no-peers"])


def test_in_cycle_overhead_is_compute_time_beyond_the_cycle_split():
    from dflash_core.bench.explain_cost import in_cycle_overhead
    from dflash_core.events import (
        Block,
        CacheLengths,
        CycleExplanation,
        CycleTimes,
        Decision,
        Injected,
        Prefill,
        Summary,
    )

    def block(i, elapsed, draft, verify, other):
        explanation = CycleExplanation(1, None, (i,), Injected(0, ()), (), ((),), Decision("greedy", (), False),
                                       CacheLengths(i, i + 1, 0, 0), CycleTimes(draft, verify, other))
        return Block(i, i, (), 0, 1, (1,), draft, verify, elapsed, explain=explanation)

    # Cycles of 0.10 s and 0.20 s whose explanations took 0.01 s and 0.03 s.
    blocks = (block(0, 0.5 + 0.11, 0.04, 0.05, 0.01), block(1, 0.61 + 0.23, 0.08, 0.1, 0.02))
    summary = Summary((1, 1), 3, 4, "max_new_tokens", Prefill(3, 1, 0.5), blocks, 0.84)
    cycle, explain = in_cycle_overhead(summary)
    assert cycle == pytest.approx(0.30) and explain == pytest.approx(0.04)


@pytest.mark.parametrize("name", ["cycle", "explain-cost", "drafter-costs", "linear-rows", "row-invariance"])
def test_every_subcommand_answers_its_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m dflash_core.bench {name}")


def test_linear_rows_prints_its_sweeps_as_json(tiny_dirs, capsys):
    target_dir, _ = tiny_dirs
    assert main(["linear-rows", "--target", str(target_dir), "--rows", "1", "3", "--reps", "1", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result["ms_per_sweep"]) == {"1", "3"} and result["dtype"] == "float32"
    assert set(result["ms_per_sweep"]["3"]) >= {"MKL (F.linear)", "oneDNN packed for default"}
    assert lines[-2].startswith("rows  3: ")


@pytest.mark.parametrize("flag, now", [("--cycle-times", "cycle"), ("--synthetic=tiny", "cycle --synthetic"),
                                       ("--explain", "explain-cost --top-k")])
def test_a_flag_that_became_a_subcommand_says_which(flag, now, capsys):
    with pytest.raises(SystemExit) as done:
        main([flag])
    assert done.value.code == 2
    assert f"is now a subcommand: python -m dflash_core.bench {now}" in capsys.readouterr().err


@pytest.mark.parametrize("peer, variable", [("vllm", "DFLASH_VLLM_VENV"), ("reference", "DFLASH_REFERENCE_VENV")])
def test_a_peer_without_its_venv_says_how_to_make_one(peer, variable, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(variable, str(tmp_path / "no-venv"))
    with pytest.raises(SystemExit):
        main(["--peer", peer, "--num-prompts", "1"])
    err = capsys.readouterr().err
    assert f"{tmp_path / 'no-venv'}/bin/python does not exist" in err and f"scripts/setup.sh --{peer}" in err


@pytest.mark.skipif(not hasattr(__import__("transformers"), "MuseGlimmerAssistantModel"),
                    reason="this transformers has no native DFlash (MuseGlimmerAssistantModel, 5.25 on)")
def test_peer_transformers_runs_its_native_dflash_with_the_exported_drafter(tiny_dirs, capsys):
    target_dir, drafter_dir = tiny_dirs
    assert main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--drafter-dtype", "float32",
                 "--prompt-set", "natural", "--num-prompts", "2", "--max-new-tokens", "16", "--no-peers",
                 "--threads", "1", "--peer", "transformers", "--peer", "transformers"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    peer = result["transformers"]
    assert peer["engine"].startswith("transformers 5.") and peer["drafts_over"] == "the target's whole head"
    # The same drafter in float32 on both sides: transformers' loop keeps our outputs and our cycles.
    assert peer["plain"]["identical"] == peer["dflash"]["identical"] == peer["dflash"]["same_cycles"] == 1.0
    assert peer["dflash"]["speedup"] == pytest.approx(peer["dflash"]["tok_s"] / peer["plain"]["tok_s"])
    assert out.count("transformers 5.") >= 2 and "same drafter and numerics" in out


@pytest.fixture(scope="module")
def methods_setup(tiny_dirs, tmp_path_factory):
    """The tiny pair, an autoregressive drafter for it and two prompts; returns main's argument list."""
    from tiny import build_drafter

    target_dir, drafter_dir = tiny_dirs
    root = tmp_path_factory.mktemp("methods")
    ar_dir = build_drafter(root / "ar", target_dir, block_size=8, architectures=["DFlashARDraftModel"])
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": c, "prompt": p}) for c, p in
                                 [("math", "What is 2+3? 1 + 2 = 3"), ("code", "def add(a, b):\n    return a + b")]))
    return ["--target", str(target_dir), "--drafter", str(drafter_dir), "--ar-drafter", str(ar_dir),
            "--prompts", str(prompts), "--num-prompts", "2", "--max-new-tokens", "16", "--block-sizes", "4",
            "--threads", "1"]


def run_methods(argv, capsys, methods="plain,dflash,ar,lookup", code=0):
    assert main([*argv, "--methods", methods]) == code
    lines = capsys.readouterr().out.strip().splitlines()
    return json.loads(lines[-1]), lines


def test_methods_rows_side_by_side(methods_setup, capsys):
    result, lines = run_methods(methods_setup, capsys)
    rows = result["methods"]
    assert list(rows) == ["plain", "dflash", "ar", "lookup"] and result["block_size"] == 4
    assert result["all_identical"] is True and result["threads"] == 1 and result["num_prompts"] == 2
    for method, r in rows.items():
        assert r["num_prompts"] == 2 and r["identical"] == 2 and r["tok_s"] > 0 and r["verify_ms_per_cycle"] > 0
        # tau = 1 + the expected number of accepted drafts = 1 + the sum over slots of P(slot accepted).
        assert r["tau"] == pytest.approx(1 + sum(r["per_position_acceptance"]))
        acceptance = r["per_position_acceptance"]
        assert all(1 >= a >= b >= 0 for a, b in zip(acceptance, acceptance[1:] + [0]))
        assert (len(acceptance), r["draft_passes_per_cycle"]) == {
            "plain": (0, 0), "dflash": (3, 1), "ar": (3, 3), "lookup": (3, 0)}[method]
        if method != "plain":
            assert r["lossless"] == {"identical": 2, "near_tie": 0, "diverged": 0} and r["differences"] == []
    plain = rows["plain"]
    assert plain["tau"] == 1.0 and plain["speedup"] == 1.0 and plain["cycles"] == plain["tokens"] - 2
    for method in ("dflash", "ar", "lookup"):
        assert rows[method]["speedup"] == pytest.approx(rows[method]["tok_s"] / plain["tok_s"])
    header = next(i for i, line in enumerate(lines) if line.startswith("method"))
    assert [line.split()[0] for line in lines[header + 1 : header + 5]] == ["plain", "DFlash", "AR", "prompt"]


def test_methods_per_position_acceptance_counts_the_blocks(methods_setup, monkeypatch, capsys):
    """The slot shares are the blocks' own: recompute them from every Block the runs yielded."""
    from dflash_core.bench import methods as bench_methods

    seen = {}

    def recording_run(target, prompt_ids, drafter, **kwargs):
        summary = run(target, prompt_ids, drafter, **kwargs)
        if len(prompt_ids) > 8:  # not the warm-up
            seen.setdefault(summary.method, []).extend(summary.blocks)
        return summary

    run = bench_methods.run
    monkeypatch.setattr(bench_methods, "run", recording_run)
    result, _ = run_methods(methods_setup, capsys, methods="lookup,ar,dflash")
    assert list(result["methods"]) == ["plain", "dflash", "ar", "lookup"]  # plain always: rows compare with it
    # Prompt lookup copies the prompts' repeats, so some slot shares are above 0 and the check can fail.
    assert result["methods"]["lookup"]["per_position_acceptance"][0] > 0
    for method in ("dflash", "ar", "lookup"):
        blocks, r = seen[method], result["methods"][method]
        assert r["cycles"] == len(blocks)
        for k, share in enumerate(r["per_position_acceptance"], start=1):
            assert share == sum(b.accepted >= k for b in blocks) / len(blocks)
        assert r["draft_ms_per_cycle"] == pytest.approx(1000 * sum(b.draft_s for b in blocks) / len(blocks))


def test_methods_report_an_output_that_differs_from_plain(methods_setup, monkeypatch, capsys):
    """A method whose output differs from plain decoding's is counted, explained, and fails the run."""
    from dataclasses import replace

    from dflash_core.bench import methods as bench_methods

    def corrupting_run(target, prompt_ids, drafter, **kwargs):
        summary = run(target, prompt_ids, drafter, **kwargs)
        if summary.method == "lookup" and len(prompt_ids) > 8:
            ids = list(summary.output_ids)
            ids[3] = (ids[3] + 1) % target.vocab_size
            summary = replace(summary, output_ids=tuple(ids))
        return summary

    run = bench_methods.run
    monkeypatch.setattr(bench_methods, "run", corrupting_run)
    result, lines = run_methods(methods_setup, capsys, code=1)
    lookup = result["methods"]["lookup"]
    assert lookup["identical"] == 0 and result["all_identical"] is False
    assert lookup["lossless"]["identical"] == 0 and len(lookup["differences"]) == 2
    assert {d["position"] for d in lookup["differences"]} == {3}
    assert result["methods"]["ar"]["identical"] == 2
    assert any("DIVERGED at token 3" in line for line in lines)
    assert any(line.startswith("NOT all outputs equal plain decoding") for line in lines)


def test_dflash2_and_input_fusion_race_as_methods_of_their_own(methods_setup, tiny_dirs, tmp_path, capsys):
    """`--methods dflash,dflash2,fusion,ar,lookup`: each drafter from its own flag, lossless, with tau
    per slot and speed; the fusion row races a tiny input-fusion drafter."""
    from tiny import build_dflash2_drafter, build_fusion_drafter

    target_dir, _ = tiny_dirs
    dflash2_dir = build_dflash2_drafter(tmp_path / "dflash2", target_dir)
    fusion_dir = build_fusion_drafter(tmp_path / "fusion", target_dir)
    argv = [*methods_setup, "--dflash2-drafter", str(dflash2_dir), "--fusion-drafter", str(fusion_dir)]
    result, lines = run_methods(argv, capsys, methods="dflash,dflash2,fusion,ar,lookup")
    rows = result["methods"]
    assert list(rows) == ["plain", "dflash", "dflash2", "fusion", "ar", "lookup"] and result["all_identical"] is True
    assert result["dflash2_drafter"] == str(dflash2_dir) and result["fusion_drafter"] == str(fusion_dir)
    for method in ("dflash2", "fusion"):
        r = rows[method]
        assert r["lossless"] == {"identical": 2, "near_tie": 0, "diverged": 0} and r["draft_passes_per_cycle"] == 1
        assert len(r["per_position_acceptance"]) == 3 and r["tau"] == pytest.approx(1 + sum(r["per_position_acceptance"]))
        assert r["speedup"] == pytest.approx(r["tok_s"] / rows["plain"]["tok_s"])
    header = next(i for i, line in enumerate(lines) if line.startswith("method"))
    assert [line.split()[0] for line in lines[header + 1 : header + 7]] == ["plain", "DFlash", "DFlash2", "input", "AR", "prompt"]


def test_a_method_s_drafter_of_another_kind_or_target_is_named(methods_setup, tiny_dirs, tmp_path):
    from tiny import build_drafter, build_qwen3_target

    from dflash_core.errors import CheckpointError, PairMismatchError

    drafter_dir = tiny_dirs[1]
    with pytest.raises(PairMismatchError, match=f"the DFlash2 drafter {drafter_dir} is a DFlash drafter; the dflash2 "
                                                "method races DFlash2 drafters"):
        main([*methods_setup, "--methods", "dflash2", "--dflash2-drafter", str(drafter_dir)])
    with pytest.raises(PairMismatchError, match=f"the input-fusion drafter {drafter_dir} is a DFlash drafter; the "
                                                "fusion method races input-fusion drafters"):
        main([*methods_setup, "--methods", "fusion", "--fusion-drafter", str(drafter_dir)])
    other = build_drafter(tmp_path / "other", build_qwen3_target(tmp_path / "qwen3"))
    with pytest.raises(PairMismatchError, match=f"the input-fusion drafter {other} does not fit the target: drafter "
                                                "vocab_size 64 does not match the target.s vocabulary of 320"):
        main([*methods_setup, "--methods", "fusion", "--fusion-drafter", str(other)])
    with pytest.raises(CheckpointError, match="model directory not found: .*nowhere"):
        main([*methods_setup, "--methods", "fusion", "--fusion-drafter", str(tmp_path / "nowhere")])


def test_plain_always_joins_the_methods(methods_setup, capsys):
    result, _ = run_methods(methods_setup, capsys, methods="dflash")
    assert list(result["methods"]) == ["plain", "dflash"] and result["ar_drafter"] is None


@pytest.mark.parametrize("methods", ["plain,eagle", "dflash,,AR", ","])
def test_methods_reject_unknown_names_naming_the_allowed_ones(methods, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--methods", methods])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "argument --methods: unknown method" in err and "choose from plain, dflash, dflash2, fusion, ar, lookup" in err


def test_methods_refuse_options_of_the_other_rows(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--methods", "plain,dflash", "--block-sizes", "4,8"])
    assert done.value.code == 2
    assert "--methods races one block size" in capsys.readouterr().err


def test_methods_on_both_sets_report_each_set(methods_setup, tmp_path, monkeypatch, capsys):
    from dflash_core.bench import run as bench

    for name, prompt in (("natural", "whats 15% of 80"), ("generated", "Calculate 3 + 4.")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps({"category": "math", "prompt": prompt}))
        monkeypatch.setitem(bench.PROMPT_SETS, name, path)
    monkeypatch.setattr(bench, "DEFAULT_PROMPTS", bench.PROMPT_SETS["generated"])
    i = methods_setup.index("--prompts")
    argv = [*methods_setup[:i], *methods_setup[i + 2 :], "--prompt-set", "both"]
    result, lines = run_methods(argv, capsys, methods="dflash,lookup")
    assert result["prompt_sets"] == ["natural", "generated"] and result["num_prompts"] == 2
    for name, rows in result["per_set"].items():
        assert list(rows) == ["plain", "dflash", "lookup"] and all(r["num_prompts"] == 1 for r in rows.values())
    # The whole run's cycles are the sets' cycles together.
    assert result["methods"]["dflash"]["cycles"] == sum(rows["dflash"]["cycles"] for rows in result["per_set"].values())
    assert any(line.startswith("natural: plain tau 1.00") for line in lines)


def test_the_schedule_may_lead_the_block_sizes(tiny_dirs, capsys):
    """`--block-sizes auto,...` as the docs' command has it: the headline is the scheduled race."""
    target_dir, drafter_dir = tiny_dirs
    assert main(["--target", str(target_dir), "--drafter", str(drafter_dir), "--num-prompts", "1",
                 "--max-new-tokens", "8", "--block-sizes", "auto,2", "--threads", "1", "--no-peers"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["identical"] == 1.0 and set(result["per_block_size"]) == {"auto", "2"}
    assert 1 <= result["per_block_size"]["auto"]["mean_verify_len"] <= 8
