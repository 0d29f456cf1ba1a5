"""Command-line entry point: ``attnsvm <command> ...``.

Each sub-command lives in its own module of this package, exposing

    HELP: str                                   one line for ``attnsvm --help``
    def configure(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int     exit status

Command modules import heavy libraries (torch, cvxpy, transformers) inside
``run`` only, so ``attnsvm --help`` and ``attnsvm list`` start instantly.

Errors: :func:`main` is the one place that turns an exception into what the user sees.
A user error (a ValueError or OSError: a bad file, a bad argument value, an argument a
command would ignore) is one line on stderr, ``attnsvm CMD: error: ...``, and exit
status 2; a usage error found by argparse is one line too (exit 2). Running out of memory
(a MemoryError: input too large for this machine) is one line, exit 2, too. Any other
exception is a bug: one line that says so, exit 1. ``--debug`` (or ``ATTNSVM_DEBUG=1``) re-raises
instead, with the full traceback. Ctrl-C is exit 130.

Figures: :func:`main` selects matplotlib's non-interactive Agg backend before it runs a
command, so the commands render figures on a headless machine. Importing attnsvm (the
library, ``attnsvm.plotting`` included) never changes the backend: a notebook keeps its
inline plots.

Help: every option's help ends with its default (:class:`~attnsvm.cli._args.HelpFormatter`),
and a command module may set ``EPILOG`` (text shown after the options, e.g. the .npz
format). Default outputs go under one root, ``attnsvm-out/<command>/`` (``--out`` /
``--store`` override it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys

from attnsvm.cli._args import HelpFormatter

# command name -> module in attnsvm.cli
COMMANDS = {
    "list": "list_",
    "reproduce": "reproduce",
    "train": "train",
    "solve": "solve",
    "vit": "vit",
    "probe": "probe",
    "sweep": "sweep",
    "warmup": "warmup",
    "examples": "examples",
}

USER_ERRORS = (ValueError, OSError)


def _load(name: str):
    return importlib.import_module(f"attnsvm.cli.{COMMANDS[name]}")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (`{self.prog} --help` "
                     f"shows the usage)\n")


def one_line(text: str) -> str:
    """``text`` on one line: its non-blank lines joined by '; '."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return "; ".join(lines)


def describe(exc: BaseException) -> str:
    """The message of ``exc`` on one line (KeyError's repr quotes dropped)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        msg = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        msg = f"{exc.filename}: {exc.strerror}"
    else:
        msg = str(exc)
    return one_line(msg) or type(exc).__name__


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``attnsvm`` parser; ``only``: configure that command's options alone (the others
    keep their one-line help), so that a command does not pay for the imports another
    command's options need (``train``'s choices import torch)."""
    parser = _Parser(
        prog="attnsvm",
        description="Max-margin token selection in attention: train, solve, reproduce.",
        epilog="`attnsvm COMMAND --help` shows a command's options and their defaults.\n"
               "Outputs go under attnsvm-out/<command>/ unless --out (sweep: --store) says "
               "otherwise.\nThe mathematics: docs/theory.md; extending: docs/extending.md.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error instead of one line")
    from attnsvm import __version__

    parser.add_argument("--version", action="version", version=f"attnsvm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            mod = _load(name)
        except ModuleNotFoundError as exc:  # a command whose module is not installed
            if exc.name and exc.name.startswith("attnsvm.cli"):
                continue
            raise
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           epilog=getattr(mod, "EPILOG", None), formatter_class=HelpFormatter)
        if only is None or name == only:
            mod.configure(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the Python traceback of an error instead of one line")
        p.set_defaults(_module=mod)
    return parser


def use_agg() -> None:
    """Select matplotlib's Agg backend (headless figures) for the command about to run; the
    CLI is the one place that does so (importing attnsvm leaves the backend alone)."""
    try:
        import matplotlib
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return
    matplotlib.use("Agg")


def main(argv: list[str] | None = None) -> int:
    """Run ``attnsvm ARGV``; returns the exit status (never raises for a user error)."""
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    debug = args.debug or os.environ.get("ATTNSVM_DEBUG", "") not in ("", "0")
    prog = f"attnsvm {args.command}"
    use_agg()
    with log_to_stderr():
        return _run(args, prog, debug)


def _run(args: argparse.Namespace, prog: str, debug: bool) -> int:
    """The command, its exceptions turned into what the user sees (see the module)."""
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `attnsvm list | head`: the reader left; nothing to report
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit flush
        except OSError:
            pass
        return 141
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"{prog}: error: {describe(exc)}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # too large for this machine: the input's size, not a bug
        if debug:
            raise
        print(f"{prog}: error: out of memory ({describe(exc)}); use smaller inputs",
              file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug: one line, the traceback on request
        if debug:
            raise
        print(f"{prog}: internal error ({type(exc).__name__}): {describe(exc)} "
              f"(a bug; `attnsvm --debug {args.command} ...` shows the traceback)",
              file=sys.stderr)
        return 1


class _StderrHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (pytest's capture, a redirect)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; the property reads sys.stderr
        pass


@contextlib.contextmanager
def log_to_stderr():
    """The CLI's handler of the library's log records (``logging.getLogger("attnsvm")``):
    INFO and above as one line each on stderr, ``attnsvm: MESSAGE``, as the commands print.
    The library itself only logs (a program that imports it configures logging its own
    way; without any configuration Python prints WARNING and above). The logger's handlers,
    level and propagation are restored when the command ends."""
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("attnsvm: %(message)s"))
    handler.setLevel(logging.INFO)
    log = logging.getLogger("attnsvm")
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
