"""docs/ stays consistent with the code: theory.md keeps the section numbers the
docstrings cite, every module, function and experiment the pages name exists, their
relative links resolve, and the example of docs/index.md runs."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
SRC = Path(__file__).resolve().parents[1] / "src" / "attnsvm"
PAGES = sorted(DOCS.glob("*.md"))
#: arrive with the tracking work (another branch); not yet in this checkout
PENDING: set[str] = set()  # pages or names documented ahead of their code (none now)

SECTIONS = ["1. Data", "2. Models", "3. Losses", "4. Token scores and optimality",
            "5. Max-margin problems", "6. Optimisers", "7. Metrics along a run",
            "8. Numerical stability", "9. Predictions the papers make",
            "10. Next-token prediction: the Graph-SVM",
            "11. The attention SVM of today's models (multi-head, grouped-query, rotary, T5, "
            "cross-attention)",
            "12. Label noise: benign and harmful overfitting of token selection"]


def test_theory_keeps_the_section_numbers_the_docstrings_cite():
    text = (DOCS / "theory.md").read_text()
    assert re.findall(r"^## (\d+\. .*)$", text, flags=re.M) == SECTIONS
    subsections = set(re.findall(r"^### (\d+\.\d+) ", text, flags=re.M))
    cited = set()
    for path in SRC.rglob("*.py"):
        for ref in re.findall(r"(?:THEORY(?:\.md)?|theory(?:\.md)?) (§[\d.,§ -]+)",
                              path.read_text()):
            cited |= set(re.findall(r"\d+(?:\.\d+)?", ref))
    for page in PAGES:
        cited |= set(re.findall(r"theory §(\d+(?:\.\d+)?)", page.read_text()))
        cited |= set(re.findall(r"§(\d+\.\d+)", page.read_text()))
    assert cited, "no citation found: the pattern is wrong"
    missing = {c for c in cited if ("." in c and c not in subsections)
               or ("." not in c and not 1 <= int(c) <= len(SECTIONS))}
    assert not missing, f"cited sections that docs/theory.md lacks: {sorted(missing)}"


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_name_and_link_a_page_mentions_exists(page):
    text = page.read_text()
    names = set(re.findall(r"`(attnsvm(?:\.\w+)+)", text))
    for name in sorted(names):
        if any(name == p or name.startswith(p + ".") for p in PENDING):
            continue
        _resolve(name)  # raises if the module or attribute is gone
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if target.startswith("http") or target in PENDING:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_experiments_named_in_theory_exist():
    from attnsvm.experiments import registry

    text = (DOCS / "theory.md").read_text()
    section9 = text[text.index("## 9."):]
    named = set(re.findall(r"`((?:mmts|tfsvm|rates|mirror|kqflow)-[\w-]+)`", section9))
    assert len(named) >= 10
    assert named <= set(registry()), named - set(registry())


def test_index_example_runs():
    text = (DOCS / "index.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]  # the page's first example
    assert "steps=2000, B=100" in code
    code = code.replace("steps=2000, B=100", "steps=20, B=4")  # the same calls, smaller
    ns: dict = {}
    exec(compile(code, "docs/index.md", "exec"), ns)
    assert ns["sol"].feasible_ and ns["run"].steps_run == 20


@pytest.mark.slow
def test_index_example_reads_as_the_page_says():
    """The home page's first example at its own size: every start reaches the LMM (corr
    0.9989); after 500 steps the same runs read 'other' (corr 0.988 < 0.99), as the page
    explains."""
    text = (DOCS / "index.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]  # the page's first example
    code = code.replace("print(", "(lambda *a: None)(")
    for steps, want in ((2000, "LMM 100 of 100"), (500, "other 100 of 100")):
        ns: dict = {}
        exec(compile(code.replace("steps=2000", f"steps={steps}"), "docs/index.md", "exec"), ns)
        line = ns["run"].outcome_line()
        assert want in line, (steps, line)
        assert f"outcome (fro SVM): {want}" in text or steps == 500
    assert "`other 100 of 100`" in text
