"""How much device memory a model pair needs, known before anything downloads.

A Hub repository's size comes from the Hub's own safetensors metadata (parameter counts per dtype,
`HfApi.model_info(expand=["safetensors", "config"])`: one small request, no weights); a local
directory's from its safetensors headers. Both are counted at the dtype the pair loads in, so a
bf16 checkpoint loaded as float32 counts double. `check_fits` compares the need (weights plus
`MARGIN`) with free device memory and refuses with a `DoesNotFitError` naming both, which tells a
GPU that is too small apart from a pair that is broken. Where the Hub cannot be reached the size is
unknown, said in words, and nothing is refused.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, DoesNotFitError
from ..models.hub import looks_like_path

# Room beyond the weights for the KV caches, activations and the allocator's slack, as a share of
# the weights (the race keeps two caches of a few thousand positions; a 4B-35B target's caches and
# activations stay well under this at those lengths).
MARGIN = 0.25
HUB_TIMEOUT_S = 10.0
GB = 2**30  # "GB" as the download progress counts them (hub.DownloadProgress)

# Floating-point tensors load in the pair's dtype; integer tensors (quantized packs, indices) keep
# their stored size.
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
STORED_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


@dataclass(frozen=True)
class WeightSize:
    """One model's weights: `bytes` once loaded, or None with `unknown` saying why."""

    name: str
    bytes: int | None
    source: str = ""  # where the figure comes from, in words
    unknown: str = ""


def loaded_bytes(counts: dict[str, int], itemsize: int, config: dict | None = None) -> int:
    """Bytes of `counts` (values per safetensors dtype) once loaded with floats at `itemsize`.

    An MXFP4 checkpoint (gpt-oss) stores two 4-bit values per U8 byte; the engine loads the target
    on the CPU first, where transformers dequantizes MXFP4 to bf16, so each stored byte becomes two
    values there.
    """
    quant = ((config or {}).get("quantization_config") or {}).get("quant_method")
    total = 0
    for dtype, n in counts.items():
        if dtype in FLOAT_DTYPES:
            total += n * itemsize
        elif dtype == "U8" and quant == "mxfp4":
            total += 2 * n * itemsize
        else:
            total += n * STORED_BYTES.get(dtype, itemsize)
    return total


def hub_weight_size(repo_id: str, itemsize: int, api=None) -> WeightSize:
    """The Hub's figure for `repo_id`; a repository that does not exist raises `CheckpointError`
    (the pair is broken), an unreachable Hub gives an unknown size (nothing is blocked)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    api = api or HfApi()
    try:
        info = api.model_info(repo_id, expand=["safetensors", "config"], timeout=HUB_TIMEOUT_S)
    except GatedRepoError as exc:
        return WeightSize(repo_id, None, unknown=f"{repo_id} is gated on the Hub ({_first_line(exc)})")
    except RepositoryNotFoundError as exc:
        raise CheckpointError(
            f"{repo_id!r} is not a model repository on the Hugging Face Hub ({_first_line(exc)}); check the id"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - offline, DNS, timeout, 5xx: all mean "size unknown"
        return WeightSize(repo_id, None, unknown=f"the Hub could not be reached for {repo_id} "
                                                 f"({type(exc).__name__}: {_first_line(exc)})")
    safetensors = getattr(info, "safetensors", None)
    counts = dict(getattr(safetensors, "parameters", None) or {})
    if not counts:
        return WeightSize(repo_id, None, unknown=f"the Hub lists no safetensors weights for {repo_id}")
    return WeightSize(repo_id, loaded_bytes(counts, itemsize, getattr(info, "config", None)), "the Hub's metadata")


def local_weight_size(directory: str | Path, itemsize: int) -> WeightSize:
    """The safetensors headers of a local directory, read without loading a tensor."""
    from safetensors import safe_open

    directory = Path(directory).expanduser()
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return WeightSize(str(directory), None, unknown=f"{directory} has no safetensors files")
    counts: Counter = Counter()
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                piece = handle.get_slice(key)
                n = 1
                for dim in piece.get_shape():
                    n *= dim
                counts[piece.get_dtype()] += n
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    return WeightSize(str(directory), loaded_bytes(counts, itemsize, config), "the safetensors files")


def weight_size(path_or_id: str, itemsize: int, api=None) -> WeightSize:
    """`local_weight_size` for a directory, `hub_weight_size` for a Hub id."""
    name = str(path_or_id)
    if looks_like_path(name):
        return local_weight_size(name, itemsize)
    return hub_weight_size(name, itemsize, api)


@dataclass(frozen=True)
class PairSize:
    """A target's and a drafter's weights together, and what they need on a device."""

    target: WeightSize
    drafter: WeightSize

    @property
    def weights(self) -> int | None:
        if self.target.bytes is None or self.drafter.bytes is None:
            return None
        return self.target.bytes + self.drafter.bytes

    @property
    def need(self) -> int | None:
        return None if self.weights is None else int(self.weights * (1 + MARGIN))

    def describe(self) -> str:
        """The size in words, for a status line."""
        if self.weights is None:
            why = "; ".join(part.unknown for part in (self.target, self.drafter) if part.unknown)
            return f"size unknown before download: {why}; loading without the memory check"
        sources = sorted({part.source for part in (self.target, self.drafter)})
        return (
            f"weights {self.weights / GB:.1f} GB (target {self.target.bytes / GB:.1f} GB + drafter "
            f"{self.drafter.bytes / GB:.2f} GB, from {' and '.join(sources)}), about {self.need / GB:.1f} GB "
            f"with {MARGIN:.0%} for the KV caches and activations"
        )


def pair_size(target: str, drafter: str, itemsize: int, api=None) -> PairSize:
    return PairSize(weight_size(target, itemsize, api), weight_size(drafter, itemsize, api))


def check_fits(size: PairSize, label: str, device: str, free: int, total: int, reclaimable: int = 0) -> None:
    """Raise `DoesNotFitError` when `size` cannot fit in `free` bytes plus `reclaimable` (memory the
    caller would free first, such as other loaded pairs). An unknown size passes."""
    need = size.need
    if need is None or need <= free + reclaimable:
        return
    freeable = f" (with {reclaimable / GB:.1f} GB more once the other loaded pairs are freed)" if reclaimable else ""
    raise DoesNotFitError(
        f"{label} needs about {need / GB:.1f} GB on {device} ({size.describe()}), but {device} has "
        f"{free / GB:.1f} GB free of {total / GB:.1f} GB{freeable}. The GPU is too small for this pair; "
        "the pair itself is not at fault. Nothing was downloaded. Choose a smaller pair, or run on a "
        "GPU with more memory."
    )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
