"""The doctor's quantization check on faithful tiny copies of the formats users ship: each stored as
its tools write it (config and tensors), and each cast back to a float dtype, named correctly.

The quantizers below follow each format's documented arithmetic (docs/doctor.md lists the sources):
fine-grained FP8 (one float8 e4m3 scale per 128x128 block, stored as `weight_scale_inv`), GPTQ and
AWQ int4 with a zero point per group of 128 (packed eight to an int32), int8 symmetric per group of
128 (compressed-tensors' int-quantized group strategy), and GGUF's Q4_0, Q4_1 and Q8_0 blocks of 32.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_core import Target
from dflash_core.doctor import DoctorPrompt, DoctorSettings, diagnose
from dflash_core.doctor.formats import stored_formats
from dflash_core.doctor.quantization import quantization_grid
from dflash_core.errors import DFlashError
from dflash_core.loading.pair import load_drafter

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "zlab-tiny-a"
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def fp8_blocks(w: torch.Tensor, side: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, float32 multiplier per block): each block divided by its absolute max / 448."""
    rows, cols = -(-w.shape[0] // side), -(-w.shape[1] // side)
    scale = torch.empty(rows, cols)
    for i in range(rows):
        for j in range(cols):
            scale[i, j] = w[i * side:(i + 1) * side, j * side:(j + 1) * side].abs().max() / 448
    full = scale.repeat_interleave(side, 0).repeat_interleave(side, 1)[: w.shape[0], : w.shape[1]]
    return (w / full).to(torch.float8_e4m3fn), scale


def fp8_dequantized(w: torch.Tensor) -> torch.Tensor:
    q, scale = fp8_blocks(w)
    return q.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[: w.shape[0], : w.shape[1]]


def int4_groups(w: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ's and AWQ's asymmetric min-max rule per group of `group` inputs: (q [out, in] in 0..15,
    zero point [out, in / group], scale [out, in / group])."""
    g = w.reshape(w.shape[0], -1, group)
    low, high = g.amin(-1), g.amax(-1)
    scale = (high - low) / 15
    zero = (-low / scale).round()
    q = ((g / scale[..., None]).round() + zero[..., None]).clamp(0, 15)
    return q.reshape(w.shape).long(), zero.long(), scale


def int4_dequantized(w: torch.Tensor, group: int = 128) -> torch.Tensor:
    q, zero, scale = int4_groups(w, group)
    g = q.reshape(w.shape[0], -1, group)
    return ((g - zero[..., None]) * scale[..., None]).reshape(w.shape)


def pack(values: torch.Tensor, order=range(8)) -> torch.Tensor:
    """Eight 4-bit values along the last dim into one int32 each, value `order[j]` in bits 4j..4j+3."""
    v = values.reshape(*values.shape[:-1], -1, 8)[..., list(order)]
    word = sum(v[..., j].long() << (4 * j) for j in range(8))
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def gptq_tensors(w: torch.Tensor, group: int, stem: str = "") -> dict:
    """GPTQ's layout: qweight [in / 8, out] (the input dimension packed), qzeros [in / group, out / 8]
    (stored less one, as GPTQ's v1 format does), scales [in / group, out], g_idx [in]."""
    q, zero, scale = int4_groups(w, group)
    return {stem + "qweight": pack(q).t().contiguous(),
            stem + "qzeros": pack((zero - 1).t().contiguous()), stem + "scales": scale.t().contiguous().half(),
            stem + "g_idx": (torch.arange(w.shape[1]) // group).to(torch.int32)}


def awq_tensors(w: torch.Tensor, group: int, stem: str = "") -> dict:
    """AWQ's GEMM layout: qweight [in, out / 8] (the output dimension packed in AWQ's interleaved
    order), qzeros [in / group, out / 8], scales [in / group, out]; no g_idx."""
    q, zero, scale = int4_groups(w, group)
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    return {stem + "qweight": pack(q.t().contiguous(), order), stem + "qzeros": pack(zero.t().contiguous(), order),
            stem + "scales": scale.t().contiguous().half()}


def int8_groups(w: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per group: (int8 weight, scale [out, in / group]), scale = absolute max / 127."""
    g = w.reshape(w.shape[0], -1, group)
    scale = g.abs().amax(-1) / 127
    return (g / scale[..., None]).round().clamp(-127, 127).to(torch.int8).reshape(w.shape), scale


def q4_0(w: torch.Tensor) -> torch.Tensor:
    """GGUF Q4_0 cast back: per block of 32, d = (the value of largest magnitude) / -8 stored in fp16,
    q = trunc(x / d + 8.5) clamped to 0..15, x' = (q - 8) * d."""
    b = w.reshape(-1, 32)
    d = (b.gather(1, b.abs().argmax(1, keepdim=True)) / -8).half().float()
    return ((torch.trunc(b / d + 8.5).clamp(0, 15) - 8) * d).reshape(w.shape)


def q4_1(w: torch.Tensor) -> torch.Tensor:
    """GGUF Q4_1 cast back: per block of 32, m = min and d = (max - min) / 15 in fp16, x' = q * d + m."""
    b = w.reshape(-1, 32)
    m, d = b.amin(1, keepdim=True).half().float(), ((b.amax(1, keepdim=True) - b.amin(1, keepdim=True)) / 15).half().float()
    return ((torch.trunc((b - m) / d + 0.5).clamp(0, 15)) * d + m).reshape(w.shape)


def q8_0(w: torch.Tensor) -> torch.Tensor:
    """GGUF Q8_0 cast back: per block of 32, d = absolute max / 127 in fp16, x' = round(x / d) * d."""
    b = w.reshape(-1, 32)
    d = (b.abs().amax(1, keepdim=True) / 127).half().float()
    return ((b / d).round() * d).reshape(w.shape)


@pytest.fixture(scope="module")
def weights() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(256, 384) * 0.02 + 0.004  # off-centre, so asymmetric grids do not start at -max


CAST_BACK = {
    "fp8 e4m3 (one scale per 128x128 block": fp8_dequantized,
    "int4 in groups of 128, a scale and a zero point each (like GPTQ / AWQ)": int4_dequantized,
    "int8 symmetric in groups of 128": lambda w: (lambda q, s: (q.float().reshape(w.shape[0], -1, 128)
                                                                 * s[..., None]).reshape(w.shape))(*int8_groups(w)),
    "4-bit blocks of 32, a scale each (like GGUF Q4_0)": q4_0,
    "4-bit blocks of 32, a scale and a minimum each (like GGUF Q4_1": q4_1,
    "8-bit blocks of 32 (like GGUF Q8_0)": q8_0,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("words", list(CAST_BACK))
def test_each_format_cast_back_is_named(weights, words, dtype):
    assert quantization_grid(weights.to(dtype)) is None
    found = quantization_grid(CAST_BACK[words](weights).to(dtype))
    assert found is not None and found.startswith(words), found


def test_each_stored_layout_is_named(weights):
    w = weights
    fp8, inv = fp8_blocks(w)
    assert stored_formats({"quantization_config": FP8_CONFIG}, {"l.weight": fp8, "l.weight_scale_inv": inv}) == {
        "config.json": "fp8 e4m3 weights, one scale per 128x128 block (quant_method fp8)",
        "l.weight": "fp8 e4m3, one scale per 128x128 block (weight_scale_inv)"}
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": False}
    assert stored_formats({"quantization_config": gptq}, gptq_tensors(w, 128, "l.")) == {
        "config.json": "int4 in groups of 128, with a zero point (quant_method gptq)",
        "l.weight": "int4 in groups of 128 (GPTQ: qweight, qzeros, scales, g_idx)"}
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    assert stored_formats({"quantization_config": awq}, awq_tensors(w, 128, "l.")) == {
        "config.json": "int4 in groups of 128, with a zero point (quant_method awq, gemm)",
        "l.weight": "int4 in groups of 128 (AWQ: qweight, qzeros, scales)"}
    q, scale = int8_groups(w)
    int8 = {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "group",
                                           "group_size": 128}}}}
    assert stored_formats({"quantization_config": int8}, {"l.weight": q, "l.weight_scale": scale}) == {
        "config.json": "int8 in groups of 128, symmetric (quant_method compressed-tensors, int-quantized)",
        "l.weight": "int8, one scale per group of 128 (weight_scale)"}
    # llm-compressor's FP8-dynamic: float8 weights, one scale per output row.
    row_scale = w.abs().amax(1, keepdim=True) / 448
    fp8_dynamic = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}}}}
    assert stored_formats({"quantization_config": fp8_dynamic},
                          {"l.weight": (w / row_scale).to(torch.float8_e4m3fn), "l.weight_scale": row_scale}) == {
        "config.json": "fp8 one scale per channel (quant_method compressed-tensors, float-quantized)",
        "l.weight": "fp8 e4m3, one scale per row (weight_scale)"}
    # compressed-tensors' pack-quantized int4: eight values to an int32 along each row.
    q, zero, scale = int4_groups(w)
    packed = {"l.weight_packed": pack(q), "l.weight_scale": scale, "l.weight_zero_point": zero,
              "l.weight_shape": torch.tensor(w.shape)}
    assert stored_formats({}, packed) == {"l.weight": "int4 in groups of 128, with a zero point (weight_packed)"}
    assert stored_formats({}, {"l.weight": w, "l.bias": w[0]}) == {}


