"""The load test's security round (issues 37, 59 and 66): what a stranger on a shared server might try.

`run(runner, server)` plays each case against the app under test and, after each, races a normal
request from another client, which must finish within `--probe-timeout-s`; it returns one dict
per group. Crafted traces are made from the shipped `assets/traces/math-greedy.json`; browser-only
events (Pause, the cycle picker) are called the way the page calls them, by function index with
a session hash of the caller's own. Visitors are told apart by their loopback source address
(127.0.0.2 and on), as the server's per-visitor bounds tell them apart. Loopback only, like the
rest of the load test.

The frame-cost group (the second attack) needs no model, and runs alone against a replay-only app:

    python scripts/load_attacks.py --out dev/measurements/issue59-frames.json

It streams each crafted trace's replay as a browser does and records the bytes streamed, the
largest event, the server's peak memory, the cycle picker's answers, and how long another
visitor's replay takes beside four hostile ones.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "assets" / "traces" / "math-greedy.json"
MAX_BYTES = 20_000_000  # dflash_core.trace.MAX_BYTES, the upload limit


def long_texts(base: dict, chars: int) -> dict:
    """`base` with every token text and pane piece `chars` characters long, of the characters that
    cost most once escaped as HTML (`"` becomes `&quot;`)."""
    text = ('"<&>' * (chars // 4 + 1))[:chars]
    data = copy.deepcopy(base)
    data["tokens"] = {key: text for key in data["tokens"]}
    data["pieces"] = {lane: [text] * len(pieces) for lane, pieces in data.get("pieces", {}).items()}
    return data


def wide_blocks(base: dict, block_size: int, blocks: int, explained: int = 1) -> dict:
    """A valid race of `blocks` DFlash cycles at `block_size`, each rejecting every draft (one token
    per cycle), against plain decoding; the first `explained` cycles carry a full explanation."""
    data = copy.deepcopy(base)
    for name in ("report", "pieces"):
        data.pop(name, None)
    runs = data["runs"] = {lane: data["runs"][lane] for lane in ("dflash", "plain")}
    data["settings"].update(block_size=block_size, max_new_tokens=blocks + 1)
    start = len(data["settings"]["prompt_ids"])
    first = runs["dflash"]["prefill"]["token_id"]
    ids = sorted(int(key) for key in data["tokens"])[:8]
    for lane, size in (("dflash", block_size), ("plain", 1)):
        run, cycles = runs[lane], []
        clock = run["prefill"]["seconds"]
        run["prefill"]["token_id"] = first
        for i in range(blocks):
            drafts = [ids[(i + k) % len(ids)] for k in range(size - 1)]
            bonus = ids[i % len(ids)]
            cycle = {"index": i, "position": start + i, "draft_ids": drafts, "accepted": 0, "bonus_id": bonus,
                     "committed_ids": [bonus], "draft_s": 0.001, "verify_s": 0.001, "elapsed_s": clock + 0.01 * (i + 1),
                     "draft_passes": 1 if drafts else 0}
            if i < explained and drafts:
                cycle["explain"] = _explanation(cycle, ids)
            cycles.append(cycle)
        run.update(block_size=size, blocks=cycles, output_ids=[first] + [c["bonus_id"] for c in cycles],
                   acceptance_lengths=[1] * blocks, total_s=clock + 0.01 * (blocks + 1), method=lane)
    return data


def _explanation(cycle: dict, ids: list[int]) -> dict:
    """A cycle's explanation with top-5 lists in every slot: the biggest one a cycle of its size holds."""
    drafts, position = cycle["draft_ids"], cycle["position"]
    top = [[token, 0.1] for token in ids[:5]]
    return {
        "slot0_id": ids[0], "mask_id": ids[1], "positions": list(range(position, position + len(drafts) + 1)),
        "injected": {"positions": 1, "target_layers": [1, 2, 3]},
        "draft_topk": [top] * len(drafts), "target_topk": [top] * (len(drafts) + 1),
        "decision": {"rule": "greedy", "resampled": False, "slots": [
            {"slot": 1, "draft": drafts[0], "target": cycle["bonus_id"], "p": 0.1, "q": 0.1, "ratio": None, "u": None,
             "accepted": False}]},
        "cache": {"target_before": position, "target_after": position + 1, "drafter_before": 0, "drafter_after": 0},
        "time": {"draft_s": 0.001, "verify_s": 0.001, "other_s": 0.0},
    }


def tiled(base: dict, times: int) -> dict:
    """`base` raced `times` times as long: every lane's cycles repeated after its own, clocks and
    positions carried on (the recorded report, which no longer fits, left out)."""
    data = copy.deepcopy(base)
    data.pop("report", None)
    data["settings"]["max_new_tokens"] *= times
    for lane, run in data["runs"].items():
        new = len(run["output_ids"]) - 1  # tokens the cycles commit (the first is the prefill's)
        span = run["total_s"] - run["prefill"]["seconds"]
        blocks = []
        for k in range(times):
            for block in copy.deepcopy(run["blocks"]):
                block.update(index=len(blocks), position=block["position"] + k * new,
                             elapsed_s=block["elapsed_s"] + k * span)
                if block.get("explain"):
                    block["explain"]["positions"] = [p + k * new for p in block["explain"]["positions"]]
                blocks.append(block)
        run.update(blocks=blocks, output_ids=run["output_ids"][:1] + run["output_ids"][1:] * times,
                   acceptance_lengths=run["acceptance_lengths"] * times, total_s=run["prefill"]["seconds"] + times * span)
        pieces = data.get("pieces", {}).get(lane)
        if pieces:
            data["pieces"][lane] = pieces[:1] + pieces[1:] * times
    return data


