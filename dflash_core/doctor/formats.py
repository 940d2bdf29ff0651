"""The quantized formats a checkpoint stores, read from its files: `config.json`'s
`quantization_config` and the tensors' names, dtypes and shapes.

What each format writes (docs/doctor.md gives the sources):

- fine-grained FP8 (transformers' `FineGrainedFP8Config`, DeepSeek-V3, the Qwen3 FP8 releases):
  `quant_method` "fp8" with `weight_block_size` [128, 128]; each `weight` in float8 e4m3 beside a
  float32 `weight_scale_inv` of one multiplier per block;
- compressed-tensors (llm-compressor's checkpoints): `quant_method` "compressed-tensors" with
  `config_groups`; `weight` in float8 (float-quantized) or int8 (int-quantized) beside
  `weight_scale`, or 4-bit values packed in int32 `weight_packed` beside `weight_scale`,
  `weight_shape` and, asymmetric, `weight_zero_point`;
- GPTQ (AutoGPTQ, GPTQModel): `quant_method` "gptq" with `bits`, `group_size`, `desc_act`, `sym`;
  int32 `qweight` [in * bits / 32, out], `qzeros`, `scales` [in / group, out] and `g_idx` [in];
- AWQ (AutoAWQ): `quant_method` "awq" with `bits`, `group_size`, `zero_point`, `version`; int32
  `qweight` [in, out * bits / 32], `qzeros` and `scales` [in / group, out], no `g_idx`;
- bitsandbytes: `quant_method` "bitsandbytes"; 4-bit weights as uint8 beside `absmax`,
  `quant_map` and `quant_state`, 8-bit ones as int8 beside `SCB`.

A quantization applied when a server loads the checkpoint (vLLM's `--quantization fp8`, say) is
in none of the files: only the server's own acceptance (the doctor's server checks) shows it.
"""

from __future__ import annotations

import torch

FLOAT8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def config_format(raw: dict) -> str | None:
    """The format `quantization_config` (or compressed-tensors' older `compression_config`) names,
    in words; None when the config has neither."""
    config = raw.get("quantization_config") or raw.get("compression_config")
    if not isinstance(config, dict):
        return None
    method = str(config.get("quant_method", "unnamed"))
    bits, group = config.get("bits"), config.get("group_size")
    if method == "fp8":
        block = config.get("weight_block_size")
        scale = f"one scale per {block[0]}x{block[1]} block" if block else "one scale per tensor or row"
        return f"fp8 {config.get('fmt', 'e4m3')} weights, {scale} (quant_method fp8)"
    if method == "gptq":
        order = ", act-order (g_idx)" if config.get("desc_act") else ""
        kind = "symmetric" if config.get("sym", True) else "with a zero point"
        return f"int{bits} in groups of {group}, {kind}{order} (quant_method gptq)"
    if method == "awq":
        kind = "with a zero point" if config.get("zero_point", True) else "symmetric"
        return f"int{bits} in groups of {group}, {kind} (quant_method awq, {config.get('version', 'gemm')})"
    if method == "compressed-tensors":
        schemes = sorted({_scheme(group.get("weights") or {}) for group in (config.get("config_groups") or {}).values()
                          if isinstance(group, dict)})
        return f"{'; '.join(schemes) or 'weights'} (quant_method compressed-tensors, {config.get('format', '?')})"
    if method == "bitsandbytes":
        if config.get("load_in_4bit"):
            return f"4-bit {config.get('bnb_4bit_quant_type', 'fp4')} in blocks (quant_method bitsandbytes)"
        return "int8 with outlier columns in 16 bits (quant_method bitsandbytes)"
    return f"quant_method {method}" + (f", {bits} bits" if bits else "")


def _scheme(weights: dict) -> str:
    bits, kind = weights.get("num_bits", "?"), weights.get("type", "int")
    strategy = weights.get("strategy", "tensor")
    if strategy == "group":
        per = f"in groups of {weights.get('group_size')}"
    elif strategy == "block":
        per = "in {}x{} blocks".format(*(weights.get("block_structure") or ["?", "?"]))
    else:
        per = f"one scale per {strategy}"
    symmetric = "symmetric" if weights.get("symmetric", True) else "with a zero point"
    return f"{kind}{bits} {per}, {symmetric}" if kind == "int" else f"fp{bits} {per}"


