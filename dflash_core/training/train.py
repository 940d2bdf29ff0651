"""Training a DFlash drafter for any target the engine supports (docs/design.md §5): the CLI and the loop.

The data are prompts with the target's own greedy responses, as written by `dflash_core.training.datagen`;
what one step computes (anchors, block mask, loss, held-out tau) is `dflash_core.training.objective`. This
module splits the data, schedules and clips, evaluates, checkpoints and resumes, and writes the
result in the released format (`config.json` + `model.safetensors`), loadable by
`DFlashDrafter.from_pretrained`.

Single process (CPU or one GPU), e.g. a first drafter for the default target, its layers copied
from the target's top layers::

    python -m dflash_core.training.train --target default:smollm2 \\
        --data assets/data/smollm2-135m-instruct --out runs/drafter-v1 \\
        --init-from-target --layers 3 --block-size 8 --draft-vocab 8192 \\
        --anchors-per-seq 64 --max-len 512 --grad-accum 4 --lr 6e-4 --warmup 0.03 \\
        --heldout-frac 0.03 --eval-every 100 --eval-seqs 48 --patience 8 --save-every 50 \\
        --feature-cache-gb 10 --time-budget 85 --threads 2

Later versions warm-start from the previous one (`--init-from`, optionally `--layers N` to grow it
or `--target-layer-ids` to add target layers it reads,
`--shards START:` for the data it has not seen, `--soft-labels 8`, `--text-data DIR` for text the target
did not write, labelled by its own greedy tokens: `text_data`); the shipped drafter's model
card (`assets/drafters/smollm2-135m-instruct-dflash/README.md`) has the exact chain of commands.

`--time-budget` is training time (evaluations excluded) and the cosine schedule follows it, so a
budgeted run always finishes its decay. `--amp auto` picks bf16 autocast where the hardware runs
it natively (CUDA, AMX or AVX512-BF16 CPUs) and fp32 elsewhere. The frozen target's forward is a
large share of each step on a CPU, hence many anchors per sequence and the in-memory feature
cache; `--draft-vocab N` cuts the LM head, the rest of the cost, to the N most frequent tokens.

Several GPUs (`--strategy ddp`, or `fsdp`: FSDP2 `fully_shard` on each drafter layer, the frozen target
replicated): a step takes `--grad-accum` sequences on each rank, consecutive in the epoch's global
order, and each sequence's anchors come from its place in that order, so N ranks compute what one
process with N times the accumulation computes (tested with two CPU processes over gloo). Rank 0
logs and saves; under FSDP every rank runs the evaluation and the saves, which gather the weights::

    torchrun --nproc_per_node 8 -m dflash_core.training.train --target Qwen/Qwen3-8B --data DATA --out OUT ...

`python -m dflash_core.training run CONFIG` runs this from a config file (`config.py`).
`--slot-weighting dpace` weighs the block's slots by D-PACE (`objective.dpace_weights`) instead of
the fixed decay.

`--drafter-kind ar` trains the autoregressive drafter with the same KV injection instead (the same
layers, causal inside the block, one token per pass at inference; `objective.py`), on the same data
and loop; a warm start keeps the kind of the drafter it starts from unless this flag names one.
`--context-fusion input` trains the input-fusion ablation of DFlash's KV injection (the same weights;
the target's features enter once, as rows of the drafter's sequence: `drafter.py`, `objective.py`),
from the same initialisations (`--init-from-target`, or `--init-from` a DFlash drafter).

`--dflash2` trains a DFlash2 drafter (docs/design.md §2, "DFlash2"): with `--init-from` a first-release
DFlash drafter, that drafter with a block convolution around each sublayer and a path selector added,
drafting at first exactly what it drafted (`drafter_init.to_dflash2`); the block loss goes through the
convolutions and `--selector-weight` weighs the selector's own loss (`objective.py`). A DFlash2 warm
start (`--init-from` a DFlash2 drafter) continues as one without the flag. E.g. the offline pair's
drafter, continued as DFlash2 (its selector sized to the pair: `to_dflash2` gives the counts)::

    python -m dflash_core.training.train --target default:smollm2 --data assets/data/smollm2-135m-instruct \
        --shards 132: --out runs/dflash2 --init-from assets/drafters/smollm2-135m-instruct-dflash --dflash2 \
        --selector-rank 32 --selector-top-k 16 --time-budget 30 --threads 1

`--resume` continues from `OUT/checkpoint/` (drafter, optimizer, schedule, step, data position,
RNG states). `OUT/train_log.jsonl` gets one JSON line per logged step and per evaluation (the first
at step 0 scores the starting drafter, so a warm start never ships worse than it began).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..errors import ConfigError, DFlashError
from ..loading.cli import add_target_arg, add_threads_arg, apply_args
from ..loading.default_target import resolve_target
from ..loading.pair import has_fast_bf16, stop_ids_of
from ..models.config import default_target_layer_ids, parse_drafter_config
from ..models.drafter import DFlashDrafter
from ..models.target import Target
from .data import frequent_tokens, heldout, load_sequences, shard_range
from .drafter_init import (
    add_feature_layers,
    build_drafter_config,
    grow_drafter,
    init_from_target,
    pick_mask_token_id,
    to_dflash2,
)
from .objective import DPACE_ALPHA, DrafterTrainer, default_gamma, evaluate, is_every_anchor, sample_anchors

CHECKPOINT_DIR = "checkpoint"
LOG_FILE = "train_log.jsonl"


# ------------------------------------------------------------------------------------ loop


def lr_at(progress: float, warmup: float, base_lr: float, min_ratio: float = 0.0) -> float:
    """Linear warmup then cosine decay, on training progress in [0, 1]."""
    if progress < warmup:
        return base_lr * max(progress / warmup, 1e-3)
    t = min(1.0, (progress - warmup) / max(1e-9, 1 - warmup))
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def anchor_generator(seed: int, epoch: int, position: int) -> torch.Generator:
    """The random source of the anchors of the sequence at `position` of epoch `epoch`'s order.

    Tied to the sequence's place in the global order, not to a stream: any number of ranks, and a
    resumed run, draw the same anchors for it as one uninterrupted process does.
    """
    return torch.Generator().manual_seed(hash((seed, epoch, position)) & (2**63 - 1))


def choose_amp(name: str, device: torch.device):
    if name == "auto":
        # bf16 autocast only where matmuls run it natively; emulated bf16 is slower than fp32.
        if has_fast_bf16(device):
            return torch.bfloat16
        return None
    return {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dflash_core.training.train", description=__doc__.split("\n\n")[0])
    add_target_arg(p, default=None)
    p.add_argument("--data", required=True, help="directory of datagen shards")
    p.add_argument("--shards", type=shard_range, default=None, metavar="START:STOP[:STEP][,...]",
                   help="use only these shards, by position in name order (e.g. 40: for a warm "
                        "drafter that has seen the first 40; 101:,84:101:4 adds every 4th of 84-100 "
                        "to replay what it learnt there)")
    p.add_argument("--text-data", default=None, metavar="DIR",
                   help="also train on these shards of text the target did not write (`text_data`), labelled by "
                        "the target's own greedy tokens in the forward that gives the features; never evaluated on")
    p.add_argument("--text-shards", type=shard_range, default=None, metavar="START:STOP[:STEP][,...]",
                   help="use only these shards of --text-data")
    p.add_argument("--out", required=True, help="output dir: released-format drafter + checkpoint/ + train_log.jsonl")
    p.add_argument("--layers", type=int, default=None,
                   help="drafter layers (default 3; with --init-from: grow the warm drafter to this many)")
    p.add_argument("--block-size", type=int, default=None, help="default 16 (with --init-from: the warm drafter's)")
    p.add_argument("--gamma", type=float, default=None, help="loss decay (default by block size, docs/design.md §5)")
    p.add_argument("--slot-weighting", choices=["decay", "dpace"], default="decay",
                   help="decay: slot k weighs exp(-(k-1)/gamma); dpace: D-PACE's weights from the drafter's own "
                        "confidence (objective.dpace_weights)")
    p.add_argument("--dpace-alpha", type=float, default=DPACE_ALPHA, help="D-PACE's confidence smoothing, in (0, 1]")
    p.add_argument("--anchors-per-seq", type=int, default=32)
    p.add_argument("--walk-weight", type=float, default=1.0,
                   help="loss weight of the blocks greedy decoding would run, against 1 for the other anchors; "
                        "applies to sequences whose every response position is an anchor")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--epochs", type=float, default=6)
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps (overrides --epochs; the schedule spans it)")
    p.add_argument("--time-budget", type=float, default=None, help="minutes of training; the cosine schedule follows elapsed time")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--min-lr-ratio", type=float, default=0.0)
    p.add_argument("--warmup", type=float, default=0.04)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--batch-tokens", type=int, default=None, help="block tokens per optimizer step (sets --grad-accum)")
    p.add_argument("--grad-accum", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="propose only the N most frequent response tokens (0: the whole vocabulary)")
    p.add_argument("--soft-labels", type=int, default=0, metavar="K",
                   help="also learn the target's top-K next-token distribution (0: greedy labels only)")
    p.add_argument("--soft-weight", type=float, default=0.5,
                   help="weight of the soft labels against the greedy one-hot label (with --soft-labels)")
    p.add_argument("--drafter-kind", choices=["dflash", "ar"], default=None,
                   help="dflash: the block-diffusion drafter (default for a new drafter); ar: the autoregressive "
                        "drafter with the same KV injection (default with --init-from: the warm drafter's kind)")
    p.add_argument("--dflash2", action="store_true",
                   help="train a DFlash2 drafter: a first-release one (e.g. --init-from) with block convolutions and a "
                        "path selector added; it drafts over the whole vocabulary")
    p.add_argument("--conv-kernel-size", type=int, default=2, help="DFlash2 convolution taps (released: 2)")
    p.add_argument("--conv-group-size", type=int, default=16,
                   help="DFlash2 channels per convolution group (released: 16)")
    p.add_argument("--selector-rank", type=int, default=32,
                   help="DFlash2 selector codebook rank (released: 256; 32 keeps the selector's 2 x vocab x rank "
                        "weights at 3.1M for a 49k vocabulary)")
    p.add_argument("--selector-top-k", type=int, default=16, help="DFlash2 candidates per slot (released: 16)")
    p.add_argument("--selector-weight", type=float, default=1.0,
                   help="weight of the DFlash2 selector's loss against the block loss")
    p.add_argument("--context-fusion", choices=["kv", "input"], default=None,
                   help="where the target's features enter the drafter: kv, every layer's keys and values "
                        "(DFlash; default for a new drafter); input, once at the input as rows of its sequence "
                        "(the ablation; default with --init-from: the warm drafter's)")
    p.add_argument("--init-from-target", action="store_true")
    p.add_argument("--init-from", default=None, help="warm start from a released-format drafter directory")
    p.add_argument("--target-layer-ids", default=None,
                   help="comma-separated 0-based target layers the drafter reads; with --init-from, a superset of its own")
    p.add_argument("--heldout-frac", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=100, help="optimizer steps between evaluations")
    p.add_argument("--eval-seqs", type=int, default=64, help="held-out sequences per evaluation, evenly spaced over the held-out split")
    p.add_argument("--patience", type=int, default=5,
                   help="evaluations without improvement before stopping, counted from the schedule's midpoint")
    p.add_argument("--save-every", type=int, default=100, help="optimizer steps between checkpoints")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--amp", default="auto", choices=["auto", "none", "bf16", "fp16"], help="autocast dtype (auto: bf16 on CUDA and AMX/AVX512-BF16 CPUs, else none = fp32)")
    p.add_argument("--feature-cache-gb", type=float, default=4.0,
                   help="keep target features of up to this many GB of sequences in memory across epochs (0: off)")
    p.add_argument("--target-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default=None)
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp",
                   help="under torchrun: ddp replicates the drafter on every rank; fsdp shards its layers (FSDP2 "
                        "fully_shard). The frozen target is replicated either way")
    add_threads_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    args = apply_args(p, p.parse_args(argv))
    if args.soft_labels and not 0 < args.soft_weight <= 1:
        p.error(f"--soft-weight must be in (0, 1], got {args.soft_weight}")
    if not args.walk_weight > 0:
        p.error(f"--walk-weight must be > 0, got {args.walk_weight}")
    if args.selector_weight < 0:
        p.error(f"--selector-weight must be >= 0, got {args.selector_weight}")
    if args.dflash2 and args.drafter_kind == "ar":
        p.error("--dflash2 trains a block-diffusion drafter; it does not go with --drafter-kind ar")
    if not 0 < args.dpace_alpha <= 1:
        p.error(f"--dpace-alpha must be in (0, 1], got {args.dpace_alpha}")
    return args


def make_drafter(args, target: Target, seqs, train, calibration, resume_state, ckpt_dir: Path, log) -> DFlashDrafter:
    """The drafter to train (on CPU): resumed from the checkpoint, warm-started from `--init-from`
    (grown to `--layers`), or new, its layers random or copied from the target's top layers."""
    layer_ids = [int(x) for x in args.target_layer_ids.split(",")] if args.target_layer_ids else None
    if resume_state is not None:
        config = parse_drafter_config(json.loads((ckpt_dir / "config.json").read_text()))
        if args.drafter_kind and (args.drafter_kind == "ar") != bool(config.autoregressive):
            raise ConfigError(f"--drafter-kind {args.drafter_kind} does not match the checkpoint in {ckpt_dir}, "
                              f"a {config.architecture}")
        if args.context_fusion and args.context_fusion != config.context_fusion:
            raise ConfigError(f"--context-fusion {args.context_fusion} does not match the checkpoint in {ckpt_dir}, "
                              f"whose context_fusion is {config.context_fusion}")
    elif args.init_from:
        # Warm start from a released-format drafter:
        # its shape, mask token and target layers carry over; optimizer and schedule start anew.
        warm = DFlashDrafter.from_pretrained(args.init_from, dtype=torch.float32)
        if warm.dflash2 is not None and args.drafter_kind == "ar":
            raise ConfigError(f"{args.init_from} is a DFlash2 drafter; it does not train as --drafter-kind ar")
        if args.layers and args.layers != len(warm.layers):
            log(f"growing the warm drafter from {len(warm.layers)} to {args.layers} layers")
            warm = grow_drafter(warm, target, args.layers, calibration)
        if layer_ids and layer_ids != warm.target_layer_ids:
            log(f"the warm drafter reads target layers {layer_ids} instead of {warm.target_layer_ids}")
            warm = add_feature_layers(warm, layer_ids)
        config = warm.config
        if args.drafter_kind:
            # The two kinds share every weight; only the mask and the decoding loop differ.
            config.autoregressive = args.drafter_kind == "ar"
        if args.context_fusion:
            # Both fusions have the same weights: only where the features enter differs.
            config.context_fusion = args.context_fusion
        if args.block_size:
            # Block size is not in the weights: a drafter can be retrained for another one.
            config.block_size = args.block_size
        log(f"warm start from {args.init_from}")
    else:
        layers = args.layers or 3
        if args.mask_token_id is not None:
            mask_id, why = args.mask_token_id, "given"
        else:
            seen = set(torch.cat([s[0] for s in seqs]).unique().tolist())
            mask_id, why = pick_mask_token_id(target.tokenizer, target.vocab_size, seen)
        name = target.tokenizer.convert_ids_to_tokens(mask_id) if target.tokenizer is not None else "?"
        log(f"mask token id {mask_id} ({name!r}, {why})")
        if not layer_ids:
            layer_ids = default_target_layer_ids(target.num_layers, layers)
        config = build_drafter_config(target, layers, args.block_size or 16, mask_id, layer_ids,
                                      autoregressive=args.drafter_kind == "ar")
        config.context_fusion = args.context_fusion or "kv"
    pad = getattr(target.tokenizer, "pad_token_id", None)
    if pad is not None and config.mask_token_id == pad:
        # Padded batches would read as masked slots: engines that pad would draft from their padding.
        raise ConfigError(f"mask token id {pad} is the target's pad token ({target.tokenizer.pad_token!r}); "
                          "choose another (--mask-token-id, drafter.mask_token_id)")
    dflash2 = resume_state is None and (args.dflash2 or config.dflash2 is not None)
    if dflash2 and args.draft_vocab:
        raise ConfigError(f"a DFlash2 drafter proposes from the whole vocabulary: --draft-vocab {args.draft_vocab} "
                          "does not apply")
    if config.context_fusion == "input" and (config.autoregressive or dflash2 or config.dflash2 is not None):
        kind = "the autoregressive drafter (--drafter-kind ar)" if config.autoregressive else "a DFlash2 drafter"
        raise ConfigError(f"--context-fusion input is implemented for the first-release DFlash drafter only, not {kind}")
    vocab = None
    if resume_state is None and args.draft_vocab:
        config.draft_vocab_size = args.draft_vocab
        vocab = frequent_tokens(train, args.draft_vocab, target.vocab_size, always=stop_ids_of(target.tokenizer))
        covered = sum(int(torch.isin(s[0][s[1]:], vocab).sum()) for s in train)
        total = sum(len(s[0]) - s[1] for s in train)
        log(f"draft vocabulary: {args.draft_vocab} ids cover {covered / total:.2%} of train response tokens")
    drafter = DFlashDrafter(config)
    if vocab is not None:
        drafter.draft_vocab.copy_(vocab)
    if resume_state is not None:
        drafter.load_state_dict(resume_state["drafter"])
    elif args.init_from:
        warm_state = warm.state_dict()
        if vocab is not None:
            warm_state["draft_vocab"] = vocab
        drafter.load_state_dict(warm_state)
    elif args.init_from_target:
        init_from_target(drafter, target, calibration)
        log(f"drafter layers initialised from target layers {target.num_layers - layers}..{target.num_layers - 1}")
    if dflash2 and drafter.dflash2 is None:
        before = sum(p.numel() for p in drafter.parameters())
        dropped = drafter.draft_vocab
        drafter = to_dflash2(drafter, args.conv_kernel_size, args.conv_group_size, args.selector_rank, args.selector_top_k)
        log(f"DFlash2: {args.conv_kernel_size}-tap convolutions in groups of {args.conv_group_size}, selector rank "
            f"{args.selector_rank} over the top {args.selector_top_k}, "
            f"+{(sum(p.numel() for p in drafter.parameters()) - before) / 1e6:.2f}M parameters; drafts over the whole "
            f"vocabulary" + ("" if dropped is None else f" (the draft vocabulary of {dropped.numel()} is dropped)"))
    return drafter