def frame_traces() -> dict[str, tuple[bytes, str]]:
    """The second attack: traces that made every frame of a replay huge (1) or failed with no message (8):
    name -> (file bytes, what the replay must answer: a part of its error, or "ok")."""
    base = json.loads(SHIPPED.read_text())

    def edit(change) -> bytes:
        data = copy.deepcopy(base)
        change(data["runs"]["dflash"]["blocks"][0])
        return json.dumps(data).encode()

    too_long = "characters long; a token's text may be at most 512"
    return {
        "10,000-character texts": (json.dumps(long_texts(base, 10_000)).encode(), too_long),
        "1,000-character texts": (json.dumps(long_texts(base, 1_000)).encode(), too_long),
        "512-character texts (the bound)": (json.dumps(long_texts(base, 512)).encode(), "ok"),
        "block 1024 x 310 cycles": (json.dumps(wide_blocks(base, 1024, 310)).encode(), "ok"),
        "509 tokens (the shipped race 4 times)": (json.dumps(tiled(base, 4)).encode(), "ok"),
        "explanation without mask_id": (edit(lambda b: b["explain"].pop("mask_id")), "missing field"),
        "explain.positions []": (edit(lambda b: b["explain"].update(positions=[])), "explain.positions must be"),
        "draft_passes 'x'": (edit(lambda b: b.update(draft_passes="x")), "draft_passes must be int"),
        "draft_passes [1]": (edit(lambda b: b.update(draft_passes=[1])), "draft_passes must be int"),
        "draft_passes 10**4000": (edit(lambda b: b.update(draft_passes=10**4000)), "4001-digit integer"),
    }


