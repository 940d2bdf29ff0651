"""How far two broken acceptance rules move DFlash's output distribution on the chi-square test's pair.

`tests/test_sampling.py` checks sampled DFlash output against the target's enumerated distribution
with a chi-square test; this measures the effect size (Cohen's w) that test must detect, by running
the same tiny pair with the rejection rule replaced by a broken one, so the number of runs can be
chosen for a stated power. Prints one line per broken rule.

    python dev/scripts/chi_square_power.py --runs 3000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from test_sampling import exact_joint  # noqa: E402
from tiny import build_drafter, build_target  # noqa: E402

from dflash_core import DFlashDrafter, SamplingParams, Target, run, verify  # noqa: E402
from dflash_core.sampling import sample  # noqa: E402


def resample_from_p(draft_ids, draft_probs, target_probs, generator):
    """Rejection sampling whose rejected slot is redrawn from p instead of the residual."""
    n = draft_ids.shape[0]
    rows = torch.arange(n)
    keep = torch.rand(n, generator=generator) * draft_probs[rows, draft_ids] < target_probs[rows, draft_ids]
    accepted = int(torch.cumprod(keep, 0).sum())
    return accepted, int(sample(target_probs[accepted : accepted + 1], generator))


def keep_every_draft(draft_ids, draft_probs, target_probs, generator):
    n = draft_ids.shape[0]
    return n, int(sample(target_probs[n : n + 1], generator))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    # The same pair as tests/test_sampling.py's tiny_vocab_pair(None).
    target_dir = build_target(root / "target", vocab_size=4, logit_scale=1.0, hidden=16, num_layers=2, seed=3)
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(build_drafter(root / "drafter", target_dir, num_layers=1, block_size=4, seed=4))
    prompt, params = [1, 2, 0], SamplingParams(temperature=1.3, top_k=3)
    exact = exact_joint(target, prompt, 3, params).flatten()
    keep = exact > 0
    for rule in (resample_from_p, keep_every_draft):
        verify.rejection_accept = rule
        counts = torch.zeros_like(exact)
        for seed in range(args.runs):
            out = run(target, prompt, drafter, max_new_tokens=3, block_size=4,
                      sampling=SamplingParams(1.3, top_k=3, seed=seed), draft_mode="sample")
            a, b, c = out.output_ids
            counts[a * 16 + b * 4 + c] += 1
        w = (((counts[keep] / args.runs - exact[keep]) ** 2) / exact[keep]).sum().sqrt().item()
        noise = (int(keep.sum()) - 1) ** 0.5 / args.runs**0.5
        print(f"{rule.__name__}: w = {w:.2f} over {args.runs} runs (sampling noise alone gives about {noise:.2f})")


if __name__ == "__main__":
    main()