@dataclass
class Progress:
    """Where a run stands; saved in every checkpoint and restored by --resume."""

    step: int = 0
    epoch: int = 0
    pos: int = 0  # sequences of this epoch's order already consumed
    elapsed: float = 0.0  # training seconds, evaluations excluded
    best_tau: float = 0.0
    bad_evals: int = 0
    block_tokens: int = 0
    seen_seqs: int = 0


@dataclass
class Dist:
    world: int
    rank: int
    device: torch.device
    strategy: str = "ddp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """FSDP: every rank takes part in each forward, evaluation and save of the drafter."""
        return self.world > 1 and self.strategy == "fsdp"


class RunLog:
    """Messages to stderr and records to OUT/train_log.jsonl, from the main rank only."""

    def __init__(self, out_dir: Path, active: bool):
        self.active = active
        self.file = open(out_dir / LOG_FILE, "a") if active else None

    def say(self, msg: str) -> None:
        if self.active:
            print(f"[train] {msg}", file=sys.stderr, flush=True)

    def record(self, record: dict) -> None:
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


def setup_distributed(args) -> Dist:
    """The device for this rank, and the process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device:
        device = torch.device(args.device)
    elif torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(world, rank, device, args.strategy)


def shard_drafter(drafter: DFlashDrafter, dist: Dist):
    """The drafter wrapped for this run's ranks: DDP, FSDP2 (`fully_shard` on each layer, then the
    rest) or itself in one process."""
    if dist.world == 1:
        return drafter
    if dist.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(drafter, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)
    if drafter.dflash2 is not None:
        # The path selector runs outside the drafter's forward, where FSDP has not gathered its weights.
        raise ConfigError("strategy fsdp shards first-release drafters; a DFlash2 drafter trains with ddp")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(dist.device.type, (dist.world,))
    for layer in drafter.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(drafter, mesh=mesh)
    return drafter


