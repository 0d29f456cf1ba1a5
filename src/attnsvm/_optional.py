"""Optional compiled parts (numba kernels): imported on first use, remembered when missing."""

from __future__ import annotations

import importlib
from types import ModuleType


class OptionalImport:
    """``OptionalImport(".kernels", __package__)()`` is the module, imported on the first call,
    or None when it cannot be imported (numba missing or broken); ``.error`` keeps the
    ImportError for the message that says how to install it."""

    def __init__(self, name: str, package: str):
        self.name, self.package = name, package
        self.module: ModuleType | None = None
        self.error: ImportError | None = None

    def __call__(self) -> ModuleType | None:
        if self.module is None and self.error is None:
            try:
                self.module = importlib.import_module(self.name, self.package)
            except ImportError as exc:
                self.error = exc
        return self.module
