"""The ``het`` command: each subcommand's module registers its flags and its entry point."""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import sys

# The modules behind ``het SUBCOMMAND``, in the order ``het --help`` lists them: each has
# ``add_parser(subparsers)``, which sets ``func``, the subcommand's entry point.
COMMANDS = ("het.train.cli", "het.export.cli", "het.export.predict_cli", "het.online.cli", "het.serve", "het.ps.reshard",
            "het.data.prepare", "het.bench", "het.demo")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="het", description="Huge embedding model training: sharded parameter "
                                "servers, per-worker caches with per-row clocks, AllReduce for dense layers.")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    # At exit the interpreter's garbage collections walk every object torch made: 0.7-0.9 s of a
    # stopping worker's, shard's or launcher's life on a busy machine, 0.15 s once frozen (measured).
    atexit.register(gc.freeze)
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as e:  # bad input: say what was wrong, no traceback
        print(f"het {args.command}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
