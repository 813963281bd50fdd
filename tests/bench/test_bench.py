"""``sigprop bench``: the registry, the run's JSON, the console table and the README section.
A fake benchmark stands in for the real ones in the default suite (each real one runs at its
quick size in the slow suite)."""

from __future__ import annotations

import json
import math
import sys

import pytest

from sigprop.bench import core
from sigprop.bench.core import Figure
from sigprop.cli import run
from sigprop.report.bench import (
    GPU_END,
    GPU_START,
    README_END,
    README_START,
    markdown,
    replace_section,
)


@pytest.fixture
def fake(monkeypatch):
    calls = []

    def fn(*, size="default", device="cpu"):
        calls.append((size, device))
        return [Figure("fake/a", "a thing", 2.0, "the reference", 4.0, target="<= 1",
                       ok=True),
                Figure("fake/rate", "a rate", 1.0, "matmul", 0.5, ratio=0.8,
                       unit="fraction of the matmul rate", target=">= 0.7", ok=True)]

    def broken(*, size="default", device="cpu"):
        raise RuntimeError("no such device\nmore text")

    monkeypatch.setitem(core.BENCHMARKS, "fake", core.Bench("fake", "a fake", fn, 1.0))
    monkeypatch.setitem(core.BENCHMARKS, "broken", core.Bench("broken", "fails", broken, 1.0))
    return calls


def test_figure_ratio():
    assert Figure("x", "", 3.0, "", 1.5).ratio == 2.0
    assert math.isnan(Figure("x", "", 3.0, "", 0.0).ratio)
    assert Figure("x", "", 3.0, "", 1.5, ratio=0.25).ratio == 0.25
    j = Figure("x", "", float("inf"), "", 1.0).to_json()
    assert j["sigprop_s"] is None and json.dumps(j)
    import numpy as np  # benchmarks compute ok and sizes with NumPy

    j = Figure("x", "", 1.0, "", 2.0, ok=np.float64(0.5) < 1, size={"n": np.int64(3)}).to_json()
    assert json.dumps(j) and j["ok"] is True and j["size"] == {"n": 3}


def test_register_twice_refused(fake):
    with pytest.raises(ValueError, match="twice"):
        core.register("fake", title="again", runtime=1)(lambda **kw: [])


def test_run_json(fake):
    res = core.run(["fake", "broken"], size="quick")
    assert fake == [("quick", "cpu")]
    m = res["machine"]
    assert m["matmul_gflops"] > 0 and m["memory_gbs"] > 0 and m["cpu_cores"] >= 1
    assert m["heap_kept"] is True or not sys.platform.startswith("linux")  # run() tunes it
    a, b = res["benchmarks"]
    assert [f["ratio"] for f in a["figures"]] == [0.5, 0.8]
    assert b["figures"] == [] and b["error"] == "RuntimeError: no such device"
    with pytest.raises(ValueError, match="unknown benchmark"):
        core.run(["nope"])
    with pytest.raises(ValueError, match="size"):
        core.run(["fake"], size="huge")


def test_readme_section_replaced_not_duplicated(fake):
    res = core.run(["fake"], size="quick")
    sec = markdown(res)
    assert sec.startswith(README_START) and sec.endswith(README_END)
    assert "| fake/a: a thing | 2.00 s | the reference: 4.00 s | 0.50x | <= 1 (met) |" in sec
    assert "80%" in sec
    text = "# title\n\nintro\n"
    once = replace_section(text, sec)
    twice = replace_section(once.replace("0.50x", "9.99x"), sec)
    assert twice.count(README_START) == 1 and "9.99x" not in twice and "intro" in twice


def test_cli(fake, tmp_path, capsys):
    out, readme = tmp_path / "b.json", tmp_path / "README.md"
    readme.write_text("# x\n")
    assert run(["bench", "fake", "--size", "quick", "--format", "json", "--out", str(out),
                "--readme", str(readme)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["benchmarks"][0]["name"] == "fake"
    assert json.loads(out.read_text())["benchmarks"] == printed["benchmarks"]
    assert README_START in readme.read_text()
    assert run(["bench", "fake", "--size", "quick"]) == 0
    shown = capsys.readouterr()
    table = shown.out
    assert "fake: " in shown.err  # not a terminal: progress as one line per benchmark
    assert "fake/a" in table and "0.50x" in table and "matmul" in table
    assert run(["bench", "--list"]) == 0
    assert "fake" in capsys.readouterr().out
    for args, words in ((["bench", "nope"], "unknown benchmark"),
                        (["bench", "--size", "huge"], "--size"),
                        (["bench", "--device", "tpu"], "--device"),
                        (["bench", "fake", "--out", str(tmp_path / "x.txt")], "--out")):
        assert run(args) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(core.benchmarks()))
def test_every_benchmark_runs_at_quick_size(name):
    res = core.run([name], size="quick")
    b = res["benchmarks"][0]
    assert "error" not in b, b.get("error")
    assert b["figures"] and all(f["sigprop_s"] and f["reference_s"] for f in b["figures"])


def test_gpu_section_has_its_own_markers(fake):
    cpu = core.run(["fake"], size="quick")
    gpu = {**cpu, "machine": {**cpu["machine"], "device": "cuda", "device_name": "Some GPU"}}
    sec_cpu, sec_gpu = markdown(cpu), markdown(gpu)
    assert sec_gpu.startswith(GPU_START) and sec_gpu.endswith(GPU_END)
    assert "Some GPU (cuda" in sec_gpu
    both = replace_section(replace_section("# t\n", sec_cpu), sec_gpu)
    assert both.count(README_START) == 1 and both.count(GPU_START) == 1
    # a new GPU run replaces the GPU table only
    again = replace_section(both, sec_gpu.replace("0.50x", "0.25x"))
    assert again.count(GPU_START) == 1 and again.count("0.25x") == 1
    assert again.count("0.50x") == 1  # the CPU table's row is untouched


def test_cli_renders_a_saved_run(fake, tmp_path, capsys):
    out, doc = tmp_path / "b.json", tmp_path / "doc.md"
    assert run(["bench", "fake", "--size", "quick", "--format", "json", "--out", str(out)]) == 0
    saved = json.loads(capsys.readouterr().out)
    saved["machine"]["device"] = "cuda"
    out.write_text(json.dumps(saved))
    assert run(["bench", "--from", str(out), "--readme", str(doc), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in shown.items() if k != "meta"} == {
        k: v for k, v in saved.items() if k != "meta"}
    assert GPU_START in doc.read_text() and "0.50x" in doc.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text('{"machine": 1}')
    for args in (["bench", "--from", str(tmp_path / "none.json")], ["bench", "--from", str(bad)],
                 ["bench", "fake", "--from", str(out)],
                 ["bench", "--from", str(out), "--size", "quick"],
                 ["bench", "--from", str(out), "--device", "cuda"]):
        assert run(args) == 2
        assert "--from" in capsys.readouterr().err
