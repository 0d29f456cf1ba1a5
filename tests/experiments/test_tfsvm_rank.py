"""tfsvm-rank: verdict logic on hand-built tables, feasible sampling, and the rank table
against the singular-value spectra (computed separately)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import tfsvm_rank as tr

CFG = tr.EXPERIMENT.config("tiny")


def _tables(fro=(5, 5, 5, 5), nuc=(2, 2, 3, 2), n=5, d=10, alt_shift=0):
    rows = [dict(n=n, T=5, d=d, instance=k, feasible_nuc=True, rank_fro=f, rank_nuc=u,
                 **{"rank_nuc_0.001": u, "rank_nuc_1e-06": u + alt_shift})
            for k, (f, u) in enumerate(zip(fro, nuc))]
    cells = pd.DataFrame([dict(n=n, T=5, d=d, tried=4, feasible=len(fro), target=len(fro))])
    return {"ranks": pd.DataFrame(rows), "cells": cells}


def test_judge_passes_on_the_predicted_ranks():
    assert all(c.passed for c in tr.judge(_tables(), dict(CFG, target=4)))


@pytest.mark.parametrize("kw, failing", [
    (dict(fro=(6, 5, 5, 5)), [0]),                    # rank above min(n, d) = 5
    (dict(nuc=(2, 2, 1, 5), fro=(5, 5, 5, 4)), [1]),  # nuclear rank above the Frobenius one
    (dict(nuc=(4, 4, 5, 4)), [2]),                    # nuclear rank not much lower
    (dict(alt_shift=1), [3]),                         # rank depends on the tolerance
])
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tr.judge(_tables(**kw), dict(CFG, target=4))
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_feasible_draws():
    cfg = dict(target=2, max_tries=12)
    kept, tried = tr.feasible_draws(5, 5, 1, cfg, seed=0)  # unit tokens in d = 1 tie: infeasible
    assert tried == 12 and sum(len(k[1]) for k in kept) == 0
    kept, tried = tr.feasible_draws(5, 5, 10, cfg, seed=0)  # d^2 >> n(T-1): always feasible
    assert sum(len(k[1]) for k in kept) >= 2 and kept[0][0].y.shape == (kept[0][0].B, 5)


def test_ranks_agree_with_the_spectra_and_the_bound():
    t = tr.compute(CFG)
    r, sp = t["ranks"], t["spectra"]
    assert len(r) == 2 and (r.rank_fro <= np.minimum(r.n, r.d)).all()
    for nm in ("fro", "nuc"):
        cnt = sp[(sp.norm == nm) & (sp.sv_ratio > tr.RTOL[nm])].groupby(["d", "instance"]).size()
        assert (cnt.to_numpy() == r.set_index(["d", "instance"])[f"rank_{nm}"]
                .reindex(cnt.index).to_numpy()).all()
