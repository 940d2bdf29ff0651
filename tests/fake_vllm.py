"""A fake vLLM 0.32 OpenAI-compatible server in the test process: /v1/models, streamed
/v1/chat/completions with token ids, and /metrics with the speculative-decoding counters.

Each request answers `max_tokens` ids made from the prompt text, one verify step per `block` ids
with `accepted` drafts each (a speculating server adds them to its counters), after `delay_s` per
token. It counts the requests it serves at once (`most_at_once`); with `gather` (a
`threading.Barrier`) set, each request waits for as many others as the barrier has parties (or 2 s),
so a test sees exactly the concurrency a client reaches.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeVllm:
    def __init__(self, model="tiny", k: int | None = None, accepted: int = 1, delay_s: float = 0.0, corrupt=(),
                 root: str = "/tiny", vocab_size: int = 1000):
        """k: the draft tokens per step (None: a plain server, no counters); corrupt: prompts whose
        first output id this server changes; root: the model directory it reports (the app reads the
        tokenizer there); vocab_size: its output ids stay below it."""
        self.model, self.k, self.accepted, self.delay_s, self.corrupt = model, k, accepted, delay_s, set(corrupt)
        self.root, self.vocab_size = root, vocab_size
        self.lock = threading.Lock()
        self.gather: threading.Barrier | None = None
        self.at_once = self.most_at_once = self.served = 0
        self.spans: list[tuple[float, float]] = []  # (start, end) of each request served, perf_counter seconds
        self.drafts = self.draft_tokens = self.accepted_total = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: str, kind="application/json"):
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/metrics":
                    self._send(fake.metrics(), "text/plain")
                else:
                    self._send(json.dumps({"data": [{"id": fake.model, "root": fake.root, "max_model_len": 512}]}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(fake.answer(body), "text/event-stream")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def output_of(self, prompt: str, n: int) -> list[int]:
        seed = zlib.crc32(prompt.encode())
        return [(seed + 7 * i) % self.vocab_size for i in range(n)]

    def answer(self, body: dict) -> str:
        prompt, n = body["messages"][-1]["content"], body["max_tokens"]
        start = time.perf_counter()
        with self.lock:
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
        if self.gather is not None:
            try:
                self.gather.wait(timeout=2.0)
            except threading.BrokenBarrierError:  # fewer came: most_at_once tells the test
                pass
        time.sleep(self.delay_s * n)
        out = self.output_of(prompt, n)
        if prompt in self.corrupt:
            out[0] += 1
        with self.lock:
            self.at_once -= 1
            self.served += 1
            self.spans.append((start, time.perf_counter()))
            if self.k is not None:  # one verify step per accepted + 1 tokens after the prefill's first
                steps = -(-(n - 1) // (self.accepted + 1))
                self.drafts += steps
                self.draft_tokens += steps * self.k
                self.accepted_total += n - 1 - steps
        chunks = [{"prompt_token_ids": [1, 2, 3], "choices": [{"token_ids": out[:1]}]},
                  {"choices": [{"token_ids": out[1:], "finish_reason": "length"}]}]
        return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    def metrics(self) -> str:
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {float(self.at_once)}']
        if self.k is not None:
            labels = f'engine="0",model_name="{self.model}"'
            lines += ["# TYPE vllm:spec_decode_num_drafts_total counter",
                      f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(self.drafts)}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(self.draft_tokens)}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(self.accepted_total)}",
                      f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e+09"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} 0.0'
                      for i in range(self.k)]
        return "\n".join(lines) + "\n"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
