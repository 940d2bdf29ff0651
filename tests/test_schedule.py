"""The per-cycle block schedule (block_size="auto"): its rule on hand cases, greedy output identical to
plain decoding whatever lengths it picks, long blocks kept where a verify is cheap (the GPU profile
with the oracle drafter), the verified length recorded in events and traces, and bad inputs named.
The chi-square test of its sampled output is in test_sampling.py."""

import copy
import json
import time

import pytest
import torch
from tiny import build_drafter

from dflash_core import DFlashDrafter, PromptLookup, SamplingParams, Target, decoding, run
from dflash_core import trace as tr
from dflash_core.__main__ import main
from dflash_core.bench.cycle import TARGETS
from dflash_core.diagnostics.oracle import OracleDrafter, expected_lengths
from dflash_core.errors import GenerationInputError
from dflash_core.schedule import (
    DECAY,
    HEADROOM,
    MAX_PAUSE,
    PATIENCE,
    PRIOR,
    WINDOW,
    BlockSchedule,
    Calibration,
    CostProfile,
    best_length,
    expected_accepted,
    measured_costs,
)


def linear_profile(block: int, verify_over_plain: float, other_over_plain: float = 0.0) -> CostProfile:
    """A verify of 1 token costs one plain step, of `block` tokens `verify_over_plain` steps, linear between."""
    slope = (verify_over_plain - 1) / (block - 1)
    return CostProfile(tuple(1 + slope * (length - 1) for length in range(1, block + 1)), other_over_plain)


# The per-cycle costs `bench cycle --synthetic qwen3-8b` holds an H200 to (bench/cycle.py TARGETS):
# a 16-token verify at most 1.3 plain steps, the draft at most 0.15 of a verify.
GPU = linear_profile(16, TARGETS["verify/plain"], TARGETS["draft/verify"] * TARGETS["verify/plain"])
# An AVX2-only CPU (docs/benchmarks.md): a 4-token verify costs 1.5 plain steps, so 16 cost 3.5.
AVX2 = linear_profile(16, 3.5)


def test_expected_accepted_sums_the_products_of_the_confidences():
    assert expected_accepted([]) == [0.0]
    assert expected_accepted([0.5, 0.5, 1.0]) == pytest.approx([0.0, 0.5, 0.75, 1.0])


def test_the_rule_maximizes_expected_tokens_per_second():
    # The block-4 CPU figures: a verify of 4 costs 29.0 ms, a plain step 25.6 ms, and the
    # slots are kept 46%, then 39% and 28% of the time given the slot before.
    cpu = CostProfile((25.6, 26.73, 27.87, 29.0))
    confidence = [0.46, 0.39, 0.28]
    rates = [(1 + e) / v for e, v in zip(expected_accepted(confidence), cpu.verify_s)]
    assert best_length(confidence, cpu.verify_s, 0.0) == rates.index(max(rates)) == 2
    assert best_length([0.01] * 3, cpu.verify_s, 0.0) == 0  # nothing worth verifying: a plain step
    assert best_length([1.0] * 3, cpu.verify_s, 0.0) == 3


def test_a_cheap_verify_keeps_long_blocks_and_a_dear_one_cuts_them():
    sure = [0.9] * 15
    assert best_length(sure, GPU.verify_s, GPU.other_s) == 15
    assert 5 <= best_length(sure, AVX2.verify_s, 0.0) <= 9
    # A per-cycle cost besides the verify (the draft) makes longer blocks pay: it is paid anyway.
    assert best_length(sure, AVX2.verify_s, 5.0) > best_length(sure, AVX2.verify_s, 0.0)


def sure_for(drafts: int, of: int) -> torch.Tensor:
    """Confidences whose best prefix under STEEP is exactly `drafts` of `of`: sure, then hopeless."""
    return torch.tensor([1.0] * drafts + [0.0] * (of - drafts))


STEEP = linear_profile(16, 4.0)  # each verified token costs a fifth of a plain step more


