"""The speedup model, from a run's own measured costs and acceptance.

Expected tokens per cycle with block size B (slot 0 plus B-1 drafts) and per-slot acceptance
rates r_k = P(the first k drafts are all accepted) (Leviathan et al., 2023; the bonus counted):

    E(B) = 1 + r_1 + ... + r_(B-1)          = (1 - a^B) / (1 - a)   when every slot accepts with a

A cycle costs the drafter, one target verification of B positions, and the bookkeeping between
them. A block-diffusion drafter (DFlash) proposes every slot in one pass; an autoregressive drafter
(EAGLE-style) needs one pass per drafted slot; prompt lookup has no model, its draft cost is a search:

    speedup_DFlash(B) = E(B) * t_plain / (t_draft + t_verify + t_other)
    speedup_AR(B)     = E(B) * t_plain / ((B - 1) * t_draft + t_verify + t_other)

With t_verify = t_plain and t_other = 0, speedup_AR is Leviathan et al.'s
(1 - a^(g+1)) / ((1 - a)(g c + 1)) with g = B - 1 drafts and c = t_draft / t_plain; DFlash replaces
g c by c. B = 1 drafts nothing: both are 1. Each lane raced gets its own curve from its own
acceptance and costs (an AR lane's t_draft per pass); without an AR lane its curve is DFlash's
acceptance at B-1 of DFlash's passes. Costs are the run's means per cycle, held at the measured
values for every B (verification of a few more positions costs about the same on a GPU; on a CPU
it grows, so the curve is optimistic for large B there).
"""

from __future__ import annotations

from dataclasses import dataclass

FORMULA_MD = r"""**Speedup model** (Leviathan et al. 2023, with the drafter's cost term for one pass per block):
expected tokens per cycle $E(B) = 1 + \sum_{k=1}^{B-1} r_k$, where $r_k$ is the fraction of cycles whose first
$k$ drafts were all accepted ($E = \frac{1-a^B}{1-a}$ when every slot is accepted with probability $a$).
$\text{speedup}_{\text{DFlash}} = \frac{E(B)\, t_{plain}}{t_{draft} + t_{verify} + t_{other}}$ (one drafter pass per block),
$\text{speedup}_{\text{AR}} = \frac{E(B)\, t_{plain}}{(B-1)\, t_{draft} + t_{verify} + t_{other}}$ (an autoregressive drafter,
one pass per slot). $t$ and $r_k$ = each lane's own measured means per cycle (without an AR lane,
its curve takes DFlash's: dotted); beyond the run's block size the last measured per-slot acceptance is carried on
(dotted). ★ marks each lane's measured speedup."""


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


def run_costs(lane, plain, per_pass: bool = False) -> Costs | None:
    """Mean per-cycle costs of a lane's summary beside plain decoding's (None until both have
    cycles); per_pass: `draft` per drafter pass (an autoregressive drafter's), else per cycle."""
    if not lane.blocks or not plain.blocks:
        return None

    def cycle_times(summary) -> list[float]:
        stamps = [summary.prefill.seconds, *(b.elapsed_s for b in summary.blocks)]
        return [b - a for a, b in zip(stamps, stamps[1:])]

    n = len(lane.blocks)
    draft = sum(b.draft_s for b in lane.blocks) / n
    verify = sum(b.verify_s for b in lane.blocks) / n
    cycle = sum(cycle_times(lane)) / n
    plain_step = sum(cycle_times(plain)) / len(plain.blocks)
    passes = lane.draft_passes / n
    per = draft / passes if per_pass and passes > 0 else draft
    return Costs(per, verify, max(cycle - draft - verify, 0.0), plain_step)


@dataclass(frozen=True)
class Curve:
    """One method's modelled speedup: its own acceptance and costs, one pass per block or per slot."""

    name: str
    label: str
    color: str
    rates: list[float]
    costs: Costs
    autoregressive: bool
    block_size: int
    measured: float | None  # the lane's speedup as reported; None: modelled only
    estimate: bool = False  # not raced: an AR drafter of DFlash's per-pass cost and acceptance


def _curves(lanes: dict, plain, measured: dict | None) -> list[Curve]:
    from ..race.lanes import COLORS, LABELS

    curves = []
    for name, summary in lanes.items():
        # The model's curve is one fixed block per run; a schedule's cut drafts would read as rejected,
        # and a tree's acceptance and verify cost are its budget's, not a chain's of each length.
        if summary is None or summary.block_size < 2 or name in ("scheduled", "tree"):
            continue
        auto = name == "ar"
        costs = run_costs(summary, plain, per_pass=auto)
        if costs is None:
            continue
        passes = "B-1 passes" if auto else ("no model" if name == "lookup" else "1 drafter pass")
        label = f"{'DFlash' if name == 'dflash' else LABELS[name]} ({passes})"
        curves.append(Curve(name, label, COLORS[name], list(summary.per_position_acceptance), costs, auto,
                            summary.block_size, (measured or {}).get(name)))
    dflash = next((c for c in curves if c.name == "dflash"), None)
    if dflash is not None and "ar" not in lanes:
        curves.append(Curve("ar", "AR drafter (B-1 passes, estimated from DFlash's pass)", COLORS["ar"], dflash.rates,
                            dflash.costs, True, dflash.block_size, None, estimate=True))
    return curves


