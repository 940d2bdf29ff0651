"""Wiring checks: whether the drafter's config and files fit the target the way the engine reads them.

Each function takes what it judges (the drafter's raw `config.json`, its tensors, the target's
facts, probe taus) and returns one `Check`; none loads a model or decodes. The raw config is read
as written, so a config the loader refuses (a mask token outside the vocabulary) is still named.
"""

from __future__ import annotations

import torch

from .measure import clearly_better
from .report import Check


def lookup(raw: dict, key: str):
    """A DFlash key as the loader reads it: `dflash_config` first, the top level second."""
    nested = raw.get("dflash_config") or {}
    return nested[key] if nested.get(key) is not None else raw.get(key)


LAYER_IDS_TEXT = (
    "The drafter reads the target's hidden states at a few layers (target_layer_ids) and was trained on "
    "exactly those. An id past the target's last layer cannot be read at all, and a drafter made for a "
    "deeper or shallower target reads the wrong layers. vLLM logs the same layers counted from 1 (it "
    "counts layer inputs), which is not an error."
)


def layer_ids_check(raw: dict, target_layers: int) -> Check:
    """target_layer_ids (and num_target_layers) against the target's depth."""
    ids, declared = lookup(raw, "target_layer_ids"), lookup(raw, "num_target_layers")
    numbers = {"target_layer_ids": ids, "num_target_layers": declared, "target_layers": target_layers}
    title = "target_layer_ids vs target depth"
    if ids is None:
        fits = declared == target_layers
        return Check("wiring.layer_ids", title, "PASS" if fits else "FAIL",
                     f"no target_layer_ids; derived from num_target_layers {declared} (target has {target_layers})",
                     LAYER_IDS_TEXT, None if fits else "num_target_layers differs from the target's depth", numbers)
    bad = [i for i in ids if not 0 <= int(i) < target_layers]
    if bad:
        return Check("wiring.layer_ids", title, "FAIL",
                     f"{ids} include {bad}, outside the target's {target_layers} layers (0..{target_layers - 1})",
                     LAYER_IDS_TEXT, "target_layer_ids outside the target", numbers)
    if declared is not None and int(declared) != target_layers:
        return Check("wiring.layer_ids", title, "FAIL",
                     f"drafter made for a {declared}-layer target; this target has {target_layers}",
                     LAYER_IDS_TEXT, "drafter made for another target depth", numbers)
    return Check("wiring.layer_ids", title, "PASS", f"{ids} within the target's {target_layers} layers", LAYER_IDS_TEXT,
                 numbers=numbers)


SHIFT_TEXT = (
    "A probe: the same drafter is run reading the target layers one below and one above the ones its "
    "config names. A drafter reads features at exactly the layers it was trained on, so shifting them "
    "should only lower acceptance. If a shift raises it a lot, the config and the code that made the "
    "drafter count layers differently (an off-by-one, as in vLLM PR 42704)."
)


def layer_shift_check(ids: list[int], taus: dict[int, float | None]) -> Check:
    """taus: tau by shift (0 = the ids as configured, -1, +1; None where a shift leaves the target)."""
    base = taus[0]
    shown = {s: t for s, t in taus.items() if t is not None and s != 0}
    numbers = {"target_layer_ids": list(ids), "tau_by_shift": {f"{s:+d}" if s else "0": t for s, t in taus.items()}}
    words = "; ".join(f"{t:.2f} shifted by {s:+d}" for s, t in shown.items()) or "no shift fits the target"
    summary = f"tau {base:.2f} at {list(ids)}; {words}"
    better = [s for s, t in shown.items() if clearly_better(t, base)]
    if better:
        best = max(better, key=lambda s: shown[s])
        moved = [i + best for i in ids]
        return Check("wiring.layer_shift", "target_layer_ids probe", "FAIL",
                     summary + f": the drafter works with {moved}", SHIFT_TEXT,
                     f"target_layer_ids off by one (shift {best:+d}: {moved})", numbers)
    return Check("wiring.layer_shift", "target_layer_ids probe", "PASS", summary, SHIFT_TEXT, numbers=numbers)