def drive(schedule: BlockSchedule, verified_per_draft: list[int]) -> list[int]:
    """Run `schedule` through cycles whose drafts it verifies `verified_per_draft` in turn (sure
    drafts, then hopeless ones); returns each cycle's drafted length (0: a paused cycle)."""
    drafted, verified = [], list(verified_per_draft)
    while verified:
        drafted.append(schedule.draft_length())
        if drafted[-1] == 0:
            assert schedule.choose(torch.empty(0)) == 0
            continue
        assert schedule.choose(sure_for(verified[0], drafted[-1])) == verified.pop(0)
    return drafted


def test_the_draft_length_follows_the_lengths_verified_lately():
    # The whole block first; then HEADROOM (2) past the most verified in the last WINDOW (4) cycles;
    # PATIENCE (2) cycles in a row whose best choice is no draft pause the drafter for 1 cycle (0), a
    # third for 2, and a cycle that pays again ends the run; a cycle that verified all 3 drafts it
    # had is followed by the whole block.
    assert (HEADROOM, WINDOW, PATIENCE) == (2, 4, 2)
    schedule = BlockSchedule(STEEP, 16)
    assert drive(schedule, [3, 1, 0, 0, 0, 3, 5, 0, 2]) == [15, 5, 5, 5, 0, 5, 0, 0, 3, 15, 7, 7]
    assert schedule.draft_length() == 7  # since the full one: 5, 0, 2 verified; 5 + 2


def test_a_drafter_that_keeps_losing_is_paused_longer_up_to_max_pause():
    schedule = BlockSchedule(STEEP, 4)
    drafted = drive(schedule, [0] * 7)
    # the paused cycles between one drafting cycle and the next: none after the first losing
    # cycle, then 1, 2, 4, ... up to MAX_PAUSE while the drafter keeps losing
    pauses = [len(run) for run in "".join("x" if n else "." for n in drafted).split("x")[1:-1]]
    assert pauses == [0, 1, 2, 4, 8, 16] and MAX_PAUSE == 16


def test_a_draft_dearer_than_its_expected_gain_pauses_the_drafter():
    # One sure draft gains a token, but with the draft's cost a cycle is slower than a plain step.
    cheap, dear = (CostProfile((1.0, 1.2), other_s=d, draft_s=d) for d in (0.1, 1.5))
    for costs, paused in ((cheap, False), (dear, True)):
        schedule = BlockSchedule(costs, 2)
        for _ in range(PATIENCE):
            assert schedule.draft_length() == 1 and schedule.choose(torch.tensor([1.0])) == 1
        assert (schedule.draft_length() == 0) == paused


def test_the_calibration_scales_the_confidence_by_what_the_run_kept():
    calibration = Calibration()
    assert calibration.apply([0.5, 0.9]) == [0.5, 0.9]  # at first the drafter's word
    # Drafts 1-2 judged (draft 2 rejected), draft 3 never reached; then a cycle keeping 1 of 1.
    calibration.update([0.9, 0.7, 0.6], verified=3, accepted=1)
    calibration.update([0.5], verified=1, accepted=1)
    said, kept = DECAY * 1.6 + 0.5, DECAY * 1 + 1
    assert calibration.ratio == pytest.approx((kept + PRIOR) / (said + PRIOR))
    assert calibration.apply([0.5, 1.0]) == pytest.approx([0.5 * calibration.ratio, min(1.0, calibration.ratio)])


def test_an_overconfident_drafter_gets_shorter_verifies():
    # A 4-token verify costs 2 plain steps: at 0.9 confidence per draft all 3 are worth it; as cycles
    # in which the first draft was always rejected pile up, fewer are, then none.
    schedule = BlockSchedule(linear_profile(4, 2.0), 4)
    sure = torch.tensor([0.9, 0.9, 0.9])
    chosen = [schedule.choose(sure)]
    while chosen[-1] and len(chosen) < 30:
        schedule.judged(chosen[-1], 0)
        chosen.append(schedule.choose(sure))
    assert chosen[0] == 3 and chosen[-1] == 0 and 1 in chosen and chosen == sorted(chosen, reverse=True)
    # Paused cycles judge nothing, and the outcomes fade: the drafter is taken at its word again.
    for _ in range(30):
        schedule.judged(0, 0)
    assert schedule.choose(sure) == 3


