"""Time `python app.py --replay FILE` from launch to its first page, and check torch never loaded.

    .venv/bin/python dev/scripts/time_replay_start.py assets/traces/math-greedy.json [--runs 3]

Prints one line per run: seconds until http://127.0.0.1:PORT/ answered 200, and whether the
server process had mapped a torch library (read from /proc/PID/maps; Linux only).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(trace: str, timeout_s: float) -> tuple[float, bool]:
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--replay", trace, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the app exited with code {server.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - started > timeout_s:
                raise SystemExit(f"no page after {timeout_s} s")
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        maps = Path(f"/proc/{server.pid}/maps")
        torch_loaded = maps.exists() and "libtorch" in maps.read_text()
        return seconds, torch_loaded
    finally:
        server.terminate()
        server.wait()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    for i in range(args.runs):
        seconds, torch_loaded = one_run(args.trace, args.timeout)
        print(f"run {i + 1}: first page after {seconds:.2f} s; torch loaded: {torch_loaded}", flush=True)


if __name__ == "__main__":
    main()
