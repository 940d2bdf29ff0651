"""A thin client of a vLLM OpenAI-compatible server that yields this engine's events (`events.py`).

The app races a vLLM server's DFlash against its plain decoding with the same race and panes as
its own engine: `stream(...)` sends one streamed chat completion and yields `Prefill`, one `Block`
per streamed chunk, then a `Summary`. Times are wall seconds since the request was sent: the
server's compute is not visible from here, and a remote server decodes on its own machine.

`complete(...)` reads one completion to its end instead: the prompt ids the server's template
made, the output ids and vLLM's per-request record as sent (the doctor's server checks).

What vLLM reports, and so what the events carry (vLLM 0.32.0, `--per-request-spec-decode-metrics
detailed`): the output token ids (`return_token_ids`), and in the final usage chunk the number of
drafts each verify step accepted, in order. The `Summary` rebuilds its blocks from that record, so
its acceptance is vLLM's own. While streaming, a block is one chunk (vLLM sends one per engine
step, its accepted drafts and the bonus, unless the client falls behind and chunks merge), so its
acceptance is provisional. vLLM does not report the rejected draft tokens, the drafter's or the
target's probabilities, or how long drafting and verifying took: `draft_ids` holds the accepted
drafts only, `explain` is None, and `verify_s` is the whole step's wall time.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ..errors import DFlashError
from ..events import Block, Prefill, Summary

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 300.0  # a CPU server's first request can sit behind its warm-up


class VllmServerError(DFlashError):
    """The server cannot be reached, serves another model, or answered with an error."""


@dataclass(frozen=True)
class ServedModel:
    url: str
    name: str  # the id requests must name
    root: str | None  # where the server loaded it from (a local directory on a loopback server)
    max_model_len: int | None


def plain_url_of(url: str) -> str:
    """The plain server next to `url`, as scripts/serve_vllm.sh starts it: the port after URL's."""
    parts = urlsplit(url)
    if parts.port is None:
        raise ValueError(f"{url} has no port: give the plain server with --vllm-plain-url")
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port + 1}"))


def served_model(url: str, model: str | None = None) -> ServedModel:
    """What the server at `url` serves (its `/v1/models`): `model` if named, else its only model."""
    import httpx

    base = url.rstrip("/")
    try:
        answer = httpx.get(f"{base}/v1/models", timeout=CONNECT_TIMEOUT_S)
        answer.raise_for_status()
        models = answer.json()["data"]
    except httpx.HTTPError as exc:
        raise VllmServerError(f"no vLLM server answers at {base} ({exc}). Start one with "
                              "`bash scripts/serve_vllm.sh` and check the URL.") from None
    except (ValueError, KeyError, TypeError):
        raise VllmServerError(f"{base}/v1/models did not answer as an OpenAI-compatible server does") from None
    names = [m.get("id") for m in models]
    if model is None and len(models) == 1:
        model = names[0]
    if model not in names:
        raise VllmServerError(f"{base} serves {', '.join(map(str, names)) or 'no model'}, not {model!r}")
    entry = models[names.index(model)]
    return ServedModel(base, model, entry.get("root"), entry.get("max_model_len"))


def stream(server: ServedModel, prompt: str, *, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
           seed: int | None = None, block_size: int = 1) -> Iterator[Prefill | Block | Summary]:
    """The events of one chat completion of `prompt` (the server applies its chat template).

    The request is sent now, in a reader thread, so that two streams started one after the other
    decode at the same time, each timed from its own start. block_size: the server's speculative
    block (K + 1; 1 for plain decoding), which the summary reports.
    """
    body = _body(server, prompt, max_new_tokens, temperature, top_p, seed)
    chunks: queue.Queue = queue.Queue()
    start = time.perf_counter()
    threading.Thread(target=_read, args=(f"{server.url}/v1/chat/completions", body, chunks), daemon=True).start()
    return _events(chunks, start, block_size)