def test_the_schedule_learns_the_rest_of_a_cycle_from_the_run():
    schedule = BlockSchedule(CostProfile((1.0, 2.0, 3.0)), 3)
    assert schedule.other_s == schedule.draft_s == 0.0
    schedule.observe(2.0, 1.0)
    schedule.observe(4.0, 2.0)
    schedule.observe(0.0, 3.0)  # a paused cycle: no draft
    assert (schedule.draft_s, schedule.other_s) == (3.0, 3.0 + 2.0)
    given = BlockSchedule(CostProfile((1.0, 2.0), other_s=0.5), 2)
    given.observe(7.0, 7.0)
    assert (given.other_s, given.draft_s) == (0.5, 0.0)  # given times hold: the choices are the drafts' alone
    assert BlockSchedule(CostProfile((1.0, 2.0), other_s=0.5, draft_s=0.25), 2).draft_s == 0.25


def test_with_the_gpu_profile_the_oracle_drafter_keeps_every_block_whole(tiny_dirs, tmp_path):
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "b16", target_dir, block_size=16))
    n, schedule = 48, [16, 3, 9, 1, 12]
    prompt = [4, 5, 6]
    plan = list(run(target, prompt, None, max_new_tokens=n + 16).output_ids)
    oracle = OracleDrafter(drafter, plan, schedule, target.vocab_size)
    out = run(target, prompt, oracle, max_new_tokens=n, block_size="auto", costs=GPU)
    assert list(out.output_ids) == plan[:n]
    assert [b.verify_len for b in out.blocks] == [16] * len(out.blocks)
    assert out.acceptance_lengths == expected_lengths(schedule, 16, len(out.blocks))


def golden_prompts(golden_expected):
    return [p["prompt_ids"] + p["target_greedy_ids"][:k] for p in golden_expected["prompts"] for k in (0, 3, 10)]


@pytest.mark.parametrize("profile", ["measured", "steep", "flat"])
def test_greedy_output_is_plain_decoding_whatever_lengths_are_verified(golden_pair, golden_expected, profile):
    target, drafter = golden_pair
    b = drafter.block_size
    costs = {"measured": None, "steep": linear_profile(b, 4.0), "flat": CostProfile((1.0,) * b)}[profile]
    lengths, accepted = set(), 0
    for prompt in golden_prompts(golden_expected)[:5]:
        plain = run(target, prompt, max_new_tokens=32)
        auto = run(target, prompt, drafter, max_new_tokens=32, block_size="auto", costs=costs)
        assert auto.output_ids == plain.output_ids
        assert auto.block_schedule == "auto" and auto.block_size == b
        for block in auto.blocks:
            assert block.accepted <= block.verified == block.verify_len - 1 <= len(block.draft_ids) <= b - 1
        lengths |= {block.verify_len for block in auto.blocks}
        accepted += sum(block.accepted for block in auto.blocks)
    assert accepted > 0, "no draft was accepted: the test would not exercise acceptance"
    if profile == "flat":
        assert lengths == {b}  # more drafts never cost more: verify them all
    elif profile == "steep":  # the measured profile is this machine's: which lengths it picks varies
        assert len(lengths) > 1, f"every cycle verified {lengths}: the test would not exercise prefixes"


def expected_draft_lengths(blocks, block_size: int) -> list[int]:
    """What each cycle should draft, read from the cycles before it: the whole block at first and after a
    cycle that verified all its drafts, else HEADROOM past the most verified in the last WINDOW cycles;
    none in the 1, 2, 4, ... cycles after PATIENCE drafting cycles in a row that verified none (a
    profile whose other_s is given and whose draft costs nothing: verifying no draft is the only
    losing choice)."""
    out, recent, paused, next_pause, losing = [], [], 0, 1, 0
    for block in blocks:
        if paused:
            out.append(0)
            paused -= 1
            continue
        out.append(min(block_size - 1, max(recent) + HEADROOM) if recent else block_size - 1)
        if block.verified == 0:
            losing += 1
            if losing >= PATIENCE:
                paused, next_pause = next_pause, min(2 * next_pause, MAX_PAUSE)
        else:
            losing, next_pause = 0, 1
        recent = [] if block.verified == len(block.draft_ids) else [*recent, block.verified][-WINDOW:]
    return out


