"""The reproduction gallery in headless Chromium: a stand-in gallery in the default suite (every
figure decodes from its relative path, no console error), the whole `--quick` gallery under
`slow` (issue 17 acceptance: <= 15 min on 2 cores, every check passing or an explained
"differs")."""

import json
import re
import subprocess
import sys
import time

import pytest

from sigprop.report import gallery
from sigprop.reproduce import core
from tests.reproduce.test_core import fake  # noqa: F401 - the stand-in registry fixture
from tests.test_report import _chromium

PROBE = ("<script>window.addEventListener('load',()=>{const im=[...document.images];"
         "document.body.setAttribute('data-probe',im.length+':'+im.filter(i=>i.complete&&"
         "i.naturalWidth>0).length+':'+document.querySelectorAll('div.card').length);});"
         "</script>")


def _render(exe, folder, tmp_path):
    """(images, decoded images, cards, console errors) of folder/index.html in Chromium; the
    probe goes into a copy next to the original so relative figure paths resolve."""
    page = (folder / "index.html").read_text(encoding="utf-8")
    probe = folder / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    p = subprocess.run([exe, "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", "--virtual-time-budget=20000",
                        "--enable-logging=stderr", "--v=0",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                        probe.as_uri()], capture_output=True, text=True, timeout=300)
    probe.unlink()
    assert p.returncode == 0, p.stderr[-2000:]
    m = re.search(r'data-probe="(\d+):(\d+):(\d+)"', p.stdout)
    assert m, p.stdout[:2000]
    console = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln
               or "Failed to load resource" in ln or "net::ERR" in ln]
    return (*map(int, m.groups()), console)


def test_stand_in_gallery_renders(fake, tmp_path):  # noqa: F811
    exe = _chromium()
    out = tmp_path / "g"
    rs = [core.run(n, catch=True) for n in fake]
    for r in rs:
        r.save(out)
    gallery.write_gallery(rs, out)
    n_img, n_ok, n_cards, console = _render(exe, out, tmp_path)
    assert (n_img, n_ok, n_cards) == (2, 2, 3)  # the error item has no figure
    assert not console, console


@pytest.mark.slow
def test_quick_gallery_acceptance(tmp_path):
    """`sigprop reproduce --all --quick --out DIR`: <= 15 min (900 s) on 2 cores, exit 0 (no
    failed check, no error), one figure per item, and the page renders with every figure."""
    exe = _chromium()
    out = tmp_path / "gallery"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sigprop", "reproduce", "--all", "--quick",
                        "--out", str(out), "--format", "json"], capture_output=True, text=True,
                       timeout=1800)
    wall = time.perf_counter() - t0
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    res = json.loads(p.stdout)["items"]
    statuses = {r["name"]: r["status"] for r in res}
    print(f"quick gallery: {len(res)} items in {wall:.0f} s; "
          + json.dumps({s: sum(v == s for v in statuses.values()) for s in core.STATUSES}))
    assert wall <= 900
    assert set(statuses.values()) <= {"pass", "differs"}, statuses
    assert len(res) == len(core.items())
    n_img, n_ok, n_cards, console = _render(exe, out, tmp_path)
    assert n_cards == len(res) and n_img == n_ok == len(res)
    assert not console, console
