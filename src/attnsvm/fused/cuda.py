"""The fused engine on a CUDA device: the CPU engine's per-trial step loop
(:func:`attnsvm.fused.kernels._trial_run`, the same Python definition) compiled by
numba-cuda as a device function, one thread per trial, one launch per segment (all the
steps between two records) of a block of trials (imported only when numba-cuda is).

Layout (trial-minor): every per-trial array lives on the device as (size, B) (a trial's
vector is a column, strided by B), so that the 32 threads of a warp, running 32
consecutive trials through the same instruction, read 32 consecutive float64 (one
coalesced load) wherever the per-trial code reads ``x[o + i]``. The data (X, Z, gamma,
...) are copied in that layout once per run; the parameters' slots are torch tensors
(s, B) on the device (:class:`CudaPlan` hands out (B, ...) views of them);
the kernel's scratch (the CPU drivers' ``_scratch``, the parameters' three working copies
P, G, N) is one workspace (rows, block) of the device, allocated once per run for a block
of trials sized to the device's memory; a run of B trials is launched block by block.
Scalars and tiny per-thread arrays (ls, gm, out) are thread-local. The first launch
compiles the kernel (about a minute; numba-cuda's disk cache afterwards).

Without a GPU: the simulator (NUMBA_ENABLE_CUDASIM=1) runs :func:`segment` in Python with
the CPU build of ``_trial_run`` (:func:`_run_trial`), and ``numba.cuda.compile_ptx``
compiles the real thing with NVVM alone (tests/test_fused_cuda.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import config, cuda, float64

from . import Plan
from . import kernels as K
from .codes import IC_D, IC_MODEL, W_MODEL
from .kernels import Scratch, TrialData, TrialState

__all__ = ["CudaPlan", "segment", "workspace_rows", "device_ok", "THREADS"]

#: threads per CUDA block (trials per block of the grid) for large launches (_threads)
THREADS = 128
#: the most device memory the workspace of one launch takes (bytes; further capped at a
#: quarter of the free memory): a run of more trials is launched block by block
WORKSPACE_BYTES = 16 << 30
SIM = bool(config.ENABLE_CUDASIM)  # NUMBA_ENABLE_CUDASIM=1: kernels run in Python


def device_ok() -> str | None:
    """None when numba-cuda sees a CUDA device, else why not (a short phrase)."""
    try:
        if cuda.is_available():
            return None
    except Exception as e:  # a broken driver install: say so, the torch engine runs
        return f"numba-cuda cannot use the CUDA driver ({e})"
    return "numba-cuda sees no usable CUDA device (driver or toolkit missing)"


def _load_registries() -> None:
    """Load numba-cuda's lazily imported registries now. numba-cuda 0.30 registers an
    overload of ``np.row_stack``, which numpy 2.5 removed; where it is missing the name is
    lent (as ``np.vstack``, its alias) for the time of these imports and taken back."""
    from numba.cuda.descriptor import cuda_target

    lent = not hasattr(np, "row_stack")
    if lent:
        np.row_stack = np.vstack
    try:
        cuda_target.target_context.refresh()
        cuda_target.typing_context.refresh()
    finally:
        if lent:
            del np.row_stack


if not SIM:
    _load_registries()

if SIM:  # the simulator hands kernels wrapped (and here strided) arrays
    from numba.cuda.simulator.cudadrv.devicearray import (
        FakeCUDAArray,
        FakeWithinKernelCUDAArray,
    )

    def _numpy(a):
        """The numpy array under the simulator's wrappers."""
        if isinstance(a, FakeWithinKernelCUDAArray):
            a = a._item
        if isinstance(a, FakeCUDAArray):
            a = a._ary
        return a

    def _run_trial(*args):
        """kernels._trial_run in the simulator: the CPU build of the same function, on
        contiguous copies of the thread's columns (the workspaces' fields too), written
        back after the call (its in-place semantics; the CPU build compiled for contiguous
        rows is reused)."""
        back = []

        def plain(a):
            if isinstance(a, tuple):  # a workspace: the same namedtuple of plain arrays
                return type(a)(*(plain(x) for x in a))
            a = _numpy(a)
            if not isinstance(a, np.ndarray):
                return a
            w = np.ascontiguousarray(a)
            if w is not a:
                back.append((a, w))
            return w

        K._trial_run(*(plain(a) for a in args))
        for a, w in back:
            a[...] = w
else:
    _run_trial = K._trial_run  # compiled by numba-cuda as a device function


def workspace_rows(ic, sP: int) -> np.ndarray:
    """The offsets of one trial's scratch arrays in its workspace column: the fields of
    ``kernels.Scratch`` (``kernels.scratch_sizes``), then P, G, N of its TrialState (21
    offsets; the last is the column's length)."""
    sizes = K.scratch_sizes(np.ascontiguousarray(ic, dtype=np.int64), int(sP)).tolist()
    sizes += [max(sP, 1)] * 3
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


