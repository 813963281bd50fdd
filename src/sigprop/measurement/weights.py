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
  SwiGLU experts (:func:`_clamped_glu`: interleaved gate / up columns, gate ``g sigmoid(1.702
  g)`` read as GELU within 0.02, ``u + 1`` as ``glu_shift``, docs/theory.md §2.5.3);
* hybrid stacks (Jamba, Qwen3-Next, Zamba, ...): a block without an attention site (its token
  mixer is Mamba, linear attention, ...) gets :data:`MEASURED_MIXER` -- the whole block, MLP
  included, is a measured residual map (docs/theory.md §2.8.1) -- and the layout entry
  ``{"mixer": "measured"}``; the attention blocks are read as above, those without an MLP
  (Nemotron-H: the MLP is a block of its own) with ``var_w_in = var_w_out = 0``. A stack
  without any attention site is not readable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from ..spec import LayerSpec
from .probe_sites import AttentionSite, describe_attention, find_attention, find_blocks

__all__ = ["WeightReader", "WeightTable", "matrix", "norm_gains"]

#: the LayerSpec of a block without attention (a hybrid stack's other mixer): the whole block
#: is a measured residual map (docs/theory.md §2.8.1), filled in by ``sigprop diagnose``
MEASURED_MIXER = LayerSpec(sigma_s=(0.0,), var_v=0.0, var_o=None, var_w_in=0.0, var_w_out=0.0,
                           mixer="measured")
#: rows of the Gaussian input a norm module's gains are read on
GAIN_ROWS = 64
#: a norm's fit counts as affine per feature when its residual is below this (relative)
GAIN_FIT_TOL = 1e-3


