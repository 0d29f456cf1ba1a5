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
    "mirror": "Optimizing Attention with Mirror Descent: Generalized Max-Margin Token Selection "
              "(Julistiono, Tarzanagh, Azizan, 2024)",
    "kqflow": "Implicit Regularization of Gradient Flow on One-Layer Softmax Attention "
              "(Sheen, Chen, Wang, Zhou, 2024)",
    "atlas": "attnsvm's own question, beyond the papers: the geometry of each optimiser's implicit bias",
    "ntp": "Mechanics of Next Token Prediction with Self-Attention (Li, Huang, Ildiz, Rawat, Oymak, 2024)",
    "study": "attnsvm's own study, beyond the papers: do the heads of transformers trained by "
             "next-token prediction become the SVM of the tokens they select?",
    "benign": "Benign Overfitting in Token Selection of Attention Mechanism (Sakamoto, Sato, ICML 2025)",
    "benign_magen": "Benign Overfitting in Single-Head Attention (Magen, Shang, Xu, Frei, Hu, Vardi, "
                    "NeurIPS 2025)",
}


def paper_key(name: str) -> str:
    """The ``PAPERS`` key of the experiment ``name``: the longest key whose dashed form
    (``_`` read as ``-``) is the name or a prefix of it followed by ``-`` (``benign-magen``
    -> ``benign_magen``), else the name's first dash-separated part (``mmts-fig4`` -> ``mmts``)."""
    hits = [k for k in PAPERS if name == k.replace("_", "-") or name.startswith(k.replace("_", "-") + "-")]
    return max(hits, key=len) if hits else name.split("-")[0]


KINDS = ("claim", "sanity", "finding")
"""The three kinds of verdict, kept apart everywhere (registry, report, README, ``list``):

- ``"claim"``: a paper's claim, run at the paper's own setting, metric, population and
  threshold; ``quote`` holds the paper's sentence and ``where`` its section or figure.
  Only these make the headline count.
- ``"sanity"``: a check of attnsvm's set-up (true by construction of the data or the
  solver); a failing one means the experiment did not test what it meant to.
- ``"finding"``: attnsvm's own result beyond the paper (a bigger population, another
  start, an unfiltered set, a new prediction); reported with its evidence and never
  counted as the paper failing.
"""


@dataclass(frozen=True)
class Check:
    """One verdict: what is predicted, what the run measured, and whether it holds.

    ``note`` says why a prediction does not apply or fails (e.g. "not saturated",
    "SVM infeasible for 3 of 100 instances") instead of hiding the case.

    ``kind`` is one of ``KINDS`` (see there). A ``"claim"`` carries the paper's sentence in
    ``quote`` and its place (section, theorem, figure) in ``where``; ``claim`` is then
    the operational statement that is checked (metric and threshold).
    """

    claim: str
    measured: str
    passed: bool
    note: str = ""
    kind: str = "claim"
    quote: str = ""
    where: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Check.kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def sanity(self) -> bool:
        """True for a check of the set-up (``kind == "sanity"``)."""
        return self.kind == "sanity"

    @property
    def verdict(self) -> str:
        """"holds" or "does not hold" (from ``passed``)."""
        return "holds" if self.passed else "does not hold"


@dataclass(frozen=True)
class Claim:
    """A verdict an experiment declares before it runs (``Experiment.verdicts``): what is
    checked (``text``), its ``kind`` (see ``KINDS``) and, for a paper's claim, the paper's
    sentence (``quote``) and its place (``where``: section, theorem, figure).

    ``attnsvm list NAME`` prints the declarations; ``judge`` turns each into the
    :class:`Check` of a run with :meth:`check`, :meth:`at_least` or :meth:`at_most`, so a
    verdict carries the kind, quote and place it was declared with.  ``claim=`` gives the
    check's statement with numbers of the run (default: ``text``).
    """

    text: str
    kind: str = "claim"
    quote: str = ""
    where: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Claim.kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "claim" and not (self.quote and self.where):
            raise ValueError(f"a paper claim needs the paper's sentence and its place "
                             f"(quote=, where=): {self.text!r}")

    def check(self, measured: str, passed: bool, note: str = "", claim: str | None = None) -> Check:
        """The Check of one run: ``passed`` as measured, with this declaration's kind/quote/where."""
        return Check(claim or self.text, measured, bool(passed), note, self.kind, self.quote,
                     self.where)

    def at_least(self, name: str, value: float, threshold: float, note: str = "",
                 fmt: str = ".4g", claim: str | None = None) -> Check:
        """``value >= threshold`` (NaN fails), see :func:`check_at_least`."""
        return check_at_least(claim or self.text, name, value, threshold, note, fmt, self.kind,
                              self.quote, self.where)

    def at_most(self, name: str, value: float, threshold: float, note: str = "",
                fmt: str = ".4g", claim: str | None = None) -> Check:
        """``value <= threshold`` (NaN fails), see :func:`check_at_most`."""
        return check_at_most(claim or self.text, name, value, threshold, note, fmt, self.kind,
                             self.quote, self.where)


