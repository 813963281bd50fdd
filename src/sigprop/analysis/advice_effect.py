"""The measured effect of the advice on trained weights (:mod:`sigprop.analysis.trained`).

The score-scale advice names the content heads whose measured beta is above beta_c and a
factor per head, ``f = sqrt(beta_c / beta)``: scaling the head's W_Q and W_K rows by ``f``
each scales its scores by ``f^2``, so its ``sigma_s`` and beta by ``f^2`` and beta / beta_c to
1 (the prediction). Here the advice is applied to the model (:func:`rescale_heads`: a copy of
a user's module, or the diagnosis' own loaded model), one probe draw runs on the same inputs,
and :func:`effect` sets each head's measured beta / beta_c and entropy before and after beside
the predicted value.

The prediction is exact (to float rounding) for a head whose layer input did not change: the
first layer, or any layer with no rescaled head below it. Above a rescaled head the layer's
input moves, and with it the head's scores: there the measurement is the check.

Grouped K/V heads (GQA, multi-query): a K row block serves every query head of its group, so
rescaling it would move the group's other heads; the head's W_Q rows are scaled by ``f^2``
instead (the same scores: RoPE and the 1 / sqrt(d_head) scale are linear in q). Models with
QK-norm (q / k normalised per head after the projection) and shared layers (one block applied
several times) are not rescaled: :class:`Unmeasured` says why.
"""

from __future__ import annotations

import math

from ..trajectory import clean

#: the heads the console line lists before summarising the rest
SHOWN = 3


class Unmeasured(Exception):  # noqa: N818 - a reason, not an error of the user's
    """The advice cannot be applied to this model's weights (the message says why)."""


def _linear(m):
    """``(module, out_axis)`` of a projection (:func:`~sigprop.models.methods.head_rows.linear_of`)
    or :class:`Unmeasured`."""
    from ..models.methods.head_rows import linear_of

    got = linear_of(m)
    if got is None:
        raise Unmeasured(f"projection {type(m).__name__} is not a linear layer sigprop can "
                         "rescale")
    return got


def rescale_heads(model, stack_path: str, factors: dict[tuple[int, int], float],
                  repeats: int = 1) -> str:
    """Scale, in place, the scores of each ``(layer, head)`` of ``factors`` (layer 1 = the
    first block of ``stack_path``) by ``factor^2``: its W_Q and W_K rows (and biases) by the
    factor each, or with grouped K/V its W_Q rows by the factor squared. The sites are the
    probe's (:func:`~sigprop.measurement.probe_sites.find_attention` on each block). Returns
    how, in words; :class:`Unmeasured` where the model's layout does not allow it."""
    import torch

    from ..measurement.probe_sites import blocks_of, find_attention
    from ..models.methods.head_rows import head_rows
    from ..nn.init import scale_linear_

    if repeats > 1:
        raise Unmeasured("shared layers: one block's W_Q / W_K serve several layers")
    blocks = blocks_of(model, stack_path)
    grouped = False
    with torch.no_grad():
        for (layer, head), f in sorted(factors.items()):
            if not 1 <= layer <= len(blocks) or not math.isfinite(f) or f <= 0:
                raise Unmeasured(f"L{layer}.H{head}: no such head or no finite factor")
            name, block = blocks[layer - 1]
            site = find_attention(block, None, name)
            if site is None or not 0 <= head < site.n_heads:
                raise Unmeasured(f"L{layer}.H{head}: no attention site with that head")
            if site.q_post is not None or site.k_post is not None:
                raise Unmeasured("QK-norm: q and k are normalised per head after W_Q and W_K, "
                                 "so rescaling them leaves the scores as they are")
            q, q_ax = _linear(site.q)
            if site.n_kv_heads == site.n_heads:
                k, k_ax = _linear(site.k)
                scale_linear_(q, f, out_slice=head_rows(site, head, "q"), out_axis=q_ax)
                scale_linear_(k, f, out_slice=head_rows(site, head, "k"), out_axis=k_ax)
            else:  # the K rows are shared by the group: the query takes f^2
                grouped = True
                scale_linear_(q, f * f, out_slice=head_rows(site, head, "q"), out_axis=q_ax)
    return ("each head's W_Q and W_K rows (and biases) times its factor" if not grouped else
            "each head's W_Q rows (and bias) times its factor squared, W_K as it is (grouped "
            "K/V: a K row block serves its group's other heads; the scores scale the same)")


