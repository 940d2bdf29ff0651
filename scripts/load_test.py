"""Load test of the app on this machine's loopback: concurrency, hostile inputs, cancellation, memory.

    python scripts/load_test.py                      # starts `python app.py` (the default pair) itself
    python scripts/load_test.py --app-args "--target DIR --drafter DIR" --max-new-tokens 8

It starts the app as a child process on a free loopback port, runs six rounds through the public
`compare` API (gradio_client, and raw HTTP where a client library would refuse to send the
value, or where a browser's own calls are imitated), stops the app, and prints one JSON line
(also written to `--out`):

1. solo: each of `--clients` requests (greedy and seeded sampling) alone, as the reference;
2. concurrent: the same requests from `--clients` clients at once; each result must equal its
   solo run token for token, and each client's wait for its first frame is recorded;
3. hostile: 40+ malformed or extreme inputs, each with the outcome it must have (an error whose
   message names the problem, or a normal race), each followed by a normal request that must work;
4. cancel: races cancelled mid-stream, each followed at once by a request that must start and finish;
5. memory: `--races` sequential races; the app's resident memory after the first `--warm-races`
   and after all of them, its peak, and the trace files it holds on disk;
6. security (the first attack): crafted trace uploads (sizes, times, markup, nesting, types, one past the
   upload limit), with the server's peak memory over them; reads and replays of another session's
   trace; a race paused and left, and one evicted from the pause table; MCP callers as separate
   agents; and the second attack's: a pause re-sent forever, one address joining 17
   races and 80 replays it never reads, URLs in any input and in the file route, an upload flood,
   a race whose page leaves with another request right behind; and the third, each
   beside another visitor's race timed against the same race alone: URLs in the old file route,
   ten parallel 19.9 MB uploads and the recording route, 30 replays of one 19.5 MB upload at once,
   a race of every lane at the most tokens, 20 s of event streams (at most 4,000) under 14,000-character session
   ids, direct calls of the race function; after each case a normal race from another client must
   finish within `--probe-timeout-s`. After the app stops, its trace files and uploads must be gone.

`--rounds` picks some of them (e.g. `--rounds security`), `--attacks` some groups of the security
round (e.g. `--attacks file_routes,replay_storm`).

Bounded: every request has a timeout, the whole run a deadline (`--deadline-s`), after which the
app is stopped and the JSON line reports what was done. Loopback only: it never serves or calls
anything beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import load_attacks  # the security round, beside this file
import psutil
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [
    "What is 17 * 23? Answer briefly.",
    "Write a Python function that reverses a string.",
    "Name three colors of the rainbow.",
    "Tell me a very short story about a cat.",
]
# Texts of the default pair's special tokens: the chat-template markers, the stop token, the
# drafter's mask token (id 16 in SmolLM2's vocabulary).
SPECIAL_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<empty_output>"]


ANY_ERROR = ""  # an expected outcome: some error, whatever its message


class Deadline(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The app as a child process on loopback, and its resident memory sampled in the background."""

    def __init__(self, app_args: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        cmd = [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(self.port), *app_args]
        self.log = log.open("w")
        # A temporary folder of its own: the trace files and uploads counted are this app's only.
        self.tmp = log.parent / "tmp"
        self.tmp.mkdir(exist_ok=True)
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        env.pop("GRADIO_TEMP_DIR", None)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.ps = psutil.Process(self.proc.pid)
        self.peak_rss = 0
        self.window_peak_rss = 0  # since the last `window()`
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def wait_ready(self, timeout_s: float) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "gradio_api/info", timeout=2).status_code == 200:
                    self._sampler.start()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the app did not answer within {timeout_s} s")

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def window(self) -> None:
        """Start a new window for `window_peak_rss`."""
        self.window_peak_rss = self.rss()

    def _sample(self) -> None:
        while self._sampling:
            try:
                rss = self.rss()
            except psutil.Error:
                return
            self.peak_rss, self.window_peak_rss = max(self.peak_rss, rss), max(self.window_peak_rss, rss)
            time.sleep(0.1)

    def stop(self) -> None:
        self._sampling = False
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Runner:
    def __init__(self, url: str, args, downloads: Path):
        self.url = url
        self.args = args
        self.downloads = downloads
        self.t_end = time.time() + args.deadline_s

    def check_time(self) -> None:
        if time.time() > self.t_end:
            raise Deadline()

    def client(self) -> Client:
        return Client(self.url, verbose=False, download_files=str(self.downloads))

    def race(self, client: Client, prompt: str, temperature=0.0, seed=0, max_new_tokens=None, block_size=None):
        """One race to the end: (report, dflash ids, plain ids, seconds to the first frame)."""
        self.check_time()
        n = max_new_tokens or self.args.max_new_tokens
        t0 = time.perf_counter()
        job = client.submit(prompt, n, block_size or self.args.block_size, temperature, 1.0 if temperature == 0 else 0.9,
                            seed, api_name="/compare")
        first = None
        while not job.done():
            if first is None and job.outputs():
                first = time.perf_counter() - t0
            time.sleep(0.02)
        result = job.result(timeout=self.args.request_timeout_s)
        first = first if first is not None else time.perf_counter() - t0
        trace = json.loads(Path(result[-1]).read_text())
        Path(result[-1]).unlink(missing_ok=True)  # the client's download; the server keeps its own copy
        runs = trace["runs"]  # dflash-trace/2
        return result[-2], runs["dflash"]["output_ids"], runs["plain"]["output_ids"], first

    # --- rounds -------------------------------------------------------------------------------
    def requests(self) -> list[dict]:
        return [
            {"prompt": PROMPTS[i % len(PROMPTS)], "temperature": 0.0 if i % 2 == 0 else 0.7, "seed": i}
            for i in range(self.args.clients)
        ]

    def solo_and_concurrent(self) -> dict:
        reqs = self.requests()
        client = self.client()
        solo = [self.race(client, r["prompt"], r["temperature"], r["seed"]) for r in reqs]
        results: list = [None] * len(reqs)
        errors: list[str] = []
        clients = [self.client() for _ in reqs]
        barrier = threading.Barrier(len(reqs))

        def one(i: int) -> None:
            barrier.wait()
            try:
                results[i] = self.race(clients[i], reqs[i]["prompt"], reqs[i]["temperature"], reqs[i]["seed"])
            except Exception as exc:  # recorded, the round goes on
                errors.append(f"client {i}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.args.request_timeout_s * len(reqs))
        equal = sum(
            1 for s, c in zip(solo, results) if c is not None and (s[1], s[2]) == (c[1], c[2])
        )
        greedy_identical = all(
            s[0]["identical"] for s, r in zip(solo, reqs) if r["temperature"] == 0.0
        )
        return {
            "clients": len(reqs),
            "equal_to_solo": equal,
            "greedy_identical": greedy_identical,
            "errors": errors,
            "first_frame_wait_s": [round(c[3], 2) if c else None for c in results],
            "concurrent_wall_s": round(time.perf_counter() - t0, 1),
        }

    def hostile(self) -> dict:
        client = self.client()
        cases = hostile_cases(self.args)
        failures, outcomes = [], []
        for name, kind, payload, expected in cases:
            self.check_time()
            outcome, message = self.attempt(client, kind, payload)
            ok_outcome = expected == "ok" if outcome == "ok" else (expected != "ok" and expected.lower() in message.lower())
            try:
                report, *_ = self.race(client, "hi", max_new_tokens=2)  # the server answers right after
                after = report["identical"] is True
            except Exception as exc:
                after, message = False, f"{message} / next request: {exc}"
            outcomes.append(ok_outcome and after)
            if not (ok_outcome and after):
                failures.append({"case": name, "expected": expected, "got": outcome, "message": message[:200]})
        return {"cases": len(cases), "as_expected": sum(outcomes), "failures": failures}

    def attempt(self, client: Client, kind: str, payload) -> tuple[str, str]:
        """('ok' | 'error', message) for one hostile request."""
        try:
            if kind == "client":
                result = client.predict(*payload, api_name="/compare")
                Path(result[-1]).unlink(missing_ok=True)
                return "ok", ""
            return self.raw(payload)
        except Exception as exc:
            return "error", str(exc)

    def raw(self, body: str) -> tuple[str, str]:
        """POST a hand-written JSON body to the compare endpoint and read its event stream."""
        base = self.url + "gradio_api/call/compare"
        with httpx.Client(timeout=self.args.request_timeout_s) as http:
            posted = http.post(base, content=body.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"})
            if posted.status_code != 200:
                return "error", f"HTTP {posted.status_code}: {posted.text[:200]}"
            event_id = posted.json()["event_id"]
            text = http.get(f"{base}/{event_id}").text
        if "event: error" in text:
            return "error", text.split("event: error", 1)[1].strip()[:300]
        return ("ok", "") if "event: complete" in text else ("error", text[:300])

    def cancellation(self) -> dict:
        rounds = []
        for _ in range(self.args.cancel_rounds):
            self.check_time()
            client = self.client()
            job = client.submit(PROMPTS[3], self.args.cancel_tokens, self.args.block_size, 0.0, 1.0, 0, api_name="/compare")
            t0 = time.time()
            while not job.outputs() or not any('class="tok ' in str(o[2]) for o in job.outputs()):
                if time.time() - t0 > self.args.request_timeout_s:
                    break
                time.sleep(0.05)
            job.cancel()
            started = time.perf_counter()
            report, _, _, first = self.race(self.client(), "hi", max_new_tokens=2)
            rounds.append({"next_first_frame_s": round(first, 2), "next_done_s": round(time.perf_counter() - started, 2),
                           "next_ok": report["identical"] is True})
        return {"rounds": len(rounds), "all_next_ok": all(r["next_ok"] for r in rounds), "detail": rounds}

    def memory(self, server: Server) -> dict:
        client = self.client()
        after_warm = None
        done = 0
        for i in range(self.args.races):
            self.race(client if i % 5 else self.client(), PROMPTS[i % len(PROMPTS)], 0.0 if i % 2 == 0 else 0.7, i)
            done += 1
            if done == self.args.warm_races:
                after_warm = server.rss()
        final = server.rss()
        return {
            "races": done,
            "rss_after_warm_mb": round(after_warm / 2**20, 1) if after_warm else None,
            "rss_final_mb": round(final / 2**20, 1),
            "growth": round(final / after_warm - 1, 4) if after_warm else None,
        }


def hostile_cases(args) -> list[tuple[str, str, object, str]]:
    """(name, 'client' | 'raw', payload, expected): expected is 'ok' or a part of the error message."""
    n, b = 4, args.block_size
    good = ["hi", n, b, 0.0, 1.0, 0]

    def with_(i, value):
        values = list(good)
        values[i] = value
        return tuple(values)

    def raw(values_json: str) -> str:
        return '{"data": [' + values_json + "]}"

    many_tokens = "lorem ipsum dolor 12345 " * 600  # under the character limit, over the token limit
    cases = [
        ("empty", "client", with_(0, ""), "empty"),
        ("whitespace only", "client", with_(0, " \n\t  "), "empty"),
        ("100k characters", "client", with_(0, "a" * 100_000), "characters; the limit is"),
        ("over the token limit", "client", with_(0, many_tokens), "tokens after the chat template"),
        ("control characters", "client", with_(0, "\x00\x01\x07 hello \x1b[31m red \x7f"), "ok"),
        ("null byte only", "client", with_(0, "\x00"), "ok"),
        ("lone surrogate", "raw", raw('"a\\ud800b", 4, %d, 0.0, 1.0, 0' % b), "surrogate"),
        ("HTML and script", "client", with_(0, "<script>alert(1)</script><img src=x onerror=alert(1)>"), "ok"),
        ("bidi, emoji, zero-width", "client", with_(0, "\u202e🙂\u200b\ufeff x"), "ok"),
        *[(f"special token text {t}", "client", with_(0, f"say {t} twice {t}"), "ok") for t in SPECIAL_TEXTS],
        ("prompt is a number", "client", with_(0, 12), "must be text"),
        ("prompt is null", "client", with_(0, None), "must be text"),
        ("prompt is a list", "raw", raw('["hi"], 4, %d, 0.0, 1.0, 0' % b), "must be text"),
        ("max_new_tokens 0", "client", with_(1, 0), "max_new_tokens must be between"),
        ("max_new_tokens negative", "client", with_(1, -5), "max_new_tokens must be between"),
        ("max_new_tokens over the limit", "client", with_(1, 10**9), "max_new_tokens must be between"),
        ("max_new_tokens fractional", "client", with_(1, 2.5), "whole number"),
        ("max_new_tokens NaN", "raw", raw('"hi", NaN, %d, 0.0, 1.0, 0' % b), "max_new_tokens"),
        ("max_new_tokens Infinity", "raw", raw('"hi", Infinity, %d, 0.0, 1.0, 0' % b), "max_new_tokens"),
        ("max_new_tokens a string", "client", with_(1, "ten"), "must be a number"),
        ("max_new_tokens null", "client", with_(1, None), "must be a number"),
        ("max_new_tokens a list", "client", with_(1, [4]), "must be a number"),
        ("max_new_tokens a boolean", "client", with_(1, True), "must be a number"),
        ("block_size 0", "client", with_(2, 0), "block_size must be at least 1"),
        ("block_size over the trained size", "client", with_(2, 1000), "trained block size"),
        ("block_size fractional", "client", with_(2, 2.5), "whole number"),
        ("block_size a string", "client", with_(2, "x"), "must be a number"),
        ("block_size 1 (no drafting)", "client", with_(2, 1), "ok"),
        ("temperature negative", "client", with_(3, -0.1), "temperature must be in"),
        ("temperature huge", "client", with_(3, 1e6), "temperature must be in"),
        ("temperature NaN", "raw", raw('"hi", 4, %d, NaN, 1.0, 0' % b), "temperature"),
        ("temperature -Infinity", "raw", raw('"hi", 4, %d, -Infinity, 1.0, 0' % b), "temperature"),
        ("temperature a string", "client", with_(3, "hot"), "must be a number"),
        ("top_p 0", "client", with_(4, 0.0), "top_p must be in"),
        ("top_p above 1", "client", with_(4, 1.5), "top_p must be in"),
        ("top_p NaN", "raw", raw('"hi", 4, %d, 0.7, NaN, 0' % b), "top_p"),
        ("top_p an object", "client", with_(4, {"p": 1}), "must be a number"),
        ("seed negative", "client", with_(5, -1), "seed must be between"),
        ("seed over 64 bits", "client", with_(5, 2**70), "seed must be between"),
        ("seed fractional", "client", with_(5, 1.5), "whole number"),
        ("seed Infinity", "raw", raw('"hi", 4, %d, 0.7, 0.9, Infinity' % b), "seed"),
        ("seed a string", "client", with_(5, "abc"), "must be a number"),
        ("seed null (allowed)", "client", with_(5, None), "ok"),
        # Gradio rejects a call with missing values before the app sees it, with an empty message.
        ("too few values", "raw", raw('"hi", 4'), ANY_ERROR),
        ("not JSON", "raw", "{data: [", "HTTP 422"),
        ("data not a list", "raw", '{"data": "hi"}', "HTTP 422"),
    ]
    return cases


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app-args", default="", help="extra arguments for app.py (default pair when empty)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--races", type=int, default=50)
    parser.add_argument("--warm-races", type=int, default=5)
    parser.add_argument("--cancel-rounds", type=int, default=3)
    parser.add_argument("--cancel-tokens", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--request-timeout-s", type=float, default=300)
    parser.add_argument("--deadline-s", type=float, default=3600)
    parser.add_argument("--start-timeout-s", type=float, default=600)
    parser.add_argument("--rounds", default=",".join(ROUNDS), help=f"some of {','.join(ROUNDS)}")
    parser.add_argument("--probe-timeout-s", type=float, default=120,
                        help="security round: how long another visitor's normal race may take after each case")
    parser.add_argument("--max-pause-s", type=int, default=20, help="passed to the app (security round)")
    parser.add_argument("--max-replay-s", type=int, default=20, help="passed to the app (security round)")
    parser.add_argument("--attacks", default="", help="security round: only these groups (comma-separated; "
                        f"the third pass's: {','.join(load_attacks.THIRD_PASS)}); default: every group")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    rounds = args.rounds.split(",")
    if set(rounds) - set(ROUNDS):
        parser.error(f"--rounds takes some of {','.join(ROUNDS)}")
    if args.clients < 1 or args.races < args.warm_races or not 1 <= args.deadline_s <= 4 * 3600:
        parser.error("need clients >= 1, races >= warm-races, and a deadline of at most 4 hours")

    work = Path(tempfile.mkdtemp(prefix="dflash-load-"))
    app_args = [*shlex.split(args.app_args), "--max-pause-s", str(args.max_pause_s),
                "--max-replay-s", str(args.max_replay_s), *(["--mcp"] if "security" in rounds else [])]
    server = Server(app_args, work / "app.log")
    out: dict = {"app_args": " ".join(app_args), "max_new_tokens": args.max_new_tokens, "rounds": rounds}
    t0 = time.time()
    try:
        server.wait_ready(args.start_timeout_s)
        out["rss_start_mb"] = round(server.rss() / 2**20, 1)
        runner = Runner(server.url, args, work / "downloads")
        for name, run in (
            ("concurrency", runner.solo_and_concurrent),
            ("hostile", runner.hostile),
            ("cancel", runner.cancellation),
            ("memory", lambda: runner.memory(server)),
            ("security", lambda: load_attacks.run(runner, server, work)),
        ):
            if name in rounds:
                out[name] = run()
        out["trace_files_on_server"] = count_trace_files(server.tmp)
        out["deadline_hit"] = False
    except Deadline:
        out["deadline_hit"] = True
    except Exception as exc:  # a round broke: the JSON line still says what was done, and why it stopped
        out["aborted"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["rss_peak_mb"] = round(server.peak_rss / 2**20, 1)
        server.stop()
        out["wall_s"] = round(time.time() - t0, 1)
    # SIGTERM closes the server, which deletes its trace files (and the copies it handed out).
    out["trace_files_after_stop"] = count_trace_files(server.tmp)
    out["trace_copies_after_stop"] = len(list(server.tmp.glob("*gradio*/*/dflash_trace.json")))
    out["uploads_after_stop"] = len([f for f in server.tmp.glob("*gradio*/**/*") if f.is_file()])
    line = json.dumps(out)
    print(line)
    if args.out:
        args.out.write_text(line + "\n")


ROUNDS = ("concurrency", "hostile", "cancel", "memory", "security")


def count_trace_files(tmp: Path) -> int:
    """Trace files the app under test holds on disk (its private store, in its temporary folder)."""
    return len(list(tmp.glob("dflash-traces-*/*/dflash_trace.json")))


if __name__ == "__main__":
    main()
