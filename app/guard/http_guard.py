"""What the server refuses before any handler runs: a URL to fetch, and uploads past a visitor's budget.

- Gradio walks every input of an event for file-shaped values (`{"path": ..., "meta": {"_type":
  "gradio.FileData"}}`) and downloads any URL found there into its served cache, before the
  handler runs, whatever the component: a prompt, a seed or a slider would do. `refuse_url_inputs`
  makes every component of the page refuse one.
- `/gradio_api/file=<URL>` and the older `/gradio_api/file/<URL>` (one handler) make Gradio fetch
  that URL and stream it back: the server would fetch for anyone. A file route naming a URL gets
  403, by Gradio's own URL test applied to the path as Gradio's router reads it, and to it
  percent-decoded once and twice more. Gradio approves a host it cannot resolve to a public address
  by asking a public DNS-over-HTTPS resolver; `keep_resolver_local` turns that look-up off, so no
  visitor makes this server contact an outside host.
- Gradio bounds each uploaded file (`max_file_size`), not a request or a visitor: ten 20 MB files
  in one request, or one every second, fill the disk. An upload request may carry at most
  `per_request` bytes, and one visitor (`callers.visitor_of`) at most `per_hour` bytes in any hour;
  past either the request gets 413 or 429 before its body is stored. The declared length (the
  per-request bound when none is declared) is reserved under the budget's lock before the body is
  read, so parallel uploads cannot all pass one check, and settled to the bytes that came. A body
  longer than it said is cut off at the bound. `/gradio_api/process_recording`, the other multipart
  route, is closed: the app has no recording component.
- A visitor's requests to the queue's routes, or to the routes Gradio answers outside the queue,
  past their rate (`request_rate.RequestRate`, one bucket each) get 429 before Gradio reads them,
  after a wait that holds a flooding client back.

`HttpGuard` is ASGI middleware (`app.ui.launch_options` installs it); `UploadBudget` holds the counts.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict, deque
from types import SimpleNamespace
from urllib.parse import unquote

import gradio as gr
from gradio_client.utils import is_http_url_like

from ..view import texts
from .callers import visitor_of
from .request_rate import DELAY_S, RequestRate

API_PREFIX = "/gradio_api"
FILE_ROUTES = (f"{API_PREFIX}/file=", f"{API_PREFIX}/file/")
UPLOAD_ROUTE = f"{API_PREFIX}/upload"
RECORDING_ROUTE = f"{API_PREFIX}/process_recording"
MULTIPART_SLACK = 64 * 1024  # form boundaries and headers around the one file an upload carries
HOUR_S = 3600.0


class UploadBudget:
    """Bytes each visitor uploaded in the last hour (`record`); `allows` says whether more may come."""

    def __init__(self, per_request: int, per_hour: int, clock=time.monotonic):
        self.per_request, self.per_hour = per_request, per_hour
        self._clock = clock
        self._sent: dict[str, deque[list]] = defaultdict(deque)  # [when, bytes] per upload
        self._lock = threading.Lock()

    def used(self, visitor: str) -> int:
        with self._lock:
            return self._used(visitor)

    def _used(self, visitor: str) -> int:
        sent, cutoff = self._sent[visitor], self._clock() - HOUR_S
        while sent and sent[0][0] < cutoff:
            sent.popleft()
        if not sent:
            del self._sent[visitor]  # idle visitors leave no entry behind
            return 0
        return sum(n for _, n in sent)

    def reserve(self, visitor: str, nbytes: int) -> list | None:
        """Count `nbytes` against `visitor`'s hour now, if they fit: the reservation to `settle`
        once the body has come, else None."""
        with self._lock:
            if self._used(visitor) + nbytes > self.per_hour:
                return None
            entry = [self._clock(), nbytes]
            self._sent[visitor].append(entry)
            return entry

    def settle(self, reservation: list, nbytes: int) -> None:
        """The bytes a reserved upload really carried replace what it reserved."""
        with self._lock:
            reservation[1] = nbytes


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


class HttpGuard:
    """ASGI middleware: refuses URLs in the file route, uploads past `budget` and requests to the
    routes of each of `rates` past it."""

    def __init__(self, app, budget: UploadBudget, rates: tuple[RequestRate, ...] = ()):
        self.app, self.budget, self.rates = app, budget, rates
        keep_resolver_local()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        for rate in self.rates:
            if rate.covers(path):
                visitor = visitor_of(_peer(scope))
                if not rate.allow(visitor):
                    return await self._too_many(send, rate, visitor)
        if names_url(path):
            return await _answer(send, 403, "This server serves its own files only; it fetches no URL.")
        if path.rstrip("/") == RECORDING_ROUTE:
            return await _answer(send, 404, "This app takes no recordings.")
        if path.rstrip("/") == UPLOAD_ROUTE and scope.get("method") == "POST":
            return await self._upload(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _too_many(self, send, rate: RequestRate, visitor: str):
        if rate.hold(visitor):
            try:
                await asyncio.sleep(DELAY_S)
            finally:
                rate.release(visitor)
        await _answer(send, 429, f"Too many requests from your address: this server takes at most {rate.per_min} "
                                 f"a minute {rate.what} from one address ({rate.flag}). Wait a moment.",
                      [(b"retry-after", str(rate.retry_after_s()).encode())])

    async def _upload(self, scope, receive, send):
        visitor, declared = visitor_of(_peer(scope)), _content_length(scope)
        if declared is not None and declared > self.budget.per_request:
            return await _answer(send, 413, _too_big(self.budget.per_request))
        reservation = self.budget.reserve(visitor, self.budget.per_request if declared is None else declared)
        if reservation is None:
            mb = self.budget.per_hour / 1e6
            return await _answer(send, 429, f"You have uploaded {self.budget.used(visitor) / 1e6:.0f} MB in the last "
                                             f"hour; this server takes at most {mb:.0f} MB per visitor per hour "
                                             "(--upload-mb-per-hour).")
        counted, answered = 0, False

        async def counting_receive():
            nonlocal counted
            message = await receive()
            if message["type"] == "http.request":
                counted += len(message.get("body", b""))
                if counted > self.budget.per_request:  # a body longer than it said, or with no length
                    raise _Refused(413, _too_big(self.budget.per_request))
            return message

        async def tracking_send(message):
            nonlocal answered
            answered = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _Refused as refused:
            if not answered:
                await _answer(send, refused.status, refused.message)
        finally:
            self.budget.settle(reservation, counted)


def names_url(path: str) -> bool:
    """Whether `path` is a file route whose file Gradio would take for a URL: its own test
    (`is_http_url_like`) on the route's path as the router passes it, and on that path
    percent-decoded once and twice (a client or proxy may decode once more)."""
    route = next((r for r in FILE_ROUTES if path.startswith(r)), None)
    if route is None:
        return False
    named = path[len(route):]
    spellings = {named, unquote(named), unquote(unquote(named))}
    return any(is_http_url_like(text.strip()) or is_http_url_like(text.strip().lower()) for text in spellings)


def keep_resolver_local() -> None:
    """Gradio's URL check (safehttpx) asks dns.google about any host the system resolver does not
    place on a public address; with no such look-up, that host is simply not approved."""
    import safehttpx

    async def no_public_resolver(hostname: str) -> list[str]:
        return []

    safehttpx.async_resolve_hostname_google = no_public_resolver


def _peer(scope) -> SimpleNamespace:
    """The parts of an ASGI scope `visitor_of` reads, as a request has them."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    return SimpleNamespace(headers=headers, client=SimpleNamespace(host=(scope.get("client") or ("", 0))[0]))


