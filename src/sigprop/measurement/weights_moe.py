"""Mixtures of experts for the weight reader (:mod:`.weights`, docs/theory.md §2.5.2): the
router (a child whose 2-D ``weight`` is ``(E, d)``) and its E experts, stacked 3-D parameters
or a ModuleList of MLPs (:func:`find_moe`), the routing rule measured from the router's output
in the forward pass or taken from the config, and the experts' and shared expert's variances
(:func:`moe_variances`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from .weight_maps import col_sq, is_norm, matrix


def router_weight(m: nn.Module) -> torch.Tensor | None:
    """A router candidate's ``(E, d)`` weight: a module's own 2-D ``weight`` that
    :func:`.weight_maps.matrix` does not take as a linear map (HF's ``*TopKRouter``), or a
    Linear named as a gate whose siblings hold experts (checked in :func:`find_moe`)."""
    w = getattr(m, "weight", None)
    if isinstance(w, torch.Tensor) and w.ndim == 2 and matrix(m) is None and not is_norm(m):
        return w.detach()
    return None


def detach_output(out):
    if torch.is_tensor(out):
        return out.detach()
    if isinstance(out, tuple | list):
        return type(out)(detach_output(x) for x in out)
    return None


def clamped_glu(mod: nn.Module) -> tuple[float, float] | None:
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
        if W.shape[1] == 2 * ff and clamped_glu(mod) is not None:  # interleaved g, u
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


def find_moe(block: nn.Module, d: int, *, router_out: dict, config,
             gains_before: Callable[[nn.Module], np.ndarray | None]) -> dict | None:
    """A mixture-of-experts MLP in ``block`` (module docstring): ``{"fields": LayerSpec
    moe_* values, "ins", "out": expert tensors (E, out, in), "module", "router", "source",
    "gains", "glu"}``, or None. ``router_out``: id(router candidate) -> its first output in
    the forward pass; ``config``: the model's (the routing rule without such an output);
    ``gains_before(router)``: the gains of the norm in front of the router, or None."""
    for mod in block.modules():
        for name, child in mod.named_children():
            W = router_weight(child)
            if W is None and matrix(child) is not None and any(
                    t in name.lower() for t in ("gate", "router")):
                W = matrix(child)[0]  # a Linear router (named gate / router)
            if W is None or W.ndim != 2 or W.shape[1] != d or not 2 <= W.shape[0] != d:
                continue
            E = int(W.shape[0])
            ex = _stacked_experts(mod, E, d) or _listed_experts(mod, E, d)
            if ex is None:
                continue
            k, weighting, scale, src = _routing_rule(router_out.get(id(child)), E, config)
            g = gains_before(child)
            G = torch.ones(d, dtype=torch.float64) if g is None else torch.as_tensor(g)
            Wr = W.to(torch.float64).cpu() * G
            fields_ = dict(moe_experts=E, moe_top_k=min(k, E),
                           moe_router_var=float(Wr.pow(2).sum() / E),
                           moe_weighting=weighting, moe_scale=scale)
            return {"fields": fields_, "ins": ex[0], "out": ex[1], "module": mod,
                    "router": child, "source": src, "gains": G,
                    "glu": clamped_glu(mod)}
    return None


def moe_variances(moe: dict, rest: list[nn.Module], biases: list,
                  mlp: Callable[[list[nn.Module]], tuple | None]) -> tuple[float, float, dict]:
    """``(var_w_in, var_w_out, LayerSpec moe fields)`` of a mixture of experts
    (:func:`find_moe`): the experts' variances averaged over experts (a gated expert's up
    branch folded into ``var_w_out`` as for a dense MLP), the shared expert from the block's
    linear maps ``rest`` inside the MoE module (a 1-output map among them: its sigmoid gate),
    read by ``mlp`` (the reader's dense-MLP maps). The experts' biases are appended to
    ``biases``."""
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
    shared = [m for m in rest if id(m) in own and m is not moe["router"]]
    sgate = [m for m in shared if matrix(m)[0].shape[0] == 1]
    sh = mlp([m for m in shared if m not in sgate])
    if sh:
        ins, (Wo, _), gm = sh
        g2 = (torch.ones(ins[0][0].shape[1], dtype=torch.float64) if gm is None
              else torch.as_tensor(gm)).square()
        sv = [float((col_sq(W) * g2).sum() / W.shape[0]) for W, _ in ins]
        so = float(col_sq(Wo).sum() / Wo.shape[0])
        if len(sv) == 2 and sv[0] > 0:
            so *= sv[1] / sv[0]
        fields_.update(moe_shared_var_in=sv[0], moe_shared_var_out=so)
        if sgate:
            Wg = matrix(sgate[0])[0].to(torch.float64).cpu()
            fields_["moe_shared_gate_var"] = float((Wg.square() * g2).sum())
    return var_in, var_out, fields_
