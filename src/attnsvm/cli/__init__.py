"""Command-line entry point: ``attnsvm <command> ...``.

Each sub-command lives in its own module of this package, exposing

    HELP: str                                   one line for ``attnsvm --help``
    def configure(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int     exit status

Command modules import heavy libraries (torch, cvxpy, transformers) inside
``run`` only, so ``attnsvm --help`` and ``attnsvm list`` start instantly.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command name -> module in attnsvm.cli
COMMANDS = {
    "list": "list_",
    "reproduce": "reproduce",
    "train": "train",
    "solve": "solve",
    "vit": "vit",
    "probe": "probe",
    "sweep": "sweep",
}


def _load(name: str):
    return importlib.import_module(f"attnsvm.cli.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnsvm",
        description="Max-margin token selection in attention: train, solve, reproduce.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = _load(name)
        except ModuleNotFoundError as exc:  # a command whose module is not installed
            if exc.name and exc.name.startswith("attnsvm.cli"):
                continue
            raise
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.configure(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    return int(args._module.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
