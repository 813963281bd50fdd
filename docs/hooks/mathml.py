"""mkdocs hook: the site's formulas as MathML, written at build time.

``pymdownx.arithmatex`` (generic mode) wraps every formula of the pages (``$...$``,
``$$...$$``, ``\\(...\\)``, ``\\[...\\]``) in ``<span class="arithmatex">`` or
``<div class="arithmatex">`` and leaves the LaTeX inside for a script to typeset in the
browser. This hook converts that LaTeX to MathML with ``latex2mathml`` instead, so the built
site shows its formulas with no script and no network: browsers render MathML natively, and
a page opened from disk (``file://``) looks the same as a served one. The wrapper element is
kept (the theme's ``.arithmatex`` style lets a wide display formula scroll). A formula that
does not convert is a build warning, which ``strict: true`` turns into a failed build.
"""

from __future__ import annotations

import html
import logging
import re

from latex2mathml.converter import convert

log = logging.getLogger("mkdocs.hooks.mathml")

#: a formula as arithmatex writes it: the wrapper tag (span: inline, div: display) and the
#: HTML-escaped LaTeX with its \( \) or \[ \] delimiters
FORMULA = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
#: latex2mathml keeps the backslash of ``\_`` inside ``\text{...}`` (KaTeX and MathJax drop it)
TEXT_UNDERSCORE = re.compile(r"\\text\{([^{}]*)\}")


def to_mathml(latex: str, display: bool) -> str:
    """One formula (without delimiters) as a ``<math>`` element."""
    latex = TEXT_UNDERSCORE.sub(lambda m: "\\text{" + m[1].replace("\\_", "_") + "}", latex)
    return convert(latex.strip(), display="block" if display else "inline")


def render_math(text: str, where: str = "") -> str:
    """``text`` (a page's HTML) with every arithmatex formula's LaTeX replaced by MathML."""
    def one(m: re.Match) -> str:
        tag, body = m[1], html.unescape(m[2]).strip()
        if body[:2] in ("\\(", "\\[") and body[-2:] in ("\\)", "\\]"):
            body = body[2:-2]
        try:
            math = to_mathml(body, display=tag == "div")
        except Exception as err:  # latex2mathml raises its own types, and IndexError
            log.warning("%s: formula %r does not convert to MathML (%s)", where, body, err)
            return m[0]
        return f'<{tag} class="arithmatex">{math}</{tag}>'

    return FORMULA.sub(one, text)


def on_page_content(html_text: str, page, config, files) -> str:
    """mkdocs event: a page's body once its Markdown is HTML."""
    return render_math(html_text, page.file.src_uri)
