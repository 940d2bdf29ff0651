"""The default target's cache is published in one rename: a cache another process finished first is
kept as it is (parallel test workers and two apps convert at once), a refresh or a corrupt cache
is replaced."""

from __future__ import annotations

import json

import pytest

from dflash_core.loading import default_target
from dflash_core.loading.default_target import DefaultTargetError, _publish


def _converted(path, weights: str):
    path.mkdir()
    (path / "model.safetensors").write_text(weights)
    (path / default_target._MARKER).write_text(json.dumps(
        {"format": default_target._CACHE_FORMAT, "files": ["model.safetensors"]}))
    return path


def test_a_cache_another_process_published_first_stands(tmp_path):
    dest = _converted(tmp_path / "cache", "first")
    inode = (dest / "model.safetensors").stat().st_ino
    _publish(_converted(tmp_path / ".late", "second"), dest, refresh=False)
    assert (dest / "model.safetensors").read_text() == "first"
    assert (dest / "model.safetensors").stat().st_ino == inode  # not even rewritten: a reader may hold it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


@pytest.mark.parametrize("refresh", [True, False])
def test_a_refresh_or_a_corrupt_cache_is_replaced(tmp_path, refresh):
    dest = _converted(tmp_path / "cache", "old")
    if not refresh:
        (dest / default_target._MARKER).unlink()
    _publish(_converted(tmp_path / ".new", "new"), dest, refresh=refresh)
    assert (dest / "model.safetensors").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_a_corrupt_cache_is_named_with_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    (tmp_path / default_target._CACHE_NAME).mkdir()
    with pytest.raises(DefaultTargetError, match="incomplete or corrupt.*refresh=True"):
        default_target.smollm2_target_dir()
