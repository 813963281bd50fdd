"""Mean-field MLP kernels ``(E[phi(u)^2], E[phi(u) phi(u')])`` (docs/theory.md §2.5).

``(u, u') ~ N(0, [[q1, p1], [p1, q1]])`` where ``q1 = sigma_w^2 q + sigma_b^2`` and
``p1 = sigma_w^2 p + sigma_b^2`` are the pre-activation second moments (the caller has already
applied the weight and bias variances).  Everything is float64 NumPy/SciPy and broadcasts
``q1`` against ``p1``.

Quadrature.  Write ``u = sqrt(q1) x``, ``u' = sqrt(q1) (c x + sqrt(1 - c^2) z)`` with ``x, z``
i.i.d. standard normal and ``c = p1 / q1``.  The default 2-D rule is the truncated trapezoid
(sinc) rule on ``[-9, 9]^2`` with a disc-shaped node set; its error for a Gaussian-weighted
integrand analytic in a strip of half-width ``a`` decays like ``exp(-2 pi a / h)``.  For tanh
the strip is ``a = pi / (2 sqrt(q1))``, so the step is ``h = min(0.5, 0.28 / sqrt(q1))``
(measured: <= ~1e-12 for tanh/gelu/silu at q1 <= 20).  Gauss-Hermite (``rule="hermite"``) is
kept for comparison: it is markedly worse for tanh at large q1 (2-D GH with 256 nodes per
dimension still errs by ~2e-6 at q1 = 10, the trapezoid rule with 205 nodes by ~1e-12).

Fast path.  :func:`kernel` on many points sharing a q1 value (post-LN blocks: q1 = sigma_w^2 +
sigma_b^2) tabulates E[phi phi'] once per ``(activation, q1)`` (``functools.lru_cache``) as a
quintic spline in ``theta = arccos c`` whose accuracy against direct quadrature is checked while
it is built (<= 1e-10 at the check, ~1e-12 measured); evaluating 65536 points then costs a few ms.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from .lazy import LazyModule

special = LazyModule("scipy.special")

ACTIVATIONS = ("relu", "gelu", "tanh", "silu", "linear", "swiglu", "geglu")
_QUAD_ACTIVATIONS = ("relu", "gelu", "tanh", "silu", "linear")  # single-input phi

_L = 9.0  # half-width of the truncated node domain (Gaussian weight e^{-L^2/2} ~ 3e-18)
_H_MAX, _H_KAPPA = 0.5, 0.28  # trapezoid step h = min(_H_MAX, _H_KAPPA / sqrt(q1_max))
_CHUNK_ELEMS = 1 << 21  # points x nodes per chunk: ~16 MB per temporary array
_INTERP_TOL = 1e-10  # midpoint check of the cached c-spline (final one ~64x better)
_INTERP_MIN_POINTS = 256  # use the cached spline when a q1 value has at least this many points
_INTERP_MAX_UNIQUE = 128  # = lru_cache size of the tables
_ROUNDOFF = 1e-12
_N_MAX = 1025  # cap on the trapezoid nodes per dimension: <= ~830k 2-D nodes, ~26 MB of rule
_Q1_SAT = 1e8  # above it: the large-scale limit (sign or relu), see gauss_kernel for accuracy
_Q1_EXACT = 1e30  # from here the limits are exact to roundoff (tanh: 1 - E tanh^2 ~ 1e-15)
_Q1_CAP = (_H_KAPPA * (_N_MAX - 1) / (2 * _L)) ** 2  # ~254: largest q1 at full node count


def _check(name: str, allowed: tuple[str, ...] = ACTIVATIONS) -> str:
    if name not in allowed:
        raise ValueError(f"unknown activation {name!r}; allowed values: {', '.join(allowed)}")
    return name


def activation_fn(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """NumPy activation ``phi`` (gelu is the exact ``x Phi(x)``, silu uses a stable sigmoid)."""
    if name in ("swiglu", "geglu"):
        raise ValueError(f"{name} is a product of two branches, not a single-input function; "
                         f"use kernel({name!r}, ...)")
    fns = {
        "relu": lambda x: np.maximum(x, 0.0),
        "gelu": lambda x: x * special.ndtr(x),
        "tanh": np.tanh,
        "silu": lambda x: x * special.expit(x),
        "linear": lambda x: np.asarray(x, dtype=np.float64) * 1.0,
    }
    return fns[_check(name, _QUAD_ACTIVATIONS)]


def _moments(q1, p1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Broadcast, validate and return ``(q1, p1, c)``; ``c`` is clipped only against roundoff."""
    q1, p1 = np.broadcast_arrays(np.asarray(q1, dtype=np.float64),
                                 np.asarray(p1, dtype=np.float64))
    if np.any(q1 < 0):
        raise ValueError("q1 must be >= 0")
    if np.any(np.abs(p1) > q1 * (1.0 + _ROUNDOFF)):
        raise ValueError("need |p1| <= q1 (|c| = |p1/q1| may exceed 1 only by roundoff < 1e-12)")
    c = np.divide(p1, q1, out=np.ones_like(q1), where=q1 > 0)
    np.clip(c, -1.0, 1.0, out=c)  # NaN passes through
    return q1, p1, c


