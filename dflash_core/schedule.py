"""The per-cycle block schedule: how many drafts a cycle drafts, and how many are worth their verify cost.

`generate(..., block_size="auto")` verifies each cycle only its first k drafts, the k that
maximizes expected tokens per second of the cycle:

    rate(k) = (1 + E[accepted | k]) / (other_s + verify_s[k + 1]),
    E[accepted | k] = sum over j <= k of c_1 * ... * c_j

c_i: the drafter's probability for draft i (`draft_confidence`); verify_s[L]: seconds of the
target's verify of L tokens, from a `CostProfile` measured once per target, thread count and
longest block (`measured_costs`) or given; other_s: the cycle's cost besides the verify (the
draft, the acceptance, the cache bookkeeping), its mean over the run's previous cycles. The 1
is the target's bonus token, which every cycle commits.

A prefix of a draft is verified exactly as a full draft is, so the output stays that of plain
decoding at temperature 0 and exact in distribution when sampling, provided the choice of k does
not depend on which token a sampled draft drew: keeping a draft only when it was a likely draw
would skew what is emitted. So with sampled drafts c_i is the expected probability of a draw,
sum_x q_i(x)^2, a function of q_i alone; and only a drafter that computes every slot's q before
drawing any (DFlash: one pass) may be scheduled then. Deterministic drafts (greedy, argmax)
use the draft's own probability, which is the same thing for them: max_x q_i(x).

The drafter's confidence is calibrated on the run's own outcomes (`Calibration`): c_i is scaled by
the drafts the run kept over the confidence it gave them, with recent cycles weighing most, so a
drafter that overstates its chances on some text (a math answer, say) stops buying long verifies
there.

Before the draft, the schedule also says how many drafts to draft (`draft_length`): a few more
than the most it verified in the last `WINDOW` cycles, the whole block at first and after a cycle
that verified every draft it had. On a CPU a drafter pass costs more with every slot, and a
drafter trained at a large block drafts as well at smaller ones (docs/benchmarks.md, "The block
schedule"). When a cycle's best choice is still slower than a plain step (its draft's cost
included), the schedule pauses the drafter: the next cycles are plain steps (length 0; the drafter
takes their features when it drafts again), 1, 2, 4, ... up to `MAX_PAUSE` cycles while the drafter
keeps losing. The length depends only on earlier cycles, never on this cycle's draws, so sampling
stays exact.

A seeded sampled run must repeat draw for draw, so its choices may not read the clock mid-run
(the learned costs vary with the machine's load, and with them the verified lengths, the number of
draws and the output). Without a given `other_s` it fixes its costs at its start instead
(`fixed_draft_costs`): the verify profile as above, and a draft's seconds measured once per target,
drafter and block on fresh sessions of their own (`measure_draft`), taken as the whole rest of a
cycle. Unseeded runs keep learning from their cycles.
"""

from __future__ import annotations

import json
import math
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import GenerationInputError
from .explain import distribution
from .sampling import greedy_ids

AUTO = "auto"  # the block_size that asks for the schedule
WINDOW = 4  # cycles whose verified lengths set the next draft length
HEADROOM = 2  # drafts past the longest recently verified, so that a run of sure drafts can grow
PRIOR = 4.0  # drafts taken at the drafter's word before the run's own outcomes calibrate it
DECAY = 0.9  # per cycle: the weight left to older outcomes, as a run's text changes
MAX_PAUSE = 16  # plain cycles at most between tries of a drafter that keeps losing
PATIENCE = 2  # losing cycles in a row before the drafter pauses: one bad draft says little of the next


