"""Batch-invariant verification: a block of B tokens computed bitwise as B one-token steps would be.

Speculative decoding is lossless only if verifying a block gives the target's scores exactly as
plain decoding would, one token at a time. Kernels do not promise that: attention over a query
block takes other code paths than a single query (mask, GQA layout, tiling), and in bfloat16 the
rounding differences flip near-tied argmaxes, so outputs drift from plain decoding after a few
dozen tokens. This module removes the difference instead of hoping it is small:

- attention computes one-token steps and short blocks through the masked-attention kernel
  (`kernels/cpu_attention.cpp`), which computes each query row alone in one order; where it does not
  run, each query row of a block with exactly the call a one-token step makes (the same base
  implementation, the query alone, the keys up to its own position, no mask);
- linear layers use one path for every row count (the CPU rows kernel where it runs, else oneDNN's
  packed weights), and each linear shape is probed once at load: where its kernel computes a row of
  a block differently from that row alone, that layer runs blocks of that many rows and more one
  row at a time (exact, slower).

The probe is needed because row invariance depends on the CPU, not only the library: the same
oneDNN kernel can split a long reduction differently for one row than for a block on one CPU and
not on another. Everything else in a decoder layer (norms, RoPE, activations, residuals) already
works row by row. By induction over decoding, every cached key and value is then bitwise what
plain decoding would have cached, and DFlash's output equals plain decoding's by construction.
float32 gets no such claim and keeps its fastest one-row library, where every MLP would otherwise
run row by row. Which shapes fail on which CPUs: docs/benchmarks.md.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .cpu_linear import PackedLinear
from .kernels import cpu_attention

SUFFIX = "+rowwise"
# The longest block made invariant: a released drafter verifies at most 16 tokens, a tree of B
# drafts B + 1 (the app offers up to 32), and the rows kernel's `amx` variant reads each weight once
# for up to 48 rows. Longer inputs are prefills, which plain decoding and DFlash compute with the
# same call, so they keep the fast path.
MAX_BLOCK = 48


def _visible_keys(mask: torch.Tensor | None, q_len: int, k_len: int) -> int | None:
    """The keys the last query sees where `mask` (None, or [b, 1, q, k] bool / additive) lets query i
    see exactly the first `used - q + 1 + i` of them: a causal block after the cached keys, with a
    static cache's unused keys masked beyond `used`. None for any other mask."""
    if mask is None:  # SDPA's causal mask, which sees the first keys: a static cache's prefill sees its own only
        return k_len if q_len == 1 else q_len
    if mask.dim() != 4 or mask.shape[-2:] != (q_len, k_len):
        return None
    allowed = (mask if mask.dtype == torch.bool else mask == 0).reshape(-1, q_len, k_len)
    seen = allowed.sum(-1)  # keys each query sees, which must be the first ones, one more per query
    prefixes = (allowed == (torch.arange(k_len, device=mask.device) < seen[..., None])).all()
    causal = (seen == seen[:1, :1] + torch.arange(q_len, device=mask.device)).all()
    used, exact = torch.stack([seen[0, -1], prefixes & causal]).tolist()  # one host read per layer
    return used if exact and used >= q_len else None


def _kernel_handles(kwargs: dict) -> bool:
    """Whether the masked-attention kernel computes an attention call with these options."""
    return not kwargs.get("dropout") and all(kwargs.get(name) is None for name in cpu_attention.UNHANDLED)


def _kernel_takes(query: torch.Tensor, kwargs: dict) -> bool:
    """Whether the masked-attention kernel computes this eager step: it computes every query row
    alone, in one order, so one-token steps and blocks through it agree bitwise without a loop over rows."""
    return (cpu_attention.row_invariant_ready() and query.device.type == "cpu" and query.shape[0] == 1
            and query.dtype in cpu_attention.DTYPES and query.shape[-1] % 8 == 0 and _kernel_handles(kwargs))


def _through_kernel(query, key, value, mask, kwargs):
    """Attention through the masked-attention kernel, in the layout transformers' attention returns."""
    scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
    return cpu_attention.masked_attention(query, key, value, mask, scale).transpose(1, 2).contiguous(), None


