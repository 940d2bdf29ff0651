"""CUDA graphs for the draft and verify steps, their logic checked on CPU through a fake graph backend."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import replace

import pytest
import torch
import torch.utils._pytree as pytree
from tiny import build_drafter
from torch.utils._python_dispatch import TorchDispatchMode

import dflash_core.drafting
from dflash_core import DFlashDrafter, SamplingParams, Target, load_pair, run
from dflash_core.__main__ import main as cli_main
from dflash_core.bench.__main__ import main as bench_main
from dflash_core.diagnostics.oracle import OracleDrafter, expected_lengths
from dflash_core.diagnostics.syncs import SyncCounter
from dflash_core.errors import ConfigError
from dflash_core.models.drafter import DrafterCache, static_slots
from dflash_core.schedule import CostProfile
from dflash_core.speed import fallbacks
from dflash_core.speed.cuda_graphs import CudaGraphBackend, StepGraphs
from dflash_core.speed.fallbacks import FallbackWarning


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _address(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except NotImplementedError:  # oneDNN-packed weights (cpu_linear.py) have no storage to ask
        return id(t)


class _Reads(TorchDispatchMode):
    """The storages a step touches that it did not allocate itself: what a graph reads at fixed addresses."""

    def __init__(self):
        super().__init__()
        self.made, self.read = set(), set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.read.update(a for t in _tensors((args, kwargs)) if (a := _address(t)) not in self.made)
        out = func(*args, **kwargs)
        self.made.update(_address(t) for t in _tensors(out))
        return out


class FakeGraphs:
    """A CPU stand-in for `torch.cuda.CUDAGraph`, as strict as a real one where it can be.

    capture: two warm-ups and the capture itself, all on the static inputs (a step that is not
    idempotent shows), with host reads forbidden (a real capture fails on a sync); it keeps the
    step, the static inputs, the outputs and the tensors the capture read. replay: reruns the step
    on those static inputs ONLY, fails if it reads any tensor the capture did not (a real graph
    would read the old address), and copies the results into the captured outputs, the one place
    a caller may read them. Inputs not copied in, outputs read from elsewhere, a graph replayed for
    another shape, or a step that picks up a new tensor per call all give wrong tokens or errors.
    """

    def __init__(self):
        self.captured: list[tuple] = []  # input shapes of each capture, in order
        self.replays: Counter = Counter()  # by input shapes

    @staticmethod
    def _run(step, inputs):
        with SyncCounter(cuda_debug=False) as syncs, _Reads() as reads:
            outputs = step(*inputs)
            count = syncs.take()
        if count:
            raise RuntimeError(f"{count} host reads inside a graph step")
        return outputs, reads.read - {0}

    def capture(self, step, inputs, tag=None):
        for _ in range(3):
            outputs, read = self._run(step, inputs)
        shapes = tuple(tuple(x.shape) for x in inputs)
        self.captured.append(shapes)
        return (step, inputs, outputs, read, shapes), outputs

    def replay(self, handle):
        step, inputs, outputs, captured_reads, shapes = handle
        fresh, read = self._run(step, inputs)
        if read - captured_reads:
            raise RuntimeError(f"the step read {len(read - captured_reads)} tensors its capture did not")
        for out, new in zip(_tensors(outputs), _tensors(fresh)):
            out.copy_(new)
        self.replays[shapes] += 1


class NeverCapture:
    """Every capture fails: the same static steps, all eager (the reference for bitwise checks)."""

    def capture(self, step, inputs, tag=None):
        raise RuntimeError("not capturing")


@pytest.fixture
def fresh_notices(monkeypatch):
    monkeypatch.setattr(fallbacks, "NOTICES", [])


def graphed(target: Target, backend) -> Target:
    return Target(target.model, static_cache=True, cuda_graphs=True, graph_backend=backend)


SAMPLINGS = [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95, seed=7)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_graphs_decode_token_for_token(golden_pair, golden_expected, sampling, fresh_notices):
    plain, drafter = golden_pair
    fake = FakeGraphs()
    on, eager = graphed(plain, fake), graphed(plain, NeverCapture())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # NeverCapture's notice
        for prompt in golden_expected["prompts"][:2]:
            ids = prompt["prompt_ids"]
            for block_size in (8, 4, None):
                kwargs = dict(max_new_tokens=40, block_size=block_size, sampling=sampling)
                d = drafter if block_size else None
                off, graphs, same_steps = (run(t, ids, d, **kwargs) for t in (plain, on, eager))
                assert graphs.output_ids == off.output_ids
                # The graphed steps are the eager static steps, replayed: bitwise the same drafts.
                assert [b.draft_ids for b in graphs.blocks] == [b.draft_ids for b in same_steps.blocks]
                assert graphs.acceptance_lengths == same_steps.acceptance_lengths == off.acceptance_lengths
            if sampling.greedy:  # and DFlash with graphs is still plain decoding's output
                assert graphs.output_ids == run(plain, ids, None, max_new_tokens=40).output_ids
    feature_width = len(drafter.target_layer_ids) * plain.hidden_size
    # One graph per shape: verify of 8, 4 and 1 tokens; the draft step at 8 and 4 slots.
    assert sorted(fake.captured) == sorted([
        ((1, 8), (1, 8)), ((1, 4), (1, 4)), ((1, 1), (1, 1)),
        ((1,), (1, 8, feature_width), (1, 16)), ((1,), (1, 4, feature_width), (1, 8)),
    ])
    assert all(fake.replays[shapes] > 10 for shapes in fake.captured)


def test_the_block_schedule_under_graphs_is_the_eager_run(golden_pair, golden_expected):
    """Scheduled blocks change the verify's shape from cycle to cycle, and the drafter's padded
    context with it: each shape replays its own graph, and the run is the eager one token for token."""
    plain, drafter = golden_pair
    fake = FakeGraphs()
    on = graphed(plain, fake)
    # other_s given: learned from the clock, it would differ between the runs (a fake replay is slow).
    costs = CostProfile(tuple(1 + 0.4 * k for k in range(drafter.block_size)), other_s=0.2)
    paused = 0
    for prompt in golden_expected["prompts"]:
        ids = prompt["prompt_ids"]
        off, graphs = (run(t, ids, drafter, max_new_tokens=40, block_size="auto", costs=costs) for t in (plain, on))
        assert graphs.output_ids == off.output_ids == run(plain, ids, None, max_new_tokens=40).output_ids
        assert [b.draft_ids for b in graphs.blocks] == [b.draft_ids for b in off.blocks]
        assert graphs.acceptance_lengths == off.acceptance_lengths
        paused += sum(not b.draft_ids for b in off.blocks[:-1])
    # A paused cycle's verify replays the one-token graph, which holds the features the drafter has
    # not seen yet: the session must keep them past it.
    assert paused, "no paused cycle: the test would not exercise them"
    verify_shapes = {shapes[0][1] for shapes in fake.captured if len(shapes) == 2}
    assert len(verify_shapes) > 1, f"one verify length only ({verify_shapes}): the test would not change shapes"


def test_graphs_with_a_llama_target_and_draft_modes(tiny_pair, fresh_notices):
    target, drafter = tiny_pair
    on = graphed(target, FakeGraphs())
    for sampling in SAMPLINGS:
        for draft_mode in ("sample", "argmax"):
            kwargs = dict(max_new_tokens=30, sampling=sampling, draft_mode=draft_mode)
            a, b = run(target, [5, 6, 7], drafter, **kwargs), run(on, [5, 6, 7], drafter, **kwargs)
            assert b.output_ids == a.output_ids and b.acceptance_lengths == a.acceptance_lengths
    assert fallbacks.NOTICES == []
    # The explanation reads the replayed outputs within their cycle: bitwise what the same steps
    # give eagerly, and the same decisions and caches as without graphs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # NeverCapture's notice
        off, graphs, same_steps = (run(t, [5, 6, 7], drafter, max_new_tokens=12, explain=3)
                                   for t in (target, on, graphed(target, NeverCapture())))
    untimed = [[replace(b.explain, time=None) for b in s.blocks] for s in (graphs, same_steps)]
    assert untimed[0] == untimed[1]
    for a, b in zip(off.blocks, graphs.blocks):
        assert all(getattr(a.explain, k) == getattr(b.explain, k) for k in ("positions", "injected", "cache"))
        assert [(x.draft, x.target) for x in a.explain.decision.slots] == [
            (x.draft, x.target) for x in b.explain.decision.slots]


def test_graphs_with_sliding_window_and_draft_vocabulary_drafters(tmp_path, tiny_dirs, tiny_pair):
    """The static draft step's own mask keeps a sliding window, and draft vocabularies map back."""
    target_dir, _ = tiny_dirs
    target, _ = tiny_pair
    fake = FakeGraphs()
    on = graphed(target, fake)
    prompt = list(range(5, 45))
    for name, extra in (("narrow", {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4}),
                        ("vocab", {"draft_vocab": list(range(target.vocab_size - 2, 3, -5))})):
        drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / name, target_dir, seed=7, **extra))
        for sampling in SAMPLINGS:
            a, b = (run(t, prompt, drafter, max_new_tokens=24, sampling=sampling) for t in (target, on))
            assert b.output_ids == a.output_ids and [x.draft_ids for x in b.blocks] == [x.draft_ids for x in a.blocks]
    assert len(fake.captured) == 3 and sum(fake.replays.values()) > 20  # verify, and one draft graph each


