"""Batched trainer: B independent trials in one tensor program (docs/theory.md §6-8).

    traj = train(WModel(d), data, loss="logistic", optimizer=ngd(lr=0.1), steps=1000, B=100)
    traj.metrics      tidy DataFrame, one row per (trial, step)
    traj.params       final parameters, dict of (B, ...) tensors
    traj.W            final effective W (B, d, d) [Prompt: p (B, d)] as numpy
    traj.stops        one row per trial: stop_step, stop_reason

Each step evaluates the stable objective with its gradient in scaled form
(:meth:`AttentionModel.evaluate`), so normalised rules keep an exact direction however far
the gradient has underflowed, and applies ``optimizer.update`` to the trials still
running. A trial stops, with the reason recorded, only when it must:

    "zero gradient"            the gradient is exactly 0 (every entry, in scaled form)
    "non-finite step"          the update would make a parameter NaN or inf (overflow)
    "no change in float64"     a full-batch stateless rule left every parameter bit-identical
                               (the step is below the resolution of W: the run cannot move)

A stopped trial's parameters and optimiser state are frozen; the run ends when every
trial has stopped.

Engines (``engine=``): "torch" is the batched tensor program above (the reference);
"fused" runs each trial's steps in one compiled loop with its data in cache
(:mod:`attnsvm.fused`, numba; on CUDA one GPU thread per trial, :mod:`attnsvm.fused.cuda`):
the same scaled maths, equal to the torch path to rounding; "auto" (default) takes
"fused" when numba (numba-cuda on CUDA) is importable and the configuration is
supported, else "torch". ``traj.extra["engine"]`` says which ran ("torch", "fused",
"fused-cuda", or "fused-gradient": the compiled gradient with the rule's update in
torch) and ``traj.extra["engine_reason"]`` why it is not the whole compiled loop (None
when it is): the configuration (:func:`attnsvm.fused.unsupported`) or the rule, since the
kernel's step loops are a closed set (:data:`attnsvm.fused.PROGRAMS`,
:func:`attnsvm.fused.not_compiled`): e.g. ``normalize_by(l1)`` then a learning rate, whose
parts each carry a kernel, is no loop of it.
``chunk=c`` trains the trials c at a time (memory bounded by the chunk; the result is
the same as one run: trials are independent).

Models: every :class:`~attnsvm.models.AttentionModel` and the next-token-prediction
:class:`~attnsvm.ntp.NTPModel` run through the same pipeline (the model protocol below).

``train`` is a short pipeline: the arguments against ``TRAIN_CONSTRAINTS`` and against
what the model can honour (:func:`_check_model_args`), then against the data and the
memory; the initial parameters; chunks (:func:`_train_chunked`, a wrapper that
calls ``train`` on each chunk of trials); then the run (:func:`_train_one`): one engine's :class:`~attnsvm.steppers.Stepper`
(:func:`~attnsvm.steppers.make_stepper`) run in segments between records
(:func:`~attnsvm.steppers.run_segments`; the fused engine in one segment, its records
taken inside the kernel: :class:`attnsvm.fused.Records`), the stops kept by
:class:`~attnsvm.steppers.Stops` and the metrics by :class:`~attnsvm.recorder.Recorder`.

The model protocol (what the trainer, steppers, recorder and engines read; no model is
recognised by its class): ``d``, ``param_shapes()``, ``init(B, seed=, scale=, kind=,
device=, dtype=)``, ``default_scale`` (the init's norm when ``scale`` is None),
``prepare(data, device, dtype)`` (the data tensors: X (Bx, n, T, d), ...),
``queries_per_sequence(tdata)`` (Q), ``W(params)``, ``w_shape`` (a reference's shape),
``finite(params)``, ``norms(params)``, ``_logits(params, tdata)`` (B, n, Q, T),
``evaluate(params, tdata, loss, grad=, autograd=, need_gap=, logits=)`` (L, gap, log gap,
scaled gradient), ``head`` ("linear": the closed-form start is reused), ``train_fixed``
({argument: the only value the model accepts}: refused by name otherwise) and
``has_kernel`` / ``kernel_inputs(tdata, Q)`` (the fused engine's arrays,
:mod:`attnsvm.fused`); where the data hold a head ``v``, ``_gamma(tdata, Q)`` (the selected
tokens alpha = argmax gamma), and with an ``alpha`` given, ``_key_mask(tdata)``.
docs/extending.md ("A model for the trainer") writes a model from this list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ._validation import (
    INT64_MAX,
    InstanceOf,
    Interval,
    Options,
    Satisfies,
    check_memory,
    check_param,
    validate_params,
)
from .fused import ENGINES
from .models import AttentionModel
from .models import objective as O
from .optim import Optimizer, ngd
from .recorder import LN10, Recorder  # noqa: F401  (LN10: re-exported)
from .steppers import (
    Stops,
    evaluate_rows,
    make_stepper,
    minibatch,
    row_chunks,
    row_data,
    rows_apply,
    run_segments,
    select_engine,
)

__all__ = ["train", "Trajectory", "minibatch", "default_record_every", "STOP_REASONS", "ENGINES",
           "train_memory"]

STOP_REASONS = ("zero gradient", "non-finite step", "no change in float64")


@dataclass
class Trajectory:
    """Result of ``train``.

    params: final parameters {name: (B, ...) tensor}; metrics: DataFrame with columns
    trial, step, loss, loss_gap, log10_gap, norm [, norm_nuc, norm_head], p_sel_mean,
    p_sel_min, p_max, soft_sparsity, ``corr_<ref>``..., stopped; W: final model.W(params) as
    numpy; param_history: {name: (n_records, B, ...)} if ``record_params``; record_steps:
    (n_records,) steps at which metrics were recorded; steps_run: steps executed;
    stop_step: (B,) step at which each trial stopped (-1: still running at the end);
    stop_reason: (B,) why ("" while running; see ``STOP_REASONS``); state: the final
    optimiser state. ``outcome()`` judges the run (GMM / LMM / other / not saturated,
    :func:`attnsvm.tokens.outcome`); the repr ends with its one-line summary.
    """

    params: dict
    metrics: pd.DataFrame
    W: np.ndarray
    steps_run: int
    record_steps: np.ndarray
    stop_step: np.ndarray
    param_history: dict | None = None
    alpha: np.ndarray | None = None
    stop_reason: np.ndarray | None = None
    state: dict | None = None
    extra: dict = field(default_factory=dict)
    #: (model, prepared data, optimizer) of the run, for :meth:`outcome` (set by ``train``)
    source: tuple | None = field(default=None, repr=False, compare=False)
    _outcome: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def stopped(self) -> np.ndarray:
        """(B,) bool: the trials that stopped before the last step (``stop_step >= 0``)."""
        return self.stop_step >= 0

    def outcome(self, norm=None) -> pd.DataFrame:
        """Per-trial verdict of the run, :func:`attnsvm.tokens.outcome` on the final W:
        "GMM" / "LMM" / "other" / "not saturated", with corr_gmm, corr_lmm (the SVM of the
        tokens each trial reached), ... in ``norm`` (default: the run's geometry,
        :func:`attnsvm.tokens.run_geometry`). Computed once (default norm) and kept.
        Raises ValueError when the run cannot be judged (seq-to-seq / causal queries, a
        trained or nonlinear head, data without v, or a Trajectory not made by ``train``)."""
        from .tokens import run_outcome

        if self.source is None:
            raise ValueError("this Trajectory does not hold its model and data (made by train())")
        if norm is None and self._outcome is not None:
            return self._outcome[0]
        model, data, optimizer = self.source
        df, name = run_outcome(model, data, self.W, optimizer=optimizer, norm=norm)
        if norm is None:
            self._outcome = (df, name)
        return df

    def outcome_line(self) -> str:
        """:func:`attnsvm.tokens.outcome_line` of :meth:`outcome`, or why there is none."""
        from .tokens import outcome_line

        try:
            df = self.outcome()
        except ValueError as exc:
            return f"outcome: not judged ({exc})"
        return outcome_line(df, self._outcome[1])

    def plot(self, y: str, x: str = "step", ax=None, **kw):
        """Median over trials of a metric (band: 10-90%) against ``x``; returns the Figure
        (see :func:`attnsvm.plotting.metric`)."""
        from .plotting import metric

        return metric(self.metrics, y, x, ax=ax, **kw)

    @property
    def stops(self) -> pd.DataFrame:
        """One row per trial: trial, stop_step (-1: ran to the end), stop_reason."""
        reason = self.stop_reason if self.stop_reason is not None else np.full(len(self.stop_step), "")
        return pd.DataFrame({"trial": np.arange(len(self.stop_step)), "stop_step": self.stop_step,
                             "stop_reason": reason})

    def __repr__(self) -> str:
        B = len(self.stop_step)
        n_stop = int(self.stopped.sum())
        why = ""
        if n_stop and self.stop_reason is not None:
            r, c = np.unique(self.stop_reason[self.stopped], return_counts=True)
            why = " (" + ", ".join(f"{ci} {ri}" for ri, ci in zip(r, c)) + ")"
        cols = [c for c in self.metrics.columns if c not in ("trial", "step", "stopped")]
        line = f"\n  {self.outcome_line()}" if self.source is not None else ""
        return (f"Trajectory(B={B}, steps_run={self.steps_run}, records={len(self.record_steps)}, "
                f"stopped={n_stop}/{B}{why}, metrics={cols}){line}")


# ------------------------------------------------------------------ validation
def _check_device(device):
    """``device`` as a torch.device that exists here and that attnsvm trains on (cpu, cuda,
    mps); a ValueError naming it otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device {device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1')") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} is not available: torch.cuda.is_available() is "
                             "False (use device='cpu')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA "
                             "device(s) visible")
    elif dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"device {device!r} is not available (use device='cpu')")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r}: attnsvm trains on 'cpu', 'cuda' or 'mps'; a "
                         f"{dev.type!r} device holds no values to train")
    return dev


