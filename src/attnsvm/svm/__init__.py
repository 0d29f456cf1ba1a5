"""Max-margin problems of THEORY §5 with checkable certificates.

Public API::

    att_svm(X, z, alpha=None, *, y=None, v=None, norm="fro"|"nuc"|"l1"|p, rank=None, mask=None)
    prompt_svm(X, W=None, alpha=None, ...)          # solution is the vector p
    seq2seq_svm(X, alpha, causal=False, mask=None)
    head_svm(R, y, p=2);  relaxed_svm(X, alpha, y, ...)
    multitoken_svm(X, z, s, threshold=1e-3, W_trained=None)
    att_svm_batch(X, z, alpha) / prompt_svm_batch(X, W, alpha) -> BatchSolution
    Solution / BatchSolution: W_, norm_, margin_, violation_, kkt_residual_, gap_, dual_,
        support_, margins_, status_, solver_, feasible_, conflict_, alpha_
"""

from .batch import BatchSolution, att_svm_batch, prompt_svm_batch
from .multitoken import MultiTokenSolution, multitoken_svm, selected_sets
from .problems import (
    att_svm,
    farkas_conflict,
    head_svm,
    opt_tokens,
    prompt_svm,
    relaxed_svm,
    scores,
    seq2seq_svm,
)
from .solution import ConstraintSet, Solution, dual_norm, primal_norm

__all__ = [
    "att_svm",
    "prompt_svm",
    "seq2seq_svm",
    "head_svm",
    "relaxed_svm",
    "multitoken_svm",
    "selected_sets",
    "att_svm_batch",
    "prompt_svm_batch",
    "farkas_conflict",
    "scores",
    "opt_tokens",
    "Solution",
    "BatchSolution",
    "MultiTokenSolution",
    "ConstraintSet",
    "primal_norm",
    "dual_norm",
]
