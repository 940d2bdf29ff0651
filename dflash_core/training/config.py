"""A training run as one typed TOML file: the schema, its checks, `key=value` overrides, and the
`train` command line it stands for.

The file has seven tables, each optional but `[data]` and `[output]`: `[target]`, `[data]`,
`[drafter]`, `[objective]`, `[optimization]`, `[evaluation]`, `[output]`. Every key is typed and
documented below (`python -m dflash_core.training schema` prints them); a key the schema does not
know, a value of the wrong type or out of range, a data folder without shards or a warm-start
folder without a drafter is a `ConfigError` naming the key and the value, raised before any model
loads. Paths are relative to the directory the command runs in.

    [target]
    model = "default:smollm2"
    [data]
    path = "assets/data/smollm2-135m-instruct"
    [output]
    dir = "runs/my-drafter"

Overrides on the command line are `table.key=value`, the value in TOML syntax (`lr=1e-4`,
`shards="132:"`, `resume=true`); a value that is not TOML is taken as a string
(`output.dir=runs/x`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (requirements-train.txt)
    import tomli as tomllib

GROUPS = ("target", "data", "drafter", "objective", "optimization", "evaluation", "output")


class _Table(BaseModel):
    # strict: TOML values are typed, so "3" for an int is a mistake, not something to coerce.
    model_config = ConfigDict(extra="forbid", strict=True)


class TargetConfig(_Table):
    model: str = Field(
        "default:smollm2", description="target directory, Hub id, or default:smollm2 (the offline pair's)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="the frozen target's weights")
    layer_ids: list[int] | None = Field(
        None, description="0-based target layers the drafter reads (default: spread over the target, "
                          "docs/design.md §2)")
    chat_template_kwargs: dict[str, bool | str | int] = Field(
        default_factory=dict,
        description="regeneration only: the chat template's arguments, e.g. {enable_thinking = false} for Qwen3 "
                    "served without thinking")


class DataConfig(_Table):
    path: str = Field(
        description="folder of shards (the datagen format): the training data, and where `regenerate` writes")
    shards: str | None = Field(
        None, description="START:STOP[:STEP][,...]: only these shards, by position in name order")
    text_path: str | None = Field(
        None, description="also train on shards of text the target did not write (`text_data`)")
    text_shards: str | None = Field(None, description="START:STOP[:STEP][,...] of text_path")
    max_len: int = Field(1024, gt=1, description="tokens per sequence (prompt + response), longer ones cut")
    heldout_frac: float = Field(
        0.05, ge=0, lt=1, description="share of sequences held out for evaluation, by hash of their id")
    # Regeneration (`python -m dflash_core.training regenerate CONFIG`).
    dataset: str | None = Field(
        None, description="regeneration: Hub dataset id, or a local folder or file in the Hub layout")
    preset: Literal["sharegpt", "ultrachat", "prompt"] | None = Field(
        None, description="regeneration: the dataset's format (sharegpt: `conversations`; ultrachat: `messages`; "
                          "prompt: a `prompt` column); default: the column the dataset has")
    split: str = Field("train", description="regeneration: the dataset split")
    limit: int | None = Field(None, gt=0, description="regeneration: at most this many prompts")
    max_new_tokens: int = Field(256, gt=0, description="regeneration: tokens per answer at most")
    engine: Literal["transformers", "vllm", "server"] = Field(
        "transformers", description="regeneration: transformers' generate in this process, vLLM's offline batch "
                                    "engine (its own venv), or an OpenAI-compatible server (`server`)")
    server: str | None = Field(
        None, description="regeneration with engine = \"server\": its URL, e.g. http://localhost:8000")
    batch_size: int = Field(32, gt=0, description="regeneration: prompts per batch (transformers, vLLM), or requests "
                                                  "in flight (server)")
    data_parallel_size: int = Field(1, gt=0, description="regeneration with vLLM: engine replicas, one per GPU")
    eager: bool = Field(False, description="regeneration with vLLM: enforce_eager, no torch.compile or CUDA graphs "
                                           "(starts in a fraction of the time, generates slower)")
    shard_size: int = Field(512, gt=0, description="regeneration: answers per shard file")


class DrafterConfig(_Table):
    kind: Literal["dflash", "ar", "dflash2"] | None = Field(
        None, description="dflash: block diffusion (a new drafter's default); ar: autoregressive with the same KV "
                          "injection; dflash2: block convolutions and a path selector (from a DFlash warm start). "
                          "Unset, a warm start keeps its own kind")
    init: str = Field("target", description="target: layers copied from the target's top layers; random; or a "
                                            "released-format drafter folder to warm-start from")
    layers: int | None = Field(None, gt=0, description="drafter layers (default 3; a warm start grows to this many)")
    block_size: int | None = Field(None, ge=2, description="tokens per block (default 16; a warm start keeps its own)")
    draft_vocab: int = Field(
        0, ge=0, description="propose only the N most frequent response tokens (0: the whole vocabulary)")
    mask_token_id: int | None = Field(
        None, ge=0, description="the mask token (default: an unused special token, never the pad token)")
    context_fusion: Literal["kv", "input"] | None = Field(
        None, description="kv: the target's features in every layer's keys and values (DFlash); input: once, as rows "
                          "of the drafter's sequence (the ablation)")
    conv_kernel_size: int = Field(2, gt=0, description="dflash2: convolution taps")
    conv_group_size: int = Field(16, gt=0, description="dflash2: channels per convolution group")
    selector_rank: int = Field(32, gt=0, description="dflash2: selector codebook rank")
    selector_top_k: int = Field(16, gt=0, description="dflash2: candidates per slot")


class ObjectiveConfig(_Table):
    anchors_per_seq: int = Field(
        32, gt=0, description="random anchors per sequence (every response position when it has fewer)")
    slot_weighting: Literal["decay", "dpace"] = Field(
        "decay", description="decay: slot k weighs exp(-(k-1)/gamma); dpace: D-PACE's weights from the drafter's "
                             "own confidence (docs/training.md)")
    gamma: float | None = Field(None, gt=0, description="decay: the rate (default 7 at block 16, 5 at 10, 4 at 8)")
    dpace_alpha: float = Field(0.5, gt=0, le=1, description="dpace: the confidence smoothing")
    soft_labels: int = Field(0, ge=0, description="also learn the target's top-K next-token distribution (0: off)")
    soft_weight: float = Field(0.5, gt=0, le=1, description="weight of the soft labels against the greedy one")
    walk_weight: float = Field(1.0, gt=0, description="weight of the blocks greedy decoding would run, against 1")
    selector_weight: float = Field(1.0, ge=0, description="dflash2: the selector's loss against the block loss")


class OptimizationConfig(_Table):
    epochs: float = Field(6, gt=0, description="passes over the training data")
    max_steps: int | None = Field(
        None, gt=0, description="optimizer steps (instead of epochs; the schedule spans them)")
    time_budget_min: float | None = Field(
        None, gt=0, description="minutes of training; the cosine schedule follows the clock")
    lr: float = Field(6e-4, gt=0, description="peak learning rate (AdamW, betas 0.9/0.95)")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="the cosine's floor, as a share of lr")
    warmup: float = Field(0.04, ge=0, lt=1, description="share of the run spent warming up linearly")
    weight_decay: float = Field(0.0, ge=0)
    clip: float = Field(1.0, gt=0, description="gradient norm clip")
    grad_accum: int = Field(4, gt=0, description="sequences per optimizer step on each rank")
    batch_tokens: int | None = Field(
        None, gt=0, description="block tokens per optimizer step over all ranks (sets grad_accum)")
    amp: Literal["auto", "none", "bf16", "fp16"] = Field(
        "auto", description="autocast: auto is bf16 where the hardware runs it natively (CUDA, AMX/AVX512-BF16)")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="under torchrun: ddp replicates the drafter; fsdp shards its layers (FSDP2). The target "
                          "is replicated either way")
    feature_cache_gb: float = Field(4.0, ge=0, description="keep the target's features of this many GB of sequences")
    seed: int = Field(0, ge=0)
    device: str | None = Field(None, description="cpu, cuda or cuda:N (default: each rank's GPU, else the CPU)")
    threads: int | None = Field(None, gt=0, description="torch CPU threads")


class EvaluationConfig(_Table):
    every: int = Field(100, gt=0, description="optimizer steps between evaluations on the held-out sequences")
    seqs: int = Field(64, gt=0, description="held-out sequences per evaluation")
    patience: int = Field(
        5, gt=0, description="evaluations without a better tau before stopping (from the schedule's midpoint)")


class OutputConfig(_Table):
    dir: str = Field(description="where the drafter (released format), checkpoint/ and train_log.jsonl go")
    save_every: int = Field(100, gt=0, description="optimizer steps between checkpoints")
    log_every: int = Field(10, gt=0, description="optimizer steps between log lines")
    resume: bool = Field(False, description="continue from dir/checkpoint/ when there is one")
    progress: bool = Field(True, description="show a progress bar")


class TrainConfig(_Table):
    target: TargetConfig = Field(default_factory=TargetConfig)
    data: DataConfig
    drafter: DrafterConfig = Field(default_factory=DrafterConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    optimization: OptimizationConfig = Field(default_factory=OptimizationConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    output: OutputConfig

    @model_validator(mode="after")
    def _consistent(self):
        d = self.drafter
        if d.kind == "dflash2" and d.draft_vocab:
            raise ValueError(f"drafter.draft_vocab = {d.draft_vocab}: a DFlash2 drafter proposes from the whole "
                             "vocabulary")
        if d.context_fusion == "input" and d.kind not in (None, "dflash"):
            raise ValueError(f"drafter.context_fusion = \"input\" is implemented for kind \"dflash\" only, "
                             f"not {d.kind!r}")
        if self.optimization.strategy == "fsdp" and d.kind == "dflash2":
            raise ValueError("optimization.strategy = \"fsdp\" shards first-release drafters; a dflash2 drafter "
                             "trains with ddp")
        if self.data.engine == "server" and self.data.dataset and not self.data.server:
            raise ValueError("data.engine = \"server\" needs data.server, the server's URL")
        return self


# ------------------------------------------------------------------------------------ reading


def parse_override(text: str) -> tuple[list[str], object]:
    """`table.key=value` -> (["table", "key"], value), the value read as TOML, else as a string."""
    key, sep, value = text.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) != 2 or not all(path):
        raise ConfigError(f"override {text!r}: expected table.key=value, e.g. optimization.lr=1e-4")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return path, parsed


def _where(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _known_keys(loc: tuple) -> str:
    """The keys the table at `loc` knows, for the message about an unknown one."""
    model = TrainConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return ""
        model = field.annotation
    return ", ".join(model.model_fields)


def _message(err: dict, source: str) -> str:
    loc = err["loc"]
    if err["type"] == "extra_forbidden":
        known = _known_keys(loc)
        table = f"[{_where(loc[:-1])}]" if len(loc) > 1 else "the top level"
        return f"{source}: unknown key {_where(loc)!r}; {table} knows: {known}"
    if err["type"] == "missing":
        return f"{source}: {_where(loc)} is required"
    if err["type"] == "value_error":
        return f"{source}: {err['msg'].removeprefix('Value error, ')}"
    return f"{source}: {_where(loc)} = {err.get('input')!r}: {err['msg']}"


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """The checked config of the TOML file `path` with `overrides` applied; a `ConfigError` that
    names every bad key or value otherwise. Reads no model and no data, only checks that the
    folders it names exist."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    for text in overrides:
        (table, key), value = parse_override(text)
        if not isinstance(raw.setdefault(table, {}), dict):
            raise ConfigError(f"override {text!r}: {table} is not a table in {path}")
        raw[table][key] = value
    try:
        config = TrainConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(_message(err, str(path)) for err in exc.errors())) from None
    check_paths(config, str(path))
    return config


