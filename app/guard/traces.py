"""The trace files a race offers for download: private to the session that ran it, kept within bounds.

Each finished race writes one trace (JSON, with its per-block CSV beside it) under `root`, a folder
of mode 0700 that must lie outside every folder the web server serves. With `served` (a folder the
server does serve, Gradio's upload folder in the app), the two files are copied there into a
folder named by 128 random bits, and those copies are what the session gets: a download link
nobody else can guess. `owner` says whose a path is (however the path is spelled), so a path of
another session's trace is refused. A session keeps its last `per_session` traces, a visitor (an
address, `callers.visitor_of`, whatever session ids it sends) its last `per_visitor`, and the
server at most `total`: past that the visitor holding the most loses its oldest, so one visitor's
many races never push out another's downloads. Older ones, a session's traces when the session
ends, and everything at shutdown (`close`) are deleted, copies included, so files do not pile up
however many races are run.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dflash_core.trace import write_trace

NAME = "dflash_trace.json"  # the download's name; the CSV beside it is dflash_trace.csv


@dataclass(frozen=True)
class _Entry:
    session: str | None
    folders: tuple[Path, ...]  # the private folder, then the served copy's (when there is one)
    visitor: str = ""

    @property
    def handed_out(self) -> Path:
        """The JSON the session was given."""
        return self.folders[-1] / NAME

    def paths(self) -> list[str]:
        return [os.path.realpath(folder / name) for folder in self.folders
                for name in (NAME, Path(NAME).with_suffix(".csv").name)]


class TraceStore:
    def __init__(
        self,
        root: Path | str | None = None,
        per_session: int = 4,
        total: int = 64,
        per_visitor: int = 16,
        on_delete: Callable[[str], None] = lambda path: None,
        served: Path | str | None = None,
    ):
        """root: the private folder to write into (created, mode 0700; default a new temporary folder).

        served: where the copies handed out go (None: the private files are handed out).
        on_delete: told the JSON path handed out of each trace removed (the app makes the file
        server forget it and the CSV beside it).
        """
        if root is None:
            root = tempfile.mkdtemp(prefix="dflash-traces-")
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.served = None if served is None else Path(served)
        self.per_session, self.total, self.per_visitor = per_session, total, per_visitor
        self.on_delete = on_delete
        self._lock = threading.Lock()
        self._by_session: dict[str | None, deque[_Entry]] = {}
        self._all: OrderedDict[Path, _Entry] = OrderedDict()  # oldest first, by private folder
        self._owners: dict[str, str | None] = {}  # every file written or handed out -> its session

    def write(self, session: str | None, data: dict, visitor: str = "") -> str:
        """Write `data` as this session's newest trace; returns the JSON path to hand to the session
        (its CSV is the same path with .csv). visitor: who sent the race (`callers.visitor_of`)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # again, after a `close`
        private = self.root / secrets.token_hex(16)
        private.mkdir(mode=0o700)
        write_trace(data, private / NAME)
        folders = (private,)
        if self.served is not None:
            copy = self.served / secrets.token_hex(16)
            shutil.copytree(private, copy)
            folders = (private, copy)
        entry = _Entry(session, folders, visitor)
        with self._lock:
            self._by_session.setdefault(session, deque()).append(entry)
            self._all[private] = entry
            self._owners.update((path, session) for path in entry.paths())
            doomed = list(self._by_session[session])[: -self.per_session]
            kept = [e for e in self._all.values() if e not in doomed]  # oldest first
            mine = [e for e in kept if e.visitor == visitor]
            doomed += mine[: max(0, len(mine) - self.per_visitor)]
            kept = [e for e in kept if e not in doomed]
            while len(kept) > self.total:
                held = Counter(e.visitor for e in kept)
                hog = max(held, key=held.get)
                oldest = next(e for e in kept if e.visitor == hog)
                doomed.append(oldest)
                kept.remove(oldest)
            for old in doomed:
                self._forget(old)
        for old in doomed:
            self._delete(old)
        return str(entry.handed_out)

    def owner(self, path) -> tuple[bool, str | None]:
        """(whether `path` is one of this store's files now, the session it belongs to)."""
        key = os.path.realpath(str(path))  # "//tmp/x" and "/tmp/./x" name "/tmp/x"
        with self._lock:
            return key in self._owners, self._owners.get(key)

    def end_session(self, session: str | None) -> None:
        """Delete every file of a session (its tab was closed)."""
        with self._lock:
            doomed = list(self._by_session.get(session, ()))
            for entry in doomed:
                self._forget(entry)
        for entry in doomed:
            self._delete(entry)

    def close(self) -> None:
        """Delete every file, the copies handed out included (the server is shutting down)."""
        with self._lock:
            doomed = list(self._all.values())
            for entry in doomed:
                self._forget(entry)
        for entry in doomed:
            self._delete(entry)
        shutil.rmtree(self.root, ignore_errors=True)

    def files(self) -> list[Path]:
        """The trace files on disk now (the private copies)."""
        return sorted(self.root.glob(f"*/{NAME}"))

    def _forget(self, entry: _Entry) -> None:
        self._all.pop(entry.folders[0], None)
        queue = self._by_session.get(entry.session)
        if queue is not None:
            if entry in queue:
                queue.remove(entry)
            if not queue:
                del self._by_session[entry.session]
        for path in entry.paths():
            self._owners.pop(path, None)

    def _delete(self, entry: _Entry) -> None:
        for folder in entry.folders:
            shutil.rmtree(folder, ignore_errors=True)
        self.on_delete(str(entry.handed_out))
