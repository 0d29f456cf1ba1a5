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
from .heads import TrackConfig, analyse_call, mask_unused

__all__ = ["Tracker", "track", "log_steps", "TRACKER_DEFAULT"]

# the tracker's default per-record work: 8 queries per head SVM and no random-selection SVMs
# (the rotation null costs no solve); light enough for the default time budget on rotary
# decoders (a full TrackConfig() record of a d = 128 rotary decoder costs ~8 000 training steps)
TRACKER_DEFAULT = TrackConfig(max_queries=8, null_draws=0)


def log_steps(last: int, n: int = 20, first: int = 0) -> list[int]:
    """About ``n`` distinct integer steps from ``first`` to ``last``, log-spaced (dense early,
    where attention changes fastest), always including both ends.

    ```pycon
    >>> from attnsvm.track import log_steps
    >>> log_steps(1000, 6)
    [0, 3, 15, 62, 250, 1000]

    ```
    """
    if last <= first:
        return [int(first)]
    g = np.unique(np.round(np.geomspace(1, last - first + 1, n)).astype(int) - 1 + first)
    return sorted({int(first), *map(int, g), int(last)})


_OPTIONS = ("inputs", "every", "steps", "config", "modules", "extractors", "matrices",
            "selections", "out", "progress", "budget", "tags")
# columns of the tracker's tables: a tag may not replace one
_RESERVED = {"step", "layer", "module", "head", "seq", "query", "key", "prob", "in_svm", "causal",
             "kind", "status", "feasible", "corr_mm", "recompute_err", "recompute_check"}


def _unknown_keywords(unknown: dict, where: str) -> str:
    import difflib

    parts = []
    for k in unknown:
        close = difflib.get_close_matches(k, _OPTIONS, n=1)
        parts.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (f"{where}: unknown keyword argument{'s' if len(parts) > 1 else ''} {', '.join(parts)}; "
            f"the options are {', '.join(_OPTIONS)}; constant columns go in tags={{...}}")


def _step_int(step, name: str) -> int:
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"{name} must be an integer >= 0; got {step!r}")
    return int(step)


def _steps(steps) -> set[int]:
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        raise ValueError(f"steps must be an iterable of integers >= 0 (e.g. log_steps(1000)); got {steps!r}")
    out = set()
    for v in steps:
        out.add(_step_int(v, "steps: each entry"))
    return out


def _check_tags(tags) -> dict:
    """``tags`` checked: a dict of column name (str) -> scalar (str, bool, int, float, None)."""
    if tags is None:
        return {}
    if not isinstance(tags, dict):
        raise ValueError(f"tags must be a dict of column name -> scalar; got {type(tags).__name__}")
    for k, v in tags.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"tags: column names must be non-empty strings; got {k!r}")
        if k in _RESERVED:
            raise ValueError(f"tags: {k!r} is a column of the tracker's table; choose another name")
        if not (v is None or isinstance(v, (str, bool, int, float, np.generic)) and np.ndim(v) == 0):
            raise ValueError(f"tags[{k!r}] must be a scalar (str, bool, int, float or None); got "
                             f"{type(v).__name__}")
    return dict(tags)


