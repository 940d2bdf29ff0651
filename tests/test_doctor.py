"""The acceptance doctor names each cause on pairs broken one way at a time, and passes healthy pairs.

Tau-based probes need a drafter that accepts by construction: the golden pair (tests/golden, a
drafter trained on its target: tau near 4 at block 8 on its first two prompts) for the layer and
RoPE probes, and an oracle that knows the target's continuations of thinking-off prompts only for
the template check. Structural breakages (mask token, quantized weights, the draft vocabulary
map, a server's block size) use tiny random pairs and a vLLM-shaped HTTP stub on loopback. The
verdict functions are also tested on controlled numbers.
"""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import THINKING_CHATML, build_drafter, build_target

from dflash_core import Target, run
from dflash_core.doctor import DoctorPrompt, DoctorSettings, default_prompts, diagnose
from dflash_core.doctor.acceptance import Stated, acceptance_check, stated_acceptance
from dflash_core.doctor.measure import Measurement, clearly_better
from dflash_core.doctor.numerics import dtype_check
from dflash_core.doctor.quantization import quantization_grid
from dflash_core.doctor.server import server_tau_check
from dflash_core.doctor.template import template_check
from dflash_core.doctor.wiring import mask_candidates
from dflash_core.drafting import Proposal
from dflash_core.errors import DFlashError
from dflash_core.loading.chat_template import template_args
from dflash_core.loading.pair import fetch_target, load_drafter
from dflash_core.loading.prompting import encode_prompt

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "zlab-tiny-a"
MAX_NEW = 40


@pytest.fixture(scope="module")
def golden_target():
    return Target.from_pretrained(GOLDEN / "target")


@pytest.fixture(scope="module")
def golden_prompts():
    expected = json.loads((GOLDEN / "expected.json").read_text())
    # The first two: the drafter was trained on continuations like them (the third accepts nothing).
    return [DoctorPrompt(f"golden-{i}", ids=tuple(p["prompt_ids"])) for i, p in enumerate(expected["prompts"][:2])]


def doctor(target, drafter_dir, prompts, **settings):
    """`diagnose` as the CLI runs it: the drafter loaded in float32, or its load error reported."""
    drafter, error = None, None
    try:
        drafter = load_drafter(target, drafter_dir, torch.float32)
    except DFlashError as exc:
        error = str(exc)
    settings.setdefault("max_new_tokens", MAX_NEW)
    return diagnose(target, drafter_dir, prompts, drafter=drafter, load_error=error,
                    settings=DoctorSettings(**settings))


def broken_golden(tmp_path, config=None, weights=None) -> Path:
    """A copy of the golden drafter with `config(raw)` and `weights(name, tensor)` applied."""
    directory = tmp_path / "drafter"
    shutil.copytree(GOLDEN / "drafter", directory)
    if config is not None:
        raw = json.loads((directory / "config.json").read_text())
        config(raw)
        (directory / "config.json").write_text(json.dumps(raw))
    if weights is not None:
        state = load_file(directory / "model.safetensors")
        save_file({k: weights(k, v) for k, v in state.items()}, directory / "model.safetensors")
    return directory


def failed(report) -> dict[str, str]:
    return {c.id: c.cause for c in report.checks if c.status == "FAIL"}


def test_a_healthy_golden_pair_passes_every_check(golden_target, golden_prompts):
    report = doctor(golden_target, GOLDEN / "drafter", golden_prompts)
    assert {c.status for c in report.checks} <= {"PASS", "SKIP"}, report.lines()
    assert report.status == "PASS" and report.causes == []
    shift = report.check("wiring.layer_shift").numbers["tau_by_shift"]
    assert shift["0"] > 3.5 and shift["-1"] < 1.5 and shift["+1"] < 1.5  # the probe has something to see
    assert report.check("template").status == "SKIP"  # no tokenizer, no template
    assert all(c.explanation for c in report.checks)
    assert json.loads(report.to_json())["checks"][0]["id"] == "load"


