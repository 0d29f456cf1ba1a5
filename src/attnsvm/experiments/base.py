"""The shape every reproduced experiment takes.

An experiment is three small pure steps, so that each can be tested alone:

    compute(cfg)        -> dict[str, DataFrame]   the numbers (tidy tables)
    judge(tables, cfg)  -> list[Check]            verdicts, computed from the tables only
    plot(tables, cfg, out) -> list[Path]          figures, drawn from the tables only
                                                  (``out=None``: the open Figures, unsaved)

``judge`` never sees the model or the optimiser: a test can hand it a table built
to fail and check that the verdict says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

Tables = dict[str, pd.DataFrame]

PAPERS = {
    "mmts": "Max-Margin Token Selection in Attention Mechanism (Tarzanagh, Li, Zhang, Oymak, 2023)",
    "tfsvm": "Transformers as Support Vector Machines (Tarzanagh, Li, Thrampoulidis, Oymak, 2023)",
    "rates": "Implicit Bias and Fast Convergence Rates for Self-attention (Vasudeva, Deora, Thrampoulidis, 2024)",
    "mirror": "Implicit Bias of Mirror Descent for Softmax Attention (Julistiono, Tarzanagh, Azizan, 2024)",
    "kqflow": "Gradient flow on separate key and query matrices: nuclear-norm implicit bias (Sheen et al., 2024)",
    "atlas": "attnsvm's own question, beyond the papers: the geometry of each optimiser's implicit bias",
    "ntp": "Mechanics of Next Token Prediction with Self-Attention (Li, Huang, Ildiz, Rawat, Oymak, 2024)",
}


@dataclass(frozen=True)
class Check:
    """One verdict: what the theory predicts, what the run measured, and whether it holds.

    ``note`` says why a prediction does not apply or fails (e.g. "not saturated",
    "SVM infeasible for 3 of 100 instances") instead of hiding the case.

    ``sanity=True`` marks a check of the set-up rather than of the paper's claim (true by
    construction of the data or the solver, e.g. "the two candidate SVMs differ", "token
    1 is not locally optimal" on fixed data, rank(W) <= min(n, d)). The report counts
    sanity checks apart from the claims; a failing sanity check means the experiment did
    not test what it meant to, not that the paper is wrong.
    """

    claim: str
    measured: str
    passed: bool
    note: str = ""
    sanity: bool = False

    @property
    def verdict(self) -> str:
        return "holds" if self.passed else "does not hold"


def check_at_least(claim: str, name: str, value: float, threshold: float, note: str = "",
                   fmt: str = ".4g", sanity: bool = False) -> Check:
    """Check ``value >= threshold`` (NaN fails), with the numbers written out."""
    ok = bool(value >= threshold) if not _isnan(value) else False
    return Check(claim, f"{name} = {value:{fmt}} (needs >= {threshold:{fmt}})", ok, note, sanity)


def check_at_most(claim: str, name: str, value: float, threshold: float, note: str = "",
                  fmt: str = ".4g", sanity: bool = False) -> Check:
    """Check ``value <= threshold`` (NaN fails), with the numbers written out."""
    ok = bool(value <= threshold) if not _isnan(value) else False
    return Check(claim, f"{name} = {value:{fmt}} (needs <= {threshold:{fmt}})", ok, note, sanity)


def _isnan(x: Any) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


@dataclass(frozen=True)
class Experiment:
    """A reproduced figure or claim.

    Attributes
    ----------
    name:    registry key, e.g. ``"mmts-fig4"``; the prefix names the paper (see ``PAPERS``).
    title:   the figure it reproduces, e.g. ``"Figure 4: NGD vs GD"``.
    claim:   the paper's claim in one sentence.
    configs: ``{"tiny": {...}, "quick": {...}, "full": {...}}``; ``tiny`` is for tests,
             ``quick`` is the default of ``attnsvm reproduce``, ``full`` the papers' scale.
    compute, judge, plot: see the module docstring.
    deviations: where this reproduction departs from the paper's setting (a different
             step size, scale, tolerance, population), one sentence each with the reason;
             the report lists them under "Where this reproduction differs from the papers".
    """

    name: str
    title: str
    claim: str
    configs: Mapping[str, Mapping[str, Any]]
    compute: Callable[[dict], Tables]
    judge: Callable[[Tables, dict], list[Check]]
    plot: Callable[[Tables, dict, Path], list[Path]]
    in_default: bool = True
    deviations: tuple[str, ...] = ()

    @property
    def paper(self) -> str:
        return PAPERS.get(self.name.split("-")[0], "")

    def config(self, scale: str = "quick", **overrides: Any) -> dict:
        if scale not in self.configs:
            raise ValueError(f"{self.name}: unknown scale {scale!r}; have {sorted(self.configs)}")
        cfg = dict(self.configs[scale])
        cfg.update(overrides)
        cfg["scale"] = scale
        return cfg


@dataclass
class Result:
    """What one experiment produced: tables, verdicts, figures, timing, or the error."""

    experiment: Experiment
    config: dict
    tables: Tables = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)

    def __repr__(self) -> str:
        if self.error is not None:
            what = "ERROR: " + self.error.strip().splitlines()[-1]
        else:
            cl, sa = self.claims, self.sanity_checks
            what = (f"claims {sum(c.passed for c in cl)}/{len(cl)} hold, sanity "
                    f"{sum(c.passed for c in sa)}/{len(sa)}")
        return (f"Result({self.experiment.name!r}, scale={self.config.get('scale')!r}, {what}, "
                f"tables={list(self.tables)}, {self.seconds:.1f} s)")

    @property
    def claims(self) -> list[Check]:
        """The checks of the paper's claims (sanity checks of the set-up excluded)."""
        return [c for c in self.checks if not c.sanity]

    @property
    def sanity_checks(self) -> list[Check]:
        return [c for c in self.checks if c.sanity]
