"""The fix registry's types: :class:`Method` (one registered object per remedy), its
:class:`Param` table, the :class:`Context` its defaults read (depth, T, the model's spec) and
the :class:`Effect` it reports, which :func:`theory_spec` turns into the per-layer
:class:`~sigprop.spec.ArchSpec` the theory runs on (docs/fixes.md).

A method acts on an HF model in place (:meth:`Method.apply`) and records what it needs in
``config.sigprop_fix["methods"]``; a method that changes the forward pass beyond the weights
(a norm on q and k, a gate on a branch, a cap on the scores, ...) re-installs that part on a
freshly built model in :meth:`Method.restore`, which :func:`sigprop.models.from_pretrained`
and :func:`sigprop.models.model_at_init` call for every recorded method. Weight-only methods
(sigma-reparam, deepnorm's beta, mimetic ...) need no restore: the weights carry them.
"""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import numpy as np

from ...spec import ArchSpec, LayerSpec, SpecError


@dataclass(frozen=True)
class Param:
    """One parameter of a method: ``default`` a value or a function of the :class:`Context`
    (depth- and T-dependent defaults); numbers checked against ``[lo, hi]``, strings against
    ``choices``; ``optional``: None is a value too (it means what ``help`` says)."""

    name: str
    help: str
    default: Any
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False

    def value(self, ctx: Context) -> Any:
        return self.default(ctx) if callable(self.default) else self.default

    def check(self, method: str, value: Any) -> Any:
        """``value`` parsed (strings from the command line) and range-checked, or a SpecError
        naming ``method.param`` and its allowed values."""
        where = f"{method}.{self.name}"
        if value is None and self.optional:
            return None
        if self.choices is not None:
            v = str(value)
            if v not in self.choices:
                raise SpecError(where, f"must be one of {', '.join(self.choices)} (got {v!r})")
            return v
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise SpecError(where, f"must be a number in [{self.lo:g}, {self.hi:g}] "
                                   f"(got {value!r})") from None
        if not math.isfinite(v) or (self.lo is not None and v < self.lo) or \
                (self.hi is not None and v > self.hi):
            raise SpecError(where, f"must be a number in [{self.lo:g}, {self.hi:g}] (got {v!r})")
        return v


@dataclass(frozen=True)
class Context:
    """What a method's defaults and its patch read: the model's ``spec`` before the method
    (per-layer when read from its weights), its ``depth`` (blocks of the stack the method
    acts on), ``seq_len``, ``norm`` placement and, for encoder-decoder formulas, the encoder
    and decoder depths (``decoder_depth`` 0: one stack)."""

    spec: ArchSpec
    rho0: float = 0.0
    encoder_depth: int = 0
    decoder_depth: int = 0
    #: the first block's input squared norm per dimension as measured (a pre-LN ``spec``'s
    #: branch variances are in its units; :func:`theory_spec` needs it when a method
    #: removes the norms); None: unknown
    embed_q: float | None = None

    depth = property(lambda self: self.spec.depth, doc="the spec's ``depth``")
    seq_len = property(lambda self: self.spec.seq_len, doc="the spec's ``seq_len``")
    norm = property(lambda self: self.spec.norm, doc="the spec's ``norm``")
    causal = property(lambda self: self.spec.causal, doc="the spec's ``causal``")