def _check_loss(loss):
    from .losses import LOSSES, get_loss
    from .optim import get as get_optimizer

    if isinstance(loss, str) and loss not in LOSSES and _is_rule(loss, get_optimizer):
        raise ValueError(f"loss={loss!r} is a step rule, not a loss: pass it as "
                         f"optimizer={loss!r} (train's third positional argument is the loss)")
    return loss if loss is None else get_loss(loss)


def _is_rule(name: str, get_optimizer) -> bool:
    """Whether ``name`` names a registered step rule (a rule passed in the loss slot)."""
    try:
        get_optimizer(name)
    except (ValueError, TypeError):
        return False
    return True


def _check_model(model):
    need = ("param_shapes", "init", "prepare", "evaluate", "W", "finite", "norms", "_logits",
            "queries_per_sequence")
    missing = [a for a in need if not callable(getattr(model, a, None))]
    if missing:
        raise ValueError(f"model must be an attnsvm model (WModel, KQModel, DiagModel, "
                         f"PromptModel, ntp.NTPModel: the model protocol of attnsvm.train); "
                         f"got a {type(model).__name__} without {', '.join(missing)}")
    return model


def _check_optimizer(optimizer):
    from .optim import get as get_optimizer

    return ngd(0.1) if optimizer is None else get_optimizer(optimizer)


_BOOL = [InstanceOf((bool, np.bool_), "True or False")]

#: train()'s arguments: what each may be (attnsvm._validation; the first constraint a value
#: meets normalises it). Checks against the data and between arguments: _check_against_data.
def _check_metrics(metrics) -> list:
    """``metrics`` as a list of objects with ``bind`` and ``take`` (train's docstring)."""
    ok = isinstance(metrics, (list, tuple)) and all(
        callable(getattr(m, "bind", None)) and callable(getattr(m, "take", None)) for m in metrics)
    if not ok:
        raise ValueError(f"metrics must be a list of metrics (objects with bind and take, e.g. "
                         f"attnsvm.generalisation.Generalisation); got {metrics!r}")
    return list(metrics)


