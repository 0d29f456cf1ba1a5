"""The step loop of :func:`attnsvm.train.train`: one interface, two engines.

    stepper = TorchStepper(...) | FusedStepper(plan)
    stepper.init(params, state)
    steps_run = run_segments(stepper, steps, every, record, stops)
    params, state = stepper.result()

A run is cut into segments [t0, t1) between two metric records (t0 a multiple of
``every``); :meth:`Stepper.step` runs one segment for the trials still running, calls
``record(t0)`` at its start, stops trials through :class:`Stops` and returns the number
of steps run once every trial has stopped (None while some run on). The engines:

* :class:`TorchStepper`: the batched tensor program (the reference; every rule, device,
  dtype, mini-batches), one ``optimizer.update`` per step; with a :class:`fused.Plan`
  whose rule has no compiled counterpart, the scaled gradient comes from the kernel
  ("fused-gradient");
* :class:`FusedStepper`: the whole segment inside the compiled kernel
  (:meth:`attnsvm.fused.Plan.run`) for a rule whose transforms all carry a compiled
  counterpart; with ``records`` (:class:`attnsvm.fused.Records`, what ``train`` sets
  unless ``record_params``) the kernel takes the metric records itself and the run is one
  segment.

Both follow the same semantics (module docstring of :mod:`attnsvm.train`): a zero gradient
stops a trial before its update; an update that makes a parameter non-finite, or (full
batch, stateless rule) leaves every parameter bit-identical, stops it and is not applied;
a step whose objective then overflows is undone. tests/test_fused.py holds the two equal.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch

from . import fused
from .chunks import chunk_bounds
from .models.objective import Objective
from .optim.base import Scaled

__all__ = ["Stops", "Stepper", "TorchStepper", "FusedStepper", "select_engine", "make_stepper",
           "run_segments", "minibatch", "evaluate_rows", "row_chunks", "row_data", "rows_apply"]


class Stops:
    """Which trials still run, and when and why the others stopped.

    active (B,) bool on the data's device; stop_step (B,) long (-1: running); reason (B,)
    str ("" while running; :data:`attnsvm.train.STOP_REASONS`)."""

    def __init__(self, B: int, device):
        self.active = torch.ones(B, dtype=torch.bool, device=device)
        self.stop_step = torch.full((B,), -1, dtype=torch.long)
        self.reason = np.full(B, "", dtype=object)

    def stop(self, mask: torch.Tensor, t: int, why: str) -> bool:
        """Stop the running trials of ``mask`` at step t for ``why``; whether any did."""
        mask = mask & self.active
        if not bool(mask.any()):
            return False
        mc = mask.cpu()
        self.stop_step[mc] = t
        self.reason[mc.numpy()] = why
        self.active = self.active & ~mask
        return True

    def running(self) -> bool:
        """Whether some trial still runs."""
        return bool(self.active.any())


class Stepper(ABC):
    """The step loop of one engine (module docstring). ``engine`` names it in
    ``Trajectory.extra["engine"]``, and ``reason`` why it is not the whole compiled loop
    ("fused"), or None, in ``Trajectory.extra["engine_reason"]``; ``params`` are the current
    parameters {name: (B, ...)} (what ``record`` reads)."""

    engine: str
    params: dict
    reason: str | None = None

    @abstractmethod
    def init(self, params: dict) -> None:
        """Start from ``params`` (the optimiser's state: ``optimizer.init(params)``)."""

    @abstractmethod
    def step(self, t0: int, t1: int, record: Callable[[int], None], stops: Stops) -> int | None:
        """Steps t0 .. t1-1 (``record(t0)`` at the start, once the parameters are those
        of step t0); returns the steps run when every trial has stopped, else None."""

    @abstractmethod
    def result(self) -> tuple[dict, dict]:
        """(params, state) at the end of the run."""


def run_segments(stepper: Stepper, steps: int, every: int, record: Callable[[int], None],
                 stops: Stops, progress: bool = False) -> int:
    """Run ``stepper`` for ``steps`` steps in segments of ``every`` steps (a record at the
    start of each); returns the number of steps run (fewer when every trial stopped)."""
    bar = None
    if progress:
        from .progress import progress_bar

        desc = "train" if stepper.engine == "torch" else f"train ({stepper.engine})"
        bar = progress_bar(total=steps, desc=desc, unit="step")
    t = 0
    try:
        while t < steps:
            t1 = min(steps, (t // every + 1) * every)
            end = stepper.step(t, t1, record, stops)
            if bar is not None:
                bar.update((t1 if end is None else end) - t)
            if end is not None:
                return end
            t = t1
    finally:
        if bar is not None:
            bar.close()
    return steps


#: the torch engine's full-batch step (closed-form gradient) runs its objective and its
#: checks in row chunks of the trials once the parameters exceed CHUNK_MIN_BYTES: at most
#: STEP_CHUNKS chunks of at least CHUNK_MIN_BYTES of parameters each
#: (:meth:`TorchStepper._evaluate_rows`; memory: docs of ``attnsvm.train.train_memory``).
#: (More chunks would hold fewer temporaries, but a chunk's batched reductions may round
#: the last bit of L otherwise: the chunks are part of a run's bits.)
CHUNK_MIN_BYTES = 4 << 20
STEP_CHUNKS = 8


def row_chunks(params: dict) -> list[tuple[int, int]]:
    """The trials' row chunks [(a, b), ...] of the torch engine's step: one chunk below
    2 CHUNK_MIN_BYTES of parameters, else k = min(STEP_CHUNKS, bytes // CHUNK_MIN_BYTES)."""
    B = next(iter(params.values())).shape[0]
    nbytes = sum(v.numel() * v.element_size() for v in params.values())
    k = max(1, min(STEP_CHUNKS, nbytes // CHUNK_MIN_BYTES, B))
    return chunk_bounds(B, -(-B // k))


def _shares_memory(t: torch.Tensor, others) -> bool:
    p = t.untyped_storage().data_ptr()
    return any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() == p
               for o in others)


def row_data(tdata: dict, rows) -> list[dict]:
    """The data of each row chunk of trials (views; a shared field (Bx = 1) as it is)."""
    B = rows[-1][1]
    return [{k: (v[a:b] if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == B else v)
             for k, v in tdata.items() if not k.startswith("_")} for a, b in rows]


def rows_apply(model) -> bool:
    """Whether the torch engine may evaluate ``model``'s objective in row chunks: the
    closed form of a linear head (every quantity per trial, the gradient in scaled form)."""
    return getattr(model, "head", None) == "linear"


def evaluate_rows(model, params, subs, rows, lossf, *, share=False, need_gap=True,
                  logits=None, bufs=None, each=None, grads=True):
    """``model.evaluate`` (closed form, with the gradient) of the trials a row chunk at a
    time: (Objective, logits or None). Every quantity of the objective is per trial, so
    the values are those of one batched call, while its temporaries are one chunk's.
    params: a callable returning the current {name: (B, ...)} (``each`` may replace them);
    subs: :func:`row_data`; share: also compute and return the logits (B, n, Q, T);
    logits: the logits already computed (sliced per chunk); bufs: {name: (B, ...)}
    buffers the gradient may be written into (else new); each(a, b, grads): called with
    a chunk's scaled gradient before it is written; grads=False: each chunk's gradient is
    let go once ``each`` has read it (the Objective's grads are None)."""
    B = rows[-1][1]
    cols, ls, out, lgs = [], {}, {}, []
    for (a, b), data in zip(rows, subs):
        p = {k: v[a:b] for k, v in params().items()}
        lg = model._logits(p, data) if share else (None if logits is None else logits[a:b])
        ev = model.evaluate(p, data, lossf, need_gap=need_gap, logits=lg)
        g = ev.grads
        if each is not None:
            each(a, b, g)
        for k, v in (g.tensors.items() if grads else ()):
            if k not in out:
                buf = (bufs or {}).get(k)
                out[k] = (buf if buf is not None and buf.shape == (B, *v.shape[1:])
                          and buf.dtype == v.dtype else v.new_empty((B, *v.shape[1:])))
            out[k][a:b] = v
            ls.setdefault(k, []).append(g.log_scale[k])
        cols.append(ev[:3])
        if share:
            lgs.append(lg)
        del p, ev, g, lg  # the chunk's tensors let go before the next chunk (memory)
        v = None
    L, gap, lgap = (None if c[0] is None else torch.cat(c) for c in zip(*cols))
    ev = Objective(L, gap, lgap, Scaled(out, {k: torch.cat(v) for k, v in ls.items()})
                   if grads else None)
    return ev, (torch.cat(lgs) if share else None)


def _trial_sums(v: torch.Tensor) -> torch.Tensor:
    """The sum of each trial's entries (B,) of v (B, ...), one reduction (equal entries:
    equal sums, the one formula for the old parameters and the new)."""
    return v.sum(tuple(range(1, v.ndim))) if v.ndim > 1 else v.reshape(-1, 1).sum(1)


def _total(x: torch.Tensor) -> float:
    """sum(x) as a number: the entry itself for one entry (B = 1: no reduction)."""
    return (x if x.numel() == 1 else x.sum()).item()


def _freeze(active: torch.Tensor, new: dict, old: dict) -> dict:
    """new where ``active`` (B,), old elsewhere, tensor by tensor."""
    return {k: torch.where(active.reshape(-1, *([1] * (v.ndim - 1))), new[k], v)
            for k, v in old.items()}


class TorchStepper(Stepper):
    """The batched tensor program: per step t, (L, log(L - L*), G) = model.evaluate
    (scaled gradient; ``plan.evaluate`` in the fused-gradient mode; a mini-batch of
    ``batch_size`` sequences when given), the checks, then ``optimizer.update`` for the
    trials still running. ``first``: the objective at the initial parameters (step 0 of a
    full-batch run reuses it); ``copy``: clone the initial parameters (they may be the
    caller's arrays)."""

    def __init__(self, model, tdata, lossf, optimizer, *, first, batch_size=None, seed=0,
                 autograd=False, plan=None, copy=False):
        self.model, self.tdata, self.lossf, self.optimizer = model, tdata, lossf, optimizer
        self.first, self.bs, self.autograd, self.plan, self.copy = first, batch_size, autograd, plan, copy
        self.engine = "torch" if plan is None else "fused-gradient"
        self.check_stall = batch_size is None and not optimizer.stateful
        self.seed = seed
        #: a record step's logits (and objective) come from the step's own forward pass:
        #: full batch on the torch path; the objective where its L and gaps are those of
        #: evaluate(grad=False) (the closed form of a linear head)
        self.shares_forward = plan is None and batch_size is None
        self.shares_objective = self.shares_forward and not autograd and model.head == "linear"
        self.forward = None  # (logits, objective or None) of the record step, until recorded
        #: the new parameters' checks in one pass (:meth:`_update_ok`): the parameters are all
        #: there is to check (W is not a product of them that may overflow first)
        self.quick_finite = not getattr(model, "factorised", True)

    def init(self, params):
        self.params = {k: v.clone() for k, v in params.items()} if self.copy else dict(params)
        self.state = self.optimizer.init(self.params)
        B = next(iter(params.values())).shape[0]
        self.seeds = torch.arange(B, dtype=torch.int64) + self.seed
        self.prev = self.prev_state = None  # the parameters before the last step
        self.all_active = True
        self.sums = None  # per tensor, the sums of the parameters' entries per trial (B,)
        self.rows = row_chunks(self.params)
        #: the objective in row chunks (:meth:`_evaluate_rows`): full batch, closed form
        self.by_rows = (len(self.rows) > 1 and self.plan is None and self.bs is None
                        and not self.autograd and rows_apply(self.model))
        self.subs = None  # the data of each chunk (views), made at first use
        self.undone = False  # _evaluate_rows undid a step (the forward pass is stale)

    def result(self):
        self.prev = self.prev_state = None  # not held through the last record (memory)
        return self.params, self.state

    def _evaluate(self, t, record: bool = False, stops=None):
        """The objective of step t; at a record step (``record``) of a full-batch run the
        logits it is computed from (and the objective, with L and the gaps) are kept in
        ``forward`` for the record (:meth:`record_inputs`): no second forward pass."""
        if self.plan is not None:
            return self.plan.evaluate(self.params, self.optimizer.needs_gap)
        if t == 0 and self.bs is None:
            first, self.first = self.first, None  # not kept across the run (memory)
            return first
        if self.by_rows:
            return self._evaluate_rows(t, record and self.shares_forward, stops)
        if record and self.shares_forward:
            a = self.model._logits(self.params, self.tdata)
            ev = self.model.evaluate(self.params, self.tdata, self.lossf, autograd=self.autograd,
                                     need_gap=self.optimizer.needs_gap or self.shares_objective,
                                     logits=a)
            self.forward = (a, ev if self.shares_objective else None)
            return ev
        batch = self.tdata if self.bs is None else minibatch(self.tdata, self.bs, self.seeds, t)
        return self.model.evaluate(self.params, batch, self.lossf, autograd=self.autograd,
                                   need_gap=self.optimizer.needs_gap)

    def _evaluate_rows(self, t, share: bool, stops):
        """:meth:`_evaluate` a row chunk of trials at a time (:func:`evaluate_rows`): once
        a chunk's gradient is known its overflowed trials are undone (:meth:`_undo`), after
        which its rows of the parameters before the last step are not needed: the gradient
        is written there. Memory: the parameters, the gradient and one chunk, not the
        parameters, the previous ones and the gradient."""
        if self.subs is None:
            self.subs = row_data(self.tdata, self.rows)
        prev, B = self.prev, stops.active.shape[0]
        keep = list(self.params.values()) + list((self.state or {}).values())
        bufs = ({k: v for k, v in prev.items() if v.is_contiguous() and not _shares_memory(v, keep)}
                if prev is not None else {})
        self.undone = False

        def undo(a, b, g):  # before the chunk's rows of prev are overwritten
            if prev is not None:
                bad = torch.zeros(B, dtype=torch.bool, device=stops.active.device)
                bad[a:b] = g.nonfinite()
                self.undone |= self._undo(bad, t, stops)

        ev, logits = evaluate_rows(
            self.model, lambda: self.params, self.subs, self.rows, self.lossf, share=share,
            need_gap=self.optimizer.needs_gap or (share and self.shares_objective),
            bufs=bufs, each=undo)
        self.prev = self.prev_state = prev = bufs = None
        if share and not self.undone:
            self.forward = (logits, ev if self.shares_objective else None)
        return ev

    def record_inputs(self):
        """(logits, objective or None) of the current parameters computed by this step's
        forward pass, or None (then the recorder computes them); handed over once."""
        fw, self.forward = self.forward, None
        return fw

    def _freeze_where(self, keep, new, new_state):
        self.params, self.sums = _freeze(keep, new, self.params), None
        self.state = _freeze(keep, new_state, self.state) if self.state else self.state

    def _undo_overflow(self, grads, t, stops) -> bool:
        """The last step overflowed the objective (logits, W) of some trials: stop them at
        t - 1 with their parameters before it. Whether they did."""
        if self.prev is None:
            return False
        return self._undo(grads.nonfinite(), t, stops)

    def _undo(self, nonfinite, t, stops) -> bool:
        """:meth:`_undo_overflow` of the trials of ``nonfinite`` (B,) bool."""
        bad = nonfinite & stops.active
        if not stops.stop(bad, t - 1, "non-finite step"):
            return False
        self.params, self.state = _freeze(bad, self.prev, self.params), (
            _freeze(bad, self.prev_state, self.state) if self.state else self.state)
        self.all_active, self.sums = False, None
        return True

    def _grads_ok(self, grads, stops) -> bool:
        """Whether every running trial's gradient is finite and not zero, i.e. neither the
        undo nor the zero-gradient stop has anything to do: the sum of the log scales over
        the running trials is finite iff each one is (they are O(|a|), far inside float64's
        range; a sum that overflowed only sends the step to the full checks). One reduction
        and one read instead of a stop check each."""
        tot = None
        for ls in grads.log_scale.values():
            tot = ls if tot is None else tot + ls
        if not self.all_active:
            tot = torch.where(stops.active, tot, 0.0)
        return math.isfinite(_total(tot))

    def _update_ok(self, new, params, stops) -> bool:
        """Whether no running trial's update is non-finite or (``check_stall``) leaves every
        parameter unchanged, from one pass per tensor: the sums of the new parameters'
        entries per trial (the full checks of :meth:`_advance` run only when this says no).
        A sum is finite iff each entry is (or it overflowed: the full checks decide); with
        ``check_stall``, a trial whose sums differ from those of its old parameters (kept
        from the last step in ``sums``) has changed some entry (equal sums: the full checks
        decide). Models whose W is a product of the parameters (it may overflow first)
        always take the full checks (``model.finite``)."""
        if not self.quick_finite:
            return False
        sums = [_trial_sums(new[k]) for k in params]
        S = sums[0] if len(sums) == 1 else torch.stack(sums)
        if self.check_stall:
            old = self.sums
            if old is None:
                old = [_trial_sums(v) for v in params.values()]
            if len(sums) == 1:
                # one tensor: x / x (x = S - S_old) is 1 iff S is finite and differs from
                # S_old (or the difference overflowed: the full checks decide), else NaN;
                # their sum is finite iff each one is
                self.sums = sums
                x = S.sub(old[0])
                x = x.div_(x)
                if not self.all_active:
                    x = torch.where(stops.active, x, 0.0)
                return math.isfinite(_total(x))
            S = S.ne(old[0] if len(old) == 1 else torch.stack(old)).logical_and_(S.isfinite())
            self.sums = sums  # those of self.params after the step, unless frozen (None)
            S = S if S.ndim == 1 else S.any(0)  # some tensor changed (all are finite: below)
            if len(sums) > 1:
                S = S.logical_and_(torch.stack(sums).isfinite().all(0))
            if not self.all_active:
                S = S.logical_or_(~stops.active)
            return bool(S.all())
        if not self.all_active:
            S = torch.where(stops.active, S, 0.0)
        return math.isfinite(_total(S))

    def _advance(self, ev, t, stops) -> None:
        """The update of step t for the running trials, unless it is not finite (stop) or,
        with ``check_stall``, changes no parameter (stop)."""
        params = self.params
        grads = ev.grads
        if self.plan is None and isinstance(grads, Scaled):
            # the gradient was made for this update alone (not the kernel's buffers): the
            # rule may write into it (memory: the direction and the new parameters in place)
            grads = grads._replace(owned=True)
        new, new_state = self.optimizer.update(grads, self.state, params, ev.log_gap)
        grads = None
        if not self._update_ok(new, params, stops):
            fin = (torch.cat([self.model.finite({k: v[a:b] for k, v in new.items()})
                              for a, b in self.rows]) if len(self.rows) > 1
                   else self.model.finite(new))  # W of a factorised model: one chunk's
            if stops.stop(~fin, t, "non-finite step"):
                self.all_active = False
            if self.check_stall:
                # all(1) of a bool as the min of its bytes: the same answer, a vectorised
                # reduction (bool all(1) over short rows was measured 4x slower); a row
                # chunk at a time (memory: no parameter-sized bool temporary)
                same = torch.cat([torch.stack([
                    (new[k][a:b] == v[a:b]).reshape(b - a, -1).view(torch.uint8).amin(1)
                    for k, v in params.items()]).amin(0) for a, b in self.rows]).bool()
                if stops.stop(same, t, "no change in float64"):
                    self.all_active = False
        self.prev, self.prev_state = params, self.state
        if self.all_active:
            self.params, self.state = new, new_state
        else:
            self._freeze_where(stops.active, new, new_state)

    def step(self, t0, t1, record, stops):
        for t in range(t0, t1):
            ev = self._evaluate(t, record=t == t0, stops=stops)
            # the stops below (undo, zero gradient) only where some log scale is not finite
            ok = self._grads_ok(ev.grads, stops)
            if self.undone or not ok and self._undo_overflow(ev.grads, t, stops):
                self.undone = False
                self.forward = None  # some parameters went back: not those of the forward pass
                if not stops.running():
                    return t
            self.prev = self.prev_state = None  # the undo is done: let the old ones go (memory)
            if t == t0:
                record(t)
                self.forward = None
            if not ok and stops.stop(~ev.grads.nonzero(), t, "zero gradient"):
                self.all_active = False
                if not stops.running():
                    return t
            self._advance(ev, t, stops)
            ev = None  # the gradient is not held through the next step's (memory)
            if not self.all_active and not stops.running():
                return t + 1
        return None


class FusedStepper(Stepper):
    """Whole segments inside the compiled kernel (:meth:`attnsvm.fused.Plan.run`) for a
    rule that runs there (``plan.in_kernel``); the parameters live in the plan's slots
    (``params`` are views of them)."""

    engine = "fused"

    def __init__(self, plan, optimizer, copy: bool = True):
        self.plan, self.optimizer = plan, optimizer
        self.copy = copy  # the initial parameters may be the caller's: the slots copy them
        #: fused.Records: the metrics taken inside the kernel (``record`` is then not
        #: called; attnsvm.train._train_one reads them); None: ``record(t0)`` per segment
        self.records = None
        self.engine = plan.engine  # "fused", or "fused-cuda" (attnsvm.fused.cuda)

    def init(self, params):
        self.state = self.optimizer.init(params)
        # the run's own initial tensors become the slots (no copy); the caller's are copied
        self.params = self.plan.load(params, own=not self.copy)
        B = self.plan.B
        self.active = np.ones(B, dtype=np.uint8)
        self.stop_at = np.full(B, -1, dtype=np.int64)
        self.code = np.zeros(B, dtype=np.int64)

    def result(self):
        return self.plan.params(), self.plan.state(self.state)

    def step(self, t0, t1, record, stops):
        """The kernel's stops are reported at their step; when the last trials stop at
        step t, the run ends at t if they all stopped on a zero gradient (checked before
        the update), else at t + 1 (the torch loop's semantics). With ``records`` the
        kernel records the steps of the segment that fall on its stride itself."""
        if self.records is None:
            record(t0)
        code, stop_at = self.code, self.stop_at
        self.plan.run(t0, t1, self.active, stop_at, code, self.records)
        for c, why in fused.STOP_CODES.items():
            for s in np.unique(stop_at[(code == c) & (stop_at >= t0)]):
                stops.stop(torch.from_numpy((code == c) & (stop_at == s)), int(s), why)
        if self.active.any():
            return None
        last = int(stop_at.max())
        return last if bool((code[stop_at == last] == 1).all()) else last + 1


def select_engine(model, tdata, lossf, optimizer, engine: str, *, batch_size=None,
                  autograd: bool = False) -> tuple[str, str | None]:
    """(the engine that runs, why it is not the whole compiled loop or None): the one
    statement of the selection rule, read by :func:`make_stepper` (the stepper) and by
    train's memory check (before any work). ``engine`` is asked for ("auto" | "torch" |
    "fused", :data:`attnsvm.fused.ENGINES`); the engine that runs is ``"torch"`` (asked
    for, or the configuration is not supported: :func:`attnsvm.fused.unsupported`),
    ``"fused-gradient"`` (supported, but the rule has no step loop in the kernel:
    :func:`attnsvm.fused.not_compiled`), ``"fused"`` (the whole step in the CPU kernel) or
    ``"fused-cuda"`` (on a CUDA device, :mod:`attnsvm.fused.cuda`). The reason is
    ``Trajectory.extra["engine_reason"]``. ``engine="fused"`` on a configuration it does
    not support: a ValueError saying what."""
    if engine == "torch":
        return "torch", "engine='torch' was asked for"
    why = fused.unsupported(model, lossf, optimizer, tdata, batch_size, autograd)
    if why is not None:
        if engine == "fused":
            raise ValueError(f"engine='fused' does not support {why}")
        return "torch", why
    why = fused.not_compiled(optimizer)
    if why is not None:
        return "fused-gradient", why
    return ("fused-cuda" if fused._on_cuda(tdata) else "fused"), None


def make_stepper(model, tdata, lossf, optimizer, engine: str, *, first, Q: int, B: int,
                 batch_size=None, seed: int = 0, autograd: bool = False,
                 copy: bool = False) -> Stepper:
    """The stepper of ``engine`` ("auto" | "torch" | "fused", :data:`attnsvm.fused.ENGINES`)
    as :func:`select_engine` decides: :class:`FusedStepper` when the compiled engine
    supports the configuration and runs the rule in the kernel, :class:`TorchStepper`
    otherwise (with the kernel's gradient when only the rule is not compiled).
    ``engine="fused"`` on a configuration it does not support: a ValueError saying what
    (:func:`attnsvm.fused.unsupported`)."""
    runs, why = select_engine(model, tdata, lossf, optimizer, engine, batch_size=batch_size,
                              autograd=autograd)
    plan = None
    if runs != "torch":
        plan = fused.plan(model, tdata, lossf, optimizer, Q, B,
                          check_stall=batch_size is None and not optimizer.stateful)
    if runs in ("fused", "fused-cuda"):
        return FusedStepper(plan, optimizer, copy=copy)
    stepper = TorchStepper(model, tdata, lossf, optimizer, first=first, batch_size=batch_size,
                           seed=seed, autograd=autograd, plan=plan, copy=copy)
    stepper.reason = why  # why not the compiled loop (Trajectory.extra["engine_reason"])
    return stepper


# ------------------------------------------------------------------ mini-batches
_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) without int64 overflow (16-bit halves)."""
    cl, ch = c & 0xFFFF, c >> 16
    xl, xh = x & 0xFFFF, x >> 16
    return (xl * cl + (((xh * cl + xl * ch) & 0xFFFF) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32) of int64 tensors in [0, 2^32)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def minibatch(tdata: dict, batch_size: int, seeds: torch.Tensor, step: int) -> dict:
    """Per-trial random subsets of ``batch_size`` sequences (without replacement).

    Trial b's subset at a step is a function of (seeds[b], step) only (a counter-based
    hash, vectorised over trials): a batched run of B trials draws the same batches as B
    separate runs with those seeds. Every field gets a leading B = len(seeds)."""
    X = tdata["X"]
    B, n = len(seeds), X.shape[1]
    s = _hash32(seeds.to(torch.int64) & _M32)
    s = _hash32(s ^ _hash32(torch.full_like(s, int(step) & _M32) ^ 0x9E3779B9))
    keys = _hash32(s[:, None] ^ _mul32(torch.arange(n, dtype=torch.int64), 0x85EBCA6B)[None])
    idx = keys.argsort(dim=1, stable=True)[:, :batch_size].to(X.device)
    out = {}
    for k, t in tdata.items():
        if k.startswith("_"):  # caches of the full data
            continue
        if t is None or k == "v":
            out[k] = None if t is None else t.expand(B, *t.shape[1:])
            continue
        t = t.expand(B, *t.shape[1:])
        ix = idx.reshape(B, batch_size, *([1] * (t.ndim - 2))).expand(B, batch_size, *t.shape[2:])
        out[k] = t.gather(1, ix)
    out["_per_trial"] = True  # each trial its own subset, even at B = 1 (not shared data)
    return out
