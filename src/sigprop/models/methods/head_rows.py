"""One attention head's rows in its Q / K projection, for the code that rescales heads on
trained weights: the score-scale advice's measured effect
(:func:`sigprop.analysis.advice_effect.rescale_heads`) and QK-Clip (:mod:`.qk_clip`). Both
scale the rows through :func:`sigprop.nn.init.scale_linear_` (``out_slice`` / ``out_axis``),
weight and bias together, on the projections of a
:class:`~sigprop.measurement.probe_sites.AttentionSite`: split ``nn.Linear`` maps, fused
``[q | k | v]`` (GPT-2's ``Conv1D`` stores its output features as columns), per-head
interleaved ``(H, 3, d_H)`` (GPT-NeoX) and a query map with a per-head output gate
``(H, 2, d_H)`` (Qwen3-Next)."""

from __future__ import annotations

from torch import nn


def linear_of(m: nn.Module) -> tuple[nn.Module, int] | None:
    """``(module, out_axis)`` of a projection: ``nn.Linear`` (rows: axis 0), HF ``Conv1D``
    (columns: axis 1), or a module wrapping exactly one ``nn.Linear`` (the wrapped one); None
    for anything else."""
    if isinstance(m, nn.Linear):
        return m, 0
    if type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None:
        return m, 1
    lin = [c for c in m.children() if isinstance(c, nn.Linear)]
    return (lin[0], 0) if len(lin) == 1 else None


def head_rows(site, head: int, part: str) -> tuple[int, int]:
    """Output features ``(start, stop)`` of ``part`` (``q`` or ``k``) of ``head`` (a query
    head for ``q``, a K/V head for ``k``) in the site's projection."""
    d = site.head_dim
    if site.fused == "per_head":  # (H, 3, d_H): q, k, v of each head in turn
        lo = head * 3 * d + (0 if part == "q" else d)
    elif site.fused == "concat":  # [q heads | k heads | v heads]
        lo = head * d if part == "q" else site.n_heads * d + head * d
    elif part == "q" and site.q_gate == "per_head":  # (H, 2, d_H): query, then output gate
        lo = head * 2 * d
    else:
        lo = head * d
    return lo, lo + d