def seed_keys(cfg: Mapping[str, Any]) -> list[str]:
    """The config keys that seed an experiment's random draws: ``seed`` and every ``*_seed``
    holding an integer (``mmts-fig7-gpt2``'s ``seeds`` is a count, not a seed)."""
    return [k for k, v in cfg.items()
            if (k == "seed" or k.endswith("_seed")) and isinstance(v, int)
            and not isinstance(v, bool)]


def offset_seeds(cfg: Mapping[str, Any], offset: int) -> dict[str, int]:
    """Overrides that move every seed of ``cfg`` by ``offset`` (``seed_keys``): with them an
    experiment draws a population of datasets and starts disjoint from the shipped one
    whenever ``offset`` exceeds its population's span (``attnsvm reproduce --seed``).
    Empty for an experiment without a seed (its data and start are fixed)."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"seed offset must be an integer >= 0; got {offset!r}")
    return {k: cfg[k] + offset for k in seed_keys(cfg)}


def check_at_least(claim: str, name: str, value: float, threshold: float, note: str = "",
                   fmt: str = ".4g", kind: str = "claim", quote: str = "",
                   where: str = "") -> Check:
    """Check ``value >= threshold`` (NaN fails), with the numbers written out."""
    ok = bool(value >= threshold) if not _isnan(value) else False
    return Check(claim, f"{name} = {value:{fmt}} (needs >= {threshold:{fmt}})", ok, note,
                 kind, quote, where)


def check_at_most(claim: str, name: str, value: float, threshold: float, note: str = "",
                  fmt: str = ".4g", kind: str = "claim", quote: str = "",
                  where: str = "") -> Check:
    """Check ``value <= threshold`` (NaN fails), with the numbers written out."""
    ok = bool(value <= threshold) if not _isnan(value) else False
    return Check(claim, f"{name} = {value:{fmt}} (needs <= {threshold:{fmt}})", ok, note,
                 kind, quote, where)


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
    verdicts: the declared verdicts (:class:`Claim`: kind, the paper's sentence and place),
             shown by ``attnsvm list NAME`` before anything runs; ``judge`` builds its
             checks from them.  Empty for an experiment that declares its checks in judge.
    requires: optional packages the experiment imports, as ``(module, extra)`` pairs, e.g.
             ``(("transformers", "probe"),)``: :meth:`missing` names those not installed, so
             ``attnsvm reproduce`` skips it in the default run (saying what to install) and
             refuses it by name before any work.
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
    verdicts: tuple[Claim, ...] = ()
    requires: tuple[tuple[str, str], ...] = ()

    def missing(self) -> str | None:
        """None when every package of ``requires`` imports; else one line naming the missing
        modules and the ``pip install`` that brings them."""
        import importlib.util

        gone = [(m, x) for m, x in self.requires if importlib.util.find_spec(m) is None]
        if not gone:
            return None
        extras = ",".join(dict.fromkeys(x for _, x in gone))
        return (f"{self.name} needs {', '.join(m for m, _ in gone)} "
                f"(pip install 'attnsvm[{extras}]')")

    @property
    def paper(self) -> str:
        """The citation of the paper this experiment reproduces (``PAPERS`` by the name's prefix)."""
        return PAPERS.get(paper_key(self.name), "")

    def config(self, scale: str = "quick", **overrides: Any) -> dict:
        """The configuration at ``scale`` ("tiny" | "quick" | "full") with ``overrides``
        applied (each key must exist at that scale); ValueError names an unknown scale or key."""
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
        """True when the experiment ran without error and every check (claims and sanity) holds."""
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
        """The checks of the papers' claims (``kind == "claim"``)."""
        return [c for c in self.checks if c.kind == "claim"]

    @property
    def sanity_checks(self) -> list[Check]:
        """The checks of attnsvm's set-up (``kind == "sanity"``)."""
        return [c for c in self.checks if c.kind == "sanity"]

    @property
    def findings(self) -> list[Check]:
        """attnsvm's own findings beyond the papers (``kind == "finding"``)."""
        return [c for c in self.checks if c.kind == "finding"]
