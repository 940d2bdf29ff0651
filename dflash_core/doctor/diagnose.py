"""The doctor's run: every check on one pair, in order, as one `Report`.

`diagnose` reads the drafter's files as written (so a config the loader refuses is still
judged), decodes the prompts with the loaded pair, probes variants of the drafter (target layers
shifted by one, other RoPE settings, float32), and with a server URL asks the server the same
prompts. Checks that cannot run here (no loaded drafter, no thinking switch, no server) are
reported as SKIP with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import Qwen3Config

from ..errors import DFlashError
from ..loading.chat_template import describe_template, has_thinking_switch, template_args
from ..loading.pair import load_drafter, stop_ids_of
from ..loading.prompting import encode_prompt
from ..lossless import compare
from ..models.drafter import DFlashDrafter
from . import acceptance, numerics, server, template, wiring
from .formats import stored_formats
from .measure import DoctorPrompt, Measurement, measure, prompt_set_path, read_prompts, variant
from .quantization import quantization_grid, quantized_tensors
from .report import Check, Report, skipped

HEAD_ROWS_TESTED = 1024  # rows of the head the grid test reads: plenty for a verdict, and fast


@dataclass(frozen=True)
class DoctorSettings:
    """How the pair decodes and what else to ask.

    thinking: "on" / "off" as the pair is used, None for its default (`trained_template`, else
    thinking off where the template has the switch, as `chat_template.template_args` decides).
    """

    max_new_tokens: int = 64
    block_size: int | None = None
    thinking: str | None = None
    trained_template: dict | None = None
    server: str | None = None
    server_model: str | None = None


def default_prompts(drafter_dir: str | Path, prompts: str | Path | None = None,
                    limit: int = 6) -> tuple[list[DoctorPrompt], Path]:
    """`limit` prompts spread over `prompts` (a JSON-lines file), else over the set the drafter's card
    names (`acceptance.stated_acceptance`), else over the natural set; and the file they came from."""
    if prompts is None:
        stated = acceptance.stated_acceptance(drafter_dir)
        prompts = prompt_set_path(stated.prompts if stated is not None and stated.prompts else "natural")
    return read_prompts(prompts, limit), Path(prompts)


def diagnose(target, drafter_dir: str | Path, prompts: list[DoctorPrompt], *, drafter=None,
             load_error: str | None = None, settings: DoctorSettings = DoctorSettings(), target_name: str | None = None,
             log=None, checkpoint=None) -> Report:
    """Every check for `target` with the drafter in `drafter_dir` (see the module doc).

    drafter: the loaded drafter (a `DFlashDrafter`, or any drafter `generate` takes; the probes that
    need a DFlash model's layers skip others); None with `load_error` when it did not load.
    log: called with a short line before each slow step (the CLI prints them).
    checkpoint: called after every decoding cycle of the measured steps; it may raise to end the run
    there (the app's doctor stops within a cycle of its visitor leaving).
    """
    log = log or (lambda line: None)
    drafter_dir = Path(drafter_dir)
    raw = json.loads((drafter_dir / "config.json").read_text())
    weights = drafter_dir / "model.safetensors"
    tensors = load_file(weights) if weights.is_file() else {}
    tokenizer = target.tokenizer
    checks: list[Check] = [_load_check(drafter, load_error)]
    checks.append(wiring.layer_ids_check(raw, target.num_layers))
    mask = wiring.lookup(raw, "mask_token_id")
    text = None
    if tokenizer is not None and mask is not None and 0 <= int(mask) < target.vocab_size:
        text = tokenizer.convert_ids_to_tokens(int(mask))
    checks.append(wiring.mask_token_check(mask, target.vocab_size, text))
    mask_at = len(checks) - 1  # probed once the pair has decoded
    head = target.head.weight.detach()  # in its own dtype: the grid test allows for its rounding
    checks.append(wiring.vocab_map_check(raw, tensors, head))
    checks.append(_quantized(drafter, tensors, head, raw))

    chat = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    args = template_args(tokenizer, settings.thinking, settings.trained_template) if chat else {}
    encoded = [_encode(tokenizer, p, args) for p in prompts]
    stop = stop_ids_of(tokenizer)
    pair = {"target": target_name, "drafter": str(drafter_dir),
            "target_dtype": _name(target.dtype), "drafter_dtype": _name(getattr(drafter, "dtype", None)),
            "block_size": settings.block_size or (None if drafter is None else drafter.block_size),
            "max_new_tokens": settings.max_new_tokens, "template": describe_template(tokenizer, args, chat),
            "prompts": [{"id": p.id, "ids": ids} for p, ids in zip(prompts, encoded)],
            "threads": torch.get_num_threads(), "server": settings.server}

    fields = wiring.rope_fields(raw)
    if drafter is None:
        config = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("dflash_config", "auto_map")})
        used = dict(config.rope_parameters)
        checks.append(wiring.rope_check(fields, used, _theta(target), {}))
        why = f"the drafter did not load ({load_error})"
        checks += [skipped(i, t, why, x) for i, t, x in _MEASURED]
        if settings.server:
            checks.append(skipped("server", "server", why, server.TAU_TEXT))
        return Report(pair, tuple(checks))

    def tau_of(d, ids=encoded, block=settings.block_size) -> Measurement:
        return measure(target, d, ids, settings.max_new_tokens, block, stop, checkpoint)

    log(f"decoding {len(encoded)} prompts ({settings.max_new_tokens} new tokens each)")
    base = tau_of(drafter)
    model = drafter if isinstance(drafter, DFlashDrafter) else None
    if model is not None:
        checks.append(_rope(model, fields, _theta(target), base, tau_of, log))
    else:
        checks.append(skipped("wiring.rope", "RoPE theta and scaling", "the drafter has no RoPE of its own",
                              wiring.ROPE_TEXT))
    if mask is not None and 0 <= int(mask) < target.vocab_size and model is not None \
            and not getattr(model, "autoregressive", False):
        checks[mask_at] = _mask_probe(model, int(mask), text, tokenizer, target.vocab_size, drafter_dir, base,
                                      tau_of, log) or checks[mask_at]
    checks.append(acceptance.acceptance_check(base, acceptance.stated_acceptance(drafter_dir)))
    checks.append(_template(tokenizer, prompts, args, base, lambda ids: tau_of(drafter, ids), log))
    checks.append(_dtype(target, model, drafter_dir, base, tau_of, log, settings.block_size))
    checks.append(_shift(model, target.num_layers, base, tau_of, log))
    if settings.server:
        checks += _server(target, model or drafter, prompts, encoded, args, base, settings, stop, log, checkpoint)
    return Report(pair, tuple(checks))


_MEASURED = [
    ("acceptance", "measured acceptance", acceptance.TEXT),
    ("template", "chat template (thinking)", template.TEXT),
    ("numerics.dtype", "drafter dtype vs float32", numerics.DTYPE_TEXT),
    ("wiring.layer_shift", "target_layer_ids probe", wiring.SHIFT_TEXT),
]


def _name(dtype) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _encode(tokenizer, prompt: DoctorPrompt, args: dict) -> list[int]:
    if prompt.ids is not None:
        return list(prompt.ids)
    return encode_prompt(tokenizer, prompt.text, template_args=args)


def _theta(target) -> float | None:
    params = getattr(target.model.config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return None if theta is None else float(theta)


LOAD_TEXT = (
    "The drafter's files are read and checked against the target before anything decodes: shapes, "
    "vocabulary, layers, block size. A drafter that fails here cannot be measured; the checks of its "
    "files below still say what is wrong."
)


def _load_check(drafter, error: str | None) -> Check:
    if drafter is None:
        return Check("load", "pair loads", "FAIL", error or "no drafter", LOAD_TEXT, "the drafter does not load")
    if not isinstance(drafter, DFlashDrafter):
        return Check("load", "pair loads", "PASS", f"{type(drafter).__name__} drafter, block {drafter.block_size}",
                     LOAD_TEXT)
    kind = ("DFlash2" if drafter.dflash2 is not None else "autoregressive" if drafter.autoregressive
            else "input-fusion" if drafter.input_fusion else "DFlash")
    return Check("load", "pair loads", "PASS",
                 f"{kind} drafter, {len(drafter.layers)} layers, block {drafter.block_size}, {_name(drafter.dtype)}, "
                 "validated against the target", LOAD_TEXT)


def _rope(model: DFlashDrafter, fields: dict, target_theta, base: Measurement, tau_of, log) -> Check:
    used = dict(model.config.rope_parameters)
    theta = float(used.get("rope_theta", 0.0))
    candidates = {}
    for name, value in fields.items():
        if name.endswith("rope_theta") and value != theta:
            candidates[f"theta {value:g} ({name})"] = {**used, "rope_theta": value}
    if target_theta is not None and target_theta != theta:
        candidates[f"theta {target_theta:g} (the target's)"] = {**used, "rope_theta": target_theta}
    probe = {"as read": base.tau}
    for label, params in candidates.items():
        log(f"probing RoPE: {label}")
        probe[label] = tau_of(variant(model, rope_parameters=params)).tau
    return wiring.rope_check(fields, used, target_theta, probe)


def _template(tokenizer, prompts, args: dict, base: Measurement, tau_of_ids, log) -> Check:
    title = "chat template (thinking)"
    if tokenizer is None or not has_thinking_switch(tokenizer):
        return skipped("template", title, "the chat template has no thinking switch", template.TEXT)
    texts = [p for p in prompts if p.text is not None]
    if len(texts) != len(prompts):
        return skipped("template", title, "the prompts are token ids, not text", template.TEXT)
    used = "on" if args.get("enable_thinking", True) else "off"
    other = "off" if used == "on" else "on"
    log(f"decoding with thinking {other}")
    flipped = {**args, "enable_thinking": other == "on"}
    flipped_ids = [encode_prompt(tokenizer, p.text, template_args=flipped) for p in texts]
    taus = {used: base.tau, other: tau_of_ids(flipped_ids).tau}
    return template.template_check(used, taus)


def _quantized(drafter, tensors: dict, head: torch.Tensor, raw: dict) -> Check:
    """The formats the drafter's files store quantized; its other tensors, and the first rows of the head
    it drafts with, tested for a grid."""
    stored = stored_formats(raw, tensors)
    own = {k: v for k, v in tensors.items() if k not in ("lm_head.weight", "d2t", "draft_vocab", *stored)}
    grids = quantized_tensors(own)
    ids = None
    if "d2t" in tensors:
        ids = tensors["d2t"].long() + torch.arange(len(tensors["d2t"]))
    elif "draft_vocab" in tensors:
        ids = tensors["draft_vocab"].long()
    if ids is None:
        rows = head[:HEAD_ROWS_TESTED]
    else:
        rows = head[ids[:HEAD_ROWS_TESTED].clamp(0, len(head) - 1).to(head.device)]
    head_grid = quantization_grid(rows)
    copy = tensors.get("lm_head.weight")
    copy_grid = None if copy is None else quantization_grid(copy[:HEAD_ROWS_TESTED])
    dflash2 = getattr(drafter, "dflash2", None) is not None or raw.get("architectures") == ["DFlash2DraftModel"]
    if head_grid is None and copy_grid is not None:
        return numerics.quantized_check(grids, copy_grid, head_is_targets=False, dflash2=dflash2, stored=stored)
    return numerics.quantized_check(grids, head_grid, head_is_targets=True, dflash2=dflash2, stored=stored)


def _mask_probe(model, mask: int, text: str | None, tokenizer, vocab_size: int, drafter_dir: Path, base: Measurement,
                tau_of, log) -> Check | None:
    """The mask token check with tau at each usual mask id (`wiring.mask_candidates`); None when there
    is no other id to try."""
    candidates = wiring.mask_candidates(tokenizer, vocab_size, mask, acceptance.stated_mask_token_id(drafter_dir))
    taus = {}
    for token_id, why in candidates.items():
        log(f"decoding with mask token id {token_id}")
        tau = tau_of(variant(model, mask_token_id=token_id)).tau
        taus[token_id] = (tau, why, None if tokenizer is None else tokenizer.convert_ids_to_tokens(token_id))
    return wiring.mask_probe_check(mask, text, vocab_size, base.tau, taus) if taus else None


def _dtype(target, model, drafter_dir: Path, base: Measurement, tau_of, log, block_size) -> Check:
    if model is None:
        return skipped("numerics.dtype", "drafter dtype vs float32", "the drafter has no weights of its own",
                       numerics.DTYPE_TEXT)
    if model.dtype == torch.float32:
        return numerics.dtype_check("float32", base.tau, None)
    log("decoding with the drafter in float32")
    exact = load_drafter(target, drafter_dir, torch.float32, block_size)
    return numerics.dtype_check(_name(model.dtype), base.tau, tau_of(exact).tau)


def _shift(model, depth: int, base: Measurement, tau_of, log) -> Check:
    if model is None:
        return skipped("wiring.layer_shift", "target_layer_ids probe", "the drafter reads no target layers",
                       wiring.SHIFT_TEXT)
    ids = list(model.target_layer_ids)
    taus: dict[int, float | None] = {0: base.tau}
    for shift in (-1, 1):
        moved = [i + shift for i in ids]
        if all(0 <= i < depth for i in moved):
            log(f"probing target_layer_ids {moved}")
            taus[shift] = tau_of(variant(model, target_layer_ids=moved)).tau
        else:
            taus[shift] = None
    return wiring.layer_shift_check(ids, taus)


def _server(target, drafter, prompts, encoded, args: dict, base: Measurement, settings: DoctorSettings, stop,
            log, checkpoint=None) -> list[Check]:
    from ..vllm.client import complete, served_model

    texts = [(p, ids) for p, ids in zip(prompts, encoded) if p.text is not None]
    if not texts:
        return [skipped("server", "server", "the prompts are token ids; a chat server takes text", server.TAU_TEXT)]
    try:
        served = served_model(settings.server, settings.server_model)
        answers = []
        for p, _ in texts:
            log(f"asking {served.url} ({p.id})")
            answers.append(complete(served, p.text, max_new_tokens=settings.max_new_tokens, template_args=args))
    except DFlashError as exc:
        return [Check("server", "server", "FAIL", str(exc), server.TAU_TEXT, "the server did not answer")]
    prompt_ids = [list(a.prompt_ids) or ids for a, (_, ids) in zip(answers, texts)]
    checks = [server.server_prompt_check([p.id for (p, ids), s in zip(texts, prompt_ids) if s != ids], len(texts))]
    k = next((a.num_speculative_tokens for a in answers if a.num_speculative_tokens is not None), None)
    checks.append(server.block_size_check(k, drafter.block_size))
    records = [a.spec for a in answers if a.spec]
    server_tau = None
    if records and sum(r.get("num_spec_steps", 0) for r in records):
        accepted = sum(r["num_accepted_draft_tokens"] for r in records)
        server_tau = 1 + accepted / sum(r["num_spec_steps"] for r in records)
    block = min(k + 1, drafter.block_size) if k is not None else drafter.block_size
    if prompt_ids == [ids for _, ids in texts] and block == base.block_size and len(texts) == len(encoded):
        engine = base
    else:
        log(f"decoding the server's prompt ids at block {block}")
        engine = measure(target, drafter, prompt_ids, settings.max_new_tokens, block, stop, checkpoint)
    checks.append(server.server_tau_check(server_tau, engine.tau, block))
    log("plain decoding of the server's prompt ids")
    plain = measure(target, None, prompt_ids, settings.max_new_tokens, None, stop, checkpoint)
    verdicts = {p.id: compare(target, ids, a.output_ids, out)
                for (p, _), ids, a, out in zip(texts, prompt_ids, answers, plain.outputs)}
    checks.append(server.server_outputs_check(verdicts))
    return checks
