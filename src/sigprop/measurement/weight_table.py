"""What the weight reader returns (:class:`WeightTable`): per-layer theory parameters, per-head
score stds, logit scales, notes and the block layout, and their mean over several draws."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..spec import LayerSpec


@dataclass
class WeightTable:
    """What :meth:`.weights.WeightReader.read` returns: ``layers`` (one :class:`LayerSpec` per block
    application), ``heads`` (dicts ``layer, head, sigma_s``: the canonical-scale score std of
    each query head), ``scale`` (each layer's logit scale times sqrt(d_head): the model's
    multiplier on top of the canonical ``1/sqrt(d_head)``), ``notes``."""

    layers: tuple[LayerSpec, ...]
    heads: list[dict]
    scale: list[float]
    notes: list[str] = field(default_factory=list)
    #: per block: ``norm`` (``pre``: the norm feeding attention runs inside the block on its
    #: input; ``post``: it is the previous block's / the embeddings' output norm; ``none``),
    #: ``parallel`` (the MLP's norm reads the block input too, or is the attention's),
    #: ``gated``, ``activation`` (name or None), ``activation_error``, ``causal``, ``mlp``
    #: (``ok``, ``missing`` or ``unrecognised``: e.g. a mixture of experts), ``sandwich``
    #: (pre-LN whose branch outputs are normalised too)
    structure: list[dict] = field(default_factory=list)

    @staticmethod
    def average(tables: list[WeightTable]) -> WeightTable:
        """Mean over several draws of the same architecture (seeds): variances and squared
        score stds averaged."""
        if len(tables) == 1:
            return tables[0]
        lay = []
        for per in zip(*(t.layers for t in tables), strict=True):
            if per[0].measured:  # a measured mixer: nothing read from the weights
                lay.append(per[0])
                continue
            sig = np.sqrt(np.mean([np.square(x.sigma_s) for x in per], axis=0))
            hw = None if per[0].head_weights is None else tuple(
                np.mean([x.head_weights for x in per], axis=0).tolist())
            vo = None if per[0].var_o is None else float(np.mean([x.var_o for x in per]))
            cross = {}
            if per[0].cross_sigma_s is not None:
                cs = np.sqrt(np.mean([np.square(x.cross_sigma_s) for x in per], axis=0))
                cross = {"cross_sigma_s": tuple(cs.tolist()),
                         "cross_var_v": float(np.mean([x.cross_var_v for x in per])),
                         "cross_var_o": float(np.mean([x.cross_var_o for x in per]))}
            if per[0].branch_gain2 is not None:
                cross["branch_gain2"] = tuple(np.mean([x.branch_gain2 for x in per],
                                                      axis=0).tolist())
            if per[0].sink_logit is not None:
                cross["sink_logit"] = tuple(np.mean([x.sink_logit for x in per],
                                                    axis=0).tolist())
            if per[0].gate_var is not None:
                cross["gate_var"] = float(np.mean([x.gate_var for x in per]))
                cross["gate_bias2"] = float(np.mean([x.gate_bias2 for x in per]))
            if per[0].glu_shift:
                cross["glu_shift"] = float(np.mean([x.glu_shift for x in per]))
            if per[0].moe_experts is not None:
                cross.update(moe_experts=per[0].moe_experts, moe_top_k=per[0].moe_top_k,
                             moe_weighting=per[0].moe_weighting, moe_scale=per[0].moe_scale)
                for name in ("moe_router_var", "moe_shared_var_in", "moe_shared_var_out",
                             "moe_shared_gate_var"):
                    if getattr(per[0], name) is not None:
                        cross[name] = float(np.mean([getattr(x, name) for x in per]))
            lay.append(LayerSpec(sigma_s=tuple(sig.tolist()),
                                 var_v=float(np.mean([x.var_v for x in per])), var_o=vo,
                                 var_w_in=float(np.mean([x.var_w_in for x in per])),
                                 var_w_out=float(np.mean([x.var_w_out for x in per])),
                                 var_b=float(np.mean([x.var_b for x in per])), head_weights=hw,
                                 **cross))
        heads = [dict(h, sigma_s=float(lay[h["layer"] - 1].sigma_s[h["head"]]))
                 for lay_heads in _by_layer(tables[0].heads) for h in lay_heads]
        return WeightTable(tuple(lay), heads, tables[0].scale, tables[0].notes,
                           tables[0].structure)


def _by_layer(heads: list[dict]) -> list[list[dict]]:
    out: dict[int, list[dict]] = {}
    for h in heads:
        out.setdefault(h["layer"], []).append(h)
    return [out[k] for k in sorted(out)]
