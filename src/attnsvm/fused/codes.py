"""The integer codes and configuration layout shared by :mod:`attnsvm.fused` and its numba
kernels (:mod:`.kernels`); plain Python, importable without numba.

``ic`` (integers) and ``fc`` (reals) are arrays, so each kernel compiles once for every
model, loss and rule. A rule's slots are filled from the numbers its transforms carry
(``Optimizer.kernel``, :mod:`attnsvm.optim.kernel_ops`): IC_RULE is the step loop that
runs the rule's sequence of opcodes (see ``attnsvm.fused.PROGRAMS``).
"""

from attnsvm.optim.kernel_ops import LP_FRO, LP_GEN, LP_INF, LP_ONE, PARAM_MAX

__all__ = [
    "W_MODEL", "KQ_MODEL", "DIAG_MODEL", "PROMPT_MODEL", "LOGISTIC", "EXPONENTIAL",
    "CORRELATION", "R_NONE", "R_GD", "R_NSD", "R_POLYAK", "R_MIRROR", "LP_FRO", "LP_INF",
    "LP_ONE", "LP_GEN", "PARAM_MAX", "STOP_ZERO", "STOP_NONFINITE", "STOP_NOCHANGE", "IC_SLOTS", "FC_SLOTS",
]

# models (``ic[IC_MODEL]``) and losses (``ic[IC_LOSS]``)
W_MODEL, KQ_MODEL, DIAG_MODEL, PROMPT_MODEL = 0, 1, 2, 3
LOGISTIC, EXPONENTIAL, CORRELATION = 0, 1, 2
# step loops (``ic[IC_RULE]``): none (the gradient only), GD, normalised steepest descent
# in an entrywise norm, Polyak, l_p mirror descent
R_NONE, R_GD, R_NSD, R_POLYAK, R_MIRROR = 0, 1, 2, 3, 4
# why a trial stopped
STOP_ZERO, STOP_NONFINITE, STOP_NOCHANGE = 1, 2, 3

# ic: integer configuration
IC_MODEL, IC_TRAINED, IC_LOSS, IC_RULE, IC_GLOBAL, IC_RELATIVE, IC_NP = 0, 1, 2, 3, 4, 5, 6
IC_N, IC_Q, IC_T, IC_D, IC_M, IC_MASK, IC_STALL, IC_LP, IC_NORMALIZED = 7, 8, 9, 10, 11, 12, 13, 14, 15
IC_MAXLR, IC_NEEDGAP, IC_WID, IC_SIZE = 16, 17, 18, 19
# fc: real hyper-parameters
FC_LR, FC_P, FC_Q, FC_REG, FC_C, FC_MAXLR, FC_CAP, FC_SIZE = 0, 1, 2, 3, 4, 5, 6, 7

#: the slot of each number a transform's KernelOp may carry (its ``args`` names)
IC_SLOTS = {"lp": IC_LP, "global": IC_GLOBAL, "relative": IC_RELATIVE,
            "normalized": IC_NORMALIZED, "maxlr": IC_MAXLR}
FC_SLOTS = {"lr": FC_LR, "p": FC_P, "q": FC_Q, "c": FC_C, "max_lr": FC_MAXLR, "cap": FC_CAP}

# in-kernel metric records (kernels._trial_record): the record configuration ``rc`` and
# the columns of a record row (attnsvm.recorder's default metrics, in this order)
RC_ALPHA, RC_NREF, RC_NUC, RC_SIZE = 0, 1, 2, 3
(M_LOSS, M_GAP, M_LOG10_GAP, M_NORM, M_NORM_NUC, M_NORM_HEAD, M_PSEL_MEAN, M_PSEL_MIN,
 M_PMAX, M_SPARSITY, M_CORR) = range(11)