def test_shapes_not_captured_run_eagerly(golden_pair):
    plain, drafter = golden_pair
    fake = FakeGraphs()
    on = graphed(plain, fake)
    b = drafter.block_size
    width = len(drafter.target_layer_ids) * plain.hidden_size
    verify, draft = ((1, b), (1, b)), ((1,), (1, b, width), (1, 2 * b))
    # The prefill (a prompt, last logits only) and the first draft step (the prompt as context)
    # have shapes of their own: they run eagerly, every later cycle replays.
    s = run(on, [1, 2, 3], drafter, max_new_tokens=30)
    assert fake.captured == [verify, draft]
    assert fake.replays == {verify: len(s.blocks), draft: len(s.blocks) - 1}
    # A prompt exactly one block long gives the first draft step the captured shape too.
    fake.replays.clear()
    s = run(on, list(range(1, b + 1)), drafter, max_new_tokens=30)
    assert fake.captured == [verify, draft] and fake.replays == {verify: len(s.blocks), draft: len(s.blocks)}
    # The graphs outlive a run; a longer one reallocates the caches, and the graphs with them.
    run(on, [1 + i % 100 for i in range(250)], drafter, max_new_tokens=12)
    assert len(fake.captured) == 4 and fake.captured[2:] == [verify, draft]


