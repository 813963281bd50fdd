"""Finite-T REM expectations by deterministic quadrature (docs/theory.md §2.3). NumPy/SciPy,
float64.

Re-exported by :mod:`sigprop.theory.rem` (model and notation there). Quadrature: ``1/Z^k``
(``Z = sum_b e^{s_b}``) is an integral over t, then ``t = e^{-u}``; keys are independent, so
each expectation is ``T int du K(u) g0(u)^(T-1)``, ``g0 = E exp(-e^{s-u}) = 1 - m``, K a
Gaussian average of a kernel of ``x = s - u``, on uniform trapezoid grids (spectrally accurate
here): in ``z = s/sqrt v`` for v < 1, in x (Gaussian weight in closed form) for v >= 1.
``(1 - m)^(T-1)`` is taken in logs and small m is a sum of positive terms, so T <= 2**22,
v <= 1e4 (and beyond) are safe. The u-range is the support of the smoothed law of log Z
(order-statistics bounds at tail 1e-12, refined by a coarse pass). Measured accuracy ~1e-8
(T = 2 closed forms, adaptive quadrature, refined grids); results clipped to exact bounds.
"""

from __future__ import annotations

import functools
from math import comb

import numpy as np

from .lazy import LazyModule

special = LazyModule("scipy.special")

__all__ = ["y2_finite", "yx_finite", "entropy_finite", "wmax_finite"]

_ZA = np.arange(-9.6, 9.6 + 1e-9, 0.4)                # v < 1: nodes in z = s / sqrt(v)
_WA = 0.4 / np.sqrt(2 * np.pi) * np.exp(-0.5 * _ZA**2)
_XH = 0.4
_XB = np.arange(-40.0, 6.0 + 1e-9, _XH)               # v >= 1: nodes in x = s - u
_EXB = np.exp(_XB)


@functools.cache
def _kb() -> np.ndarray:
    """Kernels a1, a2, b, and m minus the smooth step Phi((x - 1/2) / (1/2)) (averaged
    exactly) on the x-grid."""
    return np.stack([np.exp(_XB - _EXB), np.exp(2 * _XB - _EXB), _XB * np.exp(_XB - _EXB),
                     -np.expm1(-_EXB) - special.ndtr((_XB - 0.5) / 0.5)], axis=1)


