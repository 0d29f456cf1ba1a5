"""Generalisation metrics recorded along a run (issue 35; docs/benign.md).

    from attnsvm.generalisation import Generalisation
    m = Generalisation(test=test_data, flipped=data.flipped, roles=data.roles)
    traj = train(PromptModel(d), data.train, metrics=[m], ...)   # or Generalisation.of(data)
    traj.metrics[["step", "test_acc", "train_acc_flipped", "att_signal_clean"]]

Per trial and record step, with f_i = the model's output on sample i, y_i its observed
(training) label, s_i its attention and ``roles[t]`` the role of token position t
(``ROLES``: signal, weak_same, weak_other, noise):

    train_acc                   mean_i [y_i f_i > 0] (f = 0 counts as an error)
    train_loss                  mean_i loss(y_i f_i) with the run's loss
    train_acc_clean / _flipped  the same accuracy on the clean / flipped samples (``flipped``;
                                NaN where a trial has none)
    att_<role>_clean / _flipped the share of clean / flipped samples whose most-attended token
                                (argmax_t s_it, the first on ties) has that role (``roles``;
                                without ``flipped``: ``att_<role>`` over all samples)
    test_acc, test_loss         the same accuracy and loss on the held-out set ``test``
    test_att_signal             the share of test samples attending most to a signal token

Every column is computed batched over the trials, in the run's dtype and on its device
(:func:`columns`, the one home of these formulas; :func:`attnsvm.benign.generalisation`
applies it to recorded prompts of any other trainer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .data import TokenData

if TYPE_CHECKING:  # torch is imported when a metric is computed (attnsvm.benign stays light)
    import torch

__all__ = ["Generalisation", "columns", "ROLES"]

#: Token roles, by code: the class signal, a weakly relevant token aligned with the sample's
#: class, one aligned with the other class, and pure noise (also ``attnsvm.benign.ROLES``).
ROLES = ("signal", "weak_same", "weak_other", "noise")


def _share(hit: torch.Tensor, among: torch.Tensor | None) -> torch.Tensor:
    """mean of ``hit`` over the last dim, restricted to ``among`` (NaN where it is empty)."""
    import torch

    if among is None:
        return hit.to(torch.float64).mean(-1)
    return (hit & among).sum(-1).to(torch.float64) / among.sum(-1).to(torch.float64)


def columns(f, top, y, loss, flipped=None, roles=None, f_test=None, top_test=None,
            y_test=None) -> dict:
    """The generalisation metrics (module docstring) from outputs and attention argmaxes.

    f, y (..., n): outputs and observed labels on the training set; top (..., n) long: the
    most-attended token of each sample (None without ``roles``); loss: elementwise u ->
    loss(u) on margins u = y f; flipped (..., n) bool or None; roles (T,) long codes into
    ``ROLES`` or None; f_test, y_test, top_test (..., m): the same on the test set (None:
    no test columns). Leading dims broadcast (e.g. (R, B) records x trials). Returns
    {name: (...) float64 tensor}, in a fixed order.
    """
    import torch

    u = f * y
    ok = u > 0
    cols = {"train_acc": _share(ok, None), "train_loss": loss(u).to(torch.float64).mean(-1)}
    fl = None
    if flipped is not None:
        fl = flipped.expand(ok.shape)
        cols["train_acc_clean"] = _share(ok, ~fl)
        cols["train_acc_flipped"] = _share(ok, fl)
    if roles is not None:
        role = roles[top]
        for k, name in enumerate(ROLES):
            hit = role == k
            if fl is None:
                cols[f"att_{name}"] = _share(hit, None)
            else:
                cols[f"att_{name}_clean"] = _share(hit, ~fl)
                cols[f"att_{name}_flipped"] = _share(hit, fl)
    if f_test is not None:
        ut = f_test * y_test
        cols["test_acc"] = _share(ut > 0, None)
        cols["test_loss"] = loss(ut).to(torch.float64).mean(-1)
        if roles is not None:
            cols["test_att_signal"] = _share(roles[top_test] == 0, None)
    return cols


def _codes(roles) -> np.ndarray:
    """``roles`` as (T,) int codes into ROLES (names accepted); ValueError otherwise."""
    r = np.asarray(roles)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"roles must be a (T,) array of role codes 0..{len(ROLES) - 1} or names "
                         f"{ROLES}; got shape {r.shape}")
    if r.dtype.kind in "US":
        bad = sorted({str(x) for x in r if str(x) not in ROLES})
        if bad:
            raise ValueError(f"roles: unknown role names {bad}; expected names in {ROLES}")
        return np.array([ROLES.index(str(x)) for x in r], dtype=np.int64)
    if r.dtype.kind not in "iu" or r.min() < 0 or r.max() >= len(ROLES):
        raise ValueError(f"roles must be integer codes 0..{len(ROLES) - 1} ({', '.join(ROLES)}); "
                         f"got {r.tolist()}")
    return r.astype(np.int64)


class Generalisation:
    """A metric for ``train(..., metrics=[...])``: the columns of the module docstring.

    test:    TokenData (m, T, d) or batched (B, m, T, d), the held-out set with clean labels
             (one label per sequence), or None (no test columns). Its head v, if absent, is
             the training data's.
    flipped: (n,) or (B, n) bool, the training samples whose label was flipped, or None.
    roles:   (T,) the role of each token position (codes into ``ROLES`` or their names), or
             None (no attention columns).
    At least one of the three. Shapes are checked against the training data when the run
    starts (before any work): a ValueError naming the argument.
    """

    def __init__(self, test=None, flipped=None, roles=None):
        if test is None and flipped is None and roles is None:
            raise ValueError("Generalisation needs at least one of test, flipped, roles")
        if test is not None and not isinstance(test, TokenData):
            raise ValueError(f"test must be a TokenData (the held-out set) or None; got "
                             f"{type(test).__name__}")
        if flipped is not None:
            fl = np.asarray(flipped)
            if fl.dtype != bool or fl.ndim not in (1, 2):
                raise ValueError(f"flipped must be a (n,) or (B, n) bool array; got dtype "
                                 f"{fl.dtype}, shape {fl.shape}")
            flipped = fl
        self.test, self.flipped = test, flipped
        self.roles = None if roles is None else _codes(roles)

    @classmethod
    def of(cls, data) -> Generalisation:
        """The metric of an :class:`attnsvm.benign.NoisyLabels` (its test set, flips, roles)."""
        return cls(test=data.test, flipped=data.flipped, roles=data.roles)

    def __repr__(self) -> str:
        parts = [k for k in ("test", "flipped", "roles") if getattr(self, k) is not None]
        return f"Generalisation({', '.join(parts)})"

    def take(self, a: int, b: int, B: int) -> Generalisation:
        """The metric of trials a..b-1 of a run of B trials (per-trial arrays sliced)."""
        test = self.test
        if test is not None and test.batched and test.B == B and B > 1:
            test = TokenData(X=test.X[a:b], y=test.y[a:b], z=None if test.z is None else test.z[a:b],
                             v=None if test.v is None or test.v.ndim == 1 else test.v[a:b],
                             mask=None if test.mask is None else test.mask[a:b])
        fl = self.flipped
        if fl is not None and fl.ndim == 2 and fl.shape[0] == B and B > 1:
            fl = fl[a:b]
        return Generalisation(test, fl, self.roles)

    def bind(self, model, tdata: dict, lossf, B: int):
        """Checked against the run (model, prepared training data, loss, B trials):
        returns ``cols(params) -> {name: (B,) tensor}``."""
        import torch

        X = tdata["X"]
        Bx, n, T, d = X.shape
        if model.queries_per_sequence(tdata) != 1 or tdata["y"].ndim != 2:
            raise ValueError("metrics: Generalisation needs one query and one label per sequence "
                             "(y of shape (n,)); this run has one per token")
        if lossf is None:
            raise ValueError("metrics: Generalisation needs the run's loss (this model has none)")
        dev, dt = X.device, X.dtype
        fl = None
        if self.flipped is not None:
            if self.flipped.shape not in ((n,), (B, n)):
                raise ValueError(f"metrics: flipped must have shape (n,) = ({n},) or (B, n) = "
                                 f"({B}, {n}); got {self.flipped.shape}")
            fl = torch.as_tensor(self.flipped, device=dev)
        roles = None
        if self.roles is not None:
            if self.roles.shape != (T,):
                raise ValueError(f"metrics: roles must have shape (T,) = ({T},); got "
                                 f"{self.roles.shape}")
            roles = torch.as_tensor(self.roles, device=dev)
        ttest = None
        if self.test is not None:
            t = self.test
            tB = t.B if t.batched else 1
            if t.T != T or t.d != d or tB not in (1, B) or t.y.ndim != (2 if t.batched else 1):
                raise ValueError(f"metrics: test must have T = {T}, d = {d}, one label per "
                                 f"sequence and 1 or B = {B} datasets; got X {t.X.shape}, y "
                                 f"{t.y.shape}")
            if t.v is None and tdata.get("v") is not None:
                v = tdata["v"].detach().cpu().numpy()
                t = TokenData(X=t.X, y=t.y, z=t.z, mask=t.mask,
                              v=v if (t.batched or v.shape[0] > 1) else v[0])
            ttest = model.prepare(t, device=dev, dtype=dt)
        loss = lossf.value

        def cols(params) -> dict:
            with torch.no_grad():
                f, _, s = model._forward(params, tdata)  # (B, n, 1), ., (B, n, 1, T)
                top = s[:, :, 0].argmax(-1) if roles is not None else None
                ft = tt = yt = None
                if ttest is not None:
                    ft, _, st = model._forward(params, ttest)
                    ft = ft[:, :, 0]
                    tt = st[:, :, 0].argmax(-1) if roles is not None else None
                    yt = ttest["y"]
                return columns(f[:, :, 0], top, tdata["y"], loss, fl, roles, ft, tt, yt)

        return cols