TRAIN_CONSTRAINTS = {
    "model": [InstanceOf(AttentionModel), Satisfies(_check_model, "an attnsvm model")],
    "loss": [None, Satisfies(_check_loss, "a loss name, a Loss or a callable")],
    "optimizer": [Satisfies(_check_optimizer, "an Optimizer or a registered rule name")],
    "steps": [Interval(int, 0, None)],
    "B": [None, Interval(int, 1, None)],
    "seed": [Interval(int, 0, INT64_MAX)],
    "init": [InstanceOf(str, "an init kind (a str)"), InstanceOf(dict, "a dict of arrays")],
    "scale": [None, Interval(float, 0, None, closed="neither")],
    "record_every": [None, Interval(int, 1, None)],
    "references": [None, InstanceOf(dict)],
    "record_params": _BOOL,
    "progress": _BOOL,
    "device": [None, Satisfies(_check_device, "a torch device")],
    "dtype": [Options(torch.float16, torch.float32, torch.float64,
                      what="a real floating dtype: torch.float16, torch.float32 or torch.float64")],
    "batch_size": [None, Interval(int, 1, None)],
    "autograd": _BOOL,
    "engine": [Options(*ENGINES)],
    "chunk": [None, Interval(int, 1, None)],
    "metrics": [None, Satisfies(_check_metrics, "a list of metrics (objects with bind and "
                                "take, e.g. attnsvm.generalisation.Generalisation)")],
}

def _check_fixed(model, args: dict) -> None:
    """Refuse, by name, an argument the model cannot honour: ``model.train_fixed`` maps
    each to the only value it accepts (e.g. an NTP model: its own loss, full batch).
    Checked first, on the values as given (an NTP model's loss is refused as a loss it
    cannot take, whatever it names)."""
    for name, only in getattr(model, "train_fixed", {}).items():
        value = args[name]
        if value is None and only is None:
            continue
        if only is None or value is not only and value != only:
            what = "left out" if only is None else f"{only!r}"
            from .optim import get as get_optimizer

            rule = (f"; {value!r} is a step rule: pass optimizer={value!r}"
                    if name == "loss" and isinstance(value, str) and _is_rule(value, get_optimizer)
                    else "")
            raise ValueError(f"{name}={_short(value)}: {type(model).__name__} cannot honour it "
                             f"(train's {name} must be {what} for this model){rule}")


def _check_model_args(model, args: dict) -> None:
    """The checks between the model and the validated arguments: a stochastic rule for a
    full-batch model, the fused engine for a model without a kernel."""
    bs = getattr(args["optimizer"], "batch_size", None)
    if bs is not None and "batch_size" in getattr(model, "train_fixed", {}):
        raise ValueError(f"optimizer={args['optimizer']!r}: a stochastic rule (batch_size={bs}); "
                         f"{type(model).__name__} trains full-batch")
    if args["engine"] == "fused" and not getattr(model, "has_kernel", False):
        raise ValueError(f"engine='fused': {type(model).__name__} has no compiled kernel; use "
                         "engine='torch' or 'auto'")


def _short(value) -> str:
    text = repr(value) if not hasattr(value, "shape") else f"an array of shape {tuple(value.shape)}"
    return text if len(text) <= 60 else text[:57] + "..."


#: the peak of a run above its data, in copies of the parameters, by engine: measured
#: (benchmarks/bench_torch_engine.py --mem --mem-runs 5 --mem-models W KQ: B = 2e3 and
#: 2e4, d = 32, NGD, fresh processes; tests/test_train_memory.py holds the prediction
#: above a measured peak and within 2.5x of it). "torch": the parameters before the step
#: (kept for the undo check), the parameters, the gradient (NGD's direction and the new
#: parameters are written into it), with the allocator's slack; "torch-rows": the torch
#: engine's full-batch closed-form step in row chunks of trials (attnsvm.steppers.
#: evaluate_rows, from 2 CHUNK_MIN_BYTES of parameters): the parameters and the gradient
#: (written into the previous parameters' buffers once each chunk's undo check has read
#: them), a chunk's temporaries and glibc's heap (profiled, KQ at B = 2e4, d = 32: the
#: bytes torch holds peak at 2.36 P, the parameters, the start's gradient, a chunk's G,
#: gradients and ridge terms (0.25 P) and the data's caches; the resident peak adds the
#: heap glibc keeps: 1.39-1.47 (X + P) = 2.43-2.57 P over 5 fresh processes, with the
#: 24 logits-sized terms below: predicted 2.07 (X + P)); "fused": the
#: run's initial parameters, which become the kernel's slots (no copy; the start's
#: gradient is checked a row chunk at a time, not kept), and the start's row chunks'
#: temporaries with the heap glibc keeps of them (measured up to 1.19 copies above the
#: logits-sized terms and the returned W (KQ, B = 2e4, d = 32, 5 fresh processes));
#: "fused-cuda": the initial parameters, the kernel's trial-minor copy and its workspace
#: (not measured on a GPU: the earlier three copies kept). Optimiser state comes on top.
_PARAM_COPIES = {"torch": 4, "torch-rows": 2.5, "fused": 1.5, "fused-cuda": 3}
#: the memory model of each engine that runs (attnsvm.steppers.select_engine): the fused
#: gradient updates in torch (without row chunks)
_MEMORY_MODEL = {"torch": "torch", "fused-gradient": "torch", "fused": "fused",
                 "fused-cuda": "fused-cuda"}