@pytest.mark.parametrize("method", ["dflash", "ar"])
def test_a_scheduled_run_drafts_only_as_many_slots_as_recent_cycles_verified(golden_pair, golden_expected,
                                                                            tiny_dirs, tmp_path, method):
    target, drafter = golden_pair
    prompts = golden_prompts(golden_expected)[:3]
    if method == "ar":
        target = Target.from_pretrained(tiny_dirs[0])
        drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "ar", tiny_dirs[0], block_size=8,
                                                              architectures=["DFlashARDraftModel"]))
        prompts = [[3, 4, 5], [9, 1], [7, 7, 7, 2]]
    b = drafter.block_size
    shorter = paused = 0
    for prompt in prompts:
        auto = run(target, prompt, drafter, max_new_tokens=32, block_size="auto", costs=linear_profile(b, 4.0))
        assert auto.output_ids == run(target, prompt, max_new_tokens=32).output_ids
        drafted = [len(block.draft_ids) for block in auto.blocks]
        assert drafted == expected_draft_lengths(auto.blocks, b)
        # The AR drafter spends one pass per draft: fewer drafts, fewer passes.
        assert [block.draft_passes for block in auto.blocks] == (drafted if method == "ar" else [min(n, 1) for n in drafted])
        shorter += sum(0 < n < b - 1 for n in drafted)
        paused += drafted.count(0)
        assert all(block.verify_len == 1 and block.draft_passes == 0 for block in auto.blocks if not block.draft_ids)
    assert shorter > 0, "every cycle drafted the whole block: the test would not exercise shorter drafts"
    assert paused > 0, "no cycle was paused: the test would not exercise the drafter taking up skipped features"


class ScaledClock:
    """`time` as the decoding loop reads it, its clock running `rate` times as fast: a machine whose
    load changed since the first run."""

    def __init__(self, rate: float):
        self.rate, self.start = rate, time.perf_counter()

    def perf_counter(self) -> float:
        return self.start + (time.perf_counter() - self.start) * self.rate


# A verify of L tokens costs 10 ms + 2 ms a draft, the rest of a cycle left to the run: the choice turns on
# the confidences.
GIVEN_VERIFY = CostProfile(tuple(0.01 + 0.002 * (length - 1) for length in range(1, 9)))


@pytest.mark.parametrize("costs", [None, GIVEN_VERIFY], ids=["measured", "given-verify"])
def test_a_seeded_sampled_run_repeats_whatever_the_clock_reads(golden_pair, golden_expected, monkeypatch, costs):
    target, drafter = golden_pair
    prompt = golden_expected["prompts"][0]["prompt_ids"]
    sampling = SamplingParams(temperature=1.0, seed=5)

    def scheduled():
        out = run(target, prompt, drafter, max_new_tokens=48, block_size="auto", sampling=sampling, costs=costs)
        return list(out.output_ids), [(len(b.draft_ids), b.verify_len, b.accepted) for b in out.blocks]

    first = scheduled()
    for rate in (40.0, 0.02):
        monkeypatch.setattr(decoding, "time", ScaledClock(rate))
        assert scheduled() == first
    monkeypatch.undo()
    if costs is not None:  # a measured profile on a loaded machine may favour one length throughout
        assert len({verified for _, verified, _ in first[1]}) > 1  # the schedule did choose


def test_the_measured_profile_covers_every_length_and_is_kept_with_the_target(golden_pair):
    target, drafter = golden_pair
    target.tap_layers(drafter.target_layer_ids)
    first = measured_costs(target, 4)
    assert first.longest == 4 and all(t > 0 for t in first.verify_s) and first.other_s is None
    assert measured_costs(target, 4) is first


