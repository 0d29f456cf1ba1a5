"""ntp-global / ntp-local: every verdict on tables built to pass and to fail."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import ntp

G = next(e for e in ntp.EXPERIMENTS if e.name == "ntp-global")
L = next(e for e in ntp.EXPERIMENTS if e.name == "ntp-local")


def _runs_global(corr=0.99, fin0=0.2, finT=0.01):
    rows = []
    for c, (size, graph) in enumerate([("n4T6K8d8", "cyclic"), ("n4T6K8d8", "acyclic")]):
        for s in range(3):
            for step, cs, fd in ((0, 0.3, fin0), (100, corr, finT)):
                rows.append(dict(cell=c, size=size, graph=graph, seed=s, step=step, loss=1.0,
                                 corr_svm=cs, corr_dec=cs, fin_diff=fd if graph == "cyclic" else 0.0,
                                 resid=0.1, R=1.0))
    runs = pd.DataFrame(rows)
    sols = pd.DataFrame([dict(cell=r.cell, size=r.size, graph=r.graph, seed=r.seed, status="optimal",
                              gap=1e-12, n_eq=2 if r.graph == "cyclic" else 0, fin_converged=True,
                              fin_norm=0.1, svm_norm=3.0)
                         for r in runs[runs.step == 0].itertuples()])
    return {"runs": runs, "solutions": sols}


def _find(checks, text):
    hits = [c for c in checks if text in c.claim]
    assert hits, text
    return hits


def test_global_passes_on_a_good_table():
    cfg = G.config("tiny")
    checks = ntp.judge_global(_runs_global(), cfg)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert any(ntp.Q_GLOBAL == c.quote for c in checks) and any(ntp.Q_DECOMP == c.quote for c in checks)
    assert {c.kind for c in checks} == {"claim", "finding", "sanity"}


def test_global_hard_retrieval_fails_when_one_seed_is_below():
    t = _runs_global()
    r = t["runs"]
    r.loc[(r.seed == 1) & (r.step == 100) & (r.graph == "acyclic"), ["corr_svm", "corr_dec"]] = 0.9
    checks = ntp.judge_global(t, G.config("tiny"))
    bad = [c for c in _find(checks, "acyclic] every seed reaches") if not c.passed]
    assert len(bad) == 1 and "0.6667" in bad[0].measured


def test_global_soft_composition_fails_when_fin_diff_grows():
    t = _runs_global(finT=0.5)
    checks = ntp.judge_global(t, G.config("tiny"))
    assert not _find(checks, "norm of difference")[0].passed
    # a start already within the step resolution passes only if it ends within lr
    t = _runs_global(fin0=0.002, finT=0.004)
    assert _find(ntp.judge_global(t, G.config("tiny")), "norm of difference")[0].passed
    t = _runs_global(fin0=0.002, finT=0.02)
    assert not _find(ntp.judge_global(t, G.config("tiny")), "norm of difference")[0].passed


@pytest.mark.parametrize("col, val, text", [("status", "uncertified", "certified optimal"),
                                            ("fin_converged", False, "W_fin converged"),
                                            ("n_eq", 0, "tie (equality) rows")])
def test_global_sanity_fails(col, val, text):
    t = _runs_global()
    t["solutions"].loc[0, col] = val
    c = _find(ntp.judge_global(t, G.config("tiny")), text)[0]
    assert c.sanity and not c.passed


def test_global_residual_finding_fails_on_a_large_residual():
    t = _runs_global()
    t["runs"]["resid"] = 0.5
    hits = _find(ntp.judge_global(t, G.config("tiny")), "superposition explains")
    assert hits and all(c.kind == "finding" and not c.passed for c in hits)


def _tables_local(corr=0.99):
    rows = []
    for s in range(3):
        for step, cs in ((0, 0.3), (100, corr)):
            rows.append(dict(cell=0, size="n6T4K6d8", graph="cyclic", seed=s, step=step, loss=1.0,
                             corr_svm_local=cs, corr_dec_local=cs, corr_svm_global=0.5,
                             corr_dec_global=0.5))
    sols = pd.DataFrame([dict(seed=s, status_global="optimal", status_local="optimal", gap_local=0.0,
                              fin_converged=True, n_selected_max=1, selected_is_label=True)
                         for s in range(3)])
    return {"runs": pd.DataFrame(rows), "solutions": sols}


def test_local_verdicts():
    cfg = L.config("tiny")
    assert all(c.passed for c in ntp.judge_local(_tables_local(), cfg))
    c = ntp.judge_local(_tables_local(corr=0.9), cfg)[0]
    assert not c.passed and c.quote == ntp.Q_SUPER and c.kind == "claim"
    t = _tables_local()  # every run reaches the global Graph-SVM: the finding fails
    t["runs"][["corr_svm_global", "corr_dec_global"]] = 0.99
    c = _find(ntp.judge_local(t, cfg), "not the global one")[0]
    assert c.kind == "finding" and not c.passed
    t = _tables_local()
    t["solutions"].loc[1, "status_local"] = "suboptimal"
    assert not _find(ntp.judge_local(t, cfg), "local Graph-SVM is certified")[0].passed
    t = _tables_local()
    t["solutions"].loc[1, "n_selected_max"] = 9
    assert not _find(ntp.judge_local(t, cfg), "selected tokens")[0].passed


def test_selected_tokens_rule():
    """The notebook's C_thres / E_thres rule on a hand-set attention."""
    from attnsvm.ntp import NTPData, NTPModel

    E = np.eye(4)
    D = NTPData(E, [[0, 1, 2, 3]], [0])
    W = np.zeros((4, 4))
    # logits x_t^T W z with z = e_3: column 3 of W sets a_t = W[t, 3]
    W[:, 3] = [10.0, 10.0 + np.log(0.5), 10.0 + np.log(0.0095 * 1.5 / 0.5 * 0.5), -30.0]
    Y, ex = ntp._selected(NTPModel(4), W, D)
    assert set(Y[0][Y[0] >= 0]) == {0, 1}
    assert ex.shape == (1, 4) and ex[0].tolist() == [False, False, True, False]


def test_kq_sanity_checks_fail_on_violating_tables():
    K = next(e for e in ntp.EXPERIMENTS if e.name == "ntp-kq")
    runs = pd.DataFrame([dict(seed=s, step=10, size="n4T6K8d8", graph="acyclic", corr_nuc=0.99,
                              corr_fro=0.9, cell=0) for s in range(3)])
    sols = pd.DataFrame([dict(cell=0, seed=s, status_fro="optimal", status_nuc="optimal",
                              corr_fro_nuc=0.9) for s in range(3)])
    cfg = K.config("tiny")
    checks = ntp.judge_kq({"runs": runs, "solutions": sols}, cfg)
    assert all(c.passed for c in checks) and checks[0].measured.endswith("= 1 (needs >= 0.9)")
    worse = runs.assign(corr_nuc=0.8)  # nearer the Frobenius Graph-SVM: the finding fails
    c = ntp.judge_kq({"runs": worse, "solutions": sols}, cfg)[0]
    assert c.kind == "finding" and not c.passed
    bad = sols.assign(status_nuc=["optimal", "uncertified", "optimal"])
    assert not _find(ntp.judge_kq({"runs": runs, "solutions": bad}, cfg), "certified")[0].passed
    same = sols.assign(corr_fro_nuc=1.0)
    assert not _find(ntp.judge_kq({"runs": runs, "solutions": same}, cfg), "differ")[0].passed
