"""tfsvm-multitoken: verdict logic on hand-built tables (the paper's population and the
all-runs view); the notebook's filter and draw protocol at the tiny scale; one-token
selections reduce W_eq to the ATT-SVM."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import tfsvm_multitoken as tm
from attnsvm.metrics import correlation
from attnsvm.svm import att_svm

CFG = tm.EXPERIMENT.config("tiny")


def _tables(eq=1e-3, dr=1e-2, one=1e-1, nsel=2.0, all_dir=1e-2, kept=5, ds=(4, 6)):
    rows = []
    for d in ds:
        for b in range(kept):  # kept by the notebook's filter
            rows.append(dict(d=d, trial=b, kept=True, view=False, undecided=False, feasible=True,
                             n_selected=nsel, gap_eq=eq, gap_dir=dr, gap_one=one))
        for b in range(kept, kept + 4):  # discarded (undecided token), in the all-runs prefix
            rows.append(dict(d=d, trial=b, kept=False, view=True, undecided=True, feasible=True,
                             n_selected=nsel, gap_eq=eq, gap_dir=all_dir, gap_one=one))
    counts = pd.DataFrame([dict(d=d, drawn=20, used=20, finite=5, undecided=4, kept=kept,
                                target=kept) for d in ds])
    return {"runs": pd.DataFrame(rows), "counts": counts}


CFGJ = dict(CFG, ds=[4, 6])


def test_judge_passes_on_the_predicted_ordering():
    checks = tm.judge(_tables(), CFGJ)
    assert all(c.passed for c in checks)
    # "several tokens": the cited abstract states no count, so it is attnsvm's finding
    assert [c.kind for c in checks] == ["claim"] * 3 + ["finding", "finding", "sanity"]
    assert all(c.quote and c.where for c in checks if c.kind == "claim")


FAILS = [  # (tables built to fail, the indices of the checks that fail)
    (dict(eq=2e-2, all_dir=0.05), [0]),     # W_eq worse than W_dir
    (dict(dr=0.5, all_dir=0.05), [1]),      # W_dir worse than the one-token SVM
    (dict(eq=0.2, dr=0.3, all_dir=0.3), [1, 2, 4]),  # both worse than one-token, all runs too
    (dict(nsel=1.0), [3]),                  # only single tokens selected
    (dict(all_dir=0.5), [4]),               # the ordering fails on the runs the filter drops
    (dict(kept=3), [5]),                    # too few kept runs: sanity check fails
]


@pytest.mark.parametrize("kw, failing", FAILS)
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tm.judge(_tables(**kw), CFGJ)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_every_declared_verdict_is_judged_in_order_and_has_a_violating_input():
    checks = tm.judge(_tables(), CFGJ)
    assert [(c.kind, c.quote, c.where) for c in checks] == [
        (v.kind, v.quote, v.where) for v in tm.CLAIMS.values()]
    assert tm.EXPERIMENT.verdicts == tuple(tm.CLAIMS.values())
    assert set().union(*(failing for _, failing in FAILS)) == set(range(len(tm.CLAIMS)))


def test_a_d_without_kept_runs_fails_the_per_d_orderings():
    t = _tables()
    t["runs"] = t["runs"][~((t["runs"].d == 6) & t["runs"].kept)]
    t["counts"].loc[t["counts"].d == 6, "kept"] = 0
    checks = tm.judge(t, CFGJ)
    assert not any(c.passed for c in checks[:3])
    assert "d=6: no runs FAILS" in checks[0].note


def test_orderings_are_per_d_not_pooled():
    t = _tables()
    r = t["runs"]
    # at d = 6 W_dir is worse than the one-token SVM; pooled over d it would still be better
    r.loc[(r.d == 6) & r.kept, "gap_dir"] = 0.15
    r.loc[(r.d == 4) & r.kept, "gap_dir"] = 1e-4
    assert r[r.kept].gap_dir.mean() < r[r.kept].gap_one.mean()
    assert not tm.judge(t, CFGJ)[1].passed


def test_draws_are_a_prefix_and_follow_the_notebook():
    cfg = dict(CFG, chunk=2)
    a, Va, Wa = tm.draw(4, cfg, 0, 3)
    b, Vb, Wb = tm.draw(4, cfg, 0, 1)
    assert np.array_equal(a.X[:2], b.X) and np.array_equal(Va[:2], Vb) and np.array_equal(Wa[:2], Wb)
    assert np.allclose(np.linalg.norm(a.X, axis=-1), 1) and np.allclose(np.linalg.norm(a.z, axis=-1), 1)
    assert np.allclose(np.linalg.norm(Va, axis=(1, 2)), 1)
    assert (np.abs(Wa) <= 0.5).all()  # nn.Linear: U(-1/sqrt(d), 1/sqrt(d)), d = 4
    assert (a.y == -1).any(1).all()  # the notebook skips draws without a y = -1


def test_tiny_population_follows_the_filter_and_the_target():
    t = tm.compute(CFG)
    r, cnt = t["runs"], t["counts"]
    kept = tm.paper_runs(r)
    assert (kept.groupby("d").size() <= CFG["target"]).all()
    assert not kept.undecided.any()  # the filter drops runs with a token in (1e-6, 1e-3]
    assert (kept.min_prob <= tm.LOW).all() and (kept.max_out <= tm.LOW).all()
    assert (cnt.used <= cnt.drawn).all() and (cnt.drawn <= CFG["cap"]).all()
    # the judged numbers are the table's: the per-d means of the kept runs
    m = tm.means(kept)
    for c in tm.judge(t, CFG)[:1]:
        for d, x in m.iterrows():
            assert f"d={d}: {x.gap_eq:.3g} vs {x.gap_dir:.3g}" in c.note
    last = t["curves"].groupby(["d", "trial"]).step.max()
    assert (last == CFG["steps"]).all()


def test_single_token_selection_reduces_to_the_att_svm():
    rng = np.random.default_rng(0)
    X, z = rng.standard_normal((3, 4, 4)), rng.standard_normal((3, 4))
    s = np.full((3, 4), 1e-8)
    s[:, 0] = 1.0
    W1 = att_svm(X, z, np.zeros(3, int)).W_
    Wd, We = tm.predictors(X, z, s, rng.standard_normal((4, 4)))
    np.testing.assert_allclose(Wd, W1, rtol=1e-5, atol=1e-7)  # W_fin = 0: W_dir is the ATT-SVM
    assert abs(correlation(We, W1)) > 1 - 1e-8  # W_eq = R W_dir
