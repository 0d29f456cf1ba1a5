"""Optional compiled parts (numba kernels): imported on first use, remembered when missing.

numba is a core dependency (``pip install .`` installs it), so the compiled paths are there
by default. Where it cannot be imported (removed, or a build that does not load on this
platform), the first failed import emits one :class:`CompiledPathsWarning` for the whole
process that says what is lost and how to get it back; the plain torch / numpy paths then
compute the same results, more slowly.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

__all__ = ["OptionalImport", "CompiledPathsWarning", "LOST"]

#: what runs slower without numba (measured on 2 CPU cores, README "Benchmarks")
LOST = ("the fused training engine (training about 9x slower on the torch engine) and the "
        "compiled active-set SVM solver (a batch of 200 Frobenius SVMs about 1.4 s instead "
        "of 0.01 s on the IPM)")

_warned: list[bool] = []  # one warning per process, whichever kernel module fails first


class CompiledPathsWarning(UserWarning):
    """numba could not be imported: attnsvm runs its plain (slower) paths."""


def _warn_once(exc: ImportError) -> None:
    """Emit the one :class:`CompiledPathsWarning` of this process (later calls: nothing)."""
    if _warned:
        return
    _warned.append(True)
    warnings.warn(
        f"attnsvm: numba could not be imported ({exc}); the compiled paths are off: {LOST}. "
        f"Results are the same. To get them back: pip install 'numba>=0.59' (or reinstall "
        f"attnsvm, which depends on it).", CompiledPathsWarning, stacklevel=4)


class OptionalImport:
    """``OptionalImport(".kernels", __package__)()`` is the module, imported on the first call,
    or None when it cannot be imported (numba missing or broken); ``.error`` keeps the
    ImportError for the message that says how to install it. The first failure in the
    process emits one :class:`CompiledPathsWarning`."""

    def __init__(self, name: str, package: str):
        self.name, self.package = name, package
        self.module: ModuleType | None = None
        self.error: ImportError | None = None

    def __call__(self) -> ModuleType | None:
        if self.module is None and self.error is None:
            try:
                module = importlib.import_module(self.name, self.package)
            except ImportError as exc:
                self.error = exc
                _warn_once(exc)
            else:
                from .compiled import ensure  # an empty disk cache: compile visibly, now

                ensure(module.__name__)
                self.module = module
        return self.module
