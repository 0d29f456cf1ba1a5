"""mkdocs hooks (mkdocs.yml ``hooks:``).

- The docstrings cite names with Sphinx roles (``:func:`attnsvm.tokens.outcome```), which
  Markdown renders as ":func:" before the code: drop the role and keep the code, on every
  page of the site.
- Pages that include a README section (``--8<-- "README.md:..."``) carry the README's links
  relative to the repository root (``docs/theory.md``): make them relative to docs/."""

from __future__ import annotations

import re
from pathlib import Path

_README_DOCS_LINK = re.compile(r"\]\(docs/")
_README_SECTION = re.compile(r'^--8<-- "README\.md:(\w+)"$', flags=re.M)
_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|py:\w+):(?=<code>)")


def on_page_content(html: str, **kwargs) -> str:
    """The page's HTML with the Sphinx roles in front of inline code removed."""
    return _ROLE.sub("", html)


def _readme_section(match: re.Match) -> str:
    """The README's section between its ``--8<-- [start:NAME]`` / ``[end:NAME]`` markers,
    with its links into docs/ made relative to docs/ (the page lives there)."""
    name = match.group(1)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start, end = f"<!-- --8<-- [start:{name}] -->", f"<!-- --8<-- [end:{name}] -->"
    if start not in text or end not in text:
        raise ValueError(f"README.md has no section {name!r} (markers {start} ... {end})")
    return _README_DOCS_LINK.sub("](", text.split(start, 1)[1].split(end, 1)[0])


def on_page_markdown(markdown: str, **kwargs) -> str:
    """The page's Markdown with each README section it includes inlined here (before the
    snippets extension), its README-relative links into docs/ made docs-relative."""
    return _README_SECTION.sub(_readme_section, markdown)
