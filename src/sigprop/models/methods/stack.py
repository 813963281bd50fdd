"""The registry's methods on sigprop's own torch stack (docs/fixes.md, "on sigprop's stack").

sigprop's stack (:class:`~sigprop.nn.SigpropTransformer`) is built from an
:class:`~sigprop.spec.ArchSpec`, so a method patches it by patching the spec: each method
records its :class:`~.base.Effect` (factors on the score scale, the value / output / MLP
variances, the branch gates and stream multipliers, the attention map, a length scaling,
norms removed) and :func:`~.base.theory_spec` turns the effect into the per-layer spec the
fixed stack is built from, and the theory runs on. The stack and the theory are then one
object, as everywhere in sigprop.

How each method records its effect without an HF model: residual methods, T-Fixup, shaped
attention and the variance methods run their own ``apply`` on no blocks (only the effect is
recorded; the constants are the same functions of depth and T); QK-norm sets each head's
score std to the one unit gains give (1 at the canonical ``1/sqrt(d_head)`` scale);
sigma-reparam reads the spectral norms of the stack's own draw (the block weights of the
stack built with the same seed); sigprop's own methods (beta, alpha, centred, length
scaling) act on the spec's fields directly. Soft-capping and mimetic init change what the
Gaussian stack cannot express (a cap inside the softmax, structured Q/K and V/O): refused
with one line. Trainable gates (ReZero, SkipInit, LayerScale) are folded into the output
projections' variances: at init the stack computes the same function in distribution; it
does not carry the gate as a separate trainable parameter. Attention sinks and the output
gate of gated attention are the stack's own per-layer fields (``LayerSpec.sink_logit``,
``gate_var``), and so are sigmoid and differential attention (``sigmoid_bias``,
``diff_lambda`` with ``head_norm2``: the stack's own sigmoid rows and split heads); softpick
replaces the softmax by a map the stack does not have: refused with one line. Value
residuals, Mix-LN's per-block norm placement and Dynamic Tanh are per-layer fields too
(``LayerSpec.value_mix``, ``norm``, ``dyt``): the stack hands the first block's values on,
puts each block's own norm where it sits, and has ``tanh(alpha x)`` (alpha constant, gamma
1, beta 0: DyT at init) in place of its norms (the stack's input is the theory's layer-0
state, not an embedding norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...spec import ArchSpec, SpecError
from .base import Context, Effect, get, theory_spec

#: methods the Gaussian stack cannot express, and why
NOT_ON_STACK = {
    "softcap": "capped scores need a cap inside the softmax, which sigprop's stack does not "
               "have (apply it to an HF model: sigprop fix MODEL --method softcap)",
    "mimetic": "structured W_Q W_K^T and W_V W_O are not the stack's Gaussian draws (apply it "
               "to an HF model: sigprop fix MODEL --method mimetic)",
    "hyper-connections": "n residual streams mixed by learned matrices are not the stack's one "
                         "stream (apply it to an HF model: sigprop fix MODEL --method "
                         "hyper-connections)",
    "ngpt": "states on the unit sphere, normalised weights and the update h + alpha (f - h) "
            "are not the stack's residual form (apply it to an HF model: sigprop fix MODEL "
            "--method ngpt)",
    "softpick": "the stack's attention is a softmax, not a rectified one (apply it to an HF "
                "model: sigprop fix MODEL --method softpick)",
}


@dataclass
class StackFix:
    """What :func:`fix_spec` did: ``spec`` the fixed stack's per-layer spec (build the stack
    with :meth:`model`), ``applied`` each method's resolved parameters, ``changes`` one line
    per change, ``effect`` the combined :class:`~.base.Effect`."""

    before: ArchSpec
    spec: ArchSpec
    applied: list[dict[str, Any]]
    changes: list[str]
    effect: Effect
    #: weights (``q``, ``k``, ``v``, ``o``, ``mlp_in``, ``mlp_out``) that :meth:`model` sets
    #: to spectral norm 1 in every seed slice (sigma-reparam with ``init=one``)
    renorm: tuple[str, ...] = ()

    def build(self, spec: ArchSpec | None = None, **kw):
        """:meth:`model` with the signature of :class:`~sigprop.nn.SigpropTransformer`
        (``spec`` must be this fix's, or None), for :func:`sigprop.measurement.engine.measure`."""
        if spec is not None and spec != self.spec:
            raise ValueError("StackFix.build: a different spec than the fixed one")
        return self.model(**kw)

    def model(self, n_seeds: int = 1, seed: int = 0, **kw):
        """The fixed stack: :class:`~sigprop.nn.SigpropTransformer` of :attr:`spec`; with
        sigma-reparam each listed weight of every seed slice divided by its own spectral norm
        (the spec's score scale is that of the draw :func:`fix_spec` read, seed slice 0 of
        ``seed``; the other slices differ by the spectral norm's fluctuation, ~3% at d 128)."""
        import torch

        from ...nn import SigpropTransformer
        from .parts import spectral_norm

        model = SigpropTransformer(self.spec, n_seeds=n_seeds, seed=seed, **kw)
        with torch.no_grad():
            for blk in model.blocks:
                for w in self.renorm:
                    t = _weight(blk, w)
                    for s in range(n_seeds if t is not None else 0):
                        n = spectral_norm(t[s])
                        if n > 0:
                            t[s].mul_(1.0 / n)
        return model

    def to_dict(self) -> dict[str, Any]:
        return {"methods": self.applied, "changes": self.changes}


def _spectral_norms(spec: ArchSpec, seed: int, which: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per block, the spectral norm of the stack's own draw of each weight in ``which``
    (``q``, ``k``, ``v``, ``o``, ``mlp_in``, ``mlp_out``; seed slice 0 of the stack built
    with ``seed``)."""
    import torch

    from ...nn import SigpropTransformer
    from .parts import spectral_norm

    model = SigpropTransformer(spec, n_seeds=1, seed=seed)
    out = {w: np.ones(spec.depth) for w in which}
    with torch.no_grad():
        for i, blk in enumerate(model.blocks):
            for w in which:
                t = _weight(blk, w)
                if t is not None:
                    out[w][i] = spectral_norm(t[0])
    return out


def _weight(blk, w: str):
    """The (S, in, out) parameter of one block's weight ``w`` (None where it has none)."""
    names = {"q": "w_q", "k": "w_k", "v": "w_v", "o": "w_o"}
    if w in names:
        return getattr(blk.attn, names[w], None)
    if w == "mlp_in":
        return blk.mlp.w1 if hasattr(blk.mlp, "w1") else blk.mlp.w_gate
    return blk.mlp.w2


def _on_stack(name: str, p: dict[str, Any], ctx: Context, effect: Effect, seed: int,
              renorm: list[str]) -> list[str]:
    """One method's effect on the stack of ``ctx.spec`` (module docstring)."""
    spec = ctx.spec
    if name == "sigma-reparam":
        which = ("q", "k") + (("v", "o", "mlp_in", "mlp_out") if p["targets"] == "all"
                              else ())
        if p["init"] == "sigma":
            return ["every reparametrised weight keeps its spectral norm at init (gain = "
                    "sigma(W)): the stack is unchanged"]
        s = _spectral_norms(spec, seed, which)
        renorm += [w for w in which if w not in renorm]
        effect.scale("qk", 1.0 / (s["q"] * s["k"]))
        for w in which[2:]:
            effect.scale(w, 1.0 / s[w])
        return [f"W_Q, W_K to spectral norm 1 (were {min(s['q'].min(), s['k'].min()):.3g} .. "
                f"{max(s['q'].max(), s['k'].max()):.3g} in the stack's draw, seed {seed})"]
    if name == "qk-norm":
        effect.score_std = [1.0] * spec.depth
        return [f"q and k {p['kind']}-normalised (unit gains): score std 1 per head"]
    if name == "beta":
        before = spec.beta_eff
        effect.scale("qk", p["beta"] / before if before > 0 else 1.0)
        return [f"beta {before:.4g} -> {p['beta']:.4g} (W_Q, W_K scaled)"]
    if name == "alpha":
        effect.scale("lam_attn", p["alpha"] / spec.alpha_attn if spec.alpha_attn else 1.0)
        return [f"alpha_attn {spec.alpha_attn:.4g} -> {p['alpha']:.4g}"]
    if name == "centred":
        effect.attention = "centred"
        return ["attention A -> A - 11^T/n"]
    if name == "length-scaling":
        effect.scaling = (p["kind"], p["param"])
        what = "its default" if p["param"] is None else f"{p['param']:.4g}"
        return [f"scores times the {p['kind']} scaling (param {what})"]
    # residual methods, T-Fixup, shaped attention: their own patch on no blocks records the
    # effect (the constants are functions of ctx alone)
    return get(name).apply(None, [], p, ctx, effect)


def fix_spec(spec: ArchSpec, methods, params: dict[str, dict[str, Any]] | None = None, *,
             seed: int = 0, rho0: float | None = None) -> StackFix:
    """Apply ``methods`` (names, or a comma list; in order) to sigprop's stack of ``spec``:
    the fixed per-layer spec and what changed (module docstring). ``params``: per method its
    parameters, ``{method: {name: value}}`` (checked by
    :func:`~sigprop.models.methods.method_params`; defaults by depth and T otherwise);
    ``seed``: the stack's draw that sigma-reparam reads its spectral norms from; ``rho0``:
    the input cosine the defaults of
    beta and alpha use (default: the spec's)."""
    from . import method_params, parse_methods

    chosen = parse_methods(methods if isinstance(methods, str) else ",".join(methods))
    params = method_params(params, chosen, caller="predict / measure")
    ctx = Context(spec=spec, rho0=spec.rho_init if rho0 is None else float(rho0))
    effect = Effect(depth=spec.depth)
    applied, changes, renorm = [], [], []
    for name in chosen:
        if name in NOT_ON_STACK:
            raise SpecError("method", f"{name}: {NOT_ON_STACK[name]}")
        p = get(name).resolve(ctx, params.get(name))
        lines = _on_stack(name, p, ctx, effect, seed, renorm)
        applied.append({"method": name, "params": p})
        changes += [f"{name}: {line}" for line in lines if line]
    if effect.measured_only:
        why = "; ".join(effect.measured_only)
        raise SpecError("method", f"{why} (sigprop's stack is built from the theory's spec)")
    after = theory_spec(spec, effect)
    return StackFix(before=spec, spec=after, applied=applied, changes=changes, effect=effect,
                    renorm=tuple(renorm))
