"""Training data from a chat dataset: its prompts, from the Hub or a folder, answered by the target.

A drafter learns the target's own continuations (docs/design.md §5), so a dataset's answers are
replaced by the target's greedy ones. The prompts come through `datasets.load_dataset` (a Hub id,
or a local folder or file in the Hub layout) in one of three formats (`PRESETS`): ShareGPT's
`conversations` (`from`/`value` turns), UltraChat's `messages` (`role`/`content`), or a plain
`prompt` column. A conversation gives its first user turn (and a system turn before it); the
target's chat template, with `[target] chat_template_kwargs` (thinking on or off as the target will
be served), makes the prompt ids.

Three engines answer (`[data] engine`): transformers' `generate` in this process; vLLM's offline
batch engine, in its own venv (`scripts/vllm_regenerate.py` in a subprocess; the same code runs
data-parallel on GPUs); or any OpenAI-compatible server (`server = URL`: vLLM, SGLang), sent the
prompt ids. The answers go into `[data] path` as shards in the datagen format (`datagen.py`),
keyed by a hash of the prompt; a rerun skips the prompts already in a shard, so a killed run
loses at most the shard in progress.

    python -m dflash_core.training regenerate configs/qwen3-8b-paper.toml data.limit=2000
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import DatasetError

PRESETS = {"sharegpt": "conversations", "ultrachat": "messages", "prompt": "prompt"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
VLLM_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_regenerate.py"


@dataclass(frozen=True)
class ChatPrompt:
    id: str  # stable: a hash of the messages, so a reordered or grown dataset keeps its ids
    messages: tuple[tuple[str, str], ...]  # (role, content), ending with the user's turn

    def as_dicts(self) -> list[dict]:
        return [{"role": role, "content": content} for role, content in self.messages]


# ------------------------------------------------------------------------------------ prompts


def first_user_turn(turns: list[tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
    """A system turn, if the conversation opens with one, and the first user turn; None without one."""
    out = []
    for role, content in turns:
        if role == "system" and not out:
            out.append((role, content))
        elif role == "user":
            return (*out, (role, content)) if content.strip() else None
        elif role != "system":
            return None  # the assistant speaks first: nothing for the target to answer
    return None


def row_messages(row: dict, preset: str) -> tuple[tuple[str, str], ...] | None:
    """The (role, content) turns to answer from one dataset row of `preset`'s format."""
    if preset == "prompt":
        text = row.get("prompt")
        return (("user", text),) if isinstance(text, str) and text.strip() else None
    if preset == "sharegpt":
        turns = [(SHAREGPT_ROLES.get(str(t.get("from", "")).lower(), "?"), str(t.get("value", "")))
                 for t in row.get("conversations") or ()]
    else:
        turns = [(str(t.get("role", "")), str(t.get("content", ""))) for t in row.get("messages") or ()]
    return first_user_turn(turns)


def detect_preset(columns, dataset: str) -> str:
    for preset, column in PRESETS.items():
        if column in columns:
            return preset
    known = ", ".join(f"{c} ({p})" for p, c in PRESETS.items())
    raise DatasetError(f"{dataset}: no column of a known format ({known});"
                       f" it has {', '.join(columns)}")


def _open(dataset: str, split: str):
    try:
        from datasets import load_dataset
    except ImportError:
        raise DatasetError("chat datasets load through Hugging Face datasets: "
                           "pip install -r requirements-train.txt") from None
    path = Path(dataset)
    try:
        if path.is_file():
            kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
            if kind is None:
                raise DatasetError(f"{dataset}: a file must be .jsonl, .json, .parquet or .csv")
            return load_dataset(kind, data_files=str(path), split="train")
        return load_dataset(dataset, split=split)
    except (FileNotFoundError, ValueError, ConnectionError) as exc:
        raise DatasetError(f"{dataset} split {split!r} could not be loaded ({type(exc).__name__}: {exc})") from None


def load_chat_prompts(dataset: str, preset: str | None = None, split: str = "train",
                      limit: int | None = None) -> tuple[list[ChatPrompt], str]:
    """The distinct prompts of `dataset` (first `limit`), and the preset read."""
    rows = _open(dataset, split)
    preset = preset or detect_preset(rows.column_names, dataset)
    if PRESETS[preset] not in rows.column_names:
        raise DatasetError(f"{dataset}: preset {preset!r} reads the column {PRESETS[preset]!r}; the dataset has "
                           f"{', '.join(rows.column_names)}")
    prompts, seen = [], set()
    for row in rows:
        messages = row_messages(row, preset)
        if messages is None:
            continue
        key = hashlib.sha1(json.dumps(messages).encode()).hexdigest()[:16]
        if key not in seen:
            seen.add(key)
            prompts.append(ChatPrompt(f"{preset}:{key}", messages))
            if limit and len(prompts) >= limit:
                break
    if not prompts:
        raise DatasetError(f"{dataset} split {split!r}: no row with a user turn to answer ({preset} format)")
    return prompts, preset


