"""Cached spline tables of the finite-T REM expectations (docs/theory.md §2.3). NumPy/SciPy,
float64.

Re-exported by :mod:`sigprop.theory.rem`. ``*_table(T, d_head)`` returns a fast function of the
row variance (and rho for Yx): a spline through :mod:`.rem_finite` values, cached in memory per
(T, d_head) and on disk (:func:`disk_cached`). The spline evaluators and the disk cache are
shared with :mod:`.fluct`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np

from .lazy import LazyModule
from .rem_finite import (
    chi_nodes,
    entropy_finite,
    f64,
    inv_length,
    wmax_finite,
    y2_finite,
    yx_finite,
)

special = LazyModule("scipy.special")

__all__ = ["y2_table", "yx_table", "entropy_table", "wmax_table"]


def _expit(x: np.ndarray) -> np.ndarray:
    """Logistic function without SciPy, overflow-free: ``exp(-log1p(exp(-x)))``."""
    return np.exp(-np.logaddexp(0.0, -x))


# ------------------------------------------------------------------ splines and the disk cache
def grid_cell(grid, q):
    """Cell index of q on a uniform grid (clipped to the end cells) and the offset in it (NaN
    for a NaN q: its index is the first cell's, so that no NaN is cast to an integer)."""
    pos = (q - grid[0]) * ((grid.size - 1) / (grid[-1] - grid[0]))
    pos = np.where(np.isnan(pos), 0.0, np.clip(pos, 0, grid.size - 2))
    i = pos.astype(np.intp)
    return i, q - grid[i]


def notaknot(x, vals, axis):
    """Not-a-knot cubic spline coefficients along ``axis`` on the uniform grid x (at least 4
    nodes), shaped as :class:`scipy.interpolate.CubicSpline`'s ``c``: (4, n - 1, other axes).
    NumPy only (one dense solve for the second derivatives): importing scipy.interpolate costs
    0.3-0.8 s, more than loading :mod:`.causal`'s tables, which refit these splines on every
    load. Equal to scipy's coefficients to ~3e-14 (tests/theory/test_causal.py)."""
    y = np.moveaxis(np.asarray(vals, dtype=np.float64), axis, 0)
    n, h = x.size, (x[-1] - x[0]) / (x.size - 1)
    a = np.zeros((n, n))
    rhs = np.zeros(y.shape)
    i = np.arange(1, n - 1)
    a[i, i - 1], a[i, i], a[i, i + 1] = 1.0, 4.0, 1.0
    rhs[1:-1] = 6.0 / h**2 * (y[2:] - 2.0 * y[1:-1] + y[:-2])
    a[0, :3] = a[-1, -3:] = (1.0, -2.0, 1.0)  # third derivative continuous at x1, x_{n-2}
    m = np.linalg.solve(a, rhs.reshape(n, -1)).reshape(y.shape)
    return np.stack([(m[1:] - m[:-1]) / (6.0 * h), 0.5 * m[:-1],
                     (y[1:] - y[:-1]) / h - h * (2.0 * m[:-1] + m[1:]) / 6.0, y[:-1]])


def _spline1_coef(x, vals):
    """Not-a-knot cubic spline coefficients (4, n-1) on the uniform grid x."""
    return notaknot(x, vals, 0)


def _spline1(x, c):
    """Fast evaluator of spline coefficients ``c`` on a uniform grid (arithmetic cell lookup)."""

    def ev(xq):
        i, d = grid_cell(x, xq)
        return ((c[0][i] * d + c[1][i]) * d + c[2][i]) * d + c[3][i]

    return ev


def bicubic_coef(x, y, vals):
    """Tensor-product not-a-knot cubic spline on a uniform (x, y) grid as per-cell bicubic
    polynomials: (x-power, y-power, cell), highest power first."""
    cx = notaknot(x, vals, 0)                                     # (4, nx-1, ny)
    c = notaknot(y, cx, 2)                                        # (4, ny-1, 4, nx-1)
    return c.transpose(2, 0, 3, 1).reshape(4, 4, -1)


def bicubic_eval(x, y, coef):
    """Fast evaluator of :func:`bicubic_coef` (arithmetic cell lookup, 16 coefficients)."""

    def ev(xq, yq):
        (i, dx), (j, dy) = grid_cell(x, xq), grid_cell(y, yq)
        cell, out = i * (y.size - 1) + j, 0.0
        for ck in coef:
            out = out * dx + ((ck[0][cell] * dy + ck[1][cell]) * dy + ck[2][cell]) * dy \
                + ck[3][cell]
        return out

    return ev


_CACHE_VERSION = "rem-v1"  # bump whenever a table's nodes or quadrature change


def _cache_dir() -> str:
    root = os.environ.get("SIGPROP_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "sigprop")
    return os.path.join(root, _CACHE_VERSION)


def disk_cached(key: str, compute: Callable[[], dict]) -> dict:
    """Table coefficients are deterministic functions of (kind, T, d_head): keep them in
    ``$SIGPROP_CACHE_DIR`` (default ``~/.cache/sigprop``) so a new process skips the
    quadrature. ``SIGPROP_NO_CACHE=1`` disables it; an unwritable cache is silently skipped."""
    if os.environ.get("SIGPROP_NO_CACHE"):
        return compute()
    path = os.path.join(_cache_dir(), key + ".npz")
    try:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError):
        pass
    out = compute()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, **out)
        os.replace(tmp, path)
    except OSError:
        pass
    return out


