"""The speedup model, from a run's own measured costs and acceptance.

Expected tokens per cycle with block size B (slot 0 plus B-1 drafts) and per-slot acceptance
rates r_k = P(the first k drafts are all accepted) (Leviathan et al., 2023; the bonus counted):

    E(B) = 1 + r_1 + ... + r_(B-1)          = (1 - a^B) / (1 - a)   when every slot accepts with a

A cycle costs the drafter, one target verification of B positions, and the bookkeeping between
them. A block-diffusion drafter (DFlash) proposes every slot in one pass; an autoregressive drafter
(EAGLE-style) with the same cost per pass needs one pass per drafted slot:

    speedup_DFlash(B) = E(B) * t_plain / (t_draft + t_verify + t_other)
    speedup_AR(B)     = E(B) * t_plain / ((B - 1) * t_draft + t_verify + t_other)

With t_verify = t_plain and t_other = 0, speedup_AR is Leviathan et al.'s
(1 - a^(g+1)) / ((1 - a)(g c + 1)) with g = B - 1 drafts and c = t_draft / t_plain; DFlash replaces
g c by c. B = 1 drafts nothing: both are 1. Costs are the run's means per cycle, held at the
measured values for every B (verification of a few more positions costs about the same on a GPU;
on a CPU it grows, so the curve is optimistic for large B there).
"""

from __future__ import annotations

from dataclasses import dataclass

FORMULA_MD = r"""**Speedup model** (Leviathan et al. 2023, with the drafter's cost term for one pass per block):
expected tokens per cycle $E(B) = 1 + \sum_{k=1}^{B-1} r_k$, where $r_k$ is the fraction of cycles whose first
$k$ drafts were all accepted ($E = \frac{1-a^B}{1-a}$ when every slot is accepted with probability $a$).
$\text{speedup}_{\text{DFlash}} = \frac{E(B)\, t_{plain}}{t_{draft} + t_{verify} + t_{other}}$ (one drafter pass per block),
$\text{speedup}_{\text{AR}} = \frac{E(B)\, t_{plain}}{(B-1)\, t_{draft} + t_{verify} + t_{other}}$ (an autoregressive drafter of the same
per-pass cost, one pass per slot). $t$ = this run's measured means per cycle; beyond the run's block size the
last measured per-slot acceptance is carried on (dashed)."""


@dataclass(frozen=True)
class Costs:
    """Mean seconds per cycle, measured on one run."""

    draft: float
    verify: float
    other: float
    plain: float  # one plain decoding step


def expected_tokens(rates: list[float]) -> float:
    """E(B) for cumulative acceptance rates r_1..r_(B-1)."""
    return 1.0 + sum(rates)


def iid_rates(a: float, drafts: int) -> list[float]:
    """r_k = a^k: every slot accepted with probability a, independently."""
    return [a**k for k in range(1, drafts + 1)]


def speedup(rates: list[float], costs: Costs, autoregressive: bool = False) -> float:
    drafts = len(rates)
    if drafts == 0:
        return 1.0
    passes = drafts if autoregressive else 1
    cycle = passes * costs.draft + costs.verify + costs.other
    return expected_tokens(rates) * costs.plain / cycle if cycle > 0 else 0.0


def extend_rates(rates: list[float], drafts: int) -> list[float]:
    """Cumulative rates for `drafts` slots: measured ones, then the last conditional rate carried on."""
    out = list(rates[:drafts])
    if len(out) < drafts:
        last = rates[-1] if rates else 0.0
        prev = rates[-2] if len(rates) >= 2 else 1.0
        step = last / prev if prev > 0 else 0.0
        while len(out) < drafts:
            out.append((out[-1] if out else 1.0) * step)
    return out


