"""Fixes applied to HuggingFace models: ``apply_fix`` (exported as
``sigprop.models.loading.apply_fix``).

Four fixes, each chosen so that the patched model survives ``save_pretrained`` and a reload
without ``trust_remote_code``:

* ``beta``: Q and K weights (and biases) are multiplied by ``sqrt(r)`` each, ``r = beta_new /
  beta_now``, so the score std sigma_s = sigma_q sigma_k d scales by ``r`` (docs/theory.md §2.1).
  This
  is a rescaling of the weights at hand (via :func:`sigprop.nn.init.scale_linear_`), so it works
  for a model at init and for trained weights alike; for a model at init it is the REM draw at
  the new beta. It lives in the weights: any loader gets it.
* ``alpha_attn``: the attention skip strength ``alpha`` (block ``LN(alpha x + A(x))`` post-LN,
  ``alpha x + A(LN x)`` pre-LN, docs/theory.md §2.4) is absorbed into the weights through the
  LayerNorm's scale invariance, so stock HF code computes it exactly (up to LN's epsilon):
  post-LN ``LN(alpha x + A(x)) = LN(x + A(x)/alpha)``: the attention output projection (weight
  and bias) is divided by ``alpha``. Pre-LN, write the stream as ``x = s x'`` with a cumulative
  scale ``s`` (1 at the embeddings): block ``l`` then reads ``x' + A(LN x')/(alpha s)`` and
  ``s <- alpha s``, so every branch output projection after the first skip is divided by the
  running ``s`` (the final norm is scale invariant too). No-LN models cannot absorb it.
* ``centred`` (A - 11^T/n on each row's visible keys, mindthegap; docs/theory.md §2.4) and a
context-
  length ``scaling`` (docs/theory.md §3.2: the logits times ``score_multiplier(kind, n_keys)``) act
  at
  run time: they are computed by the ``"sigprop"`` attention function registered with
  ``transformers.AttentionInterface`` when this module is imported. The model's config records
  them as ``config.sigprop_fix`` (saved in config.json); :func:`sigprop.models.from_pretrained` (and
  ``sigprop diagnose DIR``) reload with ``attn_implementation="sigprop"``. A plain
  ``AutoModel.from_pretrained(DIR)`` without sigprop keeps the beta and alpha fixes (weights)
  and silently loses these two: load through sigprop, or pass ``attn_implementation="sigprop"``
  after ``import sigprop.models.fixes``.


``config.sigprop_fix`` also lets :func:`sigprop.models.loading.spec_from_config` describe the
patched
model (Q/K std, alpha, attention variant, scaling), so the theory sits beside the measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..spec import ArchSpec, SpecError, check_float, score_multiplier

FIX_VERSION = 1
#: ``alpha_attn="auto"`` aims this far below ``rho_max`` on the predicted final cosine, so that
#: the measured model (finite width and T; measured cos sits within ~0.06 of theory in the
#: agreement tests) lands on the trainable side of the threshold too.
AUTO_MARGIN = 0.1
RUNTIME_KEYS = ("attention", "scaling")
ATTN_NAME = "sigprop"


@dataclass
class FixReport:
    """What :func:`apply_fix` did: specs before and after, the record stored in the config,
    one line per change, and the theory's final cosine and verdict before and after."""

    before: ArchSpec
    after: ArchSpec
    record: dict[str, Any]
    changes: list[str] = field(default_factory=list)
    predicted: dict[str, Any] = field(default_factory=dict)
    #: registered methods applied (:mod:`.methods`): name and resolved parameters
    methods: list[dict[str, Any]] = field(default_factory=list)
    #: one line per applied part the theory does not reach
    measured_only: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before.to_dict(), "after": self.after.to_dict(),
                "record": self.record, "changes": self.changes, "predicted": self.predicted,
                "methods": self.methods, "measured_only": self.measured_only}


# --------------------------------------------------------------------------------------------
# the runtime attention function
# --------------------------------------------------------------------------------------------
def _options(module: nn.Module) -> dict[str, Any]:
    cfg = getattr(module, "config", None)
    rec = getattr(cfg, "sigprop_fix", None)
    return rec if isinstance(rec, dict) else {}


def _allowed(module, mask, Tq: int, Tk: int, device) -> tuple[torch.Tensor | None, Any]:
    """(bool mask of visible keys broadcastable to (B, H, Tq, Tk) or None, additive mask)."""
    if mask is None:
        if getattr(module, "is_causal", False) and Tq > 1:
            return torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril(Tk - Tq), None
        return None, None
    if mask.dtype == torch.bool:
        return mask, None
    return mask > torch.finfo(mask.dtype).min / 2, mask


