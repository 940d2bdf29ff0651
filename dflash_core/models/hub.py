"""Turns a local directory or a Hugging Face Hub id into a local directory holding model files.

Hub ids go through `huggingface_hub.snapshot_download` (which caches downloads); local paths are
used as they are. A `progress` callback sees the download as it goes (`DownloadProgress`: bytes
and files), through huggingface_hub's own progress bars (`tqdm_class`), so a UI can show a
many-GB download instead of leaving it to the server console.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

# What a causal LM target needs from its repository: config, weights, tokenizer, chat template.
TARGET_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int

    def message(self) -> str:
        gb = 1024**3
        size = f"{self.bytes_done / gb:.2f} of {self.bytes_total / gb:.2f} GB" if self.bytes_total else "starting"
        return f"downloading {self.repo_id}: {size}, {self.files_done} of {self.files_total} files"


ProgressFn = Callable[[DownloadProgress], None]


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") != 1


def progress_tqdm(repo_id: str, progress: ProgressFn):
    """A tqdm class for `snapshot_download(tqdm_class=...)` that reports every update to `progress`.

    huggingface_hub opens one bar counting files and one or more counting bytes (unit "B"); the
    byte bar furthest along stands for the download. Display is left to huggingface_hub.
    """
    from huggingface_hub.utils import tqdm as hf_tqdm

    bars: list = []

    class ProgressTqdm(hf_tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # A disabled tqdm (no terminal) keeps neither its unit nor its count: keep our own.
            self.done, self.byte_bar = kwargs.get("initial", 0) or 0, kwargs.get("unit") == "B"
            bars.append(self)
            report()

        def update(self, n=1):
            self.done += n or 0
            report()
            return super().update(n)

    def report():
        byte_bars = [b for b in bars if b.byte_bar]
        file_bars = [b for b in bars if not b.byte_bar]
        lead = max(byte_bars, key=lambda b: b.done, default=None)
        files = file_bars[0] if file_bars else None
        progress(DownloadProgress(
            repo_id,
            int(lead.done) if lead else 0, int(lead.total or 0) if lead else 0,
            int(files.done) if files else 0, int(files.total or 0) if files else 0,
        ))

    return ProgressTqdm


def resolve_model_dir(
    path_or_id: str | Path, required: tuple[str, ...] = ("config.json",), patterns: tuple[str, ...] | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """Local directory containing `required` files, downloading `patterns` (default: `required`)
    if `path_or_id` is a Hub id, with `progress` told how far the download is."""
    name = str(path_or_id)
    if looks_like_path(name):
        directory = Path(name).expanduser()
        if not directory.is_dir():
            raise CheckpointError(f"model directory not found: {directory}")
    else:
        from huggingface_hub import snapshot_download

        extra = {"tqdm_class": progress_tqdm(name, progress)} if progress else {}
        try:
            directory = Path(snapshot_download(name, allow_patterns=list(patterns or required), **extra))
        except Exception as exc:  # network, auth or unknown repo: all mean "cannot get it"
            raise CheckpointError(
                f"could not fetch {name!r} from the Hugging Face Hub ({type(exc).__name__}: {exc}); "
                "check the id and your network, or pass a local directory"
            ) from exc
    missing = [f for f in required if not (directory / f).is_file()]
    if missing:
        raise CheckpointError(f"{directory} is missing {', '.join(missing)}")
    return directory

