"""The fused training engine: each trial's steps run in one compiled loop with its data in
cache (numba, CPU), instead of one batched tensor program per step.

    train(model, data, ..., engine="auto")    # "auto" | "torch" | "fused"

"auto" runs the fused engine when numba is importable and the configuration is
supported (:func:`unsupported` says why not), else the torch path; "fused" raises a
ValueError naming what is not supported; "torch" is the reference. On a CUDA device the
fused engine is :mod:`attnsvm.fused.cuda` (the same per-trial code, one GPU thread per
trial; numba-cuda, ``attnsvm[cuda]``), for the rules that run in the kernel. Two fused
modes:

* ``"fused"``: a stateless rule whose transforms all carry a compiled counterpart
  (``Optimizer.kernel``, :mod:`attnsvm.optim.kernel_ops`) in a sequence of opcodes that
  :data:`PROGRAMS` maps to a step loop (gd; steepest descent in an entrywise norm, per
  tensor or global, relative; polyak; l_p mirror descent, plain or normalised), whatever
  the rule is called, runs whole segments of steps between two metric records inside
  :func:`kernels.run_steps`;
* ``"fused-gradient"``: every other rule (spectral / nuclear steepest descent,
  momentum, adam, adamw, adagrad, signum, muon, custom rules) takes the scaled gradient
  from :func:`kernels.grad_batch` and updates in torch, one call per step.

Supported: WModel, KQModel, DiagModel, PromptModel with a linear head (fixed or
trained), every query kind and key mask, the logistic / exponential / correlation
losses, full-batch steps, float64 on the CPU (and on CUDA, in-kernel rules). The maths is the stable scaled form of
:mod:`attnsvm.models.objective` (saturation-safe), so the fused path equals the torch
path to rounding (tests/test_fused.py) and is bit-for-bit deterministic for any number
of threads (trials are independent; sums run in a fixed order; no fastmath).
"""

from __future__ import annotations

import numpy as np
import torch

from attnsvm._optional import OptionalImport
from attnsvm._parallel import thread_pool
from attnsvm.optim.kernel_ops import Op

from . import codes as C

__all__ = ["available", "unsupported", "not_compiled", "Plan", "plan", "Records", "ENGINES",
           "PROGRAMS", "warmup"]

ENGINES = ("auto", "torch", "fused")

_kernels = OptionalImport(".kernels", __package__)  # the numba kernels, or None


def available() -> bool:
    """Whether numba is importable (the fused engine can run)."""
    return _kernels() is not None


# -------------------------------------------------------------- what is supported
#: the kernels' parameterisations, by the kind a model declares (``model.kernel_kind``,
#: read through :meth:`attnsvm.models.AttentionModel.kernel_inputs`)
_MODELS = {"W": C.W_MODEL, "KQ": C.KQ_MODEL, "Diag": C.DIAG_MODEL, "Prompt": C.PROMPT_MODEL}
_LOSSES = {"logistic": C.LOGISTIC, "exponential": C.EXPONENTIAL, "correlation": C.CORRELATION}

#: the kernel's step loops, by the sequence of opcodes of a rule's transforms
#: (``Optimizer.kernel``): {opcodes: (IC_RULE, extra integer slots)}. The numbers the
#: transforms carry fill the other slots (codes.IC_SLOTS, codes.FC_SLOTS).
PROGRAMS = {
    (Op.LEARNING_RATE, Op.DESCEND): (C.R_GD, {}),
    (Op.STEEPEST, Op.LEARNING_RATE, Op.DESCEND): (C.R_NSD, {}),
    (Op.STEEPEST, Op.PARAM_NORM, Op.LEARNING_RATE, Op.DESCEND): (C.R_NSD, {"relative": 1}),
    (Op.POLYAK, Op.DESCEND): (C.R_POLYAK, {"needgap": 1}),
    (Op.LEARNING_RATE, Op.MIRROR): (C.R_MIRROR, {}),
    (Op.NORMALIZE, Op.LEARNING_RATE, Op.MIRROR): (C.R_MIRROR, {"normalized": 1}),
}


