"""sigma-reparam: each chosen weight divided by its spectral norm and multiplied by a gain,
``W <- gamma W / sigma(W)`` (Zhai et al., ICML 2023; docs/fixes.md).

The authors' code starts the gain two ways: at 1 in their speech model and their paper's
pseudocode (``init=one``, the default here: every reparametrised weight then has spectral
norm 1), and at ``sigma(W)`` of the initial weight in their vision model (``init=sigma``:
the weights are unchanged at init; only training sees the reparametrisation). The
reparametrisation itself (the gain trained, ``sigma`` re-estimated every step) is a
training-time device: the written folder holds the weights at init, which is what sigprop
diagnoses. ``targets=qk`` (default) acts on W_Q and W_K (the score scale), ``all`` also on
W_V, W_O and the MLP. A fused QKV layer's Q, K and V blocks count as separate weights.

Theory: scaling W_Q by ``a`` and W_K by ``b`` scales each head's score std by ``a b``, the
other weights' standard deviations by their factors (:class:`.base.Effect`).
"""

from __future__ import annotations

from .base import Method, Param, register
from .parts import need, scale, spectral_norm, weight_of


@register
class SigmaReparam(Method):
    name = "sigma-reparam"
    params = (
        Param("init", "gain at init: one (spectral norm 1) or sigma (unchanged at init)",
              "one", choices=("one", "sigma")),
        Param("targets", "qk: W_Q and W_K; all: every linear of the block", "qk",
              choices=("qk", "all")),
    )

    def apply(self, model, parts, params, ctx, effect):
        one = params["init"] == "one"
        lo, hi = float("inf"), 0.0

        def norm_to_gain(t):
            nonlocal lo, hi
            s = spectral_norm(weight_of(t) if isinstance(t, tuple) else
                              weight_of((t, None, 0)))
            f = 1.0 / s if (one and s > 0) else 1.0
            if f != 1.0:
                scale(t, f)
            lo, hi = min(lo, s), max(hi, s)
            return f

        qk = []
        for p in parts:
            fq = [norm_to_gain(t) for t in need(p, "q", self.name)]
            fk = [norm_to_gain(t) for t in need(p, "k", self.name)]
            qk.append(fq[0] * fk[0])
        effect.scale("qk", qk)
        lines = [f"W_Q, W_K to spectral norm {'1' if one else 'sigma(W) (unchanged)'} "
                 f"(were {lo:.3g} .. {hi:.3g})"]
        if params["targets"] == "all":
            fv, fo, fi, fm = [], [], [], []
            for p in parts:
                fv.append(norm_to_gain(need(p, "v", self.name)[0]))
                fo.append(norm_to_gain(p.o) if p.o is not None else 1.0)
                fi.append([norm_to_gain(m) for m in p.mlp_in][0] if p.mlp_in else 1.0)
                fm.append(norm_to_gain(p.mlp_out) if p.mlp_out is not None else 1.0)
            for name, f in (("v", fv), ("o", fo), ("mlp_in", fi), ("mlp_out", fm)):
                effect.scale(name, f)
            lines.append("W_V, W_O and the MLP weights to spectral norm 1" if one else
                         "every linear reparametrised (unchanged at init)")
        return lines