def full_state(drafter, dist: Dist, opt=None):
    """(drafter state, optimizer state or None) with whole tensors on the main rank; under FSDP a
    collective that every rank must enter (the others get empty dicts)."""
    if not dist.sharded:
        return drafter.state_dict(), (opt.state_dict() if opt is not None else None)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if opt is None:
        return get_model_state_dict(drafter, options=options), None
    return get_state_dict(drafter, opt, options=options)


def save_released(drafter, dist: Dist, directory: Path, target: Target, dtype=torch.bfloat16) -> None:
    """The drafter in the released format, written by the main rank (under FSDP: gathered first)."""
    state, _ = full_state(drafter, dist) if dist.sharded else (None, None)
    if not dist.is_main:
        return
    if state is not None:
        plain = DFlashDrafter(drafter.config)
        plain.load_state_dict(state)
        plain.save_pretrained(directory, dtype=dtype, lm_head=target.head)
    else:
        drafter.save_pretrained(directory, dtype=dtype)


def save_checkpoint(out_dir: Path, drafter, opt, progress: Progress, args, dist: Dist, target: Target) -> None:
    """OUT/checkpoint/: everything --resume needs, replaced atomically; every rank calls it."""
    if not (dist.is_main or dist.sharded):
        return
    model_state, opt_state = full_state(drafter, dist, opt)
    if not dist.is_main:
        return
    ckpt_dir, tmp = out_dir / CHECKPOINT_DIR, out_dir / (CHECKPOINT_DIR + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save({"drafter": model_state, "optimizer": opt_state, "state": asdict(progress),
                "rng": _rng_state(), "args": vars(args)}, tmp / "state.pt")
    if dist.sharded:
        plain = DFlashDrafter(drafter.config)
        plain.load_state_dict(model_state)
        plain.save_pretrained(tmp, dtype=torch.float32, lm_head=target.head)
    else:
        drafter.save_pretrained(tmp, dtype=torch.float32)  # config.json for resume; weights exact
    # Never a moment without a whole checkpoint: the previous one steps aside until this one is in place.
    old = out_dir / (CHECKPOINT_DIR + ".old")
    if ckpt_dir.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt_dir, old)
    os.replace(tmp, ckpt_dir)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_dir(out_dir: Path) -> Path:
    """The checkpoint --resume reads: OUT/checkpoint/, or the previous one if a kill fell between the two renames."""
    ckpt_dir = out_dir / CHECKPOINT_DIR
    old = out_dir / (CHECKPOINT_DIR + ".old")
    return old if not (ckpt_dir / "state.pt").is_file() and (old / "state.pt").is_file() else ckpt_dir