ROPE_TEXT = (
    "RoPE tells attention where each token sits. Its base frequency (rope_theta) and any scaling can be "
    "written in two places of a config (the old top-level rope_theta / rope_scaling and the newer "
    "rope_parameters), and programs differ in which one they read (vLLM issue 54373). A drafter rotated "
    "with another theta than it was trained with still runs but accepts far less. The check reads both "
    "places and, where they or the target's theta differ, probes acceptance at each value."
)


def rope_fields(raw: dict) -> dict:
    """The RoPE settings a drafter config writes, by where they are written."""
    fields = {}
    if raw.get("rope_theta") is not None:
        fields["rope_theta"] = float(raw["rope_theta"])
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        if params.get("rope_theta") is not None:
            fields["rope_parameters.rope_theta"] = float(params["rope_theta"])
        fields["rope_parameters.rope_type"] = params.get("rope_type", "default")
        if params.get("factor") is not None:
            fields["rope_parameters.factor"] = float(params["factor"])
    scaling = raw.get("rope_scaling")
    if isinstance(scaling, dict):
        fields["rope_scaling.rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
        if scaling.get("factor") is not None:
            fields["rope_scaling.factor"] = float(scaling["factor"])
    return fields


def rope_conflicts(fields: dict) -> list[str]:
    """Settings written twice with different values, in words."""
    out = []
    pairs = [("rope_theta", "rope_parameters.rope_theta"), ("rope_scaling.rope_type", "rope_parameters.rope_type"),
             ("rope_scaling.factor", "rope_parameters.factor")]
    for a, b in pairs:
        if a in fields and b in fields and fields[a] != fields[b]:
            out.append(f"{a} {fields[a]:g} vs {b} {fields[b]:g}" if isinstance(fields[a], float)
                       else f"{a} {fields[a]} vs {b} {fields[b]}")
    return out


def rope_check(fields: dict, used: dict, target_theta: float | None, probe: dict[str, float]) -> Check:
    """fields: `rope_fields(raw)`; used: the rope parameters the engine built the drafter with;
    probe: tau by candidate label, the engine's own ("as read") first."""
    conflicts = rope_conflicts(fields)
    theta = float(used.get("rope_theta", 0.0))
    numbers = {"fields": fields, "engine_uses": used, "target_rope_theta": target_theta, "tau_by_setting": probe}
    summary = f"engine reads theta {theta:g} ({used.get('rope_type', 'default')})"
    if target_theta is not None:
        summary += f", target's theta {target_theta:g}"
    if conflicts:
        summary += "; config writes " + ", ".join(conflicts)
    base = probe.get("as read")
    if base is not None and len(probe) > 1:
        summary += "; tau " + ", ".join(f"{t:.2f} {label}" for label, t in probe.items())
        better = {label: t for label, t in probe.items() if label != "as read" and clearly_better(t, base)}
        if better:
            label = max(better, key=better.get)
            return Check("wiring.rope", "RoPE theta and scaling", "FAIL", summary, ROPE_TEXT,
                         f"RoPE settings: the drafter accepts more with {label} than with the {theta:g} read", numbers)
    if conflicts:
        return Check("wiring.rope", "RoPE theta and scaling", "WARN", summary, ROPE_TEXT,
                     "RoPE written twice with different values: other programs may read the other", numbers)
    return Check("wiring.rope", "RoPE theta and scaling", "PASS", summary, ROPE_TEXT, numbers=numbers)


MASK_TEXT = (
    "DFlash fills a block of placeholder slots in one pass; each placeholder is the embedding of the mask "
    "token. Its id must be a row of the target's embedding table: an id past the end cannot be embedded "
    "(this engine refuses it; others may read memory past the table or clamp it, and draft garbage). "
    "Inside the table, the id must also be the one the drafter was trained with: another token's embedding "
    "runs, but the drafter reads it as text and drafts far worse. So the check also measures tau with the "
    "ids drafters are usually trained with (the one the card names, the tokenizer's mask token, special "
    "tokens named mask, the highest-numbered special token besides bos / eos / pad / unk, the embedding "
    "rows no token uses) and names one that accepts clearly more."
)


def mask_candidates(tokenizer, vocab_size: int, configured: int | None, card_id: int | None = None) -> dict[int, str]:
    """The other mask ids a drafter of this target is usually trained with (id -> why), inside the
    vocabulary and apart from `configured`."""
    found: dict[int, str] = {}

    def add(token_id, why: str) -> None:
        if isinstance(token_id, int) and 0 <= token_id < vocab_size and token_id != configured:
            found.setdefault(token_id, why)

    add(card_id, "the id the drafter's card names")
    if tokenizer is None:
        return found
    add(getattr(tokenizer, "mask_token_id", None), "the tokenizer's mask token")
    specials = {int(i): getattr(t, "content", str(t)) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    for token_id, text in sorted(specials.items()):
        if "mask" in text.lower():
            add(token_id, f"a special token named {text!r}")
    reserved = {getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    spare = [i for i in specials if i not in reserved]
    if spare:  # what this project's training picks when no special token is named mask
        add(max(spare), f"the highest-numbered special token besides bos / eos / pad / unk ({specials[max(spare)]!r})")
    if len(tokenizer) < vocab_size:  # embedding rows past the tokenizer: released drafters' masks sit there
        add(len(tokenizer), "the first embedding row no token uses")
        add(vocab_size - 1, "the last embedding row, which no token uses")
    return found


def mask_probe_check(configured: int, text: str | None, vocab_size: int, base: float,
                     taus: dict[int, tuple[float, str, str | None]]) -> Check:
    """The mask token check with its probe: tau at the configured id (`base`) and at each candidate
    (id -> (tau, why, token text))."""
    numbers = {"mask_token_id": configured, "vocab_size": vocab_size, "token": text, "tau": base,
               "tau_by_mask_id": {str(i): t for i, (t, _, _) in taus.items()}}
    shown = f" ({text!r})" if text is not None else ""
    words = "; ".join(f"{t:.2f} with id {i}{_text(x)}" for i, (t, _, x) in taus.items())
    summary = f"id {configured}{shown} inside the vocabulary of {vocab_size}, tau {base:.2f}; {words}"
    better = [i for i, (t, _, _) in taus.items() if clearly_better(t, base)]
    if better:
        best = max(better, key=lambda i: taus[i][0])
        tau, why, best_text = taus[best]
        return Check("wiring.mask_token", "mask token", "FAIL",
                     f"{summary}: the drafter was trained with id {best}{_text(best_text)}, {why}", MASK_TEXT,
                     f"wrong mask token (id {configured}; trained with {best})", numbers)
    return Check("wiring.mask_token", "mask token", "PASS", summary, MASK_TEXT, numbers=numbers)


def _text(token_text: str | None) -> str:
    return f" ({token_text!r})" if token_text is not None else ""


def mask_token_check(mask_id, vocab_size: int, token_text: str | None) -> Check:
    numbers = {"mask_token_id": mask_id, "vocab_size": vocab_size, "token": token_text}
    if mask_id is None:
        return Check("wiring.mask_token", "mask token", "FAIL", "the config gives no mask_token_id", MASK_TEXT,
                     "no mask token", numbers)
    if not 0 <= int(mask_id) < vocab_size:
        return Check("wiring.mask_token", "mask token", "FAIL",
                     f"mask_token_id {mask_id} is outside the vocabulary (0..{vocab_size - 1})", MASK_TEXT,
                     "mask token outside the vocabulary", numbers)
    shown = f" ({token_text!r})" if token_text is not None else ""
    return Check("wiring.mask_token", "mask token", "PASS",
                 f"id {mask_id}{shown} inside the vocabulary of {vocab_size}", MASK_TEXT, numbers=numbers)


VOCAB_TEXT = (
    "A drafter may propose from a subset of the vocabulary (a draft vocabulary): a map from its draft "
    "ids to target ids (d2t) and, for vLLM, its own copy of the target's LM head rows for those ids. "
    "If the map and the rows disagree, or a map points past the vocabulary, the drafter proposes tokens "
    "it did not mean, and almost none are accepted."
)


def _rows(head: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of `head` (on any device), on the CPU."""
    return head[ids.to(head.device)].cpu()


def _rows_match(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row: equal up to bf16 rounding, as `pair.validate_pair` allows."""
    return torch.isclose(a.float(), b.float(), rtol=2**-7, atol=1e-6).all(dim=-1)


def vocab_map_check(raw: dict, tensors: dict, target_head: torch.Tensor) -> Check:
    """The draft vocabulary map (`d2t`, or the older `draft_vocab`) against the head rows the
    checkpoint carries and the target's head. tensors: the drafter's safetensors, as stored."""
    vocab, hidden = target_head.shape
    size = raw.get("draft_vocab_size") or (raw.get("dflash_config") or {}).get("draft_vocab_size")
    copy = tensors.get("lm_head.weight")
    title = "draft vocabulary map"
    if "d2t" in tensors:
        ids = tensors["d2t"].long() + torch.arange(len(tensors["d2t"]))
    elif "draft_vocab" in tensors:
        ids = tensors["draft_vocab"].long()
    else:
        if size:
            return Check("wiring.vocab_map", title, "FAIL", f"draft_vocab_size {size} but no d2t in the checkpoint",
                         VOCAB_TEXT, "draft vocabulary without a map")
        return Check("wiring.vocab_map", title, "PASS",
                     f"no draft vocabulary: drafts over all {vocab} ids with the target's head", VOCAB_TEXT,
                     numbers={"draft_vocab_size": None})
    numbers = {"draft_vocab_size": size, "map_entries": len(ids),
               "head_rows": None if copy is None else list(copy.shape)}
    problems = []
    if size is not None and len(ids) != int(size):
        problems.append(f"the map has {len(ids)} entries for draft_vocab_size {size}")
    outside = int(((ids < 0) | (ids >= vocab)).sum())
    if outside:
        problems.append(f"{outside} map entries point outside 0..{vocab - 1}")
    repeats = len(ids) - len(set(ids.tolist()))
    if problems:
        return Check("wiring.vocab_map", title, "FAIL", "; ".join(problems), VOCAB_TEXT, "draft vocabulary map broken",
                     numbers)
    if copy is None:
        return Check("wiring.vocab_map", title, "WARN",
                     f"{len(ids)} draft ids mapped, but no lm_head.weight rows: vLLM then drafts with the target's "
                     "full head, which does not fit the map", VOCAB_TEXT, "draft vocabulary without its head rows",
                     numbers)
    if tuple(copy.shape) != (len(ids), hidden):
        return Check("wiring.vocab_map", title, "FAIL",
                     f"lm_head.weight is {tuple(copy.shape)}, the map needs {(len(ids), hidden)}", VOCAB_TEXT,
                     "head rows do not fit the map", numbers)
    match = _rows_match(copy, _rows(target_head, ids))
    numbers["rows_matching_target"] = int(match.sum())
    if not bool(match.all()):
        wrong = int((~match).sum())
        summary = f"{wrong} of {len(ids)} lm_head rows differ from the target's rows at the mapped ids"
        cause = "draft vocabulary map and head rows disagree"
        for shift in (-1, 1):
            moved = (ids + shift).clamp(0, vocab - 1)
            if bool(_rows_match(copy, _rows(target_head, moved)).float().mean() > 0.9):
                summary += f"; they are the target's rows at the ids {shift:+d}: the map is off by one"
                cause = f"draft vocabulary map off by one ({shift:+d})"
        return Check("wiring.vocab_map", title, "FAIL", summary, VOCAB_TEXT, cause, numbers)
    summary = f"{len(ids)} draft ids inside the vocabulary; the {len(ids)} head rows are the target's rows at those ids"
    if repeats:
        return Check("wiring.vocab_map", title, "WARN", summary + f"; {repeats} ids repeat", VOCAB_TEXT,
                     "draft vocabulary repeats ids", numbers)
    return Check("wiring.vocab_map", title, "PASS", summary, VOCAB_TEXT, numbers=numbers)
