"""Shared helpers of the clpr25 items: argument checks, seeds, the transition's crossing and
width, the row-sampled angle ratio of the clpr25 layer and its exact simplex values
(docs/reproduce/clpr25.md; every other module of the package imports from here).

The layer is clpr25's one attention layer with ``Q = K = V = I`` on normalised tokens and the
length scaling ``beta = gamma log n`` (docs/theory.md §3.1); its formulas come from
:mod:`sigprop.theory.scaling`.
"""

from __future__ import annotations

import math

import numpy as np

from ...theory import scaling as sc
from .. import args

__all__ = ["COLOURS", "MAX_SIZE", "sizes", "open_real", "rho_arg", "seq", "crossing", "width",
           "angle_ratios", "ratio_theory", "ratio_limit", "sd_cos", "gamma_grid"]

COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")
#: The largest size (n, d, rows ...) an argument check lets through.
MAX_SIZE = 10**9


# --------------------------------------------------------------------------------------------
# argument checks (on sigprop.reproduce.args)


def sizes(name: str, xs, lo: int, n_min: int = 1) -> list[int]:
    """An increasing list of at least ``n_min`` whole sizes, each >= ``lo``, as Python ints."""
    return [int(x) for x in args.grid(name, xs, lo, MAX_SIZE, ints=True, n_min=n_min)]


def open_real(name: str, v, lo: float, hi: float) -> float:
    """A number in the open interval ``(lo, hi)``."""
    x = args.real(name, v, lo, hi, lo_open=True)
    args.need(name, x < hi, f"a number in ({lo:g}, {hi:g}) (got {v!r})")
    return x


def rho_arg(rho) -> float:
    """The input cosine ``rho`` of the (almost-)simplex tokens, in (0, 1)."""
    return open_real("rho", rho, 0.0, 1.0)


# --------------------------------------------------------------------------------------------
# seeds and transitions


def seq(seed: int, *keys: int) -> np.random.SeedSequence:
    """The seed sequence of the stream named by ``seed`` and ``keys``."""
    return np.random.SeedSequence([int(seed), *[int(k) for k in keys]])


def crossing(x: np.ndarray, y: np.ndarray, level: float) -> float:
    """First x where the increasing curve y(x) reaches ``level`` (linear interpolation)."""
    y = np.asarray(y, float)
    above = np.nonzero(y >= level)[0]
    if above.size == 0 or above[0] == 0:
        return float("nan")
    i = above[0]
    return float(x[i - 1] + (level - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))


def width(x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> float:
    """Width of an increasing transition: x(hi) - x(lo)."""
    return crossing(x, y, hi) - crossing(x, y, lo)


# --------------------------------------------------------------------------------------------
# the layer's angle ratio: sampled and exact


def angle_ratios(X: np.ndarray, gammas, rows: int = 64) -> np.ndarray:
    """Mean angle ratio theta'/theta (clpr25 Eq. 3.2) over the pairs of ``rows`` sampled tokens,
    one value per gamma, of the clpr25 layer with ``alpha = 0``.

    The layer is :func:`sigprop.theory.scaling.attention_forward` (``A = softmax(beta Y Y^T)``,
    ``beta = gamma log n``, output ``A Y``) evaluated on the first ``rows`` query rows only:
    each sampled row still sees all ``n`` keys, so its output is exact; only the pairs are
    subsampled. ``X`` (n, d); returns shape (len(gammas),).
    """
    X = np.asarray(X, float)
    n = X.shape[0]
    r = min(int(rows), n)
    Y = X / np.linalg.norm(X, axis=1, keepdims=True)
    Gr = Y[:r] @ Y.T                                             # (r, n) input cosines
    s = (np.asarray(gammas, float)[:, None, None] * math.log(n)) * Gr
    s -= s.max(axis=-1, keepdims=True)
    A = np.exp(s)
    A /= A.sum(axis=-1, keepdims=True)
    F = A @ Y                                                    # (G, r, d)
    F /= np.linalg.norm(F, axis=-1, keepdims=True)
    iu = np.triu_indices(r, 1)
    th_in = np.arccos(np.clip(Gr[:, :r][iu], -1.0, 1.0))
    cos_out = np.einsum("gpd,gpd->gp", F[:, iu[0]], F[:, iu[1]])
    return (np.arccos(np.clip(cos_out, -1.0, 1.0)) / th_in).mean(axis=-1)


def ratio_theory(n, gamma, rho, alpha=0.0):
    """Exact finite-n simplex angle ratio arccos(cos') / arccos(rho)."""
    return np.arccos(np.clip(sc.simplex_cos(n, gamma, rho, alpha), -1.0, 1.0)) / math.acos(rho)


def ratio_limit(gamma, rho, alpha=0.0):
    """The n -> infinity simplex angle ratio arccos(lim cos') / arccos(rho)."""
    return np.arccos(np.clip(sc.simplex_limit(gamma, rho, alpha), -1.0, 1.0)) / math.acos(rho)


def sd_cos(d: int, rho: float) -> float:
    """First-order standard deviation of a pair's cosine on almost-simplex inputs (clpr25
    Eq. 3.1): (1 - rho) sqrt(1 + 2 rho - rho^2) / sqrt(d) (tests/theory/test_scaling.py)."""
    return (1.0 - rho) * math.sqrt(1.0 + 2.0 * rho - rho * rho) / math.sqrt(d)


def gamma_grid(n_gamma: int, gmax: float = 2.0) -> np.ndarray:
    """``n_gamma`` (>= 5) equally spaced values of gamma / gamma_c up to ``gmax``."""
    n_gamma = args.integer("n_gamma", n_gamma, 5)
    return np.linspace(gmax / n_gamma, gmax, n_gamma)  # gamma / gamma_c
