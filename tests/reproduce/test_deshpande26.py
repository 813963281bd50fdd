"""deshpande26 items (sigprop.reproduce.deshpande26, docs/reproduce/deshpande26.md): every item
at its tiny size in the default suite, the bulk "differs" verdicts and that they can fail, the
helpers against closed forms, bad keywords; quick sizes under slow."""

import math

import numpy as np
import pytest
from scipy.special import gamma as gamma_fn

from sigprop.reproduce import deshpande26 as dp
from sigprop.reproduce.core import ITEMS, Check, run

NAMES = ("deshpande26.wmax", "deshpande26.bulk", "deshpande26.retrieval", "deshpande26.eq12")


@pytest.fixture(scope="module")
def tiny():
    return {n: run(ITEMS[n], "tiny") for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_tiny_runs(tiny, name):
    exp = tiny[name]
    want = "differs" if name == "deshpande26.bulk" else "pass"
    assert exp.status == want, [(c.claim, c.measured, c.expected) for c in exp.checks
                                if c.status == "fail"]
    assert exp.figure is not None and exp.figure.axes
    df = exp.trajectory
    assert list(df.columns[:4]) == ["observable", "source", "value", "stderr"]
    assert {"theory", "measured"} <= set(df.source)
    assert all(c.why for c in exp.checks)


def test_tiny_budget(tiny):
    # measured ~2.3 s for the four on the shared 2-core box
    assert sum(e.seconds for e in tiny.values()) < 5.0


def test_bulk_differs_and_can_fail(tiny):
    exp = tiny["deshpande26.bulk"]
    diff = [c for c in exp.checks if c.status == "differs"]
    assert len(diff) == 2 and all(c.paper for c in diff)
    # the paper's value (ratio 1) lies outside sigprop's band: the departure is real
    for c in diff:
        lo, hi = (float(v) for v in c.expected.strip("in []").split(","))
        assert hi < 0.9
        assert Check.differs(c.claim, 1.0, lo, hi, paper=c.paper, why=c.why).status == "fail"
    t = exp.table
    # bulk overestimates everywhere below beta_c, more so near it
    assert (t.ratio_exact < 1).all()
    big = t[t.N == t.N.max()]
    assert big.ratio_exact.iloc[-1] < big.ratio_exact.iloc[0]


def test_gumbel_bulk_closed_form():
    assert dp.gumbel_bulk(0.0, 1e4) == pytest.approx(1.0)
    x, N = 0.3, 1e3
    assert dp.gumbel_bulk(x, N) == pytest.approx(
        gamma_fn(0.7) * (4 * math.pi * math.log(N)) ** (-0.15), rel=1e-12)
    assert dp.exponent_pred(0.0, 10, 100) == pytest.approx(1.0)


def test_sample_wmax_matches_direct():
    rng = np.random.default_rng(0)
    U = rng.standard_normal((50, 30))
    m, se = dp.sample_wmax(U, [0.0, 2.0])
    assert m[0] == pytest.approx(1 / 30)
    w = np.exp(2 * U)
    assert m[1] == pytest.approx(np.mean(w.max(1) / w.sum(1)), rel=1e-12)
    assert se[0] == pytest.approx(0.0, abs=1e-15)


def test_retrieval_shift_formula():
    # the Gumbel median of the largest of N Gaussians over sqrt(2 log N), vs the exact median
    from scipy.special import ndtri
    for N in (1e3, 1e6):
        exact = ndtri(0.5 ** (1 / N)) / math.sqrt(2 * math.log(N))
        assert abs(dp.kappa_half_gumbel(N) - exact) < 0.01


def test_bad_keywords():
    # one line through sigprop.reproduce.args: "NAME: must be ..."
    with pytest.raises(ValueError, match="^Ns: must be "):
        dp.wmax(Ns=(100,))
    with pytest.raises(ValueError, match="^sigma: must be "):
        dp.bulk(sigma=0.0)
    with pytest.raises(ValueError, match="^budget: must be "):
        dp.retrieval(budget=10)
    with pytest.raises(ValueError, match="^ds: must be "):
        dp.eq12(ds=(64, 16, 4))
    with pytest.raises(ValueError, match="^N: must be "):
        dp.eq12(N=8)


def test_parts_compose():
    # an item is data + checks + plot: the plot draws into axes it is given
    from matplotlib.figure import Figure

    from sigprop.reproduce.deshpande26 import head_width

    r = head_width.eq12_data([4, 16, 64], 64, 1.0, 16, 1, seed=0)
    assert len(head_width.eq12_checks(r)) == 4
    fig = Figure()
    ax = fig.subplots()
    assert head_width.plot_eq12(r, ax=ax) is fig and ax.lines


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_quick(name):
    exp = run(ITEMS[name], "quick")
    assert exp.status in ("pass", "differs")
    assert not [c for c in exp.checks if c.status == "fail"]