def crafted_traces() -> dict[str, tuple[bytes, str]]:
    """name -> (file bytes, what the replay must answer: a part of its error, or "ok")."""
    base = json.loads(SHIPPED.read_text())

    def edit(change) -> bytes:
        data = copy.deepcopy(base)
        change(data)
        return json.dumps(data).encode()

    def block(t, i=0):
        return t["runs"]["dflash"]["blocks"][i]

    def long_clock(t):
        for run in t["runs"].values():
            run["blocks"][-1]["elapsed_s"] = run["total_s"] = 1e12

    padded = json.dumps(base).encode()
    padded = padded[:-1] + b', "padding": "' + b" " * (MAX_BYTES - len(padded) - 200) + b'"}'
    return {
        "block_size 10**7, no report": (edit(lambda t: (t["runs"]["dflash"].update(block_size=10**7), t.pop("report"))),
                                        "block_size is 10000000"),
        "accepted 10**6": (edit(lambda t: block(t).update(accepted=10**6)), "accepted is 1000000"),
        "position 10**12": (edit(lambda t: block(t).update(position=10**12)), "position is 1000000000000"),
        "40 extra top-k rows": (edit(lambda t: block(t)["explain"]["target_topk"].extend([[]] * 40)), "has 44 entries"),
        "markup in first_difference": (edit(lambda t: t["report"].update(first_difference="<img src=x onerror=alert(1)>")),
                                       "report.first_difference must be int"),
        "markup in the verdict kind": (edit(lambda t: t["report"]["lossless"].update(kind="<script>x</script>")),
                                       "report.lossless.kind must be one of"),
        "report without its keys": (edit(lambda t: t.update(report={"tau": 1.0})), "report lacks speedup"),
        "temperature 'hot'": (edit(lambda t: t["settings"].update(temperature="hot")), "settings.temperature must be"),
        "token key 'abc'": (edit(lambda t: t["tokens"].update(abc="x")), "key 'abc' is not a token id"),
        "400-digit token id": (edit(lambda t: t["runs"]["plain"]["output_ids"].append(10**400)), "401-digit integer"),
        "nested 100 000 deep": (b'{"schema": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        "clocks at 1e12 s": (edit(long_clock), "ok"),
        "20 MB, valid": (padded, "ok"),
        **frame_traces(),
    }


def loopback(local_address: str) -> httpx.HTTPTransport:
    """A transport from `local_address` for plain HTTP on loopback: no TLS, so no CA bundle loaded
    (23 ms of this process's CPU per client otherwise, which would slow the victim's timing)."""
    return httpx.HTTPTransport(verify=False, local_address=local_address)


class Attacks:
    def __init__(self, runner, server, work: Path):
        self.runner, self.server, self.args = runner, server, runner.args
        self.url = runner.url
        self.api = self.url + "gradio_api"
        self.work = work
        self.config = httpx.get(self.url + "config", timeout=30).json()
        self._addresses = itertools.count(1)
        self._victim: subprocess.Popen | None = None

    # --- helpers --------------------------------------------------------------------------------
    def probe(self) -> float:
        """Seconds for a normal race from a fresh client; raises if it fails or takes too long."""
        started = time.perf_counter()
        result = {}

        def race():
            try:
                result["report"] = self.runner.race(self.runner.client(), "hi", max_new_tokens=2)[0]
            except Exception as exc:  # noqa: BLE001 - reported below
                result["error"] = f"{type(exc).__name__}: {exc}"

        worker = threading.Thread(target=race, daemon=True)
        worker.start()
        worker.join(self.args.probe_timeout_s)
        if worker.is_alive():
            raise AssertionError(f"a normal race did not finish within {self.args.probe_timeout_s} s")
        if "error" in result:
            raise AssertionError(f"a normal race failed: {result['error']}")
        return round(time.perf_counter() - started, 2)

    def victim_probe(self) -> tuple[float | str, bool]:
        """`try_probe`'s answer for the same race raced by another visitor in a process of its own
        (`load_victim.py`), so that the attack's client threads do not slow it down."""
        if self._victim is None:
            self._victim = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("load_victim.py")), self.url, str(self.args.block_size)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._victim_answer(120)  # its imports done
        self._victim.stdin.write("race\n")
        self._victim.stdin.flush()
        answer = self._victim_answer(self.args.probe_timeout_s)
        if "seconds" in answer:
            return answer["seconds"], True
        return answer.get("error", "no answer"), False

    def _victim_answer(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self._victim.stdout], [], [], timeout_s)
        if not ready:
            self.close_victim()  # a late answer would be read as the next race's
            return {"error": f"a normal race did not finish within {timeout_s} s"}
        return json.loads(self._victim.stdout.readline() or '{"error": "the victim process ended"}')

    def close_victim(self) -> None:
        if self._victim is not None:
            self._victim.kill()
            self._victim.wait()
            self._victim = None

    def try_probe(self) -> tuple[float | str, bool]:
        """(`probe()`'s seconds, True), or (why it failed, False)."""
        try:
            return self.probe(), True
        except AssertionError as exc:
            return str(exc), False

    def fn_index(self, elem_id: str, api_name: str | None = None) -> int:
        """The function index of the event fired by the component `elem_id` (or named `api_name`)."""
        ids = {c["id"] for c in self.config["components"] if c.get("props", {}).get("elem_id") == elem_id}
        for i, dep in enumerate(self.config["dependencies"]):
            if api_name is not None and dep.get("api_name") == api_name:
                return dep.get("id", i)
            if api_name is None and any(target[0] in ids for target in dep["targets"]):
                return dep.get("id", i)
        raise LookupError(f"no event for {elem_id or api_name}")

    def call(self, api_name: str, data: list, timeout: float = 120) -> tuple[str, str]:
        """('ok' | 'error', message) of a named endpoint called over raw HTTP with `data` as sent."""
        outcome, message, _ = self.call_counted(api_name, data, timeout)
        return outcome, message

    def call_counted(self, api_name: str, data: list, timeout: float = 120) -> tuple[str, str, int]:
        """`call`'s answer, and the bytes of the event stream that carried it."""
        base = f"{self.api}/call/{api_name}"
        with httpx.Client(timeout=timeout) as http:
            posted = http.post(base, json={"data": data})
            if posted.status_code != 200:
                return "error", f"HTTP {posted.status_code}: {posted.text[:300]}", 0
            streamed = http.get(f"{base}/{posted.json()['event_id']}").content
        text = streamed.decode()
        if "event: error" in text:
            return "error", text.split("event: error", 1)[1].strip()[:400], len(streamed)
        return ("ok", "", len(streamed)) if "event: complete" in text else ("error", text[:300], len(streamed))

    def stream_replay(self, upload: str | None, session: str, speed: float = 4.0, address: str = "127.0.0.1") -> dict:
        """A replay as the page runs it, in `session`: its event stream read to the end. Returns the
        outcome, the message, the bytes streamed, the largest event, and the seconds it took."""
        data = ["math-greedy", None if upload is None else {"path": upload, "meta": {"_type": "gradio.FileData"}}, speed]
        got = {"outcome": "error", "message": "no answer", "streamed_mb": 0.0, "largest_event_mb": 0.0}
        streamed = largest = 0
        t0 = time.perf_counter()
        with httpx.Client(transport=loopback(address),
                          timeout=self.args.max_replay_s + 120) as http:
            joined = http.post(f"{self.api}/queue/join", json={
                "data": data, "fn_index": self.fn_index("", "replay"), "session_hash": session, "trigger_id": None})
            if joined.status_code != 200:
                return {**got, "message": f"HTTP {joined.status_code}: {joined.text[:300]}"}
            with http.stream("GET", f"{self.api}/queue/data", params={"session_hash": session}) as events:
                for line in events.iter_lines():
                    size = len(line.encode()) + 1
                    streamed, largest = streamed + size, max(largest, size)
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    if event.get("msg") == "process_completed":
                        got["outcome"] = "ok" if event.get("success") else "error"
                        got["message"] = str((event.get("output") or {}).get("error") or "")[:400]
                        break
        seconds = time.perf_counter() - t0
        return {**got, "streamed_mb": round(streamed / 1e6, 2), "largest_event_mb": round(largest / 1e6, 3),
                "seconds": round(seconds, 2), "mb_per_s": round(streamed / 1e6 / seconds, 2)}

    def fresh_address(self) -> str:
        """A loopback address no earlier request used: a visitor of its own for the server's bounds."""
        n = next(self._addresses)
        return f"127.0.{1 + n // 250}.{1 + n % 250}"

    def upload(self, name: str, content: bytes) -> tuple[int, str | None]:
        """Upload as a visitor of its own, so that the per-visitor upload budget (tested apart, in
        `upload_flood`) never refuses the crafted traces."""
        with httpx.Client(transport=loopback(self.fresh_address()), timeout=120) as http:
            answer = http.post(f"{self.api}/upload", files={"files": (name, content, "application/json")})
        return answer.status_code, (answer.json()[0] if answer.status_code == 200 else None)

    # --- 1, 3, 5, 7, 8: crafted uploads ------------------------------------------------------------
    def crafted(self) -> dict:
        cases, failures = [], []
        self.probe()  # the model warm, so that the window below measures the uploads
        rss_before = self.server.rss()
        self.server.window()
        for name, (content, expected) in crafted_traces().items():
            self.runner.check_time()
            status, path = self.upload("crafted.json", content)
            answer: dict = {}
            t0 = time.perf_counter()

            def replay(path=path, answer=answer, t0=t0):
                answer["got"] = ("error", f"upload HTTP {status}", 0) if path is None else self.call_counted(
                    "replay", ["math-greedy", {"path": path, "meta": {"_type": "gradio.FileData"}}, 4.0],
                    timeout=self.args.max_replay_s + 60,
                )
                answer["s"] = round(time.perf_counter() - t0, 2)

            worker = threading.Thread(target=replay, daemon=True)
            worker.start()
            case = {"case": name, "bytes": len(content)}
            try:  # while the crafted replay is being handled, another visitor races
                case["probe_s"] = self.probe()
            except AssertionError as exc:
                case["probe"] = str(exc)
            worker.join(self.args.max_replay_s + 90)
            outcome, message, streamed = answer.get("got", ("error", "no answer in time", 0))
            ok = (outcome == "ok") if expected == "ok" else (outcome == "error" and expected in message)
            ok = ok and "unexpected" not in message and str(ROOT) not in message and "probe" not in case
            case.update(outcome=outcome, answer_s=answer.get("s"), streamed_mb=round(streamed / 1e6, 2), ok=ok)
            cases.append(case)
            if not case["ok"]:
                failures.append({**case, "expected": expected, "message": message[:300]})
        # One byte past the limit: refused by the upload itself, before anything reads it.
        status, _ = self.upload("big.json", b" " * (MAX_BYTES + 1))
        cases.append({"case": "upload past 20 MB", "outcome": f"HTTP {status}", "ok": status == 413})
        # A URL in place of a file: refused, never fetched (nothing listens on port 9).
        outcome, message = self.call("replay", ["math-greedy", {"path": "http://127.0.0.1:9/x.json",
                                                                "meta": {"_type": "gradio.FileData"}}, 4.0])
        cases.append({"case": "a URL as the upload", "outcome": outcome,
                      "ok": outcome == "error" and "does not download URLs" in message})
        failures += [c for c in cases[-2:] if not c["ok"]]
        return {
            "cases": len(cases), "as_expected": sum(c["ok"] for c in cases), "failures": failures,
            "detail": cases, "rss_before_mb": round(rss_before / 2**20, 1),
            "rss_peak_mb": round(self.server.window_peak_rss / 2**20, 1),
        }

    # --- the second attack: what a crafted trace's replay costs, with no model needed ----------------
    def frame_costs(self) -> dict:
        """Each of `frame_traces` replayed as the page does: its answer, the bytes streamed, the
        largest event and the server's peak memory; the cycle picker's answers after a replay at
        block 1024; another visitor's replay of a shipped trace alone and beside four hostile ones."""
        cases, failures = [], []
        for name, (content, expected) in frame_traces().items():
            self.runner.check_time()
            self.server.window()
            status, path = self.upload("crafted.json", content)
            got = self.stream_replay(path, uuid.uuid4().hex[:11]) if path else {"outcome": "error",
                                                                                 "message": f"upload HTTP {status}"}
            ok = (got["outcome"] == "ok") if expected == "ok" else (got["outcome"] == "error" and expected in got["message"])
            case = {"case": name, "upload_mb": round(len(content) / 1e6, 2), **got, "ok": ok,
                    "rss_peak_mb": round(self.server.window_peak_rss / 2**20, 1)}
            cases.append(case)
            if not ok:
                failures.append({**case, "expected": expected})
        # With a model loaded (the full load test), the visitor beside the hostile replays races.
        probe = self.probe if hasattr(self.runner, "race") else None
        return {"cases": cases, "failures": failures, "cycle_picker": self.cycle_picker(), "beside": self.beside(probe=probe)}

    def cycle_picker(self, calls: int = 40) -> dict:
        """The cycle picker's answers (it runs outside the queue) after a replay of 20 explained
        cycles at block 1024: `calls` picks of cycles in turn, their bytes and time."""
        content = json.dumps(wide_blocks(json.loads(SHIPPED.read_text()), 1024, 20, explained=20)).encode()
        session = uuid.uuid4().hex[:11]
        _, path = self.upload("wide.json", content)
        replay = self.stream_replay(path, session)
        pick = self.fn_index("cycle-pick")
        sizes = []
        t0 = time.perf_counter()
        with httpx.Client(timeout=60) as http:
            for i in range(calls):
                answer = http.post(f"{self.api}/run/predict", json={"data": [i % 20], "fn_index": pick,
                                                                     "session_hash": session})
                sizes.append(len(answer.content))
        return {"replay_upload_mb": round(len(content) / 1e6, 2), "replay": replay["outcome"], "calls": calls,
                "largest_answer_kb": round(max(sizes) / 1e3, 1), "total_mb": round(sum(sizes) / 1e6, 2),
                "seconds": round(time.perf_counter() - t0, 2)}

    def beside(self, hostile: int = 4, probe=None) -> dict:
        """Another visitor's request, alone and while `hostile` replays of 512-character texts (the
        bound) play at 0.25x (so they last the whole --max-replay-s): `probe()`, its seconds, or by
        default a replay of the shipped trace at 4x."""
        probe = probe or (lambda: self.stream_replay(None, uuid.uuid4().hex[:11])["seconds"])
        alone = probe()
        _, path = self.upload("long.json", json.dumps(long_texts(json.loads(SHIPPED.read_text()), 512)).encode())
        results: list[dict] = []
        # Each hostile replay from an address of its own: the per-visitor bound would refuse a third
        # from one address, and the worst case is a visitor with several.
        workers = [threading.Thread(target=lambda a=self.fresh_address(): results.append(
            self.stream_replay(path, uuid.uuid4().hex[:11], 0.25, a)), daemon=True) for _ in range(hostile)]
        self.server.window()
        for worker in workers:
            worker.start()
        time.sleep(2)  # the hostile replays are playing
        beside = probe()
        for worker in workers:
            worker.join(self.args.max_replay_s + 120)
        return {"alone_s": alone, "beside_s": beside, "ratio": round(beside / alone, 2),
                "hostile": hostile, "hostile_streamed_mb": [r["streamed_mb"] for r in results],
                "hostile_mb_per_s": [r["mb_per_s"] for r in results],
                "rss_peak_mb": round(self.server.window_peak_rss / 2**20, 1)}

    # --- 2, 9: another session's trace, server paths --------------------------------------------------
    def cross_session(self) -> dict:
        from gradio_client import Client

        alice = Client(self.url, verbose=False, download_files=False)
        result = alice.predict("hi", 2, self.args.block_size, 0.0, 1.0, 0, api_name="/compare")
        trace = result[-1]
        alice_path = trace["path"] if isinstance(trace, dict) else str(trace)
        checks = {}
        with httpx.Client(timeout=30) as http:
            checks["alice fetches her own link"] = http.get(f"{self.api}/file={alice_path}").status_code == 200
            folder = Path(alice_path).parent
            checks["alice's folder name is 32 random hex digits"] = bool(re.fullmatch(r"[0-9a-f]{32}", folder.name))
            guesses = [folder.parent / f"{n:06d}" / "dflash_trace.json" for n in range(1, 21)]
            checks["counter-numbered guesses are refused"] = all(
                http.get(f"{self.api}/file={g}").status_code in (403, 404) for g in guesses
            )
            private = sorted(self.server.tmp.glob("dflash-traces-*/*/dflash_trace.json"))
            checks["the private store is served to nobody"] = bool(private) and all(
                http.get(f"{self.api}/file={p}").status_code in (403, 404) for p in private[-5:]
            )
            info = http.get(f"{self.api}/info?all_endpoints=true").text
            checks["/gradio_api/info holds no server path"] = str(ROOT) not in info and tempfile.gettempdir() + "/" not in info
            checks["one endpoint name per endpoint"] = "/replay_1" not in info and "/compare_1" not in info
        outcome, message = self.call("replay", ["math-greedy", {"path": alice_path, "meta": {"_type": "gradio.FileData"}},
                                                4.0])
        checks["bob cannot replay alice's trace by path"] = outcome == "error" and "another visitor" in message
        outcome, message = self.call("replay", [alice_path, None, 4.0])  # refused by the dropdown's choices
        checks["bob cannot name it as a recorded run"] = outcome == "error" and "not in the list of choices" in message
        checks["... nor /etc/passwd"] = self.call("replay", ["/etc/passwd", None, 4.0])[0] == "error"
        probe = self.probe()
        return {"checks": checks, "all_ok": all(checks.values()), "probe_s": probe}

    # --- 4: a paused race left behind --------------------------------------------------------------
    def pause_and_leave(self) -> dict:
        """A race paused, then: its page closed ("left"), kept open and idle ("stays", until the
        pause budget), or kept open while 260 calls with made-up sessions try to push it out of the
        pause table ("made_up_sessions": since the second attack they cannot, so it holds to the budget like
        "stays"). Each time another visitor's race, queued behind it, must finish."""
        out = {}
        for how in ("left", "stays", "made_up_sessions"):
            self.runner.check_time()
            page = Page(self, "Tell me a very short story about a cat.", self.args.cancel_tokens)
            page.pause()
            paused = time.perf_counter()
            if how == "left":
                page.leave()
            if how == "made_up_sessions":
                pick = self.fn_index("cycle-pick")
                with httpx.Client(timeout=30) as http:
                    for _ in range(260):
                        http.post(f"{self.api}/run/predict", json={"data": [0], "fn_index": pick,
                                                                    "session_hash": uuid.uuid4().hex[:11]})
            probe, ok = self.try_probe()
            waited = round(time.perf_counter() - paused, 2)
            page.leave()
            # Leaving frees the model well before the budget; staying, at it, whatever else is sent.
            if how != "left":
                ok = ok and self.args.max_pause_s <= waited < self.args.max_pause_s + self.args.probe_timeout_s
            else:
                ok = ok and waited < self.args.max_pause_s
            out[how] = {"victim_done_after_s": waited, "probe_s": probe, "paused_frames": page.paused_frames, "ok": ok}
        out["all_ok"] = all(v["ok"] for v in out.values())
        return out

    # --- 6: MCP callers -----------------------------------------------------------------------------
    def mcp(self) -> dict:
        try:
            from mcp import ClientSession
            from mcp.client.streamable_http import streamablehttp_client
        except ImportError:
            return {"skipped": "the mcp package is not installed"}
        url = self.api + "/mcp/"

        async def one(name: str, args: dict | None):
            async with streamablehttp_client(url) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    if name == "list":
                        return [t.name for t in (await session.list_tools()).tools]
                    try:
                        return await session.call_tool(name, args)
                    except Exception as exc:  # noqa: BLE001 - a refused call, as the client saw it
                        return exc

        tools = asyncio.run(one("list", None))
        refused = asyncio.run(one("replay", {"shipped": "math-greedy", "uploaded": "http://127.0.0.1:9/x", "speed": 4}))
        refused_text = str(refused) if isinstance(refused, Exception) else " ".join(c.text for c in refused.content)
        args = {"prompt": "hi", "max_new_tokens": 2, "block_size": self.args.block_size, "temperature": 0.0,
                "top_p": 1.0, "seed": 0}
        answers = [asyncio.run(one("compare", args)) for _ in range(5)]
        links = [re.findall(r"https?://\S+?dflash_trace\.json", " ".join(c.text for c in a.content))
                 for a in answers if not isinstance(a, Exception)]
        with httpx.Client(timeout=30) as http:
            alive = [bool(found) and http.get(found[-1]).status_code == 200 for found in links]
        return {
            "tools": tools, "only_compare": tools == ["compare"],
            "replay_refused": "Unknown tool" in refused_text,
            "agents": len(answers), "traces_still_there": sum(alive), "isolated": sum(alive) == 5,
            "probe_s": self.probe(),
        }

    # --- the second attack: one visitor holding time, places, memory; fetches; orphans ------------------
    def renewed_pause(self) -> dict:
        """A race paused and re-paused every few seconds: its pause budget still ends it, and the
        race queued behind it finishes within the budget (plus its own time)."""
        self.runner.check_time()
        page = Page(self, "Tell me a very short story about a cat.", self.args.cancel_tokens)
        page.pause()
        paused = time.perf_counter()
        stop = threading.Event()

        def keep_pausing():
            while not stop.wait(min(5.0, self.args.max_pause_s / 4)):
                try:
                    page.pause()
                except Exception:  # noqa: BLE001 - the race has ended: nothing left to pause
                    return

        threading.Thread(target=keep_pausing, daemon=True).start()
        probe, ok = self.try_probe()
        waited = round(time.perf_counter() - paused, 2)
        stop.set()
        page.leave()
        return {"victim_done_after_s": waited, "probe_s": probe, "max_pause_s": self.args.max_pause_s,
                "ok": ok and waited < self.args.max_pause_s + self.args.probe_timeout_s}

    def queue_hog(self) -> dict:
        """17 joins at once from one address (127.0.0.2): most refused with the reason; another
        visitor's race (127.0.0.1) and replay (127.0.0.3) are still served."""
        self.runner.check_time()
        # The API's ten inputs: ..., seed, lanes, the session's pair (a State), thinking, the tree budget.
        data = ["Count slowly from one to one hundred.", self.args.cancel_tokens, self.args.block_size, 0.0, 1.0, 0, None,
                None, None, None]
        codes, said = [], ""
        with httpx.Client(transport=loopback("127.0.0.2"), timeout=30) as http:
            for _ in range(17):
                answer = http.post(f"{self.api}/queue/join", json={
                    "data": data, "fn_index": self.fn_index("run", "compare"), "session_hash": uuid.uuid4().hex[:11],
                    "trigger_id": None})
                codes.append(answer.status_code)
                said = answer.text if answer.status_code != 200 else said
        probe, ok = self.try_probe()
        with httpx.Client(transport=loopback("127.0.0.3"), timeout=120) as http:
            posted = http.post(f"{self.api}/call/replay", json={"data": ["math-greedy", None, 4.0]})
            replay_ok = posted.status_code == 200 and "event: complete" in http.get(
                f"{self.api}/call/replay/{posted.json()['event_id']}").text
        return {"hog_joins": len(codes), "hog_accepted": codes.count(200), "hog_refused": codes.count(503),
                "refusal": said[:200], "probe_s": probe, "other_replay_served": replay_ok,
                "ok": ok and replay_ok and codes.count(200) <= 3}

    def unread_replays(self) -> dict:
        """80 replays joined by one address that never reads a stream: the per-visitor bound takes
        2, and the server's memory stays put."""
        self.runner.check_time()
        rss_before = self.server.rss()
        codes = []
        with httpx.Client(transport=loopback("127.0.0.4"), timeout=30) as http:
            replay = self.fn_index("", "replay")
            for _ in range(80):
                answer = http.post(f"{self.api}/queue/join", json={
                    "data": ["math-greedy", None, 4.0], "fn_index": replay, "session_hash": uuid.uuid4().hex[:11],
                    "trigger_id": None})
                codes.append(answer.status_code)
        time.sleep(min(30, self.args.max_replay_s + 5))  # the replays that started have ended
        grown = round((self.server.rss() - rss_before) / 2**20, 1)
        # The replay queue starts each replay at once, so it counts the visitor's running replays:
        # while two play, the next joins are refused (503).
        return {"joins": len(codes), "joins_answered": codes.count(200), "rss_growth_mb": grown,
                "probe_s": self.probe(), "ok": grown < 100}

    def url_inputs(self) -> dict:
        """A URL in a file-shaped value of any input, and in the file route: refused, never fetched."""
        link = {"path": "http://127.0.0.1:9/x.bin", "meta": {"_type": "gradio.FileData"}}
        checks = {}
        outcome, message = self.call("compare", [link, 2, self.args.block_size, 0.0, 1.0, 0, None, None, "default", 4])
        checks["a URL as the prompt"] = outcome == "error" and "does not download URLs" in message
        outcome, message = self.call("replay", ["math-greedy", None, link])
        checks["a URL as the replay speed"] = outcome == "error" and "does not download URLs" in message
        with httpx.Client(timeout=30) as http:
            checks["the file route refuses a URL"] = http.get(f"{self.api}/file=http://127.0.0.1:9/x").status_code == 403
        return {"checks": checks, "ok": all(checks.values())}

    def upload_flood(self) -> dict:
        """Ten 20 MB files in one request (refused whole), then 20 MB uploads from one address until
        its hourly budget refuses them; another address still uploads."""
        self.runner.check_time()
        big = b" " * (MAX_BYTES - 100)
        with httpx.Client(transport=loopback("127.0.0.5"), timeout=120) as http:
            t0 = time.perf_counter()
            many = http.post(f"{self.api}/upload", files=[("files", (f"t{i}.json", big, "application/json"))
                                                         for i in range(10)])
            many_s = round(time.perf_counter() - t0, 2)
            singles = [http.post(f"{self.api}/upload", files={"files": ("t.json", big, "application/json")}).status_code
                       for _ in range(7)]
        with httpx.Client(transport=loopback("127.0.0.6"), timeout=120) as http:
            other = http.post(f"{self.api}/upload", files={"files": ("o.json", b"{}", "application/json")}).status_code
        return {"ten_files_status": many.status_code, "ten_files_s": many_s, "singles": singles, "other_visitor": other,
                "ok": many.status_code == 413 and 429 in singles and other == 200}

    def orphan(self) -> dict:
        """A race whose page leaves, with another request right behind: the race stops within the
        readers' grace instead of running to its end, and writes no trace."""
        self.runner.check_time()
        traces = len(list(self.server.tmp.glob("dflash-traces-*/*/dflash_trace.json")))
        page = Page(self, "Write a long story about a lighthouse keeper.", self.args.cancel_tokens)
        page.leave()
        probe, ok = self.try_probe()
        time.sleep(5)
        written = len(list(self.server.tmp.glob("dflash-traces-*/*/dflash_trace.json"))) - traces
        return {"probe_s": probe, "traces_written": written, "ok": ok and written <= 1}  # the probe's own


    # --- the third pass: each attack beside another visitor's race ------------------------------------
    def beside_attack(self, attack) -> dict:
        """`attack()`'s dict, with another visitor's race run while it runs (`victim_probe`, from a
        process of its own): its seconds, their ratio to the same race alone just before (the
        machine's other load changes from minute to minute), the server's peak RSS growth over the
        attack, and the CPU seconds the server spent over it (the victim's race included; alone, over
        the second race alone) and the attack's client (this process) did:
        on one shared machine the client's CPU slows the victim too, where a real attacker's would not."""
        self.runner.check_time()
        alone = [self.victim_probe()]  # the first may be the model's first race
        before = sum(self.server.ps.cpu_times()[:2])
        alone.append(self.victim_probe())
        alone_cpu = sum(self.server.ps.cpu_times()[:2]) - before
        if not all(ok for _, ok in alone):
            raise AssertionError(f"a normal race alone failed: {alone}")
        self.alone_s = min(seconds for seconds, _ in alone)
        rss = self.server.rss()
        self.server.window()
        cpu = (sum(self.server.ps.cpu_times()[:2]), sum(psutil.Process().cpu_times()[:2]))
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(attack()), daemon=True)
        worker.start()
        time.sleep(0.5)  # the attack under way
        victim, ok = self.victim_probe()
        worker.join(self.args.request_timeout_s)
        server_cpu = sum(self.server.ps.cpu_times()[:2]) - cpu[0]
        client_cpu = sum(psutil.Process().cpu_times()[:2]) - cpu[1]
        ratio = round(victim / self.alone_s, 2) if ok else None
        return {**result, "victim_s": victim, "alone_s": self.alone_s, "victim_ratio": ratio,
                "load_average_1m": round(os.getloadavg()[0], 1),
                "server_cpu_s": round(server_cpu, 2), "alone_server_cpu_s": round(alone_cpu, 2),
                "attack_client_cpu_s": round(client_cpu, 2),
                "rss_growth_mb": round((self.server.window_peak_rss - rss) / 2**20, 1),
                "ok": bool(result.get("ok")) and ratio is not None and ratio <= 1.5}

    def file_routes(self) -> dict:
        """A URL in both file routes, raw, encoded, half-encoded and in capitals: 403 every time."""
        url = "http://127.0.0.1:9/probe"
        spellings = [url, url.replace(":", "%3A").replace("/", "%2F"), "http%3A//127.0.0.1:9/probe",
                     "HTTP%3A%2F%2F127.0.0.1%3A9%2Fprobe"]
        with httpx.Client(transport=loopback(self.fresh_address()), timeout=30) as http:
            codes = [http.get(f"{self.api}/{route}{spelled}").status_code
                     for route in ("file/", "file=") for spelled in spellings for _ in range(5)]
        return {"requests": len(codes), "refused": codes.count(403), "ok": codes.count(403) == len(codes)}

    def parallel_uploads(self) -> dict:
        """Ten 19.9 MB uploads at once from one address: at most the hourly budget is stored."""
        body, address = b" " * 19_900_000, self.fresh_address()

        def upload(i: int) -> int:
            with httpx.Client(transport=loopback(address), timeout=300) as http:
                return http.post(f"{self.api}/upload", files={"files": (f"p{i}.json", body, "application/json")}).status_code

        with ThreadPoolExecutor(10) as pool:
            codes = list(pool.map(upload, range(10)))
        stored_mb = codes.count(200) * 19.9
        recording = httpx.post(f"{self.api}/process_recording", timeout=60,
                               files={"video": ("v.mp4", b"\0" * 1_000_000, "video/mp4")}).status_code
        return {"accepted": codes.count(200), "stored_mb": round(stored_mb, 1), "recording_route": recording,
                "ok": stored_mb <= 100 and recording == 404}

    def replay_storm(self) -> dict:
        """One upload of a trace padded to 19.5 MB, then 30 replays naming it at once from the same address:
        all but the address's places refused before the file is read."""
        address = self.fresh_address()
        padded = SHIPPED.read_bytes() + b" " * (19_500_000 - SHIPPED.stat().st_size)
        with httpx.Client(transport=loopback(address), timeout=120) as http:
            path = http.post(f"{self.api}/upload", files={"files": ("padded.json", padded, "application/json")}).json()[0]
        data = ["math-greedy", {"path": path, "meta": {"_type": "gradio.FileData"}}, 4.0]
        replay = self.fn_index("", "replay")

        def join(i: int) -> str:
            with httpx.Client(transport=loopback(address), timeout=120) as http:
                session = f"storm{i}-{uuid.uuid4().hex[:6]}"
                joined = http.post(f"{self.api}/queue/join", json={"data": data, "fn_index": replay,
                                                                    "session_hash": session, "trigger_id": None})
                if joined.status_code != 200:
                    return joined.text
                with http.stream("GET", f"{self.api}/queue/data", params={"session_hash": session}) as events:
                    for line in events.iter_lines():
                        if "process_generating" in line or "process_completed" in line:
                            return line
            return ""

        with ThreadPoolExecutor(30) as pool:
            answers = list(pool.map(join, range(30)))
        refused = sum("Your address already has" in a for a in answers)
        return {"requests": 30, "refused": refused, "ok": refused >= 30 - 2}

    def lane_tokens(self) -> dict:
        """A race of every lane at the most tokens with a 1,200-character prompt: refused by its lane-tokens."""
        prompt = ("Tell me about the sea. " * 60)[:1200]
        # The API's inputs: prompt, max new tokens, block size, temperature, top-p, seed, lanes, the
        # session's pair (a State: None), thinking, the tree lane's budget.
        outcome, message = self.call("compare", [prompt, 512, self.args.block_size, 0.0, 1.0, 0,
                                                 ["scheduled", "tree", "dflash2", "fusion", "ar", "lookup"], None,
                                                 "default", 4])
        return {"outcome": outcome, "message": message[:200], "ok": outcome == "error" and "lane-tokens" in message}

    def session_ids(self, most: int = 4000, within_s: float = 20.0) -> dict:
        """Event-stream requests under 14,000-character made-up session ids, one after another as fast
        as the server answers, `most` of them or for `within_s`: refused (400 for the id's length, 429
        past the address's rate, each after a second's wait), nothing kept."""
        codes, t_end = [], time.perf_counter() + within_s
        with httpx.Client(transport=loopback(self.fresh_address()), timeout=30) as http:
            while len(codes) < most and time.perf_counter() < t_end:
                codes.append(http.get(f"{self.api}/queue/data",
                                      params={"session_hash": uuid.uuid4().hex + "x" * 14_000}).status_code)
        refused = codes.count(400) + codes.count(429)
        return {"requests": len(codes), "seconds": within_s, "refused": refused, "past_rate": codes.count(429),
                "ok": refused == len(codes)}

    def direct_run(self) -> dict:
        """A queued function called on /gradio_api/run/: 404, so the queue's per-visitor bounds hold."""
        with httpx.Client(transport=loopback(self.fresh_address()), timeout=30) as http:
            codes = [http.post(f"{self.api}/run/compare", json={"data": ["hi", 2, 4, 0.0, 1.0, 0, None, None]}).status_code
                     for _ in range(20)]
        return {"requests": len(codes), "refused": codes.count(404), "ok": codes.count(404) == len(codes)}