def _entropy(heads) -> dict[tuple[int, int], float]:
    e = heads[(heads.observable == "entropy") & (heads.source == "measured")]
    return {(int(a), int(b)): float(v) for a, b, v in
            zip(e["layer"], e["head"], e["value"], strict=True)}


def effect(risky, factors, before_scales, before_heads, after_scales, after_heads
           ) -> list[dict]:
    """Per rescaled head (``risky``: ``(layer, head, beta / beta_c)``), its factor, measured
    beta / beta_c before and after (after: over beta_c of the draw's own measured input
    cosine), the predicted after (before x factor^2) and the measured entropy before and
    after; JSON-safe (NaN -> None)."""
    def ratio(scales):
        return {(int(a), int(b)): float(r) for a, b, r in zip(
            scales["layer"], scales["head"], scales["beta_over_beta_c"], strict=True)}

    r0, r1 = ratio(before_scales), ratio(after_scales)
    e0, e1 = _entropy(before_heads), _entropy(after_heads)
    out = []
    for layer, head, _ in risky:
        key, f = (layer, head), factors[(layer, head)]
        b0 = r0.get(key, math.nan)
        out.append({"layer": layer, "head": head, "factor": clean(f),
                    "beta_over_beta_c_before": clean(b0),
                    "beta_over_beta_c_after": clean(r1.get(key, math.nan)),
                    "predicted_after": clean(b0 * f * f),
                    "entropy_before": clean(e0.get(key, math.nan)),
                    "entropy_after": clean(e1.get(key, math.nan))})
    return out


def line(heads: list[dict]) -> str:
    """One console line: the first :data:`SHOWN` heads before -> after (predicted), entropy
    before -> after, and the range of the rest."""
    def num(v):
        return "n/a" if v is None else f"{v:.2f}"

    parts = [f"L{h['layer']}.H{h['head']} beta/beta_c {num(h['beta_over_beta_c_before'])} -> "
             f"{num(h['beta_over_beta_c_after'])} (predicted {num(h['predicted_after'])}), "
             f"entropy {num(h['entropy_before'])} -> {num(h['entropy_after'])}"
             for h in heads[:SHOWN]]
    rest = [h["beta_over_beta_c_after"] for h in heads[SHOWN:]
            if h["beta_over_beta_c_after"] is not None]
    if len(heads) > SHOWN:
        parts.append(f"{len(heads) - SHOWN} more" + (
            f" (after {min(rest):.2f} to {max(rest):.2f})" if rest else ""))
    return "measured: " + "; ".join(parts)


def measure(rec, model, *, copy: bool, stack_path: str, repeats: int, scales, heads, roles,
            seq_len: int, redraw):
    """The score-scale advice ``rec`` with its measured effect: each head at risk rescaled by
    its factor (:func:`rescale_heads`; on a deep copy of the model when ``copy`` -- a user's
    module --, else in place on the model the run loaded), ``redraw(model)`` (one probe draw
    on the same inputs: ``(measured rows, per-head rows)``) and per head beta / beta_c and
    entropy before and after beside the prediction. ``rec`` as it is where no head is at risk
    or no model was kept; where the model's layout does not allow the rescale,
    ``measured.how`` says why (no heads)."""
    import copy as copying

    from . import trained as tr

    risky = tr.risky_heads(scales, roles)
    if not risky or model is None:
        return rec
    factors = tr.rescale_factors(risky)

    def unmeasured(why: str):
        return tr.with_measured(rec, {"heads": [], "how": f"not measured: {why}"},
                                f"measured: not measured ({why})")

    try:
        m = copying.deepcopy(model) if copy else model
    except Exception as err:  # noqa: BLE001 - a module deepcopy does not handle
        return unmeasured(f"the model could not be copied ({type(err).__name__}: {err})")
    was = m.training
    try:
        how = rescale_heads(m, stack_path, factors, repeats)
        m.eval()
        meas1, heads1 = redraw(m)
    except Unmeasured as err:
        return unmeasured(str(err))
    except Exception as err:  # noqa: BLE001 - the advice's check must not end the diagnosis
        return unmeasured(f"the rescaled model did not run ({type(err).__name__}: {err})")
    finally:
        m.train(was)
    rows = effect(risky, factors, scales, heads, tr.head_scales(heads1, meas1, seq_len), heads1)
    return tr.with_measured(rec, {"heads": rows, "how": (
        f"the advised factors applied to {'a copy of ' if copy else ''}the model ({how}), one "
        "probe draw on the same inputs; after: the draw's measured beta over beta_c of its own "
        "measured input cosine (exact up to float rounding where no head below was "
        "rescaled)")}, line(rows))
