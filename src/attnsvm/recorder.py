"""What :func:`attnsvm.train.train` records along a run: one object.

    rec = Recorder(model, tdata, lossf, alpha, refs, Q, record_params)
    rec.record(t, params, active)        # at every record step (the steppers call it)
    rec.close(steps_run, params, active) # the last step, recorded once, with final stop flags
    rec.metrics()                        # tidy DataFrame, one row per (trial, step)

Per trial and record step: loss, loss_gap, log10_gap (of the stable objective,
:meth:`AttentionModel.evaluate`), the model's norms, p_sel_mean / p_sel_min (the attention
on the selected tokens ``alpha``), p_max and soft_sparsity (1 / sum_t s_t^2) of the
softmax, ``corr_<name>`` = <W, R> / (||W|| ||R||) for each reference, the columns of each bound
metric of ``metrics`` (``cols(params) -> {name: (B,) tensor}``, e.g.
:class:`attnsvm.generalisation.Generalisation`), and ``stopped``; the parameters too when
``record_params``.

The fused engine computes the same metrics inside its kernel (:class:`attnsvm.fused.Records`,
:func:`attnsvm.fused.kernels._trial_record`; equal to :func:`_record` to 1e-12 relative,
tests/test_fused.py) and hands them over with :meth:`Recorder.take_kernel`; the
recorder's own path remains for the torch engine, for ``record_params=True`` and for
further ``metrics`` (computed in torch at each record).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from .metrics import correlation
from .steppers import row_chunks

__all__ = ["Recorder", "LN10"]

LN10 = math.log(10.0)


def _record(model, params, tdata, lossf, alpha, refs, Q, start=None):
    """Per-trial metrics (B, n_metrics) and their names. ``start``: (logits, objective or
    None) already computed at these parameters (the objective's L and gaps being those of
    ``evaluate(grad=False)``): they are not computed again."""
    a, ev = (None, None) if start is None else start
    with torch.no_grad():
        if a is None:
            a = model._logits(params, tdata)
        if ev is None:
            ev = model.evaluate(params, tdata, lossf, grad=False, logits=a)
        s = torch.softmax(a, dim=-1)  # (B, n, Q, T)
        B = s.shape[0]
        cols = {"loss": ev.loss, "loss_gap": ev.gap, "log10_gap": ev.log_gap / LN10}
        rows = row_chunks(params)  # norms a row chunk at a time (W, an SVD's copies)
        nrm = [model.norms({k: v[a:b] for k, v in params.items()}) for a, b in rows]
        cols.update({k: torch.cat([n[k] for n in nrm]) for k in nrm[0]})
        if alpha is not None:
            ix = alpha.expand(B, *alpha.shape[1:])[..., None]
            psel = s.gather(-1, ix)[..., 0].reshape(B, -1)
            cols["p_sel_mean"] = psel.mean(1)
            cols["p_sel_min"] = psel.min(1).values
        flat = s.reshape(B, -1, s.shape[-1])
        cols["p_max"] = flat.max(-1).values.mean(1)
        cols["soft_sparsity"] = (1.0 / flat.pow(2).sum(-1)).mean(1)
        Wc = model.W(params) if refs else None
        for name, R in refs.items():
            cols[f"corr_{name}"] = correlation(Wc, R, vector=Wc.ndim == 2)
    names = list(cols)
    return names, torch.stack([cols[k].to(torch.float64).reshape(B) for k in names], dim=1)


class Recorder:
    """The metrics of every trial at the record steps (module docstring). ``start``:
    (logits, objective or None) at the initial parameters, reused by the record at step 0
    (nothing has been applied yet)."""

    def __init__(self, model, tdata, lossf, alpha, refs: dict, Q: int,
                 record_params: bool = False, start=None, metrics=()):
        self.model, self.tdata, self.lossf, self.alpha, self.refs, self.Q = (
            model, tdata, lossf, alpha, refs, Q)
        self.extra = tuple(metrics)  # bound metrics: cols(params) -> {name: (B,) tensor}
        self.record_params, self.start = record_params, start
        self.steps: list[int] = []
        self._vals: list[torch.Tensor] = []
        self._hist: list[dict] = []
        self.names: list[str] | None = None

    def record(self, t: int, params: dict, active: torch.Tensor, forward=None) -> None:
        """The metrics at step t of ``params``; ``active`` (B,): the trials still running;
        ``forward``: (logits, objective or None) already computed at ``params`` by the
        step's own forward pass (the torch engine's record steps), not computed again."""
        names, vals = _record(self.model, params, self.tdata, self.lossf, self.alpha,
                              self.refs, self.Q, self.start if t == 0 else forward)
        if t > 0:  # the step-0 logits and objective (with its gradient) are not kept on
            self.start = None
        for cols in self.extra:
            more = cols(params)
            names = [*names, *more]
            vals = torch.cat([vals, torch.stack([c.to(vals.dtype).reshape(-1).expand(
                vals.shape[0]) for c in more.values()], dim=1)], dim=1)
        self.names = names
        self.steps.append(t)
        self._vals.append(torch.cat([vals, (~active).to(vals.dtype)[:, None]], dim=1))
        if self.record_params:
            self._hist.append({k: v.detach().cpu().clone() for k, v in params.items()})

    def close(self, steps_run: int, params: dict, active: torch.Tensor) -> None:
        """The record at the last step, made again if it exists (stop flags may have
        changed since)."""
        if self.steps and self.steps[-1] == steps_run:
            self.steps.pop()
            self._vals.pop()
            if self.record_params:
                self._hist.pop()
        self.record(steps_run, params, active)

    def take_kernel(self, records, final: np.ndarray, steps_run: int, stop_step) -> None:
        """The records of a fused run taken inside the kernel (:class:`attnsvm.fused.Records`,
        the same metrics as :meth:`record`) and ``final`` (B, n_metrics), the record at
        ``steps_run``: rows at the steps t = 0, every, 2 every, ... < steps_run, then the
        final one. A trial that stopped at step s (``stop_step``) holds its final record,
        ``stopped``, at every t > s (its parameters are frozen; the torch engine records so)."""
        ev = records.every
        steps = list(range(0, steps_run, ev))
        V = records.values[:, :len(steps)][:, :, records.cols]  # (B, n, M)
        F = final[:, records.cols]
        ss = np.asarray(stop_step)
        stopped = (ss[:, None] >= 0) & (ss[:, None] < np.asarray(steps, dtype=np.int64)[None, :])
        V = np.where(stopped[..., None], F[:, None, :], V)
        self.names = list(records.names)
        self.steps = [*steps, int(steps_run)]
        self._vals = [torch.from_numpy(np.concatenate([V[:, i], stopped[:, i, None]], axis=1))
                      for i in range(len(steps))]
        self._vals.append(torch.from_numpy(np.concatenate([F, (ss >= 0)[:, None]], axis=1)))

    def metrics(self) -> pd.DataFrame:
        """One row per (trial, step): trial, step, the metrics, stopped."""
        vals = torch.stack(self._vals).cpu().numpy()  # (R, B, M)
        R, B = vals.shape[:2]
        df = pd.DataFrame(vals.transpose(1, 0, 2).reshape(B * R, -1), columns=[*self.names, "stopped"])
        df.insert(0, "step", np.tile(np.asarray(self.steps), B))
        df.insert(0, "trial", np.repeat(np.arange(B), R))
        df["stopped"] = df["stopped"].astype(bool)
        return df

    def history(self) -> dict | None:
        """{name: (n_records, B, ...)} of the recorded parameters, or None."""
        if not self.record_params:
            return None
        return {k: np.stack([h[k].numpy() for h in self._hist]) for k in self._hist[0]}
