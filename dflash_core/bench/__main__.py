"""`python -m dflash_core.bench [SUBCOMMAND] ...`: the main benchmark, or the subcommand its first word names."""

from __future__ import annotations

import sys
from importlib import import_module

from . import SUBCOMMANDS


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        module, _ = SUBCOMMANDS[argv[0]]
        return import_module(f"{__package__}.{module}").main(argv[1:])
    from .run import main as benchmark

    return benchmark(argv)


if __name__ == "__main__":
    sys.exit(main())
