"""Exceptions the engine raises for bad inputs, and the words for any failure, so callers (CLI, app)
can show them as messages.

Every error names the offending value(s); `DFlashError` is the one class a caller needs to catch.
`user_message` words any exception (the library's too); `failure_kind` says which kind it is.
"""

from typing import Literal


class DFlashError(ValueError):
    """A problem with the user's input, files or model pair (not a bug in the engine)."""


class ConfigError(DFlashError):
    """A drafter or target configuration that cannot be used."""


class CheckpointError(DFlashError):
    """Missing files, or weights that do not match the architecture."""


class PairMismatchError(DFlashError):
    """A drafter that was not built for this target."""


class GenerationInputError(DFlashError):
    """A prompt or decoding parameter out of range."""


class DatasetError(DFlashError):
    """A benchmark dataset that is unknown, cannot be reached or read, or has fewer rows than asked."""


class DoesNotFitError(DFlashError):
    """A pair whose weights need more device memory than is free (the device, not the pair, is at fault)."""


FailureKind = Literal["input", "out_of_memory", "cuda", "missing_file", "unreadable", "unexpected"]


def failure_kind(exc: BaseException) -> FailureKind:
    """Which kind of failure `exc` is, so a caller can add its own advice to `user_message`."""
    first = (str(exc).strip().splitlines() or [""])[0]
    name = type(exc).__name__
    if isinstance(exc, DFlashError):
        return "input"
    if "OutOfMemoryError" in name or "out of memory" in first.lower():
        return "out_of_memory"
    if "AcceleratorError" in name or "CUDA" in first or "cuda" in name.lower():
        return "cuda"
    if isinstance(exc, FileNotFoundError):
        return "missing_file"
    if isinstance(exc, OSError):
        return "unreadable"
    return "unexpected"


def user_message(exc: BaseException, device=None) -> str:
    """What failed, in words, for a person (never a bare "Error").

    The engine's own errors already say it; out-of-memory, other CUDA errors and missing files get
    a sentence around the library's first line.
    """
    first = (str(exc).strip().splitlines() or [""])[0]
    where = f" on {device}" if device else ""
    name = type(exc).__name__
    kind = failure_kind(exc)
    if kind == "input":
        return str(exc)
    if kind == "out_of_memory":
        return f"out of GPU memory{where} ({first})."
    if kind == "cuda":
        return f"CUDA error{where} ({name}: {first})."
    if kind == "missing_file":
        return f"a file is missing: {exc.filename or first}"
    if kind == "unreadable":
        return f"could not read the model files ({name}: {first})"
    return f"unexpected {name}: {first}"
