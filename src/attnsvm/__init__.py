"""attnsvm: max-margin token selection in attention, as software.

Training a softmax-attention layer by gradient descent converges in direction to
the solution of a hard-margin SVM that separates the tokens attention selects
from the rest (see docs/theory.md). This package trains many such models at once,
solves the matching max-margin problems with checkable certificates, and
reproduces the papers' experiments.
"""

__version__ = "0.1.0"

#: the public modules (``attnsvm.svm`` etc. import on first use: ``import attnsvm`` stays light)
_MODULES = ("data", "models", "losses", "optim", "norms", "train", "tokens", "scores",
            "metrics", "svm", "experiments", "sweep", "track", "plotting", "report", "chunks",
            "progress", "realdata", "fused", "ntp", "compiled")

__all__ = ["__version__", "single_thread", "kernel_threads", "warmup", *_MODULES]


def warmup(progress: bool | None = None) -> dict:
    """Compile every numba kernel once (or load it from numba's disk cache), with a progress
    line per group on a terminal; ``{group: seconds}``. See :func:`attnsvm.compiled.warmup`
    (``attnsvm warmup`` on the command line)."""
    from attnsvm.compiled import warmup as _warmup

    return _warmup(progress=progress)


def __getattr__(name: str):
    """``attnsvm.<module>`` for a public module not imported yet (PEP 562)."""
    if name == "single_thread":  # the opt-in BLAS limit (process-wide: attnsvm._parallel)
        from ._parallel import single_thread

        return single_thread
    if name == "kernel_threads":  # the compiled kernels' threads (context-local)
        from ._parallel import kernel_threads

        return kernel_threads
    if name in _MODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
