"""ngpt: the normalised transformer (Loshchilov et al. 2024, "nGPT: Normalized Transformer
with Representation Learning on the Hypersphere"), its forward form on pre-LN decoder blocks
(GPT-2, Llama family; :mod:`.streams`).

* Every hidden state on the unit sphere: each block's input normalised, and each branch's
  update ``h <- Norm(h + alpha (Norm(f(h)) - h))`` with a learned step ``alpha`` per channel
  and branch (``alpha_A``, ``alpha_M``). ``alpha`` is reparametrised as the paper does: the
  stored parameter starts at ``alpha_scale = 1/sqrt(d)`` and the step is it times
  ``alpha_init / alpha_scale``; ``alpha_init`` 0.05 (the paper's, "of order 1/L" for its 24
  and 36 layers).
* The block norms and the final norm removed.
* q and k normalised per head, each times a learned per-channel scale (ones at init), and the
  scores taken at the model's ``1/sqrt(d_k)``: with unit-RMS q and k that is ``sqrt(d_k)``
  times the cosine, the paper's softmax scale ``sqrt(d_k)`` on unit vectors (:mod:`.qk_norm`'s
  hook; the scales act before the rotary embedding, the norm is the same before or after it;
  q and k have one scale each where the paper shares one ``s_qk``).
* The MLP's inputs to its nonlinearity times ``s_nu sqrt(d)`` (Llama's gate projection,
  GPT-2's ``c_fc``) and its gated branch times ``s_u`` (Llama's up projection), ``s`` learned
  per channel (ones at init).
* Every matrix normalised along the embedding dimension: the input embedding's rows, each
  output unit's weights over the ``d`` inputs of W_Q, W_K, W_V and the MLP's input maps, each
  input unit's weights over the ``d`` outputs of W_O and the MLP's output map, and the output
  embedding's rows where the model has one. At apply, and after every optimizer step: the
  method records itself in ``config.sigprop_fix["after_step"]`` and the training loop calls
  :meth:`NGPT.after_step` (``sigprop fix --compare --train-steps`` does).

Left out, stated: the logit scale ``s_z`` (sigprop's models end at the hidden state), the
biases of GPT-2's maps (zero at init, trained as they are), GPT-2's position embeddings (added
to the token's unit row; the first block's input normalised makes the sum unit).

Theory: measured only (the update on the sphere is not the theory's residual recursion).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...spec import SpecError
from . import streams
from .base import Method, Param, recorded_entry, register
from .parts import install_qk_norm, need, remember_hook, weight_of
from .qk_clip import AFTER_STEP

ALPHA = "sigprop_ngpt_alpha"
SCALE = "sigprop_ngpt_s"
STATE = "_sigprop_ngpt"


def _unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


def _step(module, h: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    a = getattr(module, ALPHA).to(h.dtype) * module._sigprop_ngpt_mult
    return _unit(h + a * (_unit(f) - h))


def _block_pre(module, args, kwargs):
    st = getattr(module, STATE)
    h = _unit(streams.block_input(args, kwargs))
    st.h = h
    return streams.with_block_input(args, kwargs, h)


def _attn_hook(module, _args, out):
    st = getattr(module, STATE)
    target = _step(module, st.h, streams.branch_output(out))
    delta = target - st.h
    st.after_attn, st.res = target, st.h + delta  # the block's own sum, bitwise
    return streams.with_branch_output(out, delta)


def _mlp_hook(module, _args, out):
    st = getattr(module, STATE)
    target = _step(module, st.after_attn, streams.branch_output(out))
    return streams.with_branch_output(out, target - st.res)


def _scale_hook(module, _args, out):
    return out * (getattr(module, SCALE).to(out.dtype) * module._sigprop_ngpt_c)


def _mlp_inputs(lay: streams.Layout, method: str) -> list[tuple[nn.Module, bool]]:
    """The MLP's input maps, each with True where it feeds the nonlinearity (nu)."""
    ins = need(lay.part, "mlp_in", method)
    if len(ins) == 1:
        return [(ins[0], True)]
    names = {id(m): n for n, m in lay.mlp.named_modules()}
    gate = [m for m in ins if "gate" in names.get(id(m), "")]
    if len(ins) != 2 or len(gate) != 1:
        raise SpecError(method, f"{lay.part.name}: MLP input maps not one map or a gate and an "
                                "up projection")
    return [(m, m is gate[0]) for m in ins]


def _width(m: nn.Module) -> int:
    return int(getattr(m, "out_features", None) or getattr(m, "nf", 0))


def _d(parts) -> int:
    o = parts[0].o
    return int(getattr(o, "out_features", None) or getattr(o, "nf", 0))