def test_target_layer_ids_shifted_by_one_are_named(tmp_path, golden_target, golden_prompts):
    broken = broken_golden(tmp_path, config=lambda raw: raw["dflash_config"].update(target_layer_ids=[2, 4, 6]))
    report = doctor(golden_target, broken, golden_prompts)
    check = report.check("wiring.layer_shift")
    assert check.status == "FAIL" and check.cause == "target_layer_ids off by one (shift -1: [1, 3, 5])"
    assert check.numbers["tau_by_shift"]["-1"] > 3.5 and check.numbers["tau_by_shift"]["0"] < 1.5
    assert set(failed(report)) == {"wiring.layer_shift"}, report.lines()


def test_a_changed_rope_theta_is_named(tmp_path, golden_target, golden_prompts):
    broken = broken_golden(tmp_path, config=lambda raw: raw.update(rope_theta=100000.0))
    report = doctor(golden_target, broken, golden_prompts)
    check = report.check("wiring.rope")
    assert check.status == "FAIL" and "theta 10000 (the target's)" in check.cause, check.line()
    assert set(failed(report)) == {"wiring.rope"}, report.lines()


def test_rope_written_twice_is_read_from_both_fields(tmp_path, golden_target, golden_prompts):
    # The trained theta at the top level, another in rope_parameters (which transformers reads).
    def edit(raw):
        raw["rope_parameters"] = {"rope_theta": 1000000.0, "rope_type": "default"}

    report = doctor(golden_target, broken_golden(tmp_path, config=edit), golden_prompts)
    check = report.check("wiring.rope")
    assert check.status == "FAIL" and "rope_theta 10000 vs rope_parameters.rope_theta 1e+06" in check.summary
    assert "theta 10000 (rope_theta)" in check.cause


def test_a_mask_token_outside_the_vocabulary_is_named(tmp_path, golden_target, golden_prompts):
    broken = broken_golden(tmp_path, config=lambda raw: raw["dflash_config"].update(mask_token_id=512))
    report = doctor(golden_target, broken, golden_prompts)
    check = report.check("wiring.mask_token")
    assert check.status == "FAIL" and check.summary == "mask_token_id 512 is outside the vocabulary (0..511)"
    assert report.check("load").status == "FAIL" and "mask_token_id 512" in report.check("load").summary
    assert set(failed(report)) == {"load", "wiring.mask_token"}
    assert report.check("acceptance").status == "SKIP"


@pytest.fixture(scope="module")
def default_target() -> Target:
    return Target.from_pretrained(fetch_target("default:smollm2"), dtype=torch.float32)


@pytest.mark.slow
def test_a_wrong_mask_token_inside_the_vocabulary_is_named(tmp_path, default_target):
    """The shipped drafter was trained with id 16 ('<empty_output>'); id 0 ('<|endoftext|>') is inside
    the vocabulary, so only the probe tells them apart (tau 1.83 against 1.07 on these prompts)."""
    shipped = ROOT / "assets" / "drafters" / "smollm2-135m-instruct-dflash"
    # As trained, there is no other usual id to try: 16 is the highest spare special token.
    assert mask_candidates(default_target.tokenizer, default_target.vocab_size, 16) == {}
    directory = tmp_path / "drafter"
    directory.mkdir()
    raw = json.loads((shipped / "config.json").read_text())
    raw["dflash_config"]["mask_token_id"] = 0
    (directory / "config.json").write_text(json.dumps(raw))
    (directory / "model.safetensors").symlink_to(shipped / "model.safetensors")
    shutil.copy(shipped / "README.md", directory / "README.md")
    report = doctor(default_target, directory, default_prompts(directory, limit=2)[0], max_new_tokens=32)
    check = report.check("wiring.mask_token")
    assert check.status == "FAIL", check.summary
    assert check.cause == "wrong mask token (id 0; trained with 16)"
    assert "the drafter was trained with id 16 ('<empty_output>'), the highest-numbered special token" in check.summary
    assert check.numbers["tau_by_mask_id"]["16"] > check.numbers["tau"] + 0.3, check.summary
    assert set(failed(report)) <= {"wiring.mask_token", "acceptance"}, report.lines()


def _int8(name, w):
    if w.dim() != 2:
        return w
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    return (w / scale).round() * scale