# ------------------------------------------------------------------------------------ tables
_LMIN, _LMAX = np.log(1e-3), np.log(1e4)
_LTOP = np.log(1e16)  # beyond _LMAX: an extended table to 1e16, then the 1/sqrt(v) law
_KINDS = {  # finite function, node spacing in log v, small-v power of F - F(0), F(0), F(inf)
    "y2": (y2_finite, 0.1, 1.0, inv_length, 1.0),
    "entropy": (entropy_finite, 0.1, 1.0, np.ones_like, 0.0),
    "wmax": (wmax_finite, 0.2, 0.5, inv_length, 1.0),
}


@functools.lru_cache(maxsize=256)
def _table1d(kind: str, T: float, d_head: int | None, lmax: float = _LMAX):
    """Cubic spline in ``l = log v`` on [1e-3, e^lmax] of ``logit p``,
    ``p = (F - F(0)) / (F(inf) - F(0))`` (nearly linear in l at both ends). Below 1e-3:
    ``p = c1 t + c2 t^2``, ``t = (v/1e-3)^power`` (p is analytic in v^power at 0), matched in
    value and slope at the first node. Above the grid (v > 1e4): the same table on
    [1e-3, 1e16], built when first needed; above 1e16: ``1 - p = (1 - p_top) sqrt(v_top / v)``
    (the REM's large-v law; measured deviation of that law from the exact values, applied
    from 1e4 on: <= 4e-5 absolute, so <= ~1e-10 from 1e16 on). Bounded cost per call at any v
    (exact quadrature there took ~0.2 s per call for wmax). With d_head: the chi-average of
    the plain table (extended to cover v chi_max) at the nodes."""
    fin, lh, power, at0, at_inf = _KINDS[kind]
    if T == 1:
        return lambda v: np.ones(np.shape(v))
    y0, lv = at0(T), np.linspace(_LMIN, lmax, int(round((lmax - _LMIN) / lh)) + 1)

    def build():
        if d_head is None:
            vals = fin(np.exp(lv), T)
        else:
            chi, wc = chi_nodes(d_head)
            base = _table1d(kind, T, None, lmax + lh * np.ceil(np.log(chi[-1]) / lh))
            vals = base(np.multiply.outer(np.exp(lv), chi)) @ wc
        p = np.clip((vals - y0) / (at_inf - y0), 1e-300, 1 - 1e-16)
        return {"c": _spline1_coef(lv, special.logit(p)), "p": p}

    z = disk_cached(f"{kind}-T{T!r}-d{d_head}-l{lmax:.9g}", build)
    p, coef = z["p"], z["c"]
    spl = _spline1(lv, coef)
    dp = p[0] * (1 - p[0]) * coef[2][0] / power  # spline slope at the first node

    def f(v):
        shape, v = np.shape(v), f64(v).ravel()
        out = _expit(spl(np.log(np.clip(v, np.exp(lv[0]), None))))
        low = v < np.exp(lv[0])
        t = (v[low] / np.exp(lv[0])) ** power
        out[low] = (2 * p[0] - dp) * t + (dp - p[0]) * t * t
        high = v > np.exp(lv[-1]) * (1 + 1e-12)
        if high.any() and lmax < _LTOP:  # a table reaching further, built once (disk cache)
            out = y0 + (at_inf - y0) * out
            out[high] = _table1d(kind, T, d_head, _LTOP)(v[high])
            return out.reshape(shape)
        if high.any():  # 1 - p ~ C / sqrt(v): the top row's gap to its runner-up is ~ sqrt(v)
            out[high] = 1.0 - (1.0 - p[-1]) * np.sqrt(np.exp(lv[-1]) / v[high])
        return (y0 + (at_inf - y0) * out).reshape(shape)

    # the pieces :mod:`.causal_positions` needs to evaluate many T's tables on one grid at once
    f.parts = {"lv": lv, "coef": coef, "p0": p[0], "dp": dp, "power": power, "y0": y0,
               "at_inf": at_inf, "lmax": lmax}
    return f


def y2_table(T, d_head=None) -> Callable[[np.ndarray], np.ndarray]:
    """``v -> y2_finite(v, T, d_head)``: cubic spline in log v (nodes 0.1 apart on [1e-3, 1e4])
    of the logit of ``(Y2 - 1/T)/(1 - 1/T)``, cached per (T, d_head); v < 1e-3 continued
    analytically (Y2 - 1/T ~ v), v > 1e4 evaluated exactly."""
    return _table1d("y2", float(T), None if d_head is None else int(d_head))


