"""The verdict of a diagnosis and the theory's recommendations (docs/theory.md §2.7-2.8).

:func:`verdict_of` reads a measured trajectory (and, where the theory applies, the per-block
beta table) and names the failure: ``entropy_collapse``, ``rank_collapse`` or ``trainable``.
:func:`recommend` turns a spec into concrete changes, each a :class:`Recommendation` with the
theory's predicted effect; :meth:`Recommendation.to_dict` is the form the JSON output, the
console and the HTML report show (``Diagnosis.recommendations``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..spec import ArchSpec

#: head-averaged normalised entropy below which a layer counts as entropy-collapsed
ENTROPY_MIN = 0.5

#: keys a recommendation writes even when None: the attention residual's ``alpha_crit`` is None
#: where it was not searched (causal attention sinks), and says so
_KEPT_WHEN_NONE = {"attention residual": ("alpha_crit",)}


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """One change the theory suggests, with its predicted effect. ``what`` names it (``beta
    window``, ``lower beta``, ``attention residual``, ``centred attention``, ``length
    scaling``), ``text`` says it in a sentence; the other fields are the numbers behind it,
    None where a kind of recommendation has no such number. The fields are declared in the
    order :meth:`to_dict` writes them."""

    what: str
    #: the attention residual's critical strength alpha_crit(L) (NaN above beta_c)
    alpha_crit: float | None = None
    #: the value now: beta (``beta window``), alpha_attn (``attention residual``)
    current: float | None = None
    #: beta_c(rho0), the largest beta that does not condense
    limit: float | None = None
    #: the Q/K init std that keeps beta at the limit (not with QK-norm)
    qk_std_max: float | None = None
    #: the beta to re-initialise Q/K for
    beta: float | None = None
    #: the theory's final cosine of the model as it is
    predicted_cos_L_now: float | None = None
    #: the attention residual strength to set
    alpha: float | None = None
    #: the theory's final cosine and verdict after the change
    predicted_cos_L: float | None = None
    predicted_verdict: str | None = None
    #: ``length scaling``: the longer context, beta there with fixed Q/K and with log-n
    #: scaling from the spec's length, and beta_c
    seq_len: int | None = None
    beta_none: float | None = None
    beta_log_n: float | None = None
    beta_c: float | None = None
    text: str
    #: with QK-norm: the largest product of the q / k norm gains (RMS over a head)
    gain_product_max: float | None = None

    def to_dict(self) -> dict:
        """The recommendation as the JSON output holds it: its numbers in field order, keys
        of absent numbers left out (``beta_log_n`` is written ``beta_log-n``)."""
        kept = _KEPT_WHEN_NONE.get(self.what, ())
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None or f.name in kept:
                out["beta_log-n" if f.name == "beta_log_n" else f.name] = v
        return out


def verdict_of(spec: ArchSpec, meas, heads, theory: bool = True, layers: list[dict] | None = None
               ) -> tuple[str, int | None, list[int]]:
    """``(verdict, first failing layer, failing heads)`` of a measured trajectory ``meas``
    (per-head rows ``heads``). ``theory=False``: the measurement alone (no beta_c
    condition). ``layers``: the per-block beta table (:func:`sigprop.theory.depth.layer_table`);
    a block whose beta exceeds beta_c of its input cosine condenses (docs/theory.md §2.7-2.8),
    and its heads above beta_c are failing heads with the measured low-entropy ones."""
    from ..theory import rem

    cos = meas[meas.observable == "cos"].set_index("layer")["value"]
    ent = meas[meas.observable == "entropy"].set_index("layer")["value"]
    over_layers = [r["layer"] for r in layers or [] if r["beta"] > r["beta_c"]]
    if layers is None:
        over_layers = [1] if theory and spec.beta_eff > float(rem.beta_c(spec.rho_init)) else []
    over_layers = over_layers if theory else []
    low_ent = [int(layer) for layer, v in ent.items() if v < ENTROPY_MIN]
    if spec.attention != "uniform" and (over_layers or low_ent):
        first = min(low_ent[:1] + over_layers[:1])
        h = heads[(heads.layer == first) & (heads.observable == "entropy")]
        bad = {int(x) for x in h[h.value < ENTROPY_MIN]["head"]}
        bad |= {int(x) for r in layers or [] if r["layer"] == first for x in r["heads_over"]}
        return "entropy_collapse", first, sorted(bad)
    high = [int(layer) for layer, v in cos.items() if layer > 0 and v >= spec.rho_max]
    if high:
        return "rank_collapse", high[0], []
    return "trainable", None, []


def recommend(spec: ArchSpec, rho0: float, qk_norm: bool = False) -> list[Recommendation]:
    """Concrete changes with the theory's predicted effect on the final cosine / regime: the
    beta window, a lower beta (above beta_c), the attention residual, centred attention and
    length scaling. ``qk_norm``: q and k are normalised per head (Qwen3, OLMo-2, Gemma 3/4),
    so the Q/K init does not set beta; the window is stated for the product of the q / k norm
    gains (docs/theory.md §2.8: sigma_s = multiplier x rms(g_q g_k))."""
    from ..theory import depth, rem

    bc = float(rem.beta_c(rho0))
    base = float(depth.final_cos(spec, rho0=rho0))
    out = [_beta_window(spec, bc, qk_norm)]
    if spec.beta_eff > bc:
        target = 0.5 * bc
        fixed = spec.with_beta(target)
        out.append(Recommendation(
            what="lower beta", beta=target,
            predicted_cos_L=float(depth.final_cos(fixed, rho0=rho0)),
            predicted_verdict=depth.verdict(fixed, rho0=rho0),
            text=f"re-initialise Q/K for beta={target:.3g} (sigprop fix --beta {target:.3g})"))
    out += [_attention_residual(spec, rho0, base), _centred(spec, rho0, base),
            length_scaling(spec, bc)]
    return out


def _beta_window(spec: ArchSpec, bc: float, qk_norm: bool) -> Recommendation:
    """Keep beta below beta_c: the Q/K init std that does it, or with QK-norm the q / k norm
    gains' product."""
    logt = math.sqrt(math.log(spec.seq_len))
    head = f"keep beta below beta_c(rho0)={bc:.3g} (now {spec.beta_eff:.3g}): "
    if qk_norm:
        gmax = bc * logt / spec.multiplier
        return Recommendation(
            what="beta window", current=spec.beta_eff, limit=bc, gain_product_max=gmax,
            text=head + f"QK-norm sets beta, not the Q/K init; the q / k norm gains' product "
                        f"(RMS over a head) below {gmax:.3g} at T={spec.seq_len} (logit "
                        f"multiplier {spec.multiplier:.3g} x 1/sqrt(d_head))")
    return Recommendation(
        what="beta window", current=spec.beta_eff, limit=bc,
        qk_std_max=math.sqrt(bc * logt / spec.d_model / spec.multiplier),
        text=head + f"Q/K init std below {math.sqrt(bc * logt / spec.d_model):.3g} at "
                    f"T={spec.seq_len}")


