"""The digits ViT with flipped labels (issue 35, item 5): the label noise, the token kinds,
the per-record statistics against a hand computation, the tracker's extractor (checked by
its recomputation of the model's own attention), and the findings fed violating tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm.cli import main
from attnsvm.experiments import benign_vit as E
from attnsvm.realdata import vit as V


def test_flip_labels_counts_changes_and_nesting():
    y = np.arange(200) % 10
    obs1, f1 = V.flip_labels(y, 0.1, seed=3)
    obs2, f2 = V.flip_labels(y, 0.2, seed=3)
    assert f1.sum() == 20 and f2.sum() == 40
    assert (obs1[f1] != y[f1]).all() and (obs1[~f1] == y[~f1]).all()
    assert (f2 | ~f1).all() and (obs2[f1] == obs1[f1]).all()  # nested, same wrong label
    assert set(obs2[f2]) <= set(range(10))
    assert not V.flip_labels(y, 0.0, 0)[1].any()
    with pytest.raises(ValueError, match=r"label noise ratio must be a number in \[0, 1\)"):
        V.flip_labels(y, 1.0, 0)


def test_token_kinds():
    X = np.zeros((2, 16, 4))
    X[0, 3] = 0.25  # mean exactly INK: ink
    X[1, 5, 0] = 0.99  # mean 0.2475: blank
    k = V.token_kinds(X)
    assert k.shape == (2, 17) and (k[:, 0] == 0).all()
    assert k[0, 4] == 1 and (np.delete(k[0], [0, 4]) == 2).all() and (k[1, 1:] == 2).all()


class _Fixed(torch.nn.Module):
    """A stand-in model returning fixed logits and last-layer attention."""

    def __init__(self, logits, att):
        super().__init__()
        self.logits, self.att = logits, att

    def forward(self, X):
        return self.logits, [self.att]


def test_noise_stats_by_hand():
    rng = np.random.default_rng(0)
    n = 6
    logits = torch.as_tensor(rng.standard_normal((n, 10)))
    att = torch.softmax(torch.as_tensor(rng.standard_normal((n, 2, 17, 17)) * 3), -1)
    y_true = rng.integers(0, 10, n)
    flipped = np.array([1, 0, 1, 0, 0, 0], bool)
    y_obs = np.where(flipped, (y_true + 1) % 10, y_true)
    y_obs[0] = logits[0].argmax().item()  # sample 0 (flipped) fitted
    kinds = rng.integers(1, 3, (n, 17))
    kinds[:, 0] = 0
    st = V._noise_stats(_Fixed(logits, att), None, y_obs, y_true, flipped, kinds)
    pred = logits.numpy().argmax(1)
    s = att.numpy()[:, :, 0, :].mean(1)
    for part, idx in (("clean", [1, 3, 4, 5]), ("flipped", [0, 2])):
        assert st[f"train_acc_{part}"] == pytest.approx(np.mean([pred[i] == y_obs[i] for i in idx]))
        tops = [kinds[i, int(np.argmax(s[i]))] for i in idx]
        for k, name in enumerate(V.TOKEN_KINDS):
            assert st[f"att_{name}_{part}"] == pytest.approx(np.mean([t == k for t in tops]))
        assert st[f"ink_mass_{part}"] == pytest.approx(
            np.mean([s[i][kinds[i] == 1].sum() for i in idx]), rel=1e-12)
    assert st["train_acc_flipped"] == pytest.approx(0.5 if pred[2] != y_obs[2] else 1.0)
    assert st["flipped_true"] == pytest.approx(np.mean([pred[i] == y_true[i] for i in (0, 2)]))


def test_the_extractor_reproduces_the_model_s_attention():
    """The tracker recomputes each head's attention from the extracted call and raises
    RecomputeError beyond its rounding bound: a wrong W_q / W_k would not pass."""
    from attnsvm.track import TrackConfig, Tracker

    torch.manual_seed(0)
    model = V.DigitsViT(dim=8, heads=2, layers=2, mlp=8).double()
    X = torch.rand(5, 16, 4, dtype=torch.float64)
    tr = Tracker(model, X, budget=None, extractors={V.Attention: V.digits_extractor},
                 config=TrackConfig(max_queries=8, null_draws=0))
    rows = tr.record(0)
    assert len(rows) == 4 and (rows.recompute_check == "checked").all(), rows.recompute_check.tolist()
    assert (rows.status == "optimal").all()
    # a transposed key map changes the logits: the check refuses it
    from attnsvm.track import RecomputeError

    def wrong(module, args, kwargs):
        call = V.digits_extractor(module, args, kwargs)
        call.W_k = call.W_k.flip(-1)
        return call

    with pytest.raises(RecomputeError):
        Tracker(model, X, budget=None, extractors={V.Attention: wrong}).record(0)


def _tables(test=(0.9, 0.8), fitted=0.7, ink=(0.5, 0.52), corr=(0.3, 0.32), flips_ok=True,
            certified="optimal"):
    h, t = [], []
    for r, acc in zip((0.0, 0.4), test):
        for seed, e in ((0, -0.01), (1, 0.0), (2, 0.01)):
            h.append(dict(ratio=r, seed=seed, epoch=5, test_acc=acc + e, train_acc_clean=0.99,
                          train_acc_flipped=np.nan if r == 0 else fitted,
                          flipped_true=np.nan if r == 0 else 0.2, ink_mass_clean=ink[0],
                          ink_mass_flipped=np.nan if r == 0 else ink[1], att_ink_clean=0.9,
                          att_ink_flipped=np.nan if r == 0 else 0.9))
            for head in (0, 1):
                t.append(dict(ratio=r, seed=seed, step=5, head=head, corr_mm=corr[r > 0],
                              status=certified))
    f = pd.DataFrame([dict(ratio=0.0, seed=0, n=100, flips=0, changed=0, expected=0),
                      dict(ratio=0.4, seed=0, n=100, flips=40, changed=40 if flips_ok else 39,
                           expected=40)])
    return {"history": pd.DataFrame(h), "track": pd.DataFrame(t), "flips": f}


def _verdicts(**kw):
    return {c.claim.split(":")[0]: c.passed for c in E.judge(_tables(**kw), {})}


def test_findings_hold_on_a_planted_table_and_fail_on_violations():
    keys = [c.text.split(":")[0] for c in E.CLAIMS.values()]
    assert list(_verdicts().values()) == [True] * 5 and list(_verdicts()) == keys
    flips, harmful, fitted, attend, svm = keys
    assert not _verdicts(flips_ok=False)[flips]
    assert not _verdicts(test=(0.9, 0.895))[harmful]  # a drop within the seeds' noise
    assert not _verdicts(fitted=0.3)[fitted]
    assert not _verdicts(ink=(0.5, 0.6))[attend]
    assert not _verdicts(corr=(0.3, 0.5))[svm]
    assert not _verdicts(certified="uncertified")[svm]
    checks = E.judge({**_tables(), "history": _tables()["history"].query("ratio > 0")}, {})
    assert [c.passed for c in checks[1:]] == [False] * 4  # no clean run: not measured
    assert "needs the clean run" in checks[1].note


def test_cli_label_noise_ratio_is_checked(capsys):
    assert main(["vit", "--label-noise", "0", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "expected a noise ratio in [0, 1); got '1.5'" in err and "Traceback" not in err


def test_study_arguments_are_checked_before_any_work():
    with pytest.raises(ValueError, match=r"label noise ratios must be in \[0, 1\); got 1.0"):
        V.label_noise_study((0.0, 1.0))
    with pytest.raises(ValueError, match="no learning rate for optimizer 'md5'"):
        V.label_noise_study((0.0,), V.ViTConfig(optimizers=("md5",)))
