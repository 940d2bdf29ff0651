"""Loading a target and a drafter together, and checking that the drafter was built for the target.

Every mismatch is an error that names both values, before any decoding starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError, PairMismatchError
from ..models.drafter import DFlashDrafter, method_name
from ..models.hub import TARGET_PATTERNS, looks_like_path, resolve_model_dir
from ..models.target import Target
from ..speed.batch_invariant import describe as describe_numerics
from ..speed.cpu_linear import pack_linears
from .chat_template import template_args as chat_template_args
from .default_target import cache_root, resolve_target
from .prompting import encode_prompt

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """A dtype by name; "auto" is `default_target_dtype(device)`."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return default_target_dtype(device)
    if name not in DTYPES:
        raise PairMismatchError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)} or auto")
    return DTYPES[name]


def validate_pair(target: Target, drafter: DFlashDrafter, block_size: int | None = None) -> None:
    config = drafter.config
    if config.hidden_size != target.hidden_size:
        raise PairMismatchError(
            f"drafter hidden_size {config.hidden_size} does not match the target's hidden_size {target.hidden_size}"
        )
    if config.vocab_size != target.vocab_size:
        raise PairMismatchError(
            f"drafter vocab_size {config.vocab_size} does not match the target's vocabulary of {target.vocab_size}"
        )
    if config.num_target_layers is not None and config.num_target_layers != target.num_layers:
        raise PairMismatchError(
            f"drafter was trained on a target with {config.num_target_layers} layers; this target has {target.num_layers}"
        )
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise PairMismatchError(
            f"drafter target_layer_ids {drafter.target_layer_ids} include {bad}, outside the target's "
            f"{target.num_layers} layers (0..{target.num_layers - 1})"
        )
    copy = getattr(drafter, "head_copy", None)
    if copy is not None:
        rows = target.head.weight.detach()[drafter.draft_vocab.to(target.device)].float().cpu()
        # The copy may be stored in bfloat16: equal up to that rounding (2^-8 relative) passes.
        if not torch.allclose(copy.float(), rows, rtol=2**-7, atol=1e-6):
            raise PairMismatchError(
                "the drafter's lm_head (its copy of the target's LM head rows for its draft vocabulary, "
                "which vLLM drafts with) differs from this target's rows: it was saved for another target; "
                "this engine drafts with the target's own rows"
            )
    if block_size is not None and not 1 <= block_size <= drafter.block_size:
        raise PairMismatchError(
            f"block_size {block_size} must be between 1 and the drafter's trained block size {drafter.block_size}"
        )


# The kinds (`method_name`) a method's own drafter may be: the bench's `--methods` and the
# app's lanes of the same names. A DFlash drafter in the fusion lane would race KV injection under
# input fusion's name, so each method takes only its own kind.
LANE_KINDS = {"dflash2": ("dflash2",), "fusion": ("fusion",), "ar": ("ar",)}
KIND_NAMES = {"dflash": "DFlash", "dflash2": "DFlash2", "fusion": "input-fusion", "ar": "autoregressive"}


def load_lane_drafter(target: Target, method: str, drafter, dtype: torch.dtype, block_size=None,
                      progress=None) -> DFlashDrafter:
    """The drafter of `method` (a key of `LANE_KINDS`) for `target`, loaded as `load_drafter` does;
    a drafter of another kind, or one that does not fit the target, is a PairMismatchError naming
    the method and the folder."""
    what = f"the {KIND_NAMES[method]} drafter {drafter}"
    try:
        model = load_drafter(target, drafter, dtype, block_size, progress)
    except PairMismatchError as exc:
        raise PairMismatchError(f"{what} does not fit the target: {exc}") from None
    kind = method_name(model)
    if kind not in LANE_KINDS[method]:
        wanted = " or ".join(KIND_NAMES[k] for k in LANE_KINDS[method])
        raise PairMismatchError(f"{what} is a {KIND_NAMES[kind]} drafter; the {method} method races {wanted} drafters")
    return model


def fetch_target(target, progress=None) -> str:
    """A local directory for `target`: the default target's cache, a path as given, or a Hub
    snapshot downloaded here (so `progress` sees it) rather than inside transformers."""
    name = resolve_target(target)
    if looks_like_path(name):
        return name
    return str(resolve_model_dir(name, ("config.json",), TARGET_PATTERNS, progress))