def test_the_oracle_drafter_under_graphs(golden_pair):
    """gpu_check times graphs with the oracle: its per-cycle proposal must reach the replayed step."""
    plain, drafter = golden_pair
    fake = FakeGraphs()
    on = graphed(plain, fake)
    n, schedule = 40, [1, 8, 3, 5, 2]
    plan = list(run(plain, [4, 5, 6], None, max_new_tokens=n + drafter.block_size).output_ids)
    s = run(on, [4, 5, 6], OracleDrafter(drafter, plan, schedule, plain.vocab_size), max_new_tokens=n)
    assert list(s.output_ids) == plan[:n] and s.acceptance_lengths == expected_lengths(schedule, 8, len(s.blocks))
    assert sum(fake.replays.values()) == 2 * len(s.blocks) - 1


def test_step_graphs_key_on_shapes():
    fake = FakeGraphs()
    graphs = StepGraphs(fake)
    weight = torch.arange(1.0, 5.0)

    def step(x):
        return (x * weight[: x.shape[-1]]).cumsum(-1)

    for n in (4, 2, 4, 2, 3):
        x = torch.randn(n)
        assert torch.equal(graphs("tag", step, x), step(x))
    assert fake.captured == [((4,),), ((2,),), ((3,),)] and fake.replays == {((4,),): 2, ((2,),): 2, ((3,),): 1}


def test_static_slots_keep_padding_off_the_block():
    # 3 new context rows after 10 committed, padded to 5 rows, then a block of 4: the padding goes
    # after the block, every slot once (CUDA's index_copy_ picks any one writer of a shared slot).
    assert static_slots(10, 3, 5, 4, "cpu").tolist() == [10, 11, 12, 17, 18, 13, 14, 15, 16]
    assert static_slots(0, 6, 6, 4, "cpu").tolist() == list(range(10))  # the prompt: no padding