#: (B, n, Q, T) temporaries of the objective (logits, softmax terms, dL/da, the gaps) with
#: the allocator's slack, by memory model: measured. The torch engine: bench_torch_engine.py
#: --mem 20000 --mem-runs 5 --mem-models Prompt: up to 0.551 (X + P), 15.3 of these besides
#: 4 P (the 12 assumed before let it through); its factorised models (KQ, Diag) also form W
#: itself in their finiteness checks, one (B, d, d) more (tests/test_train_memory.py, Diag,
#: B = 5000, d = 32: 30.6-34.1 P measured, 29.0 P predicted before). The fused engine:
#: those its run holds for all B trials, the scores gamma (AttentionModel._gamma,
#: attnsvm/models/base.py, cached in the data by train._alpha_tensor; formed from v^T x_it,
#: attnsvm/scores.py) and their copy with masked keys at 0 (AttentionModel._consts, the
#: objective's cache), and the start's logits (a0 of _train_one, this file, by
#: AttentionModel._logits): 3 (12 before 2026-11-28). Measured (2026-11-28, the
#: resident peak's steps traced line by line, B = 2e4, d = 32): they are formed in the
#: pages of gamma's v copy (_SCORE_COPIES) once it is let go, and the start's row chunk
#: (its _OBJECTIVE_ROWS logits-sized and _QUERY_COPIES query-sized temporaries for an
#: eighth of the trials, or 8 MiB at most) in those of the W z_iq (_WZ_COPIES): the peak
#: is Prompt 13.5-13.6 P = 433 (per trial, units of 8 bytes) = gamma's v copy 192 and its
#: v^T x 48, then W z_iq 192; Diag 22.4-23.2 P = 1435-1482 = the same 432 (W z_iq: 144
#: new), the parameters 64 and the returned W 1024. 3, not 2: the logits-sized arrays
#: fit in the v copy's pages only while 3 n Q T + n Q + P <= n d (Prompt at d = 32: 182
#: <= 192); an upper bound counts them. Re-measured (5 fresh processes each,
#: B = 2e4, d = 32, units X + P, predicted in brackets): Prompt ("torch", one chunk)
#: 0.37-0.61 [0.69; 0.57 with 16, let 0.61 through]; "torch-rows" (its heap slack: W
#: 0.91-1.33 [1.45], KQ 1.39-1.47 [2.07], Diag 0.93-1.22 [1.78])
_ROW_COPIES = {"torch": 20, "torch-rows": 24, "fused": 3, "fused-cuda": 12}
#: (B, n, Q, d) arrays of all B trials at once, by memory model: the start's logits
#: (train._train_one's a0, every engine) are formed from the vectors W z_iq of every trial
#: and query (Model._wz, attnsvm/models/params.py; Prompt's p (B, d) is broadcast over the
#: n sequences by the product, _token_product in attnsvm/models/base.py: a (B, n, 1, d)
#: copy, n = 6 times its parameters). The fused engine: one (its
#: peak is that product's: tests/test_train_memory.py, Prompt, B = 5000, d = 32: 7.8-8.8 P
#: measured, 12.1-12.2 P with glibc's mmap threshold pinned (the bytes held: the
#: parameters, gamma, a0, the copy and the product's own workspace), 18 P predicted
#: with _SCORE_COPIES; at B = 2e4 the peak is this copy's, 13.5-13.6 P);
#: the torch engine's are among its measured logits-sized copies (none here);
#: "fused-cuda" as "fused" (not measured on a GPU)
_WZ_COPIES = {"torch": 0, "torch-rows": 0, "fused": 1, "fused-cuda": 1}
#: (Bx, n, d) arrays of the data's Bx datasets, by memory model, where the data have a head
#: v (the scores gamma are formed): attnsvm.scores.scores forms v^T x_it as X (Bx, n, T, d)
#: @ v[..., None, :, None], which torch.matmul computes by broadcasting v over the n
#: sequences into a (Bx, n, d, 1) copy (let go at once, but its pages stay with glibc's
#: heap where it is below the mmap threshold: 30.7 MB at Bx = 2e4, d = 32, the dynamic
#: threshold's 32 MiB cap); train._alpha_tensor forms gamma (AttentionModel._gamma, cached)
#: before the parameters. The fused engine: one (measured: the first step of its peak,
#: 3.75 P of Diag's 22.4 P at B = 2e4; the bytes the start's logits-sized arrays are then
#: formed in); the torch engine's are among its measured logits-sized copies (none here);
#: "fused-cuda" as "fused" (not measured on a GPU). Counted per dataset, not per trial
#: running: data shared by the trials (Bx = 1) make one (n, d). At B = 5000 the same
#: arrays (7.7 MB) fall in the heap a fresh process keeps from building its data: the
#: measured peak is lower there (Prompt 7.7-14.9 P against 18 P predicted)
_SCORE_COPIES = {"torch": 0, "torch-rows": 0, "fused": 1, "fused-cuda": 1}
#: copies of one trial's W (model.w_shape) that the step forms for each trial of its
#: batch, besides the returned W, by memory model: the torch engine's checks form W of a
#: factorised model (Model.finite; DiagModel its diagonal only) and its records the
#: norms of W, both one row chunk at a time ("torch-rows": the largest chunk's trials);
#: the fused engines check and record W inside the kernel (none)
_W_COPIES = {"torch": 1, "torch-rows": 1, "fused": 0, "fused-cuda": 0}
#: (B, n, Q, d) temporaries of the objective (W z_iq and sum_t dL/da_iqt x_it) and
#: (B, n, Q, T) ones (logits, softmax terms, dL/da, the gaps) per trial: the size of the
#: fused start's row chunks (train._train_one)
_QUERY_COPIES = 2
_OBJECTIVE_ROWS = 12


def train_memory(model, tdata, B: int, chunk: int | None = None, engine: str = "torch",
                 dtype=torch.float64, rows: bool | None = None) -> float:
    """The bytes a run of ``train`` needs above its data (the pre-run memory check's
    model): per trial running at once (``chunk``), ``_PARAM_COPIES[engine]`` copies of
    the parameters, ``_ROW_COPIES[engine]`` of the logits (B, n, Q, T),
    ``_WZ_COPIES[engine]`` of the vectors W z_iq (B, n, Q, d) and, for a
    factorised model, ``_W_COPIES[engine]`` of W for the trials of a row chunk (the torch
    engine's checks and records form it); with chunks, the
    initial parameters of all B trials on top; for a factorised model (W a product of the parameters: KQ, Diag), the
    returned W (B, *w_shape) of all B trials; where the data have a head v,
    ``_SCORE_COPIES[engine]`` (Bx, n, d) copies of it (the scores' product, per
    dataset). engine: the one that runs
    (:func:`attnsvm.steppers.select_engine`: "torch", "fused-gradient", "fused",
    "fused-cuda").
    rows: the torch engine evaluates in row chunks of trials ("torch-rows"); None: as
    a full-batch closed-form run does (:func:`attnsvm.steppers.row_chunks`)."""
    P = sum(math.prod(s) for s in model.param_shapes().values())
    _, n, T, d = tdata["X"].shape
    Q = model.queries_per_sequence(tdata)
    run = min(B, chunk or B)
    item = torch.empty((), dtype=dtype).element_size()
    mem = _MEMORY_MODEL[engine]
    share = 1.0  # the share of the trials whose temporaries are held at once
    if engine == "torch" and rows is not False:
        chunks = row_chunks({"p": torch.empty((run, P), dtype=dtype, device="meta")})
        if len(chunks) > 1 and rows_apply(model):
            mem, share = "torch-rows", max(b - a for a, b in chunks) / run
    Wout = math.prod(model.w_shape) if getattr(model, "factorised", False) else 0
    Wstep = _W_COPIES[mem] * share * Wout
    step = item * run * (_PARAM_COPIES[mem] * P + _ROW_COPIES[mem] * n * Q * T
                         + _WZ_COPIES[mem] * n * Q * d + Wstep)
    score = _SCORE_COPIES[mem] * tdata["X"].shape[0] * n * d if tdata.get("v") is not None else 0
    return step + item * (B * Wout + score) + (item * B * P if run < B else 0.0)