@dataclass(frozen=True)
class CostProfile:
    """What a cycle costs at each verify length: verify_s[L - 1] seconds for a verify of L tokens
    (slot 0 and L - 1 drafts), L = 1 .. len(verify_s); other_s: the rest of a cycle (the draft,
    acceptance and bookkeeping), or None to learn it from the run's own cycles; draft_s: the draft's
    part of other_s, which a plain step saves (0 when other_s is given without it)."""

    verify_s: tuple[float, ...]
    other_s: float | None = None
    draft_s: float | None = None

    def __post_init__(self):
        given = [t for t in (self.other_s, self.draft_s) if t is not None]
        times = [*self.verify_s, *given]
        if not self.verify_s or not all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in times):
            raise GenerationInputError(
                f"a cost profile needs verify seconds for lengths 1, 2, ... and finite times >= 0; got "
                f"verify_s={list(self.verify_s)[:20]}, other_s={self.other_s}, draft_s={self.draft_s}"
            )
        if self.draft_s is not None and (self.other_s is None or self.draft_s > self.other_s):
            raise GenerationInputError(
                f"a cost profile's draft_s is a part of its other_s; got draft_s={self.draft_s}, other_s={self.other_s}"
            )
        if max(self.verify_s) <= 0:
            raise GenerationInputError(f"a cost profile's verify times are all zero: {list(self.verify_s)[:20]}")

    @property
    def longest(self) -> int:
        return len(self.verify_s)

    def to_dict(self) -> dict:
        return {"verify_s": list(self.verify_s), "other_s": self.other_s, "draft_s": self.draft_s}

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        if not isinstance(data, dict) or not isinstance(data.get("verify_s"), list):
            raise GenerationInputError(
                f'a cost profile is {{"verify_s": [seconds per length], "other_s": seconds, "draft_s": seconds}}; '
                f"got {data!r:.80}"
            )
        return cls(tuple(data["verify_s"]), data.get("other_s"), data.get("draft_s"))

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        """A profile from a JSON file (`to_dict`'s form; `bench cycle --cost-profile` writes one)."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise GenerationInputError(f"cannot read the cost profile {path}: {exc}") from None


def expected_accepted(confidence: list[float]) -> list[float]:
    """E[accepted drafts] when verifying the first k drafts, for k = 0 .. len(confidence)."""
    out, reach = [0.0], 1.0
    for c in confidence:
        reach *= c  # the chance that every draft up to this one is accepted
        out.append(out[-1] + reach)
    return out


def best_length(confidence: list[float], verify_s, other_s: float) -> int:
    """The number of drafts k (0 .. len(confidence)) with the most expected tokens per second;
    the shortest among equals."""
    gains = expected_accepted(confidence)
    rates = [(1 + gains[k]) / (other_s + verify_s[k]) for k in range(min(len(gains), len(verify_s)))]
    return max(range(len(rates)), key=lambda k: (rates[k], -k))


class Calibration:
    """How far the drafter's confidence has matched acceptance in this run: the drafts kept over the
    confidence given the drafts verified up to the first rejection, decayed by DECAY every cycle,
    with PRIOR drafts at ratio 1. So the first cycles take the drafter at its word, and so do the
    cycles after a long pause, which have no recent outcome to go by."""

    def __init__(self):
        self.said = self.kept = 0.0

    @property
    def ratio(self) -> float:
        return (self.kept + PRIOR) / (self.said + PRIOR)

    def apply(self, confidence: list[float]) -> list[float]:
        ratio = self.ratio
        return [min(1.0, c * ratio) for c in confidence]

    def update(self, confidence: list[float], verified: int, accepted: int) -> None:
        """After a cycle's verify of `verified` drafts (0 for a plain step), `accepted` of them kept;
        the drafts after the first rejected one were never judged, so they do not count."""
        judged = min(verified, accepted + 1)
        self.said = DECAY * self.said + sum(confidence[:judged])
        self.kept = DECAY * self.kept + accepted


class BlockSchedule:
    """One run's schedule: sets each cycle's drafted length (`draft_length`), chooses its verified
    drafts (`choose`), learns from each verify how far to trust the drafter (`judged`), and the cost
    of a cycle besides its verify from the cycles that ran (`observe`)."""

    def __init__(self, costs: CostProfile, block_size: int):
        if costs.longest < block_size:
            raise GenerationInputError(
                f"the cost profile covers verify lengths up to {costs.longest}, the block size is {block_size}"
            )
        self.verify_s = costs.verify_s[:block_size]
        self.given_other_s = costs.other_s
        # Given times make the schedule's choices a function of the drafts alone (tests, replays).
        self.given_draft_s = costs.draft_s if costs.draft_s is not None or costs.other_s is None else 0.0
        self.calibration = Calibration()
        self.draft_total = self.rest_total = 0.0
        self.drafting_cycles = self.cycles = 0
        self.recent: list[int] = []  # drafts verified in the last WINDOW cycles, past the last full one
        self.paused = 0  # plain cycles left before the drafter is tried again
        self.losing = 0  # drafting cycles in a row whose best choice was slower than a plain step
        self.next_pause = 1  # the pause after the next losing cycle; doubles while the drafter keeps losing
        self.confidence: list[float] = []  # the raw confidences of the cycle being verified

    @property
    def draft_s(self) -> float:
        """A draft's seconds: given, or its mean in this run (0 before the first)."""
        if self.given_draft_s is not None:
            return self.given_draft_s
        return self.draft_total / self.drafting_cycles if self.drafting_cycles else 0.0

    @property
    def other_s(self) -> float:
        """A drafting cycle's seconds besides its verify: given, or learned from the run."""
        if self.given_other_s is not None:
            return self.given_other_s
        return self.draft_s + (self.rest_total / self.cycles if self.cycles else 0.0)

    def draft_length(self) -> int:
        """Drafts to draft this cycle: 0 while paused, HEADROOM past the most verified in the last
        WINDOW cycles, or the whole block (block_size - 1) at first and after a cycle that verified
        every draft."""
        if self.paused:
            self.paused -= 1
            return 0
        longest = len(self.verify_s) - 1
        if not self.recent:
            return longest
        return min(longest, max(self.recent) + HEADROOM)

    def choose(self, confidence: torch.Tensor) -> int:
        """Drafts to verify, from the drafter's confidence per draft (one host read)."""
        self.confidence = confidence.tolist()
        if not self.confidence:  # a paused cycle: a plain step
            return 0
        calibrated = self.calibration.apply(self.confidence)
        other_s = self.other_s
        k = best_length(calibrated, self.verify_s, other_s)
        # A plain step costs the verify of one token and the cycle's rest without the draft.
        drafting_rate = (1 + expected_accepted(calibrated)[k]) / (other_s + self.verify_s[k])
        plain_rate = 1 / (max(other_s - self.draft_s, 0.0) + self.verify_s[0])
        if k == 0 or drafting_rate < plain_rate:
            self.losing += 1
            if self.losing >= PATIENCE:
                self.paused, self.next_pause = self.next_pause, min(2 * self.next_pause, MAX_PAUSE)
        else:
            self.losing, self.next_pause = 0, 1
        # A cycle that wanted every draft it had may want more: the next one drafts the whole block.
        self.recent = [] if k == len(self.confidence) else [*self.recent, k][-WINDOW:]
        return k

    def judged(self, verified: int, accepted: int) -> None:
        """The verify's outcome: `accepted` of the `verified` drafts kept (every cycle, paused ones too)."""
        self.calibration.update(self.confidence, verified, accepted)

    def observe(self, draft_s: float, rest_s: float) -> None:
        """A cycle's seconds drafting (0 when it drafted nothing) and besides its draft and verify."""
        if draft_s:
            self.draft_total += draft_s
            self.drafting_cycles += 1
        self.rest_total += rest_s
        self.cycles += 1


