"""noci22 items (package sigprop.reproduce.noci22, docs/reproduce/noci22.md): every item at its tiny
size (wiring, data, figure, checks not failing), the closed-form Jacobian norms against torch
autograd, bad sizes, and checks that fail when the theory they hold the measurement to is
wrong. The quick sizes run under `slow`."""

import math

import numpy as np
import pytest

from sigprop.measurement.rho_tokens import rho_tokens
from sigprop.reproduce import core
from sigprop.reproduce import noci22 as N
from sigprop.theory import uniform as U

NAMES = [k for k, it in core.items().items()
         if it.fn.__module__.startswith(N.__name__ + ".") and not it.trains]
EXPECTED = {"noci22.lemma3_1", "noci22.lemma3_2", "noci22.lemma3_3", "noci22.thm3_2",
            "noci22.thm3_3", "noci22.eq17_18", "noci22.eq8", "noci22.eq47", "noci22.fig3_9",
            "noci22.fig7", "noci22.fig8", "noci22.fig10", "noci22.fig11", "noci22.fig12",
            "noci22.fig13_14"}
#: items whose measurement departs from a statement of the paper (a "differs" check)
DIFFERS = {"noci22.eq17_18", "noci22.eq8", "noci22.eq47", "noci22.fig7", "noci22.fig10",
           "noci22.fig11"}


@pytest.fixture(scope="module")
def tiny():
    return {name: core.run(name, "tiny") for name in NAMES}


def test_registered():
    assert set(NAMES) == EXPECTED
    for name in NAMES:
        it = core.items()[name]
        assert it.paper == "noci22" and not it.trains and it.ref and it.claim
        assert "tiny" in it.sizes and "quick" in it.sizes
        assert bool(it.differs) == (name in DIFFERS), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tiny(tiny, name):
    exp = tiny[name]
    assert exp.status in ("pass", "differs"), [(c.claim, c.measured, c.expected)
                                              for c in exp.checks if c.status == "fail"]
    assert (exp.status == "differs") == (name in DIFFERS)
    assert exp.figure is not None and exp.figure.axes
    assert "noci22" in " ".join(ax.get_title() for ax in exp.figure.axes)
    df = exp.trajectory
    assert list(df.columns[:4]) == core.CORE and len(df) > 5
    assert set(df["source"]) >= {"measured"}
    assert np.all(np.isfinite(df["value"].to_numpy(dtype=float)))
    for c in exp.checks:
        assert c.why, c.claim
        assert (c.status == "differs") == bool(c.paper), c.claim
    assert exp.notes and exp.table is not None and len(exp.table)


def test_tiny_budget(tiny):
    # the brief's budget for all noci22 items at tiny size in the default suite
    assert sum(e.seconds for e in tiny.values()) < 15.0


def test_save_roundtrip(tiny, tmp_path):
    paths = tiny["noci22.fig7"].save(tmp_path)
    assert {"svg", "png", "data", "table", "json"} <= set(paths)
    import pandas as pd

    back = pd.read_parquet(paths["data"])
    assert len(back) == len(tiny["noci22.fig7"].trajectory)


def test_seeded():
    a = core.run("noci22.fig13_14", "tiny", seed=3).trajectory
    b = core.run("noci22.fig13_14", "tiny", seed=3).trajectory
    c = core.run("noci22.fig13_14", "tiny", seed=4).trajectory
    np.testing.assert_array_equal(a["value"], b["value"])
    assert not np.array_equal(a["value"], c["value"])


# ------------------------------------------------------------------------------ Jacobians
@pytest.mark.parametrize("uniform,tau", [(False, 1.0), (False, 3.7), (True, 1.0), (True, 2.0)])
def test_jacobian_norms_equal_autograd(uniform, tau):
    rng = np.random.default_rng(11)
    X = rho_tokens(5, 6, 0.3, rng, n_seq=4, law="gaussian", var=1.5)
    Wq, Wk, Wv = (rng.standard_normal((4, 6, k)) for k in (3, 3, 7))
    a = N.jacobian_norms(X, Wq, Wk, Wv, tau, uniform=uniform)
    b = N.autograd_norms(X, Wq, Wk, Wv, tau, uniform=uniform)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-10)
    if uniform:  # Assumption 3.1: Eq. 6 per draw, tau^2 scaling of the query norm (Eq. 46)
        xbar = X.mean(1)
        np.testing.assert_allclose(a[2], 7 * 5 * (xbar**2).sum(-1), rtol=1e-12)
        q1 = N.jacobian_norms(X, Wq, Wk, Wv, 1.0, uniform=True)[0]
        np.testing.assert_allclose(a[0], tau**2 * q1, rtol=1e-12)


