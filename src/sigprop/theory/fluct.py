"""Row-to-row fluctuations of attention seen through a per-token LayerNorm (docs/theory.md §2.3,
§2.6).

The (q, p) recursion of :mod:`.blocks` is a map of Gram *averages*: after attention plus
residual, token a has squared norm ``N_a = a0 + b Y2_a`` and pair (a, c) the overlap
``C_ac = c0 + b Yx_ac`` (docs/theory.md §2.4, ``b = sigma_v^2 (q - p)``), and the theory's cosine is
``E C / E N``. A per-token LayerNorm instead divides every token by its own norm, so the cosine
that the next layer sees (and that ``cos`` measures) is ``E[C_ac / sqrt(N_a N_c)]``. Near and
above condensation ``Y2_a`` does not self-average (a REM row's participation ratio keeps an O(1)
spread even as T -> inf), and the two differ: by +0.03 at gg25 Fig. 3's rho_in = 0.3,
beta = 1.5-2 (T = 512), where the measured Fig. 3 points sit above the ratio of averages.

Rows a != c are conditionally independent given the keys' shared energies; neglecting the
residual correlations of (Y2_a, Y2_c, Yx_ac) (measured <= 0.003 on the cosine over the whole
Fig. 3 grid) the LN average factorises::

    E[C / sqrt(N_a N_c)] = E[C] E[N^-1/2]^2 = (E C / E N) * r,
    r(v, kappa) = E[(kappa + (1 - kappa) Y2 / E Y2)^(-1/2)]^2  >= 1      (Jensen),

with ``kappa = a0 / E N`` the share of the mean norm that does not fluctuate and ``Y2`` the
participation ratio of one row of i.i.d. N(0, v) scores (averaged over the heads, and with the
chi2(d_head) query-norm spread of docs/theory.md §2.3 when d_head is given). At rho_in = 0
(independent
rows) the factorisation is exact.

Causal rows: the query at position t is a REM over t keys, so ``E N_t`` and the spread of
``N_t`` both depend on t (N_1 = a0 + b). Per token ``E[N_t^-1/2] = sqrt(r_t / E N_t)`` with
``r_t`` the factor for rows of t keys, and the cosine is the pair average of
``E[C_ac] E[N_a^-1/2] E[N_c^-1/2]`` over positions (:func:`causal_pair_means`), which also
carries the purely deterministic position spread (uniform causal attention, r = 1).

``r`` needs the law of Y2, not only its mean, so it is computed by seeded Monte Carlo over the
REM itself (docs/theory.md §2.3 allows Monte Carlo over i.i.d. scores where no quadrature exists;
these
are draws of the idealised d -> inf model, not of a network) and kept as a cached spline per
(T, d_head, heads). Rows are exact draws for T <= ``FULL_T``; longer rows draw their ``TOP_K``
largest scores exactly (uniform order statistics through exponential spacings) and replace the
remaining T - TOP_K keys, all below the K-th score, by their conditional means (a truncated
Gaussian's exponential moments), which keeps the cost independent of T.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from .lazy import LazyModule
from .rem_finite import y2_finite
from .rem_tables import bicubic_coef, bicubic_eval, disk_cached

special = LazyModule("scipy.special")

__all__ = ["sample_y2", "ln_factor_table", "ln_factor", "causal_pair_means"]

FULL_T = 512         #: rows up to this length are drawn in full
TOP_K = 512          #: longer rows: the K largest scores exactly, the rest by their mean
ROWS = 2048          #: Monte Carlo rows (head groups) per table
SEED = 20261122      #: the tables' fixed seed (they are deterministic functions of T, d, H)
_CHUNK = 1 << 21     #: scores held at once
CAUSAL_BINS = 256    #: position bins of the causal pair sums (every position up to this T)
LOGV_NODES = np.arange(np.log(1e-3), np.log(1e4) + 1e-9, 0.3)   # nodes in log v
KAPPA_NODES = np.linspace(0.0, 1.0, 21)                       # nodes in kappa


def _chi(rng, shape, d_head):
    return np.ones(shape) if d_head is None else rng.chisquare(d_head, shape) / d_head


def _draw_full(rng, T, n):
    """(n, T) standard normal scores."""
    return rng.standard_normal((n, T))


def _draw_top(rng, T, n, k):
    """(n, k) exact top-k order statistics of T standard normals, descending (the last column
    is where the other T - k keys are truncated). The k smallest of T uniforms are
    ``G_j / G_{T+1}`` with ``G`` the cumulative sums of Exp(1) draws;
    ``G_{T+1} = G_k + Gamma(T + 1 - k)``."""
    g = np.cumsum(rng.standard_exponential((n, k)), axis=1)
    total = g[:, -1:] + rng.standard_gamma(T + 1 - k, (n, 1))
    return -special.ndtri(g / total)


def sample_y2(v, T: int, *, rows: int = ROWS, heads: int = 1, d_head: int | None = None,
              seed: int = SEED) -> np.ndarray:
    """Monte Carlo draws of a row's participation ratio ``Y2 = sum_b w_b^2``, ``w =
    softmax(s)``, ``s_b`` i.i.d. N(0, v chi), averaged over ``heads`` independent rows; one
    draw per row group, the same underlying draws for every v (common random numbers, so the
    v-dependence is smooth). Returns ``(len(v), rows)``. ``chi ~ chi2(d_head)/d_head`` per row
    (1 without d_head)."""
    v = np.atleast_1d(np.asarray(v, dtype=np.float64))
    if T < 1 or np.any(~(v >= 0)):
        raise ValueError("need T >= 1 and v >= 0")
    if T == 1:
        return np.ones((v.size, rows))
    rng = np.random.default_rng(seed)
    full = T <= FULL_T
    width = T if full else TOP_K
    step = max(1, _CHUNK // (heads * width))  # row groups per chunk (bounded memory)
    out = np.empty((v.size, rows))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        n = (hi - lo) * heads
        chi = _chi(rng, (n, 1), d_head)
        x = _draw_full(rng, T, n) if full else _draw_top(rng, T, n, TOP_K)
        if not full:
            t = x[:, -1:]
            log_t = special.log_ndtr(t)
            bulk = np.log(T - TOP_K)
        for i, vi in enumerate(v):
            sig = np.sqrt(vi * chi)
            s = sig * x
            m = s[:, :1] if not full else s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            z, s2 = e.sum(axis=1), np.einsum("ij,ij->i", e, e)
            if not full:  # the T - K keys below the K-th score, at their conditional means
                lz = bulk + 0.5 * sig**2 + special.log_ndtr(t - sig) - log_t - m
                ls2 = bulk + 2.0 * sig**2 + special.log_ndtr(t - 2 * sig) - log_t - 2 * m
                z, s2 = z + np.exp(lz[:, 0]), s2 + np.exp(ls2[:, 0])
            out[i, lo:hi] = (s2 / (z * z)).reshape(hi - lo, heads).mean(axis=1)
    return out


def _ratio(y2: np.ndarray, kappa: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``r = mean_rows[(kappa + (1 - kappa) Y2 / E Y2)^(-1/2)]^2`` for (nv, rows) draws and
    every kappa: (nv, nk). ``mean``: the exact E Y2 (quadrature) per v. Dividing by it rather
    than by the draws' own mean keeps the summand bounded (Y2 >= 1/T): Y2's upper tail is
    heavy near condensation, and a sample mean in the denominator made r 4x noisier. ``y - 1``
    (exact mean 0) is a control variate for the mean of the summand (regression estimator;
    it halves the spread of r between seeds near condensation, measured over 8 seeds)."""
    y = y2 / mean[:, None]
    f = (kappa[None, None, :] + (1 - kappa)[None, None, :] * y[:, :, None]) ** -0.5
    yc = y - y.mean(axis=1, keepdims=True)
    fc = f - f.mean(axis=1, keepdims=True)
    slope = np.einsum("vrk,vr->vk", fc, yc) / np.maximum((yc * yc).sum(axis=1), 1e-300)[:, None]
    return (f.mean(axis=1) - slope * (y.mean(axis=1) - 1.0)[:, None]) ** 2