def program(optimizer):
    """(IC_RULE, {integer slot: value}, {real slot: value}) of the rule's compiled
    counterpart, read from the data its transforms carry (``optimizer.kernel``), or None
    (then the fused gradient feeds the torch update; :func:`not_compiled` says why): a
    stateful or stochastic rule, a transform with no counterpart, or a sequence of
    opcodes no step loop runs."""
    return _program(optimizer)[0]


def not_compiled(optimizer) -> str | None:
    """Why the rule's steps do not run inside the kernel (a short phrase), or None when
    they do. The kernel's step loops are a closed set, :data:`PROGRAMS`: any other chain
    of transforms, even one whose parts each carry a kernel (``normalize_by(l1)`` then a
    learning rate), takes the compiled gradient and updates in torch ("fused-gradient");
    ``Trajectory.extra["engine_reason"]`` records this phrase."""
    return _program(optimizer)[1]


def _program(optimizer):
    """(the compiled program or None, why not or None): :func:`program`, :func:`not_compiled`."""
    ops = optimizer.kernel
    if optimizer.stateful:
        return None, "a stateful rule (the kernel's step loops are stateless)"
    if optimizer.batch_size is not None:
        return None, "a stochastic rule (the kernel's step loops are full-batch)"
    if ops is None:
        return None, "a transform of the rule has no compiled counterpart"
    seq = tuple(int(o.op) for o in ops)
    if seq not in PROGRAMS:
        names = " + ".join(Op(o).name.lower() for o in seq)
        return None, (f"no step loop of the kernel runs the chain {names} (fused.PROGRAMS: "
                      "gd, steepest descent, relative steepest descent, polyak, mirror descent)")
    code, extra = PROGRAMS[seq]
    args = {}
    for o in ops:
        for k, v in o.args.items():
            if k in args and args[k] != v:  # e.g. a relative step measured in another norm
                return None, f"two transforms disagree on {k} ({args[k]!r} and {v!r})"
            args[k] = v
    if args.get("q") is not None and seq[0] == Op.NORMALIZE:  # G / ||G||_q: the mirror's q
        if args["q"] != args["p"] / (args["p"] - 1.0):
            return None, (f"a mirror step of p = {args['p']:g} normalised in l_{args['q']:g} "
                          f"(the kernel normalises in the dual l_q, q = p / (p - 1))")
    args.update(extra)
    if code == C.R_MIRROR and args["p"] == 2.0:  # l_2 mirror descent is GD / NGD (bit for bit)
        if args.get("normalized"):
            code, args = C.R_NSD, {"lr": args["lr"], "lp": C.LP_FRO, "p": 2.0, "q": 2.0}
        else:
            code, args = C.R_GD, {"lr": args["lr"]}
    elif code == C.R_MIRROR:
        args["q"] = args["p"] / (args["p"] - 1.0)
    ints = {C.IC_SLOTS[k]: int(v) for k, v in args.items() if k in C.IC_SLOTS}
    ints[C.IC_NEEDGAP] = int(args.get("needgap", 0))
    reals = {C.FC_SLOTS[k]: float(v) for k, v in args.items() if k in C.FC_SLOTS}
    return (code, ints, reals), None


