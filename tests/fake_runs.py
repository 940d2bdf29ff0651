"""Hand-made decoding runs: the event streams `dflash_core.generate` yields, with set timings and no
model, for tests of what consumes them (the app's race, pacing and controls)."""

from __future__ import annotations

from dflash_core import Block, Prefill, Summary


def run_events(prefill_s, step_s, tokens_per_block, n_blocks, block_size):
    """The events of a run of `n_blocks` cycles of `step_s` seconds, each committing `tokens_per_block`
    tokens, after a prefill of `prefill_s` seconds: what `generate` yields, without a model."""
    def gen():
        yield Prefill(3, 7, prefill_s)
        out = [7]
        blocks = []
        for i in range(n_blocks):
            ids = tuple(range(tokens_per_block))
            b = Block(
                i,
                3 + len(out) - 1,
                tuple(range(block_size - 1)),
                tokens_per_block - 1,
                0,
                ids,
                step_s / 2,
                step_s / 2,
                prefill_s + (i + 1) * step_s,  # the engine's compute clock
            )
            out.extend(ids)
            blocks.append(b)
            yield b
        total = prefill_s + n_blocks * step_s
        yield Summary(tuple(out), 3, block_size, "max_new_tokens", Prefill(3, 7, prefill_s), tuple(blocks), total)

    return gen()
