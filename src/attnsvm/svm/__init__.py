"""Max-margin problems of docs/theory.md §5 with checkable certificates.

Public API::

    att_svm(X, z, alpha=None, *, y=None, v=None, norm="fro", rank=None, mask=None)
        norm: "fro" | "nuc" | "spectral" | "l1" | "linf" | p | "l<p>" (attnsvm.norms)
    prompt_svm(X, W=None, alpha=None, ...)          # solution is the vector p
    seq2seq_svm(X, alpha, causal=False, mask=None, norm="fro")
    head_svm(R, y, p=2);  relaxed_svm(X, alpha, y, ...)
    multitoken_svm(X, z, s, threshold=1e-3, W_trained=None)
    graph_svm(E, seqs, y, norm="fro" | "nuc")     # next-token prediction (attnsvm.svm.graph)
    att_svm_batch(X, z, alpha, norm=...) / prompt_svm_batch(X, W, alpha, norm=...) -> BatchSolution
    Solution / BatchSolution: W_, norm_, margin_, violation_, kkt_residual_, gap_, dual_,
        support_, margins_, status_, solver_, feasible_, conflict_, alpha_

One engine (:mod:`attnsvm.svm.engine`) solves every problem, single (B = 1) or batched,
and one certificate (:func:`attnsvm.svm.certificate.certify`), computed from the returned W on
all constraints, sets ``feasible_`` and ``status_``; "infeasible" needs a verified Farkas
certificate.  Inputs are validated in one place (:mod:`attnsvm.svm.validate`).
The Graph-SVM (:mod:`~attnsvm.svm.graph`) takes its solvers from the same table (the
norm's row, field ``graph``) and proves each candidate with its own proof (equality rows,
exact scaling of E).

Modules by concern: constraints (:mod:`~attnsvm.svm.constraints`), which solver for which
norm (:mod:`~attnsvm.svm.strategy`, one table), the solvers (:mod:`~attnsvm.svm.frobenius`,
:mod:`~attnsvm.svm.nuclear`, :mod:`~attnsvm.svm.conic`, :mod:`~attnsvm.svm.fast` (the
Frobenius interior-point methods), :mod:`~attnsvm.svm.sdp` (the nuclear-norm SDP methods), the
compiled :mod:`~attnsvm.svm.active` with its plain reference :mod:`~attnsvm.svm.wolfe`),
the certificate (:mod:`~attnsvm.svm.certificate`), infeasibility
(:mod:`~attnsvm.svm.farkas`), the results (:mod:`~attnsvm.svm.result`) in the caller's
units (:mod:`~attnsvm.svm.assemble`).
"""

from .batch import att_svm_batch, prompt_svm_batch
from .constraints import ConstraintSet
from .graph import graph_svm, graph_svm_batch
from .multitoken import MultiTokenSolution, multitoken_svm, selected_sets
from .problems import *  # noqa: F403 - the names of problems.__all__ (their one list)
from .problems import __all__ as _problem_names
from .result import BatchSolution, NotRepresentableError, Solution, dual_norm, primal_norm

__all__ = [
    *_problem_names,  # (att_svm, prompt_svm, seq2seq_svm, head_svm, relaxed_svm, ...)
    "multitoken_svm",
    "graph_svm",
    "graph_svm_batch",
    "selected_sets",
    "att_svm_batch",
    "prompt_svm_batch",
    "Solution",
    "BatchSolution",
    "MultiTokenSolution",
    "ConstraintSet",
    "NotRepresentableError",
    "primal_norm",
    "dual_norm",
]
