"""Bounds on Gradio's queue that keep one visitor from filling it: per queue and per visitor.

Gradio bounds its queue only as a whole (`queue(max_size=...)`), so one client sending many
requests at once turns every other visitor away, from races and from replays alike.
`bound_queue` replaces that single bound with two, checked when a request joins: each queue
(a `concurrency_id`: the races, the replays, the page's own small events) holds at most
`limits.max_queue` waiting requests, and each visitor (`callers.visitor_of`: an address) at most
`limits.per_visitor` of them in each queue. A request past either bound is refused at once with
a message (HTTP 503), as Gradio refuses a request to a full queue.

A queue with no concurrency limit (the replays, whose line is their handler's own) starts every
request at once, so nothing waits in it: there a visitor's running requests count too. Joins
under way count as soon as they pass the check, so many sent at once cannot all pass it before
the first is queued. A request refused here costs no worker thread, no event and no stream.
"""

from __future__ import annotations

from collections import Counter

from .callers import visitor_of
from .limits import Limits

BUSY = "queue_full"  # Gradio's own refusal kind: answered with HTTP 503 and the message
VISITOR_FULL = (
    "Your address already has {waiting} requests waiting here, the most one address may have (--per-visitor); "
    "wait for them to finish, or stop one."
)
VISITOR_HOLDS = (
    "Your address already has {waiting} replays playing or waiting, the most one address may have (--per-visitor); "
    "wait for one to finish."
)
QUEUE_FULL = "This server is busy: {waiting} requests are waiting already. Try again in a minute."


def bound_queue(demo, limits: Limits) -> None:
    """Check every request joining `demo`'s queue against the bounds of `limits`."""
    queue = demo._queue
    queue.max_size = None  # the bounds below replace Gradio's single one
    push = queue.push
    joining: Counter[tuple] = Counter()  # (concurrency_id, visitor) -> joins checked, not yet queued

    async def bounded_push(body, request, username):
        fn = demo.fns.get(body.fn_index)
        refusal = refuse(queue, fn, request, limits, joining)
        if refusal is not None:
            return False, refusal, BUSY
        key = (getattr(fn, "concurrency_id", None), visitor_of(request))
        joining[key] += 1  # no await since the check: the next join sees this one
        try:
            return await push(body, request, username)
        finally:
            joining[key] -= 1
            if joining[key] <= 0:
                del joining[key]

    queue.push = bounded_push


def refuse(queue, fn, request, limits: Limits, joining: Counter | None = None) -> str | None:
    """Why a request to `fn` from `request`'s visitor may not join the queue now, or None."""
    if fn is None:  # an unknown function: Gradio's own push answers it
        return None
    waiting = queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
    events = list(waiting.queue) if waiting is not None else []
    if len(events) >= limits.max_queue:
        return QUEUE_FULL.format(waiting=len(events))
    visitor = visitor_of(request)
    if not visitor:
        return None
    started_at_once = fn.concurrency_limit is None
    if started_at_once:
        events += [event for job in queue.active_jobs if job is not None for event in job
                   if event.concurrency_id == fn.concurrency_id]
    mine = sum(1 for event in events if visitor_of(event.request) == visitor)
    mine += (joining or Counter())[(fn.concurrency_id, visitor)]
    if mine >= limits.per_visitor:
        return (VISITOR_HOLDS if started_at_once else VISITOR_FULL).format(waiting=mine)
    return None