def _fp8(name, w):
    return w.to(torch.float8_e4m3fn).to(w.dtype) if w.dim() == 2 else w


@pytest.mark.parametrize("cast,grid", [(_int8, "int8"), (_fp8, "fp8 e4m3")])
def test_a_drafter_cast_to_int8_or_fp8_and_back_is_named(tmp_path, golden_target, golden_prompts, cast, grid):
    report = doctor(golden_target, broken_golden(tmp_path, weights=cast), golden_prompts)
    check = report.check("numerics.quantized")
    assert check.status == "FAIL" and check.cause == "quantized drafter weights" and grid in check.summary
    assert len(check.numbers["drafter_tensors_quantized"]) == 15  # fc and every layer's 7 linears


def test_quantization_grids_are_told_apart_from_trained_weights():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.02
    for dtype in (torch.float32, torch.bfloat16):
        assert quantization_grid(w.to(dtype)) is None
        assert quantization_grid(_int8("", w).to(dtype)) == "int8 (one scale per row)"
        assert quantization_grid(_fp8("", w).to(dtype)) == "fp8 e4m3 (no scale)"
        scale = w.abs().max() / 448
        assert quantization_grid(((w / scale).to(torch.float8_e4m3fn).float() * scale).to(dtype)) == \
            "fp8 e4m3 (one scale per tensor)"
    blocks = w.reshape(-1, 32)
    low, step = blocks.amin(1, keepdim=True), (blocks.amax(1, keepdim=True) - blocks.amin(1, keepdim=True)) / 15
    q4 = (((blocks - low) / step).round() * step + low).reshape(64, 128)
    assert quantization_grid(q4) == "4-bit blocks of 32, a scale and a minimum each (like GGUF Q4_1 or Q4_K)"
    assert quantization_grid(torch.zeros(64, 128)) is None and quantization_grid(torch.ones(64, 128)) is None


@pytest.fixture(scope="module")
def tiny_vocab_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor-vocab")
    target_dir = build_target(root / "target")
    vocab = list(range(40, 200))
    return target_dir, build_drafter(root / "drafter", target_dir, block_size=4, draft_vocab=vocab)


def test_a_draft_vocabulary_map_off_by_one_is_named(tmp_path, tiny_vocab_dirs):
    target_dir, drafter_dir = tiny_vocab_dirs
    target = Target.from_pretrained(target_dir)
    prompts = [DoctorPrompt("p", text="What is the capital of France?")]
    healthy = doctor(target, drafter_dir, prompts, max_new_tokens=8)
    assert healthy.check("wiring.vocab_map").status == "PASS", healthy.check("wiring.vocab_map").line()
    assert "160 draft ids" in healthy.check("wiring.vocab_map").summary
    broken = tmp_path / "drafter"
    shutil.copytree(drafter_dir, broken)
    state = load_file(broken / "model.safetensors")
    state["d2t"] = state["d2t"] + 1  # every draft id now proposes the target id after its own
    save_file(state, broken / "model.safetensors")
    report = doctor(target, broken, prompts, max_new_tokens=8)
    check = report.check("wiring.vocab_map")
    assert check.status == "FAIL" and check.cause == "draft vocabulary map off by one (-1)", check.line()
    assert "160 of 160 lm_head rows differ" in check.summary


class ThinkingOffOracle:
    """A drafter good by construction for thinking-off prompts only: it proposes plain decoding's
    continuation of the prompts it was given (as a drafter trained on them would), and token 0 elsewhere."""

    method = "oracle"
    target_layer_ids = ()

    def __init__(self, plans: dict[tuple, list[int]], block_size: int):
        self.plans, self.block_size = plans, block_size

    def session(self, run):
        return _OracleSession(self, run)


class _OracleSession:
    target_layer_ids = ()

    def __init__(self, oracle, run):
        self.oracle, self.run = oracle, run

    def prefill(self, prompt_ids, bonus, context):
        self.plan, self.done = self.oracle.plans.get(tuple(prompt_ids)), 1

    def draft(self, bonus_ids, start, explain):
        n = self.run.block_size - 1
        ids = (self.plan or [])[self.done : self.done + n]
        ids = ids + [0] * (n - len(ids))
        return Proposal(torch.tensor(ids, device=self.run.target.device), None, 0)

    def advance(self, accepted, committed, features):
        self.done += len(committed)


