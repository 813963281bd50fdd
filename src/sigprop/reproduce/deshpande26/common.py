"""Shared helpers of the deshpande26 items: argument checks, seeded draws, the sampled largest
weight, sigprop's extreme-value correction of the bulk formula and the tables of E w_max the
wmax and bulk items share (docs/reproduce/deshpande26.md; every other module of the package
imports from here).

The model is one softmax row over ``N`` i.i.d. ``N(0, sigma^2)`` logits at inverse temperature
``beta`` (docs/theory.md §3.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy.special import gamma as gamma_fn

from ...theory import rem
from ...theory import scaling as sc
from .. import args
from ..core import Experiment, register

__all__ = ["COLOURS", "MAX_SIZE", "lengths", "positive", "budget_arg", "n_sweep_args",
           "n_sweep_sizes", "n_sweep_item", "rng_of", "trials",
           "sample_wmax", "gumbel_bulk", "exponent_pred", "wmax_tables"]

COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")
#: The largest size (N, d, rows ...) an argument check lets through.
MAX_SIZE = 10**9


# --------------------------------------------------------------------------------------------
# argument checks (on sigprop.reproduce.args)


def lengths(name: str, Ns, n_min: int = 2) -> list[int]:
    """An increasing list of at least ``n_min`` row lengths, each >= 8, as Python ints."""
    return [int(n) for n in args.grid(name, Ns, 8, MAX_SIZE, ints=True, n_min=n_min)]


def positive(name: str, v) -> float:
    """A finite number > 0 (sigma, beta)."""
    return args.real(name, v, 0.0, math.inf, lo_open=True)


def budget_arg(budget) -> int:
    """The sampled logits per N (rows x N), at least 10000."""
    return args.integer("budget", budget, 10_000)


def n_sweep_args(Ns, sigma, budget) -> tuple[list[int], float, int]:
    """The checked arguments of an item sampling rows over the lengths ``Ns``: the lengths,
    the logit std ``sigma`` and the ``budget`` of sampled logits per N."""
    return lengths("Ns", Ns), positive("sigma", sigma), budget_arg(budget)


def n_sweep_sizes(budget: int, full: bool = True) -> dict:
    """The ``tiny`` / ``quick`` (/ ``full``) sizes of an item sampling rows over N: N up to
    1000 / 10^4 (/ 10^5) with a tenth of / ``budget`` (/ ten times) the sampled logits."""
    sizes = dict(tiny=dict(Ns=(100, 1000), budget=budget // 10),
                 quick=dict(Ns=(100, 1000, 10_000), budget=budget))
    if full:
        sizes["full"] = dict(Ns=(100, 1000, 10_000, 100_000), budget=10 * budget)
    return sizes


def n_sweep_item(name: str, *, sigma: float, budget: int, runtime: Mapping[str, float],
                 full: bool = True) -> Callable:
    """Register ``body(Ns, sigma, budget, seed) -> Experiment`` as the item ``name`` that
    samples rows over the lengths ``Ns``: wmax, bulk and retrieval take the same keywords
    (``Ns``, the logit std ``sigma``, the ``budget`` of sampled logits per N), checked the
    same way (:func:`n_sweep_args`), with the sizes of :func:`n_sweep_sizes`."""
    def deco(body: Callable[..., Experiment]) -> Callable[..., Experiment]:
        def item(*, seed: int = 0, device: str = "cpu", Ns: Sequence[int] = (100, 1000, 10_000),
                 sigma: float = sigma, budget: int = budget) -> Experiment:
            return body(*n_sweep_args(Ns, sigma, budget), seed)
        item.__name__ = item.__qualname__ = body.__name__
        item.__module__, item.__doc__ = body.__module__, body.__doc__
        return register(name, **n_sweep_sizes(budget, full), runtime=runtime)(item)
    return deco


# --------------------------------------------------------------------------------------------
# draws and the largest weight


def rng_of(seed: int, *keys: int) -> np.random.Generator:
    """The generator of the stream named by ``seed`` and ``keys``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *[int(k) for k in keys]]))


def trials(budget: int, N: int, lo: int = 64) -> int:
    """Sampled rows of length ``N`` within ``budget`` logits, at least ``lo``."""
    return max(lo, int(budget) // int(N))


def sample_wmax(U: np.ndarray, betas) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error over rows of ``max_j softmax(beta U)_j`` for each beta.

    ``U`` (rows, N) sampled logits; evaluated as ``1 / sum_j exp(beta (U_j - max U))`` (no
    overflow). Returns two arrays of shape (len(betas),)."""
    z = U - U.max(axis=1, keepdims=True)
    w = np.array([1.0 / np.exp(b * z).sum(axis=1) for b in np.asarray(betas, float)])
    return w.mean(axis=1), w.std(axis=1, ddof=1) / math.sqrt(w.shape[1])


def gumbel_bulk(x, N) -> np.ndarray:
    """sigprop's correction of deshpande26 Eq. 10 for ``x = beta / beta_c < 1`` (derived here).

    Eq. 10 puts the largest logit at ``sigma sqrt(2 log N)``; at finite N it is
    ``b_N + G / a_N`` with ``a_N = sqrt(2 log N)``, ``b_N = a_N - (log log N + log 4 pi) /
    (2 a_N)`` and G standard Gumbel, and ``E exp(x G) = Gamma(1 - x)``. With ``Z`` at its
    annealed value this gives ``E w_max ~ bulk * Gamma(1 - x) (4 pi log N)^(-x/2)``: the factor
    returned here. It holds while Z concentrates (x < 1/2) and breaks down as x -> 1."""
    x, N = np.broadcast_arrays(np.asarray(x, float), np.asarray(N, float))
    return gamma_fn(1.0 - x) * (4.0 * np.pi * np.log(N)) ** (-x / 2.0)


def exponent_pred(x, N1, N2) -> np.ndarray:
    """N-exponent -d log E w_max / d log N between N1 and N2 from the corrected bulk:
    (1 - x)^2 + (x / 2) (log log N2 - log log N1) / (log N2 - log N1)."""
    x = np.asarray(x, float)
    l1, l2 = math.log(N1), math.log(N2)
    return (1.0 - x) ** 2 + 0.5 * x * (math.log(l2) - math.log(l1)) / (l2 - l1)


def wmax_tables(Ns, xs, seed, budget, sigma) -> dict:
    """MC and quadrature E w_max on a grid of x = beta / beta_c for every N:
    ``{N: (mean, stderr, exact)}``."""
    out = {}
    for N in Ns:
        bc = float(sc.deshpande_beta_c(N, sigma))
        U = sigma * rng_of(seed, N).standard_normal((trials(budget, N), N))
        m, se = sample_wmax(U, xs * bc)
        exact = rem.wmax_finite((xs * bc * sigma) ** 2, float(N))
        out[N] = (m, se, exact)
    return out
