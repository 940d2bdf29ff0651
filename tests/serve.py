"""The app served in the test process on a free loopback port, for the tests that drive it over HTTP
(its API, MCP server, reliability under load, and the browser)."""

from __future__ import annotations

import os
import socket

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app.pairs.models import PairCache  # noqa: E402
from app.pairs.registry import cli_pair, load_pairs  # noqa: E402
from app.ui import build_demo, launch_options  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_app(target_dir, drafter_dir, limits=None, cache=None, ar_drafter_dir=None, **launch):
    """Serve the app in this process on a free port; returns (demo, url)."""
    pairs, _ = load_pairs()
    pair = cli_pair(str(target_dir), str(drafter_dir), ar_drafter="" if ar_drafter_dir is None else str(ar_drafter_dir))
    demo = build_demo([pair, *pairs], pair.id, cache or PairCache("cpu"), limits)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo), **launch)
    return demo, demo.local_url
