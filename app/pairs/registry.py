"""The model-pair registry: which target/drafter pairs the app offers, read from `pairs.json`.

Each pair says where its models come from and what it needs (a GPU, the Hub); `availability`
explains in words why a pair cannot run here, so the UI can say so instead of failing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..race.lanes import DRAFTER_LANES

REPO_ROOT = Path(__file__).resolve().parents[2]
PAIRS_FILE = Path(__file__).resolve().with_name("pairs.json")


@dataclass(frozen=True)
class PairSpec:
    id: str
    label: str
    target: str
    drafter: str
    needs_gpu: bool = False
    dtype: str = "float32"
    train_hint: str = ""
    # apply_chat_template arguments the drafter was trained with, e.g. {"enable_thinking": false}
    # for the Qwen3 drafters (dflash_core/loading/chat_template.py); None: the engine's default.
    chat_template_args: dict | None = None
    # GPU memory the pair needs, about: the parameter counts in the models' names at bf16 plus the
    # drafter, with `dflash_core.loading.memory_need.MARGIN`. Loading measures it from the Hub first.
    memory_gb: float | None = None
    source: str = ""  # where the Hub ids and the template arguments come from
    # "vllm": raced on two vLLM servers (app/race/vllm_session.py), DFlash at vllm_url and plain at
    # vllm_plain_url (default: the next port); target and drafter then only label it.
    kind: str = "local"
    vllm_url: str = ""
    vllm_plain_url: str = ""
    block_size: int | None = None  # a vllm pair's K + 1, which the server fixes
    # An autoregressive drafter with the DFlash drafter's KV injection, for the race's "AR drafter"
    # lane (dflash_core/drafting.py); "": the pair has none.
    ar_drafter: str = ""
    # A DFlash2 drafter and an input-fusion drafter (the target's features at the input only) for the
    # lanes of those names; "": none. A folder named here but not there yet leaves its lane out of
    # the pair's races, and the status line says why (`lane_missing`).
    dflash2_drafter: str = ""
    fusion_drafter: str = ""

    def lane_drafters(self) -> dict[str, str]:
        """{lane: drafter path or Hub id} of the lanes that race a drafter of their own and that
        this pair names one for (`race.lanes.DRAFTER_LANES`)."""
        named = {lane: getattr(self, f"{lane}_drafter") for lane in DRAFTER_LANES}
        return {lane: name for lane, name in named.items() if name}

    def lane_missing(self, lane: str) -> str | None:
        """Why `lane` cannot race this pair, or None when it can (as far as files tell before loading)."""
        name = self.lane_drafters().get(lane)
        if name is None:
            return f"the pair names no {DRAFTER_LANES[lane]}"
        if not _is_hub_id(name) and not Path(self.location(name), "config.json").is_file():
            return f"its {DRAFTER_LANES[lane]} is not there yet: {self.location(name)} has no config.json"
        return None

    @property
    def is_hub(self) -> bool:
        return _is_hub_id(self.target) or _is_hub_id(self.drafter)

    def drafter_location(self) -> str:
        """Drafter path as the engine should load it: repo-relative paths made absolute."""
        return self.location(self.drafter)

    @staticmethod
    def location(name: str) -> str:
        """A model path or Hub id as the engine should load it: repo-relative paths made absolute."""
        if _is_hub_id(name):
            return name
        path = Path(name).expanduser()
        return str(path if path.is_absolute() else REPO_ROOT / path)


def _is_hub_id(name: str) -> bool:
    # "owner/name" that is not an existing local path; repo-relative paths have more parts.
    if name.startswith(("default:", ".", "/", "~")) or (REPO_ROOT / name).exists() or Path(name).exists():
        return False
    return name.count("/") == 1


def load_pairs(path: Path = PAIRS_FILE) -> tuple[list[PairSpec], str]:
    """(pairs, id of the default pair) from the data file."""
    data = json.loads(Path(path).read_text())
    pairs = [PairSpec(**entry) for entry in data["pairs"]]
    return pairs, data.get("default", pairs[0].id)


def cli_pair(target: str, drafter: str, dtype: str = "float32", ar_drafter: str = "", dflash2_drafter: str = "",
             fusion_drafter: str = "") -> PairSpec:
    """A pair given on the command line (`app.py --target ... --drafter ... [--ar-drafter ...]
    [--dflash2-drafter ...] [--fusion-drafter ...]`)."""
    return PairSpec(
        id="cli",
        label=f"{Path(target).name or target} + {Path(drafter).name or drafter} (command line)",
        target=target,
        drafter=drafter,
        dtype=dtype,
        ar_drafter=ar_drafter,
        dflash2_drafter=dflash2_drafter,
        fusion_drafter=fusion_drafter,
    )


def vllm_pair(url: str, plain_url: str | None, block_size: int) -> PairSpec:
    """A pair served by vLLM (`app.py --vllm-url URL [--vllm-plain-url URL2]`)."""
    return PairSpec(id="vllm", label=f"vLLM at {url}: DFlash (block {block_size}) vs plain", target="(served by vLLM)",
                    drafter="(served by vLLM)", kind="vllm", vllm_url=url, vllm_plain_url=plain_url or "",
                    block_size=block_size)


def availability(spec: PairSpec, device: str) -> str | None:
    """None when the pair can be loaded here, else the reason in plain words."""
    if spec.kind == "vllm":
        return None  # nothing loads here; the servers are asked when the pair is selected
    if spec.needs_gpu and not device.startswith("cuda"):
        return (
            f"{spec.label} needs a CUDA GPU (a 4B-8B target decodes only a few tokens per second on a CPU, "
            "so the race would say nothing useful). Run the app on a GPU machine with internet access, "
            "or choose the offline default pair."
        )
    if spec.is_hub and os.environ.get("HF_HUB_OFFLINE") == "1" and not _cached_on_hub(spec):
        return (
            f"{spec.label} must be downloaded from the Hugging Face Hub, but HF_HUB_OFFLINE=1 and the "
            "models are not in the local cache. Unset HF_HUB_OFFLINE on a machine with internet access."
        )
    if not _is_hub_id(spec.drafter) and not Path(spec.drafter_location(), "config.json").is_file():
        hint = f" To make it, {spec.train_hint}." if spec.train_hint else ""
        return (
            f"The DFlash drafter for this pair is not there yet: {spec.drafter_location()} has no config.json."
            f"{hint} Or start the app with `python app.py --target PATH_OR_ID --drafter PATH_OR_ID`."
        )
    return None


def unavailable_here(spec: PairSpec, device: str) -> str | None:
    """`availability`'s reason in a few words, for the pair's entry in a list; None when it can race here."""
    if availability(spec, device) is None:
        return None
    if spec.needs_gpu and not device.startswith("cuda"):
        return "needs a CUDA GPU; this machine has none"
    if spec.is_hub and os.environ.get("HF_HUB_OFFLINE") == "1" and not _cached_on_hub(spec):
        return "not downloaded, and the Hub is offline"
    return "its drafter is not there yet"


def _cached_on_hub(spec: PairSpec) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    ids = [name for name in (spec.target, spec.drafter) if _is_hub_id(name)]
    return all(isinstance(try_to_load_from_cache(name, "config.json"), str) for name in ids)
