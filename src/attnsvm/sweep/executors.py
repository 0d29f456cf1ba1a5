"""Where the cells run: in this process, a process pool, or a Dask cluster. Each task is
:func:`_execute` (never raises); results stream back as they finish."""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from attnsvm.experiments.base import Experiment

from .store import _check_table

__all__ = ["EXECUTORS", "SweepTerminated", "resolve_experiment"]

EXECUTORS = ("local", "processes", "dask")


def resolve_experiment(experiment: Experiment | str) -> Experiment:
    """An :class:`Experiment`, a registered name (``"mmts-fig4"``), or ``"module:ATTR"``
    (see :func:`attnsvm.experiments.resolve`)."""
    from attnsvm.experiments import resolve

    return resolve(experiment)


_THREADS_LIMITED = False


def _limit_threads() -> None:
    """One BLAS/OpenMP/torch thread per worker: parallel workers must not oversubscribe."""
    global _THREADS_LIMITED
    if _THREADS_LIMITED:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"  # read by torch / numpy when they are imported later
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    _THREADS_LIMITED = True


def _origin() -> tuple[str, int]:
    return socket.gethostname(), os.getpid()


def _execute(experiment: Any, cfg: dict, origin: tuple[str, int] | None = None
             ) -> tuple[str, Any, float]:
    """Run one cell; never raises (except KeyboardInterrupt and friends).

    Returns ``("done", tables, seconds)`` or ``("failed", traceback_text, seconds)``.
    ``experiment`` is an Experiment, its name, or cloudpickled bytes. Threads are
    limited to one when the task runs in another process than the sweep (``origin``).
    """
    if origin is not None and origin != _origin():
        _limit_threads()
    t0 = time.perf_counter()
    try:
        if isinstance(experiment, bytes):
            import cloudpickle

            experiment = cloudpickle.loads(experiment)
        exp = resolve_experiment(experiment)
        tables = exp.compute(dict(cfg))
        if not isinstance(tables, Mapping):
            raise TypeError(f"{exp.name}.compute returned {type(tables).__name__}, "
                            f"expected a dict of table name -> pandas.DataFrame")
        tables = dict(tables)
        for name, df in tables.items():
            _check_table(name, df)
        return "done", tables, time.perf_counter() - t0
    except Exception:  # noqa: BLE001 - one failing cell must not stop the sweep
        return "failed", traceback.format_exc(), time.perf_counter() - t0


def _pack(exp: Experiment) -> Any:
    """What a spawned worker receives: cloudpickle bytes when available (closures and
    notebook-defined functions travel too), else the object for plain pickling."""
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - cloudpickle ships with dask
        return exp
    return cloudpickle.dumps(exp)


def _run_local(exp: Experiment, jobs: list[tuple[str, dict]]) -> Iterator[tuple[str, tuple]]:
    for key, cfg in jobs:
        yield key, _execute(exp, cfg)


class SweepTerminated(KeyboardInterrupt):
    """SIGTERM reached a sweep running a process pool: raised in the sweep's thread so that
    its workers are stopped and the store's manifest is written (like Ctrl-C)."""


def _raise_terminated(signum, frame):  # noqa: ARG001 - the signal handler's signature
    raise SweepTerminated(f"terminated by signal {signum}")


def _catch_sigterm():
    """Make SIGTERM raise :class:`SweepTerminated` in the sweep's thread (when it is the main
    thread: only it receives signals), so the executor stops its workers and the sweep
    writes its manifest and says what resumes. Returns the previous handler, to restore
    with :func:`_restore_sigterm` (None: nothing was installed)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _restore_sigterm(previous) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _die_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """End this worker process as soon as the sweep's process ``parent`` is gone.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills the worker when the
    parent dies, SIGKILL included (strictly: when the parent's thread that started the
    worker exits; :func:`_run_processes` starts them from the sweep's thread, which outlives
    the pool). Everywhere, as a fallback: a daemon thread that polls ``os.getppid()`` and
    exits when the worker has been reparented. A worker whose parent died before this ran
    exits at once.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            PR_SET_PDEATHSIG = 1
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0))
        except (OSError, AttributeError):  # no prctl: the watchdog below still works
            pass
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    import threading

    threading.Thread(target=watch, name="attnsvm-parent-watchdog", daemon=True).start()


def _worker_init(parent: int) -> None:
    """Initializer of every process-pool worker: one thread, and die with the parent."""
    _limit_threads()
    _die_with_parent(parent)


def _run_processes(exp: Experiment, jobs: list[tuple[str, dict]], workers: int | None
                   ) -> Iterator[tuple[str, tuple]]:
    """Cells on a pool of spawned workers. No worker outlives the sweep: Ctrl-C, SIGTERM
    (handled while the pool runs, when the sweep runs in the main thread) and an
    exception terminate them; SIGKILL of this process ends them through
    :func:`_die_with_parent`."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    payload = _pack(exp)
    previous = _catch_sigterm()
    pool = ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1,
                               mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init, initargs=(os.getpid(),))
    clean = False
    try:
        futures = {pool.submit(_execute, payload, cfg, None): key for key, cfg in jobs}
        for fut in as_completed(futures):
            yield futures[fut], _future_outcome(fut)
        clean = True
    finally:
        if not clean:  # interrupted: do not wait for long cells that nobody will record
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=clean, cancel_futures=True)
        _restore_sigterm(previous)


def _future_outcome(fut: Any) -> tuple:
    try:
        return fut.result()
    except Exception:  # noqa: BLE001 - a dead worker fails its cell, not the sweep
        return "failed", "the worker running this cell died:\n" + traceback.format_exc(), 0.0


def _run_dask(exp: Experiment, jobs: list[tuple[str, dict]], executor: Any,
              address: str | None, workers: int | None) -> Iterator[tuple[str, tuple]]:
    """Cells on a Dask cluster. SIGTERM (in the main thread) raises
    :class:`SweepTerminated` as for the process pool: the pending tasks are cancelled, a
    LocalCluster this call started is closed, and the sweep records what finished."""
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = client = None
    own = False
    futures = []
    previous = _catch_sigterm()  # from the start: the cluster's start-up is stopped too
    try:
        if isinstance(executor, Client):
            client = executor
        elif address:
            client, own = Client(address), True
        else:
            cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1,
                                   threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client, own = Client(cluster), True
        token = uuid.uuid4().hex[:8]  # fresh task keys: never reuse results held by the cluster
        names = {f"attnsvm-sweep-{exp.name}-{key}-{token}": key for key, _ in jobs}
        futures = client.map(_execute, [exp] * len(jobs), [cfg for _, cfg in jobs],
                             [_origin()] * len(jobs), key=list(names))
        for fut in as_completed(futures):
            outcome = _future_outcome(fut)
            fut.release()
            yield names[fut.key], outcome
    finally:
        pending = [f for f in futures if not f.done()]
        if pending:
            client.cancel(pending)
        if own and client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
        _restore_sigterm(previous)