def relu_kernel(q1, p1) -> tuple[np.ndarray, np.ndarray]:
    """Arc-cosine closed form for ReLU (docs/theory.md §2.5): ``(q1/2, (q1/2) k(c))`` with
    ``k(c) = (sqrt(1 - c^2) + c (pi - arccos c)) / pi``; ``q1 = 0`` gives ``(0, 0)``."""
    q1, _, c = _moments(q1, p1)
    k = (np.sqrt(np.maximum(1.0 - c * c, 0.0)) + c * (np.pi - np.arccos(c))) / np.pi
    return np.asarray(0.5 * q1), np.asarray(0.5 * q1 * k)


@functools.lru_cache(maxsize=64)
def _rule1d(rule: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """1-D nodes and weights for E[f(x)], x ~ N(0, 1)."""
    if rule == "hermite":
        x, w = hermegauss(n)
        return x, w / math.sqrt(2.0 * math.pi)
    if rule == "trapezoid":
        x = np.linspace(-_L, _L, n)
        return x, (x[1] - x[0]) * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    raise ValueError(f"unknown rule {rule!r}; allowed values: trapezoid, hermite")


@functools.lru_cache(maxsize=4)
def _rule2d(rule: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tensor rule with negligible-weight nodes dropped: (x index, x, z, weight)."""
    x, w = _rule1d(rule, n)
    ix, iz = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    ww = w[ix] * w[iz]
    keep = ww > 1e-18 * ww.max()  # trapezoid: the disc x^2 + z^2 <~ L^2 (drops ~21%)
    return ix[keep], x[ix[keep]], x[iz[keep]], ww[keep]


def _auto_n(q1max: float) -> int:
    """Trapezoid nodes per dimension for tanh-grade accuracy (~1e-12) at ``q1 <= q1max``,
    capped at ``_N_MAX`` (reached at q1 ~ 250; beyond it see :func:`gauss_kernel`)."""
    q1max = min(q1max, _Q1_SAT) if np.isfinite(q1max) else 0.0
    h = min(_H_MAX, _H_KAPPA / math.sqrt(max(q1max, 1e-300)))
    return min(2 * math.ceil(_L / h) + 1, _N_MAX)


def _diag_sinh(phi, q1: np.ndarray) -> np.ndarray:
    """``E[phi(sqrt(q1) x)^2]`` by the trapezoid rule in t with ``x = sinh(t) / sqrt(q1)``,
    ``|t| <= asinh(9 sqrt(q1))``: node spacing ~ 1/sqrt(q1) near the activation's kink or step
    at 0 and <= 0.03 |x| further out, so ~ 60 log(q1) nodes resolve any q1 (used where the
    2-D rule is capped). Chunked over points."""
    sq = np.sqrt(q1)
    t0 = np.arcsinh(9.0 * sq)
    m = 2 * math.ceil(float(t0.max(initial=0.0)) / 0.03) + 1
    t = np.linspace(-1.0, 1.0, m)
    out = np.empty_like(q1)
    step = max(1, _CHUNK_ELEMS // m)
    for i in range(0, q1.size, step):
        sl = slice(i, i + step)
        tt = t0[sl, None] * t
        x = np.sinh(tt) / sq[sl, None]
        w = (t0[sl, None] * (t[1] - t[0])) * np.cosh(tt) / sq[sl, None] \
            * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        out[sl] = np.sum(phi(sq[sl, None] * x) ** 2 * w, axis=1)
    return out


def _direct(name: str, q1: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-point kernel in bounded memory and time for any q1: the 2-D trapezoid rule (nodes
    capped, see :func:`gauss_kernel` for its accuracy beyond q1 ~ 250), the 1-D sinh rule for
    the diagonal there, and the large-scale limit from q1 = 1e8 on."""
    phi = activation_fn(name)
    diag, off = np.empty_like(q1), np.empty_like(q1)
    sat = q1 >= _Q1_SAT
    if sat.any():
        diag[sat], off[sat] = _saturated(name, q1[sat], c[sat])
        mid = sat & (q1 < _Q1_EXACT)  # the diagonal stays exact (1-D rule)
        if mid.any():
            diag[mid] = _diag_sinh(phi, q1[mid])
            if name == "tanh":  # limit cosine (2/pi) arcsin c on the exact diagonal
                off[mid] *= diag[mid]
    one = ~sat & (c == 1.0)  # identical inputs: off = diag, a 1-D integral
    if one.any():
        q1o = q1[one]
        x, w = _rule1d("trapezoid", _auto_n(float(q1o.max())))
        d = np.empty_like(q1o)
        step = max(1, _CHUNK_ELEMS // x.size)
        for i in range(0, q1o.size, step):
            d[i:i + step] = phi(np.sqrt(q1o[i:i + step, None]) * x) ** 2 @ w
        big = q1o > _Q1_CAP
        if big.any():
            d[big] = _diag_sinh(phi, q1o[big])
        diag[one], off[one] = d, d
    rest = ~sat & ~one
    if rest.any():
        q1r = q1[rest]
        d, o = _quad(phi, q1r, c[rest], "trapezoid", _auto_n(float(q1r.max())))
        big = q1r > _Q1_CAP
        if big.any():
            d[big] = _diag_sinh(phi, q1r[big])
        diag[rest], off[rest] = d, o
    return diag, off


def _saturated(name: str, q1: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Large-q1 limits: tanh -> sign, ``(1, (2/pi) arcsin c)``; gelu, silu -> relu (the
    activation minus its limit is an O(1) bump near 0 that a N(0, q1) variable rarely sees)."""
    if name == "tanh":
        return np.ones_like(q1), 2.0 / np.pi * np.arcsin(c)
    k = (np.sqrt(np.maximum(1.0 - c * c, 0.0)) + c * (np.pi - np.arccos(c))) / np.pi
    return 0.5 * q1, 0.5 * q1 * k


def _quad(phi, q1: np.ndarray, c: np.ndarray, rule: str, n: int) -> tuple[np.ndarray, ...]:
    """Direct quadrature on flat arrays, chunked so temporaries stay ~< 100 MB; only the
    distinct (q1, c) pairs are evaluated."""
    if q1.size > 1:
        pairs, inv = np.unique(np.stack([q1, c], axis=1), axis=0, return_inverse=True)
        if pairs.shape[0] < q1.size:
            diag, off = _quad(phi, pairs[:, 0].copy(), pairs[:, 1].copy(), rule, n)
            inv = inv.ravel()
            return diag[inv], off[inv]
    x, w = _rule1d(rule, n)
    ix, xx, zz, ww = _rule2d(rule, n)
    sq = np.sqrt(q1)
    s = np.sqrt(np.maximum(1.0 - c * c, 0.0))
    diag, off = np.empty_like(q1), np.empty_like(q1)
    step = max(1, _CHUNK_ELEMS // xx.size)
    for i in range(0, q1.size, step):
        sl = slice(i, i + step)
        a = phi(sq[sl, None] * x)  # phi(u) at the 1-D nodes, (chunk, n)
        diag[sl] = (a * a) @ w
        up = phi(sq[sl, None] * (c[sl, None] * xx + s[sl, None] * zz))  # phi(u'), (chunk, nodes)
        off[sl] = np.einsum("pk,pk,k->p", a[:, ix], up, ww)
    return diag, off


def _finish(diag: np.ndarray, off: np.ndarray, c: np.ndarray, shape) -> tuple[np.ndarray, ...]:
    """Exact ``off = diag`` at c = 1 and Cauchy-Schwarz ``|off| <= diag`` (roundoff only)."""
    off = np.where(c == 1.0, diag, np.clip(off, -diag, diag))
    return diag.reshape(shape), off.reshape(shape)


def gauss_kernel(activation: str, q1, p1, n: int | None = None,
                 rule: str = "trapezoid") -> tuple[np.ndarray, np.ndarray]:
    """Kernel by direct 2-D quadrature at every point (docs/theory.md §2.5); see module docstring.

    ``n`` is the number of nodes per dimension; ``None`` picks it from ``max(q1)`` (trapezoid:
    step ``min(0.5, 0.28/sqrt(q1))`` on [-9, 9]; hermite: 128).  Measured accuracy of the
    default against tight dblquad: <= ~1e-12 for tanh, gelu and silu with q1 <= 20. Memory
    and time are bounded for any q1: the default caps the nodes at 1025 per dimension (full
    accuracy up to q1 ~ 250), computes the diagonal there by a 1-D sinh-mapped rule (~1e-12 at
    any q1 < 1e30) and from q1 = 1e8 on takes the off-diagonal from the large-scale limits
    (tanh -> sign: cosine ``(2/pi) arcsin c``; gelu, silu -> relu), whose error relative to
    the kernel's scale (1 for tanh, q1 for gelu/silu) is ~ 1/q1 for gelu/silu and
    ~ 1/sqrt(q1) for tanh (<= 1e-4 there); from q1 = 1e30 the limits are exact to roundoff.
    Measured error of the capped rule's off-diagonal, same scale, for 250 < q1 < 1e8:
    <= 5e-5 (gelu, silu; ~4e-6 from q1 = 1e5) and <= 1.2e-3 (tanh, c -> 1). Only diverging
    no-norm stacks reach such q1.  The
    Gauss-Hermite rule (the one docs/theory.md §2.5 names) reaches ~1e-13 for tanh only at q1 <~ 1;
    see the module docstring.  ``relu`` is accepted for testing only: the kink makes every
    smooth rule converge algebraically (error ~1e-3 with the default n, ~2e-4 with 200 GH nodes);
    use :func:`relu_kernel`.
    """
    phi = activation_fn(_check(activation, _QUAD_ACTIVATIONS))
    q1, _, c = _moments(q1, p1)
    shape = q1.shape
    q1f, cf = q1.ravel(), c.ravel()
    if q1f.size == 0:
        return np.zeros(shape), np.zeros(shape)
    if n is None and rule == "trapezoid":
        diag, off = _direct(activation, q1f, cf)
        return _finish(diag, off, cf, shape)
    if n is None:
        n = 128
    diag, off = _quad(phi, q1f, cf, rule, int(n))
    return _finish(diag, off, cf, shape)


def _interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty(a.size + b.size)
    out[0::2], out[1::2] = a, b
    return out


@functools.lru_cache(maxsize=128)
def _c_table(activation: str, q1: float) -> tuple[float, np.ndarray, float] | None:
    """Cached ``(E[phi^2], coefficients, step)``: E[phi phi'] as a function of theta = arccos c.

    In theta the kernel is smooth, 2 pi-periodic and even about 0 and pi, so a quintic
    interpolating spline with zero first and third derivatives at both ends, on a uniform theta
    grid (Chebyshev points in c), converges as h^6 everywhere, c -> +-1 included.  The grid is
    doubled until the spline matches direct quadrature at every midpoint to ``_INTERP_TOL``; the
    returned spline also interpolates those midpoints (about 64x more accurate).  ``None`` if
    more than 4097 points would be needed.
    """
    from scipy.interpolate import PPoly, make_interp_spline  # only when tabulating
    phi, n = activation_fn(activation), _auto_n(q1)
    bc = ([(1, 0.0), (3, 0.0)], [(1, 0.0), (3, 0.0)])
    theta = np.linspace(0.0, np.pi, 17)
    diag, vals = _quad(phi, np.full(theta.size, q1), np.cos(theta), "trapezoid", n)
    while True:
        mid = 0.5 * (theta[1:] + theta[:-1])
        vmid = _quad(phi, np.full(mid.size, q1), np.cos(mid), "trapezoid", n)[1]
        err = np.max(np.abs(make_interp_spline(theta, vals, k=5, bc_type=bc)(mid) - vmid))
        theta, vals = _interleave(theta, mid), _interleave(vals, vmid)
        if err <= _INTERP_TOL:
            pp = PPoly.from_spline(make_interp_spline(theta, vals, k=5, bc_type=bc))
            # one polynomial per grid interval, highest power first (skip repeated end knots)
            keep = np.searchsorted(pp.x, theta[:-1], side="right") - 1
            return float(diag[0]), np.ascontiguousarray(pp.c[:, keep]), float(theta[1])
        if theta.size > 4097:
            return None


def _eval_table(coef: np.ndarray, h: float, c: np.ndarray) -> np.ndarray:
    """Evaluate the uniform-grid piecewise polynomial at theta = arccos(c) (NaN propagates)."""
    t = np.arccos(c)
    i = np.fmax(np.fmin(t * (1.0 / h), coef.shape[1] - 1), 0.0).astype(np.intp)
    dt = t - i * h
    y = coef[0, i]
    for row in coef[1:]:
        y *= dt
        y += row[i]
    return y


def _smooth_kernel(activation: str, q1: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, ...]:
    """Flat-array kernel: cached c-tables for much-repeated q1 values, else direct quadrature."""
    if q1.size >= _INTERP_MIN_POINTS and np.all(np.isfinite(q1)):
        if q1.min() == q1.max():
            uniq, inv = q1[:1], None
        else:
            uniq, inv = np.unique(q1, return_inverse=True)
        if uniq.size <= _INTERP_MAX_UNIQUE and q1.size >= _INTERP_MIN_POINTS * uniq.size:
            diag, off = np.empty_like(q1), np.empty_like(q1)
            direct = np.zeros(q1.size, dtype=bool)
            for k, qk in enumerate(uniq):
                sel = slice(None) if inv is None else inv == k
                table = _c_table(activation, float(qk))
                if table is None:
                    direct[sel] = True
                else:
                    diag[sel] = table[0]
                    off[sel] = _eval_table(table[1], table[2], c[sel])
            if direct.any():
                diag[direct], off[direct] = _direct(activation, q1[direct], c[direct])
            return diag, off
    return _direct(activation, q1, c)


def kernel(activation: str, q1, p1) -> tuple[np.ndarray, np.ndarray]:
    """``(E[phi(u)^2], E[phi(u) phi(u')])`` for any activation in :data:`ACTIVATIONS`.

    relu: arc-cosine closed form; linear: ``(q1, p1)``; swiglu ``= silu(g) * v`` (geglu: gelu
    gate) with independent gate and up weights of equal pre-activation moments:
    ``(K_silu_diag q1, K_silu_off p1)``;
    tanh/gelu/silu: quadrature (docs/theory.md §2.5).  When a q1 value is shared by >= 256 points
    (the
    post-LN trainability grid), a cached spline in arccos c replaces per-point quadrature
    (checked to 1e-10 against it while built).
    """
    _check(activation)
    if activation == "relu":
        return relu_kernel(q1, p1)
    q1, p1, c = _moments(q1, p1)
    if activation == "linear":
        return q1.copy(), p1.copy()
    name = {"swiglu": "silu", "geglu": "gelu"}.get(activation, activation)
    diag, off = _smooth_kernel(name, q1.ravel(), c.ravel())
    diag, off = _finish(diag, off, c.ravel(), q1.shape)
    if activation in ("swiglu", "geglu"):
        return np.asarray(diag * q1), np.asarray(off * p1)
    return diag, off


def _scalar_phi(name: str) -> Callable[[float], float]:
    def silu(x: float) -> float:
        return x / (1.0 + math.exp(-x)) if x >= 0 else x * math.exp(x) / (1.0 + math.exp(x))

    return {"relu": lambda x: x if x > 0 else 0.0, "tanh": math.tanh, "silu": silu,
            "gelu": lambda x: 0.5 * x * math.erfc(-x / math.sqrt(2.0)),
            "linear": lambda x: x}[name]


def dblquad_kernel(activation: str, q1: float, p1: float, epsabs: float = 1e-10,
                   epsrel: float = 1e-10) -> tuple[np.float64, np.float64]:
    """Slow per-point baseline: ``scipy.integrate.quad`` for the diagonal and ``dblquad`` for
    the off-diagonal over ``[-12, 12]^2`` (Gaussian tail < 1e-32).  ReLU integrates only over
    the smooth region ``u, u' > 0`` (x > 0, z > -c x / s), so the kink does not slow QUADPACK."""
    from scipy import integrate  # slow import, needed only by this baseline
    _check(activation)
    q1v, p1v, cv = (float(v) for v in _moments(q1, p1))
    if activation in ("swiglu", "geglu"):
        d, o = dblquad_kernel("silu" if activation == "swiglu" else "gelu", q1v, p1v, epsabs,
                              epsrel)
        return np.float64(d * q1v), np.float64(o * p1v)
    phi, sq, big = _scalar_phi(activation), math.sqrt(q1v), 12.0
    dens = lambda t: math.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)  # noqa: E731
    lo = 0.0 if activation == "relu" else -big
    kw = {"epsabs": epsabs, "epsrel": epsrel}
    diag = integrate.quad(lambda x: phi(sq * x) ** 2 * dens(x), lo, big, limit=200, **kw)[0]
    s = math.sqrt(max(1.0 - cv * cv, 0.0))
    if s == 0.0:
        off = integrate.quad(lambda x: phi(sq * x) * phi(sq * cv * x) * dens(x), -big, big,
                             limit=200, **kw)[0]
        return np.float64(diag), np.float64(off)
    f = lambda z, x: phi(sq * x) * phi(sq * (cv * x + s * z)) * dens(x) * dens(z)  # noqa: E731
    zlo = (lambda x: min(-cv * x / s, big)) if activation == "relu" else -big
    off = integrate.dblquad(f, lo, big, zlo, big, **kw)[0]
    return np.float64(diag), np.float64(off)


def gate_kernel(q1, p1) -> tuple[np.ndarray, np.ndarray]:
    """Output-gate kernel ``(E[sigmoid(g)^2], E[sigmoid(g) sigmoid(g')])`` for gate
    pre-activations ``(g, g') ~ N(0, [[q1, p1], [p1, q1]])`` (docs/theory.md §2.4.4): the
    factor by which a sigmoid output gate multiplies the attention branch's second moments
    (diagonal, off-diagonal). ``q1 = var_g q + b2``, ``p1 = var_g p + b2`` with ``b2`` the gate
    bias's mean square. The same 2-D trapezoid quadrature as the MLP kernels (sigmoid is
    analytic in the strip ``|Im x| < pi / sqrt(q1)``, wider than tanh's, so tanh's step
    suffices); ``q1 = 0`` gives ``(1/4, 1/4)`` (sigmoid's mean 1/2)."""
    q1, _, c = _moments(q1, p1)
    shape = q1.shape
    q1f, cf = q1.ravel(), c.ravel()
    if q1f.size == 0:
        return np.zeros(shape), np.zeros(shape)
    n = _auto_n(float(np.max(q1f)))
    diag, off = _quad(special.expit, q1f, cf, "trapezoid", n)
    return _finish(diag, off, cf, shape)


def dyt_kernel(alpha, q, p) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic Tanh in place of a norm (docs/theory.md §2.6.2): ``(E tanh(alpha u)^2,
    E tanh(alpha u) tanh(alpha u'))`` for ``(u, u')`` zero-mean Gaussian with variances ``q``
    and covariance ``p``, i.e. the tanh kernel at ``(alpha^2 q, alpha^2 p)`` (the same
    quadrature as the MLP's tanh, :func:`kernel`); ``p`` is clipped to ``[-q, q]``."""
    q = np.asarray(q, dtype=np.float64)
    a2 = np.asarray(alpha, dtype=np.float64) ** 2
    p = np.clip(np.asarray(p, dtype=np.float64), -q, q)
    return kernel("tanh", a2 * q, a2 * p)