def entropy_table(T, d_head=None) -> Callable[[np.ndarray], np.ndarray]:
    """``v -> entropy_finite(v, T, d_head)``, as :func:`y2_table` (1 - entropy ~ v)."""
    return _table1d("entropy", float(T), None if d_head is None else int(d_head))


def wmax_table(T, d_head=None) -> Callable[[np.ndarray], np.ndarray]:
    """``v -> wmax_finite(v, T, d_head)``, as :func:`y2_table` (nodes 0.2 apart;
    wmax - 1/T ~ sqrt v)."""
    return _table1d("wmax", float(T), None if d_head is None else int(d_head))


XI_NODES, _ALPHA = np.linspace(0.0, 1.0, 21), 0.5
_LV2MIN = np.log(1e-2)
_LH2 = (_LMAX - _LV2MIN) / 23                         # 24 nodes in log v on [1e-2, 1e4]


def xi_of_rho(v, rho):
    """Yx table coordinate for rho at fixed v: ``a (1-rho) + (1-a) log1p(v_p) / log1p(v)``,
    ``v_p = v (1 - rho)``: linear in rho near rho = 0 and logarithmic in the private variance
    near rho = 1, where Yx moves when v_p ~ 1 (xi = 0: rho = 1, xi = 1: rho = 0)."""
    return _ALPHA * (1 - rho) + (1 - _ALPHA) * np.log1p(v * (1 - rho)) / np.log1p(v)


def rho_of_xi(v, xi):
    lo, hi = np.zeros(np.broadcast(v, xi).shape), np.ones(np.broadcast(v, xi).shape)
    for _ in range(60):                                # bisection: xi decreases in rho
        mid = 0.5 * (lo + hi)
        big = xi_of_rho(v, mid) > xi
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=256)
def _table2d(T: float, d_head: int | None, lmax: float = _LMAX):
    """Bicubic spline on (log v, xi) of ``R = (Yx - 1/T) / (Y2 - 1/T)`` (R = 1 at rho = 1,
    0 at rho = 0, ~rho at small v); ``Yx = 1/T + R (Y2 - 1/T)`` with the Y2 table. Dividing
    out Y2 removes the steep condensation step in v. Below v = 1e-2, R is frozen at its value
    there (error O(1e-2) * (Y2 - 1/T)); above the grid: exact (~0.02-0.07 s per call; the
    same spline extended to 1e8 erred by up to 7e-4 near rho = 1, ~30x its error on the
    grid, so it is not used)."""
    y2 = _table1d("y2", T, d_head, _LMAX + 0.1 * np.ceil((lmax - _LMAX) / 0.1 - 1e-9))
    if T == 1:
        return lambda v, rho: np.ones(np.broadcast(f64(v), f64(rho)).shape)
    lv = np.arange(_LV2MIN, lmax + 1e-9, _LH2)
    vt = np.exp(lv)[:, None]

    def build():
        rho = rho_of_xi(vt, XI_NODES[1:-1])
        if d_head is None:
            inner = yx_finite(vt * rho, vt * (1 - rho), T)
        else:
            chi, wc = chi_nodes(d_head)
            base = _table2d(T, None, lv[-1] + _LH2 * np.ceil(np.log(chi[-1]) / _LH2))
            inner = base(np.multiply.outer(vt, chi), rho[..., None]) @ wc
        r = np.concatenate([np.ones_like(vt), (inner - 1 / T) / (y2(vt) - 1 / T), 0 * vt],
                           axis=1)
        return {"coef": bicubic_coef(lv, XI_NODES, r)}

    coef = disk_cached(f"yx-T{T!r}-d{d_head}-l{lmax:.9g}", build)["coef"]
    spl, vmin, vmax = bicubic_eval(lv, XI_NODES, coef), vt[0, 0], vt[-1, 0]

    def f(v, rho):
        v, rho = np.broadcast_arrays(f64(v), np.clip(f64(rho), 0.0, 1.0))
        shape, v, rho = v.shape, v.ravel(), rho.ravel()
        vc = np.clip(v, vmin, vmax)
        out = 1.0 / T + spl(np.log(vc), xi_of_rho(vc, rho)) * (y2(v) - 1.0 / T)
        high = v > vmax * (1 + 1e-12)
        if high.any():
            out[high] = yx_finite(v[high] * rho[high], v[high] * (1 - rho[high]), T, d_head)
        return out.reshape(shape)

    f.parts = {"lv": lv, "coef": coef, "vmin": vmin, "vmax": vmax, "y2": y2}  # for .causal
    return f


def yx_table(T, d_head=None) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``(v, rho) -> yx_finite(v rho, v (1 - rho), T, d_head)``, v the row variance
    ``sigma_s^2 (1 - rho)`` (docs/theory.md §2.3): bicubic spline of the ratio to Y2 on 24 x 21
    nodes
    in (log v, :func:`xi_of_rho`), cached per (T, d_head); v > 1e4 evaluated exactly."""
    return _table2d(float(T), None if d_head is None else int(d_head))
