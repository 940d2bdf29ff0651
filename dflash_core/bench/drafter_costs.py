"""Measure what decides the drafter's shape on this machine: training throughput and per-cycle costs.

Training: block tokens/s of one optimizer step (target features + drafter forward/backward + AdamW)
per (layers, block size, autocast). Inference at a given context length: one drafter forward
(with the LM head on the B-1 slots), one target verify of B tokens, one plain decoding step. The
implied break-even tau is (draft + verify) / plain: a cycle must commit that many tokens to beat
plain decoding.

    python -m dflash_core.bench drafter-costs [--target default:smollm2] [--context 200]

Training's own modules build and step the drafter, so this one subcommand needs the training code.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch

from ..loading.cli import add_target_arg, add_threads_arg
from ..loading.default_target import resolve_target
from ..models.config import default_target_layer_ids
from ..models.drafter import DFlashDrafter
from ..models.target import Target
from ..training.drafter_init import build_drafter_config
from ..training.objective import DrafterTrainer, default_gamma, sample_anchors
from .run import parse


def timed(fn, repeat: int) -> float:
    fn()  # warm-up: allocations, oneDNN primitive selection
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_drafter(target, layers, block, dtype=torch.float32):
    cfg = build_drafter_config(target, layers, block, 0, default_target_layer_ids(target.num_layers, layers))
    return DFlashDrafter(cfg).to(dtype)


def training(target, args):
    rows = []
    T, plen = args.train_len, 60
    ids = torch.randint(100, 40000, (T,))
    for layers, block, amp in itertools.product(args.layers, args.blocks, ["fp32", "bf16"]):
        drafter = make_drafter(target, layers, block)
        drafter.train()
        trainer = DrafterTrainer(target, drafter, block, default_gamma(block), torch.bfloat16 if amp == "bf16" else None)
        opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
        anchors = sample_anchors(T, plen, args.anchors, torch.Generator().manual_seed(0))

        def step():
            opt.zero_grad()
            trainer.forward(ids, anchors).loss.backward()
            opt.step()

        s = timed(step, args.repeat)
        row = {"kind": "train", "layers": layers, "block": block, "amp": amp, "step_s": round(s, 3),
               "block_tok_s": round(anchors.numel() * block / s)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


@torch.inference_mode()
def inference(target, args):
    rows = []
    ctx = torch.randint(100, 40000, (1, args.context))
    target.reset()
    target.tap_layers([])
    target.forward(ctx)
    L = args.context

    def plain():
        target.forward(torch.tensor([[123]]))
        target.crop(L)

    t_plain = timed(plain, args.repeat * 3)
    rows.append({"kind": "plain_step", "ms": round(t_plain * 1e3, 1)})
    print(json.dumps(rows[-1]), flush=True)
    for block in args.blocks:
        ids = torch.randint(100, 40000, (1, block))

        def verify():
            target.forward(ids)
            target.crop(L)

        t = timed(verify, args.repeat * 3)
        rows.append({"kind": "verify", "block": block, "ms": round(t * 1e3, 1)})
        print(json.dumps(rows[-1]), flush=True)
    feats_all = torch.randn(1, L, 0)
    for layers, block, dt in itertools.product(args.layers, args.blocks, ["float32", "bfloat16"]):
        dtype = getattr(torch, dt)
        drafter = make_drafter(target, layers, block, dtype).eval()
        k = len(drafter.target_layer_ids)
        feats_all = torch.randn(1, L, k * target.hidden_size, dtype=dtype)
        cache = drafter.new_cache()
        drafter(target.embed(torch.zeros(1, 1, dtype=torch.long)).to(dtype), feats_all[:, : L - 4],
                torch.arange(0, L - 4 + 1)[None], cache=cache)
        base = cache.length
        block_ids = torch.zeros(1, block, dtype=torch.long)

        def draft(lm_dtype):
            # 4 newly accepted positions of context, then the block, as in a typical cycle.
            h = drafter(target.embed(block_ids).to(dtype), feats_all[:, L - 4 :], torch.arange(base, L + block)[None], cache=cache)
            cache.crop(base)
            w = target.model.get_output_embeddings().weight
            return (h[0, 1:].to(lm_dtype) @ (w if lm_dtype == w.dtype else w.to(lm_dtype)).T).argmax(-1)

        t_layers = timed(lambda: (drafter(target.embed(block_ids).to(dtype), feats_all[:, L - 4 :],
                                          torch.arange(base, L + block)[None], cache=cache), cache.crop(base)), args.repeat * 3)
        t_fp32_head = timed(lambda: draft(torch.float32), args.repeat * 3)
        rows.append({"kind": "draft", "layers": layers, "block": block, "drafter_dtype": dt,
                     "layers_ms": round(t_layers * 1e3, 1), "with_fp32_lm_head_ms": round(t_fp32_head * 1e3, 1)})
        print(json.dumps(rows[-1]), flush=True)
    # The LM head alone in bf16 (a pre-cast copy of the weight), for a bf16 drafter head.
    w16 = target.model.get_output_embeddings().weight.to(torch.bfloat16)
    for block in args.blocks:
        h = torch.randn(block - 1, target.hidden_size, dtype=torch.bfloat16)
        t = timed(lambda: (h @ w16.T).argmax(-1), args.repeat * 3)
        rows.append({"kind": "lm_head_bf16", "block": block, "ms": round(t * 1e3, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_core.bench drafter-costs", description=__doc__.split("\n\n")[0])
    add_target_arg(p)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--train-len", type=int, default=320)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-infer", action="store_true")
    add_threads_arg(p)
    args = parse(p, argv)
    target = Target.from_pretrained(resolve_target(args.target))
    target.model.requires_grad_(False)
    if not args.skip_infer:
        inference(target, args)
    if not args.skip_train:
        training(target, args)
    return 0
