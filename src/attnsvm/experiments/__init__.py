"""Registry of the reproduced experiments.

Every module in this package that defines ``EXPERIMENT`` (or a list ``EXPERIMENTS``)
of type :class:`~attnsvm.experiments.base.Experiment` is registered under its name.
Adding an experiment is adding one module; nothing else needs editing.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path

from attnsvm.experiments.base import (
    KINDS,
    PAPERS,
    Check,
    Claim,
    Experiment,
    Result,
    Tables,
    check_at_least,
    check_at_most,
)

__all__ = [
    "KINDS", "PAPERS", "Check", "Claim", "Experiment", "Result", "Tables", "check_at_least", "check_at_most",
    "registry", "get", "resolve", "run_experiment",
]

_PRIVATE = {"base"}


def registry() -> dict[str, Experiment]:
    """All experiments, by name, in paper order (mmts, tfsvm, rates, mirror, kqflow)."""
    found: dict[str, Experiment] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _PRIVATE or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        exps = list(getattr(mod, "EXPERIMENTS", []))
        if hasattr(mod, "EXPERIMENT"):
            exps.append(mod.EXPERIMENT)
        for exp in exps:
            if exp.name in found:
                raise RuntimeError(f"experiment {exp.name!r} registered twice")
            found[exp.name] = exp
    papers = list(PAPERS)

    def key(name: str):
        prefix = name.split("-")[0]
        return (papers.index(prefix) if prefix in papers else len(papers), name)

    return {name: found[name] for name in sorted(found, key=key)}


def get(name: str) -> Experiment:
    """The registered experiment ``name`` (KeyError naming it when unknown)."""
    reg = registry()
    if name not in reg:
        raise KeyError(f"unknown experiment {name!r}; `attnsvm list` shows {len(reg)} names")
    return reg[name]


def resolve(experiment: Experiment | str) -> Experiment:
    """An :class:`Experiment`, a registered name (``"mmts-fig4"``), or ``"module:ATTR"``.

    ``"module:ATTR"`` imports ``module`` and takes its attribute ``ATTR``, so experiments
    outside the registry (your own, a notebook's module) can be run and swept too.
    Raises KeyError for an unknown name, ValueError for a ``module:ATTR`` that cannot be
    imported or is not an Experiment, TypeError for anything else.
    """
    if isinstance(experiment, Experiment):
        return experiment
    if not isinstance(experiment, str):
        raise TypeError(f"experiment must be an Experiment or a name; got {type(experiment)}")
    if ":" not in experiment:
        return get(experiment)
    module, _, attr = experiment.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"{experiment}: cannot import module {module!r} ({exc})") from None
    if not hasattr(mod, attr):
        raise ValueError(f"{experiment}: module {module!r} has no attribute {attr!r}")
    obj = getattr(mod, attr)
    if not isinstance(obj, Experiment):
        raise ValueError(f"{experiment} is a {type(obj).__name__}, not an Experiment")
    return obj


@contextmanager
def torch_threads(n: int | None):
    """Run a block with ``n`` torch intra-op threads (None: leave as is), then restore;
    n = 1 puts BLAS on one thread too (:func:`attnsvm.single_thread`). Process-wide: what
    the experiment runner asks for by its ``threads`` argument (the solvers themselves
    never change thread settings)."""
    import torch

    from attnsvm._parallel import single_thread

    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(max(1, int(n)))
    try:
        with single_thread() if n is not None and int(n) == 1 else nullcontext():
            yield
    finally:
        torch.set_num_threads(old)


def run_experiment(exp: Experiment, scale: str = "quick", out: Path | str = ".",
                   threads: int | None = 1, **overrides) -> Result:
    """Compute, judge and plot one experiment; an exception is kept in ``Result.error``.

    Tables computed before a failure in ``judge`` or ``plot`` are kept. ``threads``
    torch threads are used (default 1: the experiments' tensors are small, and on a
    2-core machine shared with other jobs extra threads were measured to cost ~10x).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = exp.config(scale, **overrides)
    res = Result(exp, cfg)
    t0 = time.perf_counter()
    with torch_threads(threads):
        try:
            res.tables = exp.compute(cfg)
            res.checks = exp.judge(res.tables, cfg)
            from attnsvm import plotting

            with plotting.style():
                res.figures = [Path(p) for p in exp.plot(res.tables, cfg, out)]
        except Exception:  # noqa: BLE001 - a report must survive one broken experiment
            res.error = traceback.format_exc()
    res.seconds = time.perf_counter() - t0
    return res