def _attention_residual(spec: ArchSpec, rho0: float, base: float) -> Recommendation:
    """Scale the attention skip above alpha_crit(L), or say why not: not searched with causal
    sinks, undefined above beta_c, not needed."""
    from ..theory import depth, diagram

    causal_sinks = spec.causal and spec.layers is not None and any(
        x.sink_logit is not None for x in spec.layers)
    now = dict(what="attention residual", current=spec.alpha_attn, predicted_cos_L_now=base)
    if causal_sinks:  # the search re-runs the stack ~30 times; ~1 s per causal sink layer each
        return Recommendation(**now, text="alpha_crit not searched: the causal theory of "
                                          "attention sinks costs about a second per layer "
                                          "and evaluation (docs/theory.md §2.4.3)")
    a_crit = float(diagram.alpha_crit(spec, rho0=rho0)[0])
    if math.isfinite(a_crit) and a_crit > spec.alpha_attn:
        a_new = 1.1 * a_crit
        fixed = spec.replace(alpha_attn=a_new)
        new_cos = float(depth.final_cos(fixed, rho0=rho0))
        return Recommendation(
            **now, alpha_crit=a_crit, alpha=a_new, predicted_cos_L=new_cos,
            predicted_verdict=depth.verdict(fixed, rho0=rho0),
            text=f"scale the attention skip to alpha_attn={a_new:.3g} (alpha_crit(L="
                 f"{spec.depth})={a_crit:.3g}): predicted final cos {base:.3g} -> "
                 f"{new_cos:.3g}")
    if not math.isfinite(a_crit):
        return Recommendation(**now, alpha_crit=a_crit, text=(
            "alpha_crit is undefined above beta_c (the attention condenses whatever the "
            "residual strength): lower beta first"))
    return Recommendation(**now, alpha_crit=a_crit, text=(
        f"alpha_attn={spec.alpha_attn:g} is above alpha_crit(L={spec.depth})={a_crit:.3g}: "
        "no change needed"))


def _centred(spec: ArchSpec, rho0: float, base: float) -> Recommendation:
    """Centred attention (mindthegap); attention sinks are dropped: centred rows sum to 0,
    there is no mass for a sink to take."""
    from ..theory import depth

    sinks = spec.layers is not None and any(x.sink_logit is not None for x in spec.layers)
    if sinks:
        centred = spec.replace(attention="centred", layers=tuple(
            dataclasses.replace(x, sink_logit=None) for x in spec.layers))
    else:
        centred = spec.replace(attention="centred")
    c_cos = float(depth.final_cos(centred, rho0=rho0))
    return Recommendation(
        what="centred attention", predicted_cos_L=c_cos,
        predicted_verdict=depth.verdict(centred, rho0=rho0),
        text=f"centred attention (A - 11^T/T, mindthegap{', without the sinks' if sinks else ''}"
             f"): predicted final cos {base:.3g} -> {c_cos:.3g}")


def length_scaling(spec: ArchSpec, bc: float, *, measured: bool = False) -> Recommendation:
    """beta at 16 times the context, with fixed Q/K and with log-n scaling. ``measured``:
    ``spec`` carries a trained model's measured beta (:mod:`sigprop.analysis.trained`), and the
    text says so and names the command that measures the entropy band on long inputs."""
    T = spec.seq_len
    long_t = min(T * 16, 2**20)
    beta = {kind: spec.replace(seq_len=long_t, scaling=kind, scaling_param=param).beta_eff
            for kind, param in (("none", None), ("log-n", float(T)))}
    text = (f"at T={long_t}: beta {beta['none']:.3g} with fixed Q/K, {beta['log-n']:.3g} with "
            f"log-n scaling from T={T} (beta_c={bc:.3g})")
    if measured:
        text = (f"at T={long_t}: measured beta {spec.beta_eff:.3g} becomes {beta['none']:.3g} "
                f"with fixed Q/K and {beta['log-n']:.3g} with log-n scaling from T={T} "
                f"(beta_c={bc:.3g}); the entropy band per layer on long inputs: sigprop "
                f"longctx MODEL --lengths {T},{4 * T},{long_t}")
    return Recommendation(what="length scaling", seq_len=long_t, beta_none=beta["none"],
                          beta_log_n=beta["log-n"], beta_c=bc, text=text)
