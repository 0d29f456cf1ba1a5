"""The real-data experiment mmts-fig7-gpt2: judge on tables built to pass and to fail, the
optimiser factory (one config entry per rule), and a tiny-scale run end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from attnsvm.experiments import get, run_experiment  # noqa: E402
from attnsvm.experiments.mmts_fig7_gpt2 import (  # noqa: E402
    EXPERIMENT,
    corpus,
    judge,
    make_optimizer,
    sign_test,
    summary_table,
)


def _tables(good: bool, heads=8, seeds=2, steps=(0, 10, 100)):
    """Synthetic track / loss tables: ``good`` = every claim of the experiment true."""
    rng = np.random.default_rng(0)
    rows, losses = [], []
    for opt in ("AdamW", "SGD"):
        for seed in range(seeds):
            for i, step in enumerate(steps):
                f = i / (len(steps) - 1)  # 0 at init, 1 at the end
                for layer in range(2):
                    for head in range(heads // 2):
                        j = rng.uniform(0.9, 1.1)
                        norm = 0.03 * (1 + 40 * f) * j if good else 0.03 * j
                        ss = 32 / (1 + 9 * f) * j if good else 32 * j
                        corr = 0.5 + 0.495 * f if good else 0.5 - 0.2 * f
                        corr += rng.uniform(-0.002, 0.002)
                        mr = 0.01 + 0.5 * f * j if good else 0.01 * j
                        rows.append(dict(
                            optimizer=opt, seed=seed, step=step, layer=layer, head=head,
                            soft_sparsity=ss, wqk_norm=norm, corr_mm=corr, margin_ratio=mr,
                            corr_rot_q95=0.09, corr_rot_max=0.12 if good else 0.9,
                            corr_null_mean=0.0, corr_null_max=0.05, feasible=True, svm_violation=0.0,
                            svm_gap=1e-14, recompute_err=1e-7))
                losses.append(dict(optimizer=opt, seed=seed, step=step, val_loss=4.5 - 2.5 * f,
                                   train_loss=np.nan, seconds=0.0))
    track, loss = pd.DataFrame(rows), pd.DataFrame(losses)
    return {"track": track, "loss": loss, "summary": summary_table(track, loss)}


CFG = EXPERIMENT.config("tiny")


def test_judge_passes_a_table_built_to_pass():
    checks = judge(_tables(True), CFG)
    assert len(checks) == 2 * 10 and sum(c.sanity for c in checks) == 2 * 3
    # a GPT-2 on text is not the paper's ViT on CIFAR-10: no check counts as a paper claim
    assert [c.kind for c in checks] == 2 * (["sanity"] * 3 + ["finding"] * 7)
    assert all(c.passed for c in checks), [c.measured for c in checks if not c.passed]


def test_judge_fails_a_table_built_to_fail():
    checks = judge(_tables(False), CFG)
    claims = [c for c in checks if not c.sanity]
    assert not any(c.passed for c in claims), [c.claim for c in claims if c.passed]
    assert all(c.passed for c in checks if c.sanity)  # the set-up itself is fine


def test_judge_sanity_checks_fail_on_a_broken_setup():
    t = _tables(True)
    t["track"].loc[0, "svm_gap"] = 1e-3
    t["track"].loc[1, "recompute_err"] = 1e-2
    t["loss"]["val_loss"] = 4.5
    failed = [c.claim for c in judge(t, CFG) if c.sanity and not c.passed]
    # rows 0 and 1 are AdamW rows: AdamW fails all three set-up checks, SGD only the loss one
    assert len(failed) == 4 and sum(f.startswith("[AdamW]") for f in failed) == 3


def test_sign_test_against_scipy():
    from scipy.stats import binomtest

    share, p = sign_test([1, 2, -1, 0, 3, 4])
    assert share == 0.8 and abs(p - binomtest(4, 5, 0.5, alternative="greater").pvalue) < 1e-15


def test_make_optimizer_torch_class_and_core_rule():
    from attnsvm.optim import RuleOptimizer

    w = torch.nn.Parameter(torch.tensor([[3.0, -4.0]], dtype=torch.float64))
    opt = make_optimizer({"name": "AdamW", "rule": "torch.optim.AdamW", "lr": 1e-3}, [w])
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["lr"] == 1e-3
    # an attnsvm.optim rule is one config entry: NGD step W - lr G / ||G||_F
    opt = make_optimizer({"name": "NGD", "rule": "attnsvm.optim.ngd", "lr": 0.5}, [w])
    assert isinstance(opt, RuleOptimizer)
    w.grad = torch.tensor([[0.3, 0.4]], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([[3.0 - 0.3, -4.0 - 0.4]], dtype=torch.float64))
    # a registered name is one entry too: sign descent moves every entry by lr
    w2 = torch.nn.Parameter(torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    opt = make_optimizer({"name": "sign", "rule": "sign", "lr": 0.25}, [w2])
    w2.grad = torch.tensor([[-2.0, 1e-30]], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(w2.detach(), torch.tensor([[1.25, 0.75]], dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown optimizer 'nosuch'"):
        make_optimizer({"name": "x", "rule": "nosuch"}, [w2])
    with pytest.raises(ValueError, match="cannot import"):
        make_optimizer({"name": "x", "rule": "torch.optim.NoSuchThing"}, [w])
    with pytest.raises(ValueError, match="neither"):
        make_optimizer({"name": "x", "rule": "numpy.zeros", "shape": 2}, [w])


def test_corpus_ships_offline():
    ids, chars = corpus()
    assert len(ids) > 100_000 and 50 <= len(chars) <= 200
    assert ids.min() == 0 and ids.max() == len(chars) - 1


def test_tiny_scale_end_to_end(tmp_path):
    exp = get("mmts-fig7-gpt2")
    assert not exp.in_default
    res = run_experiment(exp, "tiny", out=tmp_path)
    assert res.error is None, res.error
    tr = res.tables["track"]
    cfg = exp.config("tiny")
    n_rec = tr.groupby(["optimizer", "seed"]).step.nunique()
    assert (n_rec == cfg["records"]).all()
    assert len(tr) == len(cfg["optimizers"]) * cfg["seeds"] * cfg["records"] * cfg["n_layer"] * cfg["n_head"]
    assert all(c.passed for c in res.sanity_checks if "certificate" in c.claim or "recomputed" in c.claim)
    assert res.figures and res.figures[0].is_file()
