"""Every fix sigprop applies, as one registry (docs/fixes.md): a method is one module here
holding one registered :class:`~.base.Method` (its parameters and their depth- and
T-dependent defaults, its HF patch, its restore for a saved folder, its effect on the theory's
per-layer spec). :func:`apply_methods` patches a model and records the methods in
``config.sigprop_fix["methods"]``; :func:`restore_methods` re-installs the runtime parts on a
model built from such a config (:func:`sigprop.models.model_at_init`,
:func:`sigprop.models.from_pretrained` call it).

Adding a method: one module with a ``@register``-ed subclass, imported below, and its row in
``tests/models/test_methods.py``'s definitions (the reload and theory tests run over the
registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...spec import ArchSpec, SpecError
from . import (  # noqa: F401 - each module registers its method
    admin,
    deepnorm,
    deepscalelm,
    depth_mup,
    diff_attn,
    dyt,
    gated_attn,
    hyper_connections,
    layerscale,
    ln_scaling,
    mimetic,
    mix_ln,
    ngpt,
    own,
    peri_ln,
    qk_clip,
    qk_norm,
    rezero,
    shaped,
    sigma_reparam,
    sigmoid_attn,
    sinks,
    skipinit,
    softcap,
    softpick,
    tfixup,
    value_residual,
    z_loss,
)
from .base import (
    RECORD_KEY,
    REGISTRY,
    Context,
    Effect,
    Method,
    Param,
    get,
    needs_attention,
    recorded,
    register,
    theory_spec,
)
from .own import apply_together, from_keywords, is_spec_field, resolve_together
from .parts import block_parts, weight_of

__all__ = ["REGISTRY", "Context", "Effect", "Method", "MethodsReport", "Param", "apply_methods",
           "from_keywords", "get", "is_spec_field", "method_params", "names", "needs_attention",
           "parse_methods", "parse_params", "recorded", "register", "restore_methods",
           "runtime_effect", "theory_spec"]


#: the tables' order: score scale, residual, variances, attention matrix, structure;
#: sigprop's own last (a method missing here follows in registration order)
ORDER = ("sigma-reparam", "qk-norm", "softcap", "deepnorm", "admin", "rezero", "skipinit",
         "layerscale", "depth-mup", "tfixup", "deepscalelm", "hyper-connections",
         "ngpt", "value-residual", "peri-ln", "ln-scaling",
         "mix-ln", "dyt", "shaped", "sigmoid-attn", "softpick", "sinks",
         "diff-attn", "gated-attn", "mimetic", "beta", "alpha", "centred", "length-scaling")


def names() -> list[str]:
    """Every registered method, in :data:`ORDER`."""
    return [n for n in ORDER if n in REGISTRY] + [n for n in REGISTRY if n not in ORDER]


def parse_methods(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]`` (``all``: every registered method), each checked."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise SpecError("method", f"give one or more of: {', '.join(REGISTRY)}")
    if items == ["all"]:
        return names()
    for t in items:
        get(t)
    if len(set(items)) != len(items):
        raise SpecError("method", f"a method is named twice in {text!r}")
    return items


def parse_params(items: list[str] | None, methods: list[str]) -> dict[str, dict[str, Any]]:
    """``["sigma-reparam.init=sigma", "cap=30"]`` -> per method its given parameters. A bare
    ``key`` goes to the one chosen method that has it (ambiguous or unknown: SpecError)."""
    out: dict[str, dict[str, Any]] = {m: {} for m in methods}
    for raw in items or []:
        key, sep, val = str(raw).partition("=")
        if not sep or not key.strip():
            raise SpecError("param", f"must look like METHOD.NAME=VALUE (got {raw!r})")
        key = key.strip()
        meth, dot, pname = key.rpartition(".")
        if dot:
            if meth not in out:
                raise SpecError("param", f"{meth!r} is not among the chosen methods "
                                         f"({', '.join(methods)})")
            out[meth][pname] = val.strip()
            continue
        owners = [m for m in methods if any(p.name == key for p in get(m).params)]
        if len(owners) != 1:
            what = "no chosen method takes" if not owners else "several methods take"
            raise SpecError("param", f"{what} {key!r}; write METHOD.{key}=VALUE")
        out[owners[0]][key] = val.strip()
    return out


def method_params(params: dict[str, dict[str, Any]] | list[str] | tuple[str, ...] | None,
                  methods: list[str], *, caller: str = "") -> dict[str, dict[str, Any]]:
    """Method parameters in their one Python form, ``{method: {param: value}}`` (as
    ``predict``, ``measure``, ``fix`` and ``rank_fixes`` take them), checked: every key is a
    chosen method. The command line's ``METHOD.NAME=VALUE`` strings (:func:`parse_params`)
    are still taken from Python for a release, with a FutureWarning naming ``caller``."""
    if params is None:
        return {}
    if isinstance(params, list | tuple):
        import warnings

        warnings.warn(f"{caller or 'method'} params as METHOD.NAME=VALUE strings are "
                      "deprecated: pass a dict {method: {name: value}}", FutureWarning,
                      stacklevel=3)
        return parse_params(list(params), methods)
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        raise SpecError("param", "must be a dict {method: {name: value}}")
    for meth in params:
        if meth not in methods:
            raise SpecError("param", f"{meth!r} is not among the chosen methods "
                                     f"({', '.join(methods)})")
    return {m: dict(v) for m, v in params.items()}


@dataclass
class MethodsReport:
    """What :func:`apply_methods` did: per method its resolved parameters, one line per
    change, the combined :class:`~.base.Effect` and the theory's spec after (None where a
    method is measured only: ``effect.measured_only`` says why)."""

    applied: list[dict[str, Any]]
    changes: list[str]
    effect: Effect
    before: ArchSpec
    after: ArchSpec | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"methods": self.applied, "changes": self.changes,
                "measured_only": list(self.effect.measured_only), "notes": self.notes}


def context_for(model, spec: ArchSpec, rho0: float | None = None,
                embed_q: float | None = None) -> Context:
    """The :class:`Context` of an HF model whose (per-layer) spec is ``spec`` (``embed_q``:
    its first block's measured input q, :attr:`Context.embed_q`)."""
    cfg = getattr(model, "config", None)
    enc = dec = 0
    if getattr(cfg, "is_encoder_decoder", False):
        enc = int(getattr(cfg, "encoder_layers", 0) or getattr(cfg, "num_layers", 0) or 0)
        dec = int(getattr(cfg, "decoder_layers", 0) or getattr(cfg, "num_decoder_layers", 0)
                  or enc)
    return Context(spec=spec, rho0=spec.rho_init if rho0 is None else float(rho0),
                   encoder_depth=enc, decoder_depth=dec,
                   embed_q=None if embed_q is None else float(embed_q))


def apply_methods(model, chosen: list[str], params: dict[str, dict[str, Any]] | None,
                  ctx: Context) -> MethodsReport:
    """Apply ``chosen`` methods (in order) to the HF ``model`` in place and record them in
    ``model.config.sigprop_fix["methods"]`` (appended to what is there). sigprop's own
    methods (beta, alpha, centred, length-scaling) act together at the place of the first of
    them, in the spec's order (:mod:`.own`)."""
    from ..fixes import FIX_VERSION, set_runtime_attention

    parts = block_parts(model)
    if len(parts) != ctx.depth:
        raise SpecError("method", f"the model has {len(parts)} block modules for {ctx.depth} "
                                  "layers (shared layers); the methods act on distinct blocks")
    effect = Effect(depth=ctx.depth)
    applied, changes = [], []
    params = params or {}
    together = [n for n in chosen if is_spec_field(n)]
    base = ctx.spec  # sigprop's own methods change the spec itself, the others map it
    for name in chosen:
        m = get(name)
        if name in together[1:]:
            continue  # applied with the first of sigprop's own methods
        if name in together:  # all of them at once, in the spec's order (own.py)
            resolved = resolve_together(ctx, together, params)
            rep = apply_together(model, [(get(n), resolved[n]) for n in together], ctx)
            changes.extend(rep.changes)
            base = rep.after
            applied += [{"name": n, "params": resolved[n]} for n in together]
            continue
        p = m.resolve(ctx, params.get(name))
        lines = m.apply(model, parts, p, ctx, effect)
        changes.extend(lines or [f"{m.title}: {m.describe(p)}"])
        applied.append({"name": name, "params": p})
    rec = dict(getattr(model.config, "sigprop_fix", None) or {})
    rec.setdefault("version", FIX_VERSION)
    rec[RECORD_KEY] = list(rec.get(RECORD_KEY, [])) + [
        {"name": a["name"], "params": a["params"]} for a in applied if get(a["name"]).runtime]
    rec.setdefault("applied", [])
    rec["applied"] = list(rec["applied"]) + [a["name"] for a in applied]
    model.config.sigprop_fix = rec
    if any(get(a["name"]).attention_ops for a in applied):
        set_runtime_attention(model)
    after = None if effect.measured_only else theory_spec(base, effect, ctx.embed_q)
    return MethodsReport(applied, changes, effect, ctx.spec, after)


def restore_methods(model) -> bool:
    """Re-install every recorded runtime method on ``model`` (built from its config, before
    its weights are loaded); True if any was installed."""
    rec = recorded(getattr(model, "config", None))
    if not rec:
        return False
    parts = block_parts(model)
    for m, p in rec:
        m.restore(model, parts, p)
    return True


def runtime_effect(model, depth: int) -> Effect | None:
    """What the recorded methods change beyond the weights, read from a built model (its
    branch gates, q/k norms, removed norms) as an :class:`~.base.Effect` on the spec read
    from its weights; None when the config records no method. Methods the theory does not
    reach add their line to ``measured_only``."""
    import numpy as np

    from .parts import GATE

    rec = getattr(getattr(model, "config", None), "sigprop_fix", None)
    if not isinstance(rec, dict) or not rec.get("applied"):
        return None
    parts = block_parts(model)
    if len(parts) != depth:
        return None
    eff = Effect(depth=depth)
    std = []
    for i, p in enumerate(parts):
        for at, key in ((p.gate_attn_at, "gate_attn"), (p.gate_mlp_at, "gate_mlp")):
            g = getattr(at, GATE, None) if at is not None else None
            if g is not None:
                getattr(eff, key)[i] = float(g.detach().double().square().mean().sqrt())
        gains = []
        for role in ("q", "k"):
            t = p.q[0][0] if role == "q" and p.q else p.k[0][0] if p.k else None
            g = getattr(t, f"sigprop_{role}_norm", None) if t is not None else None
            if g is not None:
                gains.append(float(g.detach().double().square().mean().sqrt()))
        if len(gains) == 2 and p.site is not None:
            std.append(p.site.scale * p.head_dim ** 0.5 * gains[0] * gains[1])
    if std and len(std) == depth:
        eff.score_std = np.asarray(std)
    for name in rec.get("applied", []):
        m = REGISTRY.get(name)
        if m is not None and m.theory == "measured only":
            eff.measured_only.append(f"{name}: {m.acts} is outside the theory")
    _norm_and_value_effect(model, parts, eff)
    for m, p in recorded(model.config):
        if m.name == "tfixup" or (m.name == "rezero" and p.get("norms") == "remove"):
            eff.norm = "none"
        if m.name == "shaped":
            _shaped_effect(parts, eff)
        if m.name == "gated-attn" and p.get("kind") == "head":
            eff.measured_only.append("gated-attn: the weight reader reads elementwise output "
                                     "gates, not head-wise ones")
    return eff


def _norm_and_value_effect(model, parts, eff: Effect) -> None:
    """Mix-LN's post-LN blocks (from its recorded alpha) and the value-residual pairs (the
    blocks' ``sigprop_value_mix``, trained or not) of a built model; Dynamic Tanh is measured
    only there (the weight reader does not read its modules' alpha and gamma)."""
    from .mix_ln import post_blocks
    from .value_residual import MIX

    depth = len(parts)
    for m, p in recorded(model.config):
        if m.name == "mix-ln":
            k = post_blocks(depth, p.get("alpha", 0.25))
            eff.layer_norm = ["post"] * k + [None] * (depth - k)
        if m.name == "dyt":
            eff.measured_only.append("dyt: the weight reader does not read the DynamicTanh "
                                     "modules (alpha, gamma) of a built model")
        if m.name == "value-residual":
            pairs = []
            for part in parts:
                t = part.v[0][0] if part.v else None
                lam = getattr(t, MIX, None) if t is not None else None
                pairs.append(None if lam is None else tuple(float(x) for x in lam.detach()))
            if pairs[0] is not None or any(x is None for x in pairs[1:]):
                eff.measured_only.append("value-residual: the value mix is not on blocks "
                                         "2..L as the method puts it")
            else:
                eff.value_mix = pairs


def _shaped_effect(parts, eff: Effect) -> None:
    """Shaped attention read off the modules: W_Q still zero and every head's ``beta ==
    gamma`` make the map ``alpha I`` (``attention="identity"``, values times the RMS alpha);
    anything else is measured only."""
    import torch

    alphas = []
    for p in parts:
        g = getattr(p.site.module, "sigprop_shape", None) if p.site is not None else None
        if g is None or any(bool(torch.any(weight_of(t) != 0)) for t in p.q) or \
                not torch.allclose(g[:, 1], g[:, 2]):
            eff.measured_only.append("shaped: W_Q or the gains moved away from init (a "
                                     "softmax mixed into alpha I), outside the theory")
            return
        alphas.append(float(g[:, 0].detach().double().square().mean().sqrt()))
    eff.attention = "identity"
    eff.zero_q = True
    eff.scale("v", alphas)