# ------------------------------------------------------------------------------------ engines


def end_of_answer(ids: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """The answer up to and including its first end-of-turn token, and whether it has one."""
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[: i + 1], True
    return ids, False


def transformers_answers(model_dir: str, dtype: str, prompts: list[list[int]], max_new_tokens: int,
                         batch_size: int) -> Iterator[tuple[int, list[int]]]:
    """(index, answer ids) per prompt from transformers' greedy `generate`, in length-sorted batches."""
    from .datagen import _eos_pad, generate_batch, load_target

    model, tok, _ = load_target(model_dir, dtype)
    eos, pad = _eos_pad(tok)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for b in range(0, len(order), batch_size):
        part = order[b : b + batch_size]
        for i, (answer, _) in zip(part, generate_batch(model, [prompts[i] for i in part], max_new_tokens, eos, pad)):
            yield i, answer


def vllm_answers(model_dir: str, dtype: str, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                 threads: int | None = None, eager: bool = False, workdir: str | None = None,
                 max_model_len: int = 4096, replicas: int = 1) -> Iterator[tuple[int, list[int]]]:
    """(index, answer ids) per prompt from vLLM's offline engine, run in its venv, as its batches end.

    `replicas` > 1: data parallelism, one engine per GPU (`CUDA_VISIBLE_DEVICES`), each answering every
    replicas-th prompt."""
    from ..bench.venv_peer import log_tail
    from ..bench.vllm_peer import subprocess_env, vllm_python

    with tempfile.TemporaryDirectory(prefix="dflash-regenerate-", dir=workdir) as tmp:
        runs = []  # (process, its answers file, its log, the global index of each of its prompts, command)
        try:
            for r in range(replicas):
                mine = list(range(r, len(prompts), replicas))
                prompts_file, out, log = (Path(tmp, f"{name}-{r}{ext}") for name, ext in
                                          (("prompts", ".json"), ("answers", ".jsonl"), ("vllm", ".log")))
                prompts_file.write_text(json.dumps([prompts[i] for i in mine]))
                out.touch()
                cmd = [str(vllm_python()), str(VLLM_SCRIPT), "--target", str(model_dir), "--prompts",
                       str(prompts_file), "--out", str(out), "--max-tokens", str(max_new_tokens), "--dtype", dtype,
                       "--batch-size", str(batch_size), "--max-model-len", str(max_model_len)]
                if threads:
                    cmd += ["--threads", str(threads)]
                if eager:
                    cmd.append("--eager")
                env = subprocess_env(threads)
                if replicas > 1:
                    env["CUDA_VISIBLE_DEVICES"] = str(r)
                with open(log, "w") as log_file:
                    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
                runs.append((proc, open(out), log, mine, cmd))
            live, partial = list(range(replicas)), [""] * replicas  # a line still being written waits whole
            while live:
                idle = True
                for r in list(live):
                    proc, answers, _, mine, _ = runs[r]
                    exited = proc.poll() is not None
                    *lines, partial[r] = (partial[r] + answers.read()).split("\n")
                    for line in lines:
                        row = json.loads(line)
                        idle = False
                        yield mine[row["i"]], row["token_ids"]
                    if exited:
                        live.remove(r)
                if idle:
                    time.sleep(0.5)
        finally:
            for proc, answers, *_ in runs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
                answers.close()
        for proc, _, log, _, cmd in runs:
            if proc.returncode != 0:
                raise DatasetError(f"vLLM failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                                   f"{log_tail(log.read_text())}")


def server_answers(url: str, prompts: list[list[int]], max_new_tokens: int, concurrency: int,
                   tokenizer) -> Iterator[tuple[int, list[int]]]:
    """(index, answer ids) per prompt from an OpenAI-compatible server's `/v1/completions`, sent the
    prompt ids; the answer's ids as the server returns them (vLLM's `return_token_ids`), else its text
    tokenized again."""
    import httpx

    from ..vllm.client import served_model

    server = served_model(url.rstrip("/"))

    def complete(i: int) -> tuple[int, list[int]]:
        body = {"model": server.name, "prompt": prompts[i], "max_tokens": max_new_tokens, "temperature": 0.0,
                "return_token_ids": True, "skip_special_tokens": False}
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600.0)
        if response.status_code != 200:
            raise DatasetError(f"{server.url} answered {response.status_code}: {response.text[:300]}")
        choice = response.json()["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            ids = tokenizer.encode(choice["text"], add_special_tokens=False)
            if choice.get("finish_reason") == "stop" and tokenizer.eos_token_id is not None:
                ids.append(tokenizer.eos_token_id)
        return i, [int(t) for t in ids]

    with ThreadPoolExecutor(concurrency) as pool:
        yield from pool.map(complete, range(len(prompts)))


# ------------------------------------------------------------------------------------ the step


def regenerate(config, source: str = "config") -> dict:
    """Answer `config.data.dataset`'s prompts with the target into shards in `config.data.path`;
    returns what ran: prompts answered, answer tokens, seconds, tokens/s."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from ..loading.default_target import resolve_target
    from ..loading.prompting import encode_chat
    from .datagen import _eos_pad, _next_shard_index, _write_shard, done_prompt_ids

    d = config.data
    if not d.dataset:
        raise DatasetError(f"{source}: regenerate needs data.dataset (a Hub id or a local folder)")
    prompts, preset = load_chat_prompts(d.dataset, d.preset, d.split, d.limit)
    out = Path(d.path)
    out.mkdir(parents=True, exist_ok=True)
    done = done_prompt_ids(out)
    todo = [p for p in prompts if p.id not in done]
    print(f"[regenerate] {len(prompts)} prompts ({preset}) from {d.dataset}, {len(prompts) - len(todo)} already "
          f"answered in {out}, {len(todo)} to go with {d.engine}", file=sys.stderr, flush=True)
    if not todo:
        return {"prompts": 0, "tokens": 0, "seconds": 0.0, "tok_per_s": None}
    model_dir = str(resolve_target(config.target.model))
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos, _ = _eos_pad(tok)
    eos_ids = {eos} | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    template_args = dict(config.target.chat_template_kwargs) or None
    ids = [encode_chat(tok, p.as_dicts(), template_args) for p in todo]
    # A prompt that fills data.max_len leaves no answer to train on (sequences are cut there).
    fits = [i for i, x in enumerate(ids) if len(x) <= d.max_len - 2]
    if len(fits) < len(todo):
        print(f"[regenerate] {len(todo) - len(fits)} prompts longer than data.max_len - 2 = {d.max_len - 2} tokens "
              "skipped", file=sys.stderr, flush=True)
        todo, ids = [todo[i] for i in fits], [ids[i] for i in fits]
    meta = {"model": model_dir, "dtype": config.target.dtype, "max_new_tokens": d.max_new_tokens, "greedy": True,
            "chat_template": True, "chat_template_kwargs": template_args, "dataset": d.dataset, "preset": preset,
            "split": d.split, "engine": d.engine}
    if d.engine == "transformers":
        answers = transformers_answers(model_dir, config.target.dtype, ids, d.max_new_tokens, d.batch_size)
    elif d.engine == "vllm":
        answers = vllm_answers(model_dir, config.target.dtype, ids, d.max_new_tokens, d.batch_size,
                               config.optimization.threads, eager=d.eager,
                               max_model_len=d.max_len + d.max_new_tokens,
                               replicas=d.data_parallel_size)
    else:
        answers = server_answers(d.server, ids, d.max_new_tokens, d.batch_size, tok)

    pending, tokens, t0 = [], 0, time.perf_counter()
    first = None  # (time, tokens) when the first batch was in: the engine's start-up is behind it
    answered = 0
    bar = tqdm(total=len(todo), unit="prompt", file=sys.stderr, dynamic_ncols=True, mininterval=5)

    def flush():
        path = out / f"shard-{_next_shard_index(out):05d}.npz"
        _write_shard(path, pending, meta)
        print(f"[regenerate] wrote {path.name}: {len(pending)} answers", file=sys.stderr, flush=True)
        pending.clear()

    for i, answer in answers:
        answer, finished = end_of_answer(list(answer), eos_ids)
        pending.append({"pid": todo[i].id, "ids": ids[i] + answer, "plen": len(ids[i]), "finished": finished})
        tokens, answered = tokens + len(answer), answered + 1
        if answered == min(d.batch_size, len(todo)):
            first = (time.perf_counter(), tokens)
        bar.update(1)
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
        if len(pending) >= d.shard_size:
            flush()
    if pending:
        flush()
    bar.close()
    seconds = time.perf_counter() - t0
    summary = {"prompts": len(todo), "tokens": tokens, "seconds": round(seconds, 1), "tok_per_s": tokens / seconds}
    # Answers come a batch at a time: past the first batch, the engine's rate without its start-up.
    steady_s = time.perf_counter() - first[0]
    summary["first_batch_s"] = round(first[0] - t0, 1)
    summary["tok_per_s_after_first_batch"] = (tokens - first[1]) / steady_s if answered > d.batch_size else None
    print(f"[regenerate] {json.dumps(summary)}", file=sys.stderr, flush=True)
    return summary
