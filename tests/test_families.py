"""Every supported model family decodes exactly: the target's cache goes back to the accepted prefix.

For each family (`families.py`) a tiny random target, loaded from disk as a checkpoint would be,
with a random DFlash drafter. The oracle drafter (`oracle.py`) rejects every slot of the block in
turn, so each kind of layer state is rolled back from every depth; the prompts overflow the
sliding windows, and hybrid targets keep a slow-decaying recurrent state, so a rollback that leaves
a rejected token behind changes the output. Architectures that cannot roll back fail at load.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from families import FAMILIES, WINDOW, build_family_target
from test_sampling import CHI_SQUARE_RUNS, chi_square_ok, exact_joint
from tiny import build_drafter
from transformers import AutoModelForCausalLM

from dflash_core import DFlashDrafter, SamplingParams, Target, run
from dflash_core.decoding import generate
from dflash_core.diagnostics.oracle import OracleDrafter, expected_lengths
from dflash_core.diagnostics.syncs import SyncCounter
from dflash_core.errors import ConfigError, DFlashError
from dflash_core.events import Block
from dflash_core.models.target_cache import FULL, LINEAR, NONE, SLIDING

BLOCK = 8
SCHEDULE = list(range(1, BLOCK + 1))  # cycle c rejects slot c (1-based), then one block is all accepted
PROMPTS = {"short": [7, 3], "long": list(range(5, 5 + 2 * WINDOW + 3))}
NEW_TOKENS = 3 * BLOCK + 5  # three rounds of the schedule: past a sliding window again and again

# What each family's cache keeps per layer (the rollback each one needs).
KINDS = {
    "llama": [FULL] * 4,
    "qwen3": [FULL] * 4,
    "qwen3_moe": [FULL] * 4,
    "qwen3_5": [LINEAR, LINEAR, LINEAR, FULL],
    "qwen3_5_moe": [LINEAR, LINEAR, LINEAR, FULL],
    "qwen3_next": [LINEAR, LINEAR, LINEAR, FULL],
    "gpt_oss": [SLIDING, FULL] * 2,
    "gemma4": [SLIDING, FULL] * 2,  # + two KV-sharing layers, which cache nothing (from transformers 5.24 on)
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, target, drafter) for one family, both loaded with `from_pretrained`."""
    name = request.param
    root = tmp_path_factory.mktemp(name)
    target_dir = build_family_target(root / "target", name)
    drafter_dir = build_drafter(root / "drafter", target_dir, block_size=BLOCK)
    return name, Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)


def test_each_layer_gets_its_own_rollback(family):
    name, target, _ = family
    assert [kind for kind in target.kv.kinds if kind != NONE] == KINDS[name]
    if name == "gpt_oss":
        # gpt-oss has no SDPA path (its sinks are an extra softmax column): it loads with eager attention.
        assert target.model.config._attn_implementation == "eager"


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_output_equals_plain_decoding_when_every_slot_is_rejected(family, prompt):
    _, target, drafter = family
    prompt_ids = PROMPTS[prompt]
    plan = list(run(target, prompt_ids, None, max_new_tokens=NEW_TOKENS + BLOCK).output_ids)
    oracle = OracleDrafter(drafter, plan, SCHEDULE, target.vocab_size)
    out = run(target, prompt_ids, oracle, max_new_tokens=NEW_TOKENS)
    assert list(out.output_ids) == plan[:NEW_TOKENS]
    assert out.acceptance_lengths == expected_lengths(SCHEDULE, BLOCK, len(out.blocks))


def test_verify_logits_after_each_rollback_equal_one_token_steps(family):
    """Stricter than the output: every kept slot's logits equal plain decoding's at that position."""
    _, target, _ = family
    prompt = PROMPTS["long"]
    seq = prompt + list(run(target, prompt, None, max_new_tokens=NEW_TOKENS + BLOCK).output_ids)
    target.reset()
    target.tap_layers(())
    plain = [target.forward(torch.tensor([prompt]), last_logits_only=True)[0][-1]]
    plain += [target.forward(torch.tensor([[t]]))[0][-1] for t in seq[len(prompt) : -1]]
    target.reset()
    target.forward(torch.tensor([prompt]), last_logits_only=True)
    start, cycle = len(prompt), 0
    while start + BLOCK < len(seq):
        keep = SCHEDULE[cycle % len(SCHEDULE)]
        block = seq[start : start + BLOCK]
        if keep < BLOCK:
            block[keep] = (block[keep] + 1) % target.vocab_size  # slots from `keep` on see a wrong token
        logits, _ = target.forward(torch.tensor([block]))
        for slot in range(keep):
            torch.testing.assert_close(logits[slot], plain[start + slot - len(prompt) + 1], rtol=0, atol=1e-4)
        start, cycle = start + keep, cycle + 1
        target.crop(start)


def test_seeded_sampling_repeats(family):
    _, target, drafter = family
    for draft_mode in ("sample", "argmax"):
        kwargs = dict(max_new_tokens=NEW_TOKENS, sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=11),
                      draft_mode=draft_mode)
        a = run(target, PROMPTS["long"], drafter, **kwargs)
        b = run(target, PROMPTS["long"], drafter, **kwargs)
        assert a.output_ids == b.output_ids and a.acceptance_lengths == b.acceptance_lengths
        assert len(a.output_ids) == NEW_TOKENS