def draft_confidence(drafter, logits, probs, sampling, vocab_size: int) -> torch.Tensor:
    """[n] the drafter's probability for each of its n drafts, as the schedule reads it (module doc).

    logits: what the drafter's `draft_logits` returned; probs: the q rows sampled drafts were
    drawn from, or None for deterministic drafts (the mode of the sampling distribution).
    """
    if probs is not None:
        return probs.square().sum(dim=-1)
    return distribution(drafter.full_logits(logits, vocab_size), sampling).amax(dim=-1)


# Measured profiles, per target (dropped with it) and (longest, threads, feature taps, device).
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def measured_costs(target, longest: int, context: int = 64) -> CostProfile:
    """The profile `measure_costs` gives for `target`, measured on first use and kept with it."""
    key = (longest, torch.get_num_threads(), target.feature_layers, str(target.device), context)
    per_target = _MEASURED.setdefault(target, {})
    if key not in per_target:
        per_target[key] = measure_costs(target, longest, context)
    return per_target[key]


def fixed_draft_costs(costs: CostProfile, target, drafter, new_session) -> CostProfile:
    """`costs` with a draft's seconds as the rest of a cycle, for a run whose choices must not read the
    clock (module doc): measured by `measure_draft(target, new_session, len(costs.verify_s))` on first
    use and kept with the target, per drafter, thread count and device."""
    key = ("draft", weakref.ref(drafter), costs.longest, torch.get_num_threads(), str(target.device))
    per_target = _MEASURED.setdefault(target, {})
    if key not in per_target:
        per_target[key] = measure_draft(target, new_session, costs.longest)
    draft_s = per_target[key]
    return CostProfile(costs.verify_s, other_s=draft_s, draft_s=draft_s)


@torch.inference_mode()
def measure_draft(target, new_session, longest: int, context: int = 4, rounds: int = 3) -> float:
    """Seconds of a drafter's whole-block draft (`longest` - 1 drafts, read back to the host) after
    `context` random tokens of the target, which a cycle's draft injects as features: the least of
    `rounds` timings after one warm-up, each on a fresh session from `new_session()` (so the run's
    own session and random generator are untouched). Leaves the target's cache holding the context;
    the caller resets it."""
    device = target.device
    ids = torch.randint(0, target.vocab_size, (1, context), generator=torch.Generator().manual_seed(0)).to(device)
    best = math.inf
    for round_ in range(rounds + 1):
        target.reset(context + longest)
        logits, features = target.forward(ids, last_logits_only=True)
        bonus = int(greedy_ids(logits[-1]))
        session = new_session()
        session.prefill(ids[0].tolist(), bonus, features)
        bonus_ids = torch.tensor([bonus], device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        session.draft(bonus_ids, context, False).ids.tolist()
        if round_:  # the first round warms up kernels and the allocator
            best = min(best, time.perf_counter() - t0)
    return best


@torch.inference_mode()
def measure_costs(target, longest: int, context: int = 64, rounds: int = 3) -> CostProfile:
    """Seconds of the target's verify of 1 .. `longest` tokens (with its feature taps as they are
    set) after `context` random tokens: the least of `rounds` timings of each, after one warm-up
    round, the lengths interleaved so a change in the machine's load touches them all alike. Leaves
    the target's cache holding the context; the caller resets it."""
    device = target.device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (1, context + longest), generator=generator).to(device)
    target.reset(context + longest)
    target.forward(ids[:, :context], last_logits_only=True)
    best = [math.inf] * longest
    for round_ in range(rounds + 1):
        for length in range(1, longest + 1):
            target.crop(context)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            logits, _ = target.forward(ids[:, context : context + length])
            int(greedy_ids(logits[-1]))  # a cycle's verify ends with its result on the host
            if round_:  # the first round warms up kernels, allocator and graph captures
                best[length - 1] = min(best[length - 1], time.perf_counter() - t0)
    target.crop(context)
    return CostProfile(tuple(best))
