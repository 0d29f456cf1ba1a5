"""Every public function and class of attnsvm has a docstring (issue 23): the API reference
of the docs site is generated from them (mkdocstrings), so a missing one is a hole there.

Public means: the modules of the package whose dotted path has no part starting with "_"
(the command-line modules document themselves through ``--help`` and are left out, as are
the numba kernel modules and the registered experiment modules, each documented by its
``Experiment``'s title, claim and deviations), and in each, the names of its ``__all__``
(or, without one, the functions and classes it defines whose names do not start with
"_"), and for a class, its public methods and properties (an override inherits the
docstring of the method it overrides, as ``inspect.getdoc`` does).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import attnsvm

SKIP = ("attnsvm.cli", "attnsvm.fused.kernels")


def _is_experiment_module(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 3 and parts[1] == "experiments" and parts[2] != "base"


def public_modules() -> list[str]:
    out = ["attnsvm"]  # and the modules of attnsvm.__all__, found by the walk below
    for info in pkgutil.walk_packages(attnsvm.__path__, "attnsvm."):
        name = info.name
        if any(p.startswith("_") for p in name.split(".")[1:]) or name.startswith(SKIP):
            continue
        if _is_experiment_module(name):
            continue
        out.append(name)
    return out


def _public_names(mod) -> list[str]:
    names = getattr(mod, "__all__", None)
    if names is not None:
        return list(names)
    return [k for k, v in vars(mod).items() if not k.startswith("_")
            and (inspect.isfunction(v) or inspect.isclass(v))
            and getattr(v, "__module__", None) == mod.__name__]


def _members(cls):
    for a, v in vars(cls).items():
        if a.startswith("_"):
            continue
        f = v.fget if isinstance(v, property) else (
            v.__func__ if isinstance(v, (classmethod, staticmethod)) else v)
        if inspect.isfunction(f):
            yield a


def undocumented() -> list[str]:
    missing: list[str] = []
    for name in public_modules():
        mod = importlib.import_module(name)
        if not (mod.__doc__ or "").strip():
            missing.append(f"{name} (module)")
        for k in _public_names(mod):
            obj = getattr(mod, k, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # constants, registries, re-exported modules
            if not getattr(obj, "__module__", "").startswith("attnsvm"):
                continue  # re-exported from another library
            where = f"{obj.__module__}.{obj.__qualname__}"
            doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
            if not (doc or "").strip():
                missing.append(where)
            if inspect.isclass(obj):
                for a in _members(obj):
                    if not (inspect.getdoc(getattr(obj, a)) or "").strip() and \
                            not (inspect.getdoc(vars(obj)[a]) or "").strip():
                        missing.append(f"{where}.{a}")
    return sorted(set(missing))


def test_the_walk_sees_the_public_api():
    mods = public_modules()
    assert {"attnsvm.data", "attnsvm.train", "attnsvm.svm", "attnsvm.tokens",
            "attnsvm.track", "attnsvm.norms", "attnsvm.optim"} <= set(mods)
    assert not [m for m in mods if m.startswith("attnsvm.cli")]
    assert {f"attnsvm.{m}" for m in attnsvm._MODULES} <= set(mods)  # attnsvm.__all__


def test_every_public_function_and_class_has_a_docstring():
    missing = undocumented()
    assert not missing, (f"{len(missing)} public names without a docstring (state the "
                         f"formula and the shapes where it is mathematical):\n  "
                         + "\n  ".join(missing))


def test_the_walk_finds_a_missing_docstring(monkeypatch):
    def undocumented_helper(x):
        return x

    monkeypatch.setattr(attnsvm.tokens, "undocumented_helper", undocumented_helper,
                        raising=False)
    undocumented_helper.__module__ = "attnsvm.tokens"
    undocumented_helper.__qualname__ = "undocumented_helper"
    monkeypatch.setattr(attnsvm.tokens, "__all__", [*attnsvm.tokens.__all__,
                                                   "undocumented_helper"])
    assert "attnsvm.tokens.undocumented_helper" in undocumented()
