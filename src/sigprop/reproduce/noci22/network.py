"""noci22's network (appendix A: ``Z = alpha_1 S + X``, ``X' = alpha_2 Y + Z``) simulated in
torch float64 for many weight draws at once (:func:`simulate`), the same network on sigprop.nn
(:func:`simulate_nn`), and the helpers the forward-pass items share."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ...measurement.rho_tokens import rho_tokens
from ...theory import depth as _depth
from ...theory import uniform as U
from .. import args
from .common import ratio_se, rng_of

__all__ = ["CONFIGS", "token_input", "simulate", "simulate_nn", "rho_of", "column",
           "residual_alphas", "ForwardSizes", "theory_cos"]


def token_input(n: int, d: int, inp: tuple, seed: int) -> np.ndarray:
    """``(n, d)`` input tokens: ``("rho", rho0)`` equal norms ``|x|^2 = d`` and pairwise cosine
    rho0 (:func:`sigprop.measurement.rho_tokens.rho_tokens`, exact for n + 1 <= d), or
    ``("gauss", std)`` i.i.d. N(0, std^2) entries (an embedding layer, noci22 Fig. 11)."""
    kind, par = inp
    if kind == "rho":
        return rho_tokens(n, d, float(par), seed)
    return rng_of(seed).standard_normal((n, d)) * float(par)


@functools.lru_cache(maxsize=64)
def simulate(L: int, a1: float, a2: float, n: int, d: int, inp: tuple, seeds: int, seed: int,
             attention: str = "uniform", activation: str = "linear", device: str = "cpu"):
    """noci22's network (appendix A: ``Z = alpha_1 S + X``, ``Y = sigma(Z W1) W2``,
    ``X' = alpha_2 Y + Z``, ``S = A X W_V``, one head, ``d_ff = d``, every weight i.i.d.
    N(0, 1/d)) for ``seeds`` weight draws at once on one input (:func:`token_input`), float64.
    Weights are drawn layer by layer (memory and time O(S d^2) per layer): ``W_V, W_1, W_2``
    from a torch Generator seeded with ``seed`` and ``W_Q, W_K`` from one seeded with
    ``seed + 1``, so runs that differ only in the attention share every other weight (paired
    comparisons). Returns per layer ``C = |sum_k X_k|^2``, ``F = ||X||_F^2`` and the mean
    pairwise cosine (``(L+1, S)``), and the attention's normalised row entropy (``(L, S)``)."""
    from ...measurement import observables as _obs

    g = torch.Generator(device=device).manual_seed(int(seed))
    g_qk = torch.Generator(device=device).manual_seed(int(seed) + 1)
    x0 = token_input(n, d, inp, seed)
    X = torch.as_tensor(x0, dtype=torch.float64, device=device).expand(seeds, n, d)
    s = 1.0 / math.sqrt(d)
    act = torch.relu if activation == "relu" else (lambda z: z)

    def w(gen=g):  # drawn in float32 (2x faster on CPU), used in float64
        return torch.randn(seeds, d, d, generator=gen, dtype=torch.float32,
                           device=device).double() * s

    C, F, cos, ent = [], [], [], []

    def record(h):
        C.append(h.sum(-2).pow(2).sum(-1))
        F.append(h.pow(2).sum((-1, -2)))
        cos.append(_obs.mean_cos(h))

    record(X)
    log_n = math.log(n)
    for _ in range(L):
        if attention == "uniform":
            S = (X.mean(-2, keepdim=True) @ w()).expand(seeds, n, d)
            ent.append(torch.ones(seeds, dtype=torch.float64, device=device))
        else:
            Wq, Wk = w(g_qk), w(g_qk)
            M = (X @ Wq) @ (X @ Wk).transpose(-1, -2) * s
            logA = torch.log_softmax(M, dim=-1)
            A = logA.exp()
            ent.append(-(A * logA).sum(-1).mean(-1) / log_n)
            S = A @ X @ w()
        Z = a1 * S + X
        X = a2 * (act(Z @ w()) @ w()) + Z
        record(X)
    out = {"C": torch.stack(C), "F": torch.stack(F), "cos": torch.stack(cos),
           "ent": torch.stack(ent)}
    res = {k: v.cpu().numpy() for k, v in out.items()}
    res["C0"], res["F0"] = float((x0.sum(0) ** 2).sum()), float((x0**2).sum())
    for v in res.values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return res


