"""Compiled steps saved to disk, so that a later process loads a step instead of tracing it again.

Inductor keeps its generated code in an on-disk cache, but a process that compiles a step still
traces it first: dynamo walks the step's bytecode through every layer, seconds per step for a
30-layer target on a CPU, over a minute for the app's lanes. torch's `aot_compile` keeps the
traced and compiled step whole, with its guards; a later process loads it from a file in a
second or two and runs the same code (docs/benchmarks.md, "Compiled lanes in the app").

A saved step is only right where the step it was traced from would have been traced the same
way. What dynamo checks on tensors travels with the file and is checked before a loaded step is
taken: the dtype, shape and strides of every weight, cache and input it reads (its `TENSOR_MATCH`
guards) and the relations between the sizes it left symbolic (`SHAPE_ENV`). What dynamo would
check by value or identity, which a file cannot hold, is in the file's name and its folder's
instead (`step_key`, `environment`):

- the step (its function) and its tag in `StepGraphs` (a verify step's tapped layers, a draft
  step's drafter and cache capacity);
- every plain attribute of every module the step's owner reaches (the model's configuration, the
  attention function, each packed linear's library, rows kernel variant and bound, a
  batch-invariant layer's rows), and the forward hooks on them (the feature taps);
- which input sizes are 1 (others are left symbolic: one trace serves every block length) and the
  compile options;
- in the folder's name, the build: the torch, transformers and Python versions, the CPU's
  instruction sets, the `DFLASH_*` variables and the source of `dflash_core` itself.

A file is written whole or not at all; one that cannot be loaded (another build of torch, a
damaged file) is removed and its step compiled and saved again. A step whose guards fail is
compiled anew and saved beside the other. Steps are saved only where the weights stay parameters
(`library` GEMMs on a CPU): `template` freezes them into the step, whose file would carry them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import os
import platform
import shutil
import sys
import threading
from pathlib import Path

import torch
import transformers

from .fallbacks import notice

FORMAT = 1  # raise when what goes into a key or a file changes
SUFFIX = ".step"
KEEP = 3  # environments (builds of torch, transformers, the engine) whose saved steps stay
# The packed linears' record of which weight storage they packed: a process's own addresses.
PROCESS_LOCAL = frozenset({"packed_key"})
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
_HOOKS = ("_forward_hooks", "_forward_pre_hooks")

# This process's steps by environment and key, loaded or compiled, shared by every owner, and the files read.
_KNOWN: dict[tuple[str, str], list] = {}
_READ: set[Path] = set()
# (environment, key) of steps that failed to compile for saving: compiled the usual way.
_UNSAVABLE: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def available() -> bool:
    """Whether this torch can save compiled steps (`torch.compile(...).aot_compile`, torch 2.10+)."""
    return hasattr(torch.compiler, "load_compiled_function")


def tensor_guards(entries) -> list[bool]:
    """Keep dynamo's guards on tensors and on symbolic sizes; the key stands for the rest."""
    return [entry.guard_type in ("TENSOR_MATCH", "SHAPE_ENV") for entry in entries]


def _stable(value):
    """`value` as JSON that is the same in every process where it means the same."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.Size, enum.Enum, Path)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape)]  # its guards check it
    if isinstance(value, (list, tuple)):
        return [_stable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted(json.dumps(_stable(item), sort_keys=True) for item in value)
    if isinstance(value, dict):
        return sorted([json.dumps(_stable(k), sort_keys=True), _stable(v)] for k, v in value.items())
    if isinstance(value, transformers.PretrainedConfig):
        config = value.to_dict()
        config.pop("_name_or_path", None)  # where it was loaded from: not what the step computes
        return [_stable(config), getattr(value, "_attn_implementation", None)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__qualname__, _stable(dataclasses.asdict(value))]
    if callable(value):
        return getattr(value, "__module__", "") + "." + getattr(value, "__qualname__", type(value).__qualname__)
    return type(value).__module__ + "." + type(value).__qualname__


def _module_state(module: torch.nn.Module) -> list:
    """Each submodule's class, public attributes and forward hooks, in order (an underscored
    attribute is nn.Module's bookkeeping, or state shared by every Target over the model)."""
    state = []
    for name, sub in module.named_modules():
        attributes = {key: value for key, value in vars(sub).items()
                      if key not in _MODULE_INTERNALS and key not in PROCESS_LOCAL and not key.startswith("_")}
        hooks = [_stable(hook) for kind in _HOOKS for hook in getattr(sub, kind, {}).values()]
        state.append([name, _stable(type(sub)), _stable(attributes), hooks])
    return state


def _reachable_modules(owner, depth: int = 3) -> list[torch.nn.Module]:
    """The modules among `owner`'s attributes and theirs (plain objects only, `depth` levels)."""
    found, seen, level = [], {id(owner)}, [owner]
    for _ in range(depth):
        following = []
        for obj in level:
            for value in getattr(obj, "__dict__", {}).values():
                if id(value) in seen:
                    continue
                seen.add(id(value))
                if isinstance(value, torch.nn.Module):
                    found.append(value)
                elif not (isinstance(value, (torch.Tensor, type)) or callable(value)):
                    following.append(value)
        level = following
    return found


