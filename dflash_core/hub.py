"""Turns a local directory or a Hugging Face Hub id into a local directory holding model files.

Hub ids go through `huggingface_hub` (which caches downloads); local paths are used as they are.
"""

from __future__ import annotations

from pathlib import Path

from .errors import CheckpointError


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") != 1


def resolve_model_dir(path_or_id: str | Path, required: tuple[str, ...] = ("config.json",)) -> Path:
    """Local directory containing `required` files, downloading them if `path_or_id` is a Hub id."""
    name = str(path_or_id)
    if looks_like_path(name):
        directory = Path(name).expanduser()
        if not directory.is_dir():
            raise CheckpointError(f"model directory not found: {directory}")
    else:
        from huggingface_hub import snapshot_download

        try:
            directory = Path(snapshot_download(name, allow_patterns=list(required)))
        except Exception as exc:  # network, auth or unknown repo: all mean "cannot get it"
            raise CheckpointError(
                f"could not fetch {name!r} from the Hugging Face Hub ({type(exc).__name__}: {exc}); "
                "check the id and your network, or pass a local directory"
            ) from exc
    missing = [f for f in required if not (directory / f).is_file()]
    if missing:
        raise CheckpointError(f"{directory} is missing {', '.join(missing)}")
    return directory
