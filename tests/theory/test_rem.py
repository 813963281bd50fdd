"""Tests for sigprop.theory.rem: attention rows as a Random Energy Model (docs/theory.md §2.1-2.3).

Kinds: closed forms and limits (§2.2), exact T = 2 references (1-D / nested adaptive
quadrature), Monte Carlo of i.i.d. Gaussian scores (§2.3) with tolerances of 3 standard errors
(seeded, so deterministic), and table-vs-exact agreement at the documented tolerances.
"""

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special

from sigprop.theory import rem

PROPS = settings(max_examples=40, deadline=None, derandomize=True)
QUAD_TOL = 1e-5     # accuracy promised for the quadratures; added to every MC tolerance


def _mc_rows(sigmas, T, n, seed, d_head=None):
    """MC of one softmax row with i.i.d. N(0, sigma^2) scores over T keys (docs/theory.md §2.3), for
    several sigma on the same normal draws (optionally times sqrt(chi2(d)/d) per row).
    Returns {stat: (means, standard errors)} for y2, entropy (/log T), wmax."""
    rng = np.random.default_rng(seed)
    acc = {k: [] for k in ("y2", "entropy", "wmax")}
    chunk = max(1, 2**20 // T)
    for start in range(0, n, chunk):
        z = rng.standard_normal((min(chunk, n - start), T))
        if d_head is not None:
            z *= np.sqrt(rng.chisquare(d_head, size=(z.shape[0], 1)) / d_head)
        rows = {k: [] for k in acc}
        for sig in sigmas:
            s = sig * z
            s -= s.max(axis=1, keepdims=True)
            e = np.exp(s)
            Z = e.sum(axis=1)
            w = e / Z[:, None]
            rows["y2"].append((w * w).sum(axis=1))
            rows["wmax"].append(1.0 / Z)                     # the largest e is exp(0) = 1
            rows["entropy"].append((np.log(Z) - (w * s).sum(axis=1)) / math.log(T))
        for k in acc:
            acc[k].append(np.array(rows[k]))
    out = {}
    for k, parts in acc.items():
        x = np.concatenate(parts, axis=1)
        out[k] = (x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(x.shape[1]))
    return out


def _assert_mc(theory, mean, se, what):
    dev = np.abs(np.asarray(theory) - mean)
    bad = dev > 3 * se + QUAD_TOL
    assert not bad.any(), f"{what}: theory {theory[bad]} vs MC {mean[bad]} +- {se[bad]}"


# ------------------------------------------------------------------- T -> infinity (§2.2)
def test_beta_c_closed_form():
    assert rem.beta_c(0.0) == math.sqrt(2.0)
    assert rem.beta_c(0.5) == pytest.approx(2.0, rel=1e-15)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isposinf(rem.beta_c(1.0))
    assert rem.beta_c(np.zeros((2, 3))).shape == (2, 3)


@pytest.mark.parametrize("rho", [0.0, 0.3, 0.9])
def test_y2_asymptotic_limits(rho):
    bc = float(rem.beta_c(rho))
    assert rem.y2_asymptotic(0.5 * bc, rho) == 0.0
    assert rem.y2_asymptotic(bc, rho) == 0.0                           # 0 at beta_c itself
    assert rem.y2_asymptotic(bc * (1 + 1e-9), rho) < 1e-8              # continuous there
    assert rem.y2_asymptotic(2 * bc, rho) == pytest.approx(0.5, abs=1e-15)
    assert 1 - rem.y2_asymptotic(1e8, rho) < 1e-7                       # -> 1
    assert np.all(rem.yx_asymptotic([1.0, 2.0], rho) == 0.0)
    assert rem.entropy_asymptotic(0.0, rho) == 1.0
    assert rem.entropy_asymptotic(0.5 * bc, rho) == pytest.approx(0.75, abs=1e-15)
    assert rem.entropy_asymptotic(bc * (1 + 1e-12), rho) == 0.0
    assert rem.wmax_asymptotic(bc, rho) == 0.0


@PROPS
@given(b1=st.floats(0.0, 20.0), b2=st.floats(0.0, 20.0), rho=st.floats(0.0, 0.99))
def test_asymptotic_monotone_in_beta(b1, b2, rho):
    lo, hi = min(b1, b2), max(b1, b2)
    assert rem.y2_asymptotic(lo, rho) <= rem.y2_asymptotic(hi, rho)
    assert rem.entropy_asymptotic(lo, rho) >= rem.entropy_asymptotic(hi, rho)
    assert rem.wmax_asymptotic(lo, rho) <= rem.wmax_asymptotic(hi, rho) + 1e-12


@pytest.mark.parametrize("m", [0.3, 0.5, 0.7])
def test_wmax_asymptotic_vs_poisson_dirichlet_mc(m):
    """PD(m): points Gamma_i^{-1/m} (Gamma_i unit-rate arrival times). The first K = 1000 are
    sampled; the rest replaced by the mean sum_{i>K} i^{-1/m} ~ (K+1/2)^{1-1/m}/(1/m-1), whose
    bias (<1e-4) and spread are far below the MC standard error (~2.5e-3): 3 SE."""
    rng, K, n, vals = np.random.default_rng(1), 1000, 10000, []
    for _ in range(n // 2000):
        x = np.cumsum(rng.exponential(size=(2000, K)), axis=1) ** (-1 / m)
        vals.append(x[:, 0] / (x.sum(axis=1) + (K + 0.5) ** (1 - 1 / m) / (1 / m - 1)))
    vals = np.concatenate(vals)
    got = rem.wmax_asymptotic(math.sqrt(2) / m)
    assert abs(got - vals.mean()) < 3 * vals.std() / math.sqrt(n)


@pytest.mark.parametrize("beta", [3.0, 5.0])
def test_finite_wmax_y2_approach_asymptotic(beta):
    """Loose: the finite-T REM approaches the T -> inf limit only logarithmically (docs/theory.md
    §2.3); from above, monotonically in T, and within 0.05 (wmax) / 0.05 (Y2) at T = 2**22."""
    T = 2.0 ** np.array([10, 14, 18, 22])
    v = beta**2 * np.log(T)
    wm, y2 = rem.wmax_finite(v, T), rem.y2_finite(v, T)
    for fin, asym in ((wm, rem.wmax_asymptotic(beta)), (y2, rem.y2_asymptotic(beta))):
        assert np.all(np.diff(fin) < 0) and np.all(fin > asym)
        assert fin[-1] - asym < 0.05


# ------------------------------------------------------------------------- finite T (§2.3)
def test_exact_special_values():
    T = np.array([1.0, 2.0, 7.0, 1024.0, 2.0**22])
    assert np.all(rem.y2_finite(0.0, T) == 1.0 / T)
    assert np.all(rem.wmax_finite(0.0, T) == 1.0 / T)
    assert np.all(rem.entropy_finite(0.0, T) == 1.0)
    for f in (rem.y2_finite, rem.wmax_finite, rem.entropy_finite):
        assert np.all(f([1e-3, 1.0, 100.0], 1.0) == 1.0)                # a single key
    assert np.all(rem.yx_finite(0.0, [0.5, 50.0], T[:, None]) == (1.0 / T)[:, None])
    # continuity into v = 0 (the quadrature itself, not the special case)
    assert np.allclose(rem.y2_finite(1e-12, T[1:]), 1 / T[1:] + (T[1:] - 1) / T[1:] ** 2 * 1e-12,
                       rtol=0, atol=1e-11)
    assert rem.y2_finite(np.ones((3, 1)), np.array([2.0, 16.0])).shape == (3, 2)


def _gauss_mean(f, sd):
    """E f(d), d ~ N(0, sd^2), adaptive quadrature to ~1e-12."""
    g = lambda z: f(sd * z) * math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)  # noqa: E731
    return integrate.quad(g, -40, 40, points=[0.0], limit=2000, epsabs=1e-13, epsrel=1e-12)[0]


@pytest.mark.parametrize("v", [1e-4, 0.3, 1.0, 3.0, 30.0, 3000.0])
def test_two_keys_exact(v):
    """T = 2: w_1 = sigmoid(d), d = s_1 - s_2 ~ N(0, 2v): 1-D integrals (reference error
    ~1e-12). Measured quadrature errors <= 1e-9 (Y2, entropy), <= 5e-8 (wmax at small v)."""
    sd, sg = math.sqrt(2 * v), special.expit
    y2 = _gauss_mean(lambda d: sg(d) ** 2 + sg(-d) ** 2, sd)
    ent = _gauss_mean(lambda d: special.entr(sg(d)) + special.entr(sg(-d)), sd) / math.log(2)
    wm = _gauss_mean(lambda d: sg(abs(d)), sd)
    assert rem.y2_finite(v, 2) == pytest.approx(y2, abs=1e-8)
    assert rem.entropy_finite(v, 2) == pytest.approx(ent, abs=1e-8)
    assert rem.wmax_finite(v, 2) == pytest.approx(wm, abs=1e-7)


@pytest.mark.parametrize("vs,vp", [(0.3, 1.0), (4.0, 0.3), (30.0, 300.0), (300.0, 4.0)])
def test_yx_two_keys_exact(vs, vp):
    """T = 2: Yx = E_g[A^2 + (1 - A)^2], A(g) = E sigmoid(g + eta), g ~ N(0, 2 v_shared),
    eta ~ N(0, 2 v_private) (nested adaptive quadrature); both quadrature paths are hit."""
    sdp = math.sqrt(2 * vp)

    def integrand(g):
        a = _gauss_mean(lambda e: special.expit(g + e), sdp)
        return a * a + (1 - a) ** 2

    assert rem.yx_finite(vs, vp, 2) == pytest.approx(_gauss_mean(integrand, math.sqrt(2 * vs)),
                                                     abs=1e-7)


BETAS, TS, RHOS = [0.5, 1.0, 1.5, 2.0, 3.0], [16, 256, 4096], [0.0, 0.5]
NMC = {16: 100_000, 256: 20_000, 4096: 3_000}   # SE <= ~1e-3 (16, 256), ~5e-3 (4096)


@pytest.mark.parametrize("T", TS)
def test_row_statistics_vs_monte_carlo(T):
    """Y2, entropy and wmax against MC of i.i.d. Gaussian scores, v = beta^2 log T (1 - rho)
    (docs/theory.md §2.1), within 3 SE (+ QUAD_TOL); also entropy in [0, 1], wmax in [1/T, 1]."""
    v = np.array([b * b * math.log(T) * (1 - r) for b in BETAS for r in RHOS])
    mc = _mc_rows(np.sqrt(v), T, NMC[T], seed=T)
    theory = {"y2": rem.y2_finite(v, T), "entropy": rem.entropy_finite(v, T),
              "wmax": rem.wmax_finite(v, T)}
    for k, th in theory.items():
        _assert_mc(th, *mc[k], f"{k} T={T}")
    assert np.all((theory["entropy"] >= 0) & (theory["entropy"] <= 1))
    assert np.all((theory["wmax"] >= 1 / T) & (theory["wmax"] <= 1))


def test_gg25_point_and_finite_head_dimension():
    """docs/theory.md §2.3: T = 1024, beta = 1.5, rho = 0 gives Y2 ~= 0.26 (asymptotic: 0.057); with
    d_head = 64 the row variance is v chi, chi ~ chi2(64)/64 per row. MC, 3 SE."""
    T, v = 1024, 1.5**2 * math.log(1024)
    y2 = float(rem.y2_finite(v, T))
    assert y2 == pytest.approx(0.266, abs=0.002) and rem.y2_asymptotic(1.5) < 0.06
    _assert_mc(np.array([y2]), *_mc_rows([math.sqrt(v)], T, 20_000, seed=7)["y2"], "iid")
    y2d = rem.y2_finite(v, T, d_head=64)
    _assert_mc(np.array([y2d]), *_mc_rows([math.sqrt(v)], T, 20_000, seed=8, d_head=64)["y2"],
               "d_head=64")
    assert abs(y2d - y2) > 1e-3           # the chi2 spread matters at this precision


@pytest.mark.parametrize("T,beta,rho", [(16, 1.0, 0.3), (16, 2.5, 0.8), (256, 0.5, 0.2),
                                        (256, 2.0, 0.5), (256, 3.0, 0.95)])
def test_yx_vs_monte_carlo(T, beta, rho):
    """Two rows s = c + e, s' = c + e' (docs/theory.md §2.3): shared variance sigma_s^2 rho (1 -
    rho),
    private sigma_s^2 (1 - rho)^2, sigma_s = beta sqrt(log T). 3 SE (+ QUAD_TOL)."""
    ss2 = beta * beta * math.log(T)
    vs, vp = ss2 * rho * (1 - rho), ss2 * (1 - rho) ** 2
    rng, n, vals = np.random.default_rng(T + int(100 * beta)), 40_000 if T == 16 else 10_000, []
    for _ in range(10):
        c = math.sqrt(vs) * rng.standard_normal((n // 10, T))
        w1, w2 = (special.softmax(c + math.sqrt(vp) * rng.standard_normal(c.shape), axis=1)
                  for _ in range(2))
        vals.append((w1 * w2).sum(axis=1))
    vals = np.concatenate(vals)
    _assert_mc(rem.yx_finite(vs, vp, T), vals.mean(), vals.std() / math.sqrt(n), "yx")


@pytest.mark.parametrize("T", [2.0, 16.0, 1024.0])
def test_yx_limits(T):
    """v_shared -> 0: independent rows, 1/T; v_private -> 0: identical rows, Y2 (docs/theory.md
    §2.3).
    The exact endpoints are special cases; the near-endpoint values test the quadrature
    (Yx - 1/T = O(v_shared), Yx - Y2 = O(v_private))."""
    v = np.array([0.1, 3.0, 30.0])
    assert np.all(rem.yx_finite(v, 0.0, T) == rem.y2_finite(v, T))
    assert np.allclose(rem.yx_finite(v, 1e-9, T), rem.y2_finite(v, T), rtol=0, atol=1e-7)
    assert np.allclose(rem.yx_finite(1e-9, v, T), 1 / T, rtol=0, atol=1e-7)
    mid = rem.yx_finite(v, v, T)
    assert np.all((mid > 1 / T + 1e-4) & (mid < rem.y2_finite(2 * v, T)))


@PROPS
@given(v1=st.floats(1e-6, 1e4), v2=st.floats(1e-6, 1e4), t=st.integers(2, 10**6))
def test_finite_monotone_in_v(v1, v2, t):
    """Larger score variance concentrates the row: Y2, wmax up, entropy down (tolerance 1e-8
    for quadrature noise between nearby points)."""
    v = np.array([min(v1, v2), max(v1, v2)])
    assert np.diff(rem.y2_finite(v, t))[0] >= -1e-8
    assert np.diff(rem.wmax_finite(v, t))[0] >= -1e-8
    assert np.diff(rem.entropy_finite(v, t))[0] <= 1e-8


def test_invalid_input():
    with pytest.raises(ValueError):
        rem.y2_finite(1.0, 0.5)
    with pytest.raises(ValueError):
        rem.yx_finite(-1.0, 1.0, 16)
    with pytest.raises(ValueError):
        rem.entropy_finite(np.nan, 16)


def test_no_nan_or_overflow_at_extremes():
    v = np.array([0.0, 1e-12, 1e-3, 1.0, 1e4])
    T = np.array([1.0, 2.0, 2.0**22])[:, None]
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        for f in (rem.y2_finite, rem.entropy_finite, rem.wmax_finite):
            assert np.isfinite(f(v, T)).all()
        assert np.isfinite(rem.yx_finite(v[:, None], v, 2.0**22)).all()
        assert np.isfinite(rem.yx_finite(v[:, None], v, 2.0)).all()
        for t in (1, 2, 2**22):
            for tab in (rem.y2_table(t), rem.entropy_table(t), rem.wmax_table(t)):
                assert np.isfinite(tab(v)).all()
            assert np.isfinite(rem.yx_table(t)(v[:, None], [0.0, 0.5, 1.0])).all()


# ---------------------------------------------------------------------------------- tables
@pytest.mark.parametrize("T", [2, 256, 2**22])
def test_tables_match_exact(T):
    """Random points, v log-uniform on [1e-6, 1e4] plus the end points: Y2, entropy, wmax
    tables within 1e-5 (measured <= 3e-6), the Yx table within 1e-4 (measured <= 5e-5),
    rho partly crowded at 0 and 1 where the table coordinate changes scale."""
    rng = np.random.default_rng(T)
    v = np.concatenate([[0.0, 1e-3, 1e4], np.exp(rng.uniform(np.log(1e-6), np.log(1e4), 60))])
    for name in ("y2", "entropy", "wmax"):
        tab, fin = getattr(rem, name + "_table")(T), getattr(rem, name + "_finite")
        assert np.abs(tab(v) - fin(v, T)).max() < 1e-5, name
    rho = np.concatenate([rng.uniform(0, 1, 40), 1 - 10 ** rng.uniform(-7, 0, 12),
                          10 ** rng.uniform(-7, 0, 11)])
    exact = rem.yx_finite(v * rho, v * (1 - rho), T)
    assert np.abs(rem.yx_table(T)(v, rho) - exact).max() < 1e-4
    assert rem.y2_table(T) is rem.y2_table(float(T))                    # cached per T
    assert np.shape(rem.y2_table(T)(3.0)) == () and rem.yx_table(T)(v[:, None], rho).shape \
        == (v.size, rho.size)


def test_tables_with_head_dimension():
    """d_head tables (chi-average of extended plain tables) against the direct chi-average."""
    T, d, rng = 64, 16, np.random.default_rng(3)
    v = np.exp(rng.uniform(np.log(1e-3), np.log(1e4), 12))
    rho = rng.uniform(0, 1, 12)
    assert np.abs(rem.y2_table(T, d)(v) - rem.y2_finite(v, T, d)).max() < 1e-5
    exact = rem.yx_finite(v * rho, v * (1 - rho), T, d)
    assert np.abs(rem.yx_table(T, d)(v, rho) - exact).max() < 1e-4