def _preflight(model, config: TrackConfig) -> None:
    """Refuse, naming the reason, what the probe pass cannot run on, before anything changes."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_meta:
            raise ValueError(f"model: {name!r} is on the meta device (not materialised: no values to "
                             "track); load the weights first (e.g. from_pretrained without a meta "
                             "device map, or to_empty() then load_state_dict())")
    cfg = getattr(model, "config", None)
    if (config.check and getattr(cfg, "reorder_and_upcast_attn", False)
            and any(p.dtype == torch.float64 for p in model.parameters())):
        raise ValueError(
            "model: GPT-2 with reorder_and_upcast_attn=True in float64: transformers' eager "
            "attention, which the recompute check compares with, fails in float64 under this "
            "option; run the model in float32, set config.reorder_and_upcast_attn=False (the same "
            "logits) or pass config=TrackConfig(check=False)")


def _configs(model) -> list:
    """Every Hugging Face config reachable from the model (its modules' and their sub-configs)."""
    seen, out = set(), []
    todo = [getattr(m, "config", None) for m in model.modules()]
    while todo:
        c = todo.pop()
        if c is None or id(c) in seen or not hasattr(c, "_attn_implementation_internal"):
            continue
        seen.add(id(c))
        out.append(c)
        todo.extend(getattr(c, k, None) for k in (getattr(c, "sub_configs", None) or {}))
    return out


def _eager(model, check: bool):
    """Switch the Hugging Face models in ``model`` (itself, or the outermost ones it wraps) to
    eager attention for the probe pass (so that their own attention probabilities are returned
    and every extraction is checked against them); returns the function restoring the user's
    implementation (SDPA, flash...): every config's attention implementation is written back as
    it was, without re-validating it (restoring through ``set_attn_implementation`` raises for
    flash attention where it is not installed)."""
    if not check:
        return lambda: None
    targets, taken = [], []
    for name, m in model.named_modules():
        if any(p == "" or name.startswith(p + ".") for p in taken):
            continue
        setter = getattr(m, "set_attn_implementation", None)
        impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
        if callable(setter) and hasattr(getattr(m, "config", None), "_attn_implementation_internal"):
            taken.append(name)
            if impl not in (None, "eager"):
                targets.append(setter)
    if not targets:
        return lambda: None
    saved = [(c, c._attn_implementation_internal) for c in _configs(model)]

    def restore():
        for c, v in saved:
            c._attn_implementation_internal = v

    try:
        for setter in targets:
            setter("eager")
    except BaseException:
        restore()
        raise
    return restore


def _swap_tensors(args, kwargs, swap: dict):
    """(args, kwargs) with the tensors whose id is in ``swap`` replaced (the pre-hook's way to
    hand the module the masked tokens); unchanged when none is found."""
    args = tuple(swap.get(id(a), a) if torch.is_tensor(a) else a for a in args)
    kwargs = {k: swap.get(id(v), v) if torch.is_tensor(v) else v for k, v in kwargs.items()}
    return args, kwargs


def _pattern_module(module, ext):
    """The submodule whose output is the attention probabilities (N, H, T, S), named by the
    extractor's ``pattern_from`` attribute (e.g. TransformerLens's ``hook_pattern``), or None."""
    name = getattr(ext, "pattern_from", None)
    if not name:
        return None
    try:
        return module.get_submodule(name)
    except AttributeError:
        raise ValueError(f"{type(module).__name__} has no submodule {name!r} (the extractor's "
                         "pattern_from)") from None


def _summary(rows: pd.DataFrame) -> dict[str, float]:
    """Per-layer summaries of one record's rows (see Tracker.summary)."""
    out = {}
    for layer, g in rows.groupby("layer", sort=True):
        L = int(layer)
        for col in ("corr_mm", "soft_sparsity", "wqk_norm"):
            if col in g:
                v = pd.to_numeric(g[col], errors="coerce").dropna()
                out[f"attnsvm/{col}/layer{L}"] = float(v.median()) if len(v) else float("nan")
        svm = "svm_solver" in g and bool((g["svm_solver"].fillna("") != "").any())
        out[f"attnsvm/certified/layer{L}"] = (float((g["status"] == "optimal").mean())
                                              if svm and "status" in g else float("nan"))
    return out


def _calling_trainer():
    """The ``transformers.Trainer`` whose callback handler is calling us (a few frames up), or
    None: the callback passes the tracker's summaries to ``Trainer.log``."""
    import sys

    try:
        from transformers import Trainer
    except ImportError:  # pragma: no cover
        return None
    f = sys._getframe(1)
    for _ in range(12):
        if f is None:
            return None
        obj = f.f_locals.get("self")
        if isinstance(obj, Trainer):
            return obj
        f = f.f_back
    return None


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

    Parameters (every one checked here, by name, before any work; an unknown keyword is a
    ValueError naming it: constant columns go in ``tags``)
    ----------
    model:   any ``nn.Module`` whose self-attention modules have an extractor (built in:
             ``nn.MultiheadAttention``, the Hugging Face families of ``SUPPORTED_MODEL_TYPES``,
             TransformerLens ``HookedTransformer``; see :mod:`attnsvm.track.extract`). Refused
             by name: parameters on the meta device; GPT-2's ``reorder_and_upcast_attn`` in
             float64 with the check on (transformers' eager path fails there).
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
             of HF / Lightning training) writes track.parquet and selections.parquet there.
    tags:    {column: scalar} constant columns added to every row (e.g.
             ``tags={"optimizer": "adamw", "seed": 0}``).

    Use: ``tr.step(step)`` in a loop (records if scheduled), ``tr.record(step)`` to force a
    record, ``with track(model, batch, every=100) as tr: ...``, ``tr.callback()`` (a Hugging
    Face ``TrainerCallback``) or ``tr.lightning_callback()``; then ``tr.table``,
    ``tr.summary()``, ``tr.plot()``, ``tr.to_tensorboard(writer)``, ``tr.save(dir)``.
    At a record the model runs once in eval mode under eager attention; its training mode and
    attention implementation are restored as they were, also when the pass raises.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import Tracker
    >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
    >>> tr = Tracker(mha, lambda m: m(x, x, x), every=10, tags={"seed": 0})
    >>> tab = tr.record(0)
    >>> tab[["step", "layer", "head", "seed"]].values.tolist()
    [[0, 0, 0, 0], [0, 0, 1, 0]]
    >>> Tracker(mha, evry=10)
    Traceback (most recent call last):
    ...
    ValueError: Tracker: unknown keyword argument 'evry' (did you mean 'every'?); the options are inputs, every, steps, config, modules, extractors, matrices, selections, out, progress, budget, tags; constant columns go in tags={...}

    ```
    """

    def __init__(self, model: torch.nn.Module, inputs=None, *, every: int | None = None,
                 steps: Iterable[int] | None = None, config: TrackConfig | None = None,
                 modules=None, extractors=None, matrices: bool = False,
                 selections: bool = True, out: str | Path | None = None, progress: Callable | None = None,
                 budget: float | None = 0.05, tags: dict | None = None, **unknown):
        if unknown:  # a misspelt option must not become a tag (issue 34: evry=10)
            raise ValueError(_unknown_keywords(unknown, "Tracker"))
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module; got {type(model).__name__}")
        if every is not None and (isinstance(every, bool) or not isinstance(every, (int, np.integer))
                                  or every < 1):
            raise ValueError(f"every must be an integer >= 1 or None; got {every!r}")
        if steps is not None:
            steps = _steps(steps)
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or not 0 < budget <= 1):
            raise ValueError(f"budget must be a number in (0, 1] or None; got {budget!r}")
        if not (inputs is None or callable(inputs) or torch.is_tensor(inputs)
                or isinstance(inputs, (dict, tuple, list)) or hasattr(inputs, "keys")):
            raise ValueError("inputs must be the probe batch: a dict, a tuple, a tensor, a callable "
                             f"inputs(model) or None; got {type(inputs).__name__}")
        if config is not None and not isinstance(config, TrackConfig):
            raise ValueError(f"config must be a TrackConfig or None; got {type(config).__name__}")
        for name, v in (("matrices", matrices), ("selections", selections)):
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False; got {v!r}")
        if out is not None and not isinstance(out, (str, Path)):
            raise ValueError(f"out must be a directory path (str or Path) or None; got {type(out).__name__}")
        if progress is not None and not callable(progress):
            raise ValueError(f"progress must be a callable (e.g. print) or None; got {type(progress).__name__}")
        if modules is not None and (isinstance(modules, str) or not all(isinstance(m, str) for m in modules)):
            raise ValueError(f"modules must be a list of module names (str) or None; got {modules!r}")
        if extractors is not None and not isinstance(extractors, dict):
            raise ValueError("extractors must be a dict {module name or class: extractor} or None; "
                             f"got {type(extractors).__name__}")
        for k, v in (extractors or {}).items():
            if not isinstance(k, (str, type)) or not callable(v):
                raise ValueError(f"extractors: each key must be a module name or a class and each value "
                                 f"a callable; got {k!r}: {type(v).__name__}")
        self.config = config or TRACKER_DEFAULT
        _preflight(model, self.config)  # refused by name before any change to the model
        self.budget = budget
        self._t0: float | None = None  # first step() call (budget schedule)
        self.spent = 0.0  # seconds spent recording
        self.model = model
        self.inputs = inputs
        self.every = None if every is None else int(every)
        self.steps = steps
        self.keep_matrices = bool(matrices)
        self.keep_selections = bool(selections)
        self.out = None if out is None else Path(out)
        self.tags = _check_tags(tags)
        self.progress = progress
        self.attention = find_attention(model, modules, extractors)  # fails early, naming modules
        self._rows: list[pd.DataFrame] = []
        self._sel: list[pd.DataFrame] = []
        self.matrices: dict = {}
        self._count = 0

    # ------------------------------------------------------------------ schedule
    def due(self, step: int) -> bool:
        """Whether ``step`` is a recording step.

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        >>> Tracker(mha, steps=[0, 10, 100]).due(10), Tracker(mha, every=3).due(10)
        (True, False)

        ```
        """
        if self.steps is not None:
            return int(step) in self.steps
        if self.every is not None:
            return int(step) % self.every == 0
        if self.budget is None or self._t0 is None or not self._rows:
            return True  # budget schedule: the first call records (the initialisation)
        return self.spent <= self.budget * (time.perf_counter() - self._t0)

    def step(self, step: int | None = None, tags: dict | None = None) -> pd.DataFrame | None:
        """Call once per training step (``step``: your counter; default an internal one).
        Records and returns that step's rows when it is due, else None (``tags``: extra
        constant columns for this record).

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
        >>> tr = Tracker(mha, lambda m: m(x, x, x), every=2)
        >>> [tr.step(s) is not None for s in range(4)]
        [True, False, True, False]

        ```
        """
        s = self._count if step is None else _step_int(step, "step")
        self._count = s + 1
        if self._t0 is None:
            self._t0 = time.perf_counter()
        return self.record(s, tags=tags) if self.due(s) else None

    # ------------------------------------------------------------------ recording
    def capture(self, inputs=None) -> list:
        """Run the model once on ``inputs`` (default: the probe batch) and return
        [(name, AttentionCall)] for every tracked module, in model order.

        The pass runs in eval mode under eager attention (a Hugging Face model's
        ``attn_implementation`` and its training mode are restored afterwards, whatever
        happens); token vectors that no valid query uses (padding) and that are not finite
        are set to 0 on entering each attention module (:func:`~attnsvm.track.heads.mask_unused`),
        so that an eager float64 pass (NaN rows for fully masked queries) leaves every valid
        position finite.

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
        >>> [(name, tuple(call.attn.shape)) for name, call in Tracker(mha, lambda m: m(x, x, x)).capture()]
        [('', (2, 2, 5, 5))]

        ```
        """
        inputs = self.inputs if inputs is None else inputs
        if inputs is None:
            raise ValueError("no probe inputs: pass inputs= to Tracker or to record()")
        _preflight(self.model, self.config)
        got: dict[str, object] = {}
        handles = []

        def pre(name, ext):
            def hook(module, args, kwargs):
                if name in got:  # first call only (a module reused in a loop: its first use)
                    return None
                raw = ext(module, args, kwargs)
                if not isinstance(raw, AttentionCall):
                    raise ValueError(f"the extractor of {name!r} must return an AttentionCall; "
                                     f"got {type(raw).__name__}")
                call = raw.validate(f"extractor of {name!r}").detached()
                clean = mask_unused(call)
                got[name] = clean
                if clean is call:
                    return None
                # the model's own pass must see the masked tokens too (its eager attention
                # multiplies NaN values of masked keys by 0 otherwise: NaN on every query)
                swap = {id(r): c for r, t, c in ((raw.hidden, call.hidden, clean.hidden),
                                                 (raw.keys, call.keys, clean.keys))
                        if r is not None and c is not t}
                return _swap_tensors(args, kwargs, swap)
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

        def pattern(name):
            def hook(module, args, output):
                call = got.get(name)
                if call is not None and call.attn is None and torch.is_tensor(output):
                    call.attn = output.detach()
            return hook

        was_training = self.model.training
        restore = _eager(self.model, self.config.check)
        try:
            self.model.eval()
            for name, mod, ext in self.attention:
                if ext is torch_mha and self.config.check:
                    handles.append(mod.register_forward_pre_hook(_mha_weights_kwargs, with_kwargs=True))
                handles.append(mod.register_forward_pre_hook(pre(name, ext), with_kwargs=True))
                handles.append(mod.register_forward_hook(post(name), with_kwargs=True))
                sub = _pattern_module(mod, ext)
                if sub is not None:
                    handles.append(sub.register_forward_hook(pattern(name)))
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

    def record(self, step: int | None = None, inputs=None, tags: dict | None = None) -> pd.DataFrame:
        """Record now (whatever the schedule); returns this step's rows (also kept in ``table``).
        ``tags``: extra constant columns for this record (added to the tracker's ``tags``).

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
        >>> tab = Tracker(mha, lambda m: m(x, x, x), tags={"run": "a"}).record(0)
        >>> len(tab), tab.run.iloc[0], tab.recompute_check.iloc[0], bool(tab.recompute_err.max() < 1e-12)
        (2, 'a', 'checked', True)

        ```
        """
        t_start = time.perf_counter()
        s = self._count if step is None else _step_int(step, "step")
        tags = {**self.tags, **_check_tags(tags)}
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
        clash = sorted(set(tags) & set(tab.columns))
        if clash:
            raise ValueError(f"tags: {clash[0]!r} is a column of the tracker's table; choose another name")
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

    def summary(self, step: int | None = None) -> dict[str, float]:
        """Per-layer summaries of one record (default the last): for each layer L,
        ``attnsvm/corr_mm/layerL`` (median corr(W, W_mm) over its heads),
        ``attnsvm/soft_sparsity/layerL`` (median soft sparsity), ``attnsvm/wqk_norm/layerL``
        (median ||W_h||_F) and ``attnsvm/certified/layerL`` (share of its heads whose SVM is
        certified optimal; NaN without SVMs). What the callbacks and :meth:`to_tensorboard` log.

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
        >>> tr = Tracker(mha, lambda m: m(x, x, x))
        >>> _ = tr.record(0)
        >>> sorted(tr.summary())
        ['attnsvm/certified/layer0', 'attnsvm/corr_mm/layer0', 'attnsvm/soft_sparsity/layer0', 'attnsvm/wqk_norm/layer0']

        ```
        """
        tab = self.table
        if tab.empty:
            raise ValueError("summary(): nothing recorded yet")
        steps = tab.step.unique()
        if step is None:
            step = int(tab.step.iloc[-1])
        elif _step_int(step, "step") not in set(steps.tolist()):
            raise ValueError(f"summary(): step {step} was not recorded; recorded: {sorted(steps.tolist())}")
        return _summary(tab[tab.step == int(step)])

    def to_tensorboard(self, writer, heads: bool = False) -> int:
        """Write :meth:`summary` of every recorded step to ``writer`` (a
        ``torch.utils.tensorboard.SummaryWriter``, or anything with ``add_scalar(tag, value,
        global_step)``) at that step; with ``heads=True`` also every head's corr_mm as
        ``attnsvm/corr_mm/layerL/headH``. Returns the number of scalars written (NaN values,
        e.g. corr_mm of an infeasible SVM, are skipped).

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> class Writer:                      # SummaryWriter's add_scalar, for the example
        ...     def __init__(self): self.scalars = []
        ...     def add_scalar(self, tag, value, global_step): self.scalars.append((tag, global_step))
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
        >>> tr = Tracker(mha, lambda m: m(x, x, x), steps=[0, 5])
        >>> for s in range(6): _ = tr.step(s)
        >>> w = Writer(); tr.to_tensorboard(w), sorted({s for _, s in w.scalars})
        (8, [0, 5])

        ```
        """
        add = getattr(writer, "add_scalar", None)
        if not callable(add):
            raise ValueError(f"writer must have add_scalar(tag, value, global_step) (a tensorboard "
                             f"SummaryWriter); got {type(writer).__name__}")
        n = 0
        tab = self.table
        for step, g in (tab.groupby("step", sort=True) if not tab.empty else ()):
            vals = dict(_summary(g))
            if heads and "corr_mm" in g:
                vals.update({f"attnsvm/corr_mm/layer{int(r.layer)}/head{int(r.head)}": float(r.corr_mm)
                             for r in g.itertuples()})
            for tag, v in vals.items():
                if np.isfinite(v):
                    add(tag, float(v), global_step=int(step))
                    n += 1
        flush = getattr(writer, "flush", None)
        if callable(flush):
            flush()
        return n

    def plot(self, metrics=("corr_mm", "soft_sparsity", "wqk_norm"), path=None, title: str = ""):
        """The tracker's figure (:func:`attnsvm.track.plot.plot_table`): one panel per metric,
        per layer its heads (thin) and their median (thick) against the step on a log axis
        (symlog: step 0 included), a legend naming each layer and its module. ``path``: also
        save it (PNG). Returns the matplotlib Figure.

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
        >>> tr = Tracker(mha, lambda m: m(x, x, x), steps=[0, 1, 10])
        >>> for s in range(11): _ = tr.step(s)
        >>> fig = tr.plot()
        >>> [ax.get_xscale() for ax in fig.axes], fig.axes[0].get_legend().get_title().get_text()
        (['symlog', 'symlog', 'symlog'], 'layer (module)')

        ```
        """
        from .plot import plot_table

        if self.table.empty:
            raise ValueError("plot(): nothing recorded yet")
        return plot_table(self.table, metrics, path=path, title=title)

    def callback(self):
        """A Hugging Face ``TrainerCallback``: records at step 0 (on_train_begin) and after every
        optimiser step that is due (``state.global_step``); each record's :meth:`summary` goes
        through ``Trainer.log``, so it lands in ``trainer.state.log_history`` and in every
        ``report_to`` backend (TensorBoard, W&B, ...; the Trainer prefixes ``train/``); saves
        at the end if ``out`` is set.

        ```pycon
        >>> import torch, transformers
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        >>> isinstance(Tracker(mha, every=10).callback(), transformers.TrainerCallback)
        True

        ```
        """
        from transformers import TrainerCallback

        tracker = self

        def log(state, rows):
            if rows is None:
                return
            logs = {k: v for k, v in _summary(rows).items() if np.isfinite(v)}
            trainer = _calling_trainer()
            if trainer is not None:
                trainer.log(logs)
            else:  # driven without a Trainer above us: keep the Trainer's record at least
                state.log_history.append({**logs, "step": state.global_step})

        class AlignmentCallback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                if tracker.due(state.global_step):
                    log(state, tracker.record(state.global_step))

            def on_step_end(self, args, state, control, **kw):
                log(state, tracker.step(state.global_step))

            def on_train_end(self, args, state, control, **kw):
                if tracker.out is not None:
                    tracker.save()

        return AlignmentCallback()

    def lightning_callback(self):
        """A Lightning ``Callback`` (``lightning.pytorch``, else ``pytorch_lightning``): records
        at the start of training when due and after every optimiser step that is due
        (``trainer.global_step``), sends each record's :meth:`summary` to every logger of the
        Trainer (``logger.log_metrics(summary, step)``), saves at the end if ``out`` is set.

        ```pycon
        >>> import torch
        >>> from attnsvm.track import Tracker
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        >>> type(Tracker(mha, every=10).lightning_callback()).__name__
        'AlignmentLightningCallback'

        ```
        """
        try:
            import lightning.pytorch as pl
        except ImportError:
            try:
                import pytorch_lightning as pl
            except ImportError:
                raise ImportError("lightning_callback() needs lightning (pip install lightning, or "
                                  "attnsvm[track])") from None
        tracker = self

        def log(trainer, rows):
            if rows is None:
                return
            logs = _summary(rows)
            step = int(rows.step.iloc[0])
            for lg in trainer.loggers:
                lg.log_metrics({k: v for k, v in logs.items() if np.isfinite(v)}, step=step)

        class AlignmentLightningCallback(pl.Callback):
            seen = None

            def on_train_start(self, trainer, pl_module):
                self.seen = trainer.global_step
                if tracker.due(trainer.global_step):
                    log(trainer, tracker.record(trainer.global_step))

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if trainer.global_step == self.seen:  # gradient accumulation: no optimiser step
                    return
                self.seen = trainer.global_step
                log(trainer, tracker.step(trainer.global_step))

            def on_train_end(self, trainer, pl_module):
                if tracker.out is not None:
                    tracker.save()

        return AlignmentLightningCallback()

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
    the table is written to ``out`` on leaving the block. Keyword arguments: see Tracker.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import track
    >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    >>> x = torch.randn(2, 5, 8, dtype=torch.float64)
    >>> with track(mha, lambda m: m(x, x, x), every=2) as tr:
    ...     for s in range(3): _ = tr.step(s)
    >>> sorted(tr.table.step.unique().tolist())
    [0, 2]

    ```
    """
    tr = Tracker(model, inputs, **kwargs)
    yield tr
    if tr.out is not None and tr._rows:
        tr.save()
