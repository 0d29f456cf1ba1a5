"""Tracker: records per-layer, per-head SVM alignment of a model at the steps you choose.

At a recorded step the tracker runs the model on a fixed probe batch (eval mode, no
gradient; the training mode is restored), captures each self-attention module's input with a
forward pre-hook (hooks exist only during that forward pass), and computes
:func:`attnsvm.track.heads.analyse_call` for every head. Results accumulate in a tidy
DataFrame (``table``), a per-query table of selected tokens (``selections``) and, optionally,
the matrices (``matrices``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .extract import AttentionCall, _mha_weights_kwargs, find_attention, torch_mha
from .heads import TrackConfig, analyse_call

__all__ = ["Tracker", "track", "log_steps", "TRACKER_DEFAULT"]

# the tracker's default per-record work: 8 queries per head SVM and no random-selection SVMs
# (the rotation null costs no solve); light enough for the default time budget on rotary
# decoders (a full TrackConfig() record of a d = 128 rotary decoder costs ~8 000 training steps)
TRACKER_DEFAULT = TrackConfig(max_queries=8, null_draws=0)


def log_steps(last: int, n: int = 20, first: int = 0) -> list[int]:
    """About ``n`` distinct integer steps from ``first`` to ``last``, log-spaced (dense early,
    where attention changes fastest), always including both ends."""
    if last <= first:
        return [int(first)]
    g = np.unique(np.round(np.geomspace(1, last - first + 1, n)).astype(int) - 1 + first)
    return sorted({int(first), *map(int, g), int(last)})


def _forward(model, inputs):
    if callable(inputs) and not torch.is_tensor(inputs):
        return inputs(model)
    if isinstance(inputs, dict) or hasattr(inputs, "keys"):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


class Tracker:
    """Follow the attention heads of ``model`` against the max-margin SVM.

    Parameters
    ----------
    model:   any ``nn.Module`` whose self-attention modules have an extractor (built in:
             ``nn.MultiheadAttention``, HF BERT / RoBERTa / DistilBERT / GPT-2 / ViT).
    inputs:  the probe batch: a dict (``model(**inputs)``), a tuple (``model(*inputs)``), a
             tensor (``model(inputs)``) or a callable ``inputs(model)``. Same batch at every
             step, on the model's device.
    every / steps: record when ``step % every == 0`` or when ``step in steps``.
    budget:  neither given (the default schedule): record at the first call of :meth:`step`
             and then whenever the time spent recording is at most ``budget`` (default 0.05)
             of the wall time since that first call: the tracker's overhead stays near
             ``budget`` of the training time whatever the model and step cost (records land
             log-like: dense while recording is cheap relative to the elapsed time).
             Steps depend on timing; pass ``steps=log_steps(...)`` for reproducible ones.
             ``budget=None``: every call of :meth:`step` records.
    config:  :class:`~attnsvm.track.heads.TrackConfig` (SVM sizes, nulls, bias handling);
             default ``TRACKER_DEFAULT`` = TrackConfig(max_queries=8, null_draws=0) (pass
             ``config=TrackConfig()`` for 32 queries and 2 random-selection SVMs per head).
    modules, extractors: restrict to module names / supply extractors
             ({name or class: fn(module, args, kwargs) -> AttentionCall}).
    matrices: keep W, u, W_mm per (step, layer, head) in ``self.matrices`` (float64; d x d each).
    selections: keep the selected key of every valid query in ``self.selections``.
    out:     a directory: :meth:`save` (called on leaving the context manager and at the end
             of HF training) writes track.parquet and selections.parquet there.
    tags:    constant columns added to every row (e.g. optimizer="adamw", seed=0).

    Use: ``tr.step(step)`` in a loop (records if scheduled), ``tr.record(step)`` to force a
    record, ``with track(model, batch, every=100) as tr: ...``, or ``tr.callback()`` as a
    Hugging Face ``TrainerCallback``.
    """

    def __init__(self, model: torch.nn.Module, inputs=None, *, every: int | None = None,
                 steps: Iterable[int] | None = None, config: TrackConfig | None = None,
                 modules=None, extractors=None, matrices: bool = False,
                 selections: bool = True, out: str | Path | None = None, progress: Callable | None = None,
                 budget: float | None = 0.05, **tags):
        if every is not None and every < 1:
            raise ValueError(f"every must be >= 1; got {every}")
        if budget is not None and not 0 < budget <= 1:
            raise ValueError(f"budget must be in (0, 1] or None; got {budget}")
        self.budget = budget
        self._t0: float | None = None  # first step() call (budget schedule)
        self.spent = 0.0  # seconds spent recording
        self.model = model
        self.inputs = inputs
        self.every = every
        self.steps = None if steps is None else {int(s) for s in steps}
        self.config = config or TRACKER_DEFAULT
        self.keep_matrices = matrices
        self.keep_selections = selections
        self.out = None if out is None else Path(out)
        self.tags = tags
        self.progress = progress
        self.attention = find_attention(model, modules, extractors)  # fails early, naming modules
        self._rows: list[pd.DataFrame] = []
        self._sel: list[pd.DataFrame] = []
        self.matrices: dict = {}
        self._count = 0

    # ------------------------------------------------------------------ schedule
    def due(self, step: int) -> bool:
        """Whether ``step`` is a recording step."""
        if self.steps is not None:
            return int(step) in self.steps
        if self.every is not None:
            return int(step) % self.every == 0
        if self.budget is None or self._t0 is None or not self._rows:
            return True  # budget schedule: the first call records (the initialisation)
        return self.spent <= self.budget * (time.perf_counter() - self._t0)

    def step(self, step: int | None = None, **tags) -> pd.DataFrame | None:
        """Call once per training step (``step``: your counter; default an internal one).
        Records and returns that step's rows when it is due, else None."""
        s = self._count if step is None else int(step)
        self._count = s + 1
        if self._t0 is None:
            self._t0 = time.perf_counter()
        return self.record(s, **tags) if self.due(s) else None

    # ------------------------------------------------------------------ recording
    def capture(self, inputs=None) -> list:
        """Run the model once on ``inputs`` (default: the probe batch) and return
        [(name, AttentionCall)] for every tracked module, in model order."""
        inputs = self.inputs if inputs is None else inputs
        if inputs is None:
            raise ValueError("no probe inputs: pass inputs= to Tracker or to record()")
        got: dict[str, object] = {}
        handles = []

        def pre(name, ext):
            def hook(module, args, kwargs):
                if name not in got:  # first call only (a module reused in a loop: its first use)
                    call = ext(module, args, kwargs)
                    if not isinstance(call, AttentionCall):
                        raise ValueError(f"the extractor of {name!r} must return an AttentionCall; "
                                         f"got {type(call).__name__}")
                    got[name] = call.validate(f"extractor of {name!r}").detached()
            return hook

        def post(name):
            def hook(module, args, kwargs, output):
                call = got.get(name)
                if call is None or call.attn is not None or not isinstance(output, tuple):
                    return
                want = (call.hidden.shape[0], call.n_heads, call.hidden.shape[1],
                        call.key_tokens.shape[1])
                cands = [o for o in output[1:] if torch.is_tensor(o) and tuple(o.shape) == want]
                if cands:  # T5 also returns its position bias (1, H, T, S): shape tells apart
                    call.attn = cands[-1].detach()
            return hook

        was_training = self.model.training
        self.model.eval()
        restore = self._eager()
        try:
            for name, mod, ext in self.attention:
                if ext is torch_mha and self.config.check:
                    handles.append(mod.register_forward_pre_hook(_mha_weights_kwargs, with_kwargs=True))
                handles.append(mod.register_forward_pre_hook(pre(name, ext), with_kwargs=True))
                handles.append(mod.register_forward_hook(post(name), with_kwargs=True))
            with torch.no_grad():
                _forward(self.model, inputs)
            if len(got) < len(self.attention):
                # e.g. nn.TransformerEncoderLayer's inference fast path skips the attention module
                got.clear()
                with torch.enable_grad():
                    _forward(self.model, inputs)
        finally:
            for h in handles:
                h.remove()
            restore()
            self.model.train(was_training)
        missing = [n for n, _, _ in self.attention if n not in got]
        if missing:
            raise ValueError(f"attention module {missing[0]!r} was not called by the forward pass "
                             "on the probe inputs")
        return [(n, got[n]) for n, _, _ in self.attention]

    def _eager(self):
        """Switch a Hugging Face model to eager attention for the probe pass (so that its own
        attention probabilities are returned and every extraction is checked against them);
        returns the function restoring the user's implementation (SDPA, flash...)."""
        cfg = getattr(self.model, "config", None)
        impl = getattr(cfg, "_attn_implementation", None)
        setter = getattr(self.model, "set_attn_implementation", None)
        if not self.config.check or impl in (None, "eager") or setter is None:
            return lambda: None
        setter("eager")
        return lambda: setter(impl)

    def record(self, step: int | None = None, inputs=None, **tags) -> pd.DataFrame:
        """Record now (whatever the schedule); returns this step's rows (also kept in ``table``)."""
        t_start = time.perf_counter()
        s = self._count if step is None else int(step)
        tags = {**self.tags, **tags}
        frames, sels = [], []
        for layer, (name, call) in enumerate(self.capture(inputs)):
            rows, sel, mats = analyse_call(call, self.config, key=(s, layer),
                                           selections=self.keep_selections,
                                           matrices=self.keep_matrices, where=f"module {name!r}")
            f = pd.DataFrame(rows)
            f.insert(0, "module", name)
            f.insert(0, "layer", layer)
            frames.append(f)
            if sel is not None:
                sel.insert(0, "layer", layer)
                sels.append(sel)
            if mats:
                for h, m in mats.items():
                    self.matrices[(s, layer, h)] = m
            if self.progress:
                self.progress(f"step {s}: {name} done")
        tab = pd.concat(frames, ignore_index=True)
        tab.insert(0, "step", s)
        for k, v in tags.items():
            tab[k] = v
        self._rows.append(tab)
        if sels:
            sel = pd.concat(sels, ignore_index=True)
            sel.insert(0, "step", s)
            for k, v in tags.items():
                sel[k] = v
            self._sel.append(sel)
        self.spent += time.perf_counter() - t_start
        return tab

    # ------------------------------------------------------------------ results
    @property
    def table(self) -> pd.DataFrame:
        """One row per (step, layer, head): the columns of docs/tracking.md."""
        return pd.concat(self._rows, ignore_index=True) if self._rows else pd.DataFrame()

    @property
    def selections(self) -> pd.DataFrame:
        """One row per (step, layer, head, sequence, valid query): selected key, its probability,
        and whether the query entered the SVM."""
        return pd.concat(self._sel, ignore_index=True) if self._sel else pd.DataFrame()

    def save(self, out: str | Path | None = None) -> dict[str, Path]:
        """Write track.parquet (and selections.parquet) under ``out`` (default ``self.out``)."""
        out = Path(out) if out is not None else self.out
        if out is None:
            raise ValueError("save(): no output directory (pass out= here or to Tracker)")
        out.mkdir(parents=True, exist_ok=True)
        paths = {"table": out / "track.parquet"}
        self.table.to_parquet(paths["table"], index=False)
        if self._sel:
            paths["selections"] = out / "selections.parquet"
            self.selections.to_parquet(paths["selections"], index=False)
        return paths

    def callback(self):
        """A Hugging Face ``TrainerCallback``: records at step 0 (on_train_begin) and after every
        optimiser step that is due (``state.global_step``); saves at the end if ``out`` is set."""
        from transformers import TrainerCallback

        tracker = self

        class AlignmentCallback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                if tracker.due(state.global_step):
                    tracker.record(state.global_step)

            def on_step_end(self, args, state, control, **kw):
                tracker.step(state.global_step)

            def on_train_end(self, args, state, control, **kw):
                if tracker.out is not None:
                    tracker.save()

        return AlignmentCallback()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        if self.out is not None and self._rows and exc[0] is None:
            self.save()

    def __repr__(self) -> str:
        n = sum(len(f) for f in self._rows)
        return (f"Tracker({type(self.model).__name__}, {len(self.attention)} attention modules, "
                f"{len(self._rows)} records, {n} rows)")


@contextlib.contextmanager
def track(model, inputs=None, **kwargs):
    """``with track(model, batch, every=100, out="runs/x") as tr: ... tr.step(step)``;
    the table is written to ``out`` on leaving the block. Keyword arguments: see Tracker."""
    tr = Tracker(model, inputs, **kwargs)
    yield tr
    if tr.out is not None and tr._rows:
        tr.save()
