"""How often one visitor may knock on the server's API: a token bucket per address and kind of route.

Every request to the queue's routes (a join, an event stream, the page's heartbeat, the REST
API's `call` routes) costs Gradio work before any bound of `queue_bounds` can look at it: a
stream under a made-up session id costs the server about 4 ms of CPU, and one address can send
hundreds a second. The routes Gradio answers outside the queue (`run` and `api`, which the page's
instant events use: Stop, Pause, Step, switching tabs, the status line's tick while a pair
compiles; `cancel`, `reset`) run their handler at once, in a worker thread, whoever asks.
`RequestRate` gives each visitor (`callers.visitor_of`) a bucket of `per_min` requests to its
routes, refilled at `per_min` / 60 a second; a request finding it empty is answered 429 by the HTTP
guard before Gradio sees it. A browser page sends 5 queue requests on loading and 2 per race, and
direct ones on loading (3 for a page without a model), one per click and one every 3 s while its
pair compiles, so the defaults leave room for a class behind one address loading the page at once.
The table holds the `max_visitors` seen last.

A refusal still costs the server its HTTP parsing, about half a millisecond, and a client that
sends the next request as soon as the last is answered would keep a core busy with them. So a
refused request is answered after `DELAY_S`, a wait that costs the server nothing: a client
sending one request after another is held to one a second per connection. A visitor has at most
`MAX_HELD` refusals waiting per bucket; past that they are answered at once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict

API_PREFIX = "/gradio_api"
QUEUE_ROUTES = (f"{API_PREFIX}/queue/", f"{API_PREFIX}/heartbeat/", f"{API_PREFIX}/call/")
DIRECT_ROUTES = (f"{API_PREFIX}/run/", f"{API_PREFIX}/api/", f"{API_PREFIX}/cancel", f"{API_PREFIX}/reset")
DELAY_S = 1.0
MAX_HELD = 256


class RequestRate:
    """A token bucket per visitor for the requests to `routes` (path prefixes): `allow(visitor)`
    takes one request from it, if there is one. `what` and `flag` name them in a refusal."""

    def __init__(self, per_min: int, routes: tuple[str, ...] = QUEUE_ROUTES, what: str = "to its queue",
                 flag: str = "--queue-requests-per-min", clock=time.monotonic, max_visitors: int = 10_000):
        self.per_min, self.max_visitors = per_min, max_visitors
        self.routes, self.what, self.flag = routes, what, flag
        self._clock = clock
        self._per_s = per_min / 60.0
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # visitor -> [tokens, when], oldest first
        self._held: Counter[str] = Counter()  # refusals waiting for their answer, by visitor
        self._lock = threading.Lock()

    def covers(self, path: str) -> bool:
        return path.startswith(self.routes)

    def allow(self, visitor: str) -> bool:
        now = self._clock()
        with self._lock:
            tokens, then = self._buckets.pop(visitor, (float(self.per_min), now))
            tokens = min(float(self.per_min), tokens + (now - then) * self._per_s)
            allowed = tokens >= 1.0
            self._buckets[visitor] = [tokens - 1.0 if allowed else tokens, now]  # now the newest
            if len(self._buckets) > self.max_visitors:
                # The one seen longest ago goes: its bucket has refilled the most, and a visitor
                # forgotten starts again from a full one.
                self._buckets.popitem(last=False)
            return allowed

    def hold(self, visitor: str) -> bool:
        """Whether a refusal of `visitor`'s may wait `DELAY_S` before its answer (`release` after)."""
        with self._lock:
            if self._held[visitor] >= MAX_HELD:
                return False
            self._held[visitor] += 1
            return True

    def release(self, visitor: str) -> None:
        with self._lock:
            self._held[visitor] -= 1
            if self._held[visitor] <= 0:
                del self._held[visitor]

    def retry_after_s(self) -> int:
        """Seconds until an empty bucket holds a request again."""
        return max(1, round(1.0 / self._per_s))

    def __len__(self) -> int:
        return len(self._buckets)