def _install(model, parts, params, ctx, method: str) -> list[streams.Layout]:
    """Norms removed and every hook and learned scale installed (init values)."""
    from .tfixup import remove_norms

    streams.check_unstreamed(parts, method)
    lays = streams.decoder_layout(parts, ctx, method)
    fin_parent, fin_attr = streams.final_norm(model, parts, method)
    for lay in lays:
        site = lay.part.site
        if (site is not None and (site.q_post is not None or site.k_post is not None)) or \
                any(hasattr(t[0], "sigprop_q_norm") for t in lay.part.q):
            raise SpecError(method, f"{lay.part.name}: the model already normalises q and k")
    d = _d(parts)
    scale, mult = 1.0 / math.sqrt(d), params["alpha_init"] * math.sqrt(d)
    remove_norms(parts, None)
    setattr(fin_parent, fin_attr, nn.Identity())
    for lay in lays:
        st = streams.State(after_attn=None)
        dev = lay.part.o.weight.device
        for mod, hook in ((lay.attn, _attn_hook), (lay.mlp, _mlp_hook)):
            mod.register_parameter(ALPHA, nn.Parameter(torch.full((d,), scale, device=dev)))
            object.__setattr__(mod, "_sigprop_ngpt_mult", mult)
            object.__setattr__(mod, STATE, st)
            remember_hook(mod, streams.KEY, mod.register_forward_hook(hook))
        object.__setattr__(lay.block, STATE, st)
        remember_hook(lay.block, streams.KEY, lay.block.register_forward_pre_hook(
            _block_pre, with_kwargs=True))
        for role in ("q", "k"):
            for t in need(lay.part, role, method):
                m, sl, _ = t
                w = (sl[1] - sl[0]) if sl is not None else _width(m)
                dh = lay.part.head_dim
                if dh <= 0 or w % dh:
                    raise SpecError(method, f"{lay.part.name}: {role} width {w} is not a "
                                            f"multiple of the head size {dh}")
                install_qk_norm(t, role, dh, "rms", w)
        for m, nu in _mlp_inputs(lay, method):
            m.register_parameter(SCALE, nn.Parameter(torch.ones(_width(m), device=dev)))
            object.__setattr__(m, "_sigprop_ngpt_c", math.sqrt(d) if nu else 1.0)
            remember_hook(m, "ngpt_scale", m.register_forward_hook(_scale_hook))
    return lays


def _matrices(model, parts) -> list[tuple[torch.Tensor, int]]:
    """Every matrix nGPT keeps on the sphere, as ``(out, in)`` views with the axis to
    normalise over (module docstring)."""
    out = []
    emb = model.get_input_embeddings()
    if emb is not None:
        out.append((emb.weight, 1))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and head.weight is not emb.weight:
        out.append((head.weight, 1))
    for p in parts:
        for t in p.q + p.k + p.v:
            out.append((weight_of(t), 1))
        for m in p.mlp_in:
            out.append((weight_of((m, None, 0)), 1))
        for m in (p.o, p.mlp_out):
            out.append((weight_of((m, None, 0)), 0))
    return out


@torch.no_grad()
def renormalise_(model, parts=None) -> int:
    """Every matrix of :func:`_matrices` normalised in place along the embedding dimension;
    returns how many."""
    from .parts import block_parts

    mats = _matrices(model, parts if parts is not None else block_parts(model))
    for w, axis in mats:
        w.div_(w.norm(dim=axis, keepdim=True).clamp_min(1e-12))
    return len(mats)


def recorded_ngpt(config) -> dict[str, Any] | None:
    """The ngpt parameters a config records in ``sigprop_fix["after_step"]``, or None."""
    return recorded_entry(config, AFTER_STEP, NGPT.name)


@register
class NGPT(Method):
    name = "ngpt"
    params = (Param("alpha_init", "each branch's step alpha at init (the paper: 0.05, of order "
                    "1/L)", 0.05, lo=1e-6, hi=1.0),)

    def apply(self, model, parts, params, ctx, effect):
        effect.measured_only.append("ngpt: hidden states on the unit sphere, updated by "
                                    "h + alpha (Norm f - h) and renormalised, outside the "
                                    "theory's residual recursion")
        if not parts:
            return ["hidden states and weights on the unit sphere"]
        lays = _install(model, parts, params, ctx, self.name)
        n = renormalise_(model, parts)
        cfg = getattr(model, "config", None)
        rec = dict(getattr(cfg, "sigprop_fix", None) or {})
        rec[AFTER_STEP] = [e for e in rec.get(AFTER_STEP) or [] if e.get("name") != self.name
                           ] + [{"name": self.name, "params": dict(params)}]
        cfg.sigprop_fix = rec
        a = params["alpha_init"]
        return [f"{2 * len(lays) + 1} norms removed; every block's input and branch update on "
                f"the unit sphere, h <- Norm(h + alpha (Norm f - h)), alpha {a:.4g} per channel "
                "(learned)",
                "q and k RMS-normalised per head (learned scales, ones): scores sqrt(d_k) cos; "
                "MLP nonlinearity input times sqrt(d) (learned scales)",
                f"{n} matrices normalised along the embedding dimension, again after every "
                "optimizer step (after_step)"]

    def restore(self, model, parts, params):
        _install(model, parts, params, None, self.name)

    def after_step(self, model, params: dict[str, Any] | None = None) -> int:
        """The training loop's hook after each optimizer step: every matrix back on the unit
        sphere (:func:`renormalise_`); returns how many."""
        for k in dict(params or {}):
            if k != "alpha_init":
                raise SpecError(f"{self.name}.{k}", "unknown parameter; ngpt takes: alpha_init")
        return renormalise_(model)
