"""The compiled kernels (numba): compiled once, visibly, never timed as a solve.

attnsvm's compiled paths are three groups of numba kernels, each cached on disk by numba
(``cache=True``: next to the source in ``__pycache__``, or numba's user-wide cache where that
is not writable, or ``NUMBA_CACHE_DIR``):

| group | kernels | used by |
|---|---|---|
| fused | `attnsvm.fused.kernels` | training (`attnsvm.train.train`) |
| active | `attnsvm.svm._active_kernels` | the Frobenius SVMs, their certificates, the Farkas screen |
| nuclear | `attnsvm.svm._nuc_kernels` | the nuclear Graph-SVM (`attnsvm.svm.graph_svm`) |

Compiling them takes minutes, once per installation (``make install`` does it;
from a wheel, ``attnsvm warmup`` or :func:`warmup` does it). Where the disk cache of a
group is empty when a library call first needs it, that call logs one warning,
``compiling kernels (once, about N min)``, compiles the whole group on tiny problems (a
progress line on a terminal) and only then starts its own work: the time a certificate
reports (``Solution.time_``) never holds the compile.

Example (the kernels loaded from the cache, or compiled on the first run)::

    >>> import attnsvm
    >>> sorted(attnsvm.warmup(progress=False))
    ['active', 'fused', 'nuclear']
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time

from attnsvm.progress import Ticker

__all__ = ["GROUPS", "warmup", "is_cached", "ensure", "ensure_all"]

logger = logging.getLogger(__name__)

#: group -> (kernel module, what it is, minutes to compile on 2 idle CPU cores)
GROUPS = {
    "fused": ("attnsvm.fused.kernels", "the fused training engine", 1),
    "active": ("attnsvm.svm._active_kernels", "the active-set SVM solver", 2),
    "nuclear": ("attnsvm.svm._nuc_kernels", "the nuclear-norm kernel", 1),
}
#: group -> its warm-up, ``module:function`` (runs the kernels on tiny problems; returns
#: whether numba is available); named here, imported when run (no import cycle)
WARMUPS = {
    "fused": "attnsvm.fused:warmup",
    "active": "attnsvm.svm.lean:warmup",
    "nuclear": "attnsvm.svm.sdp:warmup_nuclear",
}
_BY_MODULE = {mod: g for g, (mod, _, _) in GROUPS.items()}

_lock = threading.RLock()
_done: set[str] = set()  # groups whose warm-up started in this process (under _lock)
_ready: set[str] = set()  # groups whose warm-up finished (read without the lock)


def _dispatchers(module) -> list:
    """The numba dispatchers of ``module`` that cache on disk."""
    try:
        from numba.core.caching import FunctionCache
        from numba.core.registry import CPUDispatcher
    except ImportError:  # pragma: no cover - numba missing: nothing compiled
        return []
    return [v for v in vars(module).values()
            if isinstance(v, CPUDispatcher) and isinstance(v._cache, FunctionCache)]


def is_cached(group: str) -> bool | None:
    """Whether numba's disk cache holds ``group``'s kernels for the current sources; None
    where numba cannot be imported. Reads numba's own index files only (compiles nothing).

    numba stamps a cache with its source file (modification time and size) and drops it
    when the file changes, so the kernels of one module are valid or stale together; a
    kernel that only other kernels call is compiled into them and has no index of its own.
    The group counts as cached when any of its kernels has a valid index: a compile of the
    group (:func:`warmup`, or the first call that needed it) wrote them all."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {sorted(GROUPS)}, got {group!r}")
    try:
        module = importlib.import_module(GROUPS[group][0])
    except ImportError:
        return None
    for f in _dispatchers(module):
        try:
            if f._cache._cache_file._load_index():  # numba's index: empty where stale
                return True
        except Exception:  # noqa: BLE001 - an unreadable index: numba recompiles
            continue
    return False


def _warm(group: str) -> bool:
    """Run ``group``'s kernels on tiny problems (compiles them, or loads them from the cache)."""
    module, _, function = WARMUPS[group].partition(":")
    return bool(getattr(importlib.import_module(module), function)())


def _run_group(group: str, progress: bool | None, stream) -> float | None:
    """Warm ``group`` (under the lock), with a progress line where asked; its seconds, or
    None where numba is missing."""
    with _lock:
        _done.add(group)
        try:
            return _warm_group(group, progress, stream)
        finally:
            _ready.add(group)


def _warm_group(group: str, progress: bool | None, stream) -> float | None:
    """The warm-up of ``group`` itself (:func:`_run_group` holds the lock); its line starts
    before anything is imported (numba, torch: seconds), so that nothing is silent."""
    what = GROUPS[group][1]
    show = (stream is not None) and (progress if progress is not None else stream.isatty())
    t0 = time.perf_counter()
    with Ticker(f"{what} (numba)", stream if show else None,
                live=show and stream.isatty()) as tick:
        cached = is_cached(group)
        if cached is None:
            tick.end("numba cannot be imported; the plain paths run instead")
            return None
        ok = _warm(group)
    seconds = time.perf_counter() - t0
    if ok:
        tick.end(f"{'loaded from the cache' if cached else 'compiled'} in {seconds:.1f} s")
    return seconds if ok else None


def warmup(progress: bool | None = None, stream=None) -> dict[str, float | None]:
    """Compile every numba kernel of attnsvm (or load it from numba's disk cache), one
    group after the other, each on tiny problems, so that no later call compiles.

    ``progress``: one line per group on ``stream`` (default ``sys.stderr``), rewritten each
    second on a terminal (None: on where ``stream`` is a terminal). Returns
    ``{group: seconds}`` (None for a group where numba cannot be imported). Run once per
    installation (``attnsvm warmup`` runs it; ``make install`` too); later runs load the
    kernels in about a second.

    >>> times = warmup(progress=False)
    >>> sorted(times) == sorted(GROUPS)
    True
    """
    stream = sys.stderr if stream is None else stream
    return {g: _run_group(g, progress, stream) for g in GROUPS}


def ensure(module_name: str) -> None:
    """Called once per kernel module when attnsvm first imports it: where numba's disk cache
    lacks the module's group, log ``compiling kernels (once, about N min)`` and compile the
    group now, before the caller's timer starts. Otherwise nothing (the kernels load from
    the cache as they are called)."""
    group = _BY_MODULE.get(module_name)
    if group is None or group in _ready:
        return
    with _lock:  # another thread compiling this group: wait for it
        if group in _done:  # finished, or this thread's own warm-up calling back
            return
        _done.add(group)
        if is_cached(group) is not False:
            _ready.add(group)
            return
        _, what, minutes = GROUPS[group]
        logger.warning("compiling kernels (once, about %d min): %s; `attnsvm warmup` "
                       "compiles them all ahead", minutes, what)
        t0 = time.perf_counter()
        _run_group(group, None, sys.stderr)
        logger.info("compiled %s in %.0f s", what, time.perf_counter() - t0)


def ensure_all() -> None:
    """:func:`ensure` for every group: where a group's cache is empty, compile it now (said
    in the log), before timed work (``attnsvm reproduce`` and ``attnsvm sweep`` call it,
    so that no experiment's seconds hold a compile). Reads the cache index only where the
    kernels are cached (milliseconds)."""
    for module, _, _ in GROUPS.values():
        ensure(module)