THIRD_PASS = ("file_routes", "parallel_uploads", "replay_storm", "lane_tokens", "session_ids", "direct_run")


def run(runner, server, work: Path) -> dict:
    """Every group, or those named by the load test's `--attacks`."""
    attacks = Attacks(runner, server, work)
    out = {}
    groups = (("crafted_uploads", attacks.crafted), ("frame_costs", attacks.frame_costs),
              ("cross_session", attacks.cross_session), ("pause_and_leave", attacks.pause_and_leave),
              ("mcp", attacks.mcp), ("renewed_pause", attacks.renewed_pause),
              ("queue_hog", attacks.queue_hog), ("unread_replays", attacks.unread_replays),
              ("url_inputs", attacks.url_inputs), ("upload_flood", attacks.upload_flood),
              ("orphan", attacks.orphan),
              *((name, lambda name=name: attacks.beside_attack(getattr(attacks, name))) for name in THIRD_PASS))
    chosen = getattr(runner.args, "attacks", None)
    try:
        for name, case in groups:
            if chosen and name not in chosen.split(","):
                continue
            try:
                out[name] = case()
            except Exception as exc:  # noqa: BLE001 - the group failed; the others still run
                out[name] = {"aborted": f"{type(exc).__name__}: {exc}"}
    finally:
        attacks.close_victim()
    return out


