"""The theory beside a measured model (:func:`~sigprop.analysis.diagnose.diagnose`): the
:class:`~sigprop.spec.ArchSpec` with per-layer parameters read from its weights
(:func:`theory_spec`, docs/theory.md §2.8), the measured maps of its non-attention mixers
(§2.8.1), the runtime parts of recorded ``sigprop fix`` methods, an encoder-decoder model's
decoder stack (:func:`decoder_spec`), and the position-resolved theory of causal stacks on the
measured input geometry (:func:`position_resolved`, §2.9). The measured numbers these read
(embedding norm, per-head score stds) come from the diagnosis's trajectory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..spec import ArchSpec, SpecError

#: longest sequence the position-resolved (Gram-matrix) theory of causal stacks runs at: its
#: sampled attention costs O(T^3) per layer and sequence (~0.3 s at T = 256, ~2.5 s at 512)
GRAM_MAX_LEN = 512


def theory_spec(spec: ArchSpec, config, tables: list, meas, notes: list[str], *, mapped: bool,
                causal_seen: bool, position_bias: bool, rope: bool, memory: dict | None,
                runtime) -> tuple[ArchSpec, bool, Any]:
    """``(spec, mapped, weight table)`` of a measured model: ``spec`` with per-layer
    parameters from the weight ``tables`` of the draws, averaged (docs/theory.md §2.8); where
    the family has no config mapping (``mapped`` False), the block layout read from the model
    (:func:`sigprop.models.arch.structure_spec` on the measured ``causal_seen``,
    ``position_bias`` and ``rope``; ``mapped`` then becomes True); cross-attention over the
    encoder output as measured (``memory``, :func:`sigprop.measurement.hooks.merge_memory`);
    the ``runtime`` parts of recorded ``sigprop fix`` methods. The config's spec where the
    weights could not be read (table None). Each departure is a note."""
    from ..measurement.weight_table import WeightTable
    from ..models.arch import structure_spec

    table = WeightTable.average(tables) if tables and all(tables) else None
    if table is not None and len(table.layers) != spec.depth:
        notes.append(f"weights: {len(table.layers)} attention layers read, the config has "
                     f"{spec.depth}; theory from the config")
        table = None
    if not mapped and table is not None:  # the block layout read from the model itself
        laid, why = structure_spec(spec, config, table, causal_seen, rope=rope,
                                   position_bias=position_bias)
        if laid is not None:
            table = per_layer_scales(table, laid.multiplier if laid.scaling == "tau" else 1.0,
                                     notes)
            notes[:] = [n for n in notes if not n.startswith("theory: model type")]
            notes.append(f"model type {config.model_type!r}: no config mapping; the block "
                         "layout and every parameter are read from the model")
            spec, mapped = laid, True
        notes += why
    if mapped and table is not None:
        if any(x.cross_sigma_s is not None for x in table.layers):
            if memory is None:
                table.layers = tuple(without_cross(x) for x in table.layers)
            else:
                notes.append(f"cross-attention in the theory: over the encoder output as "
                             f"measured (T={memory['memory_len']}, q={memory['memory_q']:.3g}, "
                             f"cos={memory['memory_rho']:.3g})")
        spec = weights_spec(spec, table, meas, notes, memory)
        if runtime is not None:  # recorded `sigprop fix` methods beyond the weights
            spec = with_runtime(spec, runtime, notes, measured_q0(meas))
    elif mapped:
        notes.append("theory parameters from the config (initializer_range), not the weights")
    return spec, mapped, table


def decoder_spec(config, spec: ArchSpec, seq_len: int | None) -> tuple[ArchSpec, str]:
    """The placeholder spec of an encoder-decoder model's decoder stack (its depth, heads and
    MLP width from the config's decoder fields; every theory parameter is then read from the
    weights) and the note saying what is measured."""
    from ..models.arch import first_attr

    L = int(first_attr(config, ("decoder_layers", "num_decoder_layers"), spec.depth))
    H = int(first_attr(config, ("decoder_attention_heads", "num_heads"), spec.heads))
    ff = int(first_attr(config, ("decoder_ffn_dim", "d_ff"), spec.ff))
    top = first_attr(config, ("max_target_positions", "max_position_embeddings"))
    T = int(seq_len) if seq_len is not None else int(min(top or 512, 512))
    if top is not None and T > top:
        raise SpecError("seq_len", f"must be <= {int(top)} for the {config.model_type} "
                                   f"decoder (got {T})")
    heads = H if spec.d_model % H == 0 else math.gcd(spec.d_model, H)
    try:
        new = spec.replace(depth=L, heads=heads, d_ff=ff, seq_len=max(T, 2))
    except SpecError as err:
        raise SpecError("model", f"decoder of {config.model_type}: {err}") from None
    return new, (f"encoder-decoder: the decoder's self-attention stack is measured "
                 f"(decoder_input_ids: built-in text, T={new.seq_len}); cross-attention reads "
                 "the encoder output of the same inputs (its statistics: the cross_attention "
                 "rows)")


def measured_q0(traj) -> float | None:
    """Mean measured ``q`` at layer 0 of a trajectory table; None when absent or not > 0."""
    q = traj[(traj.source == "measured") & (traj.observable == "q") & (traj.layer == 0)]
    if not len(q):
        return None
    v = float(q["value"].mean())
    return v if math.isfinite(v) and v > 0 else None


def per_layer_scales(table, m: float, notes: list[str]):
    """Layers whose logit scale times sqrt(d_head) differs from the spec's multiplier ``m``
    (per-layer head dims, Gemma 4's full-attention layers): the ratio goes into that layer's
    score stds, so each layer's beta is its own."""
    import dataclasses

    sc = [float(x) for x in table.scale]
    if not sc or m <= 0 or max(abs(x / m - 1) for x in sc) < 1e-9:
        return table
    table.layers = tuple(dataclasses.replace(lay, sigma_s=tuple(v * x / m for v in lay.sigma_s))
                         for lay, x in zip(table.layers, sc, strict=False))
    notes.append("per-layer logit scales (" + ", ".join(f"{x:.3g}" for x in sc) + " x "
                 "1/sqrt(d_head)): each layer's score std carries its own")
    return table


def with_runtime(spec: ArchSpec, effect, notes: list[str], embed_q: float | None = None
                  ) -> ArchSpec:
    """The weights' spec with the recorded methods' runtime parts (gates, q/k norms, removed
    norms); a note for each part the theory does not reach (its theory rows then ignore
    that part)."""
    from ..models.methods import theory_spec

    notes.extend(f"theory without {line}" for line in effect.measured_only)
    return theory_spec(spec, effect, embed_q)


def gram_applies(spec: ArchSpec, kind: str) -> str | None:
    """Why the position-resolved theory does not apply to this spec (None: it does)."""
    if not spec.causal:
        return "bidirectional"
    if kind != "text":
        return "not token input"
    if spec.norm not in ("pre", "post") or spec.attention != "softmax":
        return "layout"
    if spec.layers is None or spec.memory_len is not None:
        return "layout"
    if spec.q0 is not None and not any(x.norm == "post" for x in spec.layers):
        return "layout"  # a raw first-block input: only Mix-LN's post-LN blocks read one here
    if any(x.measured for x in spec.layers):  # measured mixers: no Gram map (§2.8.1)
        return "layout"
    if any(x.dyt is not None or x.norm not in (None, "pre", "post") or x.diff_lambda is not None
           for x in spec.layers):  # DyT, differential attention: homogeneous theory only
        return "layout"
    if any(x.value_mix is not None for x in spec.layers) and any(
            x.var_o is None for x in spec.layers):  # value residuals without an output
        return "layout"  # projection: the stream carries V_1 itself (docs/theory.md §2.4.6)
    if spec.seq_len > GRAM_MAX_LEN:
        return "length"
    return None


@dataclass(frozen=True, kw_only=True)
class GramInput:
    """The measured input geometry the position-resolved theory of a causal text stack starts
    from: ``cos``, the first block's token cosine matrix per sequence ``(B, T, T)`` (float64,
    averaged over the draws, which read the same sequences), and ``rope``, the model's RoPE
    frequencies (None without RoPE). Only token (text) input has one (:func:`gram_applies`)."""

    cos: np.ndarray
    rope: np.ndarray | None = None


def gram_input(spec: ArchSpec, kind: str, grams, rope) -> GramInput | None:
    """The :class:`GramInput` of a diagnosis's draws (their :class:`~sigprop.measurement.
    hooks.InputGram` records), or None where the position-resolved theory does not run on
    this model (:func:`gram_applies`) or nothing was recorded."""
    if gram_applies(spec, kind) is not None:
        return None
    c0 = [c for c in (g.mean() for g in grams) if c is not None]
    if not c0:
        return None
    return GramInput(cos=np.mean(c0, axis=0),
                     rope=None if rope is None else np.asarray(rope, dtype=np.float64))


def gram_cos(spec: ArchSpec, gi: GramInput | None) -> np.ndarray | None:
    """Mean pairwise cosine at layers 0..L of ``spec`` from the measured input ``gi`` by the
    position- and token-resolved theory (docs/theory.md §2.9), averaged over the sequences;
    None where that theory does not cover ``spec`` (:func:`gram_applies`) or ``gi`` is None.
    A fix's spec (:func:`sigprop.models.methods.theory_spec`) is predicted from the unfixed
    model's measured input the same way."""
    from ..theory import gram

    if gi is None or gram_applies(spec, "text") is not None:
        return None
    return np.clip(gram.propagate_gram(spec, gi.cos, rope=gi.rope).mean(axis=-1), -1.0, 1.0)


def without_cross(lay):
    """Layer spec ``lay`` without its cross-attention (no encoder output was measured)."""
    from dataclasses import replace

    return replace(lay, cross_sigma_s=None, cross_var_v=None, cross_var_o=None)


def position_resolved(theory, spec: ArchSpec, gi: GramInput | None, why: str | None, notes):
    """Causal stacks on token input: the theory's cosine from the position- and token-resolved
    Gram-matrix theory (:func:`gram_cos`) on the measured input ``gi``; the other rows stay
    the homogeneous theory's. Elsewhere ``theory`` unchanged, with a note where it matters
    (``why``: :func:`gram_applies`'s reason)."""
    cos = gram_cos(spec, gi)
    if cos is None:
        if why in ("length", "layout") and spec.causal:
            notes.append("theory cos: homogeneous (every pair at one overlap); the position-"
                         "resolved theory of causal stacks is not run here ("
                         + (f"T above {GRAM_MAX_LEN}" if why == "length" else
                            "a block layout it does not cover") + ")")
        return theory
    rows = theory["observable"] == "cos"
    layers = theory.loc[rows, "layer"].to_numpy()
    theory = theory.copy()
    theory.loc[rows, "value"] = cos[layers]
    notes[:] = [n for n in notes if not n.startswith("RoPE: the theory ignores")]
    notes.append("theory cos: position- and token-resolved (the expected Gram matrix of each "
                 "measured input sequence, causal rows, repeated tokens"
                 + (", RoPE" if gi.rope is not None else "") + "; docs/theory.md §2.9); "
                 "ipr / entropy / q rows: the homogeneous theory")
    return theory


def weights_spec(spec: ArchSpec, table, meas, notes: list[str], memory: dict | None = None
                  ) -> ArchSpec:
    """``spec`` with per-layer parameters from the weights (docs/theory.md §2.8). Pre-LN: the
    stream starts at the measured embedding norm q0, absorbed into the branch output
    variances as the config mapping does; post-LN / no norm: the first block reads the
    embeddings at their measured q0 (``spec.q0``). Residual strengths are 1: a sigprop alpha fix
    lives in the output projections, which the weights carry."""
    from dataclasses import replace

    layers = table.layers
    extra = dict(memory) if memory and any(x.cross_sigma_s is not None for x in layers) else {}
    q0 = measured_q0(meas) or 1.0
    if spec.norm == "pre":
        layers = tuple(replace(x, var_o=None if x.var_o is None else x.var_o / q0,
                               var_w_out=x.var_w_out / q0,
                               cross_var_o=None if x.cross_var_o is None
                               else x.cross_var_o / q0,
                               branch_gain2=None if x.branch_gain2 is None
                               else tuple(g / q0 for g in x.branch_gain2)) for x in layers)
    else:  # the first block reads the embeddings as they are (ALBERT's are projected)
        extra["q0"] = q0
    if any(x.measured for x in layers):  # hybrid stacks: the other mixers' measured maps
        layers = _fill_mixers(layers, meas, q0 if spec.norm == "pre" else 1.0)
    if spec.alpha_attn != 1.0:
        notes.append(f"alpha_attn={spec.alpha_attn:g} of the sigprop fix is in the output "
                     "projections: read from the weights")
    notes.append("theory parameters read from the weights, per layer and head "
                 "(docs/theory.md §2.8)")
    return spec.replace(layers=layers, qk_std=None, beta=None, alpha_attn=1.0, alpha_mlp=1.0,
                        **extra)


def _fill_mixers(layers, meas, unit: float):
    """``layers`` with each measured mixer's ``mixer_map`` (docs/theory.md §2.8.1) from the
    measured trajectory: ``(q_in, cos_in, q_out, cos_out)`` of its block (its input: layer
    l - 1, its output: layer l), q in units of ``unit`` (pre-LN: the embedding norm q0, the
    theory's unit)."""
    from dataclasses import replace

    m = meas[meas.source == "measured"] if "source" in meas.columns else meas
    val = m.groupby(["observable", "layer"])["value"].mean()

    def get(name, layer):
        try:
            return float(val.loc[(name, layer)])
        except KeyError:
            return math.nan

    out = []
    for i, x in enumerate(layers):
        if x.measured:
            mp = (get("q", i) / unit, get("cos", i), get("q", i + 1) / unit, get("cos", i + 1))
            x = replace(x, mixer_map=mp)
        out.append(x)
    return tuple(out)


def with_weight_heads(heads, table, spec: ArchSpec):
    """Per-head rows of the weights' score std (source ``weights``, observable
    ``sigma_s``: the effective one, model scale and length scaling included)."""
    import pandas as pd

    if table is None:
        return heads
    rows = [{"layer": h["layer"], "observable": "sigma_s", "source": "weights",
             "value": h["sigma_s"] * (spec.multiplier if spec.layers is not None
                                      else table.scale[h["layer"] - 1]),
             "stderr": float("nan"), "head": h["head"]}
            for h in table.heads]
    return pd.concat([heads, pd.DataFrame(rows)], ignore_index=True) if rows else heads


def measured_beta(heads, seq_len: int) -> float:
    """beta from the measured score std: RMS over layers and heads of each head's measured
    sigma_s, over sqrt(log T) (the same aggregate as the spec's beta from the weights);
    NaN where no scores were recomputed."""
    m = heads[(heads.observable == "sigma_s") & (heads.source == "measured")]["value"]
    if not len(m):
        return float("nan")
    return float(np.sqrt(np.mean(np.square(m.to_numpy())))) / math.sqrt(math.log(seq_len))