@cuda.jit(device=True, inline=True)
def _col(A, b):
    """Column b of a trial-minor (k, B) array, or column 0 of a shared (k, 1) one."""
    return A[:, 0] if A.shape[1] == 1 else A[:, b]


@cuda.jit(device=True, inline=True)
def _rows(WS, wo, k, i):
    """Rows wo[k] .. wo[k+1]-1 of column i of the workspace: one array of the trial's."""
    return WS[wo[k]:wo[k + 1], i]


@cuda.jit(device=True, inline=True)
def _scratch(WS, wo, i):
    """The trial's Scratch: the first 17 arrays of its workspace column (workspace_rows)."""
    return Scratch(_rows(WS, wo, 0, i), _rows(WS, wo, 1, i), _rows(WS, wo, 2, i),
                   _rows(WS, wo, 3, i), _rows(WS, wo, 4, i), _rows(WS, wo, 5, i),
                   _rows(WS, wo, 6, i), _rows(WS, wo, 7, i), _rows(WS, wo, 8, i),
                   _rows(WS, wo, 9, i), _rows(WS, wo, 10, i), _rows(WS, wo, 11, i),
                   _rows(WS, wo, 12, i), _rows(WS, wo, 13, i), _rows(WS, wo, 14, i),
                   _rows(WS, wo, 15, i), _rows(WS, wo, 16, i))


@cuda.jit(cache=not SIM)
def segment(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, S0, S1, S2, so, WS, wo, t0, t1,
            active, stop_step, stop_code, capped, b0, nb):
    """Steps t0 .. t1-1 of trials b0 .. b0+nb-1 (thread i runs trial b0 + i, its scratch
    column i of WS (rows at offsets wo)): load the trial's parameters from the slots
    S0..S2 (s_k, B) (the W model's W as W^T, as kernels._load), run _trial_run on the
    trial's workspaces (kernels.TrialData, TrialState, Scratch: the CPU drivers' own),
    store them back, record its stop (kernels.run_steps)."""
    i = cuda.grid(1)
    if i >= nb:
        return
    b = b0 + i
    if not active[b]:
        return
    ls = cuda.local.array(3, float64)
    gm = cuda.local.array(3, float64)
    out = cuda.local.array(4, float64)
    for k in range(3):
        ls[k] = -math.inf
        gm[k] = 1.0
    P = _rows(WS, wo, 17, i)
    d = ic[IC_D]
    o1 = so[1]
    if ic[IC_MODEL] == W_MODEL:  # P holds W^T
        for a in range(d):
            for c in range(d):
                P[c * d + a] = S0[a * d + c, b]
    else:
        for x in range(o1):
            P[x] = S0[x, b]
    for x in range(so[2] - o1):
        P[o1 + x] = S1[x, b]
    for x in range(so[3] - so[2]):
        P[so[2] + x] = S2[x, b]
    dt = TrialData(_col(X, b), _col(Z, b), _col(gam, b), _col(gopt, b), _col(yl, b),
                   _col(w, b), _col(mask, b), Wf)
    st = TrialState(P, _rows(WS, wo, 18, i), _rows(WS, wo, 19, i), so, gm, ls)
    _run_trial(ic, fc, dt, st, _scratch(WS, wo, i), out, t0, t1)
    if ic[IC_MODEL] == W_MODEL:
        for a in range(d):
            for c in range(d):
                S0[a * d + c, b] = P[c * d + a]
    else:
        for x in range(o1):
            S0[x, b] = P[x]
    for x in range(so[2] - o1):
        S1[x, b] = P[o1 + x]
    for x in range(so[3] - so[2]):
        S2[x, b] = P[so[2] + x]
    capped[b] += out[3]
    if out[0] >= 0:
        active[b] = 0
        stop_step[b] = int(out[0])
        stop_code[b] = int(out[1])


# ------------------------------------------------------------------ the host side
def _threads(nb: int, dev) -> int:
    """Threads per CUDA block: THREADS, fewer (down to one warp) when the launch has too
    few trials to give every multiprocessor two blocks (a small B then still uses them all)."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    t = THREADS
    while t > 32 and nb < 2 * sms * t:
        t //= 2
    return t


def _to_kernel(t):
    """A torch tensor as the kernel's array: a zero-copy device view on CUDA
    (__cuda_array_interface__), the tensor's own numpy array in the simulator."""
    if isinstance(t, np.ndarray):
        return t
    return t.numpy() if t.device.type == "cpu" else cuda.as_cuda_array(t)