def effective_acceptance(tau: float, block_size: int) -> float:
    """The a with (1 - a^B) / (1 - a) = tau (bisection); 0 for tau <= 1, 1 for tau >= B."""
    if tau <= 1.0 or block_size <= 1:
        return 0.0
    if tau >= block_size:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(iid_rates(mid, block_size - 1)) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def run_costs(dflash, plain) -> Costs | None:
    """Mean per-cycle costs of a race's two summaries (None until both have cycles)."""
    if not dflash.blocks or not plain.blocks:
        return None

    def cycle_times(summary) -> list[float]:
        stamps = [summary.prefill.seconds, *(b.elapsed_s for b in summary.blocks)]
        return [b - a for a, b in zip(stamps, stamps[1:])]

    n = len(dflash.blocks)
    draft = sum(b.draft_s for b in dflash.blocks) / n
    verify = sum(b.verify_s for b in dflash.blocks) / n
    cycle = sum(cycle_times(dflash)) / n
    plain_step = sum(cycle_times(plain)) / len(plain.blocks)
    return Costs(draft, verify, max(cycle - draft - verify, 0.0), plain_step)


def speedup_figure(dflash, plain, measured: float | None = None, max_block: int = 16):
    """Modelled speedup vs block size and vs per-slot acceptance, with this run marked.

    dflash, plain: the race's summaries (provisional ones while running); measured: the run's
    speedup as reported (prefill included), or None while running.
    """
    from . import charts  # plotly only when a figure is asked for

    costs = None if dflash is None or plain is None else run_costs(dflash, plain)
    if costs is None or dflash.block_size < 2:
        fig = charts._figure("Speedup model (needs a finished DFlash cycle)", "block size B", "speedup", [])
        return fig
    b_run = dflash.block_size
    rates = list(dflash.per_position_acceptance)
    sizes = list(range(1, max(max_block, b_run) + 1))
    traces = []
    for name, color, auto in (("DFlash (1 drafter pass)", charts.DFLASH_COLOR, False), ("AR drafter (B-1 passes)", "#e8590c", True)):
        ys = [speedup(extend_rates(rates, b - 1), costs, auto) for b in sizes]
        measured_part = [b <= b_run for b in sizes]
        for dash, keep, legend in (("solid", lambda m: m, True), ("dot", lambda m: not m, False)):
            xs = [b for b, m in zip(sizes, measured_part) if keep(m) or b == b_run]
            traces.append({
                "type": "scatter", "mode": "lines+markers", "x": xs, "y": [ys[b - 1] for b in xs],
                "name": name, "showlegend": legend, "legendgroup": name,
                "line": {"color": color, "dash": dash}, "marker": {"size": 5}, "xaxis": "x", "yaxis": "y",
            })
        alphas = [i / 50 for i in range(51)]
        traces.append({
            "type": "scatter", "mode": "lines", "x": alphas,
            "y": [speedup(iid_rates(a, b_run - 1), costs, auto) for a in alphas],
            "name": name, "showlegend": False, "legendgroup": name, "line": {"color": color},
            "xaxis": "x2", "yaxis": "y2",
        })
    model_here = speedup(rates, costs)
    a_eff = effective_acceptance(dflash.tau, b_run)
    mark = measured if measured is not None else model_here
    label = "this run (measured)" if measured is not None else "this run (so far)"
    for axis, x in (("", b_run), ("2", a_eff)):
        traces.append({
            "type": "scatter", "mode": "markers", "x": [x], "y": [mark], "name": label,
            "showlegend": axis == "", "marker": {"symbol": "star", "size": 14, "color": "#222"},
            "xaxis": "x" + axis, "yaxis": "y" + axis,
        })
    fig = charts._figure(
        f"Speedup model from this run (B={b_run}: model {model_here:.2f}×, tau {dflash.tau:.2f}, a≈{a_eff:.2f})",
        "block size B", "expected speedup", traces, xaxis={"domain": [0, 0.46], "dtick": 2},
    )
    fig.layout.update({
        "height": 320,
        "xaxis2": {"domain": [0.56, 1], "title": {"text": f"per-slot acceptance a (B={b_run})"}, "anchor": "y2", "range": [0, 1]},
        "yaxis2": {"anchor": "x2", "title": {"text": "expected speedup"}},
        "shapes": [
            {"type": "line", "xref": "x", "x0": 1, "x1": sizes[-1], "yref": "y", "y0": 1, "y1": 1,
             "line": {"color": "#999", "width": 1, "dash": "dash"}},
        ],
    })
    return fig
