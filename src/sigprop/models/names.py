"""Per block, the Q/K/V/O/MLP module names of an HF model, for ``sigprop fix`` (re-exported
by :mod:`sigprop.models.loading`); blocks and attention sites as :mod:`sigprop.measurement.probe`
finds them."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..measurement.probe import find_attention, find_blocks

__all__ = ["qkv_names"]

_O = ("o_proj", "out_proj", "attention.output.dense", "attn.c_proj", "attention.dense")
_MLP_IN = ("gate_proj", "up_proj", "intermediate.dense", "c_fc", "fc1", "dense_h_to_4h")
_MLP_OUT = ("down_proj", "output.dense", "mlp.c_proj", "fc2", "dense_4h_to_h")


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"


def _ends(rel: str, pats) -> bool:
    return any(rel == p or rel.endswith("." + p) for p in pats)


def qkv_names(model: nn.Module) -> list[dict[str, Any]]:
    """Per block, the qualified names (as in ``model.named_modules()``) of its linear layers by
    role: ``q, k, v, o, mlp_out`` (str or None), ``mlp_in`` (list: ``[gate, up]`` for SwiGLU),
    ``other`` (unclassified linear layers), ``block``.

    Fused QKV (GPT-2's ``c_attn``, a ``Conv1D`` with weight ``(d, 3d)``, output ``[q | k | v]``):
    ``q = k = v = None``, ``qkv`` = its name, ``fused = "concat"``, ``qkv_slices`` = ``{"q":
    (start, stop), "k": ..., "v": ...}`` along the output features and ``out_axis`` = the weight
    axis holding them (1 for Conv1D, 0 for nn.Linear). Pass the slices to a fix; never give the
    fused module as ``q`` and ``k`` to ``init_foreign`` (the last law would win). BERT's output
    projection (``attention.output.dense``) lives outside its self-attention module."""
    out = []
    for bname, block in find_blocks(model):
        site = find_attention(block)
        e: dict[str, Any] = {"block": bname, "q": None, "k": None, "v": None, "qkv": None,
                             "fused": None, "o": None, "mlp_in": [], "mlp_out": None,
                             "other": []}
        ids = {}
        if site is not None and site.fused:
            ids, e["fused"] = {id(site.q): "qkv"}, site.fused
            if site.fused == "concat":
                n_q, n_kv = site.n_heads * site.head_dim, site.n_kv_heads * site.head_dim
                e["qkv_slices"] = {"q": (0, n_q), "k": (n_q, n_q + n_kv),
                                   "v": (n_q + n_kv, n_q + 2 * n_kv)}
                e["out_axis"] = 1 if type(site.q).__name__ == "Conv1D" else 0
        elif site is not None:
            pairs = ((site.q, "q"), (site.k, "k"), (site.v, "v"))
            ids = {id(m): r for m, r in pairs if m is not None}
        for rel, m in block.named_modules():
            if not _is_linear(m):
                continue
            full = f"{bname}.{rel}"
            role = ids.get(id(m))
            if role is None:
                role = "o" if _ends(rel, _O) else "mlp_in" if _ends(rel, _MLP_IN) else \
                    "mlp_out" if _ends(rel, _MLP_OUT) else "other"
            if role in ("mlp_in", "other"):
                e[role].append(full)
            else:
                e[role] = full
        out.append(e)
    return out
