"""Mixture-of-experts MLPs: the routing factors of the block map (docs/theory.md §2.5.2).

Token ``a``'s MLP output is ``y_a = c sum_e g_e(a) f_e(x_a)`` (``c`` the routed scaling
factor), plus a shared expert where the model has one. The router's logits ``r(x) = W_r x``
with ``W_r ~ N(0, var_r / d)`` are, for two tokens at ``(q, p)``, jointly Gaussian per expert
with variance ``s^2 = var_r q`` and correlation ``rho = p / q``, independent across experts.
The experts are i.i.d. MLPs with zero-mean weights, independent of the router, so the cross
terms between different experts vanish and the MLP's second moments factorise:

    E y_a . y_a / d = c^2 A(s) K(q, q),    E y_a . y_c / d = c^2 B(s, rho) K(q, p),

with ``A = E sum_e g_e(a)^2`` and ``B = E sum_e g_e(a) g_e(c)`` (``B(s, 1) = A``), ``K``
the dense MLP map of one expert (:func:`sigprop.theory.blocks.mlp_map`, biases included:
each expert's output bias is its own, so it carries ``B`` too).

The top-k of E correlated Gaussians has no closed form beyond E = 2, so ``A`` and ``B`` are
computed by a **deterministic seeded Monte-Carlo tabulation** in float64: pairs of standard
normal logit vectors (seed 0, common to every node, so the table is smooth in rho), drawn in
chunks until every node's measured standard error is below ``SE_BOUND = 0.5 / sqrt(N_SAMPLES)
~ 0.002`` (at most ``N_SAMPLES`` pairs: few experts need them all, hundreds of experts average
within a draw and stop after a few thousand), on ``RHO_NODES`` nodes uniform in
``u = sqrt(1 - rho)`` (``B`` has a ``sqrt(1 - rho)`` cusp at rho = 1 for hard routing),
interpolated linearly in ``u``; interpolation error below 1e-3 (tests).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..spec import MOE_WEIGHTINGS

#: routing-weight rules: score = softmax over all E or elementwise sigmoid of the logits; the
#: top-k scores are kept, and ``_norm`` renormalises them to sum 1 (softmax_norm = softmax over
#: the top-k logits: Mixtral, gpt-oss, Qwen3-MoE with norm_topk_prob; softmax: Qwen2-MoE,
#: Jamba; sigmoid_norm: DeepSeek-V3)
WEIGHTINGS = MOE_WEIGHTINGS
N_SAMPLES = 1 << 16
RHO_NODES = 41
_CHUNK = 1 << 11
#: the standard error every node's estimate reaches (sampling stops there, at the latest
#: after N_SAMPLES): many experts average within a draw, so they need fewer draws
SE_BOUND = 0.5 / np.sqrt(N_SAMPLES)


def gates(logits: np.ndarray, k: int, weighting: str) -> np.ndarray:
    """Routing weights (..., E) of logits (..., E): the top-k scores (module docstring), the
    others 0."""
    E = logits.shape[-1]
    if weighting.startswith("softmax"):
        z = logits - logits.max(axis=-1, keepdims=True)
        sc = np.exp(z)
        sc /= sc.sum(axis=-1, keepdims=True)
    else:
        sc = 1.0 / (1.0 + np.exp(-logits))
    if k < E:
        idx = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
        mask = np.zeros(logits.shape, dtype=bool)
        np.put_along_axis(mask, idx, True, axis=-1)
        sc = np.where(mask, sc, 0.0)
    if weighting.endswith("_norm"):
        sc = sc / sc.sum(axis=-1, keepdims=True)
    return sc


@lru_cache(maxsize=512)
def _table(E: int, k: int, s: float, weighting: str) -> tuple[np.ndarray, np.ndarray]:
    """``(u nodes, B on them)`` for logit std ``s`` (module docstring); ``B[0]`` (rho = 1) is
    ``A``. Nodes ``u = sqrt(1 - rho)`` in [0, sqrt 2]."""
    u = np.linspace(0.0, np.sqrt(2.0), RHO_NODES)
    rho = 1.0 - u**2
    rng = np.random.default_rng(0)
    out, sq, n_done = np.zeros(RHO_NODES), np.zeros(RHO_NODES), 0
    while n_done < N_SAMPLES:
        n = min(_CHUNK, N_SAMPLES - n_done)
        z1 = rng.standard_normal((n, E))
        z2 = rng.standard_normal((n, E))
        ga = gates(s * z1, k, weighting)
        for i, r in enumerate(rho):
            gc = gates(s * (r * z1 + np.sqrt(max(1.0 - r * r, 0.0)) * z2), k, weighting)
            x = np.einsum("ne,ne->n", ga, gc)
            out[i] += x.sum()
            sq[i] += x @ x
        n_done += n
        mean = out / n_done  # stop once every node's standard error is below the bound
        se = np.sqrt(np.maximum(sq / n_done - mean**2, 0.0) / max(n_done - 1, 1))
        if n_done >= 2 * _CHUNK and se.max() < SE_BOUND:
            break
    return u, out / n_done


def factors(E: int, k: int, var_r, weighting: str, q, p) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` (module docstring) for router inputs at ``(q, p)``: logit std
    ``s = sqrt(var_r q)``, correlation ``rho = p / q``; broadcasts over ``q`` and ``p``."""
    q = np.asarray(q, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    q, p = np.broadcast_arrays(q, p)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.clip(np.where(q > 0, p / np.where(q > 0, q, 1.0), 1.0), -1.0, 1.0)
    s = np.sqrt(np.maximum(float(var_r) * q, 0.0))
    sr = np.round(s, 6)
    A, B = np.empty(q.shape), np.empty(q.shape)
    for val in np.unique(sr):
        m = sr == val
        u, tab = _table(int(E), int(k), float(val), weighting)
        A[m] = tab[0]
        B[m] = np.interp(np.sqrt(1.0 - rho[m]), u, tab)
    return A, B