def test_the_rollback_adds_no_host_sync(family):
    """Per-position states and deferred crops are host-known bookkeeping: still one read per cycle."""
    _, target, drafter = family
    per_cycle = []
    with SyncCounter(cuda_debug=False) as counter:
        for event in generate(target, PROMPTS["long"], drafter, max_new_tokens=NEW_TOKENS,
                              sampling=SamplingParams(temperature=0.9, seed=2)):
            taken = counter.take()  # the prefill's first token is read once, outside the cycles
            if isinstance(event, Block):
                per_cycle.append(taken)
    assert len(per_cycle) >= 4 and per_cycle == [1] * len(per_cycle)


@pytest.mark.slow
def test_hybrid_sampling_matches_exact_target_distribution(tmp_path):
    """The chi-square test of test_sampling.py on a 4-token Qwen3.5 target (gated delta-net layers).

    The linear layers dominate its logits, so a recurrent state left unrestored after a rejection
    moves tokens across the top-k boundary: without the restore, 24 of the 800 runs emit a token
    the target can never emit, and the test fails.
    """
    target_dir = build_family_target(tmp_path / "target", "qwen3_5", vocab_size=4, logit_scale=3.0, seed=3,
                                     linear_gain=30.0)
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "drafter", target_dir, num_layers=1,
                                                          block_size=4, seed=4))
    prompt, length = [1, 2, 0], 3
    exact = exact_joint(target, prompt, length, SamplingParams(temperature=1.3, top_k=3)).flatten()
    counts, accepted, rolled_back = torch.zeros_like(exact), 0, 0
    for seed in range(CHI_SQUARE_RUNS):
        out = run(target, prompt, drafter, max_new_tokens=length, block_size=4,
                  sampling=SamplingParams(1.3, top_k=3, seed=seed))
        a, b, c = out.output_ids
        counts[a * 16 + b * 4 + c] += 1
        accepted += sum(blk.accepted for blk in out.blocks)
        rolled_back += sum(blk.accepted < 3 for blk in out.blocks)
    # Both partial acceptance and rollback must be common, or the test would not exercise them.
    assert accepted > CHI_SQUARE_RUNS // 5 and rolled_back > CHI_SQUARE_RUNS // 5
    assert chi_square_ok(counts, exact)


def test_an_architecture_that_cannot_roll_back_fails_at_load_naming_it(tmp_path):
    # LFM2's short-convolution layers are none of the kinds target_cache.py knows how to roll back.
    config = transformers.Lfm2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                     layer_types=["conv", "full_attention"])
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    message = r"Lfm2ForCausalLM \(lfm2\) is not supported: layer 0 \(conv\) .*cannot roll back"
    with pytest.raises(DFlashError, match=message):
        Target.from_pretrained(tmp_path)


def test_the_static_cache_refuses_layers_it_cannot_roll_back(family):
    name, target, _ = family
    if set(KINDS[name]) == {FULL}:
        assert Target(target.model, static_cache=True).kv.static
        return
    with pytest.raises(ConfigError, match=r"static KV cache needs full attention in every layer.*dynamic cache"):
        Target(target.model, static_cache=True)


def test_a_transformers_without_past_recording_is_named(family, monkeypatch):
    name, target, _ = family
    if SLIDING not in KINDS[name]:
        pytest.skip("full-attention and gated delta-net layers are checked elsewhere")
    monkeypatch.delattr(transformers.cache_utils.DynamicSlidingWindowLayer, "activate_past_recording")
    with pytest.raises(ConfigError, match=rf"needs transformers' past-state recording .*{transformers.__version__}"):
        Target(target.model)


def test_a_crop_before_the_last_forward_is_refused_where_it_cannot_be_exact(family):
    name, target, _ = family
    target.reset()
    target.forward(torch.tensor([PROMPTS["long"]]), last_logits_only=True)
    start = len(PROMPTS["long"])
    target.forward(torch.tensor([[1, 2, 3]]))
    target.forward(torch.tensor([[4, 5, 6]]))
    target.crop(start + 3)  # back to the start of the last forward: always exact
    if set(KINDS[name]) <= {FULL, NONE}:
        target.crop(start)  # full attention can go back anywhere
    else:
        with pytest.raises(ValueError, match=rf"go back only to the start of the last forward.*position {start + 3}"):
            target.crop(start)
    with pytest.raises(ValueError, match="it holds"):
        target.crop(start + 4)


def test_the_hybrid_rollback_follows_the_installed_transformers(family):
    """From 5.25 transformers keeps the recurrent states (and the rules stay unwrapped); before, the engine does."""
    from packaging.version import Version

    name, target, _ = family
    if LINEAR not in KINDS[name]:
        pytest.skip("no gated delta-net layers")
    library = Version(transformers.__version__).release >= (5, 25)
    assert target.kv.library_states == library
    assert (target.kv.recurrent is None) == library