def _method_ops(module: nn.Module) -> list:
    """``(method, params)`` of the recorded methods acting inside the attention function."""
    from .methods.base import recorded

    cfg = getattr(module, "config", None)
    return [(m, p) for m, p in recorded(cfg) if m.attention_ops] if cfg is not None else []


def sigprop_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """HF attention interface ``(B, H, T, dh)`` tensors -> ``(out (B, T, H, dh), probs)``.

    Softmax attention with the module's ``scaling`` times ``score_multiplier(kind, n)`` for
    each row's number ``n`` of visible keys (docs/theory.md §3.2), then the score hooks of the
    recorded methods (soft-capping, docs/fixes.md), the mask, the softmax (or the one
    recorded method that replaces it: sigmoid attention, softpick, sinks, differential
    attention), then, if centred, ``A - 1/n`` on the visible keys (docs/theory.md §2.4), the
    recorded methods' hooks on the attention matrix (shaped attention) and on the heads'
    outputs. Options come from ``module.config.sigprop_fix``. The returned probabilities are
    the softmax's (before centring or shaping), so probes read ipr / entropy from them; with
    a replaced softmax each row's shares ``|w| / sum |w|``. Causality: the mask, or
    ``module.is_causal`` when HF passes no mask. GQA heads repeat."""
    opts = _options(module)
    ops = _method_ops(module)
    H, Tq, dh = query.shape[1], query.shape[2], query.shape[3]
    Tk = key.shape[2]
    if key.shape[1] != H:
        rep = H // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    scale = dh ** -0.5 if scaling is None else float(scaling)
    work = torch.promote_types(query.dtype, torch.float32)  # half precision: float32 logits
    allowed, additive = _allowed(module, attention_mask, Tq, Tk, query.device)
    n_keys = (allowed.sum(-1, keepdim=True).clamp_min(1) if allowed is not None
              else torch.full((1,), Tk, device=query.device))
    kind = opts.get("scaling") or "none"
    mult = None
    if kind != "none":
        n_np = n_keys.detach().cpu().numpy().astype(np.float64)
        mult = score_multiplier(kind, n_np, opts.get("scaling_param"))

    def prepare(scores):
        """Scaled logits -> the length scaling, the methods' score hooks, the masks."""
        if mult is not None:
            scores = scores * torch.as_tensor(mult, dtype=scores.dtype, device=scores.device)
        for m, p in ops:
            scores = m.scores(module, scores, p)
        if additive is not None:
            scores = scores + additive.to(work)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        return scores

    q, k = query.to(work), key.to(work)
    own = [(m, p) for m, p in ops if m.replaces_softmax]
    if len(own) > 1:
        raise SpecError("method", f"{own[0][0].name} and {own[1][0].name} each replace the "
                                  "softmax; apply one of them")
    if own:  # the method's map; probes read where each row's weight goes, |w| / sum |w|
        weights = own[0][0].attend(module, q, k, scale, prepare, allowed, n_keys, own[0][1])
        probs = _row_shares(weights, allowed)
    else:
        probs = torch.softmax(prepare(torch.matmul(q, k.transpose(-1, -2)) * scale), dim=-1)
        weights = probs
    if opts.get("attention") == "centred":
        vis = allowed.to(probs.dtype) if allowed is not None else 1.0
        weights = probs - vis / n_keys.to(probs.dtype)
    for m, p in ops:
        weights = m.weights(module, weights, allowed, n_keys, p)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights.to(value.dtype), value)
    for m, p in ops:
        out = m.output(module, out, p)
    return out.transpose(1, 2).contiguous(), probs.to(query.dtype)


