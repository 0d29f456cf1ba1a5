"""atlas-ntp (the atlas's NTP column): verdicts on tables built to pass and to fail, and the
pipeline's cells against an independent Graph-SVM formulation."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import atlas_ntp as A


def _tables(corr_pred=0.9995, corr_other=0.9, neither=0.8, saturated=True, near=None, sep=0.9,
            status="optimal"):
    """NGD (predicted fro), sign descent (predicted neither), a (K, Q) row without one."""
    runs, cells = [], []
    for name, pred in (("NGD", "fro"), ("sign descent", "neither"), ("Adam (eps=0) on (K, Q)", "")):
        for b in range(10):
            c = ({"fro": corr_pred, "nuc": corr_other} if pred == "fro"
                 else {"fro": neither, "nuc": neither - 0.05})
            nearest = near or max(c, key=c.get)
            runs.append(dict(optimizer=name, param="W", size="n4T6K8d8", run=b, predicted=pred,
                             steps=100, saturated=saturated, p_sel_min=1.0, stop_reason="", norm=10.0,
                             selected_is_label=True, corr_fro=c["fro"], corr_nuc=c["nuc"],
                             nearest=nearest, status_fro=status, status_nuc="optimal", fro_vs_nuc=sep))
            for col in A.COLUMNS:
                cells.append(dict(optimizer=name, size="n4T6K8d8", run=b, column=col, corr=c[col],
                                  dist=1 - c[col], saturated=saturated, nearest=nearest))
    runs, cells = pd.DataFrame(runs), pd.DataFrame(cells)
    return {"runs": runs, "cells": cells, "atlas": A.atlas_table(runs, cells, A.ROWS, A.COLUMNS)}


def test_judge_passes_and_declares_only_findings_and_sanity_checks():
    checks = A.judge(_tables(), {})
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert {c.kind for c in checks} == {"sanity", "finding"}
    kinds = {k: v.kind for k, v in A.CLAIMS.items()}
    assert kinds == {"saturate": "sanity", "certified": "sanity", "differs": "sanity",
                     "nearest": "finding", "converges": "finding", "neither": "finding"}
    # NGD: 3 sanity + nearest + converges; sign: 3 + neither; the (K, Q) row: 3 only
    assert len(checks) == 5 + 4 + 3
    assert A.EXPERIMENT.verdicts == tuple(A.CLAIMS.values())


FAILS = [  # (tables, the claims that fail)
    (dict(saturated=False), {"NGD: the runs saturate", "sign descent: the runs saturate",
                             "Adam (eps=0) on (K, Q): the runs saturate",
                             "NGD: the Frobenius Graph-SVM is the nearer",
                             "NGD: converges in direction", "sign descent: converges to neither"}),
    (dict(status="uncertified"), {"NGD: every Graph-SVM", "sign descent: every Graph-SVM",
                                  "Adam (eps=0) on (K, Q): every Graph-SVM"}),
    (dict(sep=0.995), {"NGD: the two Graph-SVMs differ", "sign descent: the two Graph-SVMs differ",
                       "Adam (eps=0) on (K, Q): the two Graph-SVMs differ"}),
    (dict(near="nuc"), {"NGD: the Frobenius Graph-SVM is the nearer"}),
    (dict(corr_pred=0.95), {"NGD: converges in direction"}),
    (dict(neither=0.995), {"sign descent: converges to neither"}),
]


@pytest.mark.parametrize("kw, failing", FAILS)
def test_each_verdict_fails_on_a_violating_table(kw, failing):
    bad = {c.claim for c in A.judge(_tables(**kw), {}) if not c.passed}
    assert {next(f for f in failing if b.startswith(f)) for b in bad} == failing, bad
    assert len(bad) == len(failing)


def _reference_w(E, seqs, Y, exclude, norm):
    """The Graph-SVM from its definition (labels Y (n, L), excluded positions), a scalar
    constraint per (i, label, position), SCCs by transitive closure, cvxpy + Clarabel."""
    K, d = E.shape
    edges = [(int(seqs[i, -1]), int(y), int(seqs[i, t])) for i in range(len(seqs)) for y in Y[i]
             if y >= 0 for t in range(seqs.shape[1]) if seqs[i, t] != y and not exclude[i, t]]
    reach = {}
    for k in {e[0] for e in edges}:
        A = np.eye(K, dtype=bool)
        for q, a, b in edges:
            A[a, b] |= q == k
        for m in range(K):
            A |= A[:, m:m + 1] & A[m:m + 1, :]
        reach[k] = A & A.T
    W = cp.Variable((d, d))
    cons = [((E[a] - E[b]) @ W @ E[k] == 0) if reach[k][a, b] else ((E[a] - E[b]) @ W @ E[k] >= 1)
            for k, a, b in edges]
    obj = cp.norm(W, "fro") if norm == "fro" else cp.normNuc(W)
    cp.Problem(cp.Minimize(obj), cons).solve(solver="CLARABEL")
    return W.value


def test_tiny_cells_match_an_independent_training_and_solve():
    from attnsvm.metrics import correlation
    from attnsvm.ntp import NTPModel
    from attnsvm.optim import ngd
    from attnsvm.train import train

    cfg = A.EXPERIMENT.config("tiny", rows=["NGD", "GD flow on (K, Q)"])
    tables = A.compute(cfg)
    cells, runs = tables["cells"], tables["runs"]
    Ds = A.population(cfg["sizes"][0], cfg["graph"], cfg["seed"], cfg["S"])
    tr = train(NTPModel(8, "W", "iden"), Ds, optimizer=ngd(cfg["lr"]), steps=cfg["steps"],
                   seed=cfg["seed"] + A.row_seed("NGD"), scale=cfg["init_scale"])
    n_checked = 0
    for s, D in enumerate(Ds):
        a = tr.W[s]
        lg = np.stack([D.E[D.seqs[i]] @ a @ D.E[D.seqs[i, -1]] for i in range(D.n)])  # (n, T)
        sm = np.exp(lg - lg.max(1, keepdims=True))
        sm /= sm.sum(1, keepdims=True)
        mass = np.zeros((D.n, D.K))
        np.add.at(mass, (np.repeat(np.arange(D.n), D.T), D.seqs.ravel()), sm.ravel())
        Y = [np.nonzero(m > 1e-2)[0] for m in mass]
        Yp = np.full((D.n, max(map(len, Y))), -1)
        for i, y in enumerate(Y):
            Yp[i, :len(y)] = y
        ex = ((mass > 9e-3) & (mass <= 1e-2))[np.arange(D.n)[:, None], D.seqs]
        for col in A.COLUMNS:
            ref = float(correlation(a, _reference_w(D.E, D.seqs, Yp, ex, col)))
            got = cells[(cells.optimizer == "NGD") & (cells.run == s) & (cells.column == col)]
            assert float(got["corr"].iloc[0]) == pytest.approx(ref, abs=1e-5), (s, col)
            n_checked += 1
    assert n_checked == 2 * cfg["S"]
    r = runs[runs.optimizer == "NGD"]
    assert (r.nearest == np.where(r.corr_fro >= r.corr_nuc, "fro", "nuc")).all()
    assert set(runs.param) == {"W", "KQ"}