def check_paths(config: TrainConfig, source: str) -> None:
    """The folders and shard ranges a run needs, checked before anything loads."""
    from .data import shard_range

    problems = []
    for key in ("shards", "text_shards"):
        value = getattr(config.data, key)
        if value is not None:
            try:
                shard_range(value)
            except Exception as exc:  # argparse's type error words the format
                problems.append(f"data.{key} = {value!r}: {exc}")
    text = config.data.text_path
    if text is not None and not any(Path(text).glob("shard-*.npz")):
        problems.append(f"data.text_path = {text!r}: no shard-*.npz files there")
    init = config.drafter.init
    if init not in ("target", "random") and not (Path(init) / "config.json").is_file():
        problems.append(f"drafter.init = {init!r}: neither \"target\", \"random\" nor a drafter folder "
                        "(no config.json there)")
    if problems:
        raise ConfigError("\n".join(f"{source}: {p}" for p in problems))


def check_training_data(config: TrainConfig, source: str) -> None:
    """`run` needs shards in data.path (`regenerate` writes them)."""
    if not any(Path(config.data.path).glob("shard-*.npz")):
        hint = " (run `python -m dflash_core.training regenerate` first)" if config.data.dataset else ""
        raise ConfigError(f"{source}: data.path = {config.data.path!r}: no shard-*.npz files there{hint}")


