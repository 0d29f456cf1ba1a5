"""W_fin and the decomposition W_t ~ R W_svm + W_fin (attnsvm.ntp.fin)."""

from __future__ import annotations

import numpy as np
import pytest

from attnsvm.ntp import NTPData, decompose, ntp_random, s_fin_basis, w_fin
from attnsvm.svm import graph_svm


def test_w_fin_closed_form_log_ratio():
    """One tie {0, 1} under query 2, label 0 twice and label 1 once: the reduced loss
    -2 log sigma(delta) - log sigma(-delta) has delta = log 2 (p_0 / p_1 = 2), so with
    orthonormal embeddings W_fin = (log 2 / 2) (e_0 - e_1) e_2^T."""
    E = np.eye(4)
    seqs = [[0, 1, 2], [0, 1, 2], [1, 0, 2], [3, 0, 2]]
    y = [0, 0, 1, 0]
    fin = w_fin(NTPData(E, seqs, y))
    want = np.zeros((4, 4))
    want[0, 2], want[1, 2] = np.log(2) / 2, -np.log(2) / 2
    assert fin.converged and np.abs(fin.W - want).max() < 1e-12
    assert fin.basis.shape[0] == 1


@pytest.mark.parametrize("head", ["iden", "gen"])
def test_w_fin_is_stationary_and_orthogonal_to_w_svm(head):
    import torch

    from attnsvm.ntp.fin import _reduced_loss

    D = ntp_random(10, 6, 8, 8, graph="cyclic", seed=4)
    fin = w_fin(D, head=head)
    assert fin.converged and fin.grad_norm <= 1e-10
    Ws = graph_svm(D.E, D.seqs, D.y).W_
    assert abs(np.sum(fin.W * Ws)) <= 1e-9 * np.linalg.norm(fin.W) * np.linalg.norm(Ws) + 1e-15
    # stationary along every direction of S_fin (finite differences of the reduced loss)
    t = lambda a: torch.as_tensor(a)  # noqa: E731
    Y = D.labels
    ym = ((D.seqs[:, None, :] == Y[:, :, None]) & (Y[:, :, None] >= 0)).any(1)

    def L(W):
        return float(_reduced_loss(t(W), t(D.X), t(D.X[:, -1]), t(ym), t(fin.mask), t(D.E),
                                   t(Y[:, 0]), head))
    for B in fin.basis:
        h = 1e-5
        assert abs(L(fin.W + h * B) - L(fin.W - h * B)) / (2 * h) < 1e-8


@pytest.mark.parametrize("cell, seed", [(2, 20), (4, 31), (4, 85)])
def test_w_fin_converges_past_the_loss_rounding_floor(cell, seed):
    """Three ntp-global datasets whose Newton run used to stop at gradient ~2e-10: its line
    search on loss values could not see a decrease of ~5e-19 (below the loss's rounding),
    and refused the quadratic step for 200 iterations.  Now they converge (gradient <=
    1e-10), and W_fin is stationary by an independent central difference of the reduced
    loss along its basis, at the scale a 1e-10 gradient allows."""
    import torch

    from attnsvm.ntp import PUBLISHED_SIZES
    from attnsvm.ntp.fin import _reduced_loss

    size = PUBLISHED_SIZES["n6T4K6d8" if cell == 2 else "n10T6K8d8"]
    D = ntp_random(*size, graph="cyclic", seed=[0, cell, seed])
    fin = w_fin(D, head="iden")
    assert fin.converged and fin.grad_norm <= 1e-10 and fin.n_iter < 20, fin.grad_norm
    t = torch.as_tensor
    Y = D.labels
    ym = ((D.seqs[:, None, :] == Y[:, :, None]) & (Y[:, :, None] >= 0)).any(1)

    def L(W):
        return float(_reduced_loss(t(W), t(D.X), t(D.X[:, -1]), t(ym), t(fin.mask), t(D.E),
                                   t(Y[:, 0]), "iden"))
    for B in fin.basis:
        h = 1e-4
        assert abs(L(fin.W + h * B) - L(fin.W - h * B)) / (2 * h) < 1e-8


def test_acyclic_has_no_fin_and_decompose_reads_the_measures():
    D = ntp_random(6, 4, 6, 8, graph="acyclic", seed=0)
    fin = w_fin(D)
    assert s_fin_basis(D).shape[0] == 0 and np.all(fin.W == 0)
    Ws = graph_svm(D.E, D.seqs, D.y).W_
    Wt = np.stack([3.0 * Ws, 10.0 * Ws + 1e-3 * np.eye(8)])
    dec = decompose(Wt, Ws, fin)
    assert np.isclose(dec["corr_svm"][0], 1.0) and dec["corr_svm"][1] < 1.0
    assert np.isclose(dec["R"][0], 3.0 * np.linalg.norm(Ws))
    assert dec["resid"][0] < 1e-14 and dec["resid"][1] > 1e-6