def _check_against_data(model, tdata, B, init, batch_size, optimizer, seed):
    """The checks that relate arguments to each other and to the data: d, the number of
    trials B (returned, resolved), the mini-batch size (returned) and the trials' seeds."""
    if tdata["X"].shape[-1] != model.d:
        raise ValueError(f"the model has d = {model.d} but the data has d = {tdata['X'].shape[-1]}")
    Bx = tdata["X"].shape[0]
    if B is None:
        B = Bx if not isinstance(init, dict) else _dict_batch(init, model, Bx)
        B = check_param("B", B, TRAIN_CONSTRAINTS["B"][1:])
    if Bx != 1 and B != Bx:
        raise ValueError(f"data holds B = {Bx} datasets but B = {B} trials were requested")
    if seed + B - 1 > INT64_MAX:
        raise ValueError(f"seed must be an integer in [0, 2**63 - B] for B = {B} trials (trial "
                         f"b draws its mini-batches with seed + b, an int64); got {seed}")
    n = tdata["X"].shape[1]
    bs = batch_size if batch_size is not None else optimizer.batch_size
    if bs is not None:
        bs = check_param("batch_size", bs, TRAIN_CONSTRAINTS["batch_size"][1:])
        if bs > n:
            raise ValueError(f"batch_size must be in [1, n = {n}]; got {bs}")
    return B, bs


def _check_train_memory(model, tdata, B, chunk, dtype, device, engine, rows=None):
    """Refuse, before the first allocation, a run that cannot fit: :func:`train_memory`
    (measured copies of the parameters and logits per trial running at once, the initial
    parameters of all B trials with chunks)."""
    P = sum(math.prod(s) for s in model.param_shapes().values())
    need = train_memory(model, tdata, B, chunk, engine, dtype, rows)
    check_memory(need, f"train({type(model).__name__}(d={model.d}), B={B}"
                       + (f", chunk={chunk}" if chunk else "") + f") with {P:,} parameters "
                       "per trial", "use a smaller model, fewer trials, or chunk= to train "
                       "fewer at a time", device)


def _init_params(model, init, B, seed, scale, device, dtype):
    """The initial parameters {name: (B, ...)}. A dict's arrays are validated, not copied:
    they may share memory with the caller's (``train`` copies them unless the fused kernel,
    which copies them into its own slots, runs)."""
    if isinstance(init, str):
        return model.init(B, seed=seed, scale=scale, kind=init, device=device, dtype=dtype)
    if not isinstance(init, dict):
        raise ValueError(f"init must be a kind {('random', 'zero', 'balanced', 'unbalanced')} or a dict")
    shapes = model.param_shapes()
    if set(init) != set(shapes):
        raise ValueError(f"init must have the keys {sorted(shapes)}; got {sorted(init)}")
    out = {}
    for k, shp in shapes.items():
        v = init[k]
        try:
            t = torch.as_tensor(v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else
                                np.asarray(v, dtype=np.float64))
        except (TypeError, ValueError):
            raise ValueError(f"init[{k!r}] must be a numeric array of shape {shp} or (B, *{shp})") from None
        t = t.to(device=device, dtype=dtype)
        if tuple(t.shape) == shp:
            t = t.expand(B, *shp).clone()
        if tuple(t.shape) != (B, *shp):
            raise ValueError(f"init[{k!r}] must have shape {shp} or {(B, *shp)}; got {tuple(t.shape)}")
        if not _all_finite(t):
            raise ValueError(f"init[{k!r}] contains NaN or inf")
        out[k] = t
    return out


def _dict_batch(init, model, Bx):
    shapes = model.param_shapes()
    for k, shp in shapes.items():
        if k in init and np.ndim(init[k]) == len(shp) + 1:
            return int(np.shape(init[k])[0])
    return Bx


def _alpha_tensor(model, tdata, alpha, Q, B):
    """Selected tokens as a (Bx, n, Q) long tensor, or None (no v and no alpha)."""
    if alpha is None:
        if tdata.get("v") is None:
            return None
        return model._gamma(tdata, Q).argmax(-1)
    a0 = np.asarray(alpha)
    if a0.dtype == bool or not np.issubdtype(a0.dtype, np.integer):
        raise ValueError(f"alpha must hold integer token indices; got dtype {a0.dtype}")
    a = torch.as_tensor(a0, dtype=torch.long, device=tdata["X"].device)
    n = tdata["X"].shape[1]
    if a.ndim >= 1 and a.shape[-1] == n and Q == 1:
        a = a[..., None]
    if a.ndim == 2:
        a = a[None]
    T = tdata["X"].shape[2]
    if a.ndim != 3 or a.shape[1:] != (n, Q) or a.shape[0] not in (1, B):
        raise ValueError(f"alpha must have shape (n,) = ({n},) or (B, n) = ({B}, {n}) "
                         f"[seq2seq (n, T)]; got {tuple(np.shape(alpha))}")
    if bool(((a < 0) | (a >= T)).any()):
        raise ValueError(f"alpha must hold token indices in [0, T = {T}); got {a0.tolist()}")
    m = model._key_mask(tdata)
    if m is not None:
        mm = m if m.ndim == 4 else m[None, None].expand(1, n, Q, T)
        ok = mm.expand(max(mm.shape[0], a.shape[0]), n, Q, T).gather(
            -1, a.expand(max(mm.shape[0], a.shape[0]), n, Q)[..., None])
        if not bool(ok.all()):
            raise ValueError("alpha selects a masked (padding or causal-future) token")
    return a


def _check_refs(model, refs, B, dtype, device):
    out = {}
    shp = tuple(model.w_shape)
    for name, R in (refs or {}).items():
        try:
            r = np.asarray(R.detach().cpu().numpy() if isinstance(R, torch.Tensor) else R,
                           dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"references[{name!r}] must be a numeric array of shape {shp}") from None
        if r.shape not in (shp, (B, *shp)):
            raise ValueError(f"references[{name!r}] must have shape {shp} or {(B, *shp)}; "
                             f"got {r.shape}")
        if not np.all(np.isfinite(r)):
            raise ValueError(f"references[{name!r}] contains NaN or inf")
        out[name] = torch.as_tensor(r, device=device, dtype=dtype)
    return out


