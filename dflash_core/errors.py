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
