"""The trace files a race offers for download, kept on disk only within bounds.

Each finished race writes one trace (JSON, with its per-block CSV beside it). A session keeps its last `per_session` files and the
server its last `total`; older ones, a session's files when the session ends (its tab closed),
and everything at shutdown are deleted, so files do not pile up however many races are run.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path

from dflash_core.trace import write_trace


class TraceStore:
    def __init__(
        self,
        root: Path | str | None = None,
        per_session: int = 4,
        total: int = 64,
        on_delete: Callable[[str], None] = lambda path: None,
    ):
        """root: the folder to write into (created; default a new temporary folder).

        on_delete: told each path removed (the app makes the file server forget it).
        """
        if root is None:
            root = tempfile.mkdtemp(prefix="dflash-traces-")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.per_session, self.total = per_session, total
        self.on_delete = on_delete
        self._lock = threading.Lock()
        self._by_session: dict[str | None, deque[Path]] = {}
        self._all: OrderedDict[Path, str | None] = OrderedDict()  # oldest first
        self._count = 0

    def write(self, session: str | None, data: dict) -> str:
        """Write `data` as this session's newest trace; returns its path."""
        with self._lock:
            self._count += 1
            # One folder per file keeps the download's name `dflash_trace.json`.
            path = self.root / f"{self._count:06d}" / "dflash_trace.json"
            self._by_session.setdefault(session, deque()).append(path)
            self._all[path] = session
            doomed = []
            while len(self._by_session[session]) > self.per_session:
                doomed.append(self._by_session[session].popleft())
            while len(self._all) - len(doomed) > self.total:
                oldest = next(p for p in self._all if p not in doomed)
                self._by_session[self._all[oldest]].remove(oldest)
                doomed.append(oldest)
            for old in doomed:
                self._forget(old)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_trace(data, path)  # and the per-block CSV beside it, removed with its folder
        for old in doomed:
            self._delete(old)
        return str(path)

    def end_session(self, session: str | None) -> None:
        """Delete every file of a session (its tab was closed)."""
        with self._lock:
            doomed = list(self._by_session.pop(session, ()))
            for path in doomed:
                self._all.pop(path, None)
        for path in doomed:
            self._delete(path)

    def close(self) -> None:
        with self._lock:
            doomed = list(self._all)
            self._all.clear()
            self._by_session.clear()
        for path in doomed:
            self.on_delete(str(path))
        shutil.rmtree(self.root, ignore_errors=True)

    def files(self) -> list[Path]:
        """The trace files on disk now."""
        return sorted(self.root.glob("*/*.json"))

    def _forget(self, path: Path) -> None:
        session = self._all.pop(path, None)
        queue = self._by_session.get(session)
        if queue is not None and not queue:
            del self._by_session[session]

    def _delete(self, path: Path) -> None:
        shutil.rmtree(path.parent, ignore_errors=True)
        self.on_delete(str(path))
