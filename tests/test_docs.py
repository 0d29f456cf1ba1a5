"""docs/extending.md is correct (issue 20 §5): every ``python`` block runs, in order, in one
fresh interpreter (its registrations then stay out of this process), and every file, test,
module and attribute the page names in backticks exists.

The docs site itself builds with ``mkdocs build --strict`` in CI (``make docs``); here,
what can drift without that build noticing is held: the examples are tutorials of the site,
and the snippets the site includes exist.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTENDING = ROOT / "docs" / "extending.md"
EXAMPLES = sorted((ROOT / "src" / "attnsvm" / "examples").glob("*.py"))


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_python_blocks_are_found():
    blocks = python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n```\n")
    assert blocks == ["a = 1\n", "b = 2\n"]


def test_extending_md_code_runs(tmp_path):
    blocks = python_blocks(EXTENDING.read_text())
    assert len(blocks) >= 4  # an optimiser, a norm (two), an experiment
    script = tmp_path / "extending_blocks.py"
    script.write_text("\n\n".join(f"# --- block {i}\n{b}" for i, b in enumerate(blocks)))
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.parametrize("page", ["ntp.md", "index.md"])
def test_guide_code_runs(page, tmp_path, monkeypatch):
    """The guides whose ``python`` blocks are complete programs (the NTP tutorial from raw
    token ids to a verdict, the home page's example) run, in order, in one namespace: a
    renamed function or a changed return fails here, not in a reader's session.  (The
    tracking guide's and the README's blocks are sketches around the reader's own model.)"""
    blocks = python_blocks((ROOT / "docs" / page).read_text())
    assert blocks
    monkeypatch.chdir(tmp_path)  # (the tutorial saves and loads a file)
    ns: dict = {"__name__": f"docs_{page}"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/{page} block {i}", "exec"), ns)  # noqa: S102


def _backticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", text))


def test_what_extending_md_names_exists():
    names = _backticked(EXTENDING.read_text())
    tests_src = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    for n in names:
        if re.fullmatch(r"(src|tests|docs|examples)/[\w/.<>-]+", n) and "<" not in n:
            assert (ROOT / n).exists(), f"docs/extending.md names {n}, which does not exist"
        elif re.fullmatch(r"test_\w+", n):
            assert f"def {n}(" in tests_src, f"docs/extending.md names the test {n}"
        elif re.fullmatch(r"attnsvm(\.\w+)+", n):
            _resolve(n)


def _resolve(dotted: str):
    """Import the longest module prefix of ``dotted`` and get the rest as attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for a in parts[i:]:
            assert hasattr(obj, a), f"docs/extending.md names {dotted}: no {a!r}"
            obj = getattr(obj, a)
        return obj
    pytest.fail(f"docs/extending.md names {dotted}, which does not import")


def test_the_check_of_named_things_can_fail():
    with pytest.raises(AssertionError, match="no 'not_there'"):
        _resolve("attnsvm.norms.not_there")


def test_every_example_is_a_tutorial_of_the_docs_site():
    """Each src/attnsvm/examples/*.py has a page in docs/tutorials that includes it and is in the site's
    navigation (and each tutorial includes an example that exists): the examples are the
    site's executed tutorials, run by tests/test_examples.py."""
    assert EXAMPLES
    nav = (ROOT / "mkdocs.yml").read_text()
    for ex in EXAMPLES:
        page = ROOT / "docs" / "tutorials" / f"{ex.stem}.md"
        assert page.is_file(), f"{ex.name} has no tutorial page {page.relative_to(ROOT)}"
        assert f'--8<-- "src/attnsvm/examples/{ex.name}"' in page.read_text()
        assert f"tutorials/{ex.stem}.md" in nav, f"{page.name} is not in mkdocs.yml's nav"
    for page in (ROOT / "docs" / "tutorials").glob("*.md"):
        for inc in re.findall(r'--8<-- "(src/attnsvm/examples/[^"]+)"', page.read_text()):
            assert (ROOT / inc).is_file(), f"{page.name} includes {inc}, which does not exist"


def test_the_snippets_the_site_includes_exist():
    for page in (ROOT / "docs").rglob("*.md"):
        for inc in re.findall(r'^--8<-- "([^"]+)"', page.read_text(), flags=re.M):
            path, _, section = inc.partition(":")
            text = (ROOT / path).read_text()
            if section:
                assert f"--8<-- [start:{section}]" in text and f"--8<-- [end:{section}]" in text, inc