def test_input_grad_terms_refute_eq36():
    # near rank collapse E||A2||^2 >> E||A1||^2 (noci22's Eq. 36 says they are equal)
    rng = np.random.default_rng(2)
    X = rho_tokens(4, 16, 0.95, rng, law="gaussian")
    t = N.input_grad_terms(X, 16, 16, 1 / 16, 1 / 16, 1 / 16)
    assert t.a2 > 5 * t.a1 and t.cross > 0 and t.a3 == pytest.approx(16.0)
    # ... and with these terms the bound of Eq. 8 is exceeded at large variance
    X = rho_tokens(4, 16, 0.98, rng, n_seq=64, law="gaussian", var=16.0)
    t = N.input_grad_terms(X, 16, 16, 1 / 16, 1 / 16, 1 / 16)
    assert t.total.mean() > (8 * t.a1 + 2 * t.a3).mean()


# ------------------------------------------------------------------------------ sizes
@pytest.mark.parametrize("name,kw,field", [
    ("noci22.fig7", dict(draws=0), "draws"),
    ("noci22.fig7", dict(d_ks=(8, 4, 16, 32)), "d_ks"),
    ("noci22.eq47", dict(iwslt_rho=1.5), "iwslt_rho"),
    ("noci22.lemma3_2", dict(d=4, n=8), "d"),
    ("noci22.fig11", dict(alpha=-1.0), "alpha"),
    ("noci22.fig3_9", dict(heads=3), "heads"),
    ("noci22.eq17_18", dict(device="tpu"), "device"),
])
def test_bad_sizes(name, kw, field):
    with pytest.raises(ValueError, match=field):
        core.run(name, "tiny", **kw)


# ------------------------------------------------------------------------------ checks can fail
def test_checks_fail_with_a_wrong_theory(monkeypatch):
    # A.2's restatement of Eq. 18 (sigma_x^2 instead of sigma_x^6): the Eq. 18 check fails
    real = U.grad_norms

    def typo(sx2, d, n, rho, **kw):
        gv, gq = real(sx2, d, n, rho, **kw)
        return gv, gq / np.asarray(sx2, float) ** 2

    monkeypatch.setattr(U, "grad_norms", typo)
    exp = core.run("noci22.eq17_18", "tiny")
    failed = [c.claim for c in exp.checks if c.status == "fail"]
    assert exp.status == "fail" and any("exact Gaussian factor" in c for c in failed)


def test_tau_check_fails_at_the_papers_tau(monkeypatch):
    # feeding the paper's 8.5 as Eq. 47's value: the measured equalising tau (3.0) is outside
    monkeypatch.setattr(U, "tau_star", lambda *a, **k: np.float64(8.5))
    exp = core.run("noci22.eq47", "tiny")
    assert exp.status == "fail"


def test_forward_check_fails_with_a_wrong_lemma(monkeypatch):
    real = U.lemma33_norm
    monkeypatch.setattr(U, "lemma33_norm", lambda *a: 1.1 * real(*a))
    exp = core.run("noci22.lemma3_3", "tiny")
    assert exp.checks[0].status == "fail"


def test_differs_band_is_not_a_free_pass():
    c = N.Check.differs("x", 1.0, 2.0, 3.0, paper="p", why="w")
    assert c.status == "fail"


# ------------------------------------------------------------------------------ quick sizes
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick(name):
    exp = core.run(name, "quick")
    assert exp.status in ("pass", "differs"), [(c.claim, c.measured, c.expected)
                                              for c in exp.checks if c.status == "fail"]


@pytest.mark.slow
def test_quick_key_numbers():
    """The numbers quoted in docs/reproduce/noci22.md."""
    eq47 = core.run("noci22.eq47", "quick")
    t = eq47.trajectory
    tau = t[(t["observable"] == "tau_equalising")]
    assert float(tau[tau["source"] == "theory"]["value"].iloc[0]) == pytest.approx(3.0, abs=5e-3)
    meas = tau[(tau["source"] == "measured") & (tau["attention"] == "uniform")]["value"]
    assert float(meas.iloc[0]) == pytest.approx(3.0, abs=0.1)
    fig7 = core.run("noci22.fig7", "quick")
    slope = next(c for c in fig7.checks if c.status == "differs").measured
    assert -1.25 < slope < -1.0
    fig10 = core.run("noci22.fig10", "quick")
    off = next(c for c in fig10.checks if "(left)" in c.claim).measured
    assert 0.1 < off < 0.22 and math.isfinite(off)
