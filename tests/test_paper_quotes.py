"""Every paper claim quotes its paper: the quoted sentence appears in the stored excerpt of the
paper version CITATION.cff cites (tests/data/paper_excerpts/<paper>.txt), so a mis-quote, a
sentence from another version or an unmarked elision fails here.

A quote may hold editorial brackets: ``[p_mm]`` stands for mathematics the stored text renders
otherwise (or lost in extraction) and ``[...]`` marks left-out text; the parts between them
must appear in the excerpt, in order.  Comparison is after Unicode NFKC (ligatures), with
typographic quotes and dashes made ASCII and whitespace collapsed; nothing else is forgiven.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from attnsvm.experiments import PAPERS, registry
from attnsvm.experiments.base import paper_key

ROOT = Path(__file__).resolve().parents[1]
EXCERPTS = Path(__file__).parent / "data" / "paper_excerpts"
_TYPO = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
         "\u2014": "-", "\u2212": "-", "\u00a0": " "}
MIN_TEXT = 40  # a quote must hold at least this many characters of the paper's own text


def normalise(text: str) -> str:
    """NFKC, ASCII quotes and dashes, single spaces."""
    text = unicodedata.normalize("NFKC", text)
    for a, b in _TYPO.items():
        text = text.replace(a, b)
    return re.sub(r"\s+", " ", text).strip()


def fragments(quote: str) -> list[str]:
    """The quote's own words: the parts between editorial brackets ``[...]``."""
    return [f.strip() for f in re.split(r"\[[^\]]*\]", normalise(quote)) if f.strip()]


def excerpt(paper: str) -> str:
    """The stored excerpt of ``paper`` (a key of PAPERS), '#' lines left out."""
    lines = (EXCERPTS / f"{paper}.txt").read_text(encoding="utf-8").splitlines()
    return normalise(" ".join(ln for ln in lines if not ln.startswith("#")))


def quoted_in(quote: str, text: str) -> bool:
    """True when every fragment of ``quote`` appears in ``text``, in order, and the fragments
    hold at least MIN_TEXT characters."""
    frs = fragments(quote)
    if sum(map(len, frs)) < MIN_TEXT:
        return False
    at = 0
    for f in frs:
        i = text.find(f, at)
        if i < 0:
            return False
        at = i + len(f)
    return True


def _claims():
    out = []
    for name, exp in registry().items():
        for v in exp.verdicts:
            if v.kind == "claim":
                out.append(pytest.param(paper_key(name), v, id=f"{name}:{v.text[:40]}"))
    return out


@pytest.mark.parametrize("paper, claim", _claims())
def test_every_claim_quotes_the_cited_paper_version(paper, claim):
    assert (EXCERPTS / f"{paper}.txt").exists(), f"no stored excerpt of the paper {paper!r}"
    assert quoted_in(claim.quote, excerpt(paper)), (
        f"the quote of {claim.text!r} is not in tests/data/paper_excerpts/{paper}.txt:\n"
        + "\n".join(f for f in fragments(claim.quote) if f not in excerpt(paper)))


def test_every_excerpt_names_a_version_citation_cff_cites():
    cited = set(re.findall(r"arXiv:(\d{4}\.\d{4,5})", (ROOT / "CITATION.cff").read_text()))
    files = sorted(EXCERPTS.glob("*.txt"))
    assert {f.stem for f in files} <= set(PAPERS)
    for f in files:
        header = " ".join(ln for ln in f.read_text(encoding="utf-8").splitlines()
                          if ln.startswith("#"))
        assert set(re.findall(r"arXiv:(\d{4}\.\d{4,5})", header)) & cited, f.name
    papers_with_claims = {p.values[0] for p in _claims()}
    assert papers_with_claims <= {f.stem for f in files}


def test_the_check_fails_on_planted_misquotes():
    """Calibration: the check finds a real quote and rejects each kind of mis-quote."""
    ntp, mmts = excerpt("ntp"), excerpt("mmts")
    real = ("We prove that gradient descent implicitly discovers the strongly-connected "
            "components (SCC) of this graph")
    assert quoted_in(real, ntp)
    # one word changed
    assert not quoted_in(real.replace("implicitly", "explicitly"), ntp)
    # a sentence of another version of the abstract (the ntp-local quote)
    assert not quoted_in("We empirically and theoretically demonstrate that superposition of "
                         "these components can accurately predict the implicit bias of gradient "
                         "descent in next-token prediction.", ntp)
    # two sentences that are not adjacent, joined without "[...]"; with it they pass
    a = "(2) Soft composition: It then creates a convex combination of the high-priority tokens"
    b = "Our theory relies on decomposing the model weights into a directional component"
    assert not quoted_in(a + " " + b, ntp) and quoted_in(a + " [...] " + b, ntp)
    # the right sentence from the wrong paper
    assert not quoted_in(real, mmts)
    # order matters, and brackets cannot stand in for the whole quote
    assert not quoted_in(b + " [...] " + a, ntp)
    assert not quoted_in("[We prove that] (SCC)", ntp)


def test_normalise_forgives_typography_only():
    assert normalise("\ufb01nite \u2013 the \u201cSVM\u201d\u2019s\n  rows") == 'finite - the "SVM"\'s rows'
    assert quoted_in("we observe that softmax saturates [...] and we observe that the selected "
                     "tokens almost always converges", excerpt("mmts"))


def test_paper_key_reads_the_longest_registered_prefix():
    assert paper_key("benign-magen") == "benign_magen" and paper_key("benign-sakamoto") == "benign"
    assert paper_key("mmts-fig4") == "mmts" and paper_key("nothing-here") == "nothing"
    assert "Single-Head" in PAPERS[paper_key("benign-magen")]
