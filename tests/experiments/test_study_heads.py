"""study-heads: every verdict fed a violating result fails, the pieces of a run against
independent computations (the model's own loss, counts, singular values), and a tiny run end
to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from attnsvm.experiments import study_heads as S  # noqa: E402

STEPS = (0, 10, 30, 100, 300, 1000)
CFG = {"archs": ("llama",), "optimizers": ({"name": "AdamW"},)}


def _tables(case: str = "good", seeds: int = 3, heads: int = 8) -> dict:
    """Synthetic track / loss tables of one (arch, optimizer): ``good`` = every verdict holds;
    another ``case`` breaks one thing (see FAILS)."""
    rng = np.random.default_rng(0)
    rows, losses = [], []
    f = np.linspace(0, 1, len(STEPS))  # 0 at init, 1 at the end
    for labels in ("true", "shuffled"):
        for seed in range(seeds):
            for layer in range(2):
                for head in range(heads // 2):
                    j = rng.uniform(0.9, 1.1)
                    if labels == "true":
                        norm = 0.01 * (1 + 99 * f) * j
                        sparsity = 16 / (1 + 7 * f) * j
                        corr = 0.2 + 0.6 * f
                    else:  # shuffled labels: small growth, flat alignment
                        norm = 0.01 * (1 + 0.5 * f) * j
                        sparsity = 16 * (1 - 0.02 * f) * j
                        corr = 0.2 + 0.0 * f
                    if labels == "true" and case == "premise":      # sparsity does not fall
                        sparsity = 16 * j * np.ones_like(f)
                    if labels == "true" and case == "rises":        # corr falls as ||W_h|| grows
                        norm = 0.01 * j * np.array([1, 600, 500, 400, 300, 200])
                    if labels == "true" and case == "init":         # final corr barely above init
                        corr = 0.2 + 0.05 * f
                    if labels == "shuffled" and case == "init":
                        corr = 0.2 - 0.1 * f
                    if labels == "shuffled" and case == "shuffled":  # control aligns as much
                        corr = 0.2 + 0.6 * f
                    corr = corr + rng.uniform(-0.005, 0.005, len(f))
                    corr[0] = 0.2 + rng.uniform(-0.005, 0.005)  # the shared random-init record
                    for i, step in enumerate(STEPS):
                        rows.append(dict(arch="llama", optimizer="AdamW", labels=labels, seed=seed,
                                         step=step, layer=layer, head=head,
                                         soft_sparsity=sparsity[i], wqk_norm=norm[i],
                                         lifted_norm=norm[i], corr_mm=corr[i], feasible=True,
                                         svm_violation=0.0, svm_gap=1e-12, recompute_err=1e-7))
            for i, step in enumerate(STEPS):
                final = 2.0 if labels == "true" else 3.4
                if case == "learns" and labels == "true":
                    final = 3.2
                if case == "control" and labels == "shuffled":
                    final = 2.5
                losses.append(dict(arch="llama", optimizer="AdamW", labels=labels, seed=seed,
                                   step=step, val_loss=4.6 + (final - 4.6) * f[i], unigram=3.24))
    track = pd.DataFrame(rows)
    if case == "setup":
        track.loc[3, "recompute_err"] = 1e-3
    loss = pd.DataFrame(losses)
    return {"track": track, "loss": loss, "heads": S.head_table(track)}


def test_judge_passes_a_table_built_to_pass():
    checks = S.judge(_tables(), CFG)
    assert [c.kind for c in checks] == ["sanity"] * 3 + ["finding"] * 4
    assert all(c.passed for c in checks), [c.measured for c in checks if not c.passed]
    assert all(c.claim.startswith("[llama/AdamW] ") for c in checks)


FAILS = [  # (case, the indices in ORDER of the checks that fail)
    ("learns", [0]),    # trained held-out loss only 0.04 nat below the unigram level
    ("control", [1]),   # the shuffled-label run beats the unigram level: not a control
    ("setup", [2]),     # one extraction off by 1e-3
    ("premise", [3]),   # ||W_h|| grows but attention does not sparsify
    ("rises", [4]),     # after a jump, ||W_h|| falls while corr rises: Spearman < 0
    ("init", [5]),      # final corr only 0.05 above the random-init control
    ("shuffled", [6]),  # the shuffled-label control aligns as much as the trained heads
]


@pytest.mark.parametrize("case,bad", FAILS)
def test_each_verdict_fails_on_a_table_built_to_violate_it(case, bad):
    checks = S.judge(_tables(case), CFG)
    failed = [i for i, c in enumerate(checks) if not c.passed]
    assert failed == bad, [(S.ORDER[i], checks[i].measured) for i in failed]


def test_missing_or_nan_values_fail_instead_of_passing():
    t = _tables()
    t["track"]["corr_mm"] = np.nan  # every SVM infeasible: no alignment is measured
    t["heads"] = S.head_table(t["track"])
    checks = S.judge(t, CFG)
    assert [c.passed for c in checks[4:]] == [False] * 3


def test_head_table_spearman_and_ends():
    h = S.head_table(_tables()["track"])
    tru = h[h.labels == "true"]
    assert len(h) == 2 * 3 * 8 and (tru.rho > 0.9).all() and (tru.step_T == 1000).all()
    assert np.allclose(tru.norm_T / tru.norm_0, 100)


def test_unigram_level_against_a_direct_count():
    train = torch.tensor([0, 0, 1, 2, 2, 2])
    val = torch.tensor([0, 2, 3])
    p = (np.array([2, 1, 3, 0]) + 1) / 10  # add-one over a vocabulary of 4
    want = -np.mean(np.log(p[[0, 2, 3]]))
    assert abs(S.unigram_level(train, val, 4) - want) < 1e-12


@pytest.fixture(scope="module")
def tiny():
    cfg = S.EXPERIMENT.config("tiny")
    return cfg, S.make_data(cfg)


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
    # no padding index: every character keeps its (random, nonzero) embedding
    emb = model.get_input_embeddings().weight
    assert (emb.norm(dim=1) > 0).all()


def test_muon_runs_on_block_matrices_and_adamw_on_the_rest(tiny):
    cfg, data = tiny
    model = S.build_model("llama", cfg, data["vocab"], seed=0)
    mats, rest = S.hidden_matrices(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 and ".layers." in names[id(p)] for p in mats)
    assert {names[id(p)].rsplit(".", 2)[-2] for p in mats} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(mats) + len(rest) == len(list(model.parameters()))  # each parameter once
    spec = next(s for s in S.OPTIMIZERS if s["name"] == "Muon")
    opts = S.optimizers(spec, model)
    before = {id(p): p.detach().clone() for p in model.parameters()}
    S.ntp_loss(model, data["val_batch"]).backward()
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
    cfg = dict(cfg, archs=("llama",), optimizers=(muon,))
    t = S.compute(cfg)
    tr = t["track"]
    heads = cfg["n_layer"] * cfg["n_head"]
    assert len(tr) == 2 * cfg["records"] * heads  # true and shuffled labels
    init = tr[tr.step == 0].sort_values(["labels", "layer", "head"])
    a, b = (init[init.labels == lab].corr_mm.to_numpy() for lab in S.LABELS)
    assert np.array_equal(a, b)  # one random-init record, shared
    assert tr.recompute_err.max() < 1e-5 and tr.feasible.all()
    assert set(t["summary"].condition) == {"random init", "trained", "shuffled"}
    checks = S.judge(t, cfg)
    assert len(checks) == len(S.ORDER) and checks[2].passed  # the set-up check holds
