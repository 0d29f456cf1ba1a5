"""``attnsvm warmup``: compile every numba kernel once (numba's disk cache), visibly.

``make install`` runs it; from a wheel, run it once after ``pip install``. Without it, the
first command that needs a kernel compiles its group then, saying so
(``compiling kernels (once, about N min)``). See :mod:`attnsvm.compiled`.
"""

from __future__ import annotations

import argparse

from attnsvm.cli._args import add_progress, progress_on

HELP = "compile the numba kernels once (minutes on first use; later runs load them in seconds)"


def configure(p: argparse.ArgumentParser) -> None:
    add_progress(p, "a line per kernel group, with the seconds spent")


def run(args: argparse.Namespace) -> int:
    if progress_on(args):  # before the imports of numba and torch (seconds)
        print("attnsvm warmup: the numba kernels, one group at a time", flush=True)
    from attnsvm.compiled import GROUPS, warmup

    times = warmup(progress=progress_on(args))
    missing = [GROUPS[g][1] for g, t in times.items() if t is None]
    if missing:
        print(f"attnsvm warmup: numba cannot be imported; not compiled: {', '.join(missing)} "
              f"(the plain paths compute the same results, more slowly; pip install "
              f"'numba>=0.59')")
        return 0
    print(f"attnsvm warmup: {len(times)} kernel groups ready in {sum(times.values()):.1f} s")
    return 0
