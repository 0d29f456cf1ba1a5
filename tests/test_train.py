"""Trainer: equivalences, batching, determinism, the metrics table, the CLI."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm import data as D
from attnsvm import metrics as MT
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.train import train


@pytest.mark.parametrize("rule", ["gd", "ngd"])
def test_prompt_w_equivalence_iterate_by_iterate(rule):
    """docs/theory.md §2: with z_i = z for all i and W_0 = p_0 z^T / |z|^2, the W-iterates satisfy
    W_t = p_t z^T / |z|^2 (so W_t z = p_t) where p_t runs the prompt model (W_fixed = I)
    with lr |z|^2 (GD) or lr |z| (NGD): G_W = g_p z^T and |G_W|_F = |g_p| |z|."""
    base = D.random_sphere(n=4, T=5, d=3, seed=4)
    z = np.array([0.6, -1.3, 0.8])
    zz = z @ z
    data_w = base.replace(z=np.tile(z, (4, 1)))
    data_p = base.replace(z=None)
    p0 = np.array([[0.3, -0.2, 0.5]])
    lr = 0.2
    if rule == "gd":
        opt_w, opt_p = O.gd(lr), O.gd(lr * zz)
    else:
        opt_w, opt_p = O.ngd(lr), O.ngd(lr * np.sqrt(zz))
    tw = train(M.WModel(3), data_w, optimizer=opt_w, steps=60, init={"W": np.outer(p0[0], z)[None] / zz},
               record_every=1, record_params=True)
    tp = train(M.PromptModel(3), data_p, optimizer=opt_p, steps=60, init={"p": p0},
               record_every=1, record_params=True)
    Wh, ph = tw.param_history["W"][:, 0], tp.param_history["p"][:, 0]
    np.testing.assert_allclose(Wh @ z, ph, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(Wh, ph[:, :, None] * z[None, None, :] / zz, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tw.metrics["loss"], tp.metrics["loss"], rtol=1e-12)


def test_batched_equals_separate_runs():
    data = D.random_sphere(n=4, T=5, d=4, seed=1, batch=3)
    model = M.KQModel(4, m=2)
    init = model.init(3, seed=9, scale=0.5)
    tb = train(model, data, optimizer=O.ngd(0.1), steps=80, init=init, record_every=20,
               references={"I": np.eye(4)})
    for b in range(3):
        ts = train(model, data.trial(b), optimizer=O.ngd(0.1), steps=80,
                   init={k: v[b:b + 1] for k, v in init.items()}, record_every=20,
                   references={"I": np.eye(4)})
        for k in init:
            torch.testing.assert_close(tb.params[k][b:b + 1], ts.params[k], rtol=1e-12, atol=1e-14)
        mb = tb.metrics[tb.metrics.trial == b].drop(columns="trial").reset_index(drop=True)
        ms = ts.metrics.drop(columns="trial").reset_index(drop=True)
        pd.testing.assert_frame_equal(mb, ms, rtol=1e-10)


def test_same_seed_bit_identical_including_sgd():
    data = D.random_sphere(n=6, T=4, d=3, seed=2)
    kw = dict(optimizer=O.sngd(0.1, batch_size=3), steps=50, B=4, seed=11, record_every=5,
              record_params=True)
    a, b = train(M.WModel(3), data, **kw), train(M.WModel(3), data, **kw)
    assert torch.equal(a.params["W"], b.params["W"])
    pd.testing.assert_frame_equal(a.metrics, b.metrics, check_exact=True)
    np.testing.assert_array_equal(a.param_history["W"], b.param_history["W"])
    c = train(M.WModel(3), data, **{**kw, "seed": 12})
    assert not torch.equal(a.params["W"], c.params["W"])


def test_metrics_table_against_direct_computation():
    data = D.random_sphere(n=4, T=5, d=3, seed=3, batch=2)
    model = M.KQModel(3, m=2)
    ref = np.random.default_rng(0).standard_normal((3, 3))
    t = train(model, data, optimizer=O.gd(0.5), steps=30, record_every=10, references={"r": ref})
    assert t.record_steps.tolist() == [0, 10, 20, 30] and t.steps_run == 30
    assert len(t.metrics) == 8 and list(t.metrics.columns[:2]) == ["trial", "step"]
    last = t.metrics[t.metrics.step == 30].set_index("trial")
    s = model.attention(t.params, data).numpy()
    opt = data.opt
    psel = np.take_along_axis(s, opt[..., None], -1)[..., 0]
    np.testing.assert_allclose(last["p_sel_mean"], psel.mean(1))
    np.testing.assert_allclose(last["p_sel_min"], psel.min(1))
    np.testing.assert_allclose(last["p_max"], s.max(-1).mean(1))
    np.testing.assert_allclose(last["soft_sparsity"], (1 / (s ** 2).sum(-1)).mean(1))
    W = t.W
    np.testing.assert_allclose(last["norm"], np.linalg.norm(W, axis=(1, 2)))
    np.testing.assert_allclose(last["norm_nuc"], [np.linalg.norm(w, "nuc") for w in W])
    np.testing.assert_allclose(last["corr_r"], [(w * ref).sum() / np.linalg.norm(w) / np.linalg.norm(ref) for w in W])
    L, gap, _ = model.objective(t.params, data)
    np.testing.assert_allclose(last["loss"], L.numpy())
    np.testing.assert_allclose(last["loss_gap"], gap.numpy())


def test_prompt_references_and_alpha():
    data = D.mmts_fig1(0.0)
    model = M.PromptModel(3, W_fixed=D.MMTS_FIG1_W)
    t = train(model, data, optimizer=O.ngd(0.1), steps=20, references={"e1": np.array([1.0, 0, 0])},
              alpha=np.array([2]), record_every=10)
    assert "corr_e1" in t.metrics and t.W.shape == (1, 3) and t.alpha.ravel().tolist() == [2]


def test_metrics_helpers():
    A = np.random.default_rng(1).standard_normal((4, 3, 3))
    np.testing.assert_allclose(MT.correlation(A, 2 * A), 1.0)
    np.testing.assert_allclose(MT.directional_distance(A, 5 * A), 0.0, atol=1e-15)
    At = torch.as_tensor(A)
    assert isinstance(MT.correlation(At, At), torch.Tensor)
    np.testing.assert_allclose(MT.correlation(At, At[0]).numpy(), MT.correlation(A, A[0]))
    v = np.array([[1.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(MT.correlation(v, np.array([1.0, 0.0]), vector=True), [1, 2 ** -0.5])
    assert MT.numerical_rank(np.outer([1, 2, 3], [1, 0, 1.0])) == 1
    assert MT.numerical_rank(torch.eye(3, dtype=torch.float64)[None]).tolist() == [3]
    s = np.array([[1.0, 0, 0], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(MT.soft_sparsity(s), [1, 3])
    np.testing.assert_allclose(MT.entropy(s), [0, np.log(3)])
    np.testing.assert_allclose(MT.nuclear_norm(A), [np.linalg.norm(a, "nuc") for a in A])
    np.testing.assert_allclose(MT.lp_norm(MT.lp_normalize(A, 3.0), 3.0), 1.0)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(B=5), "data holds B = 2 datasets but B = 5"),
        (dict(init="diagonal"), "init kind must be one of"),
        (dict(init={"K": np.zeros((3, 3))}), r"init must have the keys \['W'\]"),
        (dict(init={"W": np.zeros((2, 2))}), r"init\['W'\] must have shape"),
        (dict(batch_size=7), r"batch_size must be in \[1, n = 4\]"),
        (dict(record_every=0), "record_every must be an integer >= 1"),
        (dict(steps=-1), "steps must be an integer >= 0"),
        (dict(alpha=np.zeros((4, 4), int)), "alpha must have shape"),
        (dict(alpha=np.full(4, 5)), r"alpha must hold token indices in \[0, T = 5\)"),
        (dict(loss="squared"), "loss must be one of"),
    ],
)
def test_train_bad_inputs(kw, match):
    data = D.random_sphere(n=4, T=5, d=3, batch=2)
    with pytest.raises(ValueError, match=match):
        train(M.WModel(3), data, **{"steps": 3, **kw})


def test_cli_train(tmp_path, capsys):
    from attnsvm.cli import main

    out = tmp_path / "m.csv"
    assert main(["train", "--trials", "8", "--steps", "30", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "loss gap" in text and "p_sel" in text
    assert len(pd.read_csv(out)) > 8
    path = D.random_sphere(n=3, T=4, d=5, seed=1).save(tmp_path / "d.npz")
    assert main(["train", "--data", str(path), "--trials", "2", "--steps", "10",
                 "--optimizer", "polyak", "--model", "KQ"]) == 0


def test_default_record_schedule_is_sparse_for_short_runs():
    """record_every=None: a record every max(steps // 100, min(steps, 25)) steps and at the
    last: a 100-step run records 5 times (not 101), a long run about 100 times."""
    from attnsvm.train import default_record_every

    assert [default_record_every(s) for s in (1, 7, 25, 26, 100, 2499, 2500, 2600, 10**5)] == \
        [1, 7, 25, 25, 25, 25, 25, 26, 1000]
    data = D.random_sphere(n=3, T=4, d=3, seed=0, batch=2)
    for steps, want in ((100, list(range(0, 101, 25))), (7, [0, 7]), (60, [0, 25, 50, 60])):
        t = train(M.WModel(3), data, optimizer=O.ngd(0.1), steps=steps, engine="torch")
        assert t.record_steps.tolist() == want
        # the same records as the explicit stride
        e = train(M.WModel(3), data, optimizer=O.ngd(0.1), steps=steps, engine="torch",
                  record_every=default_record_every(steps))
        pd.testing.assert_frame_equal(t.metrics, e.metrics, check_exact=True)


# ------------------------------------------------------------------ issue 32: one trainer
class _Untouchable:
    """Data that fails the test if train() reads it (the arguments come first)."""

    def __getattr__(self, name):
        raise AssertionError(f"train() read data.{name} before refusing an argument")


def test_the_issues_call_is_refused_by_name_before_any_work():
    from attnsvm.ntp import NTPModel

    with pytest.raises(ValueError) as e:
        train(NTPModel(8), _Untouchable(), "no-such-loss", batch_size=2, autograd=True,
              alpha=[1, 2])
    assert str(e.value).startswith("loss='no-such-loss': NTPModel cannot honour it"), e.value
    # a step rule in the loss slot (the third positional argument) is named as a rule
    with pytest.raises(ValueError, match="'ngd' is a step rule: pass optimizer='ngd'"):
        train(NTPModel(8), _Untouchable(), "ngd")
    with pytest.raises(ValueError, match="loss='md3' is a step rule.*optimizer='md3'"):
        train(M.WModel(3), _Untouchable(), "md3")


def test_loss_and_optimizer_by_position_the_rest_by_keyword():
    data = D.random_sphere(n=3, T=4, d=3, seed=0)
    by_pos = train(M.WModel(3), data, "exponential", O.gd(0.5), steps=4, engine="torch")
    by_kw = train(M.WModel(3), data, loss="exponential", optimizer=O.gd(0.5), steps=4,
                  engine="torch")
    np.testing.assert_array_equal(by_pos.W, by_kw.W)
    with pytest.raises(TypeError, match="positional"):
        train(M.WModel(3), data, "exponential", O.gd(0.5), 4)


@pytest.mark.parametrize("rule, engine, why", [
    (O.ngd(0.1), "fused", None),
    # every part carries a kernel, but no step loop of fused.PROGRAMS runs the chain
    (O.rule("l1n", {"lr": 0.1}, O.normalize_by("l1"), O.scale_by_learning_rate(0.1)),
     "fused-gradient", "no step loop of the kernel runs the chain normalize + learning_rate"),
    (O.adam(0.01), "fused-gradient", "a stateful rule"),
    (O.rule("sp", {"lr": 0.1}, O.scale_by_steepest("spectral"), O.scale_by_learning_rate(0.1)),
     "fused-gradient", "no compiled counterpart"),
])
def test_the_trajectory_says_which_engine_ran_and_why(rule, engine, why):
    from attnsvm import fused

    if not fused.available():
        pytest.skip("numba is not importable")
    data = D.random_sphere(n=3, T=4, d=3, seed=0)
    tr = train(M.WModel(3), data, optimizer=rule, steps=3)
    assert tr.extra["engine"] == engine
    assert fused.not_compiled(rule) == tr.extra["engine_reason"]
    if why is None:
        assert tr.extra["engine_reason"] is None
    else:
        assert why in tr.extra["engine_reason"], tr.extra["engine_reason"]
    # the torch reference says it was asked for; chunks keep the reason
    assert "engine='torch'" in train(M.WModel(3), data, optimizer=rule, steps=3,
                                     engine="torch").extra["engine_reason"]
    ch = train(M.WModel(3), data, optimizer=rule, steps=3, B=2, chunk=1)
    assert ch.extra["engine_reason"] == tr.extra["engine_reason"]


def test_train_ntp_is_a_deprecated_alias_kept_with_the_trainer():
    import attnsvm.ntp
    import attnsvm.train as T
    from attnsvm.ntp import NTPModel, ntp_random

    data = ntp_random(4, 6, 8, 8, seed=0)
    with pytest.warns(DeprecationWarning, match="train_ntp is deprecated"):
        old = T.train_ntp(NTPModel(8), data, "ngd", steps=5, B=2)
    new = train(NTPModel(8), data, optimizer="ngd", steps=5, B=2)
    np.testing.assert_array_equal(old.W, new.W)
    # ntp/ no longer hands it on (it imports nothing above it): the error says where it went
    with pytest.raises(AttributeError, match=r"attnsvm\.train\.train\(NTPModel"):
        attnsvm.ntp.train_ntp  # noqa: B018
    with pytest.raises(AttributeError, match="no_such_name"):
        attnsvm.ntp.no_such_name  # noqa: B018


def test_ntp_imports_nothing_above_it():
    """ntp/ sits below the solvers, the probe and the trainer (svm/ builds the Graph-SVM on
    its data): no import of attnsvm.train, attnsvm.svm or attnsvm.realdata anywhere in it,
    lazy ones included."""
    import ast
    from pathlib import Path

    import attnsvm.ntp

    above = ("train", "svm", "realdata")
    found = []
    for path in Path(attnsvm.ntp.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            level = getattr(node, "level", 0)
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for mod in mods:
                parts = mod.split(".")
                target = parts[1] if parts[0] == "attnsvm" and len(parts) > 1 else (
                    parts[0] if level >= 2 else "")
                if target in above:
                    found.append(f"{path.name}:{node.lineno} {'.' * level}{mod}")
    assert not found, found