def test_a_failed_capture_warns_once_and_runs_eagerly(golden_pair, fresh_notices):
    plain, drafter = golden_pair
    expected = run(plain, [1, 2, 3], drafter, max_new_tokens=24)
    for backend, error in ((NeverCapture(), "RuntimeError: not capturing"), (None, "need CUDA tensors, not cpu")):
        on = graphed(plain, backend)  # None: the real torch.cuda.CUDAGraph backend, on CPU tensors
        with pytest.warns(FallbackWarning) as caught:
            got = run(on, [1, 2, 3], drafter, max_new_tokens=24)
            run(on, [1, 2, 3], None, max_new_tokens=8)
        assert got.output_ids == expected.output_ids and got.acceptance_lengths == expected.acceptance_lengths
        notices = [str(w.message) for w in caught if w.category is FallbackWarning]
        assert len(notices) == 1 and error in notices[0]
        assert all(entry is None for entry in on.graphs.graphs.values())


def test_graphs_without_the_static_cache_are_a_clear_error(golden_dir, golden_pair, capsys):
    plain, _ = golden_pair
    with pytest.raises(ConfigError, match=r"CUDA graphs need the static KV cache \(static_cache=True, --static-cache"):
        Target(plain.model, cuda_graphs=True)
    with pytest.raises(ConfigError, match="static KV cache"):
        load_pair(golden_dir / "target", cuda_graphs=True)
    # Every command checks the shared options alike, before a model loads (loading/cli.py).
    with pytest.raises(SystemExit):
        cli_main(["generate", "--target", str(golden_dir / "target"), "--plain", "--prompt-ids", "1,2", "--cuda-graphs"])
    assert "--cuda-graphs needs --static-cache" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--cuda-graphs"])
    assert "--cuda-graphs needs --static-cache" in capsys.readouterr().err


def test_graphs_off_never_touch_the_graph_machinery(golden_pair, monkeypatch):
    plain, drafter = golden_pair

    def untouchable(*args, **kwargs):
        raise AssertionError("graph machinery used with graphs off")

    for name in ("__init__", "__call__", "clear"):
        monkeypatch.setattr(StepGraphs, name, untouchable)
    monkeypatch.setattr(CudaGraphBackend, "capture", untouchable)
    monkeypatch.setattr(dflash_core.drafting, "static_slots", untouchable)  # nor the drafter's static path
    monkeypatch.setattr(DrafterCache, "write_at", untouchable)
    for static_cache in (False, True):
        target = Target(plain.model, static_cache=static_cache)
        assert target.graphs is None
        run(target, [1, 2, 3], drafter, max_new_tokens=20)
        run(target, [1, 2, 3], None, max_new_tokens=260 if static_cache else 8)  # a static cache that grows, too


def test_cuda_graphs_is_a_switch_of_the_loaders(golden_dir):
    target = Target.from_pretrained(golden_dir / "target", static_cache=True, cuda_graphs=True)
    assert isinstance(target.graphs, StepGraphs) and isinstance(target.graphs.backend, CudaGraphBackend)
    pair = load_pair(golden_dir / "target", golden_dir / "drafter", static_cache=True, cuda_graphs=True)
    assert pair.target.graphs is not None
    assert load_pair(golden_dir / "target", static_cache=True).target.graphs is None


def test_a_tree_cycle_hands_the_drafter_a_whole_block_so_its_draft_step_replays(golden_pair):
    """A tree cycle keeps only its walked rows, fewer than a block when a draft is rejected; it pads
    them to the block as a chain's verify does, so every draft step after the first replays its
    graph (else each such cycle would draft eagerly), and the run is the eager one token for token."""
    plain, drafter = golden_pair
    fake = FakeGraphs()
    on = graphed(plain, fake)
    b = drafter.block_size
    width = len(drafter.target_layer_ids) * plain.hidden_size
    draft = ((1,), (1, b, width), (1, 2 * b))
    prompt = list(range(1, b + 1))  # one block long: the first draft step has the captured shape too
    s = run(on, prompt, drafter, max_new_tokens=30, tree_budget=4)
    assert any(block.accepted < b - 1 for block in s.blocks)  # walks shorter than the block were padded
    assert fake.replays[draft] == len(s.blocks)
    eager = run(Target(plain.model, static_cache=True), prompt, drafter, max_new_tokens=30, tree_budget=4)
    assert s.output_ids == eager.output_ids
