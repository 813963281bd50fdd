"""gg25 items that do not train (sigprop.reproduce.gg25, docs/reproduce/gg25.md).

Every item runs at its ``tiny`` size (wiring, data, figure and check logic; all together a few
seconds) and must not fail there; the ``quick`` sizes of the gallery run under ``slow``. The
helpers that carry a claim on their own (the independent gg25 block map, the closed-form tanh
slope, the single-head simulator) are checked against the library and closed forms, and the
checks are shown able to fail.
"""

import math

import numpy as np
import pytest

from sigprop.reproduce import core
from sigprop.reproduce import gg25 as g
from sigprop.spec import ArchSpec, SpecError
from sigprop.theory import depth, rem

NAMES = ("fig1ab", "fig1c", "fig1d", "fig1e", "fig3", "fig5", "figB1", "figB2", "eqB18",
         "figC1", "figC3", "eqB1")
DIFFERS = {"eqB18", "figC3"}


def _run(name, size="tiny", **kw):
    return core.run(core.ITEMS[f"gg25.{name}"], size, **kw)


@pytest.fixture(scope="module")
def tiny():
    return {n: _run(n) for n in NAMES}


def test_registered_with_refs_and_sizes():
    for n in NAMES:
        it = core.ITEMS[f"gg25.{n}"]
        assert it.paper == "gg25" and not it.trains and it.ref and it.claim
        assert "tiny" in it.sizes and "quick" in it.sizes
        assert set(it.runtime) >= {"tiny", "quick"}
        assert bool(it.differs) == (n in DIFFERS)


@pytest.mark.parametrize("name", NAMES)
def test_tiny_runs_and_passes(tiny, name):
    e = tiny[name]
    assert e.status == ("differs" if name in DIFFERS else "pass"), \
        [(c.claim, c.measured, c.expected) for c in e.checks if c.status != "pass"]
    assert e.figure is not None and "gg25" in e.figure.axes[0].get_title() + str(
        e.figure.get_suptitle())
    df = e.trajectory
    assert list(df.columns[:4]) == ["observable", "source", "value", "stderr"]
    assert {"measured", "theory"} & set(df["source"])
    assert all(c.why for c in e.checks)


def test_tiny_budget(tiny):
    assert sum(e.seconds for e in tiny.values()) < 30.0   # 15 s on a quiet 2-core box


def test_save_writes_everything(tiny, tmp_path):
    paths = tiny["fig3"].save(tmp_path)
    assert {"svg", "png", "data", "table", "json"} <= set(paths)


def test_bad_keywords_are_one_line_value_errors():
    for name, kw, match in (("fig1ab", dict(betas=(0.5, 1.0)), "^betas: must be a pair"),
                            ("fig3", dict(Ts=(512, 64)), "^Ts: must be an increasing list"),
                            ("fig5", dict(sigma_w2s=(0.5, 1.0)),
                             "^sigma_w2s: must be values on both sides"),
                            ("figC3", dict(betas=(0.5, 1.0)),
                             "^betas: must be values on both sides"),
                            ("eqB18", dict(x_exponent=0.4), "^x_exponent: must be one of xs")):
        with pytest.raises(SpecError, match=match) as err:
            _run(name, **kw)
        assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


def test_independent_block_map_matches_the_library():
    """gg25's printed equations (gg25_block_map) against sigprop's T -> inf block map."""
    spec = ArchSpec(depth=1, seq_len=512, d_model=64, heads=1, alpha_attn=1.3, **g.GG25_VARS)
    rhos = np.linspace(0.0, 0.95, 20)
    for beta in (0.1, 1.0, 2.5):
        lib = depth.final_cos(spec, beta=beta, rho0=rhos, asymptotic=True, fluctuations=False)
        ref = g.gg25_block_map(rhos, beta, alpha_attn=1.3)
        np.testing.assert_allclose(lib, ref, atol=1e-12)


def test_tanh_slope_closed_form_and_critical_variance():
    kw = dict(var_v=0.2, var_b=4e-4, alpha_attn=1.0, alpha_mlp=1.0)
    # linear regime: tanh'(0) = 1, tanh ~ identity for tiny sigma_w^2
    s = g.tanh_slope_closed_form(1e-6, **kw)
    assert s == pytest.approx(1.0 / 1.2004 / 1.0004, rel=1e-4)
    crit = g.critical(lambda v: g.tanh_slope_closed_form(v, **kw))
    assert g.tanh_slope_closed_form(crit, **kw) == pytest.approx(1.0, abs=1e-6)
    assert 1.5 < crit < 3.0


def test_head_sweep_matches_the_finite_t_rem():
    """One head on orthogonal tokens: Y2 on the finite-T REM with the chi2(d_H) average."""
    betas = np.array([0.5, 2.0])
    sw = g.head_sweep(betas, [0.0], 256, 256, None, 2, seed=3)
    th = rem.y2_finite(betas**2 * math.log(256), 256, d_head=256)
    np.testing.assert_allclose(sw["y2"][:, 0].mean(-1), th, atol=0.02)
    assert np.all(sw["entropy"] <= 1) and np.all(sw["wmax"] >= 1 / 256)


def test_crossing():
    x = np.array([0.0, 1.0, 2.0, 3.0])
    assert g.crossing(x, [1.0, 0.8, 0.4, 0.2], 0.6) == pytest.approx(1.5)
    assert math.isnan(g.crossing(x, [1.0, 0.9, 0.8, 0.7], 0.5))
    assert g.crossing(x, [0.1, 0.0, 0.0, 0.0], 0.5) == 0.0


def test_checks_can_fail():
    """The same items with set-ups that break a claim: fig1c's marks in the wrong regions,
    fig1e barely above beta_c (rows do not collapse)."""
    e = _run("fig1c", marks=((g.BETA_HF, 2.0), (g.BETA_HF, 1.0), (3.0, 1.0)))
    assert e.status == "fail"
    e = _run("fig1e", beta=1.5, depth=12)   # barely above beta_c: rows do not collapse
    assert any(c.status == "fail" for c in e.checks)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_quick(name):
    e = _run(name, "quick")
    assert e.status in ("pass", "differs"), \
        [(c.claim, c.measured, c.expected) for c in e.checks if c.status == "fail"]
