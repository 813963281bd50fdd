"""One attention layer's Jacobians: the exact squared Frobenius norms of ``dS/dW_Q``,
``dS/dW_K``, ``dS/dW_V`` in closed form (:func:`jacobian_norms`), the same from torch autograd
(:func:`autograd_norms`) that the closed form is checked against, and the input Jacobian
under Assumption 3.1 by its terms (:func:`input_grad_terms`, noci22 Eqs. 25-40)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..core import Check
from .common import softmax, swap

__all__ = ["jacobian_norms", "autograd_norms", "attn_torch", "verify_closed_form",
           "verify_check", "input_grad_norm", "JacobianPieces", "input_jacobian_pieces",
           "InputGradTerms", "input_grad_terms"]


def jacobian_norms(X, Wq, Wk, Wv, tau: float = 1.0, *, uniform: bool = False):
    """Exact ``(||dS/dW_Q||_F^2, ||dS/dW_K||_F^2, ||dS/dW_V||_F^2)`` of
    ``S = A X W_V``, ``A = softmax(tau X W_Q (X W_K)^T / sqrt(d_k))`` (noci22 Eq. 45), batched
    over the leading dimensions of ``X`` (n x d) and the weights.

    With ``Q = X W_Q``, ``K = X W_K``, ``V = X W_V`` and ``dA_ab/dM_ab' = A_ab (delta_bb' -
    A_ab')``, ``dS_ac / dW_Q[i, j] = (tau / sqrt(d_k)) X_ai G_a[c, j]`` with
    ``G_a = sum_b A_ab (V_b - S_a) K_b^T``, so ``||dS/dW_Q||^2 = tau^2/d_k sum_a |X_a|^2
    ||G_a||_F^2`` and ``||G_a||^2 = A_a^T [(V - 1 S_a)(V - 1 S_a)^T o K K^T] A_a`` (``o`` the
    entrywise product), expanded in the Gram matrices without forming ``G``; the key norm is
    the same with ``(Q, X)`` in place of ``(X, K)``, and ``||dS/dW_V||^2 = d_v ||A X||_F^2``.
    ``uniform=True``: the Jacobian under noci22's Assumption 3.1, ``A = 11^T/n`` and
    ``dA/dM = (1/n) I (x) (I - 11^T/n)`` (Eq. 24) whatever the logits.
    """
    X, Wq, Wk, Wv = (np.asarray(a, dtype=np.float64) for a in (X, Wq, Wk, Wv))
    dk, dv, n = Wq.shape[-1], Wv.shape[-1], X.shape[-2]
    Q, K, V = X @ Wq, X @ Wk, X @ Wv
    if uniform:
        A = np.full(np.broadcast_shapes(Q.shape[:-1] + (n,), K.shape[:-1] + (n,)), 1.0 / n)
    else:
        A = softmax(tau * (Q @ swap(K)) / math.sqrt(dk))
    S = A @ V
    Gv = V @ swap(V)
    Us = S @ swap(V)  # Us[a, b] = S_a . V_b
    s2 = (S**2).sum(-1)

    def block(Gm):  # ||G_a||_F^2 for every row a, G built on the Gram matrix Gm
        t1 = ((A @ (Gv * Gm)) * A).sum(-1)
        t2 = (((A * Us) @ Gm) * A).sum(-1)
        t3 = s2 * ((A @ Gm) * A).sum(-1)
        return np.maximum(t1 - 2.0 * t2 + t3, 0.0)

    gq = tau**2 / dk * ((X**2).sum(-1) * block(K @ swap(K))).sum(-1)
    gk = tau**2 / dk * ((Q**2).sum(-1) * block(X @ swap(X))).sum(-1)
    gv = dv * ((A @ X) ** 2).sum((-1, -2))
    return gq, gk, gv


def attn_torch(X, Wq, Wk, Wv, tau, uniform: bool):
    n = X.shape[-2]
    M = tau * (X @ Wq) @ (X @ Wk).T / math.sqrt(Wq.shape[-1])
    if not uniform:
        return torch.softmax(M, dim=-1) @ (X @ Wv)
    # Assumption 3.1 as a function with the same value and Jacobian at this point:
    # A = 11^T/n + (M - M0) L / n, M0 = M detached (Eq. 24: dA = dM L / n)
    L = torch.eye(n, dtype=X.dtype) - 1.0 / n
    return (X @ Wv).mean(-2, keepdim=True).expand(n, -1) + ((M - M.detach()) @ L @ X @ Wv) / n


def autograd_norms(X, Wq, Wk, Wv, tau: float = 1.0, *, uniform: bool = False):
    """The same three squared norms from full torch autograd Jacobians (``torch.func.jacrev``,
    float64), for a few draws: the reference :func:`jacobian_norms` is checked against."""
    t = [torch.tensor(np.array(a, dtype=np.float64)) for a in (X, Wq, Wk, Wv)]

    def one(x, wq, wk, wv):
        jq, jk, jv = torch.func.jacrev(attn_torch, argnums=(1, 2, 3))(x, wq, wk, wv, tau,
                                                                      uniform)
        return (jq**2).sum(), (jk**2).sum(), (jv**2).sum()

    out = torch.vmap(one)(*t)
    return tuple(o.numpy() for o in out)


def verify_closed_form(X, Wq, Wk, Wv, tau=1.0, *, uniform=False, k=3) -> float:
    """Largest relative difference between :func:`jacobian_norms` and autograd on ``k``
    draws (both in float64: roundoff only)."""
    a = jacobian_norms(X[:k], Wq[:k], Wk[:k], Wv[:k], tau, uniform=uniform)
    b = autograd_norms(X[:k], Wq[:k], Wk[:k], Wv[:k], tau, uniform=uniform)
    err = 0.0
    for x, y in zip(a, b, strict=True):
        scale = np.maximum(np.abs(y), 1e-300)
        mask = np.abs(y) > 1e-12 * (np.abs(a[2]) + 1e-300)
        if mask.any():
            err = max(err, float(np.max(np.abs(x - y)[mask] / scale[mask])))
    return err


def verify_check(ref: str, err: float) -> Check:
    return Check.within(f"{ref}: the closed-form Jacobian norms equal torch autograd "
                        "Jacobians (3 draws)", err, hi=1e-8,
                        why="both exact in float64; 1e-8 relative leaves room for roundoff "
                            "of sums over n^2 d^2 terms")



def input_grad_norm(X, Wq, Wk, Wv):
    """``||dS/dX||_F^2`` of real softmax attention by autograd, per draw."""
    t = [torch.tensor(np.array(a, dtype=np.float64)) for a in (X, Wq, Wk, Wv)]

    def one(x, wq, wk, wv):
        return (torch.func.jacfwd(attn_torch, argnums=0)(x, wq, wk, wv, 1.0, False) ** 2).sum()

    return torch.vmap(one)(*t).numpy()



def _pieces_torch(Y, X0, Wq, Wk, Wv):
    """The three terms of noci22's Eq. (25) under Assumption 3.1 as functions of Y, with the
    value and Jacobian of ``dS = (1/n) dM L X W_V + (1/n) 11ᵀ dX W_V`` at Y = X0: A1 (the dX
    on the query side of M), A2 (on the key side), A3 (the value path)."""
    n = Y.shape[-2]
    c = 1.0 / (n * math.sqrt(Wq.shape[-1]))
    L = torch.eye(n, dtype=Y.dtype) - 1.0 / n
    B = L @ X0 @ Wv
    a1 = c * (Y @ Wq) @ (X0 @ Wk).T @ B
    a2 = c * (X0 @ Wq) @ (Y @ Wk).T @ B
    a3 = (Y @ Wv).mean(-2, keepdim=True).expand(n, -1)
    return torch.stack([a1, a2, a3])


@dataclass(frozen=True, kw_only=True)
class JacobianPieces:
    """Per draw, the squared Frobenius norms of the input Jacobian's pieces: ``a1``, ``a2``,
    ``a3`` (``||A1||²``, ``||A2||²``, ``||A3||²``) and ``full`` (``||A1 + A2 + A3||²``)."""

    a1: np.ndarray
    a2: np.ndarray
    a3: np.ndarray
    full: np.ndarray


def input_jacobian_pieces(X, Wq, Wk, Wv) -> JacobianPieces:
    """Per draw the pieces of the input Jacobian under Assumption 3.1 by torch autograd
    (forward mode, ``jacfwd`` of :func:`_pieces_torch`)."""
    t = [torch.tensor(np.array(a, dtype=np.float64)) for a in (X, Wq, Wk, Wv)]

    def one(x, wq, wk, wv):
        J = torch.func.jacfwd(_pieces_torch, argnums=0)(x, x, wq, wk, wv)  # (3, n, dv, n, d)
        return (J**2).sum((1, 2, 3, 4)), (J.sum(0) ** 2).sum()

    parts, full = torch.vmap(one)(*t)
    return JacobianPieces(a1=parts[:, 0].numpy(), a2=parts[:, 1].numpy(),
                          a3=parts[:, 2].numpy(), full=full.numpy())


@dataclass(frozen=True, kw_only=True)
class InputGradTerms:
    """The terms of ``E_W||dS/dX||_F^2`` (:func:`input_grad_terms`): ``a1 = E||A1||²``,
    ``a2 = E||A2||²``, ``cross = 2 E<A1, A2>`` and ``a3 = E||A3||²``."""

    a1: np.ndarray
    a2: np.ndarray
    cross: np.ndarray
    a3: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """``E_W||dS/dX||_F^2`` itself, the sum of the terms."""
        return self.a1 + self.a2 + self.cross + self.a3


def input_grad_terms(X, d_k: int, d_v: int, sigma_q2: float, sigma_k2: float,
                     sigma_v2: float) -> InputGradTerms:
    """sigprop's exact ``E_W||dS/dX||_F^2`` under Assumption 3.1 for a fixed ``X`` (n x d),
    by its terms (docs/reproduce/noci22.md): with ``s = sigma_q^2 sigma_k^2 sigma_v^2``,
    ``B = ||XᵀLX||_F^2``, ``F = ||X||_F^2``, ``F_L = ||LX||_F^2``:
    ``E||A1||² = s d d_v B / n`` (noci22's Eq. 31 with d = d_k), ``E||A2||² = s d d_v F F_L /
    n²`` (noci22 Eq. 36 says it equals ``E||A1||²``: it does not), ``2 E<A1, A2> = 2 s d_v B /
    n²`` and ``E||A3||² = d d_v sigma_v^2``; the cross terms with A3 vanish. Each
    term is broadcast over the leading dimensions of X."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape[-2:]
    Lx = X - X.mean(-2, keepdims=True)
    B = ((swap(X) @ Lx) ** 2).sum((-1, -2))
    F = (X**2).sum((-1, -2))
    FL = (Lx**2).sum((-1, -2))
    s = sigma_q2 * sigma_k2 * sigma_v2
    del d_k  # enters only through sigma_k2 sigma_q2 d_k, which the 1/sqrt(d_k) cancels
    return InputGradTerms(a1=s * d * d_v * B / n, a2=s * d * d_v * F * FL / n**2,
                          cross=2 * s * d_v * B / n**2, a3=np.full(B.shape, d * d_v * sigma_v2))
