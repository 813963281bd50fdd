"""The reproduce framework (sigprop.reproduce.core), the gallery page and `sigprop reproduce`,
on stand-in items so that the wiring is tested apart from the papers' experiments."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from sigprop import cli
from sigprop.plotting.figures import new_figure
from sigprop.report import gallery
from sigprop.reproduce import core, plots
from sigprop.reproduce.core import Check, Experiment, Item, frame

DRAWN = []   # the data each stand-in plot was drawn from, in order


def _plot(data, ax=None):
    """A stand-in item's plot function: y over x on ``ax`` or a new figure."""
    DRAWN.append(data)
    fig, (a,) = plots.axes_row(ax, 1, (3, 2))
    a.plot(data["x"], data["y"])
    plots.decorate(a, "x", "y", "stand-in", legend=None)
    return fig


def _fig():
    fig = new_figure((3, 2))
    ax = fig.add_subplot()
    ax.plot([1, 2, 3], [1, 4, 9])
    return fig


def _ok(*, seed=0, device="cpu", n=4):
    x = np.arange(1, n + 1, dtype=float)
    rng = np.random.default_rng(seed)
    y = x ** -1.0 * (1 + 0.01 * rng.standard_normal(n))
    recs = [dict(observable="y", source="measured", value=v, n=int(k))
            for k, v in zip(x, y, strict=True)]
    recs += [dict(observable="y", source="theory", value=1 / k, n=int(k)) for k in x]
    return Experiment(frame(recs), pd.DataFrame({"n": [n], "slope": [core.slope(x, y)]}),
                      [Check.within("slope is -1 (Eq. 1)", core.slope(x, y), -1.05, -0.95,
                                    why="1% noise on 4 points")], _plot, dict(x=x, y=y),
                      notes="a <script>stand-in</script>")


def _differs(*, seed=0, device="cpu"):
    return Experiment(frame([dict(observable="y", source="measured", value=0.5)]),
                      pd.DataFrame(), [Check.differs("rate T^-1 (Prop. 9)", -0.5, -0.6, -0.4,
                                                     paper="the paper states -1",
                                                     why="4 sizes")], _fig())


def _bad(*, seed=0, device="cpu"):
    raise RuntimeError("boom\nsecond line")


@pytest.fixture
def fake(monkeypatch):
    reg = {
        "gg25.ok": Item("gg25.ok", "gg25", "Fig. 9", "ok <b>item</b>", "y ~ 1/n", _ok,
                        sizes={"tiny": {"n": 3}, "quick": {"n": 5}},
                        runtime={"quick": 2.0}),
        "noci22.diff": Item("noci22.diff", "noci22", "Prop. 9", "differs", "a rate", _differs,
                            differs="the rate is T^-1/2"),
        "mindthegap.bad": Item("mindthegap.bad", "mindthegap", "Fig. 1", "broken", "x",
                               _bad, trains=True),
    }
    monkeypatch.setattr(core, "items", lambda: reg)
    return reg


def test_checks_can_fail_and_state_their_band():
    assert Check.within("c", 0.5, 0, 1, why="w").status == "pass"
    assert Check.within("c", 1.5, 0, 1, why="w").status == "fail"
    assert Check.within("c", float("nan"), 0, 1, why="w").status == "fail"  # NaN never passes
    assert Check.within("c", 2.0, lo=1, why="w").expected == ">= 1"
    assert Check.ratio("c", 3.0, 2.0, 1.5, why="w").status == "pass"
    assert Check.ratio("c", 3.1, 2.0, 1.5, why="w").status == "fail"
    assert Check.ratio("c", -3.0, -2.0, 1.5, why="w").status == "fail"
    assert Check.that("c", False, 1.0, "a < b", why="w").status == "fail"
    d = Check.differs("c", 0.5, 0.4, 0.6, paper="p", why="w")
    assert d.status == "differs" and d.passed
    assert Check.differs("c", 0.9, 0.4, 0.6, paper="p", why="w").status == "fail"
    with pytest.raises(ValueError, match="status"):
        Check("c", 1.0, "x", "maybe")
    assert json.dumps(Check.within("c", float("inf"), 0, 1, why="w").to_json())


def test_frame_validates_columns_and_sources():
    with pytest.raises(ValueError, match="columns"):
        frame([dict(observable="y", value=1.0)])
    with pytest.raises(ValueError, match="source"):
        frame([dict(observable="y", source="guess", value=1.0)])
    f = frame([dict(n=3, observable="y", source="paper", value=1.0)])
    assert list(f.columns[:4]) == core.CORE and math.isnan(f.stderr.iloc[0])


def test_slope_of_a_power_law():
    x = np.geomspace(1, 100, 7)
    assert core.slope(x, 3 * x ** -1.5) == pytest.approx(-1.5, abs=1e-12)
    assert math.isnan(core.slope([1.0], [1.0]))


def test_status_aggregates_checks(fake):
    assert core.run("gg25.ok", "tiny").status == "pass"
    assert core.run("noci22.diff").status == "differs"
    e = core.run("mindthegap.bad", catch=True)
    assert e.status == "error" and e.error == "RuntimeError: boom"
    with pytest.raises(RuntimeError):
        core.run("mindthegap.bad")
    assert Experiment(frame([]), pd.DataFrame(), []).status == "fail"  # no check, no pass


