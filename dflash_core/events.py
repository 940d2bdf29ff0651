"""Events a decoding run yields, the typed explanation a block may carry, and the trace (JSON) and
metrics built from them.

A run yields one `Prefill`, then one `Block` per cycle, then one `Summary`. Plain decoding yields
the same events with one-token blocks and no draft, so both are measured on equal terms. With
`explain=k` every block carries a `CycleExplanation` (built by `explain.py`); its `to_dict` and
`from_dict` are the trace's JSON form of it (docs/design.md §4 for the terms). This module imports
no torch: a replay rebuilds these events from a trace file without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Literal

Rule = Literal["greedy", "match", "rejection"]  # how a cycle decided (`verify.py`)
TopK = tuple[tuple[int, float], ...]  # (token id, probability), most likely first


@dataclass(frozen=True)
class SlotVerdict:
    """The target's verdict on one draft slot."""

    slot: int  # 1..B-1
    draft: int
    target: int | None  # the target's token here; under the rejection rule only the rejected slot has one (the bonus)
    p: float  # the target's probability of the draft
    q: float  # the drafter's probability of the draft
    ratio: float | None  # p / q, under the rejection rule
    u: float | None  # the uniform draw compared with the ratio, under the rejection rule
    accepted: bool


@dataclass(frozen=True)
class Decision:
    rule: Rule
    slots: tuple[SlotVerdict, ...]  # each draft slot up to and including the first rejected one
    resampled: bool  # the rejected slot's token was drawn from the residual max(p - q, 0)


@dataclass(frozen=True)
class Injected:
    positions: int  # new context positions fed into every drafter layer this cycle
    target_layers: tuple[int, ...]


@dataclass(frozen=True)
class CacheLengths:
    target_before: int
    target_after: int
    drafter_before: int
    drafter_after: int


@dataclass(frozen=True)
class CycleTimes:
    """The cycle's own seconds; building its explanation comes after them."""

    draft_s: float
    verify_s: float
    other_s: float

    @property
    def total_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s


@dataclass(frozen=True)
class SelectorPath:
    """A DFlash2 draft step's path selector at work, one row per drafted slot (docs/design.md §2,
    "DFlash2"): the slot's top-K candidates (target ids, the LM head's best first), the selector's
    probability of each one after the candidate chosen at the slot before (the distribution the
    draft was drawn from, or whose mode it took), and the index of the candidate it chose."""

    candidates: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]
    chosen: tuple[int, ...]


