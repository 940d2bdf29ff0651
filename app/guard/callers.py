"""Who is calling a handler: a browser tab, an API client, or an agent through the MCP server.

Gradio's MCP server calls the app through one loopback client of its own (it marks its requests
`x-gradio-user: mcp`), so every agent would share that client's session: one agent's Stop, trace
files and pause state would be another's. `session_of` gives each MCP call a session of its own.

A session id is whatever the client sends, so per-visitor bounds count addresses instead
(`visitor_of`): the connection's peer, or on a Hugging Face Space, where every request arrives
through the platform's proxy, the address that proxy appended last to X-Forwarded-For. Elsewhere
that header is ignored, since any client may write it, unless the request comes from an address
named by `--trusted-proxy` (nginx, a load balancer): then uvicorn's `ProxyHeadersMiddleware`
(`app.ui.launch_options`) has already put the forwarded address in the peer's place.
"""

from __future__ import annotations

import os
import uuid

MCP_USER = "mcp"  # the x-gradio-user header of Gradio's MCP loopback client


def is_mcp(request) -> bool:
    headers = getattr(request, "headers", None) or {}
    return headers.get("x-gradio-user") == MCP_USER


def session_of(request) -> str | None:
    """The session a request's state (Stop, trace files, Pause) is kept under; a new one per MCP call."""
    if is_mcp(request):
        return f"mcp-{uuid.uuid4().hex}"
    return getattr(request, "session_hash", None)


def visitor_of(request) -> str:
    """The address a request comes from, for the bounds per visitor ("" when unknown)."""
    headers = getattr(request, "headers", None) or {}
    forwarded = headers.get("x-forwarded-for", "") if os.environ.get("SPACE_ID") else ""
    if forwarded:
        return forwarded.split(",")[-1].strip()
    client = getattr(request, "client", None)
    return getattr(client, "host", None) or ""
