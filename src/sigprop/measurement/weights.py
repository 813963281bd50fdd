"""Theory parameters read from a model's weights, per layer and per head (docs/theory.md §2.8).

    with WeightReader(model) as w:     # hooks record which modules run, in what order
        model(**inputs)                # any forward pass (one is enough)
    table = w.read()                   # WeightTable: per-layer LayerSpec + per-head rows

Works on any ``nn.Module`` whose blocks and attention :mod:`.probe_sites` finds. The forward
pass only fixes the *call order* -- which normalisation runs last before a block's attention
and before its MLP, which linear map is the attention output projection (the first one called
after the value projection) and which are the MLP's (the block's other linear maps; the last
one called is the output, the earlier ones the inputs: one plain, two gated, or one fused
``[gate | up]`` of twice the output's fan-in). Every number comes from the weights:

* norm gains: each normalisation module is evaluated on a fixed unit-RMS Gaussian input and
  its per-feature gain is the regression slope of output on normalised input (either RMS or
  mean-subtracted normalisation, whichever fits), so any norm class is read the same way
  (LayerNorm, RMSNorm, Gemma's ``1 + w``, a norm without gain);
* score std of query head h: ``sigma_s^2 = c^2 (|G W_Q^h^T W_K^g G|_F^2 + |G W_K^g^T b_Q^h|^2)``
  with ``c = 1/sqrt(d_head)`` (the canonical logit scale; any other is the spec's multiplier),
  ``g`` the K/V head of h's group and ``G`` the input norm's gains: the variance of
  ``x_a W_Q W_K^T x_b`` over isotropic inputs with q = 1 (the key bias cancels in the
  softmax). With QK-norm (q and k RMS-normalised per head with gains ``g_q``, ``g_k``):
  ``sigma_s^2 = sum_i g_q,i^2 g_k,i^2 / d_head``. RoPE is not in the formula: a rotation leaves
  the score variance of i.i.d. weights unchanged;
* ``var_v = |W_V G|_F^2 / rows``, ``var_o = |W_O|_F^2 / rows`` (weight variance times fan-in),
  MLP ``var_w_in`` (the gate's, for a gated MLP; the up branch's variance multiplies the
  output, folded into ``var_w_out``), ``var_w_out``; ``var_b``: the mean squared bias of the
  value, output and MLP maps; ``head_weights``: ``|W_O^h|^2 |W_V^g G|^2`` per head;
* attention sinks (gpt-oss): a 1-D parameter of the attention module itself (not of a
  submodule), one entry per query head, whose name says sink -- ``sink_logit``, in the
  model's final logit units (docs/theory.md §2.4.3);
* output gate (Qwen3-Next): the query projection's rows are ``(H, 2, d_H)`` [query | gate]
  per head (:class:`~.probe_sites.AttentionSite` ``q_gate``), or the attention module holds
  its own gate projection (a child named ``*gate*`` mapping the model width to ``H d_H``):
  ``gate_var = |W_g G|_F^2 / rows``, ``gate_bias2`` the mean square of its bias
  (docs/theory.md §2.4.4);
* mixture-of-experts MLP (docs/theory.md §2.5.2): a module of the block holding a router (a
  child whose 2-D ``weight`` is ``(E, d)``) beside E experts, either a ModuleList of E MLPs
  or 3-D stacked parameters ``(E, ., .)`` (HF's fused ``gate_up_proj`` / ``down_proj``, in
  either orientation): the experts' variances averaged over experts, ``moe_router_var =
  |W_r G|_F^2 / E``; ``moe_top_k``, the weighting rule and ``moe_scale`` measured from the
  router's output in the forward pass (the routing weights' row sums: constant c means
  renormalised, times c; softmax or sigmoid from which reproduces them), else from the
  config attributes the model carries (:meth:`WeightReader.read` ``config``); a shared expert
  (the block's remaining linear maps) and its 1-output sigmoid gate; gpt-oss's clamped
  SwiGLU experts (:func:`.weights_moe.clamped_glu`: interleaved gate / up columns, gate ``g
  sigmoid(1.702 g)`` read as GELU within 0.02, ``u + 1`` as ``glu_shift``, docs/theory.md
  §2.5.3) (the MoE readers: :mod:`.weights_moe`; MLA's: :mod:`.weights_mla`);
* hybrid stacks (Jamba, Qwen3-Next, Zamba, ...): a block without an attention site (its token
  mixer is Mamba, linear attention, ...) gets :data:`MEASURED_MIXER` -- the whole block, MLP
  included, is a measured residual map (docs/theory.md §2.8.1) -- and the layout entry
  ``{"mixer": "measured"}``; the attention blocks are read as above, those without an MLP
  (Nemotron-H: the MLP is a block of its own) with ``var_w_in = var_w_out = 0``. A stack
  without any attention site is not readable.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from ..spec import LayerSpec
from .handles import HookHandles
from .probe_sites import AttentionSite, describe_attention, find_attention, find_blocks
from .weight_maps import (
    ACT_APPROX,
    ACT_REFERENCE,
    classify_activation,
    col_sq,
    fingerprint,
    is_norm,
    matrix,
    norm_gains,
    norm_width,
)
from .weight_table import WeightTable
from .weights_mla import MLASite, find_mla, mla_scores
from .weights_moe import detach_output, find_moe, moe_variances, router_weight

__all__ = ["MEASURED_MIXER", "WeightReader"]

#: the LayerSpec of a block without attention (a hybrid stack's other mixer): the whole block
#: is a measured residual map (docs/theory.md §2.8.1), filled in by ``sigprop diagnose``
MEASURED_MIXER = LayerSpec(sigma_s=(0.0,), var_v=0.0, var_o=None, var_w_in=0.0, var_w_out=0.0,
                           mixer="measured")






def _mlp_group(block: nn.Module, rest: list[nn.Module]) -> list[nn.Module]:
    """The linear maps of the block's MLP among ``rest`` (its linear maps outside attention,
    in call order): where a child module of the block holds two or more of them and the
    others lie outside it (Gemma 3n / 4's per-layer input gate and projection beside the
    MLP), that child's maps; else ``rest``."""
    groups: dict[int, list[nn.Module]] = {}
    for _, child in block.named_children():
        ids = {id(x) for x in child.modules()}
        got = [m for m in rest if id(m) in ids]
        if len(got) >= 2:
            groups[id(child)] = got
    if len(groups) == 1:
        (got,) = groups.values()
        return got
    return rest