def test_sizes_and_overrides(fake):
    e = core.run("gg25.ok", "quick", seed=3)
    assert e.params == {"seed": 3, "device": "cpu", "n": 5} and e.size == "quick"
    assert core.run("gg25.ok", "full").params["n"] == 4  # no full size: the defaults
    assert core.run("gg25.ok", "tiny", n=6).params["n"] == 6
    with pytest.raises(ValueError, match="size must be one of"):
        core.run("gg25.ok", "huge")


def test_select(fake):
    assert [i.name for i in core.select(["gg25.ok"])] == ["gg25.ok"]
    assert [i.name for i in core.select(papers=["noci22"])] == ["noci22.diff"]
    assert [i.name for i in core.select(["gg25.*", "gg25.ok"])] == ["gg25.ok"]  # no repeats
    assert len(core.select(everything=True)) == 3
    with pytest.raises(ValueError, match="unknown item 'gg25.nope'"):
        core.select(["gg25.nope"])
    with pytest.raises(ValueError, match="unknown item 'gg2'"):
        core.select(["gg2"])  # a bare prefix is not a selection
    with pytest.raises(ValueError, match="paper must be one of"):
        core.select(papers=["vaswani17"])


def test_register_names_and_duplicates():
    with pytest.raises(ValueError, match="<paper>.<figure>"):
        core.register("bert.fig1", ref="", title="", claim="")
    with pytest.raises(ValueError, match="<paper>.<figure>"):
        core.register("gg25", ref="", title="", claim="")


def test_save_writes_figure_data_and_checks(fake, tmp_path):
    e = core.run("gg25.ok", "tiny")
    paths = e.save(tmp_path)
    assert set(paths) == {"svg", "png", "data", "table", "json"}
    data = pd.read_parquet(tmp_path / "gg25.ok.parquet")
    assert len(data) == 6 and set(data.source) == {"measured", "theory"}
    assert (tmp_path / "gg25.ok.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "gg25.ok.svg").read_text().lstrip().startswith("<?xml")
    j = json.loads((tmp_path / "gg25.ok.json").read_text())
    assert j["status"] == "pass" and j["params"]["n"] == 3 and j["checks"][0]["expected"]


def test_figure_drawn_on_demand(fake, tmp_path):
    # an experiment keeps its data and plot function: nothing is drawn until asked
    DRAWN.clear()
    e = core.run("gg25.ok", "tiny")
    assert DRAWN == [] and e.data["x"].size == 3
    fig = e.figure
    assert len(DRAWN) == 1 and e.figure is fig and fig.axes[0].get_title() == "stand-in"
    e.figure = None                      # let the canvas go; the next access draws again
    assert e.figure is not fig and len(DRAWN) == 2
    other = new_figure((6, 2))
    axes = other.subplots(1, 2)
    assert e.plot(ax=axes[1]) is other and axes[1].lines and not axes[0].lines
    # an item that drew its Figure itself passes it; it is kept as is
    drawn = _fig()
    kept = Experiment(frame([]), pd.DataFrame(), [], drawn)
    assert kept.figure is drawn and kept.plot() is drawn and kept.draw is None


def test_gallery_page(fake, tmp_path):
    rs = [core.run(n, catch=True) for n in fake]
    for r in rs:
        r.save(tmp_path)
    page = gallery.write_gallery(rs, tmp_path, command="sigprop reproduce --all")
    html = page.read_text()
    assert html.count('class="card"') == 3
    assert 'src="gg25.ok.svg"' in html and "<script>" not in html  # escaped notes
    assert "&lt;b&gt;item&lt;/b&gt;" in html
    assert "the paper states -1" in html and "the rate is T^-1/2" in html
    assert "RuntimeError: boom" in html
    assert gallery.counts(rs) == {"pass": 1, "differs": 1, "fail": 0, "error": 1}


def test_cli_list_and_run(fake, tmp_path, capsys):
    assert cli.run(["reproduce", "--list", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["items"]] == list(fake) and out["quick_total_s"] == 2.0
    d = tmp_path / "g"
    assert cli.run(["reproduce", "gg25.ok", "--seed", "noci22", "--quick", "--out", str(d),
                    "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["items"]] == ["noci22.diff", "gg25.ok"]
    assert out["items"][1]["params"]["n"] == 5  # the quick size
    assert (d / "index.html").exists() and (d / "gg25.ok.svg").exists()
    # an error is a card and a non-zero exit, not a traceback
    assert cli.run(["reproduce", "--seed", "mindthegap", "--seed", "7", "--out", str(d)]) == 1
    assert json.loads((d / "mindthegap.bad.json").read_text())["params"]["seed"] == 7


@pytest.mark.parametrize("args, msg", [
    (["gg25.nope"], "NAMES: unknown item"),
    (["--seed", "bert"], "--seed: must be a paper"),
    (["--seed", "-1", "--all"], "--seed: must be an integer"),
    (["--all", "--size", "huge"], "--size: must be one of"),
    (["--all", "--quick", "--size", "full"], "--size"),
    (["--all", "--device", "tpu"], "--device"),
    ([], "NAMES: give item names"),
])
def test_cli_bad_input_is_one_line(fake, tmp_path, capsys, args, msg):
    assert cli.run(["reproduce", *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1 and "Traceback" not in err