def _content_length(scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_big(limit: int) -> str:
    return f"An upload may carry one trace file of at most {(limit - MULTIPART_SLACK) / 1e6:.0f} MB."


async def _answer(send, status: int, message: str, headers: list | None = None) -> None:
    body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def refuse_url_inputs(blocks: gr.Blocks) -> None:
    """Every component of `blocks` refuses to download a URL into its cache (uploaded files and
    the app's own files still move there as before). Wrapping the component's two cache methods
    is the whole change: a subclass per component type would do the same, but Gradio writes a
    .pyi file beside every module that defines a component class."""
    for block in blocks.blocks.values():
        if hasattr(block, "async_move_resource_to_block_cache"):
            _refuse_urls_in(block)


def _refuse_urls_in(block) -> None:
    fetch_async, fetch = block.async_move_resource_to_block_cache, block.move_resource_to_block_cache

    async def guarded_async(url_or_file_path):
        _refuse_url(url_or_file_path)
        return await fetch_async(url_or_file_path)

    def guarded(url_or_file_path):
        _refuse_url(url_or_file_path)
        return fetch(url_or_file_path)

    block.async_move_resource_to_block_cache, block.move_resource_to_block_cache = guarded_async, guarded


def _refuse_url(url_or_file_path) -> None:
    if is_http_url_like(str(url_or_file_path or "").strip()):
        raise gr.Error(texts.NO_URLS)