def test_the_autoregressive_drafter_is_scheduled_with_argmax_drafts(tiny_pair, tiny_dirs, tmp_path):
    target, _ = tiny_pair
    ar = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "ar", tiny_dirs[0], block_size=4,
                                                     architectures=["DFlashARDraftModel"]))
    for prompt in ([3, 4, 5], [9, 1]):
        plain = run(target, prompt, max_new_tokens=16)
        assert run(target, prompt, ar, max_new_tokens=16, block_size="auto", costs=linear_profile(4, 2.0)).output_ids \
            == plain.output_ids


def test_inputs_the_schedule_cannot_serve_are_named(tiny_pair, tiny_dirs, tmp_path):
    target, drafter = tiny_pair
    with pytest.raises(GenerationInputError, match="prompt lookup|lookup has none"):
        run(target, [1, 2], PromptLookup(block_size=4), block_size="auto")
    ar = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "ar", tiny_dirs[0], block_size=4,
                                                     architectures=["DFlashARDraftModel"]))
    with pytest.raises(GenerationInputError, match='ar conditions each draft on the ones before it: use draft_mode="argmax"'):
        run(target, [1, 2], ar, block_size="auto", sampling=SamplingParams(0.7, seed=0))
    with pytest.raises(GenerationInputError, match="block_size must be a whole number, None or 'auto', got 'big'"):
        run(target, [1, 2], drafter, block_size="big")
    with pytest.raises(GenerationInputError, match="covers verify lengths up to 2, the block size is 8"):
        run(target, [1, 2], drafter, block_size="auto", costs=CostProfile((1.0, 2.0)))
    with pytest.raises(GenerationInputError, match="finite times >= 0"):
        CostProfile((1.0, float("nan")))
    with pytest.raises(GenerationInputError, match="draft_s is a part of its other_s; got draft_s=0.5, other_s=0.25"):
        CostProfile((1.0, 2.0), other_s=0.25, draft_s=0.5)
    with pytest.raises(GenerationInputError, match="draft_s is a part of its other_s; got draft_s=0.5, other_s=None"):
        CostProfile((1.0, 2.0), draft_s=0.5)
    with pytest.raises(GenerationInputError, match="verify times are all zero"):
        CostProfile((0.0, 0.0))
    # Plain decoding has nothing to schedule: "auto" without a drafter is plain decoding.
    assert run(target, [1, 2], None, block_size="auto", max_new_tokens=4).block_schedule == "fixed"


@pytest.fixture(scope="module")
def auto_trace(golden_pair, golden_expected):
    target, drafter = golden_pair
    prompt = golden_expected["prompts"][0]["prompt_ids"]
    runs = {"dflash": run(target, prompt, drafter, max_new_tokens=24, block_size="auto",
                          costs=linear_profile(drafter.block_size, 3.0), explain=3),
            "plain": run(target, prompt, None, max_new_tokens=24)}
    return tr.build_trace(
        settings=tr.settings_of(None, prompt, 24, drafter.block_size, SamplingParams(), block_schedule="auto"),
        pair={"id": "golden", "target": "t", "drafter": "d", "trained_block_size": drafter.block_size},
        runs=runs, vocab_size=target.vocab_size, text_of=None, device="cpu",
    )


def test_the_trace_records_each_verified_length_and_old_traces_still_read(auto_trace):
    dflash = auto_trace["runs"]["dflash"]
    assert dflash["block_schedule"] == "auto" and auto_trace["runs"]["plain"]["block_schedule"] == "fixed"
    lengths = [b["verify_len"] for b in dflash["blocks"]]
    # Shorter drafts than the block are read back as they were drafted.
    assert min(len(b["draft_ids"]) for b in dflash["blocks"]) < dflash["block_size"] - 1
    assert min(lengths) < dflash["block_size"] and {b["verify_len"] for b in auto_trace["runs"]["plain"]["blocks"]} == {1}
    assert dflash["mean_verify_len"] == pytest.approx(sum(lengths) / len(lengths))
    assert tr.validate_trace(json.dumps(auto_trace).encode()) == auto_trace
    assert [row.split(",")[-1] for row in tr.trace_csv(auto_trace).splitlines()[1 : len(lengths) + 1]] \
        == [str(n) for n in lengths]
    old = copy.deepcopy(auto_trace)  # as written before the schedule: whole blocks, no new fields
    for lane in old["runs"].values():
        lane.pop("block_schedule")
        for block in lane["blocks"]:
            block.pop("verify_len")
            block.pop("explain", None)
            block["draft_ids"] = (block["draft_ids"] + [block["bonus_id"]] * lane["block_size"])[: lane["block_size"] - 1]
    assert tr.validate_trace(json.dumps(old).encode())["runs"]["plain"]["blocks"]