def simulate_nn(L: int, a1: float, a2: float, n: int, d: int, inp: tuple, seeds: int,
                seed: int) -> np.ndarray:
    """``C(X^l)`` per layer ``(L+1, S)`` of the same network built as sigprop's
    :class:`sigprop.nn.SigpropTransformer` from :func:`sigprop.theory.uniform.noci_spec`
    (uniform attention, linear, the branch weights folded into ``W_V``, ``W_2``)."""
    from ...nn.model import SigpropTransformer

    spec = U.noci_spec(L, a1, a2, n, d).replace(d_ff=d)
    x = torch.as_tensor(token_input(n, d, inp, seed), dtype=torch.float64)[None]
    model = SigpropTransformer(spec, n_seeds=seeds, seed=seed + 7919, dtype=torch.float64)
    with torch.no_grad():
        out = model(x, return_hidden=True, return_stats=False)
    return torch.stack([h[:, 0].sum(-2).pow(2).sum(-1) for h in out.hidden]).numpy()


def rho_of(sim: dict, n: int):
    """Thm 3.3's correlation ``E C / ((n-1) E F) - 1/(n-1)`` per layer (ratio of means over
    seeds) with its standard error."""
    r, se = ratio_se(sim["C"], sim["F"])
    return (r - 1.0) / (n - 1.0), se / (n - 1.0)


def column(traj: pd.DataFrame, name: str) -> np.ndarray:
    sub = traj[traj["observable"] == name].sort_values("layer")
    return sub["value"].to_numpy(dtype=np.float64)


def residual_alphas(kind: str, L: int, at1: float, at2: float):
    """(alpha_1, alpha_2) of a residual configuration."""
    if kind == "scaled":
        return math.sqrt(at1 / L), math.sqrt(at2 / L)
    return at1, at2


@dataclass(frozen=True, kw_only=True)
class ForwardSizes:
    """The forward-pass items' shared sizes: ``n`` tokens of width ``d`` at pairwise cosine
    ``rho0``, ``depth`` layers, ``seeds`` weight draws, the ``depths`` of a depth sweep (None
    for an item without one) and ``alpha_tilde`` (the residual scale ``alpha^2 = alpha~ / L``).
    Build it with :meth:`checked`."""

    n: int
    d: int
    rho0: float
    depth: int
    seeds: int
    depths: np.ndarray | None
    alpha_tilde: float

    @classmethod
    def checked(cls, *, n, d, rho0, depth, seeds, alpha_tilde, depths=None) -> ForwardSizes:
        """The sizes, each checked in this order (:mod:`sigprop.reproduce.args`)."""
        n = args.integer("n", n, 2, 4096)
        return cls(n=n, d=args.integer("d", d, n + 1, 65536),
                   rho0=args.real("rho0", rho0, 0.0, 0.99),
                   depth=args.integer("depth", depth, 1, 200),
                   seeds=args.integer("seeds", seeds, 4, 100_000),
                   depths=None if depths is None else args.grid("depths", depths, 1, 512,
                                                                ints=True),
                   alpha_tilde=args.real("alpha_tilde", alpha_tilde, 0.0, 4.0, lo_open=True))

    def data_kw(self) -> dict:
        """The keywords the items' ``*_data`` functions take these sizes by (``at`` for
        ``alpha_tilde``; ``depths`` when there is a depth sweep)."""
        kw = dict(n=self.n, d=self.d, rho0=self.rho0, depth=self.depth, seeds=self.seeds,
                  at=self.alpha_tilde)
        return kw if self.depths is None else {**kw, "depths": self.depths}


#: per-layer residual configurations: (label, kind, alpha~_1 or alpha_1, alpha~_2 or alpha_2)
CONFIGS = (("α₁ = α₂ = 0.5", "const", 0.5, 0.5), ("α₁ = 0.3, α₂ = 0.8", "const", 0.3, 0.8),
           ("α² = α̃/L", "scaled", None, None))


def theory_cos(spec, rho0: float) -> np.ndarray:
    """sigprop's per-layer token cosine (:func:`sigprop.theory.depth.propagate`)."""
    return column(_depth.propagate(spec, rho0=rho0), "cos")