def schedule_position(progress: Progress, total_steps: int, budget_s: float | None) -> float:
    """Training progress in [0, 1] for the learning-rate schedule: steps or time, whichever is further."""
    done = progress.step / total_steps
    return max(done, progress.elapsed / budget_s) if budget_s else done


def run_eval(trainer, eval_seqs, args, progress: Progress, position: float, save, log: RunLog) -> dict:
    """Score the drafter on the held-out sequences; `save()` it when it is the best so far."""
    metrics = evaluate(trainer, eval_seqs, args.anchors_per_seq)
    metrics.update(step=progress.step, elapsed_s=round(progress.elapsed, 1), kind="eval")
    # Held-out tau, not loss, decides: with soft labels the loss also rewards matching the
    # target's runners-up, which acceptance never sees.
    improved = metrics["val_tau"] > progress.best_tau
    if improved:
        progress.best_tau, progress.bad_evals = metrics["val_tau"], 0
        save()  # the best drafter so far is always the shipped one
    elif position >= 0.5:
        # Patience counts only past the cosine midpoint: a warm start scores below its step-0
        # evaluation while the rate is high and recovers as it decays.
        progress.bad_evals += 1
    metrics["best"] = improved
    log.record(metrics)
    walk = metrics["val_tau_decode"]
    log.say(f"eval step {progress.step}: val_loss {metrics['val_loss']:.4f} est. tau {metrics['val_tau']:.2f}"
            + (f", as decoded {walk:.2f}" if walk is not None else "")
            + (" (best, saved)" if improved else f" (no improvement x{progress.bad_evals})"))
    return metrics


