"""tfsvm-paths: verdict logic on hand-built population tables; the population's recipe and
prefix property; the recorded paths against an independent correlation at the tiny scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm.experiments import tfsvm_paths as tp
from attnsvm.metrics import correlation

CFG = tp.EXPERIMENT.config("tiny")


def _tables(w=(0.999, 0.90), kq=(0.90, 0.999), cfn=0.9, S=10, bad_w=0, bad_kq=0, informative=10,
            sel=0.999, fig_w=(0.999, 0.999, 0.9), fig_kq=(0.998, 0.998, 0.9), fig_cfn=0.89, F=4):
    """Hand-built tables: population final (corr with the optimal tokens' SVMs, corr_sel with
    the selected tokens' SVM), svm and the figure's runs (corr_sel, corr_pred, corr_other)."""
    fin = []
    for m, (cf, cn), bad in (("W", w, bad_w), ("KQ", kq, bad_kq)):
        for b in range(S):
            f, n, c = (0.3, 0.3, 0.3) if b < bad else (cf, cn, sel)
            fin.append(dict(model=m, dataset=b, corr_fro=f, corr_nuc=n, corr_sel=c,
                            sel_feasible=True, reached_opt=b >= bad, p_sel_min=1.0))
    svm = pd.DataFrame(dict(dataset=np.arange(S), feasible=True, rank_fro=2, rank_nuc=1,
                            corr_fro_nuc=np.where(np.arange(S) < informative, cfn, 0.99)))
    fig = []
    for m, (cs, cp, co), B in (("W", fig_w, 1), ("KQ", fig_kq, F)):
        pred = tp.PRED[m]
        for b in range(B):
            fig.append({"model": m, "start": b, "corr_sel": cs, "sel_feasible": True,
                        f"corr_{pred}": cp, f"corr_{'nuc' if pred == 'fro' else 'fro'}": co,
                        "reached_opt": True, "p_sel_min": 1.0, "corr_fro_nuc": fig_cfn})
    return {"final": pd.DataFrame(fin), "svm": svm, "figure": pd.DataFrame(fig)}


KINDS = ["sanity", "claim", "claim", "claim", "claim"] + ["finding"] * 6 + ["sanity"]


def test_judge_passes_when_each_model_finds_its_svm():
    checks = tp.judge(_tables(), CFG)
    assert all(c.passed for c in checks)
    assert [c.kind for c in checks] == KINDS
    assert all(c.quote and c.where for c in checks if c.kind == "claim")


FAILS = [  # (tables built to fail, the indices of the checks that fail)
    (dict(fig_cfn=0.97), [0]),                  # the figure's SVMs coincide: nothing to tell apart
    (dict(fig_w=(0.95, 0.95, 0.9)), [1]),       # W not at the SVM of its selected tokens
    (dict(fig_w=(0.999, 0.9, 0.95)), [2]),      # W closer to the nuclear SVM
    (dict(fig_kq=(0.98, 0.98, 0.9)), [3]),      # (K, Q) not at the nuclear SVM of its tokens
    (dict(fig_kq=(0.998, 0.9, 0.95)), [4]),     # (K, Q) closer to the Frobenius SVM
    (dict(sel=0.95), [5, 8]),                   # population: not at the selected tokens' SVMs
    (dict(w=(0.95, 0.90)), [6]),                # population: W not at W_fro(opt)
    (dict(w=(0.991, 0.995)), [7]),              # population: W closer to the nuclear SVM
    (dict(kq=(0.90, 0.95)), [9]),               # population: KQ not at W_nuc(opt)
    (dict(kq=(0.999, 0.995)), [10]),            # population: KQ closer to the Frobenius SVM
    (dict(bad_w=1), [5, 6]),                    # one dataset of ten elsewhere: means < 0.99
    (dict(bad_kq=2), [8, 9, 10]),               # two of ten: means and the 90% share fail
    (dict(informative=4), [11]),                # too few datasets whose SVMs differ
]


@pytest.mark.parametrize("kw, failing", FAILS)
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tp.judge(_tables(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_every_declared_verdict_is_judged_in_order_and_has_a_violating_input():
    checks = tp.judge(_tables(), CFG)
    assert [(c.kind, c.quote, c.where) for c in checks] == [
        (v.kind, v.quote, v.where) for v in tp.CLAIMS.values()]
    assert tp.EXPERIMENT.verdicts == tuple(tp.CLAIMS.values())
    assert set().union(*(failing for _, failing in FAILS)) == set(range(len(tp.CLAIMS)))


def test_the_claims_use_the_selected_tokens_not_the_optimal_ones():
    """A run at the SVM of the tokens it selects holds the claim even where those are not the
    optimal tokens (the paper's metric); the optimal-token comparison is a finding."""
    t = _tables(fig_w=(0.999, 0.5, 0.3))
    checks = tp.judge(t, CFG)
    assert checks[1].passed and checks[1].kind == "claim"
    t = _tables(w=(0.5, 0.3))
    checks = tp.judge(t, CFG)
    assert checks[5].passed and not checks[6].passed and checks[6].kind == "finding"


def test_uninformative_datasets_do_not_count_for_the_comparison():
    t = _tables(informative=6)
    f = t["final"]
    f.loc[(f.model == "W") & (f.dataset >= 6), ["corr_fro", "corr_nuc"]] = (0.995, 0.999)
    checks = tp.judge(t, CFG)
    assert checks[7].passed and "6 informative datasets" in checks[7].note


def test_figure_dataset_is_the_notebooks_draw():
    """The notebook's generator seeded 1: v, X, z in that order; cluster means (-1, 0) and
    (+1, 0); its SVMs of the optimal tokens differ (the figure's point)."""
    d = tp.figure_dataset()
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(2, generator=gen).double()
    assert np.allclose(d.v, (v / v.norm()).numpy())
    assert d.X.shape == (2, 3, 2) and np.all(d.y == 1)
    assert d.X[0, :, 0].mean() < -0.5 < 0.5 < d.X[1, :, 0].mean()
    assert np.allclose(np.linalg.norm(d.z, axis=-1), 1)


def test_population_is_the_recipe_and_a_prefix():
    data, K0 = tp.paths_population(6, seed=0, chunk=4)
    small, K0s = tp.paths_population(3, seed=0, chunk=4)
    assert np.array_equal(data.X[:3], small.X) and np.array_equal(K0[:3], K0s)
    assert data.X.shape == (6, 2, 3, 2) and np.all(data.y == 1)
    assert np.allclose(np.linalg.norm(data.z, axis=-1), 1) and np.allclose(np.linalg.norm(data.v, axis=-1), 1)
    assert (data.X[:, 0, :, 0].mean(-1) < data.X[:, 1, :, 0].mean(-1)).all()  # (-1, 0) vs (1, 0)


def test_tiny_population_paths_match_an_independent_correlation():
    t = tp.compute(CFG)
    svm, path, fin = t["svm"], t["path"], t["final"]
    fig = t["figure"]
    assert len(fig) == 1 + CFG["F"] and set(fig.model) == {"W", "KQ"}
    assert ((fin.corr_sel >= -1) & (fin.corr_sel <= 1)).all()
    assert len(svm) == CFG["S"] and set(fin.model) == {"W", "KQ"}
    for nm in ("fro", "nuc"):
        R = svm[[f"{nm}_{e}" for e in tp.ENTRIES]].to_numpy(float).reshape(-1, 2, 2)
        for m in ("W", "KQ"):
            d = path[(path.model == m) & (path.norm > 0)]
            W = d[tp.ENTRIES].to_numpy().reshape(-1, 2, 2)
            assert np.allclose(correlation(W, R[d.dataset.to_numpy()]), d[f"corr_{nm}"], atol=1e-10)
            last = d[d.step == d.step.max()].set_index("dataset")[f"corr_{nm}"]
            f = fin[fin.model == m].set_index("dataset")[f"corr_{nm}"]
            assert np.allclose(last.reindex(f.index), f)
    assert tp.shown_dataset(svm) in set(svm.dataset)
