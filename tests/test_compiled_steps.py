"""Compiled steps (`compiled_steps.py`): torch.compile'd verify and draft steps decode token for
token as the eager ones, through inductor's merged GEMM templates on frozen weights or through
oneDNN-packed linears, and refuse what they cannot run."""

from __future__ import annotations

import os
import re
from unittest import mock

import pytest
import torch
from tiny import build_target
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._inductor.graph import GraphLowering
from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from dflash_core import SamplingParams, Target, load_pair, run
from dflash_core.__main__ import main as cli_main
from dflash_core.bench.__main__ import main as bench_main
from dflash_core.errors import ConfigError
from dflash_core.speed import compiled_steps
from dflash_core.speed.cpu_linear import PackedLinear
from dflash_core.speed.kernels import cpu_attention, cpu_rows


def decodes_as_eager(eager, compiled, drafter):
    """Plain decoding and DFlash (greedy and sampled) through `compiled` equal the eager target's."""
    for ids in ([5, 6, 7, 8, 9], [3, 1, 4, 1, 5, 9, 2, 6]):
        plain = run(eager, ids, None, max_new_tokens=24)
        assert run(compiled, ids, None, max_new_tokens=24).output_ids == plain.output_ids
        for sampling in (SamplingParams(), SamplingParams(temperature=0.9, seed=3)):
            a = run(eager, ids, drafter, max_new_tokens=24, sampling=sampling)
            b = run(compiled, ids, drafter, max_new_tokens=24, sampling=sampling)
            assert b.output_ids == a.output_ids and b.acceptance_lengths == a.acceptance_lengths
            if sampling.greedy:
                assert b.output_ids == plain.output_ids


def compiled_shapes(target) -> dict:
    """{input shapes of a StepGraphs key: compiled (not fallen back to eager)}."""
    return {tuple(tuple(s) for s, _, _ in key[1:]): entry is not None for key, entry in target.graphs.graphs.items()}


@pytest.mark.parametrize("rows_kernel", [
    pytest.param(True, marks=pytest.mark.skipif(cpu_rows.unsupported_reason() is not None,
                                                reason="no rows kernel here")),
    False,
])
def test_compiled_steps_decode_as_the_eager_ones(small_pair, monkeypatch, rows_kernel):
    eager, drafter = small_pair
    for module in eager.model.modules():
        if isinstance(module, PackedLinear):
            monkeypatch.setattr(module, "rows_kernel", rows_kernel and cpu_rows.available())
    torch._dynamo.reset()  # dynamo does not guard on module attributes: forget steps traced the other way
    compiled = Target(eager.model, static_cache=True, compiled=True, compile_gemms="library")
    packed_calls, codes = [], []
    packed_forward = PackedLinear.packed_forward

    def counted(self, x):
        packed_calls.append(x.shape[:-1].numel())
        return packed_forward(self, x)

    monkeypatch.setattr(PackedLinear, "packed_forward", counted)
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        decodes_as_eager(eager, compiled, drafter)
    feature_width = len(drafter.target_layer_ids) * eager.hidden_size
    # Every shape compiled (none fell back to eager): verify of 1 and 4 tokens, the draft step.
    assert compiled_shapes(compiled) == {
        ((1, 1), (1, 1)): True, ((1, 4), (1, 4)): True, ((1,), (1, 4, feature_width), (1, 8)): True
    }
    if cpu_attention.READY:  # the target's steps and the draft step attend through the masked-attention kernel
        assert sum("dflash_cpu.masked_attention" in code for code in codes) == len(codes) == 3
    if rows_kernel:  # the target's steps call the kernel, and nothing takes the packed weights
        assert sum("dflash_cpu.rows_linear" in code for code in codes) >= 2 and not packed_calls
    else:  # the linears ran through the packed weights (a small model packs one rows too)
        assert packed_calls and set(packed_calls) >= {1, 4}
    torch._dynamo.reset()