def train_step(trainer, model, batch, args, dist: Dist, text_keys=frozenset()) -> tuple[float, int]:
    """Forward and backward over this rank's share of one optimizer step, `batch` [(ids, prompt
    length, key, anchor generator)]; returns the step's (mean loss, block tokens) over all ranks.

    Each rank's loss is its own mean and DDP and FSDP average the gradients over ranks, so a step
    computes what one process computes on the whole batch. Sequences whose key is in `text_keys` are
    text the target did not write: their labels come from the target's own forward (`--text-data`)."""
    loss, tokens = 0.0, 0
    for j, (ids, plen, key, gen) in enumerate(batch):
        anchors = sample_anchors(len(ids), plen, args.anchors_per_seq, gen)
        if anchors.numel() == 0:
            continue
        # Gradients are reduced over ranks on the last sequence of the step only.
        sync = j == len(batch) - 1 or dist.world == 1
        ctx = contextlib.nullcontext()
        if dist.sharded:
            model.set_requires_gradient_sync(sync)
        elif not sync:
            ctx = model.no_sync()
        text = key in text_keys
        walk_weight = args.walk_weight if is_every_anchor(anchors, len(ids), plen) and not text else 1.0
        with ctx:
            out = trainer.forward(ids, anchors, key=key, walk_weight=walk_weight, target_labels=text)
            (out.loss / len(batch)).backward()
        loss += float(out.loss.detach()) / len(batch)
        tokens += out.block_tokens
    if dist.world > 1:
        totals = torch.tensor([loss, tokens], dtype=torch.float64, device=dist.device)
        torch.distributed.all_reduce(totals)
        loss, tokens = float(totals[0]) / dist.world, int(totals[1])
    return loss, tokens