@pytest.fixture(scope="module")
def thinking_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor-thinking")
    target_dir = build_target(root / "target", chat_template=THINKING_CHATML)
    return Target.from_pretrained(target_dir), build_drafter(root / "drafter", target_dir, block_size=4)


@pytest.mark.parametrize("used,status", [("on", "FAIL"), ("off", "PASS")])
def test_a_wrong_thinking_setting_is_named(thinking_pair, used, status):
    target, drafter_dir = thinking_pair
    texts = ["What is the capital of France?", "def add(a, b):", "Once upon a time"]
    off = template_args(target.tokenizer, "off")
    plans = {}
    for text in texts:
        ids = encode_prompt(target.tokenizer, text, template_args=off)
        plans[tuple(ids)] = list(run(target, ids, max_new_tokens=MAX_NEW + 4).output_ids)
    prompts = [DoctorPrompt(f"t{i}", text=t) for i, t in enumerate(texts)]
    report = diagnose(target, drafter_dir, prompts, drafter=ThinkingOffOracle(plans, 4),
                      settings=DoctorSettings(max_new_tokens=MAX_NEW, thinking=used))
    check = report.check("template")
    assert check.status == status, check.line()
    assert check.numbers["tau_thinking_off"] > 3.5 and check.numbers["tau_thinking_on"] < 1.2
    if status == "FAIL":
        assert check.cause == "wrong thinking setting: the drafter was trained with thinking off"
        assert set(failed(report)) == {"template"}
    else:
        assert "trained with thinking off, as used" in check.summary
    assert {report.check(i).status for i in ("numerics.dtype", "wiring.layer_shift", "wiring.rope")} == {"SKIP"}


def test_verdicts_on_controlled_numbers():
    assert clearly_better(3.0, 1.5) and not clearly_better(1.35, 1.1) and not clearly_better(2.2, 2.0)
    assert template_check("off", {"off": 1.2, "on": 3.1}).cause == \
        "wrong thinking setting: the drafter was trained with thinking on"
    assert template_check("off", {"off": 2.0, "on": 2.1}).status == "PASS"
    assert dtype_check("bfloat16", 1.5, 3.0).cause == "bfloat16 drafter numerics"
    assert dtype_check("bfloat16", 2.0, 2.2).status == "WARN" and dtype_check("bfloat16", 2.0, 2.05).status == "PASS"
    assert server_tau_check(1.3, 2.6, 4).cause == "the server, not the drafter: it accepts far less than this engine"
    assert server_tau_check(2.5, 2.6, 4).status == "PASS" and server_tau_check(None, 2.6, 4).status == "SKIP"
    m = Measurement(4, 100, 70, (0.4, 0.2, 0.1), (), ())
    assert acceptance_check(m, Stated(2.0)).status == "PASS"  # 70% of the stated gain
    assert acceptance_check(m, Stated(2.5)).status == "WARN"
    assert acceptance_check(m, Stated(3.0)).cause == "tau far below the card's 3.00"
    assert acceptance_check(Measurement(4, 100, 2, (0.02, 0, 0), (), ()), None).status == "WARN"


def test_the_shipped_card_states_its_tau():
    stated = stated_acceptance(ROOT / "assets" / "drafters" / "smollm2-135m-instruct-dflash")
    assert stated == Stated(1.668, "natural", 128, 4)


