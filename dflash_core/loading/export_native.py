"""`python -m dflash_core.loading.export_native SRC OUT [--target T]`: a drafter as a checkpoint transformers
runs natively (no remote code).

SRC is any drafter this engine loads (one of this project's, a released z-lab DFlash checkpoint, or
a native one); OUT gets `config.json` and `model.safetensors` in transformers' `MuseGlimmerAssistantModel`
layout (`native_format.py`), which loads with `AutoModel.from_pretrained(OUT)` and drafts in

    target.generate(ids, assistant_model=draft, speculation_type="dflash", do_sample=False)

The native drafter drafts over the target's whole LM head: a draft vocabulary is dropped, so such a
drafter's native drafts may differ from this engine's (decoding stays lossless either way). With
`--target`, the drafter is first checked against that target and the target's special token ids are
recorded. With a transformers that has native DFlash (5.25 on) the config is written through its
config class and the state's shapes are checked against its model; an older transformers (which
cannot run the result) still writes the same fields, and transformers fills in its defaults on load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import ConfigError, DFlashError
from ..models.drafter import DFlashDrafter
from ..models.hub import resolve_model_dir
from ..models.native_format import NATIVE_ARCHITECTURE, NATIVE_MODEL_TYPE, native_config, to_native_state
from .pair import load_pair, parse_dtype, validate_pair


def native_classes():
    """transformers' native DFlash config and model classes, or None where this transformers has none
    (they came with 5.25)."""
    try:
        from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
    except ImportError:
        return None
    return MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel


def stored_dtype(directory: Path) -> torch.dtype:
    """The dtype a drafter's config says its weights are stored in (float32 when it says none)."""
    raw = json.loads((directory / "config.json").read_text())
    return parse_dtype(raw.get("dtype") or raw.get("torch_dtype") or "float32")


def export_native(src, out, target=None, dtype=None) -> DFlashDrafter:
    """Write the drafter at `src` (path or Hub id) to the directory `out` in transformers' native
    format, in `dtype` (default: as stored); return the drafter as this engine loaded it.

    `target` (path, Hub id or `default:...`): check the drafter against it first, and record its
    bos/eos/pad ids in the native config.
    """
    classes = native_classes()
    directory = resolve_model_dir(src, ("config.json", "model.safetensors"))
    dtype = parse_dtype(dtype) if dtype else stored_dtype(directory)
    drafter = DFlashDrafter.from_pretrained(directory, dtype=dtype)
    special = None
    if target is not None:
        target_model = load_pair(target).target
        validate_pair(target_model, drafter)
        target_config = target_model.model.config
        special = {k: getattr(target_config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    fields = native_config(drafter.config, special)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in to_native_state(drafter.state_dict()).items()}
    if classes is not None:
        config_class, model_class = classes
        config = config_class(**fields)
        config.architectures = [NATIVE_ARCHITECTURE]
        config.dtype = dtype
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in model_class(config).state_dict().items()}
        got = {k: tuple(v.shape) for k, v in state.items()}
        if got != expected:
            # A bug in the mapping, not the user's input: name every key that differs.
            differ = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
            raise ConfigError(f"the native state does not match {NATIVE_ARCHITECTURE}'s at {differ}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if classes is not None:
        config.save_pretrained(out)
    else:
        raw = {"architectures": [NATIVE_ARCHITECTURE], "model_type": NATIVE_MODEL_TYPE,
               "dtype": str(dtype).removeprefix("torch."), **fields}
        (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return drafter


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_core.loading.export_native", description=__doc__.splitlines()[0])
    parser.add_argument("src", help="drafter directory or Hub id (this project's, a released DFlash one, or native)")
    parser.add_argument("out", help="directory to write the native checkpoint to")
    parser.add_argument("--target", help="check the drafter against this target first (path, Hub id or default:smollm2)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="weights' dtype (default: as stored)")
    args = parser.parse_args(argv)
    try:
        drafter = export_native(args.src, args.out, args.target, args.dtype)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = drafter.config
    dropped = f"; its draft vocabulary of {config.draft_vocab_size} ids was dropped" if config.draft_vocab_size else ""
    print(f"wrote {args.out}: {NATIVE_ARCHITECTURE}, {config.num_hidden_layers} layers, block {config.block_size}, "
          f"drafting over the target's whole LM head{dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