@functools.cache
def _sources_digest() -> str:
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cpp", ".h")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _cpu_features() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return " ".join(sorted(flags.partition(":")[2].split())) or platform.processor()


def environment() -> dict:
    """What a saved step depends on outside the process's objects."""
    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version,
        "cpu": [torch.backends.cpu.get_cpu_capability(), hashlib.sha256(_cpu_features().encode()).hexdigest()],
        "variables": sorted((k, v) for k, v in os.environ.items() if k.startswith("DFLASH_")),
        "sources": _sources_digest(),
    }


def step_key(step, tag, inputs, options: dict) -> str:
    """The name of `step`'s file: a digest of everything the step's trace read that its tensor
    guards do not check (the module's docstring lists it) but the `environment`, which names the
    file's folder."""
    owner = step.__self__
    described = {
        "step": _stable(step.__func__),
        "tag": _stable(tag),
        "modules": [_module_state(module) for module in _reachable_modules(owner)],
        "inputs": [[str(x.dtype), x.device.type, [size == 1 for size in x.shape]] for x in inputs],
        "options": _stable({k: v for k, v in options.items() if k != "guard_filter_fn"}),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


def environment_digest() -> str:
    """The name of the folder of this build's steps: a digest of `environment()`."""
    return hashlib.sha256(json.dumps(environment(), sort_keys=True).encode()).hexdigest()[:16]


class SavedSteps:
    """The compiled steps in one folder: a step is loaded from it, or compiled and saved there.

    The steps of each `environment` go to a folder of their own inside it; when a step is saved,
    the folders of all but the `KEEP` environments used last are removed (an upgrade or an edit of
    the engine leaves its old steps behind)."""

    def __init__(self, folder: str | Path):
        self.root = Path(folder).expanduser()
        self.folder = self.root / environment_digest()
        self.loaded = 0  # steps this object took from files
        self.saved = 0  # steps it compiled and wrote

    def compile(self, step, inputs, tag, options: dict):
        """A compiled `step` for `inputs` (the owner's state as it is now): a saved one whose guards
        pass, or one compiled now with every size above 1 symbolic, then saved. Returns a callable
        taking `(step.__self__, *inputs)`, or None where the step cannot be compiled for saving
        (the caller compiles it as usual)."""
        args = (step.__self__, *inputs)
        key = step_key(step, tag, inputs, options)
        with _LOCK:
            for compiled in self._known(key):
                if compiled.guard_check(*args):
                    self.loaded += 1
                    return compiled
            if (self.folder.name, key) in _UNSAVABLE:
                return None
        for x in inputs:
            for dim, size in enumerate(x.shape):
                if size > 1:
                    torch._dynamo.maybe_mark_dynamic(x, dim)
        try:
            compiled = torch.compile(step.__func__, fullgraph=True,
                                     options={**options, "guard_filter_fn": tensor_guards}).aot_compile((args, {}))
        except Exception as exc:  # noqa: BLE001 - e.g. a guard on an object a file cannot hold
            notice(f"a compiled step could not be prepared for saving ({type(exc).__name__}: {exc}); "
                   "it compiles as an unsaved one")
            _UNSAVABLE.add((self.folder.name, key))
            return None
        compiled.disable_guard_check()  # checked where it is taken; the step's key fixes its shapes
        with _LOCK:
            _KNOWN.setdefault((self.folder.name, key), []).append(compiled)
            taken = {int(p.name[len(key) + 1:-len(SUFFIX)]) for p in self.folder.glob(f"{key}-*{SUFFIX}")}
            path = self.folder / f"{key}-{max(taken, default=-1) + 1}{SUFFIX}"
            _READ.add(path)
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                compiled.save_compiled_function(str(path))
            except Exception as exc:  # noqa: BLE001 - the step still runs; a later process compiles it again
                notice(f"a compiled step could not be saved to {self.folder} ({type(exc).__name__}: {exc}); "
                       "the next process compiles it again")
            else:
                self.saved += 1
                self._forget_old_environments()
        return compiled

    def _forget_old_environments(self) -> None:
        """Remove the folders of all but the KEEP environments whose steps were used last."""
        with contextlib.suppress(OSError):  # another process may be removing them too
            folders = sorted((p for p in self.root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime,
                             reverse=True)
            for old in folders[KEEP:]:
                if old != self.folder:
                    shutil.rmtree(old, ignore_errors=True)

    def _known(self, key: str) -> list:
        """The steps of `key` this process has, after reading the folder's files of it not read yet."""
        known = _KNOWN.setdefault((self.folder.name, key), [])
        with contextlib.suppress(OSError):  # a folder the process may read but not write
            os.utime(self.folder)  # used now: the environments kept are the ones used last
        for path in sorted(self.folder.glob(f"{key}-*{SUFFIX}")):
            if path in _READ:
                continue
            _READ.add(path)
            try:
                with open(path, "rb") as f:
                    compiled = torch.compiler.load_compiled_function(f)
            except Exception as exc:  # noqa: BLE001 - whatever made it unreadable, compiling again replaces it
                notice(f"a saved compiled step did not load ({type(exc).__name__}: {exc}); it is compiled again")
                path.unlink(missing_ok=True)
                _READ.discard(path)
                continue
            compiled.disable_guard_check()
            known.append(compiled)
        return known
