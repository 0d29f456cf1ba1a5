"""Library calls leave process-wide state alone (issue 31 item 2, issue 32 item 2): the
solvers (att_svm, att_svm_batch, graph_svm and graph_svm_batch in both norms) and the NTP
trainer called from 4 threads at once
give the answers they give alone, the caller's BLAS thread count and warnings filters are
the same during and after the calls, and a warning issued by another thread while they
run reaches the caller's filters (none is lost)."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from attnsvm.ntp import NTPModel, ntp_random
from attnsvm.optim import ngd
from attnsvm.svm import att_svm, att_svm_batch, graph_svm, graph_svm_batch
from attnsvm.train import train

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def _problems():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, 5, 4))
    z = rng.standard_normal((6, 4))
    Xb, zb = rng.standard_normal((5, 6, 5, 4)), rng.standard_normal((5, 6, 4))
    ab = rng.integers(0, 5, (5, 6))
    D = ntp_random(4, 6, 8, 8, seed=3)
    Ds = [ntp_random(4, 6, 8, 8, graph="cyclic", seed=s) for s in range(2)]

    def graph_batch(norm):
        return np.stack([s.W_ for s in graph_svm_batch(Ds, norm)])

    return {
        "att_svm": lambda: att_svm(X, z, np.zeros(6, int)).W_,
        "att_svm_batch": lambda: att_svm_batch(Xb, zb, ab).W_,
        "att_svm_batch_nuc": lambda: att_svm_batch(Xb[:2], zb[:2], ab[:2], norm="nuc").W_,
        "graph_fro": lambda: graph_svm(D.E, D.seqs, D.labels, "fro").W_,
        "graph_nuc": lambda: graph_svm(D.E, D.seqs, D.labels, "nuc").W_,
        "graph_batch_fro": lambda: graph_batch("fro"),
        "graph_batch_nuc": lambda: graph_batch("nuc"),
        "ntp_train": lambda: train(NTPModel(8), D, optimizer=ngd(0.1), steps=20, B=2).W,
    }


@pytest.mark.slow
def test_four_threads_same_answers_and_process_state_untouched():
    if not _blas():
        pytest.skip("no BLAS library that threadpoolctl can see")
    probs = _problems()
    alone = {k: f() for k, f in probs.items()}
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        blas0, filters0 = _blas(), list(warnings.filters)
        results, errors, seen = {}, [], []
        start, done = threading.Barrier(5), threading.Event()

        def worker(j):
            try:
                start.wait()
                for k, f in probs.items():
                    results[(j, k)] = f()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def watcher():  # the caller's state while the solves run
            start.wait()
            while not done.is_set():
                seen.append((_blas(), list(warnings.filters)))
                done.wait(0.01)

        threads = [threading.Thread(target=worker, args=(j,)) for j in range(4)]
        w = threading.Thread(target=watcher)
        for t in [*threads, w]:
            t.start()
        # a warning issued here while the solves run is not lost
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            n_warn = 0
            while any(t.is_alive() for t in threads):
                warnings.warn(f"caller {n_warn}", UserWarning, stacklevel=1)
                n_warn += 1
                threads[0].join(0.005)
        for t in threads:
            t.join()
        done.set()
        w.join()
        assert not errors, errors
        ours = [c for c in caught if str(c.message).startswith("caller ")]
        assert n_warn > 0 and len(ours) == n_warn
        assert seen and all(b == blas0 for b, _ in seen), "a solve changed the BLAS threads"
        ours_filter = [("always", None, Warning, None, 0), *filters0]  # this test's own block
        assert all(f in (filters0, ours_filter) for _, f in seen), "a solve changed the filters"
        assert _blas() == blas0
        assert list(warnings.filters) == filters0
    for (_, k), v in results.items():
        np.testing.assert_array_equal(v, alone[k], err_msg=k)
    assert len(results) == 4 * len(probs)


def test_hub_loads_leave_the_environment_alone():
    """Loading the shipped model's tokenizer and embeddings (ntp.from_text) sets no
    environment variable (HF_HUB_OFFLINE was set process-wide before; every load now
    passes local_files_only=True instead). Calibrated: a planted setdefault is seen."""
    import os

    from attnsvm.ntp import from_text

    def changed(before):
        keys = set(os.environ) | set(before)
        return {k for k in keys if before.get(k) != os.environ.get(k)}

    pytest.importorskip("transformers")
    before = dict(os.environ)
    data, ids = from_text("the cat sat on the mat and the cat sat on the hat", T=4)
    assert data.E.shape[0] == len(ids)
    assert not changed(before) - {"TORCHINDUCTOR_CACHE_DIR"}, changed(before)  # (torch's own)
    os.environ.setdefault("ATTNSVM_PLANTED_ENV", "1")  # the check sees a change
    try:
        assert "ATTNSVM_PLANTED_ENV" in changed(before)
    finally:
        del os.environ["ATTNSVM_PLANTED_ENV"]