def matrix(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(W (out, in), bias or None)`` of a linear map: ``nn.Linear``, HF ``Conv1D`` (weight
    stored ``(in, out)``) or any module with a 2-D ``weight`` and ``in_features``; else None."""
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.ndim != 2:
        return None
    b = getattr(m, "bias", None)
    b = b.detach() if isinstance(b, torch.Tensor) else None
    if isinstance(m, nn.Linear) or getattr(m, "in_features", None) == w.shape[1]:
        return w.detach(), b
    nf = getattr(m, "nf", None)
    if isinstance(nf, int) and w.shape[1] == nf:  # HF Conv1D: y = x W + b
        return w.detach().T, b
    return None


def _col_sq(W: torch.Tensor) -> torch.Tensor:
    """Per column (input feature) of ``W``: the sum of squares, float64 out, accumulated in
    the weights' own float32 by one fused dot product per column: within ~2e-7 relative of the
    float64 sum (torch's blocked summation; tests/measurement/test_weights.py), far below the
    sampling noise of a variance read from one draw (~sqrt(2 / rows)), and without a squared
    copy of the matrix (bert-base's 3072 x 768 MLP maps: ~1.2 ms against ~3.4 ms through
    ``square().sum(dtype=float64)``, per matrix and draw)."""
    W = W.detach()
    W = W if W.dtype in (torch.float32, torch.float64) else W.float()  # bf16 squares: 3 digits
    return torch.linalg.vecdot(W.mT, W.mT).double().cpu()


def _is_norm(m: nn.Module) -> bool:
    name = type(m).__name__.lower()
    return "norm" in name and not isinstance(m, nn.ModuleList) and not any(
        isinstance(c, nn.Linear) for c in m.children())


def _width(m: nn.Module) -> int | None:
    w = getattr(m, "weight", None)
    if isinstance(w, torch.Tensor) and w.ndim == 1:
        return int(w.numel())
    shape = getattr(m, "normalized_shape", None)
    if isinstance(shape, tuple | list) and shape:
        return int(np.prod(shape))
    for attr in ("hidden_size", "dim", "d_model"):
        v = getattr(m, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


@torch.no_grad()
def norm_gains(m: nn.Module, width: int | None = None, seed: int = 0) -> np.ndarray | None:
    """Per-feature gains of a normalisation module (module docstring); None when it is not
    affine per feature in its normalised input (then it is not treated as a norm)."""
    width = width or _width(m)
    if not width:
        return None
    p = next(m.parameters(), None)
    dtype = p.dtype if p is not None else torch.float32
    device = p.device if p is not None else "cpu"
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(GAIN_ROWS, width, generator=g, dtype=torch.float64)
    try:
        y = m(z.to(device=device, dtype=dtype))
    except Exception:  # noqa: BLE001 - a module that cannot run on a plain (rows, d) input
        return None
    y = y[0] if isinstance(y, tuple | list) else y
    if not torch.is_tensor(y) or tuple(y.shape) != (GAIN_ROWS, width):
        return None
    y = y.detach().to(torch.float64).cpu()
    best = None
    for zn in (z / z.pow(2).mean(-1, keepdim=True).sqrt(),
               (z - z.mean(-1, keepdim=True)) / z.std(-1, unbiased=False, keepdim=True)):
        zc, yc = zn - zn.mean(0), y - y.mean(0)
        slope = (zc * yc).sum(0) / zc.pow(2).sum(0)
        resid = (yc - slope * zc).pow(2).sum() / max(float(yc.pow(2).sum()), 1e-300)
        if best is None or resid < best[0]:
            best = (float(resid), slope)
    if best is None or best[0] > GAIN_FIT_TOL:
        return None
    return best[1].numpy()


#: activations a module is compared with (docs/theory.md §2.5 kernels), on [-5, 5]
_ACT_REFERENCE = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "linear": lambda x: x,
}
#: a module within this (max abs, on [-5, 5]) of a reference *is* that activation
ACT_EXACT = 2e-3
#: within this of GELU it is read as GELU with a note (tanh-approximate GELU differs by ~5e-4,
#: CLIP's quick-GELU x sigmoid(1.702 x) by ~0.02)
ACT_APPROX = 0.03


def _erf(x):
    from scipy import special

    return special.erf(x)


@torch.no_grad()
def classify_activation(m: nn.Module) -> tuple[str | None, float]:
    """``(name, max abs difference)`` of the closest activation in docs/theory.md §2.5's set
    for a parameter-free elementwise module (evaluated on [-5, 5]); ``(None, inf)`` when the
    module is not elementwise or not close to any (within :data:`ACT_APPROX` of GELU, or
    :data:`ACT_EXACT` of another)."""
    x = np.linspace(-5.0, 5.0, 201)
    try:
        y = m(torch.tensor(x, dtype=torch.float32))
    except Exception:  # noqa: BLE001 - not callable on a plain vector
        return None, math.inf
    if not torch.is_tensor(y) or tuple(y.shape) != x.shape:
        return None, math.inf
    y = y.double().numpy()
    errs = {k: float(np.max(np.abs(f(x) - y))) for k, f in _ACT_REFERENCE.items()}
    name = min(errs, key=errs.get)
    if errs[name] <= ACT_EXACT or (name == "gelu" and errs[name] <= ACT_APPROX):
        return name, errs[name]
    return None, math.inf


def _fingerprint(args, kwargs):
    """A cheap identity of a module's first tensor input: (shape, sum, sum of squares). The
    sums are taken per row in float32 and then over the rows in float64: a float64
    accumulation over the whole tensor (``sum(dtype=torch.float64)``) took ~1.5 ms per
    bert-base activation against ~0.1 ms this way, once per norm and seed. Equal inputs give
    equal fingerprints (the same reduction of the same values); that is all the reader asks."""
    t = next((a for a in list(args) + list(kwargs.values()) if torch.is_tensor(a)), None)
    if t is None or not t.is_floating_point():
        return None
    t = t.detach().float()
    if t.dim() == 0:
        t = t.reshape(1)
    return tuple(t.shape), float(t.sum(dim=-1).double().sum()), float(
        torch.linalg.vecdot(t, t).double().sum())


@dataclass
class MLASite(AttentionSite):
    """A multi-head latent attention module (DeepSeek-V2/V3's MLA, docs/theory.md §2.4.5), in
    :class:`AttentionSite`'s terms for the reader's call-order logic: ``q`` the query map
    reading the model width (the low-rank ``q_a`` map, or the full query map where there is
    no query rank), ``k`` the joint ``[latent | k_rope]`` down-projection, ``v`` the latent's
    up-projection to per-head ``[k_nope | v]``, ``head_dim`` the query / key width
    ``nope + rope`` (the canonical logit scale is ``1/sqrt(nope + rope)``), ``n_kv_heads ==
    n_heads`` (the up-projection is per head). The rest is MLA's own."""

    q_b: nn.Module | None = None  # the query up-projection (None: no query rank)
    q_norm: nn.Module | None = None  # the RMSNorm between the query maps
    kv_norm: nn.Module | None = None  # the RMSNorm of the key / value latent
    o: nn.Module | None = None  # the output projection (H v_head_dim -> width)
    nope: int = 0  # qk_nope_head_dim
    rope: int = 0  # qk_rope_head_dim
    v_head_dim: int = 0
    q_rank: int | None = None  # q_lora_rank
    kv_rank: int = 0  # kv_lora_rank


def _int_attr(srcs, name: str, lo: int = 1) -> int | None:
    for o in srcs:
        v = getattr(o, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v >= lo:
            return int(v)
    return None


def _has_attr(srcs, name: str) -> bool:
    return any(o is not None and hasattr(o, name) for o in srcs)


def find_mla(block: nn.Module, prefix: str = "") -> MLASite | None:
    """The first module of ``block`` that is a multi-head latent attention: it (or its
    ``config``) states ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
    ``v_head_dim``, a head count and ``q_lora_rank`` (an int, or None: a full query map), and
    its own linear maps have the shapes these fix (the down-projection ``width -> kv_rank +
    rope``, the up-projection ``kv_rank -> H (nope + v)``, the query maps, the output ``H v ->
    width``; a name saying ``kv`` or ``q`` settles a tie between equal shapes), with one
    normalisation of the latent's width (and one of the query rank's). None where there is
    none. Nothing here names a model class: the projections and the config say what it is."""
    for name, m in block.named_modules():
        srcs = [m, getattr(m, "config", None)]
        r = _int_attr(srcs, "kv_lora_rank")
        rope = _int_attr(srcs, "qk_rope_head_dim")
        nope = _int_attr(srcs, "qk_nope_head_dim", lo=0)
        dv = _int_attr(srcs, "v_head_dim")
        H = _int_attr(srcs, "num_heads") or _int_attr(srcs, "num_attention_heads")
        if None in (r, rope, nope, dv, H) or not _has_attr(srcs, "q_lora_rank"):
            continue
        rq = _int_attr(srcs, "q_lora_rank")
        lin = [(n, c, matrix(c)[0].shape) for n, c in m.named_children()
               if matrix(c) is not None]

        def pick(out_f, in_f, hint, lin=lin):  # the map of this shape, a named one first
            got = [(n, c) for n, c, (o, i) in lin if o == out_f and i == in_f]
            got.sort(key=lambda nc: hint not in nc[0].lower())
            return got[0][1] if got else None

        dqk = nope + rope
        outs = sorted(((n, c) for n, c, (_, i) in lin if i == H * dv),
                      key=lambda x: not x[0].lower().startswith("o"))
        if not outs:
            continue
        o = outs[0][1]
        d = matrix(o)[0].shape[0]
        kv_a, kv_b = pick(r + rope, d, "kv"), pick(H * (nope + dv), r, "kv")
        if rq is not None:
            q, q_b = pick(rq, d, "q"), pick(H * dqk, rq, "q")
        else:
            q, q_b = pick(H * dqk, d, "q"), None
        if None in (kv_a, kv_b, q) or q is kv_a or q_b is kv_b or (rq is not None
                                                                   and q_b is None):
            continue
        norms = [(n, c) for n, c in m.named_children() if _is_norm(c)]
        kv_norm = sorted((x for x in norms if _width(x[1]) == r),
                         key=lambda x: "kv" not in x[0].lower())
        q_norm = sorted((x for x in norms if _width(x[1]) == rq and x not in kv_norm[:1]),
                        key=lambda x: "q" not in x[0].lower()) if rq is not None else []
        if not kv_norm or (rq is not None and not q_norm):
            continue
        scale = getattr(m, "scaling", None)
        scale = float(scale) if isinstance(scale, float | int) and scale > 0 else dqk ** -0.5
        return MLASite(m, q, kv_a, kv_b, H, H, dqk, scale, bool(getattr(m, "is_causal", False)),
                       name=f"{prefix}.{name}".strip("."), q_b=q_b,
                       q_norm=q_norm[0][1] if q_norm else None, kv_norm=kv_norm[0][1], o=o,
                       nope=nope, rope=rope, v_head_dim=dv, q_rank=rq, kv_rank=r)
    return None


def _router_weight(m: nn.Module) -> torch.Tensor | None:
    """A router candidate's ``(E, d)`` weight: a module's own 2-D ``weight`` that
    :func:`matrix` does not take as a linear map (HF's ``*TopKRouter``), or a Linear named
    as a gate whose siblings hold experts (checked in :meth:`WeightReader._moe`)."""
    w = getattr(m, "weight", None)
    if isinstance(w, torch.Tensor) and w.ndim == 2 and matrix(m) is None and not _is_norm(m):
        return w.detach()
    return None


def _detach(out):
    if torch.is_tensor(out):
        return out.detach()
    if isinstance(out, tuple | list):
        return type(out)(_detach(x) for x in out)
    return None


def _clamped_glu(mod: nn.Module) -> tuple[float, float] | None:
    """``(alpha, limit)`` of experts with gpt-oss's clamped SwiGLU (``glu = g sigmoid(alpha
    g)`` with g clamped above at ``limit``, times ``u + 1`` with u clamped to +-limit, over an
    interleaved ``[g0, u0, g1, u1, ...]`` fused projection): a module inside ``mod`` holding
    numeric ``alpha`` and ``limit`` attributes (HF ``GptOssExperts``); None otherwise."""
    for m in mod.modules():
        a, lim = getattr(m, "alpha", None), getattr(m, "limit", None)
        if all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, lim)):
            return float(a), float(lim)
    return None


def _stacked_experts(mod: nn.Module, E: int, d: int):
    """``(ins, out)`` of experts stored as 3-D parameters ``(E, ., .)`` directly in ``mod``
    or one of its descendants, as ``(E, out, in)`` float64 tensors (biases ``(E, out)`` or
    None): the input map has the model width ``d`` on one side, the output map maps back to
    ``d``; a fused input of twice the output's fan-in is split into [gate | up]. None when
    absent."""
    params = {n: p.detach() for n, p in mod.named_parameters()}
    three = {n: p for n, p in params.items() if p.ndim == 3 and p.shape[0] == E}
    if len(three) < 2:
        return None

    def orient(W, fan_in):  # (E, out, in)
        return W if W.shape[2] == fan_in else W.transpose(1, 2)

    names = sorted(three)
    down = next((n for n in names if "down" in n.lower() or n.lower().endswith("w2")), None)
    if down is None:
        return None
    Wd = three[down].to(torch.float64).cpu()
    ff = Wd.shape[2] if Wd.shape[1] == d else Wd.shape[1]
    Wd = orient(Wd, ff)
    ins = []
    for n in names:
        if n == down:
            continue
        W = three[n].to(torch.float64).cpu()
        if d not in W.shape[1:]:
            continue
        W = orient(W, d)
        b = params.get(n + "_bias")
        b = None if b is None else b.to(torch.float64).cpu()
        if W.shape[1] == 2 * ff and _clamped_glu(mod) is not None:  # interleaved g, u
            ins += [(W[:, 0::2], None if b is None else b[:, 0::2]),
                    (W[:, 1::2], None if b is None else b[:, 1::2])]
        elif W.shape[1] == 2 * ff:
            ins += [(W[:, :ff], None if b is None else b[:, :ff]),
                    (W[:, ff:], None if b is None else b[:, ff:])]
        elif W.shape[1] == ff:
            ins.append((W, b))
    bd = params.get(down + "_bias")
    return (ins[:2], (Wd, None if bd is None else bd.to(torch.float64).cpu())) if ins else None


def _listed_experts(mod: nn.Module, E: int, d: int):
    """The same as :func:`_stacked_experts` for a ModuleList of E expert MLPs (their Linear
    maps: the output maps to ``d`` from another width, the inputs read ``d``, a map named
    gate or w1 first)."""
    for child in mod.modules():
        if not isinstance(child, nn.ModuleList) or len(child) != E:
            continue
        ins_all, outs = [], []
        for ex in child:
            mats = [(n, matrix(m)) for n, m in ex.named_modules() if matrix(m) is not None]
            o = [mt for _, mt in mats if mt[0].shape[0] == d and mt[0].shape[1] != d]
            i = sorted(((n, mt) for n, mt in mats if mt[0].shape[1] == d
                        and mt[0].shape[0] != d),
                       key=lambda x: ("gate" not in x[0].lower() and "w1" not in x[0], x[0]))
            if len(o) != 1 or not i:
                break
            ins_all.append([mt for _, mt in i[:2]])
            outs.append(o[0])
        else:
            def stack(ts):
                return None if ts[0] is None else torch.stack([t.to(torch.float64).cpu()
                                                               for t in ts])

            ins = [(stack([x[j][0] for x in ins_all]), stack([x[j][1] for x in ins_all]))
                   for j in range(len(ins_all[0]))]
            return ins, (stack([o[0] for o in outs]), stack([o[1] for o in outs]))
    return None


def _routing_rule(out, E: int, config) -> tuple[int, str, float, str]:
    """``(top_k, weighting, scale, source)`` of a router from its forward output ``out``
    (logits ``(N, E)`` and routing weights ``(N, k)``, k < E): the weights' row sums
    constant (relative spread < 1e-4) mean renormalised weights times that constant, else
    unnormalised times the median ratio to the top-k scores; softmax or sigmoid scores
    whichever reproduces the weights. Without such an output: the config's
    ``num_experts_per_tok``, ``norm_topk_prob`` (None: renormalised), ``scoring_func``,
    ``routed_scaling_factor``."""
    ts = [t for t in (out if isinstance(out, tuple | list) else (out,))
          if torch.is_tensor(t) and t.is_floating_point() and t.ndim >= 2]
    logits = next((t for t in ts if t.shape[-1] == E), None)
    wts = next((t for t in ts if t.shape[-1] < E), None)
    if logits is not None and wts is not None:
        L = logits.reshape(-1, E).to(torch.float64).cpu()
        W = wts.reshape(-1, wts.shape[-1]).to(torch.float64).cpu().sort(-1, descending=True)[0]
        k = W.shape[-1]
        sums = W.sum(-1)
        norm = bool(sums.std() <= 1e-4 * sums.mean().abs()) if len(sums) > 1 else True
        best = None
        for score in ("softmax", "sigmoid"):
            sc = torch.softmax(L, -1) if score == "softmax" else torch.sigmoid(L)
            top = sc.gather(-1, L.topk(k, -1).indices).sort(-1, descending=True)[0]
            if norm:
                top = top / top.sum(-1, keepdim=True)
                c = float(sums.mean())
            else:
                c = float((sums / top.sum(-1)).median())
            err = float((W - c * top).abs().max())
            if best is None or err < best[0]:
                best = (err, score, c)
        c = 1.0 if abs(best[2] - 1.0) < 1e-5 else best[2]  # float32 rounding of 1
        return k, best[1] + ("_norm" if norm else ""), c, "measured"
    k = int(getattr(config, "num_experts_per_tok", None) or 1)
    norm = getattr(config, "norm_topk_prob", None)
    score = "sigmoid" if getattr(config, "scoring_func", None) == "sigmoid" else "softmax"
    scale = float(getattr(config, "routed_scaling_factor", None) or 1.0)
    return k, score + ("" if norm is False else "_norm"), scale, "config"


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


@dataclass
class WeightTable:
    """What :meth:`WeightReader.read` returns: ``layers`` (one :class:`LayerSpec` per block
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


class WeightReader:
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
                if _is_norm(m):  # the norms' inputs tell parallel blocks (_structure)
                    self.inputs[id(m)] = _fingerprint(args, kwargs)

        def out_hook(m, args, out):
            if id(m) not in self.router_out:
                self.router_out[id(m)] = _detach(out)

        blocks = {id(b) for _, b in self.blocks}
        inside = {id(x) for _, b in self.blocks for x in b.modules()}
        for m in self.model.modules():
            if id(m) in inside and _router_weight(m) is not None:  # a router candidate
                self._handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
                self._handles.append(m.register_forward_hook(out_hook))
                continue
            leaf_fn = (id(m) in inside and not list(m.children()) and not list(m.parameters())
                       and not isinstance(m, nn.Dropout | nn.Identity))
            if _is_norm(m) or matrix(m) is not None or id(m) in blocks or leaf_fn or any(
                    s is not None and m is s.module for s in self.sites):
                self._handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    # ---------------------------------------------------------------- reading
    def _pos(self, m) -> int:
        """``m``'s place in the call order (-1: not called)."""
        return self._index.get(id(m), -1)

    def _norm_module_before(self, pos: int, width: int) -> nn.Module | None:
        """The last norm of this width called before position ``pos`` (None: none)."""
        for m in reversed(self.order[:max(pos, 0)]):
            if _is_norm(m) and _width(m) == width:
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
        kids = [n for n, c in block.named_children() if not _is_norm(c)]
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
                                          - _ACT_REFERENCE["gelu"](x))))
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
            sig, vn, bv = self._mla(s, G)
            dv, Wv = s.v_head_dim, None
        elif s.q_post is not None and s.k_post is not None:  # QK-norm: the norm gains set it
            gq = norm_gains(s.q_post, _width(s.q_post))
            gk = norm_gains(s.k_post, _width(s.k_post))
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
        if v_norm is not None and _is_norm(v_norm):  # Gemma 4: values RMS-normalised per head
            gv = norm_gains(v_norm, _width(v_norm) or s.head_dim)
            var_v = float(np.mean(gv**2)) if gv is not None else 1.0
        biases = [b for b in (bv,) if b is not None]
        o = None if parts.o is None else matrix(parts.o)
        mlp = parts.mlp
        var_o, hw = None, None
        if o is not None:
            Wo, bo = o
            bo = None if bo is None else bo.to(torch.float64).cpu()
            o_cols = _col_sq(Wo)
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
            var_w_in, var_w_out, moe_fields = self._moe_read(moe, parts, biases)
            if moe["source"] == "config":
                notes.append("mixture of experts: routing rule from the config (the router's "
                             "output gave no routing weights)")
        elif mlp:
            ins, out_m, gm = mlp
            Wout, bout = out_m
            bout = None if bout is None else bout.to(torch.float64).cpu()
            var_w_out = float(_col_sq(Wout).sum() / Wout.shape[0])
            g2 = torch.ones(ins[0][0].shape[1], dtype=torch.float64) if gm is None \
                else torch.as_tensor(gm)
            vin = []
            for W, b in ins:
                vin.append(float((_col_sq(W) * g2.square()).sum() / W.shape[0]))
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
    def _mla(s: MLASite, G: torch.Tensor):
        """``(sigma_s per head, |V_h G|_F^2 per head, value bias or None)`` of a multi-head
        latent attention (docs/theory.md §2.4.5). Each RMSNorm inside is a constant divisor
        (its output's RMS concentrates, relative spread ~sqrt(2 / rank)): the latent ``z =
        g * (A x + b) / rho`` with ``rho^2 = (|A G|_F^2 + |b|^2) / rank`` its mean square
        over isotropic inputs with q = 1. Then head h's query ``Q_h x + b_h`` and key ``K_h
        x``, ``K_h = [U_h^nope A_kv / rho_kv ; W_rope]`` (the rope rows shared by all heads,
        their bias cancelling in the softmax as a key bias does), are linear, and
        ``sigma_s,h^2 = (|G Q_h^T K_h G|_F^2 + b_h^T K_h G^2 K_h^T b_h) / (nope + rope)``,
        formed from ``(nope + rope)``-square Gram matrices through the latents (never a
        width-square one); RoPE is left out as in :meth:`_scores`."""
        H, nope, rope, dv, r = s.n_heads, s.nope, s.rope, s.v_head_dim, s.kv_rank
        G2 = G.square()

        def f64(t):
            return None if t is None else t.to(torch.float64).cpu()

        def gains(norm, width):
            g = None if norm is None else norm_gains(norm, width)
            return torch.ones(width, dtype=torch.float64) if g is None else torch.as_tensor(g)

        def latent(W, b, norm):  # (D g / rho: up-projection column scales, A G^2 A^T, b)
            width = W.shape[0]
            rho2 = (float((W.square() * G2).sum()) + (0.0 if b is None else float(b.square()
                                                                                   .sum())))
            rho2 /= width
            return gains(norm, width) / math.sqrt(max(rho2, 1e-300)), (W * G2) @ W.T

        Wa, ba = (f64(t) for t in matrix(s.k))
        Wlat, blat, Wpe = Wa[:r], None if ba is None else ba[:r], Wa[r:]
        col, Mkv = latent(Wlat, blat, s.kv_norm)
        Wb, bb = (f64(t) for t in matrix(s.v))
        U = (Wb * col).unflatten(0, (H, nope + dv))  # (H, nope + v, r)
        Uk, Uv = U[:, :nope], U[:, nope:]
        # the keys' Gram per head: [[nope-nope, nope-rope], [rope-nope, rope-rope]]
        C = (Wlat * G2) @ Wpe.T  # (r, rope)
        kk_nn = Uk @ Mkv @ Uk.transpose(-1, -2)
        kk_nr = Uk @ C
        kk_rr = ((Wpe * G2) @ Wpe.T).expand(H, rope, rope)
        KK = torch.cat([torch.cat([kk_nn, kk_nr], -1),
                        torch.cat([kk_nr.transpose(-1, -2), kk_rr], -1)], -2)
        Wq, bq = (f64(t) for t in matrix(s.q))
        if s.q_b is not None:  # x -> q_a -> RMSNorm -> q_b
            qcol, Mq = latent(Wq, bq, s.q_norm)
            Wqb, bqb = (f64(t) for t in matrix(s.q_b))
            P = (Wqb * qcol).unflatten(0, (H, nope + rope))  # (H, nope + rope, q_rank)
            QQ = P @ Mq @ P.transpose(-1, -2)
            bqh = None if bq is None else P @ bq
            if bqb is not None:
                bqb = bqb.unflatten(0, (H, nope + rope))
                bqh = bqb if bqh is None else bqh + bqb
        else:  # one query map of the width
            A = (Wq * G).unflatten(0, (H, nope + rope))
            QQ = A @ A.transpose(-1, -2)
            bqh = None if bq is None else bq.unflatten(0, (H, nope + rope))
        fro = (QQ * KK).sum((-1, -2))
        if bqh is not None:
            fro = fro + torch.einsum("hi,hij,hj->h", bqh, KK, bqh)
        sig = np.sqrt(np.maximum(fro.numpy(), 0.0) / (nope + rope))
        vn = torch.einsum("hir,rs,his->h", Uv, Mkv, Uv)  # |U_h^v A_kv G|_F^2 / rho^2
        bv = None if blat is None else (Uv @ blat).flatten()
        if bb is not None:
            bbv = bb.unflatten(0, (H, nope + dv))[:, nope:].flatten()
            bv = bbv if bv is None else bv + bbv
        return sig, vn, bv

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
        between = [m for m in parts.in_block if lo < self._pos(m) < hi and _is_norm(m)
                   and _width(m) == d]
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
        last_is_norm = bool(in_block) and _is_norm(in_block[-1]) and _width(in_block[-1]) == d
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
            cache[id(block)] = self._find_moe(block, d)
        return cache[id(block)]

    def _find_moe(self, block: nn.Module, d: int) -> dict | None:
        for mod in block.modules():
            for name, child in mod.named_children():
                W = _router_weight(child)
                if W is None and matrix(child) is not None and any(
                        t in name.lower() for t in ("gate", "router")):
                    W = matrix(child)[0]  # a Linear router (named gate / router)
                if W is None or W.ndim != 2 or W.shape[1] != d or not 2 <= W.shape[0] != d:
                    continue
                E = int(W.shape[0])
                ex = _stacked_experts(mod, E, d) or _listed_experts(mod, E, d)
                if ex is None:
                    continue
                out = self.router_out.get(id(child))
                k, weighting, scale, src = _routing_rule(out, E, getattr(self.model,
                                                                         "config", None))
                g = self._norm_before(self._pos(child), d) if self._pos(child) >= 0 else None
                G = torch.ones(d, dtype=torch.float64) if g is None else torch.as_tensor(g)
                Wr = W.to(torch.float64).cpu() * G
                fields_ = dict(moe_experts=E, moe_top_k=min(k, E),
                               moe_router_var=float(Wr.pow(2).sum() / E),
                               moe_weighting=weighting, moe_scale=scale)
                return {"fields": fields_, "ins": ex[0], "out": ex[1], "module": mod,
                        "router": child, "source": src, "gains": G,
                        "glu": _clamped_glu(mod)}
        return None

    def _moe_read(self, moe: dict, parts: _Parts, biases: list) -> tuple[float, float, dict]:
        """``(var_w_in, var_w_out, LayerSpec moe fields)`` of a mixture of experts: the
        experts' variances averaged over experts (a gated expert's up branch folded into
        ``var_w_out`` as for a dense MLP), the shared expert from the block's linear maps
        inside the MoE module (a 1-output map among them: its sigmoid gate)."""
        G2 = moe["gains"].square()
        vin = [float(((W.square() * G2).sum(-1)).mean()) for W, _ in moe["ins"]]
        Wd, bd = moe["out"]
        var_out = float(Wd.square().sum(-1).mean())
        var_in = vin[0]
        if len(vin) == 2 and vin[0] > 0:
            var_out *= vin[1] / vin[0]
        biases += [b for _, b in moe["ins"] if b is not None] + ([bd] if bd is not None else [])
        fields_ = dict(moe["fields"])
        if moe.get("glu") is not None and len(vin) == 2 and vin[1] > 0:  # (u + 1): c^2 / r
            fields_["glu_shift"] = vin[0] / vin[1]
        own = {id(x) for x in moe["module"].modules()}
        shared = [m for m in parts.rest if id(m) in own and m is not moe["router"]]
        sgate = [m for m in shared if matrix(m)[0].shape[0] == 1]
        sh = self._mlp([m for m in shared if m not in sgate])
        if sh:
            ins, (Wo, _), gm = sh
            g2 = (torch.ones(ins[0][0].shape[1], dtype=torch.float64) if gm is None
                  else torch.as_tensor(gm)).square()
            sv = [float((_col_sq(W) * g2).sum() / W.shape[0]) for W, _ in ins]
            so = float(_col_sq(Wo).sum() / Wo.shape[0])
            if len(sv) == 2 and sv[0] > 0:
                so *= sv[1] / sv[0]
            fields_.update(moe_shared_var_in=sv[0], moe_shared_var_out=so)
            if sgate:
                Wg = matrix(sgate[0])[0].to(torch.float64).cpu()
                fields_["moe_shared_gate_var"] = float((Wg.square() * g2).sum())
        return var_in, var_out, fields_

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
