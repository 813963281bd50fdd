"""Shared simulators, helpers and plotting bits of the mindthegap items (every other module of
the package imports from here; docs/reproduce/mindthegap.md).

The model is the paper's attention-only network ``X_l = A_l X_(l-1) W_l^V`` (Eq. 3) with
Random Markov attention ``A_l`` (Def. 1.1) or key-query attention ``A(X)``, value matrices
``N(0, sigma_V^2)`` *not* divided by ``d``, orthonormal tokens ``X_0``, and its gap-free
version with ``A_perp = A - 11^T / T`` (Eq. 9). Everything is dense float64.
"""

from __future__ import annotations

import math

import numpy as np

from .. import args
from ..plots import axes_grid

__all__ = ["C_GAP", "C_PERP", "C_ID", "C_KQ", "MODULES", "MOD_LABEL", "MAX_SIZE", "rng_of",
           "sub", "positive", "spectrum_args", "sizes", "SPECTRUM_SIZES", "tokens", "loglog_slope",
           "softmax_rows", "layernorm", "sr_excess", "new_axes", "bars", "plt_colours", "tol_T",
           "kq_logits"]

#: The sizes of the items drawing one T x T attention matrix's spectrum (Figs. 1 and 9).
SPECTRUM_SIZES = dict(tiny=dict(T=256, n_seeds=1), quick=dict(T=512, n_seeds=3),
                      full=dict(T=2048, n_seeds=4))

C_GAP, C_PERP, C_ID, C_KQ = "#d1495b", "#4c72b0", "#6a994e", "#8e6c8a"
MODULES = ("plain", "ln", "skip", "skip+ln")
MOD_LABEL = {"plain": "", "ln": " + LN", "skip": " + skip", "skip+ln": " + skip + LN"}
#: The largest size (T, d, number of seeds ...) an argument check lets through.
MAX_SIZE = 10**9


def rng_of(seed) -> np.random.Generator:
    """``seed`` itself when it is a Generator, else a new one seeded by it."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def sub(*parts) -> int:
    """An independent integer seed for the stream named by ``parts``."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def positive(name: str, v) -> float:
    """A finite number > 0 (a std, a ratio, a threshold)."""
    return args.real(name, v, 0.0, math.inf, lo_open=True)


def spectrum_args(T, scale_name: str, scale, n_seeds) -> tuple[int, float, int]:
    """The checked keywords of the items on :data:`SPECTRUM_SIZES` (Figs. 1 and 9): the
    length ``T`` >= 16, their scale (``scale_name``: sigma_A, sigma_qk) > 0 and ``n_seeds``
    >= 1."""
    return (args.integer("T", T, 16), positive(scale_name, scale),
            args.integer("n_seeds", n_seeds, 1))


def sizes(name: str, values, low: int = 8) -> tuple[int, ...]:
    """An increasing list of >= 2 whole sizes, each >= ``low``, as a tuple of ints."""
    return tuple(int(t) for t in args.grid(name, values, low, MAX_SIZE, ints=True))


def tokens(T: int, d: int, rho: float = 0.0, seed=0) -> np.ndarray:
    """Unit-norm tokens (T, d) with pairwise cosine ``rho``: ``sqrt(1-rho) e_a + sqrt(rho) u``.

    ``e_a`` orthonormal, ``u`` a unit vector orthogonal to them (random orientation, so needs
    ``d >= T + 1`` when ``rho > 0``); ``rho = 0`` gives orthonormal rows (``X X^T = I``, the
    isometric input of mindthegap Sec. 2).
    """
    args.need("rho", 0.0 <= rho < 1.0, f"in [0, 1) (got {rho!r})")
    args.need("d", d >= T + (rho > 0), f"at least T (T + 1 when rho > 0) (got {d!r})")
    rng = rng_of(seed)
    Q = np.linalg.qr(rng.standard_normal((d, T + (rho > 0))))[0].T  # orthonormal rows
    return Q[:T] if rho == 0 else math.sqrt(1.0 - rho) * Q[:T] + math.sqrt(rho) * Q[T]


def loglog_slope(x, y) -> np.ndarray:
    """Least-squares slope of ``log y`` against ``log x`` along the last axis of ``y``."""
    lx = np.log(np.asarray(x, dtype=np.float64))
    ly = np.log(np.asarray(y, dtype=np.float64))
    lx = lx - lx.mean()
    return ((ly - ly.mean(axis=-1, keepdims=True)) * lx).sum(axis=-1) / (lx**2).sum()


def softmax_rows(S: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a logit matrix (rows of the result sum to 1)."""
    Z = np.exp(S - S.max(axis=-1, keepdims=True))
    return Z / Z.sum(axis=-1, keepdims=True)


def layernorm(Y: np.ndarray) -> np.ndarray:
    """LayerNorm over features without gain/bias, at the input's scale: each token centred
    over features and rescaled to unit norm (the isometric X_0 has unit-norm tokens; the
    usual unit mean square would multiply every layer by sqrt(d))."""
    Y = Y - Y.mean(axis=-1, keepdims=True)
    return Y / np.sqrt((Y**2).sum(axis=-1, keepdims=True) + 1e-300)


def sr_excess(X: np.ndarray) -> tuple[float, float]:
    """``(sr(X X^T) - 1, sr(X X^T))`` from the singular values of X (the excess without
    cancellation: ``sum_{i>1} s_i^4 / s_1^4``)."""
    s = np.linalg.svd(X, compute_uv=False)
    ex = float(((s[1:] / s[0]) ** 4).sum())
    return ex, 1.0 + ex


def new_axes(ncols: int = 1, nrows: int = 1, w: float = 5.0, h: float = 3.5):
    """A new constrained-layout figure of ``nrows x ncols`` panels of ``w x h`` inches each and
    its (nrows, ncols) axes (:func:`sigprop.reproduce.plots.axes_grid`)."""
    return axes_grid(None, nrows, ncols, (w * ncols, h * nrows))


def bars(ax, x, m, se, **kw):
    """Points with standard-error bars (a non-finite error drawn as none)."""
    se = np.where(np.isfinite(se), se, 0.0)
    kw.setdefault("ls", "none")
    kw.setdefault("capsize", 2)
    kw.setdefault("ms", 4)
    ax.errorbar(x, m, yerr=se, **kw)


def plt_colours(n: int) -> list:
    """``n`` colours along viridis."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(x) for x in np.linspace(0.05, 0.85, max(n, 1))]


def tol_T(T: int, a: float, b: float = 1.0) -> float:
    """A finite-T tolerance ``a + b T^(-2/3)`` (edge fluctuations of random-matrix spectra)."""
    return a + b * float(T) ** (-2.0 / 3.0)


def kq_logits(X: np.ndarray, sigma_qk2: float, d_qk: int, rng) -> np.ndarray:
    """Key-query logits ``X W^Q (X W^K)^T / sqrt(d_qk)``, ``W^Q, W^K`` i.i.d. N(0, sigma_qk2)."""
    d = X.shape[1]
    WQ = math.sqrt(sigma_qk2) * rng.standard_normal((d, d_qk))
    WK = math.sqrt(sigma_qk2) * rng.standard_normal((d, d_qk))
    return (X @ WQ) @ (X @ WK).T / math.sqrt(d_qk)