@dataclass(frozen=True)
class TreeCycle:
    """One tree-verified cycle (`tree.py`): the tree the drafter's top-k grew, and the target's walk.

    Node 0 is the root (slot 0, the previous bonus token); every other node is a draft whose parent
    has a smaller number. `targets[i]` is the target's own token after node i's path (its argmax, or
    its sample): the walk follows it while it is a child, and the last walked node's is the bonus.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # -1 for the root
    depths: tuple[int, ...]
    probs: tuple[float, ...]  # the drafter's probability of each node's token at its slot (1.0 at the root)
    targets: tuple[int, ...]
    path: tuple[int, ...]  # the nodes walked, from the root: its drafts are the block's accepted drafts
    host_s: float  # host seconds spent growing the tree and walking it

    @property
    def bonus_id(self) -> int:
        return self.targets[self.path[-1]]

    def to_dict(self) -> dict:
        return _lists(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> TreeCycle:
        ints = ("tokens", "parents", "depths", "targets", "path")
        return cls(**{name: tuple(int(x) for x in data[name]) for name in ints},
                   probs=tuple(float(p) for p in data["probs"]), host_s=float(data["host_s"]))


@dataclass(frozen=True)
class CycleExplanation:
    """What one cycle saw and decided. Plain decoding has no drafter: mask_id is None, draft_topk
    and decision.slots are empty. path: the selector's walk when a DFlash2 drafter drafted, else None."""

    slot0_id: int
    mask_id: int | None
    positions: tuple[int, ...]  # slot 0's position, then one per draft slot
    injected: Injected
    draft_topk: tuple[TopK, ...]  # one per draft slot 1..B-1
    target_topk: tuple[TopK, ...]  # one per verified slot 0..B-1: row i scores the token after slot i
    decision: Decision
    cache: CacheLengths
    time: CycleTimes
    path: SelectorPath | None = None

    def to_dict(self) -> dict:
        """The trace's JSON form (the "explain" of a trace block); "path" only where a selector walked."""
        out = _lists(asdict(self))
        if out["path"] is None:
            del out["path"]  # traces of other drafters stay as they were
        return out

    @classmethod
    def from_dict(cls, data: dict) -> CycleExplanation:
        """Back from `to_dict`'s form, e.g. a block of a file `trace.validate_trace` accepted."""

        def topk(rows) -> tuple[TopK, ...]:
            return tuple(tuple((int(t), float(p)) for t, p in row) for row in rows)

        decision, injected = data["decision"], data["injected"]
        return cls(
            slot0_id=int(data["slot0_id"]),
            mask_id=None if data["mask_id"] is None else int(data["mask_id"]),
            positions=tuple(int(x) for x in data["positions"]),
            injected=Injected(int(injected["positions"]), tuple(int(x) for x in injected["target_layers"])),
            draft_topk=topk(data["draft_topk"]),
            target_topk=topk(data["target_topk"]),
            decision=Decision(decision["rule"], tuple(_pick(SlotVerdict, s) for s in decision["slots"]),
                              decision["resampled"]),
            cache=_pick(CacheLengths, data["cache"]),
            time=_pick(CycleTimes, data["time"]),
            path=None if data.get("path") is None else SelectorPath(
                tuple(tuple(int(t) for t in row) for row in data["path"]["candidates"]),
                tuple(tuple(float(p) for p in row) for row in data["path"]["probs"]),
                tuple(int(i) for i in data["path"]["chosen"]),
            ),
        )


def _pick(cls, data: dict):
    """`cls` from the keys of `data` that name its fields (a trace may carry more)."""
    return cls(**{f.name: data[f.name] for f in fields(cls)})