def unsupported(model, lossf, optimizer=None, tdata=None, batch_size=None,
                autograd: bool = False) -> str | None:
    """Why the fused engine cannot run this configuration (a short phrase), or None."""
    if not available():
        return f"numba is not importable ({_kernels.error}); install attnsvm[fast]"
    if not getattr(model, "has_kernel", False) or model.kernel_kind not in _MODELS:
        return (f"model {type(model).__name__} (no compiled kernel; fused: WModel, KQModel, "
                "DiagModel, PromptModel)")
    if model.head != "linear":
        return f"head {model.head!r} (fused: linear heads, fixed or trained)"
    from attnsvm.losses import LOSSES

    if getattr(lossf, "name", None) not in _LOSSES or LOSSES[lossf.name] is not lossf:
        return f"loss {getattr(lossf, 'name', lossf)!r} (fused: logistic, exponential, correlation)"
    if autograd:
        return "autograd=True (the fused engine computes the closed-form gradient)"
    if batch_size is not None:
        return "mini-batches (batch_size; fused: full-batch steps)"
    if tdata is not None:
        X = tdata["X"]
        if X.device.type == "cuda":
            why = _cuda_engine()[1]
            if why is not None:
                return why
            if optimizer is not None and program(optimizer) is None:  # whole steps only
                return (f"rule {optimizer} on CUDA (fused-cuda: the stateless rules of "
                        "fused.PROGRAMS, full-batch)")
        elif X.device.type != "cpu":
            return f"device {X.device.type} (fused: CPU and CUDA; use engine='torch' on " \
                   f"{X.device.type})"
        if X.dtype != torch.float64:
            return f"dtype {X.dtype} (fused: float64)"
    return None


def _cuda_engine():
    """(attnsvm.fused.cuda, None) when the CUDA engine can run here, else (None or the
    module, why not): numba-cuda importable and a CUDA device visible to it."""
    try:
        from . import cuda as module
    except ImportError as exc:
        return None, f"numba-cuda is not importable ({exc}); install attnsvm[cuda]"
    return module, module.device_ok()


def plan(model, tdata, lossf, optimizer, Q: int, B: int, check_stall: bool) -> Plan:
    """The plan of a supported configuration (:func:`unsupported` is None) on the data's
    device: :class:`Plan` on the CPU, :class:`attnsvm.fused.cuda.CudaPlan` on CUDA."""
    cls = Plan
    if _on_cuda(tdata):
        cls = _cuda_engine()[0].CudaPlan
    return cls(model, tdata, lossf, optimizer, Q, B, check_stall)


def _on_cuda(tdata) -> bool:
    """Whether the run takes the CUDA engine (the data live on a CUDA device;
    tests/test_fused_cuda.py patches it to drive the simulator with CPU data)."""
    return tdata["X"].device.type == "cuda"


# --------------------------------------------------------------------- the plan
def _flat(t, dtype=np.float64):
    """A (B, ...) tensor as a C-contiguous (B, prod(...)) array (one flat row per trial)."""
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return np.ascontiguousarray(a.reshape(a.shape[0], -1), dtype=dtype)


