"""Self-attention rows as a Random Energy Model (docs/theory.md §2.1-2.3). NumPy/SciPy, float64.

A row ``w = softmax(s)``, T keys, i.i.d. scores ``s_b ~ N(0, v)``, ``v = beta^2 log T (1 - rho)``
(§2.1). ``*_asymptotic``: T -> inf (§2.2), here; ``*_finite``: exact finite-T expectations by
deterministic quadrature (§2.3, :mod:`.rem_finite`); ``*_table``: cached splines of those
(:mod:`.rem_tables`). All broadcast; every name is importable from this module.
"""

from __future__ import annotations

import numpy as np

from .lazy import LazyModule
from .rem_finite import (
    entropy_finite,
    f64,
    wmax_finite,
    y2_finite,
    yx_finite,
)
from .rem_tables import (
    entropy_table,
    wmax_table,
    y2_table,
    yx_table,
)

special = LazyModule("scipy.special")

__all__ = [
    "beta_c", "y2_asymptotic", "yx_asymptotic", "entropy_asymptotic", "wmax_asymptotic",
    "y2_finite", "yx_finite", "entropy_finite", "wmax_finite",
    "y2_table", "yx_table", "entropy_table", "wmax_table",
]

_LR = np.arange(-40.0, 5.0, 0.1)                      # wmax_asymptotic: grid in log r


# ----------------------------------------------------------------- T -> infinity (docs/theory.md
# §2.2)
def beta_c(rho) -> np.ndarray:
    """Condensation threshold ``sqrt(2 / (1 - rho))`` (docs/theory.md §2.2); +inf at rho = 1."""
    with np.errstate(divide="ignore"):
        return np.sqrt(2.0 / (1.0 - f64(rho)))


def y2_asymptotic(beta, rho=0.0) -> np.ndarray:
    """REM participation ratio: 0 for beta <= beta_c(rho), ``1 - beta_c/beta`` above (§2.2)."""
    beta, bc = np.broadcast_arrays(f64(beta), beta_c(rho))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(beta > bc, 1.0 - bc / beta, 0.0)


def yx_asymptotic(beta, rho=0.0) -> np.ndarray:
    """Cross-row overlap: sub-leading, 0 in the T -> inf limit (docs/theory.md §2.2)."""
    return np.zeros(np.broadcast(f64(beta), f64(rho)).shape)


def entropy_asymptotic(beta, rho=0.0) -> np.ndarray:
    """Normalised entropy S / log T: ``1 - (beta/beta_c)^2`` below beta_c, 0 above (gg25 B.7)."""
    beta, bc = np.broadcast_arrays(f64(beta), beta_c(rho))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(beta <= bc, 1.0 - (beta / bc) ** 2, 0.0)


def wmax_asymptotic(beta, rho=0.0) -> np.ndarray:
    """E[max weight] of the T -> inf REM: 0 at/below beta_c, Poisson-Dirichlet above.

    Above beta_c the weights converge to PD(m, 0), ``m = beta_c / beta``: ``w_i = x_i / S`` for a
    Poisson process with intensity ``m x^{-1-m}``. Write ``M / S = M int_0^inf e^{-tS} dt``;
    condition on the largest point M = x (Frechet, ``P(M < x) = exp(-x^{-m})``): the others are
    the process on (0, x), so ``E e^{-t S_rest} = exp(-m int_0^x y^{-1-m}(1 - e^{-ty}) dy)``.
    With r = t x and ``w = x^{-m}`` the x-integral is elementary:
    ``E w_max = int_0^inf e^{-r} / (1 + Psi(r)) dr``,
    ``Psi(r) = m r^m int_0^r z^{-1-m}(1 - e^{-z}) dz = r^m Gamma(1-m) P(1-m, r) - (1 - e^{-r})``
    (integration by parts; P the regularised lower incomplete gamma). m -> 0 gives 1, m -> 1
    gives 0. 1-D trapezoid rule in log r.
    """
    beta, bc = np.broadcast_arrays(f64(beta), beta_c(rho))
    out = np.zeros(beta.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = bc / beta
    sel = m < 1.0
    if sel.any():
        mm, r = m[sel][:, None], np.exp(_LR)
        psi = r**mm * special.gamma(1 - mm) * special.gammainc(1 - mm, r) + np.expm1(-r)
        out[sel] = 0.1 * np.sum(np.exp(_LR - r) / (1.0 + psi), axis=1)
    return out
