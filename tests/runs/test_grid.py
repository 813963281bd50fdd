"""Grid text, YAML sweep files and task expansion (sigprop.runs.grid)."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.runs.grid import GridError, Task, expand, load_yaml, parse_grid, parse_value


def test_issue_grid_text():
    g = parse_grid("beta=0.1:3:16,alpha_attn=0.5,1,2,depth=12,48")
    assert list(g) == ["beta", "alpha_attn", "depth"]
    np.testing.assert_allclose(g["beta"], np.linspace(0.1, 3, 16), rtol=1e-11)
    assert g["alpha_attn"] == [0.5, 1, 2] and g["depth"] == [12, 48]
    assert all(isinstance(v, int) for v in g["depth"])
    assert len(expand("measure", g)) == 16 * 3 * 2


def test_values_and_ranges():
    assert parse_value("true") is True and parse_value("None") is None
    assert parse_value("3") == 3 and isinstance(parse_value("3.0"), float)
    assert parse_value("gpt2") == "gpt2" and parse_value("[512, 4096]") == [512, 4096]
    g = parse_grid("lengths=[512,4096],[1024],seq_len=8:32:4,x=1:100:3:log,model=a/b.json")
    assert g["lengths"] == [[512, 4096], [1024]]
    assert g["seq_len"] == [8, 16, 24, 32]
    np.testing.assert_allclose(g["x"], [1, 10, 100])
    assert g["model"] == ["a/b.json"]
    # dashes spell the same option as the command line
    assert list(parse_grid("alpha-attn=1")) == ["alpha_attn"]
    # linspace noise is rounded away, so the value (and its hash) reads as written
    assert parse_grid("b=0.1:0.3:3")["b"] == [0.1, 0.2, 0.3]


@pytest.mark.parametrize("text, words", [
    ("", "empty"), ("0.5,1", "must start with key=value"), ("beta=1,beta=2", "twice"),
    ("beta=1:2:0", "number of values"), ("beta=0:1:3:log", "log range"),
    ("beta=[1,2", "unbalanced"), ("beta=1,,2", "empty value"), ("config=1", "store column"),
    ("beta=inf", None),
])
def test_bad_grids(text, words):
    if words is None:  # 'inf' is a string value (not a number); the spec rejects it later
        assert parse_grid(text)["beta"] == ["inf"]
        return
    with pytest.raises(GridError, match=words):
        parse_grid(text)


def test_expand_product_order_and_dedup():
    tasks = expand("predict", {"beta": [0.1, 0.2], "depth": [2, 4, 6]},
                   configs=[{"norm": "pre"}, {"norm": "post"}], fixed={"d_model": 64})
    assert len(tasks) == 2 * 2 * 3
    assert [t.config["depth"] for t in tasks[:3]] == [2, 4, 6]  # last key varies fastest
    assert all(t.config["d_model"] == 64 for t in tasks)
    assert len({t.key for t in tasks}) == len(tasks)
    twice = expand("predict", {"beta": [0.1, 0.1]})
    assert len(twice) == 1
    # the hash ignores key order and separates commands
    a = Task.make("predict", {"beta": 1.0, "depth": 2})
    assert a.key == Task.make("predict", {"depth": 2, "beta": 1.0}).key
    assert a.key != Task.make("measure", {"beta": 1.0, "depth": 2}).key
    assert a.key != Task.make("predict", {"beta": 1.0, "depth": 3}).key


def test_yaml_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("""
command: measure
store: out/
workers: 3
fixed: {d_model: 32, heads: 2}
grid: {beta: "0.5:1.5:3", depth: [2, 4]}
sweeps:
  - {command: diagnose, grid: {model: [gpt2, bert-base-uncased]}, fixed: {seq_len: 16}}
""")
    tasks, settings = load_yaml(f)
    assert settings == {"store": "out/", "workers": 3}
    meas = [t for t in tasks if t.command == "measure"]
    diag = [t for t in tasks if t.command == "diagnose"]
    assert len(meas) == 6 and len(diag) == 2
    assert [t.config["beta"] for t in meas[::2]] == [0.5, 1.0, 1.5]
    assert all(t.config["d_model"] == 32 for t in meas)
    # an entry inherits the top-level fixed values under its own
    assert diag[0].config == {"d_model": 32, "heads": 2, "model": "gpt2", "seq_len": 16}


@pytest.mark.parametrize("body, words", [
    ("- 1\n- 2\n", "mapping"), ("command: measure\nbogus: 1\ngrid: {beta: [1]}\n", "bogus"),
    ("grid: {beta: [1]}\n", "no command"), ("command: x\n", "no tasks"),
    ("command: measure\ngrid: {beta: []}\n", "no values"), ("a: [\n", "not valid YAML"),
    ("command: predict\ngrid: {beta: [.inf]}\n", "beta: config values must be finite"),
    ("command: predict\nconfigs: [1, 2]\n", "every entry must be a mapping"),
    ("command: predict\ngrid: {beta: \"0.1:3:1e9\"}\n", "must be an integer"),
])
def test_bad_yaml(tmp_path, body, words):
    f = tmp_path / "s.yaml"
    f.write_text(body)
    with pytest.raises(GridError, match=words):
        load_yaml(f)
