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

from sigprop.analysis import diagnose as dg
from sigprop.analysis.forward import vocab_at_init
from sigprop.models.presets import PRESETS, shrink
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
        assert s.startswith("data:image/svg+xml;base64,")
        svg = base64.b64decode(s.split(",", 1)[1]).decode("utf-8")
        assert "<svg" in svg[:2000] and len(svg) > 5000
    # links inside the SVGs are namespace declarations, not fetched assets
    assert not re.search(r"https?://(?!www\.w3\.org/)", page)
    assert f'class="verdict {diagnosis.verdict}"' in page


def test_report_records_command_version_and_sampling(diagnosis):
    page = render(diagnosis, diagram_grid=24, command="sigprop diagnose x --seeds 2")
    assert "<code>sigprop diagnose x --seeds 2</code>" in page
    from sigprop.cli.common import version

    assert f"sigprop {version()}" in page
    assert "2 seed(s) from 0 x 1 sequence(s)" in page
    assert "±" in page  # measured values carry their standard error in the per-layer table


def test_head_heatmap_has_a_fixed_scale_and_bounded_height():
    """Entropy on [0, 1] whatever the data (a fitted scale paints 0.995 vs 0.997 noise as
    structure), and a 48-layer model stays under 5.5 inches tall."""
    import pandas as pd

    from sigprop.plotting.heads import plot_head_heatmap

    rows = [{"layer": la, "head": h, "observable": "entropy", "value": 0.995 + 0.002 * (h % 2)}
            for la in range(1, 49) for h in range(12)]
    fig = plot_head_heatmap(pd.DataFrame(rows))
    norm = fig.axes[0].images[0].norm
    assert (norm.vmin, norm.vmax) == (0.0, 1.0)
    assert fig.get_figheight() <= 5.5


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


@pytest.mark.slow  # two diagnose subprocesses, ~19 s; make test-slow
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
    """The pre-run estimate refuses a run that would not fit, in one line naming the option
    and a smaller setting, and that setting does fit."""
    from sigprop.spec import SpecError

    monkeypatch.setattr(dg, "available_memory", lambda: 0.6 * 2**30)  # pretend 0.6 GiB free
    with pytest.raises(SpecError) as err:
        dg.diagnose("bert-base-uncased", seq_len=512, seeds=1, sequences=4)
    msg = str(err.value)
    assert "\n" not in msg and "GB are available" in msg and "fits" in msg
    m = re.search(r"e\.g\. (--[a-z-]+ \d+(?: --[a-z-]+ \d+)*) fits", msg)
    assert m, msg
    sizes = dict(seq_len=512, sequences=4)
    for flag, val in re.findall(r"--([a-z-]+) (\d+)", m.group(1)):
        sizes[flag.replace("-", "_")] = int(val)
    from sigprop import models as hf

    config = hf.load_config("bert-base-uncased")
    spec, info = hf.spec_and_info(config, sizes["seq_len"])
    dg.check_memory(config, spec, sizes["sequences"], vocab_at_init(config, info.vocab_size))


def test_figures_leave_matplotlib_state_alone(tmp_path):
    """Library plots never switch the backend nor leave pyplot figures open; they return the
    Figure and write it only when given a path (the format follows the extension)."""
    import matplotlib

    from sigprop.plotting.figures import plot_diagram
    from sigprop.spec import ArchSpec
    from sigprop.theory import diagram

    before = matplotlib.get_backend()
    d = diagram.compute(ArchSpec(depth=4), n_beta=8, n_alpha=8)
    fig = plot_diagram(d)
    assert matplotlib.get_backend() == before
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []
    assert fig.axes and not list(tmp_path.iterdir())
    plot_diagram(d, str(tmp_path / "d.svg"))
    assert (tmp_path / "d.svg").read_text().lstrip().startswith("<?xml")


def test_trainability_plot_is_the_grid():
    """The (beta, alpha) grid: one cell per point coloured by the theory's regime, one marker
    per point (filled: learned, cross: stuck), a red frame where training disagreed."""
    import pandas as pd

    from sigprop.plotting.training import plot_trainability

    rows = [dict(beta=b, alpha=a, theory="trainable" if a > 1 else "rank_collapse",
                 outcome="learned" if a > 1 else "stuck", gain=0.7 if a > 1 else 0.0,
                 agree=not (a == 0.2 and b == 0.3))
            for b in (0.3, 1.0) for a in (0.2, 2.0)]
    fig = plot_trainability(None, pd.DataFrame(rows))
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (2, 2)
    markers = [ln.get_marker() for ln in ax.lines]
    assert sorted(markers) == ["X", "X", "o", "o"]
    assert sum(p.get_edgecolor()[:3] == (1.0, 0.0, 0.0) for p in ax.patches) == 1