def tensor_formats(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Weight name -> its stored quantized format in words, for each weight the tensors store quantized."""
    found = {}
    for name, tensor in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        stem = prefix + "." if prefix else ""
        if leaf == "weight_scale_inv":
            weight = tensors.get(stem + "weight")
            found[stem + "weight"] = f"fp8 e4m3, one scale per {_block(weight, tensor)} block (weight_scale_inv)"
        elif leaf == "qweight" and stem + "scales" in tensors:
            found[stem + "weight"] = _gptq_or_awq(tensor, tensors[stem + "scales"], tensors.get(stem + "g_idx"))
        elif leaf == "weight_packed" and stem + "weight_scale" in tensors:
            shape = tensors.get(stem + "weight_shape")
            cols = int(shape[1]) if shape is not None else tensor.shape[1] * 8
            bits = 32 * tensor.shape[1] // cols if tensor.dtype == torch.int32 else 8 * tensor.shape[1] // cols
            scale = tensors[stem + "weight_scale"]
            per = f"in groups of {cols // scale.shape[-1]}" if scale.dim() == 2 and scale.shape[-1] > 1 else "one scale per row"
            kind = "with a zero point" if stem + "weight_zero_point" in tensors else "symmetric"
            found[stem + "weight"] = f"int{bits} {per}, {kind} (weight_packed)"
        elif leaf == "weight" and tensor.dtype in (*FLOAT8, torch.int8) and stem + "weight_scale_inv" not in tensors:
            if stem + "SCB" in tensors:
                found[name] = "int8, one scale per row (bitsandbytes SCB)"
            else:
                kind = "int8" if tensor.dtype == torch.int8 else f"fp8 {str(tensor.dtype).split('_')[1][:4]}"
                found[name] = f"{kind}, {_per(tensor, tensors.get(stem + 'weight_scale'))}"
        elif leaf == "absmax" and prefix.endswith("weight"):
            found[prefix] = "4-bit blocks (bitsandbytes absmax)"
    return found


def _block(weight: torch.Tensor | None, scale: torch.Tensor) -> str:
    if weight is None or scale.dim() != 2:
        return "block"
    # A dimension that one block spans says only that the block is at least that long.
    return "x".join(f"{-(-weight.shape[i] // scale.shape[i])}" if scale.shape[i] > 1 else f">={weight.shape[i]}"
                    for i in (0, 1))


def _per(weight: torch.Tensor, scale: torch.Tensor | None) -> str:
    """What a compressed-tensors `weight_scale` of this shape scales."""
    if scale is None:
        return "no scale"
    if scale.numel() == 1:
        return "one scale per tensor (weight_scale)"
    if scale.dim() == 2 and scale.shape[1] == 1:
        return "one scale per row (weight_scale)"
    if scale.dim() == 2 and scale.shape[0] == weight.shape[0]:
        return f"one scale per group of {weight.shape[1] // scale.shape[1]} (weight_scale)"
    return f"one scale per {_block(weight, scale)} block (weight_scale)"


def _gptq_or_awq(qweight: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None) -> str:
    """GPTQ packs the input dimension into qweight's rows and keeps g_idx; AWQ packs the output one."""
    groups, out = scales.shape
    if g_idx is not None:
        inputs = len(g_idx)
        bits = 32 * qweight.shape[0] // inputs
        order = "" if torch.equal(g_idx.long(), torch.arange(inputs) // (inputs // groups)) else ", act-order"
        return f"int{bits} in groups of {inputs // groups}{order} (GPTQ: qweight, qzeros, scales, g_idx)"
    inputs = qweight.shape[0]
    return f"int{32 * qweight.shape[1] // out} in groups of {inputs // groups} (AWQ: qweight, qzeros, scales)"


def stored_formats(raw: dict, tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Name -> stored quantized format, from the tensors and (as "config.json") from the config."""
    found = tensor_formats(tensors)
    named = config_format(raw)
    if named is not None:
        found = {"config.json": named, **found}
    return found
