"""Untrusted text made inert in Markdown: cell names, paths, claim statements and refusal reasons come from
files a user may not trust, and every report writes them into Markdown tables that are rendered to HTML."""

from __future__ import annotations

import html
import re

__all__ = ["md_code", "md_text"]


def md_code(text: object) -> str:
    """`text` as a Markdown code span no content can end: cell names and paths come from files a user may not trust.

    The fence is one backtick longer than the longest run inside (CommonMark),
    so a backtick in a crafted cell name cannot close the span and let raw
    HTML (``<img onerror=...>``) out; newlines become spaces and ``|`` is
    escaped so a table row stays one row.
    """
    body = " ".join(str(text).splitlines()).replace("|", "\\|")
    runs = [len(m) for m in re.findall(r"`+", body)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or runs else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_text(text: object) -> str:
    """Free text (a claim's statement, a refusal reason) as inert Markdown: no raw HTML, one table cell, one line.

    Backticks are kept (reasons and statements quote names as code); with
    ``<``, ``>`` and ``&`` escaped, a code span can show markup but never run it.
    """
    return html.escape(" ".join(str(text).splitlines()), quote=False).replace("|", "\\|")