_KCOL = {"a1": 0, "a2": 1, "b": 2, "m": 3}
_NCOARSE, _NU, _NUX = 24, 96, 64   # u-nodes: coarse pass; Y2 and entropy; Yx and wmax
_DROP = 26.0                       # log-range of the integrand kept in u
_ZC, _WC = np.polynomial.hermite_e.hermegauss(12)     # Yx, small shared variance: GH in c
_WC = _WC / _WC.sum()
_JD, _NY, _HY, _SWITCH = 32, 160, 0.3, 0.6           # Yx lattice sizes, spacing, path switch
_ZF = np.arange(-11.0, 11.0 + 1e-9, 0.05)             # wmax: fine grids (partial integrals)
_XF = np.arange(-40.0, 4.5 + 1e-9, 0.05)
_GREG = [1 / 2, -1 / 12, 1 / 24, -19 / 720, 3 / 160, -863 / 60480]   # Gregory end weights
_GD = np.array([sum(c * comb(j, i) * (-1) ** (j - i) for j, c in enumerate(_GREG) if j >= i)
                for i in range(6)])


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# ------------------------------------------------------------------- finite T (docs/theory.md §2.3)
def tpow(m, n):
    """``(1 - m)^n`` for 0 <= m <= 1 in log space; n = 0 gives 1."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.exp(np.where(n == 0, 0.0, n * np.log1p(-np.clip(m, -0.5, 1.0))))


def _terms_small(uu, sg, need):
    """sig < 1: trapezoid in z, kernels evaluated at ``x = sig z - u``."""
    x = np.minimum(sg * _ZA - uu, 700.0)
    ex = np.exp(x)
    k1 = np.exp(x - ex)
    get = {"a1": lambda: k1 @ _WA, "a2": lambda: np.einsum("...i,...i,i", k1, ex, _WA),
           "b": lambda: np.einsum("...i,...i,i", k1, x, _WA), "m": lambda: np.expm1(-ex) @ -_WA}
    return np.stack([get[k]() for k in need], axis=-1)


def _terms_large(uu, sg, need):
    """sig >= 1: fixed kernel vectors on the x-grid against Gaussian weights (in place)."""
    g = _XB + uu
    g *= 1.0 / sg
    g *= g
    g *= -0.5
    g += np.log(_XH / np.sqrt(2 * np.pi)) - np.log(sg)
    res = np.exp(g, out=g) @ _kb()[:, [_KCOL[k] for k in need]]
    if "m" in need:
        step = special.ndtr(-(uu[..., 0] + 0.5) / np.sqrt(sg[..., 0] ** 2 + 0.25))
        res[..., need.index("m")] += step
    return res


def row_terms(u, sig, need):
    """Gaussian averages ``E_s k(s - u)``, s ~ N(0, sig^2), for u of shape (P, n), sig (P,).

    ``m``: 1 - exp(-e^x); ``a1``: e^{x - e^x}; ``a2``: e^{2x - e^x}; ``b``: x e^{x - e^x}.
    For sig >= 1, m = (step ``Phi((x - 1/2)/(1/2))``, averaged in closed form) + (remainder
    ``R >= 0`` vanishing at both ends, on the grid): positive terms, full relative precision.
    """
    out = {k: np.empty(u.shape) for k in need}
    small = sig < 1.0
    for sel, fn in ((small, _terms_small), (~small, _terms_large)):
        if sel.any():
            res = fn(u[sel][..., None], sig[sel][:, None, None], need)
            for i, k in enumerate(need):
                out[k][sel] = res[..., i]
    return out


def linear_grid(a, b, n):
    """Uniform trapezoid nodes and weights on [a, b] per point: shapes (P, n)."""
    u = a[:, None] + (b - a)[:, None] * np.linspace(0.0, 1.0, n)
    w = np.repeat(((b - a) / (n - 1))[:, None], n, axis=1)
    w[:, [0, -1]] *= 0.5
    return u, w


def score_bracket(sig, T):
    """u-interval carrying the integrands: the smoothed law of log Z, ``J = T a1 g0^(T-1)``.
    ``log Z >= max(log T + mean(s), max(s))``, ``log Z <= log T + max(s)``, Gaussian quantiles
    at tail 1e-12; a coarse pass keeps where log J > max - _DROP."""
    lt, a_hi = np.log(T), -special.ndtri(1e-12 / T)
    a_lo = -special.ndtri(-np.expm1(np.log(1e-12) / T))
    lo = np.maximum(lt - 7.5 * sig / np.sqrt(T), sig * a_lo) - 6.0
    u, _ = linear_grid(lo, lt + sig * a_hi + _DROP + 2.0, _NCOARSE)
    f = row_terms(u, sig, ("a1", "m"))
    with np.errstate(divide="ignore"):
        lj = np.log(f["a1"]) + np.log(tpow(f["m"], T[:, None] - 1))
    ok = lj >= lj.max(axis=1, keepdims=True) - _DROP
    i0 = np.maximum(np.argmax(ok, axis=1) - 1, 0)
    i1 = np.minimum(_NCOARSE - np.argmax(ok[:, ::-1], axis=1), _NCOARSE - 1)
    return u[np.arange(len(u)), i0], u[np.arange(len(u)), i1]


def _kernel_integral(v, T, key):
    """``T int du E_s[k(s - u)] g0(u)^(T-1)`` for the kernel ``key`` of :func:`row_terms`."""
    sig = np.sqrt(v)
    u, w = linear_grid(*score_bracket(sig, T), _NU)
    f = row_terms(u, sig, (key, "m"))
    return T * np.sum(w * f[key] * tpow(f["m"], T[:, None] - 1), axis=1)


def _y2_core(v, T):
    """``Y2 = T int_0^inf t g2 g0^(T-1) dt = T int du E[e^{2(s-u)} exp(-e^{s-u})] g0^(T-1)``."""
    return _kernel_integral(v, T, "a2")


def _entropy_core(v, T):
    """``H = E log Z - E sum w s = -gamma - T int E[(s-u) e^{s-u-e^{s-u}}] g0^(T-1) du``:
    E log Z = int u J du - gamma (Frullani; gamma = mean of the Gumbel law of u - log Z) and
    E sum w s = int u J du + T int E[(s-u) ...] ..., so the ``u J`` terms cancel."""
    return (-np.euler_gamma - _kernel_integral(v, T, "b")) / np.log(T)


def _tail_integral(f, h):
    """``int_{x_k}^inf f`` on a uniform grid (f ~ 0 at the top): Gregory end correction."""
    n = f.shape[-1]
    pad = np.concatenate([f, np.zeros(f.shape[:-1] + (5,))], axis=-1)
    corr = sum(_GD[i] * pad[..., i:i + n] for i in range(6))
    return h * (np.cumsum(f[..., ::-1], axis=-1)[..., ::-1] - corr)


def _wmax_core(v, T):
    """``E w_max = T E[e^{s_1}/Z; s_1 = max] = T int du E_s[e^{x - e^x} K(u, s)^(T-1)]``
    (x = s - u) with ``K = E[exp(-e^{s'-u}); s' < s] = 1 - m(u) - U(u, s)``,
    ``U = int_s^inf p(s') exp(-e^{s'-u}) ds'``: an upper-tail integral, cumulative on a fine
    grid with Gregory end corrections (sixth order)."""
    sig = np.sqrt(v)
    u, w = linear_grid(*score_bracket(sig, T), _NUX)
    res, small = np.empty(T.shape), sig < 1.0
    for sel in (small, ~small):
        if not sel.any():
            continue
        uu, sg = u[sel][..., None], sig[sel][:, None, None]
        if sel is small:
            x, h = np.minimum(sg * _ZF - uu, 700.0), _ZF[1] - _ZF[0]
            dens = np.exp(-0.5 * _ZF**2) / np.sqrt(2 * np.pi)
            m = np.sum(h * dens * -np.expm1(-np.exp(x)), axis=-1)
        else:
            x, h = _XF, _XF[1] - _XF[0]
            dens = np.exp(-0.5 * ((x + uu) / sg) ** 2) / (np.sqrt(2 * np.pi) * sg)
            m = row_terms(u[sel], sig[sel], ("m",))["m"]
        ex = np.exp(x)
        tail = _tail_integral(dens * np.exp(-ex), h)
        k = h * dens * np.exp(x - ex) * tpow(m[..., None] + tail, T[sel, None, None] - 1)
        res[sel] = T[sel] * np.sum(w[sel] * k.sum(-1), axis=1)
    return res


def _yx_small_shared(vs, vp, T, u, w):
    """Shared std small vs the private kernels: Gauss-Hermite over c, (u, u') tensor grid;
    ``1 - G00 = mbar_i + mbar_j - E_c[m_i m_j]`` keeps small values precise."""
    P, n = u.shape
    f = row_terms((u[:, :, None] - np.sqrt(vs)[:, None, None] * _ZC).reshape(P, -1),
                   np.sqrt(vp), ("a1", "m"))
    m, a1 = f["m"].reshape(P, n, -1), f["a1"].reshape(P, n, -1)
    mbar = m @ _WC
    m00 = mbar[:, :, None] + mbar[:, None, :] - (m * _WC) @ m.transpose(0, 2, 1)
    f2 = ((a1 * _WC) @ a1.transpose(0, 2, 1)) * tpow(m00, T[:, None, None] - 1)
    return T * np.einsum("pi,pij,pj->p", w, f2, w)


def _yx_large_shared(vs, vp, T, u, w):
    """Shared std comparable or larger: the integrand hugs the diagonal u = u', so use
    ``ubar = (u+u')/2`` and ``delta = u - u'`` (even in delta), with ``c = ubar + y`` on a
    lattice shared with the kernels' arguments ``u - c = delta/2 - y``, ``u' - c = -delta/2 - y``.
    ``1 - G00 = mbar(ubar) + E_c[(1 - a0 a0') - m(ubar - c)]`` (mbar: exact 1-row m at the total
    variance): the bracket vanishes far from ubar on both sides, so the c-window needs no tails.
    """
    sc, sp = np.sqrt(vs), np.sqrt(vp)
    dreq = np.minimum(u[:, -1] - u[:, 0], 20.0 - 1.5 * sp * special.ndtri(1e-12 / T))
    hu = (u[:, -1] - u[:, 0]) / (u.shape[1] - 1)
    h = np.maximum.reduce([np.minimum.reduce([_HY * np.maximum(1.0, sp), hu, sc]),
                           dreq / (2 * _JD), (dreq + 40.0 + 16.0 * sp) / (_NY - 1)])
    yl, off = 0.5 * dreq + 35.0 + 8.0 * sp, _JD + _NY - 1
    f = row_terms(yl[:, None] + h[:, None] * np.arange(-off, _JD + 1), sp, ("a1", "m"))
    k, j = np.arange(_NY)[:, None], np.arange(_JD + 1)[None, :]
    i1, i2 = j - k + off, -j - k + off
    a1, m = f["a1"], f["m"]
    m1, m2 = m[:, i1], m[:, i2]
    bb = np.concatenate([m1 + m2 - m1 * m2 - m[:, off - k], a1[:, i1] * a1[:, i2]], axis=2)
    c = u[:, :, None] + (h[:, None] * np.arange(_NY) - yl[:, None])[:, None, :]
    c *= 1.0 / sc[:, None, None]
    c *= c
    c *= -0.5
    c += np.log(h / (np.sqrt(2 * np.pi) * sc))[:, None, None]
    # c-averages [1 - G00 - mbar, G11]; products split into 8-row blocks so that each BLAS
    # call stays below OpenBLAS's threading threshold (threads thrash on a loaded machine)
    g = (np.exp(c, out=c).reshape(len(T), -1, 8, _NY) @ bb[:, None]).reshape(*c.shape[:2], -1)
    m00 = row_terms(u, np.sqrt(vs + vp), ("m",))["m"][:, :, None] + g[:, :, :_JD + 1]
    f2 = g[:, :, _JD + 1:] * tpow(m00, T[:, None, None] - 1)
    f2[:, :, 1:] *= 2.0
    return T * 2.0 * h * np.einsum("pi,pij->p", w, f2)


def _yx_core(vs, vp, T):
    out = np.empty(T.shape)
    same = vp == 0
    if same.any():
        out[same] = _y2_core(vs[same], T[same])
    vs, vp, T = vs[~same], vp[~same], T[~same]
    if not T.size:
        return out
    u, w = linear_grid(*score_bracket(np.sqrt(vs + vp), T), _NUX)
    res = np.empty(T.shape)
    small = np.sqrt(vs) < _SWITCH * np.maximum(1.0, np.sqrt(vp))
    for sel, fn in ((small, _yx_small_shared), (~small, _yx_large_shared)):
        if sel.any():
            res[sel] = fn(vs[sel], vp[sel], T[sel], u[sel], w[sel])
    out[~same] = res
    return out


@functools.cache
def chi_nodes(d_head: int):
    """Quadrature for chi ~ chi2(d)/d = X/k, X ~ Gamma(k = d/2) (docs/theory.md §2.3): trapezoid in
    log X (density ``exp(k t - e^t)``, tails cut at 1e-13), >= 48 nodes, spacing <= 0.25.
    (Gauss-Laguerre fails both for d = 1, mass near 0, and for d >~ 1000.)"""
    if d_head < 1:
        raise ValueError("d_head must be a positive integer")
    k = d_head / 2.0
    lo, hi = np.log(special.gammaincinv(k, 1e-13)), np.log(special.gammainccinv(k, 1e-13))
    t = np.linspace(lo, hi, max(48, int(np.ceil((hi - lo) / 0.25)) + 1))
    w = np.exp(k * t - np.exp(t) - np.max(k * t - np.exp(t)))
    return np.exp(t) / k, w / w.sum()


def _evaluate(core, variances, T, d_head, chunk, at0, lo):
    """Broadcast; optionally average the variances over the chi2 row scale (extra axis);
    fill degenerate points (T = 1 or first variance 0) with ``at0(T)``; run the core on the
    others in chunks; clip to the exact bounds ``[lo(T), 1]``."""
    arrs = np.broadcast_arrays(*[f64(a) for a in (*variances, T)])
    shape, flat = arrs[0].shape, [a.ravel() for a in arrs]
    if np.any(~(flat[-1] >= 1)) or any(np.any(~(a >= 0)) for a in flat[:-1]):
        raise ValueError("need T >= 1 and variances >= 0")
    if d_head is not None:
        chi, wc = chi_nodes(int(d_head))
        flat = [np.multiply.outer(a, chi).ravel() for a in flat[:-1]] \
            + [np.repeat(flat[-1], chi.size)]
    T = flat[-1]
    out = at0(T)
    reg = np.flatnonzero((T > 1) & (flat[0] > 0))
    for i in range(0, reg.size, chunk):
        idx = reg[i:i + chunk]
        out[idx] = np.clip(core(*[a[idx] for a in flat]), lo(T[idx]), 1.0)
    if d_head is not None:
        out = out.reshape(-1, chi.size) @ wc
    return out.reshape(shape)


def inv_length(T):
    return 1.0 / T


def y2_finite(v, T, d_head=None) -> np.ndarray:
    """``Y2 = E sum_b w_b^2``, i.i.d. scores ``N(v)`` over T keys (docs/theory.md §2.3): the exact
    1-D
    integral ``T int_0^inf t g2 g0^(T-1) dt``. ``d_head``: averaged over the row variance
    ``v chi``, ``chi ~ chi2(d_head)/d_head`` (:func:`chi_nodes`). v = 0 gives 1/T exactly,
    T = 1 gives 1. T may be any real >= 1."""
    return _evaluate(_y2_core, (v,), T, d_head, 32, inv_length, inv_length)


def yx_finite(v_shared, v_private, T, d_head=None) -> np.ndarray:
    """``Yx = E sum_b w_b w'_b`` for rows ``s = c + e``, ``s' = c + e'`` (docs/theory.md §2.3 end),
    c, e,
    e' independent Gaussians with variances v_shared, v_private, v_private.

    ``1/(Z Z') = int int e^{-tZ - t'Z'}``; given c the rows factorise, so
    ``Yx = T int int du du' E_c[a1(u-c) a1(u'-c)] (E_c[a0(u-c) a0(u'-c)])^(T-1)`` with the
    private-noise kernels ``a0 = E_e exp(-e^{c+e-u})``, ``a1 = E_e[e^{c+e-u} exp(-e^{c+e-u})]``:
    the c-averages are matrix products over a c-grid. v_shared = 0 gives 1/T exactly,
    v_private = 0 gives y2_finite(v_shared) exactly. ``d_head``: both rows share one chi draw
    (both variances scaled by it), a simplification (real rows have independent query norms).
    """
    return _evaluate(_yx_core, (v_shared, v_private), T, d_head, 16, inv_length, inv_length)


def entropy_finite(v, T, d_head=None) -> np.ndarray:
    """``E[H(w)] / log T``, ``H = log Z - sum_b w_b s_b`` (docs/theory.md §2.3: E log Z by Frullani,
    E sum w s via 1/Z = int e^{-tZ} dt). v = 0 gives 1; a single key (T = 1) is defined as
    entropy 1.0 (the uniform distribution over one key)."""
    return _evaluate(_entropy_core, (v,), T, d_head, 32, np.ones_like, np.zeros_like)


def wmax_finite(v, T, d_head=None) -> np.ndarray:
    """``E max_b w_b`` (deshpande26 Eq. 4) by the deterministic 2-D quadrature over (s, t) of
    :func:`_wmax_core`; in [1/T, 1]."""
    return _evaluate(_wmax_core, (v,), T, d_head, 8, inv_length, inv_length)