def test_without_the_attention_kernel_compiled_steps_take_sdpa_and_decode_as_the_eager_ones(small_pair, monkeypatch):
    """Where the CPU kernels cannot build (no x86 AVX2, no compiler), the grouped SDPA is traced instead."""
    eager, drafter = small_pair
    monkeypatch.setattr(cpu_attention, "prepare", lambda: False)
    monkeypatch.setattr(cpu_attention, "READY", False)
    torch._dynamo.reset()  # forget steps traced with the kernel
    compiled = Target(eager.model, static_cache=True, compiled=True, compile_gemms="library")
    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        decodes_as_eager(eager, compiled, drafter)
    assert all(compiled_shapes(compiled).values())
    assert codes and not any("dflash_cpu.masked_attention" in code for code in codes)
    assert any("scaled_dot_product" in code for code in codes)
    torch._dynamo.reset()


def test_longer_steps_of_library_gemms_share_one_trace_and_decode_as_the_eager_ones(small_pair):
    """After a second length, a step's length is symbolic: every later block size reuses that trace
    (each trace of a real target costs seconds), and decodes token for token as plain decoding."""
    eager, drafter = small_pair
    torch._dynamo.reset()
    compiled = Target(eager.model, static_cache=True, compiled=True, compile_gemms="library")
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = run(eager, ids, None, max_new_tokens=24).output_ids
    codes, traced = [], []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        for block in (4, 3, 2):
            assert run(compiled, ids, drafter, max_new_tokens=24, block_size=block).output_ids == plain
            traced.append(len(codes))
    # Block 4: its draft and verify steps; block 3: both again, length symbolic; block 2: the draft
    # step alone, whose block of one noise token is a size-1 dimension dynamo specializes.
    assert traced == [2, 4, 5]
    assert len(_debug_get_cache_entry_list(Target._step.__code__)) == 2  # the verify: block 4, then any length
    assert sum(1 for key in compiled.graphs.graphs if key[0][0] == "verify") == 3 and all(compiled_shapes(compiled).values())
    torch._dynamo.reset()


def test_another_targets_taps_leave_a_compiled_step_as_it_was_compiled(small_pair):
    """Targets over one model share one hook per layer (`LayerTaps`): a second target tapping layers
    for its drafter, or tapping none again, neither adds hooks nor makes the first's compiled steps
    compile again (dynamo guards the hooks on every module a step calls), and a third target tapping
    the same layers reuses the second's traces."""
    eager, drafter = small_pair
    torch._dynamo.reset()
    hooks = [len(layer._forward_hooks) for layer in eager.layers]
    plain_side = Target(eager.model, static_cache=True, compiled=True, compile_gemms="library")
    dflash_side = Target(eager.model, static_cache=True, compiled=True, compile_gemms="library")
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = run(plain_side, ids, None, max_new_tokens=8).output_ids
    entries = len(_debug_get_cache_entry_list(Target._step.__code__))
    assert run(dflash_side, ids, drafter, max_new_tokens=8).output_ids == plain
    assert [len(layer._forward_hooks) for layer in eager.layers] == hooks
    traced = len(_debug_get_cache_entry_list(Target._step.__code__))
    assert run(plain_side, ids, None, max_new_tokens=8).output_ids == plain
    assert run(dflash_side, ids, drafter, max_new_tokens=8).output_ids == plain
    assert entries == 1 and len(_debug_get_cache_entry_list(Target._step.__code__)) == traced
    # A third target with the same taps (another lane of the drafter) reuses the second's traces.
    third = Target(eager.model, static_cache=True, compiled=True, compile_gemms="library")
    assert run(third, ids, drafter.with_own_cache(), max_new_tokens=8).output_ids == plain
    assert len(_debug_get_cache_entry_list(Target._step.__code__)) == traced
    torch._dynamo.reset()