class _Parts(NamedTuple):
    """One block as the call order shows it (:meth:`WeightReader._parts`)."""

    block: nn.Module
    own: set  # ids of the block's modules
    in_block: list  # the block's recorded modules, in call order
    last_is_norm: bool  # the block's last operation is a norm of the model's width
    n_attn: nn.Module | None  # the norm that runs last before the attention
    o: nn.Module | None  # the attention output projection
    rest: list  # the MLP's linear maps, in call order
    mlp: tuple | None  # (ins, out, gains in front) of those maps




class WeightReader(HookHandles):
    """Context manager: record the call order of a model's norms and linear maps during one
    forward pass, then :meth:`read` the per-layer theory parameters (module docstring).

    ``blocks`` and ``sites``: as :class:`~sigprop.measurement.probe.Probe` finds them (pass a
    probe's ``blocks`` / ``sites`` to share them); ``repeats``: applications of each block
    (ALBERT); every application is one layer with the same weights."""

    def __init__(self, model: nn.Module, blocks=None, sites=None, repeats: int = 1):
        self.model = model
        self.blocks = blocks if blocks is not None else find_blocks(model)
        sites = sites if sites is not None else [find_attention(b, None, n)
                                                 for n, b in self.blocks]
        # multi-head latent attention (docs/theory.md §2.4.5): no split or fused Q/K/V maps
        # for the probe's discovery, read here (a copy: the probe's own list is left as it is)
        self.sites = [find_mla(b, n) if st is None else st
                      for (n, b), st in zip(self.blocks, sites, strict=True)]
        self.repeats = repeats
        self.order: list[nn.Module] = []
        self.inputs: dict[int, Any] = {}  # id(module) -> fingerprint of its first input
        self._index: dict[int, int] = {}  # id(module) -> its place in ``order``
        self._handles: list = []
        #: id(router candidate) -> its first output (mixture of experts, :meth:`_moe`)
        self.router_out: dict[int, Any] = {}

    def __enter__(self):
        def hook(m, args, kwargs):
            if id(m) not in self._index:  # first call only: one forward fixes the order
                self._index[id(m)] = len(self.order)
                self.order.append(m)
                if is_norm(m):  # the norms' inputs tell parallel blocks (_structure)
                    self.inputs[id(m)] = fingerprint(args, kwargs)

        def out_hook(m, args, out):
            if id(m) not in self.router_out:
                self.router_out[id(m)] = detach_output(out)

        blocks = {id(b) for _, b in self.blocks}
        inside = {id(x) for _, b in self.blocks for x in b.modules()}
        for m in self.model.modules():
            if id(m) in inside and router_weight(m) is not None:  # a router candidate
                self._handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
                self._handles.append(m.register_forward_hook(out_hook))
                continue
            leaf_fn = (id(m) in inside and not list(m.children()) and not list(m.parameters())
                       and not isinstance(m, nn.Dropout | nn.Identity))
            if is_norm(m) or matrix(m) is not None or id(m) in blocks or leaf_fn or any(
                    s is not None and m is s.module for s in self.sites):
                self._handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    # ---------------------------------------------------------------- reading
    def _pos(self, m) -> int:
        """``m``'s place in the call order (-1: not called)."""
        return self._index.get(id(m), -1)

    def _norm_module_before(self, pos: int, width: int) -> nn.Module | None:
        """The last norm of this width called before position ``pos`` (None: none)."""
        for m in reversed(self.order[:max(pos, 0)]):
            if is_norm(m) and norm_width(m) == width:
                return m
        return None

    def _norm_before(self, pos: int, width: int) -> np.ndarray | None:
        """Gains of the last norm of this width called before position ``pos``."""
        m = self._norm_module_before(pos, width)
        return None if m is None else norm_gains(m, width)

    def read(self) -> WeightTable:
        """Per-layer :class:`LayerSpec` and per-head score stds (module docstring)."""
        layers, heads, scales, notes = [], [], [], []
        self.structure: list[dict] = []
        if all(site is None for site in self.sites):
            raise ValueError("no block has an attention with recognised Q/K projections")
        for i, ((_, block), site) in enumerate(zip(self.blocks, self.sites, strict=True)):
            if site is None:  # a hybrid stack's other mixer: a measured residual map
                lay, sig, sc = MEASURED_MIXER, np.zeros(0), math.nan
                self.structure.append(self._mixer_structure(block))
                notes.append(f"layer {i + 1}: no attention with recognised Q/K projections "
                             f"({self.structure[-1]['mixer_modules']}): a measured residual "
                             "map (docs/theory.md §2.8.1)")
            else:
                parts = self._parts(block, site)
                lay, sig, sc, note = self._read_block(site, parts)
                notes += [f"layer {i + 1}: {n}" for n in note]
                self.structure.append(self._structure(site, parts))
            for r in range(self.repeats):
                layer = i * self.repeats + r + 1
                layers.append(lay)
                scales.append(sc)
                heads += [{"layer": layer, "head": h, "sigma_s": float(s)}
                          for h, s in enumerate(sig)]
        structure = [st for st in self.structure for _ in range(self.repeats)]
        if any(x.measured for x in layers):  # hybrid: an attention block without an MLP
            layers = [replace(x, var_w_in=0.0, var_w_out=0.0)  # (its MLP is another block)
                      if not x.measured and st.get("mlp") == "missing" else x
                      for x, st in zip(layers, structure, strict=True)]
            notes = [n.replace("no MLP found; var_w_in = var_w_out = 1", "no MLP (attention "
                               "only, a hybrid stack's MLP is a block of its own); var_w_in "
                               "= var_w_out = 0") for n in notes]
        known = [x for x in scales if math.isfinite(x)]
        fill = float(np.median(known))  # a measured mixer has no logit scale: the median
        scales = [x if math.isfinite(x) else fill for x in scales]
        return WeightTable(tuple(layers), heads, scales, notes, structure)

    @staticmethod
    def _mixer_structure(block: nn.Module) -> dict:
        """The layout entry of a block without attention (a hybrid stack's Mamba, linear
        attention, xLSTM ... mixer): ``mixer`` ``"measured"`` and the names of its children
        that are not norms (``mixer_modules``), for the note."""
        kids = [n for n, c in block.named_children() if not is_norm(c)]
        return {"mixer": "measured", "mixer_modules": ", ".join(kids) or type(block).__name__}

    def _structure(self, s: AttentionSite, parts: _Parts) -> dict:
        """The block's layout read from the call order and the inputs' fingerprints (see
        :class:`WeightTable`)."""
        d = matrix(s.q)[0].shape[1]
        n_attn = parts.n_attn
        if n_attn is not None and id(n_attn) in parts.own:
            norm = "pre"  # the block normalises its own input before attention
        elif parts.last_is_norm:
            norm = "post"  # the block's last operation normalises the residual sum
        else:
            norm = "none"
        out = {"norm": norm, "parallel": False, "gated": False, "activation": None,
               "activation_error": math.inf, "causal": bool(s.causal), "mlp": "missing",
               "sandwich": False}
        if isinstance(s, MLASite):  # docs/theory.md §2.4.5
            out["mla"] = {"q_lora_rank": s.q_rank, "kv_lora_rank": s.kv_rank,
                          "qk_nope_head_dim": s.nope, "qk_rope_head_dim": s.rope,
                          "v_head_dim": s.v_head_dim}
        moe = self._moe(parts.block, d)
        if moe is not None:  # a mixture of experts (docs/theory.md §2.5.2)
            out.update(mlp="ok", moe=True, gated=len(moe["ins"]) == 2, extra_maps=0,
                       sandwich=norm == "pre" and parts.last_is_norm)
            n_mlp = self._norm_module_before(self._pos(moe["router"]), d)
            fp = self.inputs.get(id(n_mlp)) if n_mlp is not None else None
            out["parallel"] = n_attn is not None and n_mlp is not None and norm == "pre" and (
                n_mlp is n_attn or (fp is not None and fp == self.inputs.get(id(n_attn))))
            own = {id(x) for x in moe["module"].modules()}
            for m in self.order:  # the experts' activation: a parameter-free leaf inside
                if id(m) in own and not list(m.parameters()) and not list(m.children()):
                    name, err = classify_activation(m)
                    if name is not None:
                        out.update(activation=name, activation_error=err)
                        break
            if out["activation"] is None and moe.get("glu") is not None:  # gpt-oss, inline:
                x = np.linspace(-5.0, 5.0, 201)  # its gate g sigmoid(alpha g) against GELU
                a = moe["glu"][0]
                err = float(np.max(np.abs(x / (1.0 + np.exp(-a * x))
                                          - ACT_REFERENCE["gelu"](x))))
                if err <= ACT_APPROX:
                    out.update(activation="gelu", activation_error=err, glu=moe["glu"])
            return out
        if not parts.mlp:
            return out
        # pre-LN with a norm after the MLP output inside the block: the branch outputs are
        # normalised too (Gemma 2, OLMo 2)
        out["sandwich"] = norm == "pre" and parts.last_is_norm
        first_in, last = parts.rest[0], parts.rest[-1]
        n_mlp = self._norm_module_before(self._pos(first_in), d)
        # parallel: the MLP reads the attention's norm, or its own norm of the block input
        fp = self.inputs.get(id(n_mlp)) if n_mlp is not None else None
        out["parallel"] = n_attn is not None and n_mlp is not None and norm == "pre" and (
            n_mlp is n_attn or (fp is not None and fp == self.inputs.get(id(n_attn))))
        out["gated"] = len(parts.mlp[0]) == 2
        group = _mlp_group(parts.block, parts.rest)
        out["mlp"] = "ok" if len(group) <= 3 else "unrecognised"
        out["extra_maps"] = len(parts.rest) - len(group)  # linear maps beside attn and MLP
        # the activation: a parameter-free leaf called between the MLP's input and output
        for m in self.order[self._pos(first_in) + 1:self._pos(last)]:
            if id(m) in parts.own and not list(m.parameters()) and not list(m.children()):
                name, err = classify_activation(m)
                if name is not None:
                    out.update(activation=name, activation_error=err)
                    break
        return out

    def _qkv(self, s: AttentionSite):
        """(W_Q, b_Q, W_K, b_K, W_V, b_V) as (out, in) tensors in float64."""
        H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim

        def f64(t):
            return None if t is None else t.to(torch.float64).cpu()

        if s.q_gate == "per_head":  # [query | gate] per head: the query rows only
            Wq, bq = (f64(t) for t in matrix(s.q))
            Wq = Wq.unflatten(0, (H, 2, dh))[:, 0].flatten(0, 1)
            bq = None if bq is None else bq.unflatten(0, (H, 2, dh))[:, 0].flatten()
            out = [Wq, bq]
            for m in (s.k, s.v):
                mat = matrix(m) if m is not None else None
                out += [None, None] if mat is None else [f64(mat[0]), f64(mat[1])]
            return tuple(out)
        if s.fused:
            W, b = (f64(t) for t in matrix(s.q))
            if s.fused == "per_head":
                Wr = W.unflatten(0, (H, 3, dh))
                br = None if b is None else b.unflatten(0, (H, 3, dh))
                parts = [Wr[:, j].flatten(0, 1) for j in range(3)]
                bparts = [None if br is None else br[:, j].flatten() for j in range(3)]
            else:
                cuts = [0, H * dh, (H + Hkv) * dh, (H + 2 * Hkv) * dh]
                parts = [W[cuts[j]:cuts[j + 1]] for j in range(3)]
                bparts = [None if b is None else b[cuts[j]:cuts[j + 1]] for j in range(3)]
            return parts[0], bparts[0], parts[1], bparts[1], parts[2], bparts[2]
        out = []
        for m in (s.q, s.k, s.v):
            mat = matrix(m) if m is not None else None
            out += [None, None] if mat is None else [f64(mat[0]), f64(mat[1])]
        return tuple(out)

    def _read_block(self, s: AttentionSite, parts: _Parts):
        notes = []
        H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim
        Wq, bq, Wk, bk, Wv, bv = self._qkv(s)
        d = Wq.shape[1]
        g = None if parts.n_attn is None else norm_gains(parts.n_attn, d)
        G = torch.ones(d, dtype=torch.float64) if g is None else torch.as_tensor(g)
        grp = max(H // max(Hkv, 1), 1)
        dv, vn = dh, None  # value head width; per-K/V-head |W_V^g G|^2
        if isinstance(s, MLASite):  # latent attention: its own maps (docs/theory.md §2.4.5)
            sig, vn, bv = mla_scores(s, G)
            dv, Wv = s.v_head_dim, None
        elif s.q_post is not None and s.k_post is not None:  # QK-norm: the norm gains set it
            gq = norm_gains(s.q_post, norm_width(s.q_post))
            gk = norm_gains(s.k_post, norm_width(s.k_post))
            if gq is None or gk is None:
                gq = gk = np.ones(dh)
                notes.append("QK-norm gains not readable; taken as 1")
            gq = np.resize(gq, H * dh).reshape(H, dh) if gq.size != dh else np.tile(gq, (H, 1))
            gk = (np.resize(gk, Hkv * dh).reshape(Hkv, dh) if gk.size != dh
                  else np.tile(gk, (Hkv, 1)))
            sig = np.sqrt(np.sum(gq**2 * gk[np.arange(H) // grp] ** 2, axis=1) / dh)
        else:
            sig = self._scores(Wq, bq, Wk * G, G, H, Hkv, dh)
        # values, output projection, head shares
        if Wv is not None:
            wv2 = (Wv * G).pow(2)
            var_v = float(wv2.sum() / Wv.shape[0])
            vn = wv2.unflatten(0, (Hkv, dh)).sum((1, 2)) if Wv.shape[0] == Hkv * dh else None
        else:  # MLA: from its latent maps; else no value map read
            var_v = float(vn.sum() / (Hkv * dv)) if vn is not None else 1.0
        v_norm = dict(s.module.named_children()).get("v_norm")
        if v_norm is not None and is_norm(v_norm):  # Gemma 4: values RMS-normalised per head
            gv = norm_gains(v_norm, norm_width(v_norm) or s.head_dim)
            var_v = float(np.mean(gv**2)) if gv is not None else 1.0
        biases = [b for b in (bv,) if b is not None]
        o = None if parts.o is None else matrix(parts.o)
        mlp = parts.mlp
        var_o, hw = None, None
        if o is not None:
            Wo, bo = o
            bo = None if bo is None else bo.to(torch.float64).cpu()
            o_cols = col_sq(Wo)
            var_o = float(o_cols.sum() / Wo.shape[0])
            if bo is not None:
                biases.append(bo)
            if vn is not None and Wo.shape[1] == H * dv:
                on = o_cols.unflatten(0, (H, dv)).sum(1)
                w = np.array([float(on[h] * vn[h // grp]) for h in range(H)])
                hw = tuple((w / w.mean()).tolist()) if w.mean() > 0 else None
        elif vn is not None:
            notes.append("no attention output projection found; var_o = none")
        var_w_in, var_w_out = 1.0, 1.0
        moe = self._moe(parts.block, d)
        moe_fields: dict = {}
        if moe is not None:
            var_w_in, var_w_out, moe_fields = moe_variances(moe, parts.rest, biases, self._mlp)
            if moe["source"] == "config":
                notes.append("mixture of experts: routing rule from the config (the router's "
                             "output gave no routing weights)")
        elif mlp:
            ins, out_m, gm = mlp
            Wout, bout = out_m
            bout = None if bout is None else bout.to(torch.float64).cpu()
            var_w_out = float(col_sq(Wout).sum() / Wout.shape[0])
            g2 = torch.ones(ins[0][0].shape[1], dtype=torch.float64) if gm is None \
                else torch.as_tensor(gm)
            vin = []
            for W, b in ins:
                vin.append(float((col_sq(W) * g2.square()).sum() / W.shape[0]))
                if b is not None:
                    biases.append(b.to(torch.float64).cpu())
            if len(vin) == 2:  # gated: gate's variance in, the up branch's scales the output
                var_w_in = vin[0]
                var_w_out *= vin[1] / vin[0] if vin[0] > 0 else 1.0
            else:
                var_w_in = vin[0]
            if bout is not None:
                biases.append(bout)
        else:
            notes.append("no MLP found; var_w_in = var_w_out = 1")
        var_b = float(np.mean([float(b.to(torch.float64).pow(2).mean()) for b in biases])) \
            if biases else 0.0
        cross = self._read_cross(parts.block, s)
        cross.update(self._sinks_and_gate(s, G))
        branch = self._branch_norms(parts, d)
        lay = LayerSpec(sigma_s=tuple(sig.tolist()), var_v=var_v, var_o=var_o,
                        var_w_in=var_w_in, var_w_out=var_w_out, var_b=var_b, head_weights=hw,
                        branch_gain2=branch, **cross, **moe_fields)
        return lay, sig, float(s.scale * math.sqrt(dh)), notes

    @staticmethod
    def _sinks_and_gate(s: AttentionSite, G: torch.Tensor) -> dict:
        """``sink_logit``, ``gate_var``, ``gate_bias2`` of one attention module (module
        docstring), as far as it has them."""
        out: dict = {}
        H, dh = s.n_heads, s.head_dim
        for name, prm in s.module.named_parameters(recurse=False):
            if prm.ndim == 1 and prm.numel() == H and "sink" in name.lower():
                out["sink_logit"] = tuple(prm.detach().to(torch.float64).cpu().tolist())
                break
        gate = None
        if s.q_gate == "per_head":
            W, b = matrix(s.q)
            W = W.to(torch.float64).cpu().unflatten(0, (H, 2, dh))[:, 1].flatten(0, 1)
            b = None if b is None else b.to(torch.float64).cpu().unflatten(0, (H, 2, dh))[:, 1]
            gate = (W, b)
        else:
            for name, child in s.module.named_children():
                mat = matrix(child)
                if ("gate" in name.lower() and mat is not None and mat[0].shape[0] == H * dh
                        and mat[0].shape[1] == G.numel()):
                    gate = (mat[0].to(torch.float64).cpu(),
                            None if mat[1] is None else mat[1].to(torch.float64).cpu())
                    break
        if gate is not None:
            W, b = gate
            out["gate_var"] = float((W * G).pow(2).sum() / W.shape[0])
            out["gate_bias2"] = 0.0 if b is None else float(b.pow(2).mean())
        return out

    def _branch_norms(self, parts: _Parts, d: int):
        """Pre-LN blocks that normalise their branch outputs (the block's last operation is
        a norm, and so is the first one after the attention output projection): the mean
        squared gains of those two norms (attention, MLP); None otherwise."""
        if not parts.last_is_norm or parts.n_attn is None or id(parts.n_attn) not in parts.own:
            return None  # post-LN: the last norm normalises the stream, not a branch
        if parts.o is None or not parts.rest:
            return None
        lo, hi = self._pos(parts.o), self._pos(parts.rest[0])
        between = [m for m in parts.in_block if lo < self._pos(m) < hi and is_norm(m)
                   and norm_width(m) == d]
        if len(between) < 2:  # one norm there is the MLP's input norm: no branch norm
            return None
        ga, gm = norm_gains(between[0], d), norm_gains(parts.in_block[-1], d)
        if ga is None or gm is None:
            return None
        return float(np.mean(ga**2)), float(np.mean(gm**2))

    @staticmethod
    def _scores(Wq, bq, Wk, G, H, Hkv, dh) -> np.ndarray:
        """Per query head: the canonical-scale score std (module docstring), ``|A_h^T
        B_g|_F^2 = tr(A A^T B B^T)`` with ``A = W_Q^h G`` and ``B = W_K^g`` (the caller folds
        the key side's gains into ``Wk``), plus the query bias term."""
        A = (Wq * G).unflatten(0, (H, dh))
        B = Wk.unflatten(0, (Hkv, dh))
        aat, bbt = A @ A.transpose(-1, -2), B @ B.transpose(-1, -2)
        grp = max(H // max(Hkv, 1), 1)
        out = np.empty(H)
        for h in range(H):
            fro = float((aat[h] * bbt[h // grp]).sum())
            if bq is not None:
                fro += float((B[h // grp].T @ bq[h * dh:(h + 1) * dh]).pow(2).sum())
            out[h] = math.sqrt(max(fro, 0.0) / dh)
        return out

    def _read_cross(self, block: nn.Module, s: AttentionSite) -> dict:
        """A decoder block's cross-attention (a second attention module, called after the
        self-attention): per-head score std with the gains of the norm in front of its
        queries, value and output variances (``LayerSpec.cross_*``); {} when there is none."""
        site, own_q = None, self._pos(s.q)
        for m in block.modules():
            if m is s.module:
                continue
            cand = describe_attention(m)
            if cand is not None and self._pos(cand.q) > own_q:
                site = cand
                break
        if site is None:
            return {}
        Wq, bq, Wk, _, Wv, _ = self._qkv(site)
        g = self._norm_before(self._pos(site.q), Wq.shape[1])
        G = torch.ones(Wq.shape[1], dtype=torch.float64) if g is None else torch.as_tensor(g)
        sig = self._scores(Wq, bq, Wk, G, site.n_heads, site.n_kv_heads, site.head_dim)
        var_v = float(Wv.pow(2).sum() / Wv.shape[0]) if Wv is not None else 1.0
        v_pos = max(self._pos(m) for m in (site.q, site.k, site.v) if m is not None)
        o = next((m for m in self.order if self._pos(m) > v_pos and matrix(m) is not None
                  and m not in (site.q, site.k, site.v)
                  and matrix(m)[0].shape[1] == site.n_heads * site.head_dim), None)
        var_o = 1.0
        if o is not None:
            Wo = matrix(o)[0].to(torch.float64).cpu()
            var_o = float(Wo.pow(2).sum() / Wo.shape[0])
        return {"cross_sigma_s": tuple(sig.tolist()), "cross_var_v": var_v,
                "cross_var_o": var_o}

    def _parts(self, block: nn.Module, s: AttentionSite) -> _Parts:
        """What the call order says about one block (module docstring): its modules in call
        order, the norm feeding the attention, the attention output projection (the first
        linear map called after the value projection) and the MLP's maps (the block's other
        linear maps, outside any attention module)."""
        own = {id(x) for x in block.modules()}
        in_block = sorted((m for m in block.modules() if self._pos(m) >= 0), key=self._pos)
        d = matrix(s.q)[0].shape[1]
        last_is_norm = bool(in_block) and is_norm(in_block[-1]) and norm_width(in_block[-1]) == d
        n_attn = self._norm_module_before(self._pos(s.module), d)
        qkv = {id(m) for m in (s.q, s.k, s.v) if m is not None}
        called = [m for m in in_block if matrix(m) is not None and id(m) not in qkv]
        v_pos = max(self._pos(m) for m in (s.q, s.k, s.v) if m is not None)
        H, dh = s.n_heads, s.head_dim
        o = s.o if isinstance(s, MLASite) else next(
            (m for m in called if self._pos(m) > v_pos and matrix(m)[0].shape[1] == H * dh),
            None)
        # the self-attention, a cross-attention (decoder blocks) and other attention-like
        # modules hold no MLP map
        attn = {id(x) for x in s.module.modules()}
        for m in block.modules():
            if m is not s.module and describe_attention(m) is not None:
                attn |= {id(x) for x in m.modules()}
        rest = [m for m in called if m is not o and id(m) not in attn]
        return _Parts(block, own, in_block, last_is_norm, n_attn, o, rest,
                      self._mlp(_mlp_group(block, rest)))

    def _moe(self, block: nn.Module, d: int) -> dict | None:
        """A mixture-of-experts MLP in ``block`` (module docstring): ``{"fields": LayerSpec
        moe_* values, "ins", "out": expert tensors (E, out, in), "module", "router",
        "source"}``, or None. Read once per block."""
        cache = self.__dict__.setdefault("_moe_cache", {})
        if id(block) not in cache:
            cache[id(block)] = find_moe(
                block, d, router_out=self.router_out, config=getattr(self.model, "config", None),
                gains_before=lambda m: (self._norm_before(self._pos(m), d)
                                        if self._pos(m) >= 0 else None))
        return cache[id(block)]

    def _mlp(self, rest: list[nn.Module]):
        """``(ins, out as (W, b), gains of the norm in front)`` of the MLP maps ``rest`` (in
        call order: the last is the output; one input, or two gated, or one fused ``[gate |
        up]`` of twice the output's fan-in), or None."""
        if not rest:
            return None
        Wout = matrix(rest[-1])[0]
        ins = []
        for m in rest[:-1]:
            W, b = matrix(m)
            if W.shape[0] == 2 * Wout.shape[1] and len(rest) == 2:  # fused [gate | up]
                half = Wout.shape[1]
                ins = [(W[:half], None if b is None else b[:half]),
                       (W[half:], None if b is None else b[half:])]
            elif W.shape[0] == Wout.shape[1]:
                ins.append((W, b))
        if not ins:
            return None
        gm = self._norm_before(self._pos(rest[0]), ins[0][0].shape[1])
        return ins[:2], matrix(rest[-1]), gm