@dataclass
class Effect:
    """What the methods did to each block, as the theory sees it (one entry per block; 1 =
    unchanged): factors on the score std (``qk``) or the score std set outright
    (``score_std``, QK-norm), factors on the standard deviations of V, O, the MLP's first and
    second layers and on each branch's output (``gate_attn``, ``gate_mlp``: a multiplier on
    the branch, ``lam_attn``/``lam_mlp``: a multiplier on the residual stream it is added
    to), the attention map (``attention``: ``centred``), a length ``scaling``, ``norm``
    removed (``"none"``), attention sinks and output gates (``sink_logit``, ``gate``: the
    :class:`~sigprop.spec.LayerSpec` fields per block), per-block norm placement, Dynamic
    Tanh and value residuals (``layer_norm``, ``dyt``, ``value_mix``: the LayerSpec's
    ``norm``, ``dyt``, ``value_mix``), sigmoid and differential attention and a per-head
    output norm (``sigmoid_bias``, ``diff_lambda``, ``head_norm2``, the LayerSpec's fields),
    and ``measured_only``: one line per part the theory
    does not reach."""

    depth: int
    qk: np.ndarray = None
    score_std: np.ndarray | None = None
    v: np.ndarray = None
    o: np.ndarray = None
    mlp_in: np.ndarray = None
    mlp_out: np.ndarray = None
    gate_attn: np.ndarray = None
    gate_mlp: np.ndarray = None
    lam_attn: np.ndarray = None
    lam_mlp: np.ndarray = None
    attention: str | None = None
    scaling: tuple[str, float | None] | None = None
    beta: float | None = None
    alpha_attn: float | None = None
    norm: str | None = None
    zero_q: bool = False
    #: per block: each head's attention sink logit (docs/theory.md §2.4.3; None: unchanged)
    sink_logit: list[tuple[float, ...] | None] | None = None
    #: per block: an output gate's ``(gate_var, gate_bias2)`` (§2.4.4; None: unchanged)
    gate: list[tuple[float, float] | None] | None = None
    #: per block: the mean squared gains (attention, MLP) of norms put on the branch outputs
    #: (Peri-LN), in absolute units; None: unchanged
    branch_gain2: list[tuple[float, float]] | None = None
    #: per block: its own norm placement (Mix-LN; None: the spec's); None: unchanged
    layer_norm: list[str | None] | None = None
    #: per block: Dynamic Tanh slopes (attention, MLP) in place of its norms; None: unchanged
    dyt: list[tuple[float, float]] | None = None
    #: per block: value residual ``(lambda_self, lambda_first)`` (None on the first block)
    value_mix: list[tuple[float, float] | None] | None = None
    #: per block: sigmoid rows ``(k, b0)``, bias ``b0 - k log n`` (§2.4.7); None: unchanged
    sigmoid_bias: list[tuple[float, float]] | None = None
    #: per block: differential rows ``(lambda_init, lambda_std)`` (§2.4.8); None: unchanged
    diff_lambda: list[tuple[float, float]] | None = None
    #: per block: the mean squared gain of a per-head norm on the head outputs (before W_O,
    #: absolute units); None: unchanged
    head_norm2: list[float] | None = None
    measured_only: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("qk", "v", "o", "mlp_in", "mlp_out", "gate_attn", "gate_mlp", "lam_attn",
                     "lam_mlp"):
            if getattr(self, name) is None:
                setattr(self, name, np.ones(self.depth))

    def scale(self, name: str, factor) -> None:
        """Multiply the per-block factor ``name`` by ``factor`` (a number or one per block)."""
        setattr(self, name, getattr(self, name) * np.broadcast_to(
            np.asarray(factor, dtype=np.float64), (self.depth,)))