KERNEL = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\(.*?r'''(.*?)'''", re.DOTALL | re.MULTILINE)


def gemm_calls(code: str) -> int:
    """How many calls of inductor's C++ GEMM template kernels one compiled step's code makes."""
    templates = {name for name, source in KERNEL.findall(code) if "micro_gemm" in source}
    body = code[code.index("def call(self, args):"):]
    return sum(1 for name in re.findall(r"^\s+(\w+)\(", body, re.MULTILINE) if name in templates)


def test_template_gemms_merge_the_linears_and_decode_as_the_eager_ones(small_pair, monkeypatch):
    eager, drafter = small_pair
    # CPP alone: the engine's CPP,ATEN setting where the template wins, without timing every shape
    # against MKL first (seconds per shape).
    monkeypatch.setitem(compiled_steps.TEMPLATE_CONFIG, "max_autotune_gemm_backends", "CPP")
    # One-row inputs on F.linear, as on a model large enough to time MKL against oneDNN: the library
    # target's one-token step then traces the graph the template's does, and must not be reused.
    for module in eager.model.modules():
        if isinstance(module, PackedLinear):
            monkeypatch.setattr(module, "single_row_packed", False)
    library = Target(eager.model, static_cache=True, compiled=True, compile_gemms="library")
    run(library, [5, 6, 7], None, max_new_tokens=4)
    compiled = Target(eager.model, static_cache=True, compiled=True, compile_gemms="template")
    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        decodes_as_eager(eager, compiled, drafter)
    assert all(compiled_shapes(compiled).values()) and len(codes) == 3  # verify of 1 token, draft, verify of 4
    for code in codes:
        assert "dflash.packed_linear" not in code and "extern_kernels.mm" not in code and "addmm" not in code
    # The two verify steps: per target layer q/k/v merged into one GEMM, o, gate/up merged into one,
    # down; plus the head. The draft step: fc, its one layer (q; k/v merged over context and block;
    # o; gate/up; down), the head. Unmerged, they would be 15, 15 and 9.
    assert sorted(map(gemm_calls, codes)) == [1 + 5 + 1, 4 * eager.num_layers + 1, 4 * eager.num_layers + 1]


def test_compiled_steps_need_the_static_cache_and_exclude_cuda_graphs(small_pair, tmp_path, capsys):
    eager, _ = small_pair
    with pytest.raises(ConfigError, match=r"Compiled steps need the static KV cache \(static_cache=True"):
        Target(eager.model, compiled=True)
    with pytest.raises(ConfigError, match="choose CUDA graphs or compiled steps"):
        Target(eager.model, static_cache=True, cuda_graphs=True, compiled=True)
    with pytest.raises(SystemExit):
        bench_main(["--compile", "--cuda-graphs", "--static-cache"])
    assert "--compile and --cuda-graphs" in capsys.readouterr().err


def test_compiled_gemms_are_checked(small_pair, monkeypatch):
    eager, _ = small_pair
    monkeypatch.delenv("DFLASH_COMPILE_GEMMS", raising=False)
    assert Target(eager.model, static_cache=True, compiled=True).graphs.backend.gemms == "template"
    with pytest.raises(ConfigError, match="compile_gemms='library' is for compiled steps"):
        Target(eager.model, static_cache=True, compile_gemms="library")
    with pytest.raises(ConfigError, match=r"must be one of template, library, not 'mkl' \(compile_gemms\)"):
        Target(eager.model, static_cache=True, compiled=True, compile_gemms="mkl")
    monkeypatch.setenv("DFLASH_COMPILE_GEMMS", "Library")
    assert Target(eager.model, static_cache=True, compiled=True).graphs.backend.gemms == "library"
    monkeypatch.setenv("DFLASH_COMPILE_GEMMS", "fast")
    with pytest.raises(ConfigError, match=r"not 'fast' \(DFLASH_COMPILE_GEMMS\)"):
        Target(eager.model, static_cache=True, compiled=True)


def test_compile_is_a_switch_of_the_loaders(tmp_path, monkeypatch):
    # The library GEMMs compile in seconds; the template's are covered above.
    monkeypatch.setenv("DFLASH_COMPILE_GEMMS", "library")
    target_dir = build_target(tmp_path / "target", num_layers=1)
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path / "cache"))
    # What importing the compiled steps leaves in the environment: inductor's own default.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    pair = load_pair(target_dir, compiled=True, static_cache=True)
    assert pair.target.graphs is not None and pair.target.static_cache
    # Its `library` steps are saved for later processes in the project's cache folder too.
    assert pair.target.graphs.backend.saved.root == tmp_path / "cache" / "compiled-steps"
    # Inductor's code and timings are kept in the project's cache folder, not the temp folder.
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "inductor")
    assert inductor_cache_dir() == str(tmp_path / "cache" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    load_pair(target_dir, compiled=True, static_cache=True)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "elsewhere")  # the user's choice stays
    # The CLI's --compile implies the static cache.
    assert cli_main(["generate", "--target", str(target_dir), "--plain", "--prompt-ids", "1,2", "--max-new-tokens",
                     "2", "--compile", "--quiet"]) == 0
    assert torch.compiler.is_compiling() is False