def _check_start(a0, first, tdata, grads_finite: bool | None = None) -> None:
    """The objective at the initial parameters is finite: logits (-inf allowed: masked
    keys), losses and gradients (``grads_finite``: checked already, row chunk by row chunk,
    where ``first`` keeps none); else a ValueError saying the data overflow float64."""
    if grads_finite is None:
        grads_finite = _grads_finite(first.grads.tensors)
    if (not bool((torch.isnan(a0) | torch.isposinf(a0)).any())
            and bool(torch.isfinite(first.loss).all()) and grads_finite):
        return
    big = float(tdata["X"].abs().max())
    raise ValueError(f"the objective is not finite at the start (max |X| = {big:.3g}): the "
                     "data overflow float64 in the logits or the gradient; rescale X (and z): "
                     "the max-margin direction does not depend on the scale of the tokens")


def _grads_finite(tensors: dict) -> bool:
    """Every gradient tensor is finite (:func:`_all_finite`)."""
    return all(_all_finite(t) for t in tensors.values())


def _all_finite(t: torch.Tensor) -> bool:
    """Every entry of t is finite (no NaN, no inf): its min and max are, in one pass
    without a temporary (min and max propagate NaN)."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def _train_chunked(model, tdata, params, chunk, k, alpha_t, refs, seed, kw,
                   metrics=None) -> Trajectory:
    """``train`` of B trials, ``chunk`` at a time, assembled into one Trajectory equal to
    the unchunked run: each chunk starts from its slice of the initial parameters (drawn
    for all B trials at once, as without chunks), trial b keeps its mini-batch seed
    seed + b, and a chunk that ended early (all its trials stopped) contributes its final,
    frozen record at the later record steps of the run."""
    B = next(iter(params.values())).shape[0]
    parts = []
    for a in range(0, B, chunk):
        b = min(B, a + chunk)
        sub = {kk: (None if v is None or kk.startswith("_") else
                    (v[a:b] if v.shape[0] == B and B > 1 else v))
               for kk, v in tdata.items()}
        sub = {kk: v for kk, v in sub.items() if not kk.startswith("_")}
        al = None
        if alpha_t is not None:  # (Bx, n, Q) -> the chunk's rows, in a shape train reads back
            al = alpha_t[a:b] if alpha_t.shape[0] == B else alpha_t
            al = al.cpu().numpy()
            al = al[..., 0] if al.shape[-1] == 1 else al
        item = len(model.w_shape)
        rf = {nm: (R[a:b] if R.ndim == item + 1 else R) for nm, R in refs.items()}
        ms = [m.take(a, b, B) for m in metrics] if metrics else None
        parts.append(train(model, sub, init={kk: v[a:b] for kk, v in params.items()}, B=b - a,
                           seed=seed + a, record_every=k, alpha=al, references=rf or None,
                           metrics=ms, **kw))
    steps_run = max(p.steps_run for p in parts)
    rec = sorted({t for t in range(0, steps_run, k)} | {steps_run})
    frames, hist = [], {}
    for a, p in zip(range(0, B, chunk), parts):
        m = p.metrics
        own = set(p.record_steps.tolist())
        last = int(p.record_steps[-1])
        take = [t if t in own and (t < p.steps_run or t == last) else last for t in rec]
        pos = {t: i for i, t in enumerate(p.record_steps.tolist())}
        R = len(p.record_steps)
        idx = np.asarray([pos[t] for t in take])
        nb = len(p.stop_step)
        rows = (np.arange(nb)[:, None] * R + idx[None, :]).reshape(-1)
        f = m.iloc[rows].reset_index(drop=True)
        f["step"] = np.tile(np.asarray(rec), nb)
        f["trial"] = f["trial"] + a
        # stopped as the unchunked run records it: at the start of step t, or at its end
        ss = np.repeat(p.stop_step, len(rec))
        tt = f["step"].to_numpy()
        f["stopped"] = (ss >= 0) & ((ss < tt) | (tt == steps_run))
        frames.append(f)
        if p.param_history is not None:
            for kk, h in p.param_history.items():
                hist.setdefault(kk, []).append(h[idx])
    state = None
    if parts[0].state:
        state = {kk: torch.cat([p.state[kk] for p in parts]) for kk in parts[0].state}
    engines = sorted({p.extra.get("engine", "torch") for p in parts})
    reasons = sorted({p.extra.get("engine_reason") for p in parts} - {None})
    recs = sorted({p.extra["records"] for p in parts if "records" in p.extra})
    return Trajectory(
        params={kk: torch.cat([p.params[kk] for p in parts]) for kk in parts[0].params},
        metrics=pd.concat(frames, ignore_index=True),
        W=np.concatenate([p.W for p in parts]),
        steps_run=steps_run,
        record_steps=np.asarray(rec),
        stop_step=np.concatenate([p.stop_step for p in parts]),
        param_history={kk: np.concatenate(v, axis=1) for kk, v in hist.items()} or None,
        alpha=None if alpha_t is None else alpha_t.cpu().numpy(),
        stop_reason=np.concatenate([p.stop_reason for p in parts]),
        state=state,
        extra={"engine": "+".join(engines), "engine_reason": "; ".join(reasons) or None,
               "chunks": len(parts), **({"records": "+".join(recs)} if recs else {})},
    )


def _train_one(model, tdata, lossf, optimizer, params, engine, *, steps, every, Q, batch_size,
               seed, autograd, alpha_t, refs, record_params, progress, copy,
               metrics=()) -> Trajectory:
    """The run of checked arguments: the objective at the start (checked finite), the
    engine's stepper, run in segments of ``every`` steps with its stops and its recorder,
    assembled into a Trajectory. ``copy``: the initial parameters may be the caller's."""
    B = next(iter(params.values())).shape[0]
    a0 = model._logits(params, tdata)
    rows = row_chunks(params)
    # the compiled loop computes its own gradients: the start's is checked, not kept, a
    # row chunk's at a time; with its records in the kernel (the start's values unused: the
    # torch recorder's step 0 takes them, in the chunks it always had), the chunks sized
    # by the objective's temporaries too (memory: train_memory's "fused"; they are many
    # times the parameters of Diag and Prompt)
    kept = select_engine(model, tdata, lossf, optimizer, engine, batch_size=batch_size,
                         autograd=autograd)[0] not in ("fused", "fused-cuda")
    if not kept and not record_params and not metrics:
        n, T, d = tdata["X"].shape[1:]
        rows = row_chunks({**params, "": torch.empty(
            (B, _QUERY_COPIES * n * Q * d + _OBJECTIVE_ROWS * n * Q * T), device="meta",
            dtype=a0.dtype)})
    finite = []
    if len(rows) > 1 and not autograd and rows_apply(model):  # temporaries: one chunk's
        first = evaluate_rows(model, lambda: params, row_data(tdata, rows), rows, lossf,
                              logits=a0, grads=kept, each=None if kept else lambda a, b, g:
                              finite.append(_grads_finite(g.tensors)))[0]
    else:
        first = model.evaluate(params, tdata, lossf, grad=True, autograd=autograd, logits=a0)
    _check_start(a0, first, tdata, all(finite) if finite else None)
    if not kept:
        first = O.Objective(first.loss, first.gap, first.log_gap, None)
    stepper = make_stepper(model, tdata, lossf, optimizer, engine, first=first, Q=Q, B=B,
                           batch_size=batch_size, seed=seed, autograd=autograd, copy=copy)
    stops = Stops(B, tdata["X"].device)
    # the record at step 0 reuses the initial logits, and the closed form's L and gaps
    # (those of grad=False; the autograd paths compute them another way; not its gradient)
    ev0 = (O.Objective(first.loss, first.gap, first.log_gap, None)
           if not autograd and model.head == "linear" else None)
    recorder = Recorder(model, tdata, lossf, alpha_t, refs, Q, record_params, start=(a0, ev0),
                        metrics=metrics)
    del a0, first, ev0  # held by the stepper / recorder only until they have used them (memory)
    stepper.init(params)
    # the stepper holds its own dict (the fused slots: a copy): the initial tensors are let
    # go with the first step (train's own dict, made by _init_params: never the caller's)
    params.clear()
    extra = {"engine": stepper.engine, "engine_reason": stepper.reason}
    if stepper.engine == "fused":
        # the records inside the kernel: the run is one segment (a progress bar: one per
        # record stride), unless the recorder must keep the parameters of every record
        if record_params:
            extra["records"] = "segments (record_params=True: the recorder keeps the parameters)"
        elif metrics:
            extra["records"] = "segments (further metrics are computed in torch at each record)"
        else:
            stepper.records = stepper.plan.records(alpha_t, refs, steps, every)
            extra["records"] = "kernel"
    if stepper.engine == "fused" and stepper.records is not None:
        recorder.start = None
        steps_run = run_segments(stepper, steps, every if progress else max(steps, 1),
                                 lambda t: None, stops, progress)
        params, state = stepper.result()
        recorder.take_kernel(stepper.records, stepper.plan.record(stepper.records), steps_run,
                             stops.stop_step.numpy())
    else:
        shared = getattr(stepper, "record_inputs", lambda: None)  # the step's own forward pass
        steps_run = run_segments(stepper, steps, every,
                                 lambda t: recorder.record(t, stepper.params, stops.active,
                                                           shared()),
                                 stops, progress)
        params, state = stepper.result()
        recorder.close(steps_run, params, stops.active)
    return Trajectory(
        params={kk: v.detach() for kk, v in params.items()},
        metrics=recorder.metrics(),
        W=model.W(params).detach().cpu().numpy(),
        steps_run=steps_run,
        record_steps=np.asarray(recorder.steps),
        stop_step=stops.stop_step.numpy(),
        param_history=recorder.history(),
        alpha=None if alpha_t is None else alpha_t.cpu().numpy(),
        stop_reason=stops.reason.astype(str),
        state=state,
        extra=extra,
        source=(model, tdata, optimizer),
    )