class Plan:
    """A configuration compiled for the kernels: data arrays, codes and slots.

    ``Plan(model, tdata, lossf, optimizer, Q, B)``; ``plan.in_kernel`` says whether the
    rule runs inside the kernel (:meth:`run`) or only the gradient does (:meth:`evaluate`).
    Parameters live in flat slots (B, s) while the plan runs (:meth:`load`, :meth:`params`).
    :class:`attnsvm.fused.cuda.CudaPlan` is the same plan on a CUDA device.
    """

    engine = "fused"
    _flat = staticmethod(_flat)  # the data arrays' layout (CudaPlan: trial-minor, on the device)

    def __init__(self, model, tdata, lossf, optimizer, Q: int, B: int, check_stall: bool):
        K = _kernels()
        self.K, self.model, self.B, self.Q = K, model, B, Q
        self.names = list(model.param_shapes())
        self.shapes = model.param_shapes()
        ki = model.kernel_inputs(tdata, Q)  # the model's public protocol: no private reads
        mcode = _MODELS[ki.kind]
        na = 2 if mcode in (C.KQ_MODEL, C.DIAG_MODEL) else 1
        self.slots = {nm: (i if i < na else na) for i, nm in enumerate(self.names)}
        X = tdata["X"]
        n, T, d = X.shape[1:]
        self.X = self._flat(X)
        trained = ki.trained
        if ki.Z is not None:
            self.Z = self._flat(ki.Z.expand(ki.Z.shape[0], n, Q, d))
        else:
            self.Z = np.zeros((1, 1))
        self.w = self._flat(torch.log(ki.weights))  # log w: the kernels' form
        if trained:
            self.gam, self.gopt = np.zeros((1, 1)), np.zeros((1, 1))
            self.yl = self._flat(ki.labels.expand(-1, n, Q))
        else:
            self.gam, self.gopt = self._flat(ki.gamma), self._flat(ki.gamma_opt)
            self.yl = np.zeros((1, 1))
        km = ki.key_mask
        if km is None:
            self.mask = np.ones((1, 1), dtype=np.uint8)
        else:
            km = km if km.ndim == 4 else km[None, None]
            self.mask = self._flat(km.expand(km.shape[0], n, Q, T), np.uint8)
        wid = False
        if ki.W_fixed is not None:
            wid = bool(np.array_equal(ki.W_fixed, np.eye(d)))
            Wf = np.asarray(ki.W_fixed, dtype=np.float64)
            self.Wf = np.ascontiguousarray(np.stack([Wf.T.ravel(), Wf.ravel()]))
        else:
            self.Wf = np.zeros((2, 1))
        m = ki.m
        rc, self.why = _program(optimizer)  # why: the rule is not compiled (or None)
        self.in_kernel = rc is not None
        ic = np.zeros(C.IC_SIZE, dtype=np.int64)
        fc = np.zeros(C.FC_SIZE, dtype=np.float64)
        ic[C.IC_MODEL], ic[C.IC_TRAINED] = mcode, int(trained)
        ic[C.IC_LOSS] = _LOSSES[lossf.name]
        ic[C.IC_NP] = len(self.names)
        ic[C.IC_N], ic[C.IC_Q], ic[C.IC_T], ic[C.IC_D], ic[C.IC_M] = n, Q, T, d, m
        ic[C.IC_MASK] = int(km is not None)
        ic[C.IC_STALL] = int(check_stall)
        ic[C.IC_WID] = int(wid)
        fc[C.FC_REG] = ki.reg
        fc[C.FC_P], fc[C.FC_Q], fc[C.FC_C], fc[C.FC_MAXLR] = 2.0, 2.0, 1.0, 1.0
        if rc is not None:
            code, ints, reals = rc
            ic[C.IC_RULE] = code
            for slot, v in ints.items():
                ic[slot] = v
            for slot, v in reals.items():
                fc[slot] = v
        self.ic, self.fc = ic, fc
        self._slots = None
        self.capped = np.zeros(B)  # steps that took Polyak's range cap, per trial

    # ---------------------------------------------------------- parameters
    def _empty_slots(self):
        sz = [0, 0, 0]
        for nm, s in self.slots.items():
            sz[s] = int(np.prod(self.shapes[nm]))
        return [np.zeros((self.B, k)) for k in sz]

    def load(self, params: dict, own: bool = False) -> dict:
        """Copy params into the plan's slots; returns the params as views of the slots.
        own: the params are the run's own (the caller lets them go): a C-contiguous float64
        CPU tensor becomes its slot (no copy; the kernel then writes into it), unless two
        of them share memory."""
        self._slots = self._empty_slots()
        ptrs = [params[nm].untyped_storage().data_ptr() for nm in self.slots]
        own = own and len(set(ptrs)) == len(ptrs)
        for nm, s in self.slots.items():
            t = params[nm].detach()
            if (own and t.device.type == "cpu" and t.dtype == torch.float64
                    and t.is_contiguous()):
                self._slots[s] = t.reshape(self.B, -1).numpy()
            else:
                self._slots[s][:] = t.reshape(self.B, -1).cpu().numpy()
        return self.params()

    def params(self) -> dict:
        """{name: (B, ...) tensor}: views of the slots (they change as the plan runs)."""
        return {nm: torch.from_numpy(self._slots[s]).view(self.B, *self.shapes[nm])
                for nm, s in self.slots.items()}

    def _map(self, fn, *args):
        """fn(*args, b0, b1) over slices of the trials (:func:`attnsvm._parallel.thread_pool`)."""
        thread_pool(fn, self.B, *args)

    # -------------------------------------------------------------- kernels
    def evaluate(self, params: dict, need_gap: bool):
        """The scaled gradient and log(L - L*) at ``params`` (an Objective with loss and
        gap None): the fused-gradient mode."""
        from attnsvm.models.objective import Objective
        from attnsvm.optim.base import Scaled

        K = self.K
        P = self._empty_slots()
        for nm, s in self.slots.items():
            P[s][:] = params[nm].detach().reshape(self.B, -1).cpu().numpy()
        G = self._empty_slots()
        LS = np.full((self.B, 3), -np.inf)
        LG = np.full(self.B, np.nan)
        ic = self.ic.copy()
        ic[C.IC_NEEDGAP] = int(need_gap)
        ic[C.IC_RULE] = C.R_NONE
        self._map(K.grad_batch, ic, self.fc, self.X, self.Z, self.gam, self.gopt, self.yl, self.w,
                  self.mask, self.Wf, P[0], P[1], P[2], G[0], G[1], G[2], LS, LG)
        tensors = {nm: torch.from_numpy(G[s]).view(self.B, *self.shapes[nm])
                   for nm, s in self.slots.items()}
        scales = {nm: torch.from_numpy(LS[:, s].copy()) for nm, s in self.slots.items()}
        lg = torch.from_numpy(LG) if need_gap else None
        return Objective(None, None, lg, Scaled(tensors, scales))

    def run(self, t0: int, t1: int, active: np.ndarray, stop_step: np.ndarray,
            stop_code: np.ndarray, records: Records | None = None) -> None:
        """Steps t0 .. t1-1 of the rule inside the kernel, on the loaded slots; with
        ``records``, the metric records of the steps t in [t0, t1) that are multiples of
        ``records.every`` are taken inside the kernel too (:class:`Records`)."""
        P = self._slots
        if records is None:
            self._map(self.K.run_steps, self.ic, self.fc, self.X, self.Z, self.gam, self.gopt,
                      self.yl, self.w, self.mask, self.Wf, P[0], P[1], P[2], int(t0), int(t1),
                      active, stop_step, stop_code, self.capped)
            return
        r = records
        self._map(self.K.run_steps_rec, self.ic, r.icr, self.fc, self.X, self.Z, self.gam,
                  self.gopt, self.yl, self.w, self.mask, self.Wf, P[0], P[1], P[2], int(t0),
                  int(t1), int(r.every), active, stop_step, stop_code, self.capped, r.alpha,
                  r.ref, r.rc, r.values)

    def records(self, alpha, refs: dict, steps: int, every: int) -> Records:
        """The in-kernel records of a run of ``steps`` steps recording every ``every``
        (:class:`Records`)."""
        return Records(self, alpha, refs, steps, every)

    def record(self, records: Records) -> np.ndarray:
        """The metrics (B, n_metrics) at the current parameters (in the kernel)."""
        out = np.full((self.B, records.values.shape[2]), np.nan)
        P = self._slots
        self._map(self.K.record_batch, records.icr, self.X, self.Z, self.gam, self.gopt,
                  self.yl, self.w, self.mask, self.Wf, P[0], P[1], P[2], records.alpha,
                  records.ref, records.rc, out)
        return out

    def state(self, state: dict) -> dict:
        """The optimiser state after :meth:`run`: ``state`` with Polyak's count of capped
        steps (``"polyak_capped"``) from the kernel (the kernel runs stateless rules only)."""
        if "polyak_capped" not in state:
            return state
        ref = state["polyak_capped"]
        return {**state, "polyak_capped": torch.from_numpy(self.capped.copy()).to(ref.dtype)}


