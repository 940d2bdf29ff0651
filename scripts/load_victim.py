"""Another visitor, in a process of its own: the load test's victim, beside an attack.

    python scripts/load_victim.py URL BLOCK_SIZE

Each line read on stdin starts one short race (the prompt "hi", 2 new tokens) from a new
gradio_client client, as a fresh page would; its seconds, from the client's creation to the
race's last frame, are printed as one JSON line. A visitor under attack shares the server with
the attacker, not the attacker's client: timed inside the load test's own process, the race
would also wait for the attack's client threads (their TLS set-up, JSON and streams hold the
interpreter's lock), which no real visitor does.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

from gradio_client import Client


def race(url: str, block_size: int, downloads: str) -> float:
    t0 = time.perf_counter()
    client = Client(url, verbose=False, download_files=downloads)
    client.predict("hi", 2, block_size, 0.0, 1.0, 0, api_name="/compare")
    return time.perf_counter() - t0


def main() -> None:
    url, block_size = sys.argv[1], int(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="dflash-victim-") as downloads:
        print(json.dumps({"ready": True}), flush=True)
        for _ in sys.stdin:
            try:
                answer = {"seconds": round(race(url, block_size, downloads), 2)}
            except Exception as exc:  # noqa: BLE001 - the load test reports it
                answer = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