class Page:
    """A browser page imitated over HTTP: it starts a race in a session of its own and reads the
    race's event stream in a thread until it `leave`s."""

    def __init__(self, attacks: Attacks, prompt: str, max_new_tokens: int):
        self.attacks, self.api = attacks, attacks.api
        self.session = uuid.uuid4().hex[:11]
        self.http = httpx.Client(timeout=attacks.args.request_timeout_s)
        # None: no added lanes, the default pair, its default thinking setting
        data = [prompt, max_new_tokens, attacks.args.block_size, 0.0, 1.0, 0, None, None, None]
        joined = self.http.post(f"{self.api}/queue/join", json={
            "data": data, "fn_index": attacks.fn_index("run", "compare"), "session_hash": self.session, "trigger_id": None,
        })
        joined.raise_for_status()
        self.tokens = threading.Event()
        self.paused_frames = 0
        self._left = False
        self._response = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self.tokens.wait(attacks.args.request_timeout_s):
            raise AssertionError("the race showed no token")

    def _read(self) -> None:
        try:
            with self.http.stream("GET", f"{self.api}/queue/data", params={"session_hash": self.session}) as events:
                self._response = events
                for line in events.iter_lines():
                    if self._left:
                        return
                    if 'class=\\"tok ' in line:
                        self.tokens.set()
                    if "Paused" in line:
                        self.paused_frames += 1
        except Exception:  # noqa: BLE001 - the page left (its stream was closed under the reader)
            pass

    def pause(self) -> None:
        answer = self.http.post(f"{self.api}/run/predict", json={
            "data": [], "fn_index": self.attacks.fn_index("pause"), "session_hash": self.session,
        })
        answer.raise_for_status()

    def leave(self) -> None:
        """Close the page: its event stream ends (Gradio then ends the session's running events)."""
        self._left = True
        if self._response is not None:
            self._response.close()
        self.http.close()
        self._reader.join(10)


def main(argv=None) -> None:
    """The frame-cost group alone, against a replay-only app (no model): one JSON line."""
    import load_test  # beside this file; it imports this module for the full security round

    parser = argparse.ArgumentParser(description="crafted traces against a replay-only app")
    parser.add_argument("--max-replay-s", type=int, default=20, help="passed to the app")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="dflash-frames-"))
    # A fifth replay slot for the visitor measured beside four hostile replays.
    app_args = ["--replay", str(SHIPPED), "--max-replay-s", str(args.max_replay_s), "--replay-concurrency", "5"]
    server = load_test.Server(app_args, work / "app.log")
    out: dict = {"app_args": " ".join(app_args)}
    try:
        server.wait_ready(300)
        out["rss_start_mb"] = round(server.rss() / 2**20, 1)
        runner = SimpleNamespace(url=server.url, args=args, check_time=lambda: None)
        out["frame_costs"] = Attacks(runner, server, work).frame_costs()
    finally:
        out["rss_peak_mb"] = round(server.peak_rss / 2**20, 1)
        server.stop()
    line = json.dumps(out)
    print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
