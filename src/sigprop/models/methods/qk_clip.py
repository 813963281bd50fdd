"""qk-clip: after each optimizer step, every head whose largest pre-softmax logit of the step's
forward pass, ``S_max``, passed ``tau`` has its query and key weights rescaled so that its
logits scale by ``gamma = tau / S_max`` (Kimi Team 2025, Kimi K2's MuonClip; Megatron-LM's
``--qk-clip``; docs/fixes.md). Heads at or below ``tau`` are untouched.

Per layout (the sites are the probe's, :func:`sigprop.measurement.probe_sites.find_attention`
on each block of :func:`~sigprop.measurement.probe_sites.find_blocks`, or MLA as the weight
reader finds it, :func:`sigprop.measurement.weights_mla.find_mla`):

* one K head per query head (split ``nn.Linear`` maps, fused ``[q | k | v]`` as GPT-2's
  ``Conv1D``, per-head interleaved ``(H, 3, d_H)``): the head's W_Q rows times
  ``gamma^alpha`` and its W_K rows times ``gamma^(1 - alpha)``. A bias is part of the map:
  ``q = W x + b`` becomes ``gamma^alpha q`` only if the head's bias entries scale with its
  rows, so they do (the key's likewise), and the head's logits scale exactly by ``gamma``
  for any input (RoPE and the logit scale are linear in q and k).
* grouped K/V heads (GQA, multi-query): a K head's rows serve every query head of its group,
  so only the clipped head's W_Q rows (and bias) scale, by the whole ``gamma``; ``alpha``
  does not apply (the result says ``q only (grouped K/V)``).
* multi-head latent attention (DeepSeek-V2/V3, Kimi K2): each head's query is
  ``[q_C | q_R]`` (content, rotary) from the query up-projection (or the one query map) and
  its key ``[k_C | k_R]`` with ``k_C`` a per-head row block of the latent's up-projection and
  ``k_R`` one rotary key shared by all heads. Kimi's rule, with ``alpha``: ``q_C`` times
  ``gamma^alpha``, ``k_C`` times ``gamma^(1 - alpha)``, ``q_R`` times ``gamma``, the shared
  ``k_R`` as it is: ``q_C.k_C + q_R.k_R`` scales by ``gamma`` (the RMSNorms sit before these
  maps, so their outputs scale exactly).
* QK-norm (the model's ``q_norm``/``k_norm`` after W_Q and W_K, sigprop's ``qk-norm``
  method, or a norm inside a wrapped projection): rescaling W_Q / W_K leaves the scores as
  they are, so those heads are reported ``skipped: QK-norm`` and nothing changes (Kimi
  notes QK-norm makes the clip unnecessary).

Non-finite maxima are never applied, and are reported. At init nothing changes: the method
records its parameters in ``config.sigprop_fix["after_step"]`` and the training loop calls
:meth:`QKClip.after_step` after each optimizer step. Theory: measured only (training
dynamics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ...spec import SpecError
from .base import Method, Param, recorded_entry, register
from .head_rows import head_rows, linear_of

#: the key of ``config.sigprop_fix`` listing the methods a training loop calls after each
#: optimizer step, each ``{"name": ..., "params": {...}}``
AFTER_STEP = "after_step"

HOW_QK = "q^a k^(1-a)"
HOW_GROUPED = "q only (grouped K/V)"
HOW_MLA = "q_C^a k_C^(1-a), q_R by gamma, shared k_R as is (MLA)"
HOW_QK_NORM = "skipped: QK-norm"
HOW_NON_FINITE = "skipped: non-finite"


def attention_layers(model) -> list[tuple[str, Any]]:
    """``[(block name, site), ...]``: the blocks of :func:`find_blocks` that hold an attention
    site (:func:`find_attention`, else MLA's :func:`find_mla`), in order; index ``i`` of this
    list is attention layer ``i`` of :func:`qk_clip_`'s ``max_logits``."""
    from ...measurement.probe_sites import find_attention, find_blocks
    from ...measurement.weights_mla import find_mla

    out = []
    for name, block in find_blocks(model):
        site = find_attention(block, None, name) or find_mla(block, name)
        if site is not None:
            out.append((name, site))
    return out


def check_tau_alpha(tau: float, alpha: float) -> tuple[float, float]:
    """``(tau, alpha)`` as floats, or a one-line SpecError naming ``qk_clip.tau`` /
    ``qk_clip.alpha``."""
    try:
        t = float(tau)
    except (TypeError, ValueError):
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        raise SpecError("qk_clip.tau", f"must be a positive finite number (got {tau!r})")
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        a = math.nan
    if not (math.isfinite(a) and 0.0 <= a <= 1.0):
        raise SpecError("qk_clip.alpha", f"must be a number in [0, 1] (got {alpha!r})")
    return t, a


def _maxima(max_logits, layers) -> dict[int, torch.Tensor]:
    """``max_logits`` checked against ``layers``: per layer index a float64 vector of its
    heads' maxima."""
    if not isinstance(max_logits, Mapping):
        raise SpecError("qk_clip.max_logits", "must be a mapping {attention layer index: "
                                              "per-head max logits}")
    out = {}
    for key, vals in max_logits.items():
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < len(layers):
            raise SpecError("qk_clip.max_logits", f"layer {key!r} is not an attention layer "
                                                  f"index in [0, {len(layers) - 1}]")
        try:
            v = torch.as_tensor(vals.detach() if torch.is_tensor(vals) else vals)
            v = v.to("cpu", torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise SpecError("qk_clip.max_logits", f"layer {key}: not a sequence of numbers "
                                                  f"({type(vals).__name__})") from None
        heads = layers[key][1].n_heads
        if v.ndim != 1 or v.numel() != heads:
            raise SpecError("qk_clip.max_logits", f"layer {key}: {tuple(v.shape)} values for "
                                                  f"{heads} heads (one per head, 1-D)")
        out[key] = v
    return out


def _proj(module, block: str, role: str):
    got = linear_of(module)
    if got is None:
        raise SpecError("qk_clip", f"{block}: {role} projection {type(module).__name__} is not "
                                   "a linear layer sigprop can rescale")
    return got


def has_qk_norm(site) -> bool:
    """q or k normalised after its projection: the model's own norms, sigprop's qk-norm
    hook, or a norm inside a wrapped projection."""
    from .parts import is_norm

    if site.q_post is not None or site.k_post is not None:
        return True
    for role, m in (("q", site.q), ("k", site.k)):
        if any(hasattr(x, f"sigprop_{role}_norm") for x in m.modules()):
            return True
        if linear_of(m) is not None and linear_of(m)[0] is not m and \
                any(is_norm(x) for x in m.modules()):
            return True
    return False


def _plan_head(site, block: str, head: int, gamma: float, alpha: float):
    """``(how, [(module, factor, (lo, hi), out_axis), ...])`` for one head above tau."""
    from ...measurement.weights_mla import MLASite

    if isinstance(site, MLASite):
        dqk, dk = site.nope + site.rope, site.nope + site.v_head_dim
        qm, q_ax = _proj(site.q_b if site.q_b is not None else site.q, block, "query")
        km, k_ax = _proj(site.v, block, "key/value up-")
        lo = head * dqk
        return HOW_MLA, [(qm, gamma ** alpha, (lo, lo + site.nope), q_ax),
                         (qm, gamma, (lo + site.nope, lo + dqk), q_ax),
                         (km, gamma ** (1 - alpha), (head * dk, head * dk + site.nope), k_ax)]
    qm, q_ax = _proj(site.q, block, "query")
    if site.n_kv_heads != site.n_heads:  # a K head serves its group: the query takes it all
        return HOW_GROUPED, [(qm, gamma, head_rows(site, head, "q"), q_ax)]
    km, k_ax = _proj(site.k, block, "key")
    return HOW_QK, [(qm, gamma ** alpha, head_rows(site, head, "q"), q_ax),
                    (km, gamma ** (1 - alpha), head_rows(site, head, "k"), k_ax)]


def qk_clip_(model, max_logits, tau: float = 100.0, alpha: float = 0.5) -> list[dict]:
    """QK-Clip in place (module docstring). ``max_logits``: ``{attention layer index:
    per-head max logits}`` (layer ``i``: the ``i``-th block of
    :func:`~sigprop.measurement.probe_sites.find_blocks` with an attention site,
    :func:`attention_layers`; one value per query head, the largest pre-softmax logit of the
    step's forward pass, after the logit scale). Every argument is checked before any weight
    moves (SpecError naming ``qk_clip.tau``, ``qk_clip.alpha``, ``qk_clip.max_logits`` or
    ``qk_clip``).

    Returns one dict per clipped or skipped head: ``layer``, ``head``, ``block`` (the block's
    name), ``max_logit``, ``gamma`` (the factor on its logits; None where skipped) and
    ``how`` (:data:`HOW_QK`, :data:`HOW_GROUPED`, :data:`HOW_MLA`, :data:`HOW_QK_NORM`,
    :data:`HOW_NON_FINITE`). Heads at or below ``tau`` are neither touched nor listed."""
    from ...nn.init import scale_linear_

    tau, alpha = check_tau_alpha(tau, alpha)
    layers = attention_layers(model)
    maxima = _maxima(max_logits, layers)
    report, plan = [], []
    for layer in sorted(maxima):
        block, site = layers[layer]
        qk_norm = has_qk_norm(site)
        for head, s in enumerate(maxima[layer].tolist()):
            row = {"layer": layer, "head": head, "block": block, "max_logit": s,
                   "gamma": None}
            if not math.isfinite(s):
                report.append({**row, "how": HOW_NON_FINITE})
            elif s > tau and qk_norm:
                report.append({**row, "how": HOW_QK_NORM})
            elif s > tau:
                gamma = tau / s
                how, ops = _plan_head(site, block, head, gamma, alpha)
                report.append({**row, "gamma": gamma, "how": how})
                plan += ops
    with torch.no_grad():
        for module, factor, rows, axis in plan:
            if factor != 1.0:
                scale_linear_(module, factor, out_slice=rows, out_axis=axis)
    return report


def qk_clip_own_(attention, max_logits, tau: float = 100.0, alpha: float = 0.5
                 ) -> list[dict]:
    """QK-Clip in place on one layer of sigprop's own stack
    (:class:`sigprop.nn.attention.BatchedAttention`: ``S`` stacked initialisations, W_Q and
    W_K ``(S, d, d)`` with head ``h`` the ``h``-th block of ``d_H`` columns, no Q/K bias).
    ``max_logits``: ``(S, H)`` (or ``(H,)`` for ``S = 1``), each slice's own largest logit
    per head (the telemetry's ``slice:max_logit``): a slice is an independent run, so each
    is clipped by its own factor: its head's W_Q columns times ``gamma^alpha`` and W_K
    columns times ``gamma^(1 - alpha)``, ``gamma = tau / S_max``, and that slice's logits of
    that head scale by exactly ``gamma`` (the score factor ``m(n) / sqrt(d_H)`` is applied
    after the projections). Returns one dict per clipped or non-finite (slice, head):
    ``slice``, ``head``, ``max_logit``, ``gamma`` (None where skipped), ``how``."""
    tau, alpha = check_tau_alpha(tau, alpha)
    S, H, dh = attention.n_seeds, attention.heads, attention.d_head
    m = torch.as_tensor(max_logits, dtype=torch.float64).detach().cpu()
    if m.dim() == 1 and S == 1:
        m = m[None]
    if tuple(m.shape) != (S, H):
        raise SpecError("qk_clip.max_logits", f"need ({S}, {H}) values (slices, heads) for "
                                              f"this layer (got {tuple(m.shape)})")
    finite = torch.isfinite(m)
    gamma = torch.where(finite & (m > tau), tau / m, torch.ones_like(m))
    report = []
    for s_, h in torch.nonzero(~finite | (m > tau)).tolist():
        ok = bool(finite[s_, h])
        report.append({"slice": s_, "head": h, "max_logit": float(m[s_, h]),
                       "gamma": float(gamma[s_, h]) if ok else None,
                       "how": HOW_QK if ok else HOW_NON_FINITE})
    if any(r["gamma"] is not None for r in report):
        with torch.no_grad():  # (S, 1, H, 1) factors on the (S, d, H, d_H) column blocks
            for w, power in ((attention.w_q, alpha), (attention.w_k, 1.0 - alpha)):
                f = gamma.pow(power).to(w.dtype).to(w.device)
                w.view(S, w.shape[1], H, dh).mul_(f[:, None, :, None])
    return report


def recorded_clip(config) -> dict[str, Any] | None:
    """The qk-clip parameters a config records (``sigprop_fix["after_step"]``), or None."""
    return recorded_entry(config, AFTER_STEP, QKClip.name)


@register
class QKClip(Method):
    name = "qk-clip"
    #: acts through training only: at init the model is the baseline itself
    training_only = True
    params = (
        Param("tau", "threshold on each head's max pre-softmax logit (Kimi K2: 100)", 100.0,
              lo=1e-3, hi=1e6),
        Param("alpha", "share of the factor on W_Q (gamma^alpha), the rest on W_K", 0.5,
              lo=0.0, hi=1.0),
    )

    def apply(self, model, parts, params, ctx, effect):
        cfg = getattr(model, "config", None)
        if cfg is not None:
            rec = dict(getattr(cfg, "sigprop_fix", None) or {})
            rec[AFTER_STEP] = [e for e in rec.get(AFTER_STEP) or [] if e.get("name") != self.name
                               ] + [{"name": self.name, "params": dict(params)}]
            cfg.sigprop_fix = rec
        return [f"nothing changes at init; after each optimizer step (after_step) every head "
                f"whose max logit S passed tau = {params['tau']:.4g} gets its logits times "
                f"tau / S (W_Q rows ^alpha, W_K rows ^(1 - alpha), alpha = "
                f"{params['alpha']:.4g})"]

    def after_step(self, model, max_logits, params: dict[str, Any] | None = None
                   ) -> list[dict]:
        """The training loop's hook after each optimizer step: :func:`qk_clip_` with
        ``params`` (``tau``, ``alpha``; defaults where missing; checked as the registry
        checks them)."""
        given = dict(params or {})
        known = {p.name: p for p in self.params}
        for k in given:
            if k not in known:
                raise SpecError(f"{self.name}.{k}", "unknown parameter; qk-clip takes: tau, "
                                                    "alpha")
        p = {k: q.check(self.name, given.get(k, q.default)) for k, q in known.items()}
        return qk_clip_(model, max_logits, tau=p["tau"], alpha=p["alpha"])