def stop_ids_of(tokenizer) -> list[int]:
    """The ids that end a generation: the tokenizer's end-of-sequence token, where it has one."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return [] if eos is None else [int(eos)]


@dataclass
class ModelPair:
    """A target and its drafter (None: plain decoding), with the facts every caller needs of them."""

    target: Target
    drafter: DFlashDrafter | None

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def stop_ids(self) -> list[int]:
        return stop_ids_of(self.tokenizer)

    @property
    def context_length(self) -> int | None:
        """Positions the target can attend to (None when its config does not say)."""
        return getattr(self.target.model.config, "max_position_embeddings", None)

    @property
    def numerics(self) -> str:
        """The target's dtype, and how its blocks stay lossless, in words."""
        dtype = str(self.target.dtype).removeprefix("torch.")
        how = describe_numerics(self.target.model)
        return f"{dtype}, {how}" if how else dtype

    @property
    def trained_block_size(self) -> int | None:
        return None if self.drafter is None else self.drafter.block_size

    def encode(self, prompt: str, thinking: str | None = None, *, template_args: dict | None = None,
               chat: bool = True) -> list[int]:
        """Prompt ids through the target's chat template, with `template_args` where given, else with
        thinking as `thinking` asks ("on", "off"; None: as the released drafters were trained);
        without `chat`, the raw text."""
        if template_args is None and chat and getattr(self.tokenizer, "chat_template", None):
            template_args = chat_template_args(self.tokenizer, thinking)
        return encode_prompt(self.tokenizer, prompt, chat=chat, template_args=template_args)


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def has_fast_bf16(device: str | torch.device) -> bool:
    """True on CUDA and on CPUs with AMX or AVX512-BF16; elsewhere bf16 matmuls are emulated."""
    device = torch.device(device)
    if device.type == "cuda":
        return True
    return device.type == "cpu" and any(flag in _cpu_flags() for flag in ("amx_bf16", "avx512_bf16"))


def default_target_dtype(device: str | torch.device) -> torch.dtype:
    """The target dtype "auto" picks: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32.

    On CUDA bf16 is what the released Qwen3 pairs were made for; its block verification is not
    bitwise a one-token step, so a greedy race may part at a near-tie (`lossless.py` tells those
    apart from bugs). On a CPU with native bf16 a batch-invariant bf16 target decodes faster than a
    float32 one, eager or compiled, and stays exact; elsewhere bf16 would be emulated
    (docs/benchmarks.md).
    """
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if has_fast_bf16(device) else torch.float32


def default_drafter_dtype(device: str | torch.device, target_dtype: torch.dtype) -> torch.dtype:
    """bf16 where the hardware runs it natively, else the target's dtype.

    The drafter's precision never changes the output (the target verifies every token), only how
    often drafts are accepted, and a bf16 drafter costs half as much per cycle.
    """
    return torch.bfloat16 if has_fast_bf16(device) else target_dtype


def keep_compiled_code() -> str:
    """Keep inductor's on-disk cache (generated code, GEMM timings) in the project's cache folder,
    `inductor/` under $DFLASH_CACHE or ~/.cache/dflash-studio, unless TORCHINDUCTOR_CACHE_DIR
    names another; return the folder. Inductor's default is under the system's temp folder, which
    a reboot empties: the next process would compile every step again (minutes on a CPU)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # Inductor writes its default into the environment the first time it asks (importing the
    # compiled steps does): that value is its own, not a user's choice.
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default_cache_dir()) == default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def compiled_steps_folder() -> Path:
    """Where compiled steps are saved for later processes (`speed/saved_steps.py`):
    `compiled-steps/` in the project's cache folder ($DFLASH_CACHE or ~/.cache/dflash-studio)."""
    return cache_root() / "compiled-steps"


def load_pair(
    target, drafter=None, *, device="cpu", dtype="float32", drafter_dtype=None, block_size=None, batch_invariant=None,
    progress=None, static_cache=False, cuda_graphs=False, compiled=False,
) -> ModelPair:
    """Load a target (path or Hub id) and optionally a drafter, and validate them as a pair.

    `dtype` "auto" picks `default_target_dtype`, `drafter_dtype` None `default_drafter_dtype`,
    `batch_invariant` None `wants_batch_invariance` (see `Target.from_pretrained`, also for
    `static_cache`, `cuda_graphs` and `compiled`; compiled steps of `library` GEMMs are saved in
    `compiled_steps_folder()`); `progress` is told how Hub downloads advance (`hub.DownloadProgress`).
    """
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        from ..speed.device import cuda_mismatch

        raise ConfigError(cuda_mismatch() or f"device {device!r} was asked for, but torch sees no CUDA GPU here")
    dtype = parse_dtype(dtype, device)
    if compiled:
        keep_compiled_code()
    target = fetch_target(target, progress)
    target_model = Target.from_pretrained(
        target, device=device, dtype=dtype, batch_invariant=batch_invariant, static_cache=static_cache,
        cuda_graphs=cuda_graphs, compiled=compiled, steps_folder=compiled_steps_folder() if compiled else None,
    )
    if drafter is None:
        return ModelPair(target_model, None)
    drafter_dtype = parse_dtype(drafter_dtype) if drafter_dtype else default_drafter_dtype(device, dtype)
    return ModelPair(target_model, load_drafter(target_model, drafter, drafter_dtype, block_size, progress))


def load_drafter(target: Target, drafter, dtype: torch.dtype, block_size=None, progress=None) -> DFlashDrafter:
    """A drafter (path or Hub id) on the target's device, validated against it and ready for decoding."""
    model = DFlashDrafter.from_pretrained(
        drafter, device=target.device, dtype=dtype, progress=progress, vocab_size=target.vocab_size
    )
    validate_pair(target, model, block_size)
    pack_linears(model)  # loaded for decoding, not training: its weights are fixed
    return model