class VllmStub(BaseHTTPRequestHandler):
    """/v1/models and streamed /v1/chat/completions as vLLM 0.32 answers them (`vllm_client.py`)."""

    tokenizer = answers = None  # set per test: prompt ids -> (output ids, per_step_accepted, K)

    def log_message(self, *args):
        pass

    def _send(self, body: bytes, kind="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(json.dumps({"data": [{"id": "tiny", "root": "/tiny", "max_model_len": 512}]}).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = self.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True,
                                                    return_dict=False, **body.get("chat_template_kwargs", {}))
        out, steps, k = self.answers[tuple(prompt)]
        histogram = [steps.count(j) for j in range(k + 1)]
        record = {"acceptance_histogram": histogram, "num_spec_steps": len(steps),
                  "num_accepted_draft_tokens": sum(steps), "per_step_accepted": steps}
        chunks = [{"prompt_token_ids": prompt, "choices": [{"token_ids": out[:1]}]},
                  {"choices": [{"token_ids": out[1:], "finish_reason": "length"}]},
                  {"choices": [], "metrics": {"speculative_decoding": record}}]
        self._send("".join(f"data: {json.dumps(c)}\n\n" for c in [*chunks, "[DONE]"]).replace('"[DONE]"', "[DONE]")
                   .encode(), "text/event-stream")


@pytest.fixture(scope="module")
def stub_server(tiny_dirs):
    target_dir, drafter_dir = tiny_dirs
    target = Target.from_pretrained(target_dir)
    VllmStub.tokenizer = target.tokenizer
    server = ThreadingHTTPServer(("127.0.0.1", 0), VllmStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield target, drafter_dir, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("k,corrupt", [(7, False), (11, False), (7, True)])
def test_the_doctor_against_a_server(stub_server, k, corrupt):
    target, drafter_dir, url = stub_server
    drafter = load_drafter(target, drafter_dir, torch.float32)
    prompts = [DoctorPrompt("a", text="What is the capital of France?"), DoctorPrompt("b", text="def add(a, b):")]
    eos = [target.tokenizer.eos_token_id]
    VllmStub.answers = {}
    for p in prompts:
        ids = encode_prompt(target.tokenizer, p.text)
        out = list(run(target, ids, max_new_tokens=16, stop_ids=eos).output_ids)
        if corrupt:
            out[5] = (out[5] + 1) % target.vocab_size
        # The server accepted as this engine does: its own record of the same run.
        steps = [b.accepted for b in run(target, ids, drafter, max_new_tokens=16, stop_ids=eos).blocks]
        VllmStub.answers[tuple(ids)] = (out, steps, k)
    report = diagnose(target, drafter_dir, prompts, drafter=drafter,
                      settings=DoctorSettings(max_new_tokens=16, server=url))
    assert report.check("server.prompt_ids").status == "PASS"
    block, outputs = report.check("server.block_size"), report.check("server.outputs")
    if k == 7:
        assert block.status == "PASS" and block.summary.startswith("num_speculative_tokens 7 (block 8)")
    else:
        assert block.status == "FAIL" and block.cause == "server block 12 larger than the drafter's 8 (K should be 7)"
    assert report.check("server.tau").status == "PASS"
    tau = report.check("server.tau").numbers
    assert tau["server_tau"] == pytest.approx(tau["engine_tau"])
    if corrupt:
        assert outputs.status == "FAIL" and "DIVERGED at token 5" in outputs.summary
    else:
        assert outputs.status == "PASS" and outputs.summary.startswith("2/2 outputs identical")


def test_the_cli_prints_one_line_per_check_and_writes_the_json(tmp_path, capsys):
    from dflash_core.__main__ import main

    expected = json.loads((GOLDEN / "expected.json").read_text())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"g{i}", "prompt_ids": p["prompt_ids"]}) + "\n"
                               for i, p in enumerate(expected["prompts"][:2])))
    broken = broken_golden(tmp_path, config=lambda raw: raw["dflash_config"].update(target_layer_ids=[2, 4, 6]))
    out_json = tmp_path / "report.json"
    code = main(["doctor", "--target", str(GOLDEN / "target"), "--drafter", str(broken), "--prompts", str(prompts),
                 "--max-new-tokens", str(MAX_NEW), "--drafter-dtype", "float32", "--json", str(out_json)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 3
    assert any(line.startswith("FAIL  target_layer_ids probe: tau 1.") for line in lines), lines
    assert lines[-1].startswith("FAIL: ") and "target_layer_ids off by one" in lines[-1]
    report = json.loads(out_json.read_text())
    assert report["format"] == "dflash-doctor/1" and report["status"] == "FAIL"
    assert len(report["checks"]) == len(lines) - 2  # a header, one line per check, the verdict