def rowwise(base):
    """Wrap attention function `base` so a query block runs as one-query calls of `base`, or (where
    the masked-attention kernel runs) one-token steps and blocks both through the kernel."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        q_len = query.shape[2]
        windowed = getattr(module, "sliding_window", None) is not None
        if torch.compiler.is_compiling():
            # A compiled step passes the target's own causal mask over its static cache (no host
            # read of it can be traced); the kernel applies it as is, each query row alone.
            if not windowed and _kernel_handles(kwargs) and cpu_attention.takes(query, key, attention_mask, 0.0):
                return _through_kernel(query, key, value, attention_mask, kwargs)
            return base(module, query, key, value, attention_mask, **kwargs)
        k_len = _visible_keys(attention_mask, q_len, key.shape[2])
        if k_len is None and not windowed and _kernel_takes(query, kwargs) and cpu_attention.takes_mask(attention_mask, q_len):
            # Another mask over one sequence, a draft tree's: the kernel applies it as is, each query
            # over its allowed keys in ascending position, as the one-token step at its depth does.
            return _through_kernel(query, key, value, attention_mask, kwargs)
        # Prefills go through `base` unchanged; so do masks this cannot reproduce (padding, sliding
        # windows), which stay correct but lose the bitwise guarantee.
        if k_len is None or not q_len <= min(MAX_BLOCK, k_len) or windowed:
            return base(module, query, key, value, attention_mask, **kwargs)
        key, value = key[:, :, :k_len], value[:, :, :k_len]  # a static cache's unused keys dropped
        attention_mask = None if attention_mask is None else attention_mask[..., :k_len]
        if _kernel_takes(query, kwargs):
            causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
            return _through_kernel(query, key, value, causal, kwargs)
        if q_len == 1 or q_len == k_len:  # a plain step, or a prefill of at most MAX_BLOCK tokens
            return base(module, query, key, value, attention_mask, **kwargs)
        past = k_len - q_len
        rows = [
            base(module, query[:, :, i : i + 1], key[:, :, : past + i + 1], value[:, :, : past + i + 1], None, **kwargs)[0]
            for i in range(q_len)
        ]
        return torch.cat(rows, dim=1), None

    return attention


def register(base_name: str) -> str:
    """Register the row-wise variant of attention implementation `base_name`; return its name."""
    name = base_name + SUFFIX
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, rowwise(ALL_ATTENTION_FUNCTIONS[base_name]))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base_name])
    return name


def cancelling_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """Random inputs ([1, rows, in]) orthogonal to (up to) half of `weight`'s rows.

    Rounded to bf16, a different summation order rarely shows in an output: 1 element in 10,000 of
    SmolLM2's down_proj on random inputs, so a probe could pass a kernel that is not row-invariant.
    An input orthogonal to a weight row makes that output the residue of large terms cancelling,
    which depends on the order: 4 in 100 differ there.
    """
    gen = torch.Generator().manual_seed(0)
    out_features, in_features = weight.shape
    basis, _ = torch.linalg.qr(weight[: min(out_features, in_features // 2)].float().T)
    x = torch.randn(1, rows, in_features, generator=gen)
    return (x - (x @ basis) @ basis.T).to(weight)


@torch.inference_mode()
def rows_alone_from(linear: nn.Linear, max_rows: int = MAX_BLOCK) -> int | None:
    """The fewest rows (2..max_rows) of a block that `linear` computes differently from each row
    alone, or None where every block matches.

    A kernel's reduction order depends on the shapes, not the values, so one probe per row count
    decides it.
    """
    x = cancelling_rows(linear.weight, max_rows)
    alone = torch.cat([linear(x[:, i : i + 1]) for i in range(max_rows)], dim=1)
    return next((rows for rows in range(2, max_rows + 1) if not torch.equal(linear(x[:, :rows]), alone[:, :rows])), None)


def run_rows_alone(linear: nn.Linear, from_rows: int = 2) -> None:
    """Make `linear` compute a block of `from_rows` to MAX_BLOCK rows as one-row calls, as one-token
    steps do (shorter blocks keep their one call: the probe found them exact)."""
    one_row = linear.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or not from_rows <= x.shape[-2] <= MAX_BLOCK:
            return one_row(x)
        return torch.cat([one_row(x[..., i : i + 1, :]) for i in range(x.shape[-2])], dim=-2)

    linear.forward = forward
    linear.runs_rows_alone = from_rows


def make_batch_invariant(model) -> list[str]:
    """Switch a loaded model to row-wise attention and one linear library for all row counts, and
    run rows alone through linear layers whose kernel is not row-invariant here; return their names."""
    current = model.config._attn_implementation
    if not current.endswith(SUFFIX):
        model.set_attn_implementation(register(current))
    verdicts: dict[tuple, bool] = {}  # kernels are chosen by shape: probe each shape once
    for module in model.modules():
        if not isinstance(module, nn.Linear) or getattr(module, "runs_rows_alone", False):
            continue
        if isinstance(module, PackedLinear):
            module.single_row_packed = True
            module.rows_limit = MAX_BLOCK  # one path for every block, where the rows kernel runs
        key = (module.in_features, module.out_features, module.bias is not None, module.weight.dtype, type(module))
        if key not in verdicts:
            verdicts[key] = rows_alone_from(module)
        if verdicts[key] is not None:
            run_rows_alone(module, verdicts[key])
    return rows_alone_layers(model)


def rows_alone_layers(model) -> list[str]:
    """Names of the linear layers that run a block one row at a time (see `make_batch_invariant`)."""
    return [name for name, m in model.named_modules() if getattr(m, "runs_rows_alone", False)]


def is_batch_invariant(model) -> bool:
    return model.config._attn_implementation.endswith(SUFFIX)


def describe(model) -> str:
    """How `model` keeps verification exact, in words for a status line ('' if it does not claim to)."""
    if not is_batch_invariant(model):
        return ""
    slow = [m.runs_rows_alone for m in model.modules() if getattr(m, "runs_rows_alone", False)]
    if not slow:
        return "blocks verified bitwise as one-token steps"
    blocks = f" in blocks of {min(slow)} rows or more" if min(slow) > 2 else ""
    return f"blocks verified bitwise as one-token steps ({len(slow)} linear layers row by row{blocks})"
