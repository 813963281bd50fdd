"""``sigprop sweep`` and ``sigprop results`` from the command line: outputs, exit codes and
one-line errors; the scan plot's points against a direct groupby of the rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sigprop.cli import run
from sigprop.plotting.scan import PlotError, parse_plot, scan_table
from sigprop.runs.store import Store

GRID = "beta=0.3,1,3,depth=2,8,d_model=16,heads=2,seq_len=8,rho0=0.5"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A predict sweep (theory only: fast) of 6 points."""
    path = tmp_path_factory.mktemp("cli") / "st"
    assert run(["sweep", "--command", "predict", "--grid", GRID, "--store", str(path),
                "--workers", "2", "--format", "json"]) == 0
    return path


def test_sweep_json_and_rerun(store, capsys):
    capsys.readouterr()
    assert run(["sweep", "--command", "predict", "--grid", GRID, "--store", str(store),
                "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["total"], out["skipped"], out["done"], out["failed"]) == (6, 6, 0, 0)
    assert out["store"] == str(store) and out["meta"]["command"].startswith("sigprop sweep")


def test_dry_run_lists_status(store, tmp_path, capsys):
    grid = GRID.replace("depth=2,8", "depth=2,8,16")
    capsys.readouterr()
    assert run(["sweep", "--command", "predict", "--grid", grid, "--store", str(store),
                "--dry-run", "--format", "csv"]) == 0
    df = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert len(df) == 9
    assert set(df[df.depth == 16].status) == {"pending"}
    assert set(df[df.depth != 16].status) == {"done"}
    assert len(Store(store).done("predict")) == 6  # nothing ran


def test_results_formats(store, tmp_path, capsys):
    capsys.readouterr()
    assert run(["results", str(store), "--query", "beta > 1 and observable == 'cos'",
                "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == 2 and {r["beta"] for r in out["rows"]} == {3}
    assert {r["observable"] for r in out["rows"]} == {"cos"}
    assert run(["results", str(store), "--format", "csv"]) == 0
    csv = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert csv["config_hash"].nunique() == 6
    # read back sorted by the sweep's coordinates: beta, then depth
    firsts = csv.drop_duplicates("config_hash")[["beta", "depth"]].to_numpy().tolist()
    assert firsts == sorted(firsts)
    out_file = tmp_path / "rows.parquet"
    assert run(["results", str(store), "--format", "parquet", "--out", str(out_file)]) == 0
    assert len(pd.read_parquet(out_file)) == len(csv)
    assert run(["results", str(store), "--limit", "3"]) == 0
    text = capsys.readouterr().out
    assert "from 6 tasks" in text and "first 3 of" in text
    assert "fixed: d_model=16" in text


def test_results_plot(store, tmp_path, capsys):
    out = tmp_path / "scan.png"
    assert run(["results", str(store), "--plot", "x=beta,y=cos,hue=depth", "--out",
                str(out)]) == 0
    assert out.stat().st_size > 5000
    # the points drawn: each task's last layer, per (depth, beta), against the rows themselves
    rows = Store(store).read()
    pts, averaged = scan_table(rows, "beta", "cos", hue="depth")
    assert averaged == []
    last = rows[rows.observable == "cos"]
    last = last[last.layer == last.groupby("config_hash").layer.transform("max")]
    for r in pts.itertuples():
        want = last[(last.beta == r.beta) & (last.depth == r.depth)]["value"]
        assert len(want) == 1 and r.value == pytest.approx(float(want.iloc[0]), rel=1e-12)
    # deeper is closer to rank collapse at every beta (theory, rho0 = 0.5)
    w = pts.pivot(index="beta", columns="depth", values="value")
    assert (w[8] > w[2]).all()


def test_scan_averages_and_says_so(store):
    rows = Store(store).read()
    pts, averaged = scan_table(rows, "beta", "cos")
    assert averaged == ["depth"]
    sub = rows[(rows.observable == "cos") & (rows.beta == 1)]
    sub = sub[sub.layer == sub.groupby("config_hash").layer.transform("max")]
    v = sub["value"].to_numpy()
    got = pts[pts.beta == 1].iloc[0]
    assert got.value == pytest.approx(v.mean()) and got.stderr == pytest.approx(
        v.std(ddof=1) / np.sqrt(2))


@pytest.mark.parametrize("args, words", [
    (["sweep", "--command", "predict", "--grid", "bta=1", "--store", "{s}"], "bta: not an option"),
    (["sweep", "--command", "predict", "--grid", "beta=-1", "--store", "{s}"], "beta"),
    (["sweep", "--command", "nope", "--grid", "beta=1", "--store", "{s}"], "--command"),
    (["sweep", "--grid", "beta=1", "--store", "{s}"], "--command"),
    (["sweep", "--command", "predict", "--grid", "beta=1"], "--store"),
    (["sweep", "--command", "predict", "--grid", "beta=1:2", "--store", "{s}"], None),
    (["sweep", "--command", "predict", "--grid", "beta=1,2:3:0", "--store", "{s}"],
     "number of values"),
    (["sweep", "--command", "predict", "--grid", "beta=1", "--store", "{s}", "--executor",
      "dask"], "--executor"),
    (["sweep", "--command", "predict", "--grid", "beta=1", "--store", "{s}", "--workers", "0"],
     "--workers"),
    (["sweep", "--command", "predict", "--grid", "beta=1", "--store", "{s}", "--address",
      "auto"], "--address"),
    (["sweep", "--command", "diagnose", "--grid", "seq_len=8", "--store", "{s}"], "model"),
    (["sweep", "--command", "reproduce", "--grid", "item=gg25.nope", "--store", "{s}"],
     "unknown item"),
    (["sweep", "--command", "predict", "--grid", "beta=1", "--store", "{foreign}"],
     "not a sigprop results store"),
    (["results", "{foreign}"], "not a sigprop results store"),
    (["results", "{s}", "--query", "bta > 1"], "--query"),
    (["results", "{s}", "--plot", "x=beta,y=nothing", "--out", "{png}"], "--plot"),
    (["results", "{s}", "--plot", "x=beta,y=cos"], "--out"),
    (["results", "{s}", "--format", "parquet"], "--out"),
    (["results", "{s}", "--command", "train"], "--command"),
])
def test_bad_input_exits_2_with_one_line(store, tmp_path, capsys, args, words):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.txt").write_text("x")
    fill = {"s": str(store) if args[0] == "results" else str(tmp_path / "new"),
            "foreign": str(foreign), "png": str(tmp_path / "a.png")}
    args = [a.format(**fill) for a in args]
    code = run(args)
    err = capsys.readouterr().err.strip()
    if words is None:  # 1:2 is the string '1:2', which ArchSpec refuses as a beta
        assert code == 2 and "beta" in err
        return
    assert code == 2, err
    assert len(err.splitlines()) == 1 and words in err, err
    assert "Traceback" not in err


def test_failed_tasks_exit_1_and_are_listed(tmp_path, capsys):
    """A task that raises inside the worker (here a seq_len longer than the diagnose model
    allows is refused only at run time... use a bad model name) is recorded; exit code 1."""
    st = tmp_path / "st"
    code = run(["sweep", "--command", "diagnose", "--grid", "model=no-such-model-xyz,seq_len=8",
                "--store", str(st), "--workers", "1", "--format", "json"])
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] == 1 and "no-such-model-xyz" in out["failures"][0]["error"]
    assert run(["results", str(st), "--failures", "--format", "json"]) == 0
    f = json.loads(capsys.readouterr().out)["failures"]
    assert len(f) == 1 and f[0]["attempts"] == 1


def test_parse_plot():
    assert parse_plot("x=beta,y=cos,hue=depth,logx") == {"x": "beta", "y": "cos",
                                                         "hue": "depth", "logx": True}
    for bad in ("y=cos", "x=beta", "x=beta,y=cos,size=3", "x=,y=cos"):
        with pytest.raises(PlotError):
            parse_plot(bad)
