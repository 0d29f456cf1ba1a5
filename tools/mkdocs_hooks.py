"""mkdocs hook (mkdocs.yml ``hooks:``): the docstrings cite names with Sphinx roles
(``:func:`attnsvm.tokens.outcome```), which Markdown renders as ":func:" before the code.
Drop the role and keep the code, on every page of the site."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|py:\w+):(?=<code>)")


def on_page_content(html: str, **kwargs) -> str:
    """The page's HTML with the Sphinx roles in front of inline code removed."""
    return _ROLE.sub("", html)