SPEC_COUNTERS = {  # vLLM 0.32's /metrics counters of speculative decoding (vllm/v1/spec_decode/metrics.py)
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")  # name{labels} value (Prometheus text format)
_POSITION = re.compile(r'position="([^"]*)"')


@dataclass(frozen=True)
class SpecCounters:
    """A server's speculative-decoding counters at one moment, summed over its engines: verify
    steps (drafts), draft tokens proposed, drafts accepted, and K (its draft positions)."""

    drafts: float
    draft_tokens: float
    accepted: float
    positions: int

    def acceptance_length(self, since: SpecCounters) -> float | None:
        """Tokens committed per verify step between `since` and now (`1 + accepted / drafts`), the
        bonus included as tau counts it; None when no step ran."""
        drafts = self.drafts - since.drafts
        return 1 + (self.accepted - since.accepted) / drafts if drafts > 0 else None


def spec_counters(server: ServedModel) -> SpecCounters | None:
    """The server's counters from its Prometheus `/metrics` page; None where it has none (a plain server)."""
    import httpx

    try:
        answer = httpx.get(f"{server.url}/metrics", timeout=CONNECT_TIMEOUT_S)
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        raise VllmServerError(f"{server.url}/metrics did not answer ({exc})") from None
    sums: dict[str, float] = {}
    positions = set()
    for line in answer.text.splitlines():
        sample = _SAMPLE.match(line)
        if sample is None:  # a comment, a blank line
            continue
        name, labels, value = sample.groups()
        if name == PER_POSITION:
            position = _POSITION.search(labels or "")
            positions.add(position.group(1) if position else "")
        elif name in SPEC_COUNTERS.values():
            sums[name] = sums.get(name, 0.0) + float(value)
    if not sums:
        return None
    return SpecCounters(*(sums.get(name, 0.0) for name in SPEC_COUNTERS.values()), positions=len(positions))


@dataclass(frozen=True)
class Completion:
    """One chat completion as the server reported it: the prompt ids its template made, the output
    ids, and vLLM's per-request speculative-decoding record (None from a server without
    `--per-request-spec-decode-metrics`, or a plain one)."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: str | None
    spec: dict | None

    @property
    def num_speculative_tokens(self) -> int | None:
        """K, from the record's histogram of accepted drafts per step (one entry for each of 0..K)."""
        histogram = (self.spec or {}).get("acceptance_histogram")
        return len(histogram) - 1 if histogram else None


def complete(server: ServedModel, prompt: str, *, max_new_tokens: int, template_args: dict | None = None) -> Completion:
    """One greedy chat completion of `prompt`, read to its end in this thread.

    template_args: the chat template's keyword arguments (e.g. `{"enable_thinking": False}`), sent
    as vLLM's `chat_template_kwargs` so the server builds the prompt this engine builds.
    """
    body = _body(server, prompt, max_new_tokens, 0.0, 1.0, None)
    if template_args:
        body["chat_template_kwargs"] = dict(template_args)
    chunks: queue.Queue = queue.Queue()
    _read(f"{server.url}/v1/chat/completions", body, chunks)
    prompt_ids, ids, finish, spec = (), [], None, None
    for _, chunk in _received(chunks):
        prompt_ids = tuple(chunk.get("prompt_token_ids") or ()) or prompt_ids
        spec = _spec_record(chunk) or spec
        for choice in chunk.get("choices") or ():
            finish = choice.get("finish_reason") or finish
            ids.extend(int(t) for t in choice.get("token_ids") or ())
    return Completion(prompt_ids, tuple(ids), finish, spec)


def _body(server: ServedModel, prompt: str, max_new_tokens: int, temperature: float, top_p: float,
          seed: int | None) -> dict:
    """A streamed chat completion request that returns token ids and, last, the usage chunk with vLLM's metrics."""
    body = {"model": server.name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_new_tokens,
            "temperature": temperature, "top_p": top_p, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    return body


def _spec_record(chunk: dict) -> dict | None:
    return (chunk.get("metrics") or {}).get("speculative_decoding")


def _read(url: str, body: dict, chunks: queue.Queue) -> None:
    """Puts (arrival seconds, chunk dict) per server-sent event, then (time, None); an exception instead on failure."""
    import httpx

    try:
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        with httpx.stream("POST", url, json=body, timeout=timeout) as answer:
            if answer.status_code != 200:
                answer.read()
                raise VllmServerError(f"{url} answered {answer.status_code}: {_error_text(answer)}")
            for line in answer.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                chunks.put((time.perf_counter(), json.loads(data)))
        chunks.put((time.perf_counter(), None))
    except VllmServerError as exc:
        chunks.put((time.perf_counter(), exc))
    except Exception as exc:  # noqa: BLE001 - a dropped connection or bad JSON reaches the race as a message
        chunks.put((time.perf_counter(), VllmServerError(f"the stream from {url} broke: {exc}")))


def _error_text(answer) -> str:
    try:
        return str(answer.json().get("error", {}).get("message") or answer.text)[:500]
    except ValueError:
        return answer.text[:500]


def _received(chunks: queue.Queue) -> Iterator[tuple[float, dict]]:
    """The (arrival seconds, chunk) pairs `_read` put, to the end of the stream; a failure it put is raised."""
    while True:
        at, chunk = chunks.get()
        if isinstance(chunk, Exception):
            raise chunk
        if chunk is None:
            return
        yield at, chunk


def _events(chunks: queue.Queue, start: float, block_size: int) -> Iterator[Prefill | Block | Summary]:
    prompt_len, ids = 0, []
    prefill, blocks, finish, spec = None, [], None, None
    stamps = []
    for at, chunk in _received(chunks):
        prompt_len = len(chunk.get("prompt_token_ids") or ()) or prompt_len
        spec = _spec_record(chunk) or spec
        for choice in chunk.get("choices") or ():
            finish = choice.get("finish_reason") or finish
            new = [int(t) for t in choice.get("token_ids") or ()]
            if not new:
                continue
            seconds = at - start
            if prefill is None:
                prefill = Prefill(prompt_len, new[0], seconds)
                yield prefill
                new = new[1:]
                ids.append(prefill.token_id)
                if not new:
                    continue
            block = _block(len(blocks), prompt_len + len(ids) - 1, new, min(len(new) - 1, block_size - 1),
                           seconds, seconds - (stamps[-1] if stamps else prefill.seconds))
            blocks.append(block)
            stamps.append(seconds)
            ids.extend(new)
            yield block
    if prefill is None:
        raise VllmServerError("the server finished the request without a token")
    total = time.perf_counter() - start if not stamps else max(stamps[-1], prefill.seconds)
    steps = (spec or {}).get("per_step_accepted")
    if steps is not None:
        blocks = _blocks_from_steps(prompt_len, ids, steps, blocks, prefill.seconds)
    reason = {"length": "max_new_tokens", "stop": "stop_token"}.get(finish, "max_new_tokens")
    yield Summary(tuple(ids), prompt_len, block_size, reason, prefill, tuple(blocks), total_s=total)


def _block(index: int, position: int, committed: list[int], accepted: int, elapsed: float, step_s: float) -> Block:
    # slot 0 is the previous token; the accepted drafts are the first committed ids, the rest unknown.
    return Block(index=index, position=position, draft_ids=tuple(committed[:accepted]), accepted=accepted,
                 bonus_id=committed[accepted], committed_ids=tuple(committed), draft_s=0.0, verify_s=step_s,
                 elapsed_s=elapsed)


def _blocks_from_steps(prompt_len: int, ids: list[int], steps: list[int], streamed: list[Block],
                       prefill_s: float) -> list[Block]:
    """The blocks of vLLM's per-step record: step i committed steps[i] accepted drafts and a bonus.

    Each block's time is that of the streamed chunk its last token arrived in.
    """
    arrival = [prefill_s]  # per output token: when the chunk with it arrived
    for b in streamed:
        arrival.extend([b.elapsed_s] * len(b.committed_ids))
    blocks, at = [], 1
    for accepted in [*steps, *([0] * len(ids))]:  # tokens beyond the record (none expected): one per step
        if at >= len(ids):
            break
        committed = ids[at : at + accepted + 1]  # the last step may be cut at the limit or a stop token
        end = at + len(committed) - 1
        accepted = min(accepted, len(committed) - 1)
        previous = blocks[-1].elapsed_s if blocks else prefill_s
        blocks.append(_block(len(blocks), prompt_len + at - 1, committed, accepted, arrival[end], arrival[end] - previous))
        at += len(committed)
    return blocks
