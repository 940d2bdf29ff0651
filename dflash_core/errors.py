"""Exceptions the engine raises for bad inputs, so callers (CLI, app) can show them as messages.

Every error names the offending value(s); `DFlashError` is the one class a caller needs to catch.
"""


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


def explain(exc: BaseException, device=None) -> str:
    """A message for a visitor: what failed, in words, and what to try (never a bare "Error").

    The engine's own errors already say it; out-of-memory, other CUDA errors and missing files get
    a sentence around the library's first line.
    """
    if isinstance(exc, DFlashError):
        return str(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    where = f" on {device}" if device else ""
    name = type(exc).__name__
    if "OutOfMemoryError" in name or "out of memory" in first.lower():
        return (
            f"out of GPU memory{where} ({first}). Load one pair at a time, pick a smaller pair or dtype, "
            "or lower max_new_tokens."
        )
    if "AcceleratorError" in name or "CUDA" in first or "cuda" in name.lower():
        return f"CUDA error{where} ({name}: {first}). If it repeats, restart the app: the GPU state may be broken."
    if isinstance(exc, FileNotFoundError):
        return f"a file is missing: {exc.filename or first}"
    if isinstance(exc, OSError):
        return f"could not read the model files ({name}: {first})"
    return f"unexpected {name}: {first}"
