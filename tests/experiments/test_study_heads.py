"""study-heads: the instrument against independent computations (the model's own attention,
brute-force margins, the SVM's own optimality), its calibration (planted SVM heads detected,
random heads rejected), every verdict fed a violating result fails, and a tiny run end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from attnsvm.experiments import study_heads as S  # noqa: E402
from attnsvm.svm import att_svm  # noqa: E402

STEPS = (0, 10, 100, 1000)


# ------------------------------------------------------------------ synthetic tables
def _tables(case: str = "good", arch: str = "gpt2", seeds: int = 2, heads: int = 4) -> dict:
    """Synthetic track / loss / measure / calibration tables of one (arch, AdamW): ``good`` =
    every verdict holds; another ``case`` breaks one thing (see FAILS)."""
    norms = S.NORMS[arch]
    tags = dict(arch=arch, optimizer="AdamW")
    track, losses, meas, cal = [], [], [], []
    f = np.linspace(0, 1, len(STEPS))
    for seed in range(seeds):
        for labels in ("init", "true", "shuffled"):
            for h in range(heads):
                sat = labels == "true" and not (case == "saturates" or (case == "few" and h))
                sel_min = 0.999 if sat else 0.3
                for n in norms:
                    ratio = 0.98 if labels == "true" else 0.02
                    if labels == "true" and case == f"aligned-{n}":
                        ratio = 0.5  # saturated but not the SVM in this norm
                    if case == "setup" and h == 0 and labels == "true":
                        viol = 1e-3
                    else:
                        viol = 0.0
                    meas.append(dict(**tags, labels=labels, seed=seed, step=0 if labels == "init" else 1000,
                                     layer=0, head=h, sel_min=sel_min, sel_share=1.0 if sat else 0.4,
                                     saturated=sat, queries=448, norm=n, constraints=1800,
                                     unknowns=72, corr=0.99, ratio=ratio,
                                     aligned=ratio >= S.ALIGNED, feasible=True, violation=viol,
                                     gap=1e-9))
                if labels == "init":
                    continue
                for i, step in enumerate(STEPS):
                    track.append(dict(**tags, labels=labels, seed=seed, step=step, layer=0, head=h,
                                      soft_sparsity=4 - 2 * f[i], wqk_norm=1 + 9 * f[i],
                                      lifted_norm=1 + 9 * f[i], lift_dim=1, recompute_err=1e-7))
            if labels != "init":
                final = 0.4 if labels == "true" else 2.1
                if case == "learns" and labels == "true":
                    final = 2.0
                if case == "control" and labels == "shuffled":
                    final = 1.5
                for i, step in enumerate(STEPS):
                    losses.append(dict(**tags, labels=labels, seed=seed, step=step,
                                       val_loss=2.2 + (final - 2.2) * f[i], unigram=2.08))
        for h in range(heads):
            for n in norms:
                for kind in ("planted", "random"):
                    ok = kind == "planted"
                    if case == f"detect-{n}" and kind == "planted" and h == 0:
                        ok = False   # one planted head of this norm missed
                    if case == "alarm" and kind == "random" and h == 0:
                        ok = True    # one random head judged aligned
                    cal.append(dict(**tags, labels="true", seed=seed, layer=0, head=h, kind=kind,
                                    norm=n, corr=0.99, ratio=1.0 if ok else 0.03, aligned=ok,
                                    constraints=1800, unknowns=72, feasible=True, violation=0.0,
                                    gap=1e-9))
    track, loss, meas, cal = map(pd.DataFrame, (track, losses, meas, cal))
    if case == "recompute":
        track.loc[3, "recompute_err"] = 1e-3
    return {"track": track, "loss": loss, "measure": meas, "calibration": cal,
            "heads": S.head_table(track, meas)}


def _cfg(arch="gpt2"):
    return {"archs": (arch,), "optimizers": ({"name": "AdamW"},)}


def test_judge_passes_tables_built_to_pass():
    for arch in ("gpt2", "llama"):
        checks = S.judge(_tables(arch=arch), _cfg(arch))
        assert [c.kind for c in checks] == ["sanity"] * 4 + ["finding"] * (1 + len(S.NORMS[arch]))
        assert all(c.passed for c in checks), [c.measured for c in checks if not c.passed]


FAILS = [  # (case, the keys in _order("gpt2") of the checks that fail)
    ("learns", ["learns"]),          # trained loss only 0.08 nat below the unigram level
    ("control", ["control"]),        # the shuffled-label run beats the unigram level
    ("setup", ["setup"]),            # one SVM with violation 1e-3: not certified
    ("recompute", ["setup"]),        # one extraction off by 1e-3
    # one planted head missed: the instrument is not calibrated, its findings not applicable
    ("detect-fro", ["calibration", "aligned-fro"]),
    ("detect-nuc", ["calibration", "aligned-nuc"]),
    ("alarm", ["calibration", "aligned-fro", "aligned-nuc"]),  # a random head judged aligned
    ("saturates", ["saturates", "aligned-fro", "aligned-nuc"]),  # no head saturated: n/a
    ("few", ["saturates"]),          # 1 of 4 saturated: the premise fails, alignment judged on 1
    ("aligned-fro", ["aligned-fro"]),  # saturated heads, margin ratio 0.5 < 0.9
    ("aligned-nuc", ["aligned-nuc"]),
]


@pytest.mark.parametrize("case,bad", FAILS)
def test_each_verdict_fails_on_a_table_built_to_violate_it(case, bad):
    checks = S.judge(_tables(case), _cfg())
    keys = S._order("gpt2")
    failed = [keys[i] for i, c in enumerate(checks) if not c.passed]
    assert failed == bad, [(keys[i], checks[i].measured) for i, c in enumerate(checks) if not c.passed]


def test_not_applicable_is_said_and_never_passes():
    c = dict(zip(S._order("gpt2"), S.judge(_tables("saturates"), _cfg())))
    assert c["aligned-fro"].measured.startswith("not applicable: no trained head")
    c = dict(zip(S._order("gpt2"), S.judge(_tables("detect-nuc"), _cfg())))
    assert c["aligned-nuc"].measured.startswith("not applicable: the instrument is not calibrated")
    assert c["aligned-fro"].passed  # the Frobenius instrument is calibrated: judged


def test_missing_values_fail_instead_of_passing():
    t = _tables()
    t["measure"]["feasible"] = False  # no SVM solved: nothing certified
    t["heads"] = S.head_table(t["track"], t["measure"])
    checks = dict(zip(S._order("gpt2"), S.judge(t, _cfg())))
    assert not checks["setup"].passed
    t = _tables()
    t["calibration"] = t["calibration"].iloc[:0]  # no calibration: not calibrated
    checks = dict(zip(S._order("gpt2"), S.judge(t, _cfg())))
    assert not checks["calibration"].passed and not checks["aligned-fro"].passed


def test_head_table_joins_measure_and_track():
    h = S.head_table(_tables()["track"], _tables()["measure"])
    assert len(h) == 3 * 2 * 4 and set(h.labels) == {"init", "true", "shuffled"}
    tru = h[h.labels == "true"]
    assert np.allclose(tru.norm_T / tru.norm_0, 10) and np.allclose(tru.cu_fro, 1800 / 72)
    ini = h[h.labels == "init"]
    assert np.allclose(ini.norm_T, ini.norm_0)  # the random-init control: step 0


# ------------------------------------------------------------------ the instrument
def _problem(rng, n=40, T=6, d=3, e=4):
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, e))
    allowed = np.tril(np.ones((T, T), bool))[rng.integers(1, T, n)]
    return X, z, allowed


def test_own_selection_and_margin_ratio_against_brute_force():
    rng = np.random.default_rng(1)
    X, z, allowed = _problem(rng)
    X[0, 1] = X[0, 0]  # a key identical to another: no matrix separates them
    allowed[0, :2] = True
    M = rng.standard_normal((3, 4))
    alpha, mask = S.own_selection(M, X, z, allowed)
    for i in range(len(X)):
        lg = [X[i, t] @ M @ z[i] if allowed[i, t] else -np.inf for t in range(X.shape[1])]
        assert alpha[i] == int(np.argmax(lg))
    assert mask[0, 1 - alpha[0]] == (alpha[0] > 1)  # the twin of the selected key is dropped
    sol = att_svm(X, z, alpha, mask=mask, irreducible=False)
    W = np.asarray(sol.W_)

    def gamma(A):  # brute force: min margin over every (i, t != alpha_i) / ||A||_F
        g = min((X[i, alpha[i]] - X[i, t]) @ A @ z[i] for i in range(len(X))
                for t in range(X.shape[1]) if mask[i, t] and t != alpha[i])
        return g / np.linalg.norm(A)

    want = gamma(M) / gamma(W)
    assert abs(S.margin_ratio(M, W, X, z, alpha, mask, "fro") - want) < 1e-10
    assert 0 < want < 1  # a random matrix is not the max-margin direction
    assert abs(S.margin_ratio(3.0 * W, W, X, z, alpha, mask, "fro") - 1) < 1e-9


@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_measure_of_an_svm_is_one_and_of_a_perturbed_svm_less(norm):
    rng = np.random.default_rng(2)
    X, z, allowed = _problem(rng, n=60)
    a, mask = S.own_selection(rng.standard_normal((3, 4)), X, z, allowed)
    W = np.asarray(att_svm(X, z, a, norm=norm, mask=mask, irreducible=False).W_)
    m = S.measure(W, X, z, allowed, norm)
    assert m["aligned"] and m["ratio"] > 1 - 1e-6 and m["corr"] > 1 - 1e-6
    assert m["unknowns"] == 12 and m["constraints"] == int(mask.sum() - len(X))
    P = W + 0.3 * np.linalg.norm(W) * rng.standard_normal(W.shape) / np.sqrt(W.size)
    assert S.measure(P, X, z, allowed, norm)["ratio"] < 1 - 1e-3


def test_measure_reuses_a_known_svm_only_for_its_own_problem():
    """``known``: the same row as a fresh solve when M's selection is the known one; a known
    solution of another selection is not used (the row is the fresh solve's)."""
    rng = np.random.default_rng(4)
    X, z, allowed = _problem(rng, n=40)
    a, mask = S.own_selection(rng.standard_normal((3, 4)), X, z, allowed)
    sol = att_svm(X, z, a, mask=mask, irreducible=False)
    W = np.asarray(sol.W_)
    fresh = S.measure(W, X, z, allowed, "fro")
    assert S.measure(W, X, z, allowed, "fro", known=(a, mask, sol)) == fresh
    R = rng.standard_normal((3, 4))
    other = S.measure(R, X, z, allowed, "fro", known=(a, mask, sol))
    assert other == S.measure(R, X, z, allowed, "fro") and other["ratio"] < S.ALIGNED


@pytest.fixture(scope="module")
def tiny():
    cfg = S.EXPERIMENT.config("tiny")
    return cfg, S.make_data(cfg)


def test_copy_population_follows_its_rule(tiny):
    cfg, data = tiny
    pop = data["population"].numpy()
    V, T = cfg["vocab"], cfg["context"]
    assert pop.shape == (V * V, T)
    assert {(a, b) for a, b in pop[:, :2]} == {(a, b) for a in range(V) for b in range(V)}
    pi = {}
    for row in pop:  # x_{t+1} = pi(x_{t-1}), one permutation for every sequence
        for t in range(2, T):
            assert pi.setdefault(row[t - 2], row[t]) == row[t]
    assert sorted(pi.values()) == list(range(V))
    assert data["probe"] is data["plant"] is data["population"]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_head_tokens_reproduce_the_models_own_attention(tiny, arch):
    cfg, data = tiny
    model = S.build_model(arch, cfg, data["vocab"], seed=0).double()
    with torch.no_grad():  # a sharper head: the check is not satisfied by near-uniform attention
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(4)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attn = model(input_ids=data["probe"], output_attentions=True).attentions[0]
    call = S._calls(model, data["probe"])[0]
    for h, t in enumerate(S.head_tokens(call)):
        lg = np.where(t["allowed"], np.einsum("nsd,de,ne->ns", t["X"], t["M"], t["z"]), -np.inf)
        s = np.exp(lg - lg.max(1, keepdims=True))
        s /= s.sum(1, keepdims=True)
        ref = attn[:, h].numpy().reshape(-1, attn.shape[-1])  # (N T, S): queries in order
        # (float64 model; Hugging Face computes the rotary cos / sin in float32)
        np.testing.assert_allclose(s, ref, atol=1e-6)
        np.testing.assert_allclose(t["mass"], ref, atol=1e-6)
        # unknowns: d_h x (d_h + 1) (bias augmented); rotary: the lift, L d_h x d_h
        assert t["M"].size == (8 * 9 if arch == "gpt2" else 8 * 8 * 8)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_calibration_detects_planted_svm_heads_and_rejects_random_heads(tiny, arch):
    """The instrument's acceptance test: heads planted as exactly the SVM (in each norm) of a
    known selection on the copy population are judged aligned (>= 99%: here every one of 8 per
    norm), random heads are not (none)."""
    cfg, data = tiny
    model = S.build_model(arch, cfg, data["vocab"], seed=0)
    cal = S.calibrate(model, data["probe"], data["plant"], S.NORMS[arch], seed=3, draws=4)
    for norm in S.NORMS[arch]:
        c = cal[cal.norm == norm]
        pl, ra = c[c.kind == "planted"], c[c.kind == "random"]
        assert len(pl) == len(ra) == 4 * cfg["n_head"]
        assert pl.aligned.mean() >= S.DETECT and (pl.ratio > 1 - 1e-6).all()
        assert ra.aligned.mean() <= S.FALSE_ALARM and ra.ratio.max() < S.ALIGNED
        assert (c.feasible.astype(bool)).all() and (c.violation <= 1e-6).all()


def test_calibration_on_held_out_queries_cannot_say_yes(tiny):
    """An SVM planted on other sequences than the probe (the text study's held-out probe)
    is not the SVM of the probe's queries: the instrument does not detect it."""
    cfg, data = tiny
    model = S.build_model("gpt2", cfg, data["vocab"], seed=0)
    pop = data["population"]
    cal = S.calibrate(model, pop[::2], pop[1::2], ("fro",), seed=3, draws=4)
    pl = cal[cal.kind == "planted"]
    assert pl.aligned.mean() < S.DETECT and pl.ratio.median() < S.ALIGNED


# ------------------------------------------------------------------ training pieces
def test_unigram_level_against_a_direct_count():
    train = torch.tensor([0, 0, 1, 2, 2, 2])
    val = torch.tensor([0, 2, 3])
    p = (np.array([2, 1, 3, 0]) + 1) / 10  # add-one over a vocabulary of 4
    want = -np.mean(np.log(p[[0, 2, 3]]))
    assert abs(S.unigram_level(train, val, 4) - want) < 1e-12


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_ntp_loss_is_the_models_own_and_takes_replaced_targets(tiny, arch):
    cfg, data = tiny
    model = S.build_model(arch, cfg, data["vocab"], seed=0)
    x = data["val_batch"]
    with torch.no_grad():
        ref = model(input_ids=x, labels=x).loss  # the library's own shifted loss
        assert abs(float(S.ntp_loss(model, x)) - float(ref)) < 1e-5
        y = x[:, 1:].reshape(-1)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        logp = torch.log_softmax(model(input_ids=x).logits[:, :-1].reshape(len(y), -1), -1)
        want = -logp[torch.arange(len(y)), y[perm]].mean()  # the targets replaced, by hand
        assert abs(float(S.ntp_loss(model, x, y[perm])) - float(want)) < 1e-5
    emb = model.get_input_embeddings().weight  # no padding index: every embedding nonzero
    assert (emb.norm(dim=1) > 0).all()


def test_muon_runs_on_block_matrices_and_adamw_on_the_rest(tiny):
    cfg, _ = tiny  # on text (the copy task's 4 token ids give rank-deficient gradients)
    cfg = dict(cfg, task="text", n_head=4, n_kv_head=2, context=12, probe_seqs=2, val_seqs=4,
               plant_seqs=2)
    data = S.make_data(cfg)
    model = S.build_model("llama", cfg, data["vocab"], seed=0)
    x = data["val_batch"]
    mats, rest = S.hidden_matrices(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 and ".layers." in names[id(p)] for p in mats)
    assert {names[id(p)].rsplit(".", 2)[-2] for p in mats} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(mats) + len(rest) == len(list(model.parameters()))  # each parameter once
    spec = next(s for s in S.OPTIMIZERS if s["name"] == "Muon")
    opts = S.optimizers(spec, model)
    before = {id(p): p.detach().clone() for p in model.parameters()}
    S.ntp_loss(model, x).backward()
    for o in opts:
        o.step()
    W = mats[0]
    step = (W.detach() - before[id(W)]) / spec["lr"]
    sv = torch.linalg.svdvals(step.double())
    assert 0.5 < sv.min() and sv.max() < 1.3  # an (approximate) polar factor: Newton-Schulz
    emb = model.get_input_embeddings().weight  # AdamW's first step: lr * sign(g) per entry
    moved = (emb.detach() - before[id(emb)]).abs()
    g = emb.grad.abs() > 1e-4  # (eps = 1e-8 matters below)
    torch.testing.assert_close(moved[g], torch.full_like(moved[g], spec["others"]["lr"]),
                               rtol=1e-3, atol=1e-6)


def test_tiny_run_end_to_end(tiny):
    cfg, _ = tiny
    muon = next(s for s in S.OPTIMIZERS if s["name"] == "Muon")
    cfg = dict(cfg, archs=("gpt2",), optimizers=(muon,))
    t = S.compute(cfg)
    tr, m = t["track"], t["measure"]
    heads = cfg["n_layer"] * cfg["n_head"]
    assert len(tr) == 2 * cfg["records"] * heads  # true and shuffled labels
    assert len(m) == 3 * heads * len(S.NORMS["gpt2"])  # init, true, shuffled; per norm
    assert tr.recompute_err.max() < 1e-5 and m.feasible.all()
    assert set(t["summary"].condition) == {"random init", "trained", "shuffled"}
    assert set(t["ceiling"].kind) == {"planted", "random"}
    checks = S.judge(t, cfg)
    keys = S._order("gpt2")
    assert len(checks) == len(keys)
    c = dict(zip(keys, checks))
    assert c["setup"].passed and c["calibration"].passed
