"""Who is calling a handler: a browser tab, an API client, or an agent through the MCP server.

Gradio's MCP server calls the app through one loopback client of its own (it marks its requests
`x-gradio-user: mcp`), so every agent would share that client's session: one agent's Stop, trace
files and pause state would be another's. `session_of` gives each MCP call a session of its own.
"""

from __future__ import annotations

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