def golden_as(tmp_path, layout, quantization_config) -> Path:
    """The golden drafter with every linear weight stored in `layout` (name stem, weight -> tensors)."""
    directory = tmp_path / "drafter"
    shutil.copytree(GOLDEN / "drafter", directory)
    raw = json.loads((directory / "config.json").read_text())
    raw["quantization_config"] = quantization_config
    (directory / "config.json").write_text(json.dumps(raw))
    state = {}
    for name, tensor in load_file(directory / "model.safetensors").items():
        if name.endswith("proj.weight") or name == "fc.weight":
            state.update(layout(name.removesuffix("weight"), tensor.float()))
        else:
            state[name] = tensor
    save_file(state, directory / "model.safetensors")
    return directory


def fp8_layout(stem, w):
    q, inv = fp8_blocks(w)
    return {stem + "weight": q, stem + "weight_scale_inv": inv}


@pytest.mark.parametrize("layout,config,named", [
    # The golden drafter's matrices are at most 192 wide: one block across most of them.
    (fp8_layout, FP8_CONFIG, "fp8 e4m3 weights, one scale per 128x128 block (quant_method fp8); "
                             "fp8 e4m3, one scale per >=64x96 block (weight_scale_inv); 4 more"),
    (lambda stem, w: gptq_tensors(w, 32, stem), {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False},
     "int4 in groups of 32, with a zero point (quant_method gptq); int4 in groups of 32 (GPTQ"),
])
def test_the_doctor_names_a_drafter_stored_quantized(tmp_path, layout, config, named):
    target = Target.from_pretrained(GOLDEN / "target")
    directory = golden_as(tmp_path, layout, config)
    drafter, error = None, None
    try:
        drafter = load_drafter(target, directory, torch.float32)
    except DFlashError as exc:
        error = str(exc)
    prompt = json.loads((GOLDEN / "expected.json").read_text())["prompts"][0]["prompt_ids"]
    report = diagnose(target, directory, [DoctorPrompt("p", ids=tuple(prompt))], drafter=drafter, load_error=error,
                      settings=DoctorSettings(max_new_tokens=8))
    check = report.check("numerics.quantized")
    assert check.status == "FAIL" and check.cause == "quantized drafter weights"
    assert check.summary.startswith(f"the drafter's files store it quantized: {named}"), check.summary
    assert "(15 weights, e.g. " in check.summary  # fc and every layer's 7 linears
    assert "in none of the files" in check.explanation  # serve-time quantization: the server checks catch it
