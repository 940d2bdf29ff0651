"""Who is reading a session's results: the open event streams of each session, so that a race or
replay whose visitor has left can end instead of running on for nobody.

Gradio sends a session's results over one event stream (`GET /gradio_api/queue/data?session_hash=`)
and notices a client that left only when it next writes to it, which a race's steady frames can
hide (a new request arriving within moments of the disconnect left the old race running to its
end). `Readers` is ASGI middleware that counts the streams open per session; `gone(session)` is a
race's stop condition: true once a session that was read has had no stream open for `grace_s`.
A session never seen reading (a handler called directly, not over HTTP) is never `gone`.

A session id is whatever the client sends: a stream asked for under an id longer than
`MAX_SESSION_CHARS` is refused (400) before Gradio sees it, and the table of sessions that left
keeps the newest `max_left` of them, so made-up ids cannot grow the server's memory.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from urllib.parse import parse_qs

STREAM_ROUTE = "/gradio_api/queue/data"
GRACE_S = 3.0  # a page reconnecting its stream (a network blip, a reload of the stream) is not leaving
# A browser's session id has 11 characters, gradio_client's (a UUID) 36: room to spare.
MAX_SESSION_CHARS = 128
# A run stops within seconds of its reader leaving (`GRACE_S`), so only the newest sessions that
# left matter; this many is far more than a server has streams at once.
MAX_LEFT = 10_000


class Readers:
    """Open event streams per session; `middleware(app)` counts them."""

    def __init__(self, grace_s: float = GRACE_S, clock=time.monotonic, max_left: int = MAX_LEFT):
        self.grace_s, self._clock, self.max_left = grace_s, clock, max_left
        self._open: Counter[str] = Counter()
        self._left: dict[str, float] = {}  # session -> when its last stream closed
        self._lock = threading.Lock()

    def opened(self, session: str) -> None:
        with self._lock:
            self._open[session] += 1
            self._left.pop(session, None)

    def closed(self, session: str) -> None:
        with self._lock:
            self._open[session] -= 1
            if self._open[session] <= 0:
                del self._open[session]
                self._left.pop(session, None)  # re-inserted: the table stays in the order sessions left
                self._left[session] = self._clock()
                self._forget_old()

    def gone(self, session: str | None, since: float = float("-inf")) -> bool:
        """True once `session` had a stream and has had none for `grace_s` seconds, counted from
        no earlier than `since` (a run's start: a stream closed before it may reopen for it)."""
        with self._lock:
            left = self._left.get(session or "")
            if left is None or session in self._open:
                return False
            return self._clock() - max(left, since) >= self.grace_s

    def watch(self, session: str | None):
        """The stop condition of a run starting now for `session`: its reader has gone."""
        started = self._clock()
        return lambda: self.gone(session, since=started)

    def _forget_old(self) -> None:
        # A session that left long ago has no run left to stop; the table stays small.
        cutoff = self._clock() - 3600.0
        for session in [s for s, t in self._left.items() if t < cutoff]:
            del self._left[session]
        while len(self._left) > self.max_left:  # the oldest go first
            del self._left[next(iter(self._left))]

    def middleware(self, app):
        """ASGI middleware around `app` that counts the event streams it serves."""
        readers = self

        async def counted(scope, receive, send):
            session = _stream_session(scope)
            if session is None:
                return await app(scope, receive, send)
            if len(session) > MAX_SESSION_CHARS:
                return await _refuse_long(send, len(session))
            readers.opened(session)
            try:
                await app(scope, receive, send)
            finally:
                readers.closed(session)

        return counted


async def _refuse_long(send, chars: int) -> None:
    body = f"A session id has at most {MAX_SESSION_CHARS} characters; this one has {chars}.".encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _stream_session(scope) -> str | None:
    if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") != STREAM_ROUTE:
        return None
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash")
    return values[0] if values else None