@pytest.mark.parametrize("edit,message", [
    (lambda b: b.update(verify_len=b["verify_len"] + len(b["draft_ids"]) + 1), "verifies at most"),
    (lambda b: b.update(verify_len=0), "verify_len is 0; it must be at least 1"),
    (lambda b: b.update(verify_len=b["accepted"]), "verified drafts accepts 0 to"),
    (lambda b: b.update(draft_ids=b["draft_ids"] * 8), "drafts; block_size 8 drafts up to 7"),
])
def test_a_verified_length_that_contradicts_its_block_is_refused(auto_trace, edit, message):
    broken = copy.deepcopy(auto_trace)
    block = next(b for b in broken["runs"]["dflash"]["blocks"] if b["accepted"] > 0)
    edit(block)
    with pytest.raises(tr.TraceFieldError, match=message):
        tr.validate_trace(json.dumps(broken).encode())
    with pytest.raises(tr.TraceFieldError, match="block_schedule is 'sometimes'"):
        tr.validate_trace(json.dumps({**auto_trace, "runs": {
            "plain": {**auto_trace["runs"]["plain"], "block_schedule": "sometimes"}}}).encode())


def test_cli_block_size_auto_with_a_cost_profile(golden_dir, tmp_path, capsys):
    profile = tmp_path / "costs.json"
    profile.write_text(json.dumps(linear_profile(8, 3.0).to_dict()))
    path = tmp_path / "auto.json"
    code = main(["generate", "--target", str(golden_dir / "target"), "--drafter", str(golden_dir / "drafter"),
                 "--prompt-ids", "5,6,7", "--max-new-tokens", "12", "--block-size", "auto",
                 "--cost-profile", str(profile), "--trace-json", str(path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "dflash block=auto (mean " in out.out and " of 8)" in out.out
    trace = tr.validate_trace(path)
    assert trace["settings"]["block_schedule"] == "auto" and trace["runs"]["dflash"]["block_schedule"] == "auto"
    with pytest.raises(SystemExit):
        main(["generate", "--target", "t", "--prompt-ids", "1", "--block-size", "many"])
    assert "--block-size must be a whole number or auto, got 'many'" in capsys.readouterr().err
    profile.write_text("[1, 2]")
    assert main(["generate", "--target", str(golden_dir / "target"), "--drafter", str(golden_dir / "drafter"),
                 "--prompt-ids", "5,6,7", "--block-size", "auto", "--cost-profile", str(profile)]) == 1
    assert "a cost profile is" in capsys.readouterr().err



def test_bench_cycle_writes_a_cost_profile_that_generate_reads(tiny_dirs, tmp_path, capsys):
    from dflash_core.bench.__main__ import main as bench

    target_dir, drafter_dir = tiny_dirs
    path = tmp_path / "profile.json"
    assert bench(["cycle", "--target", str(target_dir), "--drafter", str(drafter_dir), "--block-sizes", "4,8",
                  "--context", "24", "--threads", "1", "--cost-profile", str(path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    profile = CostProfile.load(path)
    assert profile.longest == 8 and profile.other_s > 0 and result["cost_profile"] == profile.to_dict()
    target, drafter = Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)
    out = run(target, [3, 4, 5], drafter, max_new_tokens=12, block_size="auto", costs=profile)
    assert out.output_ids == run(target, [3, 4, 5], max_new_tokens=12).output_ids
