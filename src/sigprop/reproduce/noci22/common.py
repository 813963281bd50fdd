"""Shared pieces of the noci22 items: the tolerance in standard errors, ratio and slope
estimators with their standard errors, token and weight draws, and small plot helpers."""

from __future__ import annotations

import math

import numpy as np

from ...measurement.rho_tokens import rho_tokens
from ..core import slope

__all__ = ["Z", "ratio_se", "slope_se", "ratio_diff_se", "z_dev", "rng_of",
           "log_x", "gaussian_tokens", "draw_weights", "softmax", "swap", "one_at_a_time"]

#: 4-standard-error bands throughout (a Gaussian z beyond 4 has probability 6e-5)
Z = 4.0


def ratio_se(num, den, axis=-1):
    """Ratio of sample means ``mean(num) / mean(den)`` and its delta-method standard error."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    k = num.shape[axis]
    mn, md = num.mean(axis), den.mean(axis)
    r = mn / md
    cn = num - np.expand_dims(mn, axis)
    cd = den - np.expand_dims(md, axis)
    var = ((cn - np.expand_dims(r, axis) * cd) ** 2).sum(axis) / (k - 1)
    return r, np.sqrt(var / k) / np.abs(md)


def slope_se(x, y, se) -> tuple[float, float]:
    """:func:`slope` of ``log y`` on ``log x`` (ordinary least squares, as for a theory curve
    on the same grid) and its standard error propagated from the points' standard errors
    (``se / y`` on the log scale, points independent)."""
    lx = np.log(np.asarray(x, np.float64))
    y, se = np.asarray(y, np.float64), np.asarray(se, np.float64)
    c = lx - lx.mean()
    sxx = (c**2).sum()
    return slope(x, y), float(math.sqrt(((c * se / y) ** 2).sum()) / sxx)


def ratio_diff_se(ca, fa, cb, fb) -> tuple[float, float]:
    """``mean(ca)/mean(fa) - mean(cb)/mean(fb)`` for paired draws (the same weights under two
    settings) and its delta-method standard error (per-draw influence values)."""
    ca, fa, cb, fb = (np.asarray(a, np.float64) for a in (ca, fa, cb, fb))
    ra, rb = ca.mean() / fa.mean(), cb.mean() / fb.mean()
    infl = (ca - ra * fa) / fa.mean() - (cb - rb * fb) / fb.mean()
    return float(ra - rb), float(infl.std(ddof=1) / math.sqrt(infl.size))


def z_dev(m, se, t, rel: float = 0.0) -> float:
    """Largest ``|m - t| / (Z se + rel |t|)``: deviation in units of its tolerance."""
    m, se, t = (np.asarray(a, dtype=np.float64) for a in (m, se, t))
    return float(np.max(np.abs(m - t) / (Z * se + rel * np.abs(t))))


def rng_of(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


def log_x(ax, values) -> None:
    """Log x axis labelled at ``values`` (no minor-tick labels)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    vals = sorted({float(v) for v in values})
    ax.set_xticks(vals, [f"{v:g}" for v in vals])
    ax.xaxis.set_minor_formatter(NullFormatter())


def gaussian_tokens(rng: np.random.Generator, draws: int, n: int, d: int, sigma_x2: float,
                    rho: float) -> np.ndarray:
    """``(draws, n, d)`` tokens as in noci22 A.2: every column i.i.d.
    ``N(0, sigma_x2 [(1 - rho) I_n + rho 11^T])``; the Gaussian law of
    :func:`sigprop.measurement.rho_tokens.rho_tokens`, under this module's earlier name."""
    return rho_tokens(n, d, rho, rng, n_seq=draws, law="gaussian", var=sigma_x2)


def draw_weights(rng: np.random.Generator, draws: int, d: int, dk: int | None = None,
                 *, wq: bool = True):
    """``W_Q, W_K`` (d x d_k) and ``W_V`` (d x d_k) with i.i.d. N(0, 1/d) entries (fan-in;
    Xavier for square matrices, noci22's ``sigma^2 = 1/d``)."""
    dk = d if dk is None else dk
    s = 1.0 / math.sqrt(d)
    Wq = rng.standard_normal((draws, d, dk)) * (s if wq else 0.0)
    Wk = rng.standard_normal((draws, d, dk)) * s
    Wv = rng.standard_normal((draws, d, dk)) * s
    return Wq, Wk, Wv


def softmax(M: np.ndarray) -> np.ndarray:
    """Row softmax over the last axis."""
    E = np.exp(M - M.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


def swap(a: np.ndarray) -> np.ndarray:
    """Transpose of the last two axes."""
    return np.swapaxes(a, -1, -2)


def one_at_a_time(base: dict, axes: dict):
    """The one-at-a-time sweeps of a figure: ``(axis, value, params)`` for every value of every
    axis, the other parameters at ``base``."""
    for ax, vals in axes.items():
        for v in vals:
            yield ax, float(v), {**base, ax: float(v)}
