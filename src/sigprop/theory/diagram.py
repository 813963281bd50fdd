"""Trainability diagram over (beta, alpha_attn) and the critical residual strength
(docs/theory.md §2.7, gg25 Fig. 1c). Vectorised: the whole grid is iterated through the depth at
once,
and alpha_crit is a bisection run on all betas together — no Python loop per grid point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..spec import ArchSpec
from . import rem
from .depth import final_cos, verdict

TRAINABLE, RANK_COLLAPSE, ENTROPY_COLLAPSE = 0, 1, 2
REGIMES = ("trainable", "rank_collapse", "entropy_collapse")
SEARCH_K, SEARCH_ROUNDS = 15, 5
ALPHA_CEILING = 1e3


@dataclass
class Diagram:
    """A computed diagram: ``regime[i, j]`` for ``betas[i]``, ``alphas[j]`` (codes index
    :data:`REGIMES`), ``rho_l[i, j]`` the final cosine (when computed), ``alpha_crit[i]``
    (NaN above beta_c, where the first layer condenses and the residual cannot help)."""

    betas: np.ndarray
    alphas: np.ndarray
    rho_l: np.ndarray | None
    regime: np.ndarray
    alpha_crit: np.ndarray
    beta_c: float
    rho0: float
    rho_max: float
    depth: int
    point: dict

    def to_json(self) -> dict:
        """Plain dict (arrays kept as arrays: pass through
        :func:`sigprop.trajectory.clean_json`)."""
        return {
            "depth": self.depth, "rho0": self.rho0, "rho_max": self.rho_max,
            "beta_c": self.beta_c, "regimes": list(REGIMES),
            "betas": self.betas, "alphas": self.alphas, "regime": self.regime,
            "rho_L": self.rho_l, "alpha_crit": {"beta": self.betas, "alpha": self.alpha_crit},
            "point": self.point,
        }


def alpha_crit(spec: ArchSpec, betas=None, *, rho0: float | None = None,
               depth: int | None = None, asymptotic: bool = False,
               hi: float = ALPHA_CEILING) -> np.ndarray:
    """Smallest alpha_attn with rho_L < rho_max, per beta (docs/theory.md §2.7).

    rho_L decreases with alpha, so the crossing is bracketed and narrowed for all betas at
    once by a (K+1)-ary search: each round evaluates K candidates per beta in one vectorised
    pass through the depth (bisection with K = 1). 0 when alpha = 0 already keeps rho_L below
    rho_max; +inf when alpha = ``hi`` does not. Betas default to the spec's own.

    NaN above beta_c(rho0) (softmax and centred attention): there the first layer condenses
    (entropy collapse) whatever the residual, so no alpha_attn makes the spec trainable. This is
    the one definition used by ``predict``, ``measure`` and ``diagram`` (grid and own point).
    NaN also where the search met a non-finite rho_L (see :func:`.depth.final_cos`)."""
    b_all = np.atleast_1d(np.asarray(spec.beta_eff if betas is None else betas,
                                     dtype=np.float64))
    r0 = spec.rho_init if rho0 is None else float(rho0)
    out_all = np.full(b_all.shape, np.nan)
    need = (b_all <= float(rem.beta_c(r0)) if spec.attention not in ("uniform", "identity")
            else np.ones(b_all.shape, bool))
    if need.any():
        out_all[need] = _alpha_crit_search(spec, b_all[need], rho0, depth, asymptotic, hi)
    return out_all


def _alpha_crit_search(spec, b, rho0, depth, asymptotic, hi):
    """The vectorised (K+1)-ary search of :func:`alpha_crit` for betas below beta_c."""
    # only the side of rho_max matters: entries may stop early once it is certain
    kw = dict(rho0=rho0, depth=depth, asymptotic=asymptotic, threshold=spec.rho_max)
    ends = final_cos(spec, beta=b[:, None], alpha_attn=np.array([0.0, hi]), **kw)
    ok0, ok_hi = ends[:, 0] < spec.rho_max, ends[:, 1] < spec.rho_max
    out = np.where(ok0, 0.0, np.where(ok_hi, np.nan, np.inf))
    out = np.where(np.isfinite(ends).all(axis=1), out, np.nan)
    todo = ~ok0 & ok_hi & np.isfinite(ends).all(axis=1)  # only these need the search
    if todo.any():
        out[todo] = _refine(spec, b[todo], kw, hi)
    return out


def _refine(spec, b, kw, hi):
    """The (K+1)-ary narrowing of alpha_crit in (0, hi] for betas whose ends bracket it."""
    lo, up = np.zeros_like(b), np.full_like(b, hi)
    frac = np.arange(1, SEARCH_K + 1) / (SEARCH_K + 1)
    rows = np.arange(b.size)
    # round 0 brackets alpha_crit on a geometric ladder (alpha spans decades), then
    # (K+1)-ary refinement: relative resolution ~ 2.2 / 16^4 ~ 3e-5
    ladder = np.geomspace(1e-2, hi, SEARCH_K + 1)[:-1]
    for rnd in range(SEARCH_ROUNDS):
        cand = (np.broadcast_to(ladder, (b.size, SEARCH_K)) if rnd == 0
                else lo[:, None] + (up - lo)[:, None] * frac)
        good = final_cos(spec, beta=b[:, None], alpha_attn=cand, **kw) < spec.rho_max
        first = np.where(good.any(axis=1), good.argmax(axis=1), SEARCH_K)
        new_up = np.where(first < SEARCH_K, cand[rows, np.minimum(first, SEARCH_K - 1)], up)
        lo = np.where(first > 0, cand[rows, np.maximum(first - 1, 0)], lo)
        up = new_up
    return up


def compute(spec: ArchSpec, *, n_beta: int = 256, n_alpha: int = 256,
            beta_max: float | None = None, alpha_max: float | None = None,
            rho0: float | None = None, asymptotic: bool = False,
            with_rho: bool = False) -> Diagram:
    """The (beta, alpha_attn) regime grid for the spec's depth (docs/theory.md §2.7, gg25 Fig. 1c).

    Entropy collapse: beta > beta_c(rho0) (the first layer condenses; uniform attention never
    does). Rank collapse: otherwise, if rho_L >= rho_max. Trainable: the rest.
    ``with_rho`` also iterates the whole grid through the depth for ``rho_l[i, j]``.
    """
    r0 = spec.rho_init if rho0 is None else float(rho0)
    bc = float(rem.beta_c(r0))
    if beta_max is None:
        beta_max = max(3.0, 2.0 * bc if math.isfinite(bc) else 3.0, 1.25 * spec.beta_eff)
    betas = np.linspace(0.0, beta_max, n_beta)
    # alpha_crit only matters where the first layer does not condense (beta <= beta_c); above
    # it the entry is NaN. The spec's own beta rides along in the same vectorised search.
    crit_all = alpha_crit(spec, np.append(betas, spec.beta_eff), rho0=r0, asymptotic=asymptotic)
    crit, own_crit = crit_all[:-1], float(crit_all[-1])
    if alpha_max is None:
        finite = crit[np.isfinite(crit)]
        top = float(finite.max()) if finite.size else 1.0
        alpha_max = float(min(max(2.0, 1.25 * top, 1.25 * spec.alpha_attn), ALPHA_CEILING))
    alphas = np.linspace(0.0, alpha_max, n_alpha)
    # rho_L is monotone in alpha, so the rank-collapse region is exactly alpha < alpha_crit
    with np.errstate(invalid="ignore"):
        regime = np.where(alphas[None, :] < crit[:, None], RANK_COLLAPSE, TRAINABLE)
    rho_l = None
    if with_rho:
        rho_l = final_cos(spec, beta=betas[:, None], alpha_attn=alphas[None, :], rho0=r0,
                          asymptotic=asymptotic)
    if spec.attention not in ("uniform", "identity"):
        regime = np.where(betas[:, None] > bc, ENTROPY_COLLAPSE, regime)
    own_rho = float(final_cos(spec, rho0=r0, asymptotic=asymptotic))
    point = {"beta": spec.beta_eff, "alpha": spec.alpha_attn, "rho_L": own_rho,
             "regime": verdict(spec, rho0=r0, rho_l=own_rho), "alpha_crit": own_crit}
    return Diagram(betas, alphas, rho_l, regime.astype(np.int8), crit, bc, r0, spec.rho_max,
                   spec.depth, point)
