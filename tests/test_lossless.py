"""The three-way lossless check and the dtype "auto" picks: identical, near-tie (rounding), diverged (a bug)."""

from __future__ import annotations

from dataclasses import replace

import torch

from app.race.report import race_report
from app.view.render import summary_html
from dflash_core import Target, run
from dflash_core.loading.pair import default_target_dtype, parse_dtype
from dflash_core.lossless import compare

PROMPT = [5, 9, 17, 33]


def test_auto_dtype_is_bf16_on_cuda():
    assert default_target_dtype("cuda") == torch.bfloat16
    assert default_target_dtype("cuda:1") == torch.bfloat16
    assert parse_dtype("auto", "cuda") == torch.bfloat16
    assert default_target_dtype("cpu") in (torch.float32, torch.bfloat16)  # bf16 only with AMX or AVX512-BF16


def tied_target(tiny_dirs, position=3):
    """The tiny target with token `b` scoring exactly like plain decoding's token at `position`."""
    target = Target.from_pretrained(tiny_dirs[0])
    plain = list(run(target, PROMPT, max_new_tokens=10).output_ids)
    p = plain[position]
    b = max(i for i in range(target.vocab_size) if i not in plain)  # a later index: argmax keeps p
    with torch.no_grad():
        target.head.weight[b] = target.head.weight[p]
    assert list(run(target, PROMPT, max_new_tokens=10).output_ids) == plain
    return target, plain, b


def test_identical_near_tie_and_diverged(tiny_dirs):
    target, plain, b = tied_target(tiny_dirs)
    assert compare(target, PROMPT, plain, plain).kind == "identical"

    tie = compare(target, PROMPT, [*plain[:3], b, 7, 7], plain)
    assert (tie.kind, tie.position, tie.dflash_token, tie.plain_token) == ("near_tie", 3, b, plain[3])
    assert tie.gap == 0.0 and tie.top2_margin == 0.0 and tie.lossless
    assert "near-tie at token 3" in tie.message() and "round" in tie.message()

    # The worst-scoring token at position 3: the target's choice was clear.
    probe = Target(target.model)
    logits, _ = probe.forward(torch.tensor([[*PROMPT, *plain[:3]]]), last_logits_only=True)
    worst = int(logits[-1].argmin())
    bug = compare(target, PROMPT, [*plain[:3], worst], plain)
    assert bug.kind == "diverged" and bug.position == 3 and not bug.lossless
    assert bug.gap > bug.tolerance and "bug" in bug.message()
    # A run that stops early with the same tokens is a bug too, never rounding.
    assert compare(target, PROMPT, plain[:5], plain).kind == "diverged"


def test_report_and_summary_show_the_verdict(tiny_dirs):
    target, plain, b = tied_target(tiny_dirs)
    d = run(target, PROMPT, max_new_tokens=10)
    near = compare(target, PROMPT, [*plain[:3], b], plain)
    report = race_report(d, d, 0.0, 4, near)
    assert report.lossless.kind == "near_tie" and report.lossless.position == 3
    report = replace(report, identical=False, first_difference=3)  # as a race that parted there would say
    html = summary_html(report)
    assert "near-tie at token 3" in html and "not a bug" in html and "BUG" not in html
    report = replace(report, lossless=replace(report.lossless, kind="diverged"))
    assert "BUG: differ at token 3" in summary_html(report)
    assert race_report(d, d, 0.7, 4, near).lossless is None  # sampling: not checked