class Method:
    """One remedy. Subclasses set the class attributes and override :meth:`apply` (and
    :meth:`restore` when the forward pass changes beyond the weights).

    ``name``: the registry key (``--method``); ``title``, ``cite``: how the tables and docs
    name it; ``acts``: where it acts; ``theory``: what sigprop predicts for it (``"beta"``,
    ``"residual"``, ``"attention map"``, ``"variances"``, ``"value kernel"``, ``"norm
    placement"``, ``"tanh kernel"`` or ``"measured only"``);
    ``params``: its :class:`Param` table; ``attention_ops``: True when it hooks the attention
    function (:meth:`scores`, :meth:`weights`). Whether it is a runtime method follows from
    these (:attr:`runtime`)."""

    name: str = ""
    title: str = ""
    cite: str = ""
    acts: str = ""
    theory: str = "measured only"
    params: tuple[Param, ...] = ()
    #: the attention function hooks used when the method is recorded (see :mod:`.runtime`)
    attention_ops: bool = False

    @property
    def runtime(self) -> bool:
        """True when the forward pass changes beyond the weights: the method hooks the
        attention function or re-installs a part in :meth:`restore` (so it is recorded in
        config.json and restored by sigprop's loader)."""
        return self.attention_ops or type(self).restore is not Method.restore

    def defaults(self, ctx: Context) -> dict[str, Any]:
        return {p.name: p.value(ctx) for p in self.params}

    def resolve(self, ctx: Context, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """Defaults for ``ctx`` overridden by ``given`` (checked; unknown names refused). A
        given parameter's default is not computed (alpha's runs the theory, and may refuse a
        model the given value suits)."""
        given = dict(given or {})
        known = {p.name: p for p in self.params}
        for k in given:
            if k not in known:
                allowed = ", ".join(known) or "none"
                raise SpecError(f"{self.name}.{k}", f"unknown parameter; {self.name} takes: "
                                                    f"{allowed}")
        out = {p.name: given[p.name] if p.name in given else p.value(ctx) for p in self.params}
        for k, v in list(out.items()):
            out[k] = known[k].check(self.name, v)
        self.validate(ctx, out)
        return out

    def validate(self, ctx: Context, params: dict[str, Any]) -> None:
        """Refuse a model the method cannot act on (SpecError naming the method)."""

    def apply(self, model, parts, params: dict[str, Any], ctx: Context, effect: Effect
              ) -> list[str]:
        """Patch ``model`` in place (``parts``: :func:`.parts.block_parts`), add what it did to
        ``effect``; return one line per change."""
        raise NotImplementedError

    def restore(self, model, parts, params: dict[str, Any]) -> None:
        """Re-install the runtime part on a model built from a config that records the method
        (parameters at their init values; the caller then loads the saved ones)."""

    # attention-function hooks (runtime methods with ``attention_ops``); tensors (B, H, T, .)
    def scores(self, module, scores, params):
        return scores

    #: True when :meth:`attend` replaces the softmax (sigmoid attention, softpick, sinks,
    #: differential attention): at most one such method per model
    replaces_softmax: bool = False

    def attend(self, module, query, key, scale, prepare, allowed, n_keys, params):
        """The attention weights (B, H, Tq, Tk) in place of ``softmax(prepare(q k^T
        scale))`` (:attr:`replaces_softmax`): ``query``, ``key`` the heads (GQA repeated,
        float32 or wider), ``prepare(logits)`` the model's length scaling, the recorded
        :meth:`scores` hooks and the masks (``-inf`` on the hidden keys), ``allowed`` the
        visible keys (bool, broadcastable; None: all), ``n_keys`` their number per row."""
        raise NotImplementedError

    def weights(self, module, probs, allowed, n_keys, params):
        return probs

    def output(self, module, out, params):
        """The heads' outputs ``weights @ values`` (B, H, T, d_head) before they are merged
        (differential attention's per-head norm)."""
        return out

    def describe(self, params: dict[str, Any]) -> str:
        return ", ".join(f"{k}={_fmt(v)}" for k, v in params.items())


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


REGISTRY: dict[str, Method] = {}
#: the key of ``config.sigprop_fix`` listing the runtime methods with their parameters
RECORD_KEY = "methods"


#: the words describing a method, read from ``methods.toml`` (its one home)
TEXT = ("title", "cite", "acts", "theory")


@functools.cache
def _method_text() -> dict[str, dict[str, str]]:
    with resources.files(__package__).joinpath("methods.toml").open("rb") as f:
        return tomllib.load(f)


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: one instance of ``cls`` under ``cls.name``, its :data:`TEXT` from
    this package's ``methods.toml``. A method defined elsewhere (no entry there) sets them as
    class attributes; one that has an entry may not say them differently."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"method name {cls.name!r} missing or registered twice")
    for key, value in _method_text().get(cls.name, {}).items():
        if key not in TEXT:
            raise ValueError(f"methods.toml [{cls.name}]: unknown key {key!r} (one of "
                             f"{', '.join(TEXT)})")
        if cls.__dict__.get(key, value) != value:
            raise ValueError(f"method {cls.name!r}: its {key} differs from methods.toml, its "
                             "one home; drop the class attribute")
        setattr(cls, key, value)
    REGISTRY[cls.name] = cls()
    return cls


def get(name: str) -> Method:
    try:
        return REGISTRY[name]
    except KeyError:
        raise SpecError("method", f"unknown method {name!r}; one of: "
                                  f"{', '.join(REGISTRY)}") from None


def recorded(config) -> list[tuple[Method, dict[str, Any]]]:
    """The runtime methods a config records, in order (unknown names: SpecError)."""
    rec = getattr(config, "sigprop_fix", None)
    if not isinstance(rec, dict):
        return []
    return [(get(str(e.get("name"))), dict(e.get("params") or {}))
            for e in rec.get(RECORD_KEY, []) or []]


def recorded_entry(config, key: str, name: str) -> dict[str, Any] | None:
    """The parameters of method ``name`` in the list ``config.sigprop_fix[key]`` (the
    training-time records: ``after_step``, ``train_loss``), or None when it is not there."""
    rec = getattr(config, "sigprop_fix", None)
    for e in (rec.get(key) or []) if isinstance(rec, dict) else []:
        if isinstance(e, dict) and e.get("name") == name:
            return dict(e.get("params") or {})
    return None


def needs_attention(config) -> bool:
    """True if a recorded method acts inside the attention function."""
    return any(m.attention_ops for m, _ in recorded(config))


# --------------------------------------------------------------------------------------------
# the theory map
# --------------------------------------------------------------------------------------------
def theory_spec(before: ArchSpec, effect: Effect, embed_q: float | None = None) -> ArchSpec:
    """The per-layer spec after the methods (docs/fixes.md, "what sigprop predicts").

    Per block: each head's score std times ``qk`` (or set to ``score_std``; 0 with
    ``zero_q``), the value, output and MLP variances times the squared factors, the branch
    gates squared onto the branch's output variance (its output projection, or the norm
    gains of a normalised branch), and the residual multipliers by LayerNorm's scale
    invariance: post-LN ``LN(lam x + g f) = LN(x + (g / lam) f)``, pre-LN the stream
    rescaled by the running product ``s`` of the multipliers, ``x + (g / s) f`` (the final
    norm and every branch's input norm do not see ``s``); no norm: one multiplier for all
    blocks becomes ``alpha``. ``before`` without ``layers`` gets them from its own
    parameters.

    A pre-LN spec carries its branch output variances in units of the embeddings' squared
    norm q0 (the stream is scale-free under pre-LN; :mod:`sigprop.models.arch`). When the
    methods take the norms away, the branches read the stream as it is, so with
    ``embed_q`` (the measured q0) the variances return to absolute units and the first
    block starts from ``q0 = embed_q``; without it the stream is taken to start at 1. The
    same holds where Dynamic Tanh takes the norms' place (tanh reads the stream's scale) or
    some blocks become post-LN (Mix-LN: they read the raw stream and reset its scale)."""
    spec = before if before.layers is not None else _with_layers(before)
    L = spec.depth
    norm = effect.norm or spec.norm
    scale_free = norm == "pre" and effect.dyt is None and all(
        x in (None, "pre") for x in (effect.layer_norm or ()))
    if spec.norm == "pre" and not scale_free and embed_q is not None and spec.q0 is None:
        spec = _unabsorbed(spec, float(embed_q))
    # a pre-LN spec's branch variances are in units of the embeddings' q0 (docstring)
    unit = float(embed_q) if norm == "pre" and spec.q0 is None and embed_q else 1.0
    ga, gm = effect.gate_attn.copy(), effect.gate_mlp.copy()
    la, lm = effect.lam_attn, effect.lam_mlp
    alpha_a, alpha_m = spec.alpha_attn, spec.alpha_mlp
    if np.any(la != 1) or np.any(lm != 1):
        if norm == "post":
            ga, gm = ga / la, gm / lm
        elif norm == "pre":
            s = 1.0
            for i in range(L):
                s *= la[i]
                ga[i] /= s
                s *= lm[i]
                gm[i] /= s
        else:
            if np.ptp(la) > 0 or np.ptp(lm) > 0:
                raise SpecError("method", "per-layer residual multipliers on a stack without "
                                          "LayerNorm are outside the theory")
            alpha_a, alpha_m = alpha_a * float(la[0]), alpha_m * float(lm[0])
    layers = []
    for i, lay in enumerate(spec.layers):
        sig = np.asarray(lay.sigma_s, dtype=np.float64)
        if effect.zero_q:
            sig = np.zeros_like(sig)
        elif effect.score_std is not None:
            sig = np.broadcast_to(np.asarray(effect.score_std[i], dtype=np.float64),
                                  sig.shape).copy()
        else:
            sig = sig * effect.qk[i]
        var_v = lay.var_v * effect.v[i] ** 2
        var_o = None if lay.var_o is None else lay.var_o * effect.o[i] ** 2
        gain2 = lay.branch_gain2
        if effect.branch_gain2 is not None:  # norms put on the branch outputs (Peri-LN)
            gain2 = tuple(g / unit for g in effect.branch_gain2[i])
        hn = lay.head_norm2
        if effect.head_norm2 is not None:  # a per-head norm before W_O (diff-attn): its
            hn = effect.head_norm2[i] / (unit if var_o is None else 1.0)  # gain is the output
        if gain2 is not None:  # the gate acts after the branch's own norm
            gain2 = (gain2[0] * ga[i] ** 2, gain2[1] * gm[i] ** 2)
        elif var_o is not None:
            var_o = var_o * ga[i] ** 2
        elif hn is not None:
            hn = hn * ga[i] ** 2
        else:
            var_v = var_v * ga[i] ** 2
        var_w_out = lay.var_w_out * effect.mlp_out[i] ** 2
        if gain2 is None:
            var_w_out = var_w_out * gm[i] ** 2
        extra = {}
        if effect.sink_logit is not None and effect.sink_logit[i] is not None:
            extra["sink_logit"] = tuple(effect.sink_logit[i])
        if effect.gate is not None and effect.gate[i] is not None:
            extra["gate_var"], extra["gate_bias2"] = effect.gate[i]
        for name in ("layer_norm", "dyt", "value_mix", "sigmoid_bias", "diff_lambda"):
            got = getattr(effect, name)  # Mix-LN, DyT, value residual, the two maps
            if got is not None and got[i] is not None:
                extra["norm" if name == "layer_norm" else name] = got[i]
        layers.append(replace(lay, sigma_s=tuple(sig.tolist()), var_v=var_v, var_o=var_o,
                              var_w_in=lay.var_w_in * effect.mlp_in[i] ** 2,
                              var_w_out=var_w_out, branch_gain2=gain2, head_norm2=hn, **extra))
    out = spec.replace(layers=tuple(layers), norm=norm, alpha_attn=alpha_a, alpha_mlp=alpha_m)
    if effect.attention is not None:
        out = out.replace(attention=effect.attention)
    if effect.scaling is not None:
        out = out.replace(scaling=effect.scaling[0], scaling_param=effect.scaling[1])
    return out


def _unabsorbed(spec: ArchSpec, q0: float) -> ArchSpec:
    """A pre-LN per-layer ``spec`` (variances in units of the embeddings' q0) in absolute
    units, starting from ``q0``."""
    if not (math.isfinite(q0) and q0 > 0):
        raise SpecError("embed_q", f"must be a positive finite number (got {q0!r})")
    layers = tuple(replace(
        x, var_o=None if x.var_o is None else x.var_o * q0, var_w_out=x.var_w_out * q0,
        cross_var_o=None if x.cross_var_o is None else x.cross_var_o * q0,
        branch_gain2=None if x.branch_gain2 is None else tuple(g * q0 for g in x.branch_gain2))
        for x in spec.layers)
    return spec.replace(layers=layers, q0=q0)


def _with_layers(spec: ArchSpec) -> ArchSpec:
    """``spec`` with one explicit :class:`LayerSpec` per block from its global parameters."""
    sig = float(spec.sigma_s) / spec.multiplier  # the layers' stds exclude the length scaling
    lay = LayerSpec(sigma_s=(sig,) * spec.heads, var_v=spec.var_v, var_o=spec.var_o,
                    var_w_in=spec.var_w_in, var_w_out=spec.var_w_out, var_b=spec.sigma_b2)
    return spec.replace(beta=None, qk_std=None, layers=(lay,) * spec.depth)
