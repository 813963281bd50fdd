"""Terminal output at 80 columns (piped output falls back to 80): no line wider than the
terminal, no number cut with an ellipsis (issue 14)."""

import json

import pytest

from sigprop.cli import run
from sigprop.models.presets import PRESETS, shrink

CASES = [
    ["diagnose", "--seq-len", "128", "--seeds", "1", "--sequences", "1"],
    ["measure", "--depth", "4", "--d-model", "64", "--heads", "4", "--seq-len", "64",
     "--seeds", "3"],
    ["longctx", "--d-model", "64", "--heads", "4", "--seq-len", "64", "--lengths", "64,1024",
     "--queries", "32", "--compare"],
    ["diagram", "--depth", "60", "--grid", "32"],
    ["predict"],
    ["translate"],
    ["fix", "bert-deep-48", "--alpha-attn", "auto", "--seq-len", "32", "--seeds", "1",
     "--sequences", "1"],
    ["reproduce", "--list"],
    ["reproduce", "clpr25.thm23", "mindthegap.prop3", "deshpande26.eq12", "--size", "tiny"],
]


@pytest.mark.parametrize("argv", CASES, ids=[c[0] for c in CASES])
def test_tables_fit_80_columns(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "80")
    if argv[0] == "fix":  # the worked example's depth at a small width (same tables, faster)
        cfg = shrink(PRESETS["bert-deep-48"], layers=48, hidden=64, heads=4, intermediate=128,
                     vocab=200)
        (tmp_path / "deep48.json").write_text(json.dumps(cfg))
        argv = [argv[0], str(tmp_path / "deep48.json"), *argv[2:]]
    if argv[0] in ("fix", "reproduce") and "--list" not in argv:
        argv = [*argv, "--out", str(tmp_path / "fixed")]
    assert run(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) > 5
    wide = [ln for ln in lines if len(ln) > 80]
    assert not wide, "\n".join(wide)
    assert "…" not in out, out
