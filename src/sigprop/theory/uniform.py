"""Uniform attention: forward moments, gradient norms and temperature (noci22; docs/theory.md §4).

noci22's model (appendix A): ``Z = alpha_1 S + X``, ``Y = sigma(Z W1) W2``,
``X' = alpha_2 Y + Z`` with ``S = A X W_V`` and ``A = softmax(X W_Q W_K^T X^T / sqrt(d_k))``,
under Assumption 3.1 (uniform attention, ``A = 11^T / n``). Everything here is NumPy float64
and broadcasts over its arguments (docs/theory.md §1 conventions); torch is never imported.

Gradient normalisation (settled by autograd simulation in ``tests/theory/test_uniform.py``):

* one head, ``X`` is ``n x d``; ``W_Q, W_K`` are ``d x d_k``, ``W_V`` is ``d x d_v``;
  Eqs. 17-18 take ``d_k = d_v = d`` (keyword ``d_head`` lifts this);
* ``W_V`` and ``W_K`` entries i.i.d., mean 0, variance ``1/d`` (fan-in; noci22's
  ``sigma_v^2 = sigma_k^2 = 1/d``). ``W_Q`` does not enter: the Jacobian is taken under
  Assumption 3.1, i.e. ``A = 11^T/n`` and ``dA/dM = (1/n) I_n kron (I_n - 11^T/n)`` (Eq. 24),
  which is exact at ``W_Q = 0`` and the limit of small logits;
* inputs as in noci22 A.2: the columns of ``X`` are i.i.d. ``N(0, sigma_x^2 [(1-rho) I +
  rho 11^T])`` (every pair of tokens has correlation rho in every dimension);
* ``||dS/dW||_F^2`` is the squared Frobenius norm of the full Jacobian
  ``d vec(S) / d vec(W)^T``, i.e. ``sum_{a,c,i,j} (dS_ac / dW_ij)^2`` over all ``n d_v``
  output entries and all parameter entries; the expectation is over X and the weights.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..spec import ArchSpec
from . import depth


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# gradients at initialisation (noci22 §3.3, appendix A.2; docs/theory.md §4)
# --------------------------------------------------------------------------------------------
def isserlis_factor(d, n, rho) -> np.ndarray:
    """``1 + 4 (1 - rho) / (n d)``: exact Gaussian value of ``E[||X||_F^2 ||X^T L X||_F^2]``
    over the product of the two expectations that noci22 A.2 assumes uncorrelated.

    Derivation: with ``L = I - 11^T/n``, ``U = L X`` written in an orthonormal basis of
    ``1^perp`` is an ``(n-1) x d`` matrix of i.i.d. ``N(0, s)`` entries, ``s = sigma_x^2 (1-rho)``,
    independent of the mean part, and ``||X^T L X||_F^2 = ||U^T U||_F^2`` is homogeneous of
    degree 4 in ``U``; hence ``E[||U||_F^2 f(U)] = s (N + 4) E f`` with ``N = (n-1) d``,
    while the mean part contributes ``d sigma_x^2 (1 + (n-1) rho)`` independently. Summing gives
    ``E||X^T L X||^2 * sigma_x^2 (n d + 4 (1 - rho))``.
    """
    return 1.0 + 4.0 * (1.0 - _f(rho)) / (_f(n) * _f(d))


def grad_norms(sigma_x2, d, n, rho, *, d_head=None, exact: bool = False):
    """``(E||dS/dW_V||_F^2, E||dS/dW_Q||_F^2)`` of one attention layer at init.

    noci22 Eq. 17 (docs/theory.md §4): ``sigma_x^2 d^2 (1 + rho (n-1))``, from Eq. 6
    ``d_v n E|xbar|^2``; exact under the module's normalisation (it involves no weight).

    noci22 Eq. 18: ``sigma_x^6 ((n-1)/n) (1-rho)^2 d (n + d)``, from Eq. 7
    ``(sigma_v^2 sigma_k^2 d_v / n^2) E[||X||_F^2 ||X^T L X||_F^2]`` after A.2's decoupling
    ``E[||X||^2 ||X^T L X||^2] ~ E||X||^2 E||X^T L X||^2``. The power is ``sigma_x^6`` (as in
    Eq. 46 and docs/theory.md §4; the restatement at the start of A.2's proof says ``sigma_x^2``, a
    typo): checked by autograd at ``sigma_x^2 = 2`` (n = d = 8, rho = 0.3: value / Eq. 17
    = 0.997 +- 0.008, query / Eq. 18 = 1.031 +- 0.013). ``exact=True`` multiplies by
    :func:`isserlis_factor` ``1 + 4(1-rho)/(n d)``, the exact Gaussian expectation (1.044
    there); at n = d = 4, rho = 0 autograd measures query / Eq. 18 = 1.226 +- 0.020 against the
    factor 1.25, so Eq. 18 is the large-``n d`` form. The key gradient has the same
    expectation (its norm is ``||X W_Q||^2 ||X^T L X W_V||^2 / (n^2 d_k)``).

    ``d_head`` (default ``d``): heads of width ``d_k = d_v = d_head`` cut from ``d x d`` weights
    of variance ``1/d``; per head ``sigma_x^2 d d_head (1 + rho (n-1))`` and
    ``sigma_x^6 ((n-1)/n) (1-rho)^2 d_head (n + d)`` (times the factor, now ``1 + 4(1-rho)/(n
    d)``). Their ratio, hence :func:`tau_star`, does not depend on ``d_head``.

    Outside Assumption 3.1 the constants move (autograd, softmax with W_Q, W_K, W_V ~
    N(0, 1/d), n = d = 8, 4000 draws, value / Eq. 17 and query / Eq. 18 +- SE): at noci22's
    stated init with ``sigma_x^2 = 1`` (logits of O(1) variance) 2.355 +- 0.019 and
    0.926 +- 0.012 at rho = 0, 1.223 +- 0.010 and 0.956 +- 0.013 at rho = 0.3; at
    ``sigma_x^2 = 1/d`` (logits O(1/d^2), noci22 B.2) 1.027 +- 0.008 and 1.053 +- 0.015
    (uniform theory with the factor: 1 and 1.0625).
    """
    sx2, d, n, rho = _f(sigma_x2), _f(d), _f(n), _f(rho)
    dh = d if d_head is None else _f(d_head)
    g_v = sx2 * d * dh * (1.0 + rho * (n - 1.0))
    g_q = sx2**3 * ((n - 1.0) / n) * (1.0 - rho) ** 2 * dh * (n + d)
    if exact:
        g_q = g_q * isserlis_factor(d, n, rho)
    return g_v, g_q


def tau_star(sigma_x2, d, n, rho, *, exact: bool = False):
    """noci22 Eq. 47: the logit multiplier ``tau`` (Eq. 45) equalising Eqs. 17 and 46,

        ``tau^2 = d n (1 + rho (n-1)) / (sigma_x^4 (1-rho)^2 (n+d) (n-1))``.

    ``d`` is the model width the Q/K/V weights read from (fan-in variance ``1/d``); with heads
    the ratio is independent of the head width (see :func:`grad_norms`), so for noci22's
    IWSLT'14 model use ``d = 512``, not the head width 128. ``exact=True`` divides ``tau^2`` by
    :func:`isserlis_factor`. ``rho -> 1`` (rank collapse: the query gradient vanishes,
    Thm 3.2) gives ``+inf``, as does ``n = 1``; never NaN for ``0 <= rho <= 1``.
    """
    sx2, d, n, rho = _f(sigma_x2), _f(d), _f(n), _f(rho)
    num = d * n * (1.0 + rho * (n - 1.0))
    den = sx2**2 * (1.0 - rho) ** 2 * (n + d) * (n - 1.0)
    if exact:
        den = den * isserlis_factor(d, n, rho)
    with np.errstate(divide="ignore"):
        return np.sqrt(num / den)


def grad_norms_tempered(sigma_x2, d, n, rho, tau, *, d_head=None, exact: bool = False):
    """noci22 Eq. 46 with Eq. 45's logits ``tau X W_Q W_K^T X^T / sqrt(d_k)``: the query
    gradient is ``tau^2`` times Eq. 18, the value gradient is unchanged (Eq. 17). Under
    Assumption 3.1 this is exact (tau rescales ``dM/dW_Q`` and leaves ``A`` uniform). At
    ``tau = tau_star(...)`` (same ``exact``) the two norms are equal."""
    g_v, g_q = grad_norms(sigma_x2, d, n, rho, d_head=d_head, exact=exact)
    return g_v, _f(tau) ** 2 * g_q


# --------------------------------------------------------------------------------------------
# deviation from uniform attention (noci22 Lemma A.7)
# --------------------------------------------------------------------------------------------
def uniform_deviation(sigma_k2, x_norm2_i, x_norm2_j):
    """noci22 Eq. 43: ``E[M_ij^2 | X] = sigma_k^4 |X_i|^2 |X_j|^2`` for the logits
    ``M = X W_Q W_K^T X^T / sqrt(d_k)`` with ``W_Q, W_K`` i.i.d. of variance ``sigma_k^2``
    (``E[M_ij | X] = 0``). Exact for any ``d_k`` and also for ``i = j`` (W_Q, W_K independent)."""
    return _f(sigma_k2) ** 2 * _f(x_norm2_i) * _f(x_norm2_j)


def glorot_deviation(d_v, d_k, x_norm2):
    """Eq. 43 at Glorot ``sigma_k^2 = 2 / (d_v + d_k)`` for tokens of squared norm ``x_norm2``:
    ``4 x_norm2^2 / (d_v + d_k)^2``. Eq. 44's ``O(1/d_k^2)`` holds with the input width
    ``d_v`` and the token norms held fixed as ``d_k -> inf`` (then ``M -> 0`` in L2 and
    ``A -> 11^T / n``); its local log-log slope is ``-2 d_k / (d_v + d_k)``. With tokens of
    O(1) entries (``x_norm2 ~ d_v``) the same law holds with a ``d_v^2`` prefactor."""
    return 4.0 * _f(x_norm2) ** 2 / (_f(d_v) + _f(d_k)) ** 2


# --------------------------------------------------------------------------------------------
# forward moments (noci22 Lemmas 3.2, 3.3, Thm 3.3)
# --------------------------------------------------------------------------------------------
def _growth_m1(L, a2):
    """``(1 + a2)^L - 1`` without cancellation (``a2 = alpha^2 >= 0``)."""
    return np.expm1(_f(L) * np.log1p(_f(a2)))


def lemma32_C(L, alpha1, alpha2, C0):
    """noci22 Eq. 10: ``E C(X^L) = (1 + alpha_2^2)^L (1 + alpha_1^2)^L C(X)``, with
    ``C(X) = sum_{k,k'} <X_k, X_k'> = n^2 |xbar|^2`` (uniform attention, linear activation,
    no LN, weights of variance ``1/d``)."""
    return (1.0 + _growth_m1(L, _f(alpha1) ** 2)) * (1.0 + _growth_m1(L, _f(alpha2) ** 2)) * _f(C0)


def lemma33_norm(L, alpha1, alpha2, C0, F0, n):
    """noci22 Eq. 12: ``E||X^L||_F^2 = (1+alpha_2^2)^L [alpha_1^2 sum_{k<L} (1+alpha_1^2)^k
    C0 / n + F0]`` with ``F0 = ||X||_F^2`` and ``C0 / n = n |xbar|^2``; the geometric sum times
    ``alpha_1^2`` is ``(1+alpha_1^2)^L - 1`` (0 at ``alpha_1 = 0``)."""
    geo = _growth_m1(L, _f(alpha1) ** 2)
    return (1.0 + _growth_m1(L, _f(alpha2) ** 2)) * (geo * _f(C0) / _f(n) + _f(F0))


def thm33_rho_limit(alpha1_tilde, C0, F0, n):
    """noci22 Eq. 15: ``lim_L rho^L`` under ``alpha_i^2 = alpha~_i / L`` (tokens of equal norm):

        ``n e^a C0 / ((n-1) [(e^a - 1) C0 + n F0]) - 1/(n-1)``,  ``a = alpha~_1``

    (independent of ``alpha~_2``). The finite-L value differs by ``O(alpha~_1^2 / L)``.
    Constant ``alpha`` instead gives ``rho^L -> 1`` (Eq. 16)."""
    a, C0, F0, n = _f(alpha1_tilde), _f(C0), _f(F0), _f(n)
    return (n * np.exp(a) * C0 / ((n - 1.0) * (np.expm1(a) * C0 + n * F0))
            - 1.0 / (n - 1.0))


class NociTrajectory(NamedTuple):
    """Per-layer expectations for layers ``0..L`` (index = layer)."""

    C: np.ndarray  # E C(X^l) = E sum_{k,k'} <X_k, X_k'>
    F: np.ndarray  # E ||X^l||_F^2
    rho: np.ndarray  # mean pairwise token correlation (docs/theory.md §1 cos)


def noci_spec(L: int, alpha1, alpha2, n: int, d: int = 64) -> ArchSpec:
    """The ArchSpec of noci22's model, with the residual weights folded into the branch.

    noci22 scales the branch (``Z = alpha_1 S + X``); sigprop's ``alpha_attn/alpha_mlp`` scale
    the skip (docs/theory.md §2.6). With linear maps ``alpha_1 A X W_V`` has exactly the law of
    ``A X W_V'`` with ``W_V' ~ N(0, alpha_1^2 / d)``, and ``alpha_2 Z W1 W2`` that of
    ``Z W1 W2'`` with ``W2' ~ N(0, alpha_2^2 / d_ff)``; so unit skips with ``sigma_v2 =
    alpha_1^2`` and ``sigma_w2_out = alpha_2^2`` give noci22's moments with no rescaling.
    The skip gauge (``alpha_attn = 1/alpha_1``, second moments ``(alpha_1 alpha_2)^2`` smaller
    per block) agrees where it is representable (tested) but overflows for small alphas at
    large depth ((1 + 1/alpha^2)^(2L) at alpha^2 = 1e-4, L = 1e4) and cannot express
    ``alpha = 0``; here ``alpha_1 = 0`` is ``sigma_v2 = 0`` (attention branch off) exactly.
    """
    return ArchSpec(depth=int(L), d_model=int(d), heads=1, seq_len=int(n), norm="none",
                    attention="uniform", activation="linear", sigma_v2=float(alpha1) ** 2,
                    sigma_w2=1.0, sigma_w2_out=float(alpha2) ** 2, sigma_b2=0.0,
                    alpha_attn=1.0, alpha_mlp=1.0)


def propagate_noci(L, alpha1, alpha2, n, rho0, d: int = 64, sigma_x2: float = 1.0):
    """noci22's model (uniform attention, linear activation, no LN, value and FF weights of
    variance ``1/d``) run through :func:`sigprop.theory.depth.propagate` (docs/theory.md §4: the
    (q, p) recursion of §2 with uniform attention) via :func:`noci_spec`.

    Input: ``n`` tokens of width ``d``, per-dimension variance ``sigma_x2`` and pairwise
    correlation ``rho0`` in [0, 1] (propagate's range). Returns a :class:`NociTrajectory`
    of arrays of length ``L + 1`` with ``F = n d q`` and ``C = n d (q + (n-1) p)``; these equal
    Lemmas 3.2/3.3 (:func:`lemma32_C`, :func:`lemma33_norm`) to roundoff. Scalar parameters
    only (the Trajectory is one spec's); ``L >= 1``.
    """
    traj = depth.propagate(noci_spec(L, alpha1, alpha2, n, d), rho0=float(rho0))

    def column(name: str) -> np.ndarray:
        sub = traj[traj["observable"] == name].sort_values("layer")
        return sub["value"].to_numpy(dtype=np.float64)

    rho = column("cos")
    q = column("q") * float(sigma_x2)
    F = float(n) * float(d) * q
    return NociTrajectory(C=F * (1.0 + (float(n) - 1.0) * rho), F=F, rho=rho)
