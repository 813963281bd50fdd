"""qk-norm: q and k normalised before the scores, each with a trainable gain (ones at init):
per head over ``head_dim`` (``scope=head``, as Qwen 3 and Gemma 3; Henry et al. 2020,
Dehghani et al. 2023) or over the whole projection (``scope=proj``, as OLMo 2); RMSNorm
(``kind=rms``, default) or LayerNorm (``kind=layernorm``). The norm acts on the projection's
output (a forward hook on W_Q and W_K, before any rotary embedding, as in those models), so
it works with every attention implementation; the gains are saved as ``sigprop_q_norm`` /
``sigprop_k_norm`` beside the projection's weight and restored by sigprop's loader.

Theory: unit-RMS q and k of ``head_dim`` entries give scores of variance ``(scale^2 dh)``
times the gains' product, whatever the weights: each head's score std becomes
``scale sqrt(dh)`` (1 for the usual ``scale = dh^-1/2``).
"""

from __future__ import annotations

import math

from ...spec import SpecError
from .base import Method, Param, register
from .parts import install_qk_norm, need


def _install(parts, params, method):
    for p in parts:
        if p.site is not None and p.site.q_post is not None:
            raise SpecError(method, f"{p.name}: the model already normalises q and k")
        for role in ("q", "k"):
            for t in need(p, role, method):
                m, sl, _ = t
                width_all = (sl[1] - sl[0]) if sl is not None else \
                    (getattr(m, "out_features", None) or m.nf)
                if params["scope"] == "head":
                    width = gain = p.head_dim
                    if width <= 0 or width_all % width:
                        raise SpecError(method, f"{p.name}: {role} width {width_all} is not "
                                                f"a multiple of the head size {width}")
                else:
                    width = gain = width_all
                install_qk_norm(t, role, width, params["kind"], gain)


@register
class QKNorm(Method):
    name = "qk-norm"
    params = (
        Param("scope", "head: each head's q/k (Qwen 3); proj: the whole projection (OLMo 2)",
              "head", choices=("head", "proj")),
        Param("kind", "rms (RMSNorm) or layernorm", "rms", choices=("rms", "layernorm")),
    )

    def apply(self, model, parts, params, ctx, effect):
        _install(parts, params, self.name)
        std = [p.site.scale * math.sqrt(p.head_dim) if p.site is not None else 1.0
               for p in parts]
        effect.score_std = [float(s) for s in std]
        return [f"q and k {params['kind']}-normalised per "
                f"{'head' if params['scope'] == 'head' else 'projection'} (unit gains): "
                f"score std {min(std):.3g}" + (f" .. {max(std):.3g}" if max(std) > min(std)
                                               else "")]

    def restore(self, model, parts, params):
        _install(parts, params, self.name)
