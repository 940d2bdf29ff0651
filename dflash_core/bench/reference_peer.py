"""z-lab's reference package as a benchmark peer: `dflash==0.1.0`'s `dflash.model.dflash_generate` on the
same prompt ids, in the package's own venv.

`dflash[local]` pins torch 2.13.0 and transformers 5.15.0, so it lives in a separate venv (`bash
scripts/setup.sh --reference` makes `.venv-reference`; `$DFLASH_REFERENCE_VENV` names another). This
module never imports the package: it runs `scripts/reference_generate.py` there in a subprocess
(`venv_peer.py`), one process per method (plain decoding is the package's loop at block size 1), and
reads back its JSON: token ids, seconds, accepted lengths and drafts per cycle. The package drafts
over the target's whole LM head (a drafter's draft vocabulary is ignored).
"""

from __future__ import annotations

from pathlib import Path

from .venv_peer import ROOT, PeerUnavailable, PeerVenv, clean_env

GENERATE_SCRIPT = ROOT / "scripts" / "reference_generate.py"
TIMEOUT_S = 1800


class ReferenceUnavailable(PeerUnavailable):
    """No venv with the reference package to run the peer in, or the package failed in it."""


REFERENCE = PeerVenv("dflash 0.1.0", "DFLASH_REFERENCE_VENV", ".venv-reference", "--reference", ReferenceUnavailable)


def reference_generate(target_dir, prompts: list[list[int]], drafter, *, block_size: int | None = None,
                       max_new_tokens: int = 128, dtype: str = "float32", threads: int | None = None,
                       stop_ids: list[int] | None = None, device: str = "cpu",
                       workdir: str | Path | None = None) -> dict:
    """The reference package's greedy decoding of `prompts` (token ids, already through the chat
    template), one at a time, with `drafter` at `block_size` (1: plain decoding; None: the drafter's).

    Returns `scripts/reference_generate.py`'s JSON: "outputs" (per prompt: token_ids, seconds,
    acceptance_lengths, draft_blocks), "summary" (tok_per_s, tau), "load_s", and the versions of
    "dflash", "torch" and "transformers".
    """
    args = ["--target", str(target_dir), "--drafter", str(drafter), "--max-tokens", str(max_new_tokens),
            "--dtype", dtype, "--device", device]
    if block_size is not None:
        args += ["--block-size", str(block_size)]
    if threads:
        args += ["--threads", str(threads)]
    if stop_ids:
        args += ["--stop-ids", ",".join(str(t) for t in stop_ids)]
    env = clean_env()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return REFERENCE.run(GENERATE_SCRIPT, prompts, args, env, TIMEOUT_S, workdir)