def main(argv=None) -> dict:
    # --- arguments, devices, seeds ---------------------------------------------------------------
    args = parse_args(argv)
    dist = setup_distributed(args)
    out_dir = Path(args.out)
    ckpt_dir = checkpoint_dir(out_dir)
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(out_dir, dist.is_main)
    random.seed(args.seed + dist.rank)
    np.random.seed(args.seed + dist.rank)
    torch.manual_seed(args.seed)  # same initial drafter on every rank

    # --- the frozen target -----------------------------------------------------------------------
    target_path = resolve_target(args.target)
    dtype = torch.float32 if args.target_dtype == "float32" else torch.bfloat16
    target = Target.from_pretrained(target_path, device=dist.device, dtype=dtype)
    target.model.requires_grad_(False)
    log.say(f"target {target_path}: {target.num_layers} layers, hidden {target.hidden_size}, vocab {target.vocab_size}")

    # --- data ------------------------------------------------------------------------------------
    seqs = load_sequences(args.data, args.max_len, shards=args.shards)
    if not seqs:
        raise SystemExit(f"no usable samples in {args.data}" + (" (--shards)" if args.shards else ""))
    val = [s for s in seqs if heldout(s[2], args.heldout_frac)]
    train = [s for s in seqs if not heldout(s[2], args.heldout_frac)]
    log.say(f"data: {len(train)} train / {len(val)} held-out sequences, "
            f"{sum(len(s[0]) - s[1] for s in train)} train response tokens")
    text_keys = set()
    if args.text_data:
        # Text the target did not write: training only; its labels come from the target's forward.
        text = load_sequences(args.text_data, args.max_len, shards=args.text_shards)
        text_keys = {key for _, _, key in text}
        train = train + text
        log.say(f"text data: {len(text)} sequences, {sum(len(s[0]) - s[1] for s in text)} response tokens, "
            "labelled by the target")
    calibration = [s[0] for s in train[:16]]  # text for measuring the target's q/k scales
    # Spread over the whole held-out split: shards are written source by source.
    eval_seqs = val[:: max(1, len(val) // args.eval_seqs)][: args.eval_seqs]

    # --- the drafter, its trainer and optimizer --------------------------------------------------
    resume_state = None
    if args.resume and (ckpt_dir / "state.pt").is_file():
        resume_state = torch.load(ckpt_dir / "state.pt", map_location="cpu", weights_only=False)
        log.say(f"resuming from step {resume_state['state']['step']}")
    drafter = make_drafter(args, target, seqs, train, calibration, resume_state, ckpt_dir, log.say).to(dist.device)
    drafter.train()
    config = drafter.config
    log.say(f"drafter: {'autoregressive, ' if config.autoregressive else 'DFlash2, ' if config.dflash2 else ''}"
            f"{'input fusion, ' if config.context_fusion == 'input' else ''}"
            f"{config.num_hidden_layers} layers, block {config.block_size}, target_layer_ids "
            f"{config.target_layer_ids}, {sum(p.numel() for p in drafter.parameters()) / 1e6:.1f}M parameters")
    model = shard_drafter(drafter, dist)
    gamma = args.gamma or default_gamma(config.block_size)
    amp = choose_amp(args.amp, dist.device)
    trainer = DrafterTrainer(target, model, config.block_size, gamma, amp, int(args.feature_cache_gb * 2**30),
                             soft_top_k=args.soft_labels, soft_weight=args.soft_weight, selector_weight=args.selector_weight,
                             slot_weighting=args.slot_weighting, dpace_alpha=args.dpace_alpha)
    weighting = f"gamma {gamma}" if args.slot_weighting == "decay" else f"D-PACE slot weights, alpha {args.dpace_alpha}"
    log.say(f"{weighting}, autocast {amp}, device {dist.device}"
            + (f", {dist.world} ranks ({dist.strategy})" if dist.world > 1 else "")
            + (f", soft labels top-{args.soft_labels} weight {args.soft_weight}" if args.soft_labels else "")
            + (f", decoding-walk blocks weigh {args.walk_weight}x" if args.walk_weight != 1 else "")
            + (f", selector loss weight {args.selector_weight}" if config.dflash2 is not None else ""))
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    progress = Progress()
    if resume_state is not None:
        if dist.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(drafter, opt, resume_state["optimizer"], options=StateDictOptions(full_state_dict=True))
        else:
            opt.load_state_dict(resume_state["optimizer"])
        progress = Progress(**resume_state["state"])
        _set_rng_state(resume_state["rng"])
    assert not any(p.requires_grad for p in target.model.parameters())  # nothing of the target slipped in

    # --- schedule --------------------------------------------------------------------------------
    grad_accum = args.grad_accum
    if args.batch_tokens:
        grad_accum = max(1, round(args.batch_tokens / (args.anchors_per_seq * config.block_size * dist.world)))
    # One step takes grad_accum sequences on each rank, consecutive in the epoch's global order.
    per_step = grad_accum * dist.world
    steps_per_epoch = max(1, len(train) // per_step)
    total_steps = args.max_steps or max(1, int(args.epochs * steps_per_epoch))
    budget_s = args.time_budget * 60 if args.time_budget else None
    log.say(f"{grad_accum} sequences per step, {steps_per_epoch} steps per epoch, up to {total_steps} steps"
            + (f", time budget {args.time_budget:g} min" if budget_s else ""))

    def evaluate_now() -> dict | None:
        # Under FSDP every rank runs the evaluation's forwards (they gather the sharded weights);
        # all reach the same scores, and the main rank alone logs and writes.
        if not val or not (dist.is_main or dist.sharded):
            return None
        position = schedule_position(progress, total_steps, budget_s)
        return run_eval(trainer, eval_seqs, args, progress, position,
                        lambda: save_released(drafter, dist, out_dir, target), log)

    # --- the loop --------------------------------------------------------------------------------
    # The starting point is the first candidate: a warm start that training never improves on
    # ships the warm drafter, not whichever later step happened to score best.
    last_eval = evaluate_now() if progress.step == 0 else None
    bar = tqdm(total=total_steps, initial=progress.step, disable=not dist.is_main or args.no_progress,
               dynamic_ncols=True, file=sys.stderr, mininterval=2)
    win_tokens, win_loss, win_steps, win_t0 = 0, 0.0, 0, time.perf_counter()  # the current log window
    stop_reason, order, t_last = None, None, time.perf_counter()
    while stop_reason is None:
        if order is None or progress.pos >= len(train):
            if order is not None:
                progress.epoch, progress.pos = progress.epoch + 1, 0
            # One permutation per epoch, reproducible from the seed: resume finds the same order.
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed + progress.epoch)).tolist()
        if len(train) - progress.pos < per_step and progress.pos > 0:
            progress.pos = len(train)  # drop the ragged tail; the next epoch reshuffles
            continue
        lr = lr_at(schedule_position(progress, total_steps, budget_s), args.warmup, args.lr, args.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        first = progress.pos + dist.rank * grad_accum
        batch = [(*train[order[(first + j) % len(train)]], anchor_generator(args.seed, progress.epoch, first + j))
                 for j in range(grad_accum)]
        step_loss, step_tokens = train_step(trainer, model, batch, args, dist, text_keys)
        grad_norm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), args.clip)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        opt.step()
        now = time.perf_counter()
        progress.elapsed += now - t_last
        t_last = now
        progress.step += 1
        progress.pos += per_step
        progress.seen_seqs += per_step
        progress.block_tokens += step_tokens
        win_tokens, win_loss, win_steps = win_tokens + step_tokens, win_loss + step_loss, win_steps + 1
        bar.update(1)

        # --- logging, evaluation, stopping, checkpoints ------------------------------------------
        if progress.step % args.log_every == 0 or progress.step == 1:
            tok_s = win_tokens / max(1e-9, now - win_t0)
            loss = win_loss / win_steps
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:.0f}", ep=progress.epoch)
            log.record({"kind": "train", "step": progress.step, "epoch": progress.epoch, "loss": loss, "lr": lr,
                        "grad_norm": grad_norm, "block_tok_s": tok_s, "elapsed_s": round(progress.elapsed, 1),
                        "block_tokens": progress.block_tokens})
            win_tokens, win_loss, win_steps, win_t0 = 0, 0.0, 0, time.perf_counter()
        if progress.step >= total_steps:
            stop_reason = "max_steps"
        elif budget_s and progress.elapsed >= budget_s:
            stop_reason = "time_budget"
        if progress.step % args.eval_every == 0 or stop_reason:
            last_eval = evaluate_now()
            t_last = time.perf_counter()  # evaluation time does not eat the training budget
            if progress.bad_evals >= args.patience and stop_reason is None:
                stop_reason = "early_stopping"
        if dist.world > 1:
            flag = torch.tensor([stop_reason is not None], device=dist.device, dtype=torch.int32)
            torch.distributed.broadcast(flag, 0)
            if flag.item() and stop_reason is None:
                stop_reason = "rank0"
        if progress.step % args.save_every == 0 or stop_reason:
            save_checkpoint(out_dir, drafter, opt, progress, args, dist, target)
    bar.close()

    # --- the result --------------------------------------------------------------------------------
    if not val:
        save_released(drafter, dist, out_dir, target)  # without a held-out split the last drafter is the result
    summary = {"kind": "done", "stop_reason": stop_reason, "step": progress.step, "epoch": progress.epoch,
               "elapsed_s": round(progress.elapsed, 1), "block_tokens": progress.block_tokens,
               "best_val_tau": progress.best_tau, "last_eval": last_eval}
    log.record(summary)
    log.say(f"done ({stop_reason}) after {progress.step} steps, {progress.elapsed / 60:.1f} min; drafter in {out_dir}")
    log.close()
    if dist.world > 1:
        # The DDP wrapper's reducer must go before its process group: torn down afterwards, as
        # main's locals are on return, it could hang a rank at exit.
        del trainer, model
        # No rank leaves while another still writes or logs: a peer's closed connection aborted a
        # gloo rank at exit (SIGABRT) on a loaded machine.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return summary


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        # Under torchrun, a failing rank's traceback goes into the launcher's failure summary.
        record(main)()
    except DFlashError as exc:
        sys.exit(f"error: {exc}")
