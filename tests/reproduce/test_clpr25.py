"""clpr25 items (sigprop.reproduce.clpr25, docs/reproduce/clpr25.md): every item at its tiny
size in the default suite (wiring, data, figure, checks passing), that the checks can fail,
the row-sampled angle ratio against the full layer, and bad keywords; quick sizes under slow."""

import math

import numpy as np
import pytest

from sigprop.reproduce import clpr25
from sigprop.reproduce.core import ITEMS, Check, run
from sigprop.theory import scaling as sc

NAMES = ("clpr25.fig1", "clpr25.fig2", "clpr25.table1", "clpr25.thm21", "clpr25.thm23",
         "clpr25.vs_gg25")


@pytest.fixture(scope="module")
def tiny():
    return {n: run(ITEMS[n], "tiny") for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_tiny_runs_and_passes(tiny, name):
    exp = tiny[name]
    assert exp.status == "pass", [(c.claim, c.measured, c.expected) for c in exp.checks
                                  if c.status == "fail"]
    assert exp.figure is not None and exp.figure.axes
    df = exp.trajectory
    assert list(df.columns[:4]) == ["observable", "source", "value", "stderr"]
    assert {"theory", "measured"} <= set(df.source)
    assert np.isfinite(df.value.dropna()).all() and len(exp.table)
    assert all(c.why for c in exp.checks)


def test_tiny_budget(tiny):
    # all six items at tiny size: a few seconds (measured ~2.5 s on the shared 2-core box)
    assert sum(e.seconds for e in tiny.values()) < 6.0


def test_angle_ratios_match_full_layer():
    # sampling rows is exact per row: the ratio over all rows equals the full layer's
    X = sc.almost_simplex(24, 40, 0.4, seed=3)
    g = np.array([0.5, 1.7, 4.0])
    got = clpr25.angle_ratios(X, g, rows=24)
    Y = X / np.linalg.norm(X, axis=1, keepdims=True)
    iu = np.triu_indices(24, 1)
    th_in = np.arccos(np.clip((Y @ Y.T)[iu], -1, 1))
    want = []
    for gi in g:
        Z = sc.attention_forward(X, gi)
        Z /= np.linalg.norm(Z, axis=1, keepdims=True)
        want.append(np.mean(np.arccos(np.clip((Z @ Z.T)[iu], -1, 1)) / th_in))
    assert np.allclose(got, want, atol=1e-12)


def test_checks_can_fail(tiny):
    # a wrong measurement fed to the same bands fails: the fig1 location band, the thm21 limit
    c = tiny["clpr25.fig1"].checks[0]
    lo, hi = (float(v) for v in c.expected.strip("in []").split(","))
    assert Check.within(c.claim, hi + 0.1, lo, hi, why=c.why).status == "fail"
    t = tiny["clpr25.table1"].table
    assert set(t.regime) == {"subcritical", "critical", "supercritical"}
    assert (t.regime == t.expected).all()
    # the standard (unscaled) row is far from the critical value: labelled critical it fails
    lim = float(t[t.kind == "none"].ratio_at_1e12.iloc[0])
    r_c = math.acos(float(sc.simplex_limit(2.0, 0.5))) / math.acos(0.5)
    assert abs(lim - r_c) > 0.5


def test_table1_orders(tiny):
    t = tiny["clpr25.table1"].table.set_index("method")
    assert t.loc["standard (1/√d only)"].fitted_order == pytest.approx(0.0, abs=1e-9)
    assert t.loc["Qwen log_{n_train} n"].fitted_order == pytest.approx(1.0, abs=1e-9)
    assert 1.5 < t.loc["YaRN (0.1 ln s + 1)², s = n/n_train"].fitted_order < 2.0


def test_bad_keywords():
    # one line through sigprop.reproduce.args: "NAME: must be ..."
    with pytest.raises(ValueError, match="^rho: must be "):
        clpr25.fig1(rho=1.0)
    with pytest.raises(ValueError, match="^ns: must be "):
        clpr25.fig1(ns=(64,))
    with pytest.raises(ValueError, match="^ds: must be "):
        clpr25.fig2(ds=(128, 16))
    with pytest.raises(ValueError, match="^n_gamma: must be "):
        clpr25.fig2(n_gamma=2)
    with pytest.raises(ValueError, match="^alpha: must be "):
        clpr25.thm21(alpha=0.0)
    with pytest.raises(ValueError, match="^level: must be "):
        clpr25.vs_gg25(level=1.0)
    with pytest.raises(ValueError, match="^d: must be "):
        clpr25.table1(d=4)


def test_parts_compose():
    # an item is data + checks + plot: the plot draws into axes it is given
    from matplotlib.figure import Figure

    from sigprop.reproduce.clpr25 import theorems

    r = theorems.thm23_data([8, 16], 0.5, seed=0)
    assert len(theorems.thm23_checks(r)) == 4
    fig = Figure()
    ax = fig.subplots()
    assert theorems.plot_thm23(r, ax=ax) is fig and ax.lines


def test_seeded(tiny):
    a = run(ITEMS["clpr25.fig1"], "tiny", seed=0).trajectory
    assert a.equals(tiny["clpr25.fig1"].trajectory)
    b = run(ITEMS["clpr25.fig1"], "tiny", seed=1).trajectory
    assert not np.allclose(a.value.to_numpy(), b.value.to_numpy())
    assert math.isfinite(float(b.value.sum()))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_quick(name):
    exp = run(ITEMS[name], "quick")
    assert exp.status == "pass", [(c.claim, c.measured, c.expected) for c in exp.checks
                                  if c.status == "fail"]