@functools.lru_cache(maxsize=64)
def ln_factor_table(T: int, d_head: int | None = None, heads: int = 1
                    ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``(v, kappa) -> r`` (module docstring) for rows of T keys: a bicubic spline on 56 x 21
    nodes in (log v on [1e-3, 1e4], kappa), built from :data:`ROWS` seeded draws per node
    (:func:`sample_y2`; ``ROWS / heads``, at least 256, with several heads) and cached on
    disk per (T, d_head, heads). Outside the v-range r is held at the end value (below 1e-3,
    r - 1 < 1e-4)."""
    T, heads = int(T), int(heads)
    d_head = None if d_head is None else int(d_head)
    if T == 1:
        return lambda v, kappa: np.ones(np.broadcast(np.asarray(v), np.asarray(kappa)).shape)
    rows = max(256, ROWS // heads)  # heads average out: r - 1 shrinks ~1/heads

    def build():
        v = np.exp(LOGV_NODES)
        y2 = sample_y2(v, T, rows=rows, heads=heads, d_head=d_head)
        ratio = _ratio(y2, KAPPA_NODES, y2_finite(v, T, d_head))
        return {"coef": bicubic_coef(LOGV_NODES, KAPPA_NODES, ratio)}

    coef = disk_cached(f"lnfluct-T{T}-d{d_head}-h{heads}-n{rows}-s{SEED}", build)["coef"]
    spl = bicubic_eval(LOGV_NODES, KAPPA_NODES, coef)

    def f(v, kappa):
        v, kappa = np.broadcast_arrays(np.asarray(v, dtype=np.float64),
                                       np.clip(np.asarray(kappa, dtype=np.float64), 0.0, 1.0))
        shape = v.shape
        lv = np.clip(np.log(np.maximum(v.ravel(), 1e-300)), LOGV_NODES[0], LOGV_NODES[-1])
        out = np.maximum(spl(lv, kappa.ravel()), 1.0)
        return out.reshape(shape)

    f.coef = coef  # for :mod:`.causal_positions` (all positions' tables on one grid at once)
    return f


def ln_factor(v, kappa, T: int, d_head: int | None = None, heads: int = 1) -> np.ndarray:
    """The LayerNorm fluctuation factor r >= 1 (module docstring), vectorised."""
    return ln_factor_table(T, d_head, heads)(v, kappa)


def position_bins(T: int, k: int = CAUSAL_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Log-spaced representative positions g (every integer while T <= k) and the number of
    the T positions each stands for (the counts sum to T)."""
    g = (np.arange(1, T + 1) if T <= k
         else np.unique(np.round(np.geomspace(1, T, k)).astype(int)))
    edges = np.concatenate([[0.5], 0.5 * (g[1:] + g[:-1]), [T + 0.5]])
    counts = np.diff(np.ceil(edges))  # integers in each half-open bin
    return g.astype(float), counts


def causal_pair_means(nodes, m, yx, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Pair averages of a causal layer seen through a per-token LayerNorm (module docstring,
    causal rows). The query at position t sees t keys, so its norm ``N_t = a0 + b Y2_t`` has a
    law that depends on t; ``m`` holds ``E[N_t^-1/2]`` and ``yx`` the cross ipr ``Yx(N = t)``
    at the positions ``nodes`` (axis 0; the other axes broadcast), both positive. Both are
    interpolated linearly in (log t, log value) to :data:`CAUSAL_BINS` position bins (every
    position while T <= CAUSAL_BINS), then averaged over the T (T - 1) ordered pairs a != c:

        P0 = mean m(a) m(c),     P1 = mean (a/c) Yx(a) m(a) m(c)   (a < c; docs/theory.md §2.4
        causal:
                                                                      row c puts mass a/c on
                                                                      the first a keys)

    so that the LN-averaged cosine is ``c0 P0 + b P1`` for pairs ``C = c0 + b Yx``. Pairs
    inside one bin use the bin's value (a/c ~ 1 there)."""
    nodes = np.asarray(nodes, dtype=np.float64)
    m, yx = np.asarray(m, dtype=np.float64), np.asarray(yx, dtype=np.float64)
    g, n = position_bins(int(T))
    idx = np.interp(np.log(g), np.log(nodes), np.arange(nodes.size, dtype=np.float64))
    j = np.minimum(np.floor(idx).astype(int), max(nodes.size - 2, 0))
    lam = (idx - j).reshape((-1,) + (1,) * (m.ndim - 1))
    jn = np.minimum(j + 1, nodes.size - 1)
    with np.errstate(divide="ignore", invalid="ignore"):  # geometric: exact for Yx = 1/t
        lm, lx = np.log(m), np.log(yx)  # at the nodes, then gathered to the bins
        mg = np.exp((1 - lam) * lm[j] + lam * lm[jn])
        xg = np.exp((1 - lam) * lx[j] + lam * lx[jn])
    nn = n.reshape(lam.shape)
    gg = g.reshape(lam.shape)
    pairs = float(T) * (T - 1)
    nm = nn * mg
    p0 = (nm.sum(axis=0) ** 2 - (nm * mg).sum(axis=0)) / pairs
    w = nm / gg  # sum over later positions c of m(c) / c
    tail = np.cumsum(w[::-1], axis=0)[::-1] - w
    p1 = 2.0 * ((nn * gg * xg * mg * tail).sum(axis=0)
                + (0.5 * nn * (nn - 1) * xg * mg * mg).sum(axis=0)) / pairs
    return p0, p1
