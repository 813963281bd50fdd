"""The docs site's formulas are MathML written at build time (docs/hooks/mathml.py), so the
built site needs no script and no network for its math. Needs the docs extra
(latex2mathml); ``make docs`` also checks the built theory page."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

pytest.importorskip("latex2mathml")

HOOK = Path(__file__).resolve().parents[1] / "docs" / "hooks" / "mathml.py"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("docs_mathml_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inline_and_display_formulas_become_mathml(hook):
    page = ('<p>a <span class="arithmatex">\\(x &lt; \\beta_c\\)</span> b</p>\n'
            '<div class="arithmatex">\\[\n\\frac{1}{2}\n\\]</div>')
    out = hook.render_math(page)
    assert out.count("<math") == 2 and "\\(" not in out and "\\[" not in out
    assert '<span class="arithmatex"><math' in out and 'display="inline"' in out
    assert '<div class="arithmatex"><math' in out and 'display="block"' in out
    assert "&#x003B2;" in out and "<mfrac>" in out  # beta, and the fraction
    assert "&#x0003C;" in out  # the escaped "<" read back as the operator


def test_text_underscore_loses_its_backslash(hook):
    out = hook.render_math('<span class="arithmatex">\\(\\text{tau\\_warmup}\\)</span>')
    assert "<mtext>tau_warmup</mtext>" in out


def test_a_formula_that_does_not_convert_is_a_warning(hook, monkeypatch, caplog):
    def broken(latex, display):
        raise ValueError("no")

    monkeypatch.setattr(hook, "to_mathml", broken)
    page = '<span class="arithmatex">\\(x\\)</span>'
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.mathml"):
        assert hook.render_math(page, "theory.md") == page
    assert "theory.md" in caplog.text and "does not convert" in caplog.text