class Records:
    """The metric records of a fused run taken inside the kernel
    (:func:`kernels._trial_record`): the default metrics of :mod:`attnsvm.recorder`
    (loss, loss_gap, log10_gap, the model's norms, p_sel_mean / p_sel_min, p_max,
    soft_sparsity, ``corr_<ref>``), equal to the recorder's to rounding, so that a run is one
    kernel call whatever its record stride. ``values`` (B, n_records, n_metrics) holds the
    record at step r ``every`` in row r (NaN where the trial had stopped: the recorder
    fills those rows from the final record); ``names`` the recorder's column names, in its
    order; ``cols`` their columns in ``values``."""

    def __init__(self, plan: Plan, alpha, refs: dict, steps: int, every: int):
        model = plan.model
        zero = {nm: torch.zeros(1, *shp, dtype=torch.float64) for nm, shp in plan.shapes.items()}
        norms = list(model.norms(zero))
        cols = {"loss": C.M_LOSS, "loss_gap": C.M_GAP, "log10_gap": C.M_LOG10_GAP}
        known = {"norm": C.M_NORM, "norm_nuc": C.M_NORM_NUC, "norm_head": C.M_NORM_HEAD}
        for nm in norms:  # (a model with other norms is not compiled: a guard)
            cols[nm] = known[nm]
        if alpha is not None:
            cols["p_sel_mean"], cols["p_sel_min"] = C.M_PSEL_MEAN, C.M_PSEL_MIN
        cols["p_max"], cols["soft_sparsity"] = C.M_PMAX, C.M_SPARSITY
        for j, name in enumerate(refs):
            cols[f"corr_{name}"] = C.M_CORR + j
        self.names, self.cols = list(cols), list(cols.values())
        self.every = int(every)
        B, R = plan.B, plan.ic[C.IC_N] * plan.ic[C.IC_Q]
        self.icr = plan.ic.copy()
        self.icr[C.IC_NEEDGAP] = 1
        self.icr[C.IC_RULE] = C.R_NONE
        rc = np.zeros(C.RC_SIZE, dtype=np.int64)
        rc[C.RC_ALPHA], rc[C.RC_NREF], rc[C.RC_NUC] = alpha is not None, len(refs), "norm_nuc" in norms
        self.rc = rc
        if alpha is None:
            self.alpha = np.zeros((1, 1), dtype=np.int64)
        else:
            a = alpha.detach().cpu().numpy().astype(np.int64)
            self.alpha = np.ascontiguousarray(a.reshape(a.shape[0], -1))
            assert self.alpha.shape[1] == R
        item = len(model.w_shape)
        rs = [(R_.detach().cpu().numpy() if isinstance(R_, torch.Tensor) else np.asarray(R_))
              for R_ in refs.values()]
        Br = max([1] + [r.shape[0] for r in rs if r.ndim == item + 1])
        flat = [r.reshape(r.shape[0], -1) if r.ndim == item + 1 else r.reshape(1, -1) for r in rs]
        self.ref = (np.ascontiguousarray(np.concatenate(
            [np.broadcast_to(r, (Br, r.shape[1])) for r in flat], axis=1), dtype=np.float64)
            if flat else np.zeros((1, 1)))
        n_rec = max(1, -(-int(steps) // self.every))
        self.values = np.full((B, n_rec, C.M_CORR + len(refs)), np.nan)


STOP_CODES = {C.STOP_ZERO: "zero gradient", C.STOP_NONFINITE: "non-finite step",
              C.STOP_NOCHANGE: "no change in float64"}



def warmup() -> bool:
    """Compile (or load from numba's disk cache) both kernels on a tiny problem; returns
    whether numba is available. ``make install`` runs it once."""
    if not available():
        return False
    from attnsvm import data as D
    from attnsvm import models as M
    from attnsvm import optim as O
    from attnsvm.losses import get_loss
    from attnsvm.models import prepare

    model, tdata = M.WModel(3), prepare(D.random_sphere(n=2, T=3, d=3, seed=0))
    params = {"W": torch.zeros(1, 3, 3, dtype=torch.float64)}
    plan = Plan(model, tdata, get_loss("logistic"), O.ngd(0.1), 1, 1, check_stall=True)
    plan.evaluate(params, True)  # the gradient kernel (the fused-gradient mode)
    plan.load(params)
    z = np.zeros(1, dtype=np.int64)
    plan.run(0, 2, np.ones(1, dtype=np.uint8), z - 1, z.copy())  # the step kernel
    rec = plan.records(None, {}, 2, 1)  # the step kernel with its records, a record alone
    plan.run(0, 2, np.ones(1, dtype=np.uint8), z - 1, z.copy(), rec)
    plan.record(rec)
    return True