#: the smallest stride of the default record schedule (:func:`default_record_every`)
RECORD_MIN_STRIDE = 25


def default_record_every(steps: int) -> int:
    """The default record stride of ``train(..., steps=steps)``: k = max(steps // 100,
    min(steps, RECORD_MIN_STRIDE)) (>= 1), records at 0, k, 2k, ... and at the last step.

    Long runs (steps >= 2500) keep about 100 records (k = steps // 100). A shorter run
    records every 25 steps (every step before: 101 records for 100 steps, now 5), and a
    run of at most 25 steps records at its first and last step only. Why: a record costs
    about two steps. The fused engine takes its records inside the kernel
    (:class:`attnsvm.fused.Records`: the run is one kernel call whatever k; measured at
    B = 10^4, d = 10, 100 steps, 1 thread, CPU time: the default 5 records 1.03x the same
    run with two records, a record every step 3.25x; with the records between kernel
    segments, as before, 4.2x every step, 1.5x every 20 steps); the torch engine's
    records are tensor programs of about one step each. Pass ``record_every`` for a
    finer grid."""
    return max(1, steps // 100, min(steps, RECORD_MIN_STRIDE))


def train(model: AttentionModel, data, loss=None, optimizer: Optimizer | None = None, *,
          steps: int = 1000, B: int | None = None, seed: int = 0, init="random",
          scale: float | None = None, record_every: int | None = None,
          references: dict | None = None, record_params: bool = False, progress: bool = False,
          device=None, dtype=torch.float64, alpha=None, batch_size: int | None = None,
          autograd: bool = False, engine: str = "auto", chunk: int | None = None,
          metrics: list | None = None) -> Trajectory:
    """Train B independent trials of ``model`` on ``data`` with a step rule.

    Each step: (L, log(L - L*), G) = model.evaluate(params, data) (stable form, §8; G in
    scaled form), (params, state) <- optimizer.update(G, state, params, log(L - L*)) for the
    trials still running (see the module docstring for when a trial stops).

    model: an AttentionModel (WModel, KQModel, DiagModel, PromptModel) or an
    :class:`~attnsvm.ntp.NTPModel` (next-token prediction; its data an NTPData or a list
    of B NTPData). ``loss`` and ``optimizer`` may come third and fourth by position (as
    they always could); every later argument is a keyword.
    loss: a loss name, a Loss or a callable (default None: "logistic"; an NTP model has its
    own next-token loss and takes none).
    optimizer: an :class:`~attnsvm.optim.Optimizer` or a registered name (default NGD, lr 0.1).
    data: TokenData, unbatched (shared by all trials) or batched with B datasets.
    init: "random" | "zero" | "balanced" | "unbalanced" (with ``scale``, ``seed``) or a
    dict {name: (..) or (B, ..)} of initial parameters. scale: the Frobenius norm of each
    random initial tensor (default None: the model's ``default_scale``, 0.1 for attention
    models, sqrt(d / 3) for NTP models).
    record_every: metrics every k steps plus the first and last step (default None:
    :func:`default_record_every`, k = max(steps // 100, min(steps, 25)): at most 101
    records, and at most one every 25 steps, so a short run is not dominated by its
    records: each costs about two steps). The fused engine computes them inside its
    kernel (one kernel call per run, ``traj.extra["records"] == "kernel"``), except with
    ``record_params=True``: then the recorder takes them between kernel segments (it keeps
    the parameters of every record) and ``traj.extra["records"]`` says so.
    references: {name: (d, d) or (B, d, d) [Prompt: (d,) or (B, d)]};
    adds ``corr_<name>`` = <W, R> / (|W| |R|). alpha: selected tokens for p_sel (default
    opt = argmax gamma when data has v). batch_size (or optimizer.batch_size):
    mini-batch of sequences per trial and step (SGD/SNGD); trial b's batches depend only
    on its seed ``seed + b`` and the step. autograd: torch.autograd of the stable objective
    instead of the closed-form gradient (linear heads; other heads always use autograd).
    device: "cpu", "cuda", ... (must exist). dtype: torch.float64 (default), float32 or
    float16.
    Every argument is checked before any work (the table ``TRAIN_CONSTRAINTS``, what the
    model can honour (``model.train_fixed``), then against the data and the memory
    available): a bad one is a ValueError naming it and what was expected.
    engine: "auto" | "torch" | "fused" (module docstring; "fused" raises a ValueError
    naming what it does not support). chunk: train at most ``chunk`` trials at a time
    (same result; the step's memory is that of one chunk; :func:`_train_chunked`).
    metrics: further metrics recorded with the others, each an object with ``bind(model,
    tdata, loss, B)`` (checked against the run before any work; returns ``cols(params) ->
    {name: (B,) tensor}``) and ``take(a, b, B)`` (its trials a..b-1, for ``chunk``), e.g.
    :class:`attnsvm.generalisation.Generalisation` (test accuracy and loss on a held-out
    set, train accuracy on clean and flipped samples, the role of the attended token).

    Example (a next-token-prediction model through the same trainer)::

        >>> from attnsvm.ntp import NTPModel, ntp_random
        >>> traj = train(NTPModel(8), ntp_random(4, 6, 8, 8, seed=0), optimizer="ngd", steps=50)
        >>> traj.steps_run, traj.extra["engine"]
        (50, 'torch')
    """
    _check_fixed(model, {"loss": loss, "batch_size": batch_size, "autograd": autograd,
                         "alpha": alpha})  # (as given) before any work
    args = validate_params(TRAIN_CONSTRAINTS, locals(), "train")
    _check_model_args(model, args)
    lossf, optimizer, steps, seed, device, chunk = (args[a] for a in (
        "loss", "optimizer", "steps", "seed", "device", "chunk"))
    if lossf is None and "loss" not in getattr(model, "train_fixed", {}):
        lossf = _check_loss("logistic")
    scale = model.default_scale if args["scale"] is None else args["scale"]
    k = default_record_every(steps) if record_every is None else args["record_every"]
    tdata = model.prepare(data, device=device, dtype=dtype)
    B, bs = _check_against_data(model, tdata, args["B"], init, batch_size, optimizer, seed)
    Q = model.queries_per_sequence(tdata)
    alpha_t = _alpha_tensor(model, tdata, alpha, Q, B)
    refs = _check_refs(model, references, B, dtype, tdata["X"].device)
    metrics = args["metrics"]
    bound = [m.bind(model, tdata, lossf, B) for m in metrics or ()]  # checked before any work
    _check_train_memory(model, tdata, B, chunk, dtype, device, select_engine(
        model, tdata, lossf, optimizer, engine, batch_size=bs, autograd=autograd)[0],
        rows=False if autograd or bs is not None else None)
    params = _init_params(model, init, B, seed, scale, device, dtype)
    # (a row chunk at a time: W of a factorised model is formed one chunk's at once)
    if not all(bool(model.finite({kk: v[a:b] for kk, v in params.items()}).all())
               for a, b in row_chunks(params)):
        raise ValueError("the initial parameters overflow float64 in W (e.g. K Q^T): start smaller")
    if chunk is not None and chunk < B:
        traj = _train_chunked(
            model, tdata, params, chunk, k, alpha_t, refs, seed,
            dict(loss=lossf, optimizer=optimizer, steps=steps, scale=scale,
                 record_params=record_params, progress=progress, device=device, dtype=dtype,
                 batch_size=batch_size, autograd=autograd, engine=engine), metrics=metrics)
        traj.source = (model, tdata, optimizer)
        return traj

    return _train_one(model, tdata, lossf, optimizer, params, engine, steps=steps, every=k, Q=Q,
                      batch_size=bs, seed=seed, autograd=autograd, alpha_t=alpha_t, refs=refs,
                      record_params=record_params, progress=progress, copy=isinstance(init, dict),
                      metrics=bound)


def train_ntp(model, data, optimizer=None, steps: int = 1000, B: int | None = None,
              seed: int = 0, init="random", scale: float | None = None, **kw) -> Trajectory:
    """Deprecated (``attnsvm.ntp`` no longer hands it on): :func:`train` of an
    :class:`~attnsvm.ntp.NTPModel`, ``train(model, data, optimizer=..., ...)`` (the one
    trainer; the same arguments, by keyword after ``optimizer``, and the same results).

    Example::

        >>> import warnings
        >>> from attnsvm.ntp import NTPModel, ntp_random
        >>> data = ntp_random(4, 6, 8, 8, seed=0)
        >>> new = train(NTPModel(8), data, optimizer="ngd", steps=20, B=2)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     old = train_ntp(NTPModel(8), data, "ngd", steps=20, B=2)
        >>> bool((old.W == new.W).all()), caught[0].category.__name__
        (True, 'DeprecationWarning')
    """
    import warnings

    warnings.warn("attnsvm.train.train_ntp is deprecated: use attnsvm.train.train(NTPModel(...), "
                  "data, optimizer=..., ...)", DeprecationWarning, stacklevel=2)
    return train(model, data, optimizer=optimizer, steps=steps, B=B, seed=seed, init=init,
                 scale=scale, **kw)
