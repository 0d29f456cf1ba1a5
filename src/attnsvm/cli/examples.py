"""``attnsvm examples [NAME] [--copy DIR]``: the tutorial scripts, shipped with the package.

The scripts of the site's tutorials live in ``attnsvm/examples/`` (package data: a wheel
has them). Without arguments: each one with its first line and where it is installed;
``NAME``: the script on stdout; ``--copy DIR``: the scripts (or NAME) copied into DIR, to
run with ``python DIR/NAME.py``. Nothing is fetched.
"""

from __future__ import annotations

import argparse

HELP = "list, print or copy the tutorial scripts shipped with attnsvm (nothing is fetched)"


def scripts() -> dict:
    """``{name: Traversable}`` of the shipped example scripts, sorted by name."""
    from importlib.resources import files

    folder = files("attnsvm") / "examples"
    return {f.name[:-3]: f for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".py")}


def _summary(text: str) -> str:
    """The first line of the script's docstring."""
    for line in text.splitlines():
        line = line.strip().strip('"').strip()
        if line and not line.startswith("#"):
            return line
    return ""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", default=None, metavar="NAME",
                   help="an example to print (or to copy, with --copy); default: list them")
    p.add_argument("--copy", default=None, metavar="DIR",
                   help="copy the scripts (or NAME) into DIR (made if missing; default: print or list "
                        "them)")
    p.add_argument("--force", action="store_true", help="overwrite files in DIR")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnsvm.cli._args import check_out_dir

    found = scripts()
    name = args.name[:-3] if args.name and args.name.endswith(".py") else args.name
    if name is not None and name not in found:
        raise ValueError(f"unknown example {args.name!r}; the examples: {', '.join(found)}")
    chosen = {name: found[name]} if name else found
    if args.copy is not None:
        out = check_out_dir(args.copy, "--copy")
        clash = [f"{n}.py" for n in chosen if (out / f"{n}.py").exists()]
        if clash and not args.force:
            raise ValueError(f"--copy {args.copy}: {', '.join(clash)} exist; pass --force to "
                             f"overwrite, or give another folder")
        out.mkdir(parents=True, exist_ok=True)
        for n, f in chosen.items():
            (out / f"{n}.py").write_text(f.read_text())
            print(f"{Path(out) / (n + '.py')}")
        return 0
    if name is not None:
        print(found[name].read_text(), end="")
        return 0
    for n, f in found.items():
        print(f"{n:<22s} {_summary(f.read_text())}")
    print(f"\n`attnsvm examples NAME` prints one; `attnsvm examples --copy DIR` copies them "
          f"(then python DIR/NAME.py). Installed in {Path(str(found[next(iter(found))])).parent}")
    return 0
