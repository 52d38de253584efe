"""The ``het`` command: each subcommand's module registers its flags and its entry point."""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import sys

from het.process import follow_parent

# Each ``het SUBCOMMAND`` and its module, in the order ``het --help`` lists them: the module has
# ``add_parser(subparsers)``, which sets ``func``, the subcommand's entry point.
COMMANDS = {"train": "het.train.cli", "export": "het.export.cli", "predict": "het.export.predict_cli",
            "serve-model": "het.online.cli", "serve": "het.serve", "reshard": "het.ps.reshard",
            "data": "het.data.prepare", "bench": "het.bench", "demo": "het.demo"}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every subcommand's, or ``command``'s alone (only its module is
    imported: ``het train``'s launcher loads no torch before it starts the workers)."""
    p = argparse.ArgumentParser(prog="het", description="Huge embedding model training: sharded parameter "
                                "servers, per-worker caches with per-row clocks, AllReduce for dense layers.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        if command in (None, name):
            importlib.import_module(module).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    # At exit the interpreter's garbage collections walk every object torch made: 0.7-0.9 s of a
    # stopping worker's, shard's or launcher's life on a busy machine, 0.15 s once frozen (measured).
    atexit.register(gc.freeze)
    follow_parent()
    argv = sys.argv[1:] if argv is None else argv
    args = parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as e:  # bad input: say what was wrong, no traceback
        print(f"het {args.command}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