class CudaPlan(Plan):
    """:class:`attnsvm.fused.Plan` on a CUDA device (or the simulator, with CPU tensors):
    the same codes and slots, the data and the parameters' slots held trial-minor as
    torch tensors on the data's device; :meth:`run` launches :func:`segment` block by
    block. The rule must run in the kernel (``in_kernel``; the fused-gradient mode is
    CPU-only)."""

    engine = "fused-cuda"

    def __init__(self, model, tdata, lossf, optimizer, Q: int, B: int, check_stall: bool):
        self.dev = tdata["X"].device
        super().__init__(model, tdata, lossf, optimizer, Q, B, check_stall)
        for nm in ("X", "Z", "gam", "gopt", "yl", "w", "mask"):  # Plan's (1, 1) stand-ins
            a = getattr(self, nm)
            if isinstance(a, np.ndarray):
                setattr(self, nm, torch.from_numpy(np.ascontiguousarray(a.T)).to(self.dev))
        self.Wf = torch.from_numpy(self.Wf).to(self.dev)
        self._ic = torch.from_numpy(self.ic).to(self.dev)
        self._fc = torch.from_numpy(self.fc).to(self.dev)

    def _flat(self, t, dtype=np.float64):
        """A (B, ...) tensor as a trial-minor (prod(...), B) tensor on the plan's device."""
        td = torch.uint8 if dtype == np.uint8 else torch.float64
        t = torch.as_tensor(t) if not isinstance(t, torch.Tensor) else t.detach()
        return t.reshape(t.shape[0], -1).T.to(self.dev, td).contiguous()

    def load(self, params: dict, own: bool = False) -> dict:
        """Copy params into the trial-minor slots (always a copy: ``own`` is the CPU
        plan's); returns the params as views of the slots."""
        sz = [0, 0, 0]
        for nm, s in self.slots.items():
            sz[s] = int(np.prod(self.shapes[nm]))
        self._slots = [torch.zeros(k, self.B, dtype=torch.float64, device=self.dev) for k in sz]
        for nm, s in self.slots.items():
            self._slots[s].copy_(params[nm].detach().reshape(self.B, -1).T)
        so = np.zeros(4, dtype=np.int64)
        so[1:] = np.cumsum(sz)
        self.so = torch.from_numpy(so).to(self.dev)
        self.wo = workspace_rows(self.ic, int(so[3]))
        rows = int(self.wo[-1])
        cap = WORKSPACE_BYTES
        if self.dev.type == "cuda":
            cap = min(cap, torch.cuda.mem_get_info(self.dev)[0] // 4)
        nb = max(THREADS, (cap // (8 * rows)) // THREADS * THREADS)
        self.nb = min(nb, self.B)
        self.WS = torch.empty(rows, self.nb, dtype=torch.float64, device=self.dev)
        self._wo = torch.from_numpy(self.wo).to(self.dev)
        return self.params()

    def params(self) -> dict:
        """{name: (B, ...) tensor}: views of the trial-minor slots (on the device)."""
        return {nm: self._slots[s].T.view(self.B, *self.shapes[nm])
                for nm, s in self.slots.items()}

    def evaluate(self, params: dict, need_gap: bool):
        raise NotImplementedError("the CUDA engine runs in-kernel rules only (in_kernel)")

    def run(self, t0: int, t1: int, active: np.ndarray, stop_step: np.ndarray,
            stop_code: np.ndarray, records=None) -> None:
        """Steps t0 .. t1-1 of the rule on the device, in place on the slots; active /
        stop_step / stop_code (host arrays) are updated as :meth:`Plan.run` does. The
        metrics are not taken in this kernel (``records`` must be None): the trainer
        records between segments (attnsvm.train._train_one)."""
        if records is not None:
            raise ValueError("the CUDA engine takes no records inside its kernel")
        k = _to_kernel
        state = [torch.from_numpy(a).to(self.dev) for a in (active, stop_step, stop_code,
                                                             self.capped)]
        S = [k(s) for s in self._slots]
        args = [k(a) for a in (self._ic, self._fc, self.X, self.Z, self.gam, self.gopt,
                               self.yl, self.w, self.mask, self.Wf)]
        threads = 32 if SIM else _threads(self.nb, self.dev)
        for b0 in range(0, self.B, self.nb):
            nb = min(self.nb, self.B - b0)
            segment[(nb + threads - 1) // threads, threads](
                *args, S[0], S[1], S[2], k(self.so), k(self.WS), k(self._wo), int(t0), int(t1),
                *(k(a) for a in state), b0, nb)
        if self.dev.type == "cuda":
            cuda.synchronize()
        for a, t in zip((active, stop_step, stop_code, self.capped), state):
            a[:] = t.cpu().numpy()
