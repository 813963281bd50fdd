"""The self-contained HTML report: escaping, no external assets, and a render in headless
Chromium (Debian `chromium`; .ci/run installs it and sets SIGPROP_REQUIRE_CHROMIUM=1 so CI
cannot skip this)."""

import base64
import json
import os
import re
import shutil
import subprocess

import pytest

from sigprop import diagnose as dg
from sigprop.presets import PRESETS, shrink
from sigprop.report.html import render

EVIL = 'evil<script>alert("x")</script>&"'


@pytest.fixture(scope="module")
def diagnosis(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    folder = root / EVIL.replace("/", "_")  # a user-chosen folder name full of markup
    folder.mkdir()
    cfg = shrink(PRESETS["bert-base-uncased"], layers=3, hidden=64, heads=4,
                 intermediate=128, vocab=200)
    (folder / "config.json").write_text(json.dumps(cfg))
    return dg.diagnose(str(folder), seq_len=32, seeds=2, sequences=1)


def test_report_escapes_user_strings_and_is_self_contained(diagnosis):
    page = render(diagnosis, diagram_grid=24)
    assert "<script" not in page.lower()          # the folder name's markup is escaped
    assert "evil&lt;script&gt;alert(&quot;x&quot;)&lt;_script&gt;&amp;&quot;" in page
    srcs = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert len(srcs) == 3                          # depth curves, head heat map, diagram
    for s in srcs:
        assert s.startswith("data:image/png;base64,")
        png = base64.b64decode(s.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert not re.search(r"https?://", page)
    assert f'class="verdict {diagnosis.verdict}"' in page


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if os.environ.get("SIGPROP_REQUIRE_CHROMIUM") == "1":
        pytest.fail("chromium is required (SIGPROP_REQUIRE_CHROMIUM=1) but not installed")
    pytest.skip("chromium not installed (.ci/run installs the Debian package)")


def test_report_renders_in_headless_chromium(diagnosis, tmp_path):
    """Every image decodes (naturalWidth > 0, checked by a probe script appended to a copy of
    the page: the report itself has no scripts), no console error, no failed request."""
    exe = _chromium()
    page = render(diagnosis, diagram_grid=24)
    probe = ("<script>window.addEventListener('load',()=>{const im=[...document.images];"
             "document.body.setAttribute('data-probe',im.length+':'+im.filter(i=>i.complete&&"
             "i.naturalWidth>0).length+':'+document.querySelectorAll('table').length);});"
             "</script>")
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", probe + "</body>"), encoding="utf-8")
    p = subprocess.run([exe, "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", "--virtual-time-budget=10000", "--enable-logging=stderr",
                        "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                        path.as_uri()], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    m = re.search(r'data-probe="(\d+):(\d+):(\d+)"', p.stdout)
    assert m, p.stdout[:2000]
    n_img, n_ok, n_tab = map(int, m.groups())
    assert n_img == 3 and n_ok == 3
    assert n_tab >= 3
    console = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln
               or "Failed to load resource" in ln or "net::ERR" in ln]
    assert not console, console


def test_cli_diagnose_writes_report(tmp_path):
    import sys

    cfg = shrink(PRESETS["gpt2"], layers=2, hidden=64, heads=4, intermediate=128, vocab=200)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    out = tmp_path / "r.html"
    p = subprocess.run([sys.executable, "-m", "sigprop", "diagnose", str(tmp_path / "c.json"),
                        "--seq-len", "32", "--seeds", "1", "--format", "json", "--report",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
    bad = subprocess.run([sys.executable, "-m", "sigprop", "diagnose", str(tmp_path / "c.json"),
                          "--seq-len", "32", "--seeds", "1", "--report",
                          str(tmp_path / "no" / "such" / "dir" / "r.html")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--report" in bad.stderr and "Traceback" not in bad.stderr


def test_memory_refusal_is_one_clear_line(monkeypatch):
    """The pre-run estimate refuses a run that would not fit, suggesting a smaller size."""
    monkeypatch.setattr(dg, "available_memory", lambda: 64 * 2**20)  # pretend 64 MiB free
    from sigprop.spec import SpecError

    with pytest.raises(SpecError) as err:
        dg.diagnose("bert-base-uncased", seq_len=512, seeds=1, sequences=2)
    msg = str(err.value)
    assert "--seq-len 128" in msg and "--sequences 1" in msg and "GiB" in msg
    assert "\n" not in msg