def _lists(value):
    """`value` with every tuple a list, as JSON reads it back."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


# Why a run ended; "running" marks a provisional summary of a run still in progress, "stopped" one
# its caller cut short (the engine itself never stops early).
StopReason = Literal["running", "stopped", "max_new_tokens", "stop_token"]


@dataclass(frozen=True)
class Prefill:
    prompt_len: int
    token_id: int  # the first new token, from the prompt's last position
    seconds: float


@dataclass(frozen=True)
class Block:
    index: int
    position: int  # position of slot 0 (the previous bonus token)
    draft_ids: tuple[int, ...]  # the B-1 proposed tokens; empty for plain decoding
    accepted: int  # draft tokens the target kept (the bonus excluded)
    bonus_id: int  # the target's own token after the accepted prefix
    committed_ids: tuple[int, ...]  # tokens this cycle adds to the output (cut at a stop or the limit)
    draft_s: float
    verify_s: float
    elapsed_s: float  # compute seconds since the run started (prefill included), at the end of this cycle
    # Drafter forward passes behind draft_ids (their time is draft_s): 1 for DFlash, one per draft
    # for the autoregressive drafter, 0 for prompt lookup and plain decoding.
    draft_passes: int = 0
    # Tokens the target verified: slot 0 and the first verify_len - 1 drafts. A block schedule
    # (`schedule.py`) may verify fewer drafts than draft_ids holds; None (traces from before the
    # schedule): all of them.
    verify_len: int | None = None
    # What the cycle saw and decided, when decoding ran with `explain=k`; else None.
    explain: CycleExplanation | None = field(default=None, repr=False, compare=False, hash=False)
    # The cycle's draft tree and the target's walk through it, when the run verified trees; then
    # draft_ids are the walked path's drafts (all accepted) and verify_len counts every node.
    tree: TreeCycle | None = field(default=None, repr=False)

    @property
    def acceptance_length(self) -> int:
        return self.accepted + 1

    @property
    def verified(self) -> int:
        """Drafts the target verified: the first `verified` of draft_ids."""
        return len(self.draft_ids) if self.verify_len is None else self.verify_len - 1


@dataclass(frozen=True)
class Summary:
    output_ids: tuple[int, ...]
    prompt_len: int
    block_size: int  # 1 for plain decoding
    stop_reason: StopReason
    prefill: Prefill
    blocks: tuple[Block, ...] = field(repr=False)
    total_s: float = 0.0  # compute seconds of the whole run, prefill included
    method: str = "plain"  # what drafted: plain, dflash, dflash2, fusion, ar or lookup (`models.drafter.method_name`)
    # "fixed": every cycle verified its whole draft; "auto": a block schedule chose each cycle's
    # verified length (`Block.verify_len`), block_size being the longest.
    block_schedule: str = "fixed"
    tree_budget: int = 0  # drafts per tree when the run verified trees (`tree.py`); 0: chains

    @property
    def acceptance_lengths(self) -> list[int]:
        return [b.acceptance_length for b in self.blocks]

    @property
    def tau(self) -> float:
        """Mean acceptance length per cycle, bonus included (1.0 for plain decoding)."""
        lengths = self.acceptance_lengths
        return sum(lengths) / len(lengths) if lengths else 0.0

    @property
    def acceptance_histogram(self) -> list[int]:
        """Number of cycles with acceptance length L, at index L (0 unused)."""
        counts = [0] * (self.block_size + 1)
        for length in self.acceptance_lengths:
            counts[length] += 1
        return counts

    @property
    def per_position_acceptance(self) -> list[float]:
        """Fraction of cycles whose draft slot k (1..B-1) was accepted."""
        cycles = len(self.blocks)
        return [
            sum(b.accepted >= k for b in self.blocks) / cycles if cycles else 0.0 for k in range(1, self.block_size)
        ]

    @property
    def mean_verify_len(self) -> float:
        """Mean tokens verified per cycle (block_size unless a schedule cut blocks)."""
        return sum(b.verified + 1 for b in self.blocks) / len(self.blocks) if self.blocks else 0.0

    @property
    def ttft_s(self) -> float:
        return self.prefill.seconds

    @property
    def draft_s(self) -> float:
        return sum(b.draft_s for b in self.blocks)

    @property
    def verify_s(self) -> float:
        return sum(b.verify_s for b in self.blocks)

    @property
    def draft_passes(self) -> int:
        return sum(b.draft_passes for b in self.blocks)

    @property
    def tokens_per_s(self) -> float:
        return len(self.output_ids) / self.total_s if self.total_s > 0 else 0.0

    def metrics(self) -> dict:
        return {
            "new_tokens": len(self.output_ids),
            "cycles": len(self.blocks),
            "tau": self.tau,
            "mean_verify_len": self.mean_verify_len,
            "acceptance_histogram": self.acceptance_histogram,
            "per_position_acceptance": self.per_position_acceptance,
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "stop_reason": self.stop_reason,
        }

    def to_trace(self) -> dict:
        """The JSON trace: generated ids, acceptance per cycle, and every block."""
        return {
            "output_ids": list(self.output_ids),
            "prompt_len": self.prompt_len,
            "block_size": self.block_size,
            "acceptance_lengths": self.acceptance_lengths,
            "method": self.method,
            "block_schedule": self.block_schedule,
            "prefill": asdict(self.prefill),
            "blocks": [_block_trace(b) for b in self.blocks],
            **({"tree_budget": self.tree_budget} if self.tree_budget else {}),
            **self.metrics(),
        }


def _block_trace(block: Block) -> dict:
    """One block as JSON; the "explain" key is present only when the run was explained."""
    out = {f: getattr(block, f) for f in BLOCK_FIELDS}
    out["draft_ids"], out["committed_ids"] = list(block.draft_ids), list(block.committed_ids)
    if block.explain is not None:
        out["explain"] = block.explain.to_dict()
    if block.tree is not None:
        out["tree"] = block.tree.to_dict()
    return out


BLOCK_FIELDS = [f.name for f in fields(Block) if f.name not in ("explain", "tree")]