def _row_shares(weights: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Each row's share of its absolute weight per key, ``|w| / sum |w|`` (a probability row
    the probes read for maps that are not a softmax: sigmoid rows, softpick, sinks, a
    difference of softmaxes); uniform over the visible keys where a row has no weight."""
    a = weights.abs()
    tot = a.sum(-1, keepdim=True)
    vis = (allowed if allowed is not None else torch.ones_like(a[..., :1, :], dtype=torch.bool))
    uni = vis.to(a.dtype) / vis.to(a.dtype).sum(-1, keepdim=True).clamp_min(1)
    return torch.where(tot > 0, a / tot.clamp_min(torch.finfo(a.dtype).tiny), uni)


def register_attention() -> None:
    """Register :func:`sigprop_attention` as ``attn_implementation="sigprop"`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, sigprop_attention)


def needs_runtime(config) -> bool:
    """True if ``config.sigprop_fix`` asks for centred attention, a length scaling or a
    method acting inside the attention function (:mod:`.methods`)."""
    from .methods.base import needs_attention

    rec = getattr(config, "sigprop_fix", None)
    return isinstance(rec, dict) and (rec.get("attention") == "centred"
                                      or (rec.get("scaling") or "none") != "none"
                                      or needs_attention(config))


def set_runtime_attention(model: nn.Module) -> None:
    """Switch ``model`` to the ``"sigprop"`` attention function."""
    register_attention()
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(ATTN_NAME)
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = ATTN_NAME


# --------------------------------------------------------------------------------------------
# spec-level resolution (pure: no weights touched)
# --------------------------------------------------------------------------------------------
def auto_alpha(spec: ArchSpec, rho0: float) -> float:
    """The smallest alpha_attn whose predicted final cosine is ``AUTO_MARGIN`` below
    ``rho_max`` (docs/theory.md §2.7's alpha_crit at the threshold rho_max - margin); the current
    alpha if that is already enough."""
    from ..theory import diagram

    target = spec.replace(rho_max=max(spec.rho_max - AUTO_MARGIN, 0.05))
    a = float(diagram.alpha_crit(target, rho0=rho0)[0])
    if not math.isfinite(a):
        raise SpecError("alpha_attn", f"no alpha_attn up to {diagram.ALPHA_CEILING:g} keeps the "
                                      f"final cosine below {target.rho_max:g} at depth "
                                      f"{spec.depth}; lower beta or use --centred")
    return max(a, spec.alpha_attn)


def resolve(spec: ArchSpec, *, beta: float | None = None, alpha_attn: float | str | None = None,
            centred: bool = False, scaling: str | None = None,
            scaling_param: float | None = None, rho0: float | None = None) -> ArchSpec:
    """The spec after the fix: scaling and centring, then beta (as ``--beta`` everywhere:
    before the length multiplier, docs/theory.md §2.1), then alpha (so ``auto`` sees the new
    beta)."""
    r0 = spec.rho_init if rho0 is None else float(rho0)
    new = spec
    if scaling is not None and scaling != "none":
        if spec.scaling not in ("none", scaling):
            raise SpecError("scaling", f"the model already multiplies its logits ({spec.scaling}"
                                       f"); a second length scaling is not supported")
        new = new.replace(scaling=scaling, scaling_param=scaling_param)
    if centred:
        new = new.replace(attention="centred")
    if beta is not None:  # after the scaling, so that beta is the effective one at seq_len
        check_float("beta", beta, 0.0, 1e4, lo_open=True)
        new = new.with_beta(float(beta))
    if alpha_attn is not None:
        if alpha_attn == "auto":
            a = auto_alpha(new, r0)
        else:
            check_float("alpha_attn", alpha_attn, 0.0, 1e4, lo_open=True)
            a = float(alpha_attn)
        if a != spec.alpha_attn and spec.norm == "none":
            raise SpecError("alpha_attn", "residual scaling is absorbed through LayerNorm's "
                                          "scale invariance; this model has no LayerNorm")
        new = new.replace(alpha_attn=a)
    return new


# --------------------------------------------------------------------------------------------
# applying it to a model
# --------------------------------------------------------------------------------------------
def _qk_targets(entry: dict[str, Any]) -> list[tuple[str, tuple[int, int] | None, int]]:
    if entry.get("qkv") is not None:
        if entry.get("fused") != "concat":
            raise SpecError("beta", f"{entry['qkv']}: fused Q/K/V layout "
                                    f"{entry.get('fused')!r} cannot be split")
        sl, ax = entry["qkv_slices"], entry["out_axis"]
        return [(entry["qkv"], sl["q"], ax), (entry["qkv"], sl["k"], ax)]
    if entry.get("q") is None or entry.get("k") is None:
        raise SpecError("beta", f"{entry['block']}: no Q/K projections found")
    return [(entry["q"], None, 0), (entry["k"], None, 0)]


@torch.no_grad()
def apply_fix(model: nn.Module, *, beta: float | None = None,
              alpha_attn: float | str | None = None, centred: bool = False,
              scaling: str | None = None, scaling_param: float | None = None,
              seq_len: int | None = None, rho0: float | None = None,
              spec: ArchSpec | None = None) -> FixReport:
    """Patch an HF model in place (module docstring) and record the fix in ``model.config``.

    ``beta`` is gg25's beta at ``seq_len`` (default the config's length, as ``diagnose``);
    ``alpha_attn`` a number or ``"auto"`` (:func:`auto_alpha`, at input cosine ``rho0``,
    default the architecture's); ``scaling`` one of docs/theory.md §3.2's kinds with its
    parameter. ``spec``: the model's spec read from its weights (``Diagnosis.spec``, per-layer
    ``layers``); then ``beta`` rescales each layer's Q and K so that *its* beta becomes the
    target (trained or rescaled weights), and the predictions use those weights. Without it
    the spec comes from the config (weights at their HF init)."""
    from ..nn.init import scale_linear_
    from ..theory import depth
    from .arch import spec_and_info
    from .names import qkv_names

    before, info = spec_and_info(model.config, seq_len)
    if spec is not None:
        if spec.depth != before.depth:
            raise SpecError("spec", f"has depth {spec.depth}, the model {before.depth}")
        before = spec
    if beta is not None and info.qk_norm:
        raise SpecError("beta", "this model RMS-normalises q and k per head (QK-norm): the "
                                "Q/K weights do not set beta")
    after = resolve(before, beta=beta, alpha_attn=alpha_attn, centred=centred, scaling=scaling,
                    scaling_param=scaling_param, rho0=rho0)
    names = qkv_names(model)
    mods = dict(model.named_modules())
    changes: list[str] = []
    # the weights carry the score scale before the length multiplier (applied at run time)
    per = len(before.layers) // len(names) if before.layers is not None and names else 1
    ratios = [float(np.sqrt(np.mean(after.layer_sigma(i * per + 1) ** 2)
                            / np.mean(before.layer_sigma(i * per + 1) ** 2)))
              if np.mean(before.layer_sigma(i * per + 1) ** 2) > 0 else 1.0
              for i in range(len(names))]
    if beta is not None and any(r != 1.0 for r in ratios):
        for entry, r in zip(names, ratios, strict=True):
            for name, sl, ax in _qk_targets(entry):
                scale_linear_(mods[name], math.sqrt(r), out_slice=sl, out_axis=ax)
        lo, hi = min(ratios), max(ratios)
        x = f"x{math.sqrt(lo):.4g}" if hi == lo else \
            f"x{math.sqrt(lo):.4g} .. x{math.sqrt(hi):.4g} per layer"
        changes.append(f"Q and K weights {x}: beta {before.beta_eff:.4g} -> "
                       f"{after.beta_eff:.4g} at T={before.seq_len}")
    ratio = after.alpha_attn / before.alpha_attn
    if ratio != 1.0:
        s = 1.0
        for entry in names:
            o = entry.get("o")
            if o is None:
                raise SpecError("alpha_attn", f"{entry['block']}: no attention output "
                                              "projection found")
            s *= ratio
            scale_linear_(mods[o], 1.0 / (ratio if before.norm == "post" else s))
            if before.norm == "pre":
                out = entry.get("mlp_out")
                if out is None:
                    raise SpecError("alpha_attn", f"{entry['block']}: no MLP output "
                                                  "projection found")
                scale_linear_(mods[out], 1.0 / s)
        how = ("attention output projections / alpha" if before.norm == "post" else
               "branch output projections / alpha^l (pre-LN stream rescaled)")
        changes.append(f"alpha_attn {before.alpha_attn:.4g} -> {after.alpha_attn:.4g}: {how}")
    rec = dict(getattr(model.config, "sigprop_fix", None) or {})
    rec.update(version=FIX_VERSION, alpha_attn=after.alpha_attn, attention=after.attention,
               seq_len=before.seq_len)
    if beta is not None:  # the i.i.d. Q/K std of this beta (a config-only reader's view)
        qk = after.qk_std if after.qk_std is not None else math.sqrt(
            float(beta) * math.sqrt(math.log(after.seq_len)) / after.multiplier
            / after.d_model)
        rec.update(qk_std=qk, beta=float(beta))
    if scaling is not None and scaling != "none":  # the model's own multiplier is not ours
        rec.update(scaling=scaling, scaling_param=scaling_param)
    if after.attention != before.attention:
        changes.append("centred attention (A - 11^T/n) via attn_implementation='sigprop'")
    if after.scaling != before.scaling:
        changes.append(f"length scaling {after.scaling} (param {after.scaling_param}) via "
                       "attn_implementation='sigprop'")
    model.config.sigprop_fix = rec
    if needs_runtime(model.config):
        set_runtime_attention(model)
    r0 = before.rho_init if rho0 is None else float(rho0)
    predicted = {k: {"final_cos": float(depth.final_cos(s, rho0=r0)),
                     "verdict": depth.verdict(s, rho0=r0)}
                 for k, s in (("before", before), ("after", after))}
    return FixReport(before, after, rec, changes or ["nothing to change"], predicted)


# importing the loader (``sigprop.models``) registers the attention function, so a folder
# written by ``sigprop fix`` also loads with ``AutoModel.from_pretrained(DIR,
# attn_implementation="sigprop")`` (methods with hooks or parameters need
# :func:`sigprop.models.reload.from_pretrained`)
register_attention()
