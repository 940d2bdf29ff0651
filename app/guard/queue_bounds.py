"""Bounds on Gradio's queue that keep one visitor from filling it: per queue and per visitor.

Gradio bounds its queue only as a whole (`queue(max_size=...)`), so one client sending many
requests at once turns every other visitor away, from races and from replays alike.
`bound_queue` replaces that single bound with two, checked when a request joins: each queue
(a `concurrency_id`: the races, the replays, the page's own small events) holds at most
`limits.max_queue` waiting requests, and each visitor (`callers.visitor_of`: an address) at most
`limits.per_visitor` of them in each queue. A request past either bound is refused at once with
a message (HTTP 503), as Gradio refuses a request to a full queue.
"""

from __future__ import annotations

from .callers import visitor_of
from .limits import Limits

BUSY = "queue_full"  # Gradio's own refusal kind: answered with HTTP 503 and the message
VISITOR_FULL = (
    "Your address already has {waiting} requests waiting here, the most one address may have (--per-visitor); "
    "wait for them to finish, or stop one."
)
QUEUE_FULL = "This server is busy: {waiting} requests are waiting already. Try again in a minute."


def bound_queue(demo, limits: Limits) -> None:
    """Check every request joining `demo`'s queue against the bounds of `limits`."""
    queue = demo._queue
    queue.max_size = None  # the bounds below replace Gradio's single one
    push = queue.push

    async def bounded_push(body, request, username):
        refusal = refuse(queue, demo.fns.get(body.fn_index), request, limits)
        if refusal is not None:
            return False, refusal, BUSY
        return await push(body, request, username)

    queue.push = bounded_push


def refuse(queue, fn, request, limits: Limits) -> str | None:
    """Why a request to `fn` from `request`'s visitor may not join the queue now, or None."""
    if fn is None:  # an unknown function: Gradio's own push answers it
        return None
    waiting = queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
    events = list(waiting.queue) if waiting is not None else []
    if len(events) >= limits.max_queue:
        return QUEUE_FULL.format(waiting=len(events))
    visitor = visitor_of(request)
    mine = sum(1 for event in events if visitor_of(event.request) == visitor)
    if visitor and mine >= limits.per_visitor:
        return VISITOR_FULL.format(waiting=mine)
    return None
