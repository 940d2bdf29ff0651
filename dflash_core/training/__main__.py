"""`python -m dflash_core.training`: a training run from one config file (`config.py`).

    python -m dflash_core.training run configs/smollm2-offline.toml [table.key=value ...]
    python -m dflash_core.training check configs/qwen3-8b-paper.toml    # the checks and the train command, nothing loads
    python -m dflash_core.training regenerate CONFIG [table.key=value ...]   # data.dataset -> shards in data.path
    python -m dflash_core.training schema                                # every key, its type, default and meaning

`run` under torchrun spreads the run over the ranks (`optimization.strategy`):

    torchrun --nproc_per_node 8 -m dflash_core.training run configs/qwen3-8b-paper.toml
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..errors import DFlashError


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dflash_core.training", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("run", "train a drafter as the config says"),
                        ("check", "check the config and print the train command it stands for; loads nothing"),
                        ("regenerate", "have the target answer data.dataset's prompts into shards in data.path")):
        cmd = sub.add_parser(name, help=help_)
        cmd.add_argument("config", help="a TOML file (configs/*.toml)")
        cmd.add_argument("overrides", nargs="*", metavar="table.key=value", help="e.g. optimization.max_steps=20")
    sub.add_parser("schema", help="print every table and key with its type, default and meaning")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from . import config as cfg

    if args.command == "schema":
        print(cfg.schema_text())
        return None
    config = cfg.load_config(args.config, args.overrides)
    if args.command == "regenerate":
        from .regenerate import regenerate

        return regenerate(config, args.config)
    argv = cfg.train_argv(config)
    if args.command == "check":
        print("python -m dflash_core.training.train " + shlex.join(argv))
        try:
            cfg.check_training_data(config, args.config)
        except DFlashError as exc:
            print(f"note: {exc}", file=sys.stderr)
        return None
    cfg.check_training_data(config, args.config)
    from .train import main as train

    return train(argv)


if __name__ == "__main__":
    try:
        main()
    except DFlashError as exc:
        sys.exit(f"error: {exc}")