def speedup_figure(lanes, plain, measured: dict | None = None, max_block: int = 16):
    """Modelled speedup vs block size and vs per-slot acceptance, one curve per drafting lane from
    its own measured acceptance and costs, with each lane's run marked on its curve.

    lanes: the drafting lanes' summaries by name (provisional ones while running); plain: plain
    decoding's; measured: each lane's speedup as reported (prefill included), None while running.
    Without an AR lane, the AR curve is DFlash's acceptance at B-1 of DFlash's passes (dotted).
    """
    from . import charts  # plotly only when a figure is asked for

    curves = [] if not lanes or plain is None else _curves(lanes, plain, measured)
    if not curves:
        return charts._figure("Speedup model (needs a finished DFlash cycle)", "block size B", "speedup", [])
    sizes = list(range(1, max(max_block, *(c.block_size for c in curves)) + 1))
    traces = []
    for c in curves:
        ys = [speedup(extend_rates(c.rates, b - 1), c.costs, c.autoregressive) for b in sizes]
        for dash, beyond, legend in (("solid", False, True), ("dot", True, False)):
            xs = [b for b in sizes if (b > c.block_size) == beyond or b == c.block_size]
            traces.append({
                "type": "scatter", "mode": "lines+markers", "x": xs, "y": [ys[b - 1] for b in xs],
                "name": c.label, "showlegend": legend, "legendgroup": c.name,
                "line": {"color": c.color, "dash": "dot" if c.estimate else dash}, "marker": {"size": 5},
                "xaxis": "x", "yaxis": "y",
            })
        alphas = [i / 50 for i in range(51)]
        traces.append({
            "type": "scatter", "mode": "lines", "x": alphas,
            "y": [speedup(iid_rates(a, c.block_size - 1), c.costs, c.autoregressive) for a in alphas],
            "name": c.label, "showlegend": False, "legendgroup": c.name,
            "line": {"color": c.color, "dash": "dot" if c.estimate else "solid"}, "xaxis": "x2", "yaxis": "y2",
        })
    marked = [c for c in curves if not c.estimate]
    for i, c in enumerate(marked):
        tau = 1 + sum(c.rates)
        mark = c.measured if c.measured is not None else speedup(c.rates, c.costs, c.autoregressive)
        label = "this run (measured)" if c.measured is not None else "this run (so far)"
        for axis, x in (("", c.block_size), ("2", effective_acceptance(tau, c.block_size))):
            traces.append({
                "type": "scatter", "mode": "markers", "x": [x], "y": [mark], "name": label,
                "showlegend": axis == "" and i == 0, "legendgroup": "run",
                "marker": {"symbol": "star", "size": 14, "color": c.color, "line": {"color": "#222", "width": 1}},
                "xaxis": "x" + axis, "yaxis": "y" + axis,
            })
    lead = curves[0]
    b_run, tau = lead.block_size, 1 + sum(lead.rates)
    model_here = speedup(lead.rates, lead.costs, lead.autoregressive)
    legend = sum(1 for t in traces if t.get("showlegend"))
    fig = charts._figure(
        f"Speedup model from this run (B={b_run}: DFlash model {model_here:.2f}×, tau {tau:.2f}, "
        f"a≈{effective_acceptance(tau, b_run):.2f})",
        "block size B", "expected speedup", traces, xaxis={"domain": [0, 0.46], "dtick": 2},
    )
    # More than four legend entries take two rows: the figure grows so that they clear the title.
    crowded = legend > 4
    height = 400 if crowded else 320
    fig.layout.update({
        "height": height,
        "margin": {"l": 50, "r": 10, "t": 125 if crowded else 40, "b": 40},
        "title": {"y": 1 - 30 / height if crowded else 0.92, "yref": "container", "yanchor": "top"},
        "xaxis2": {"domain": [0.56, 1], "title": {"text": f"per-slot acceptance a (B={b_run})"}, "anchor": "y2", "range": [0, 1]},
        "yaxis2": {"anchor": "x2", "title": {"text": "expected speedup"}},
        "shapes": [
            {"type": "line", "xref": "x", "x0": 1, "x1": sizes[-1], "yref": "y", "y0": 1, "y1": 1,
             "line": {"color": "#999", "width": 1, "dash": "dash"}},
        ],
    })
    return fig