# ------------------------------------------------------------------------------------ the command it stands for


def train_argv(config: TrainConfig) -> list[str]:
    """`python -m dflash_core.training.train`'s arguments for `config`."""
    t, d, dr, o, op, e, out = (config.target, config.data, config.drafter, config.objective, config.optimization,
                               config.evaluation, config.output)
    argv = ["--target", t.model, "--target-dtype", t.dtype, "--data", d.path, "--out", out.dir,
            "--max-len", str(d.max_len), "--heldout-frac", repr(d.heldout_frac)]

    def opt(flag: str, value) -> None:
        if value is not None:
            argv.extend([flag, str(value)])

    opt("--target-layer-ids", ",".join(map(str, t.layer_ids)) if t.layer_ids else None)
    opt("--shards", d.shards)
    opt("--text-data", d.text_path)
    opt("--text-shards", d.text_shards)
    # The drafter
    if dr.init == "target":
        argv.append("--init-from-target")
    elif dr.init != "random":
        opt("--init-from", dr.init)
    if dr.kind == "dflash2":
        argv.append("--dflash2")
    else:
        opt("--drafter-kind", dr.kind)
    opt("--layers", dr.layers)
    opt("--block-size", dr.block_size)
    opt("--draft-vocab", dr.draft_vocab)
    opt("--mask-token-id", dr.mask_token_id)
    opt("--context-fusion", dr.context_fusion)
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        opt("--" + key.replace("_", "-"), getattr(dr, key))
    # The objective
    opt("--anchors-per-seq", o.anchors_per_seq)
    opt("--slot-weighting", o.slot_weighting)
    opt("--gamma", o.gamma)
    opt("--dpace-alpha", o.dpace_alpha)
    opt("--soft-labels", o.soft_labels)
    opt("--soft-weight", o.soft_weight)
    opt("--walk-weight", o.walk_weight)
    opt("--selector-weight", o.selector_weight)
    # Optimization
    opt("--epochs", op.epochs)
    opt("--max-steps", op.max_steps)
    opt("--time-budget", op.time_budget_min)
    for key in ("lr", "min_lr_ratio", "warmup", "weight_decay", "clip", "grad_accum", "batch_tokens", "amp",
                "strategy", "feature_cache_gb", "seed", "device", "threads"):
        opt("--" + key.replace("_", "-"), getattr(op, key))
    # Evaluation and output
    opt("--eval-every", e.every)
    opt("--eval-seqs", e.seqs)
    opt("--patience", e.patience)
    opt("--save-every", out.save_every)
    opt("--log-every", out.log_every)
    if out.resume:
        argv.append("--resume")
    if not out.progress:
        argv.append("--no-progress")
    return argv


def schema_text() -> str:
    """Every table and key with its type, default and meaning, as TOML comments and values."""
    lines = []
    for group in GROUPS:
        model = TrainConfig.model_fields[group].annotation
        lines.append(f"[{group}]")
        for name, field in model.model_fields.items():
            default = "(required)" if field.is_required() else _toml(field.get_default(call_default_factory=True))
            kind = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
            lines.append(f"# {field.description or ''} ({kind})".replace(" ()", ""))
            lines.append(f"{name} = {default}" if default != "(unset)" else f"# {name} = (unset)")
        lines.append("")
    return "\n".join(lines)


def _toml(value) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{}" if not value else "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)
