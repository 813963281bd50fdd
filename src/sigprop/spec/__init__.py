"""ArchSpec: the one validated description of an architecture (docs/architecture.md).

Both the theory map (:func:`sigprop.theory.depth.propagate`) and the torch model are built from
an :class:`ArchSpec`. Bad values raise :class:`SpecError`, whose message is one line naming the
field and its allowed range; the CLI prints it and exits with code 2.

Variance conventions (docs/theory.md §2.4-2.5): ``sigma_v2``, ``sigma_w2``, ``sigma_o2`` are weight
variances *times fan-in* (``W_V ~ N(0, sigma_v2 / d)``); ``sigma_b2`` is the variance of every
bias. Two ways to set them:

* **HF mode** (no explicit ``sigma_v2`` / ``sigma_w2``): every weight is ``N(0, init_std^2)`` as
  HuggingFace initialises BERT/GPT-2, so ``sigma_v2 = sigma_o2 = init_std^2 d``, the MLP input
  ``sigma_w2 = init_std^2 d`` and output ``sigma_w2_out = init_std^2 d_ff``; an output
  projection ``W_O`` is present.
* **mean-field mode** (``sigma_v2`` or ``sigma_w2`` given): gg25's parametrisation, one
  ``sigma_w2`` for both MLP matrices and no output projection unless ``sigma_o2`` is given.
  A variance left unset takes its HF-mode value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from .checks import (
    SpecError,
    check_attention_map,
    check_choice,
    check_float,
    check_int,
    check_moe,
    float_tuple,
)

NORMS = ("post", "pre", "none")
LN_KINDS = ("rms", "layernorm")
ATTENTIONS = ("softmax", "centred", "uniform", "identity")
ACTIVATIONS = ("relu", "gelu", "tanh", "silu", "linear", "swiglu", "geglu")
SCALINGS = ("none", "log-n", "sqrt-log-n", "qwen", "sqrt-qwen", "ssmax", "yarn", "tau")

#: Default reference length for the length scalings (training context of BERT-base).
DEFAULT_TRAIN_LEN = 512
#: routing-weight rules of a mixture-of-experts MLP (docs/theory.md §2.5.2)
MOE_WEIGHTINGS = ("softmax_norm", "softmax", "sigmoid_norm", "sigmoid")
#: largest |attention sink logit| a LayerSpec accepts (docs/theory.md §2.4.3)
SINK_MAX = 50.0
#: token mixers a LayerSpec takes from the measurement (docs/theory.md §2.8.1)
MIXERS = ("measured",)
MAX_SEQ_LEN = 2**30


# --------------------------------------------------------------------------------------------
# Context-length score scalings (docs/theory.md §3.2, clpr25 Table 1)
# --------------------------------------------------------------------------------------------
def _default_scaling_param(kind: str) -> float:
    return {
        "none": 1.0,
        "log-n": float(DEFAULT_TRAIN_LEN),  # reference length n_ref
        "sqrt-log-n": float(DEFAULT_TRAIN_LEN),  # reference length n_ref
        "sqrt-qwen": float(DEFAULT_TRAIN_LEN),  # training length n_train
        "qwen": float(DEFAULT_TRAIN_LEN),  # training length n_train
        "ssmax": 1.0 / math.log(DEFAULT_TRAIN_LEN),  # s, so that s log n = 1 at n = 512
        "yarn": 1.0,  # context extension factor s
        "tau": 1.0,  # temperature tau
    }[kind]


def score_multiplier(kind: str, n, param: float | None = None) -> np.ndarray:
    """Multiplier ``s(n)`` applied to the attention logits (so to beta), docs/theory.md §3.2.

    Exact forms implemented (``n`` = number of keys, vectorised over ``n``):

    * ``none``: 1.
    * ``log-n``: ``log n / log n_ref`` (``param = n_ref``, default 512): clpr25's critical
      log-length scaling, normalised to 1 at the reference (training) length.
    * ``sqrt-log-n``: ``sqrt(log n / log n_ref)`` (``param = n_ref``, default 512): gg25's
      scaling, which holds beta = sigma_s / sqrt(log n) fixed as n grows.
    * ``sqrt-qwen``: ``max(1, sqrt(log n / log n_train))`` (``param = n_train``, default 512):
      gg25's square root applied only beyond the training length, as Qwen clips log-n, so
      contexts the model was trained on keep their logits.
    * ``qwen``: ``max(1, log n / log n_train)`` (``param = n_train``, default 512): Qwen's
      ``log_{n_train} n`` applied only beyond the training length.
    * ``ssmax``: ``s log n`` (``param = s``, default ``1/log 512``): Scalable-Softmax.
    * ``yarn``: ``(0.1 ln s + 1)^2`` (``param = s >= 1``, default 1): YaRN's attention factor
      ``sqrt(1/t) = 0.1 ln s + 1`` applied to both queries and keys, hence squared in the logits;
      independent of n.
    * ``tau``: ``tau`` (``param = tau``, default 1): noci22's temperature, which multiplies the
      logits (Eq. 45: ``softmax(tau X W_Q W_K^T X^T / sqrt(d_k))``), so the printed
      ``tau_star`` (Eq. 47) is used as it is.
    """
    if kind not in SCALINGS:
        raise SpecError("scaling", f"must be one of {', '.join(SCALINGS)} (got {kind!r})")
    p = _default_scaling_param(kind) if param is None else float(param)
    n = np.asarray(n, dtype=np.float64)
    logn = np.log(np.maximum(n, 1.0))
    if kind == "none":
        return np.ones_like(n)
    if kind == "log-n":
        return logn / math.log(p)
    if kind == "sqrt-log-n":
        return np.sqrt(logn / math.log(p))
    if kind == "qwen":
        return np.maximum(1.0, logn / math.log(p))
    if kind == "sqrt-qwen":
        return np.sqrt(np.maximum(1.0, logn / math.log(p)))
    if kind == "ssmax":
        return p * logn
    if kind == "yarn":
        return np.full_like(n, (0.1 * math.log(p) + 1.0) ** 2)
    return np.full_like(n, p)  # tau multiplies the logits (noci22 Eq. 45)


@dataclass(frozen=True)
class LayerSpec:
    """One block's theory parameters read from its weights (docs/theory.md §2.8).

    ``sigma_s``: the score std of each query head for inputs with q = 1 at the canonical
    logit scale ``1/sqrt(d_head)`` (the spec's ``multiplier`` -- model logit scale, length
    scaling -- comes on top), from ``W_Q``, ``W_K``, their biases and the norm gains in front
    of them (QK-norm: from the norm gains). ``head_weights``: each head's share of the
    attention output's variance (``|W_O^h|^2 |W_V^h|^2``), normalised to mean 1 (None: equal).
    Variances are per output dimension for unit-variance inputs, i.e. weight variance times
    fan-in as in :class:`ArchSpec`; ``var_o`` None means no output projection; ``var_b`` the
    mean squared bias of the block's value, output and MLP biases. ``cross_*``: a decoder
    block's cross-attention over the encoder output (``ArchSpec.memory_*``): its per-head
    score std (queries at q = 1, keys at q = 1) and value / output variances.
    ``branch_gain2``: pre-LN blocks whose branch outputs are normalised before the residual
    add (Gemma 2, OLMo 2): the mean squared gains of those two norms (attention, MLP).
    ``sink_logit``: learned attention sinks (gpt-oss, "off-by-one softmax"), one logit per
    query head added to the softmax denominator only, in the units of the final (scaled)
    logits (docs/theory.md §2.4.3). ``gate_var``: output-gated attention (Qwen3-Next): each
    head's output is multiplied elementwise by ``sigmoid(x W_g + b_g)`` before ``W_O``;
    ``gate_var`` is ``W_g``'s variance times fan-in (with the gains of the norm in front),
    ``gate_bias2`` the mean square of ``b_g`` (docs/theory.md §2.4.4).
    ``moe_*``: a mixture-of-experts MLP (docs/theory.md §2.5.2): ``moe_experts`` routed
    experts (each an MLP with ``var_w_in`` / ``var_w_out``), ``moe_top_k`` of them per
    token, a router ``W_r`` of variance times fan-in ``moe_router_var``, routing weights by
    ``moe_weighting`` (:data:`MOE_WEIGHTINGS`) times ``moe_scale``; a shared expert (an MLP
    of the same activation every token passes through) with ``moe_shared_var_in`` /
    ``moe_shared_var_out``, its output times ``sigmoid(x w_s)`` where ``moe_shared_gate_var``
    (``w_s``'s variance times fan-in) is given.
    ``mixer``: ``"measured"`` for a block whose token mixer is not attention (Mamba, linear
    attention, ... in a hybrid stack, docs/theory.md §2.8.1): the whole block (mixer and its
    MLP) is the measured residual map ``mixer_map = (q_in, cos_in, q_out, cos_out)``, the
    block's measured input and output squared norm per dimension (in the theory's units)
    and mean token cosine; its attention and MLP fields are unused (``sigma_s`` (0,) by
    convention). ``mixer_map`` None: not filled yet (``sigprop diagnose`` fills it); the
    theory then refuses the layer. ``glu_shift``: a gated MLP whose up branch is shifted by a
    constant, ``phi(g) (u + c)`` (gpt-oss: c = 1): ``c^2`` over the up branch's variance
    ratio folded into ``var_w_out`` (docs/theory.md §2.5.3); 0 for none.
    ``norm``: this block's norm placement in place of the spec's (``post``, ``pre``,
    ``none``; Mix-LN: post-LN blocks below pre-LN ones, docs/theory.md §2.6.1); None: the
    spec's. ``dyt``: Dynamic Tanh in place of the block's two norms, ``tanh(alpha x)``
    elementwise with ``(alpha_attn, alpha_mlp)`` for the norm of the attention's and of the
    MLP's input (post-LN: the norms after the attention's and the MLP's add;
    docs/theory.md §2.6.2); needs a block with a norm. ``value_mix``: value residual
    learning, ``(lambda_self, lambda_first)``: the block's values are
    ``lambda_self V + lambda_first V_1`` with ``V_1`` the first block's (docs/theory.md
    §2.4.6); not on the first block. ``sigmoid_bias = (k, b0)``: sigmoid attention,
    ``w = sigmoid(z + b0 - k log n)`` in place of the softmax (n the row's visible keys;
    §2.4.7). ``diff_lambda = (lambda_init, lambda_std)``: differential attention, two
    half-width softmax maps ``A1 - lambda A2``, ``lambda = exp(l1 . l2) - exp(l3 . l4) +
    lambda_init`` with the four vectors' entries N(0, lambda_std^2) (§2.4.8). ``head_norm2``:
    each head's output RMS-normalised (before ``W_O``) times a gain of this mean square.
    """

    sigma_s: tuple[float, ...]
    var_v: float
    var_o: float | None
    var_w_in: float
    var_w_out: float
    var_b: float = 0.0
    head_weights: tuple[float, ...] | None = None
    cross_sigma_s: tuple[float, ...] | None = None
    cross_var_v: float | None = None
    cross_var_o: float | None = None
    branch_gain2: tuple[float, float] | None = None
    sink_logit: tuple[float, ...] | None = None
    gate_var: float | None = None
    gate_bias2: float = 0.0
    moe_experts: int | None = None
    moe_top_k: int = 1
    moe_router_var: float = 0.0
    moe_weighting: str = "softmax_norm"
    moe_scale: float = 1.0
    moe_shared_var_in: float | None = None
    moe_shared_var_out: float | None = None
    moe_shared_gate_var: float | None = None
    mixer: str | None = None
    mixer_map: tuple[float, float, float, float] | None = None
    glu_shift: float = 0.0
    norm: str | None = None
    dyt: tuple[float, float] | None = None
    value_mix: tuple[float, float] | None = None
    sigmoid_bias: tuple[float, float] | None = None
    diff_lambda: tuple[float, float] | None = None
    head_norm2: float | None = None

    def __post_init__(self) -> None:
        check_moe(self, MOE_WEIGHTINGS)
        check_attention_map(self)
        if self.norm is not None:
            check_choice("layers.norm", self.norm, NORMS)
        if self.dyt is not None:
            a = float_tuple("layers.dyt", self.dyt, 0.0, 1e4, size=2,
                             need="(attention, MLP) tanh slopes alpha (got {got} values)")
            if min(a) <= 0:
                raise SpecError("layers.dyt", f"needs slopes alpha > 0 (got {self.dyt!r})")
            object.__setattr__(self, "dyt", a)
            for name in ("branch_gain2", "cross_sigma_s", "mixer"):
                if getattr(self, name) is not None:
                    raise SpecError("layers.dyt", f"Dynamic Tanh with {name} is outside the "
                                                  "theory (one tanh per norm of a plain block)")
        if self.value_mix is not None:
            v = float_tuple("layers.value_mix", self.value_mix, 0.0, 1e3, size=2,
                             need="(lambda_self, lambda_first) (got {got} values)")
            object.__setattr__(self, "value_mix", v)
            if self.mixer is not None:
                raise SpecError("layers.value_mix", "a measured mixer has no values to mix")
        self._check_mixer()
        check_float("layers.glu_shift", self.glu_shift, 0.0, 1e12)
        object.__setattr__(self, "glu_shift", float(self.glu_shift))
        if self.branch_gain2 is not None:
            g = float_tuple("layers.branch_gain2", self.branch_gain2, 0.0, 1e12, size=2,
                             need="(attention, MLP) mean squared gains (got {got} values)")
            object.__setattr__(self, "branch_gain2", g)
        if self.cross_sigma_s is not None:
            cs = float_tuple("layers.cross_sigma_s", self.cross_sigma_s, 0.0, 1e6, array=True)
            object.__setattr__(self, "cross_sigma_s", cs)
            for name in ("cross_var_v", "cross_var_o"):
                if getattr(self, name) is None:
                    raise SpecError(f"layers.{name}", "needed with cross_sigma_s")
                check_float(f"layers.{name}", getattr(self, name), 0.0, 1e12)
        sig = float_tuple("layers.sigma_s", self.sigma_s, 0.0, 1e6, array=True)
        if not sig:
            raise SpecError("layers.sigma_s", "needs one score std per head (got none)")
        object.__setattr__(self, "sigma_s", sig)
        for name in ("var_v", "var_w_in", "var_w_out", "var_b"):
            check_float(f"layers.{name}", getattr(self, name), 0.0, 1e12)
        if self.var_o is not None:
            check_float("layers.var_o", self.var_o, 0.0, 1e12)
        per_head = f"{len(sig)} entries, one per head (got {{got}})"
        if self.head_weights is not None:
            w = float_tuple("layers.head_weights", self.head_weights, 0.0, 1e6,
                             size=len(sig), need=per_head)
            object.__setattr__(self, "head_weights", w)
        if self.sink_logit is not None:
            sk = float_tuple("layers.sink_logit", self.sink_logit, -SINK_MAX, SINK_MAX,
                              array=True, size=len(sig), need=per_head)
            object.__setattr__(self, "sink_logit", sk)
        if self.gate_var is not None:
            check_float("layers.gate_var", self.gate_var, 0.0, 1e6)
            object.__setattr__(self, "gate_var", float(self.gate_var))
        check_float("layers.gate_bias2", self.gate_bias2, 0.0, 1e6)
        if self.gate_bias2 and self.gate_var is None:
            raise SpecError("layers.gate_bias2", "needs gate_var (an output gate)")

    def _check_mixer(self) -> None:
        if self.mixer is None:
            if self.mixer_map is not None:
                raise SpecError("layers.mixer_map", "needs mixer='measured'")
            return
        check_choice("layers.mixer", self.mixer, MIXERS)
        if self.mixer_map is None:
            return
        try:
            m = tuple(float(x) for x in self.mixer_map)
        except (TypeError, ValueError):
            raise SpecError("layers.mixer_map", "needs (q_in, cos_in, q_out, cos_out) "
                                                f"(got {self.mixer_map!r})") from None
        if len(m) != 4:
            raise SpecError("layers.mixer_map", "needs (q_in, cos_in, q_out, cos_out) "
                                                f"(got {len(m)} values)")
        for i, name in ((0, "q_in"), (2, "q_out")):
            check_float(f"layers.mixer_map.{name}", m[i], 0.0, 1e300, lo_open=True)
        for i, name in ((1, "cos_in"), (3, "cos_out")):
            check_float(f"layers.mixer_map.{name}", m[i], -1.0, 1.0)
        object.__setattr__(self, "mixer_map", m)

    @property
    def measured(self) -> bool:
        """Whether this block is a measured residual map (``mixer``), not attention."""
        return self.mixer is not None

    @property
    def sigma_rms(self) -> float:
        """Root mean square of the heads' score stds."""
        return float(np.sqrt(np.mean(np.square(self.sigma_s))))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerSpec:
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict):
            raise SpecError("layers", f"each entry must be a mapping (got {data!r})")
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecError(f"layers.{unknown[0]}",
                            f"unknown field; allowed: {', '.join(sorted(names))}")
        return cls(**data)


@dataclass(frozen=True)
class ArchSpec:
    """A transformer architecture at initialisation (docs/cli.md spec table; defaults = BERT-base).

    Set the score scale either with ``beta`` (gg25 Eq. 11, docs/theory.md §2.1; REM initialisation)
    or with ``qk_std`` (raw Q/K weight std); when neither is given ``qk_std = init_std``.
    """

    depth: int = 12
    d_model: int = 768
    heads: int = 12
    d_ff: int | None = None
    seq_len: int = 512
    norm: str = "post"
    ln_kind: str = "rms"
    attention: str = "softmax"
    beta: float | None = None
    qk_std: float | None = None
    scaling: str = "none"
    scaling_param: float | None = None
    alpha_attn: float = 1.0
    alpha_mlp: float = 1.0
    init_std: float = 0.02
    sigma_v2: float | None = None
    sigma_w2: float | None = None
    sigma_w2_out: float | None = None
    sigma_o2: float | None = None
    sigma_b2: float = 0.0
    activation: str = "relu"
    causal: bool = False
    parallel: bool = False
    rho0: float | None = None
    q0: float | None = None
    rho_max: float = 0.9
    layers: tuple[LayerSpec, ...] | None = None
    memory_len: int | None = None
    memory_q: float | None = None
    memory_rho: float | None = None

    def __post_init__(self) -> None:
        check_int("depth", self.depth, 1, 100_000)
        check_int("d_model", self.d_model, 1, 1_000_000)
        check_int("heads", self.heads, 1, self.d_model)
        if self.d_model % self.heads:
            raise SpecError("heads", f"must divide d_model={self.d_model} (got {self.heads})")
        if self.d_ff is not None:
            check_int("d_ff", self.d_ff, 1, 10_000_000)
        check_int("seq_len", self.seq_len, 2, MAX_SEQ_LEN)
        check_choice("norm", self.norm, NORMS)
        check_choice("ln_kind", self.ln_kind, LN_KINDS)
        check_choice("attention", self.attention, ATTENTIONS)
        check_choice("scaling", self.scaling, SCALINGS)
        check_choice("activation", self.activation, ACTIVATIONS)
        if self.beta is not None and self.qk_std is not None:
            raise SpecError("beta", "give beta or qk_std, not both")
        if self.beta is not None:
            check_float("beta", self.beta, 0.0, 1e4)
        if self.qk_std is not None:
            check_float("qk_std", self.qk_std, 0.0, 1e3)
        if self.scaling_param is not None:
            check_float("scaling_param", self.scaling_param, 0.0, 1e12, lo_open=True)
            if self.scaling in ("log-n", "sqrt-log-n", "qwen", "sqrt-qwen") and \
                    self.scaling_param <= 1:
                raise SpecError("scaling_param", f"must be a length > 1 for {self.scaling}")
            if self.scaling == "yarn" and self.scaling_param < 1:
                raise SpecError("scaling_param", "must be >= 1 for yarn (extension factor)")
        check_float("alpha_attn", self.alpha_attn, 0.0, 1e6)
        check_float("alpha_mlp", self.alpha_mlp, 0.0, 1e6)
        check_float("init_std", self.init_std, 0.0, 1e3, lo_open=True)
        for name in ("sigma_v2", "sigma_w2", "sigma_w2_out", "sigma_o2"):
            if getattr(self, name) is not None:
                check_float(name, getattr(self, name), 0.0, 1e6)
        check_float("sigma_b2", self.sigma_b2, 0.0, 1e6)
        if not isinstance(self.causal, bool | np.bool_):
            raise SpecError("causal", f"must be true or false (got {self.causal!r})")
        if not isinstance(self.parallel, bool | np.bool_):
            raise SpecError("parallel", f"must be true or false (got {self.parallel!r})")
        if self.rho0 is not None:
            check_float("rho0", self.rho0, 0.0, 1.0)
        if self.q0 is not None:
            check_float("q0", self.q0, 0.0, 1e12, lo_open=True)
        check_float("rho_max", self.rho_max, 0.0, 1.0, lo_open=True)
        if self.layers is not None:
            if self.beta is not None or self.qk_std is not None:
                raise SpecError("layers", "give layers (scores from the weights) or beta / "
                                          "qk_std, not both")
            if isinstance(self.layers, LayerSpec | dict) or not hasattr(self.layers, "__len__"):
                raise SpecError("layers", "must be a list with one entry per layer")
            lay = tuple(x if isinstance(x, LayerSpec) else LayerSpec.from_dict(x)
                        for x in self.layers)
            if len(lay) != self.depth:
                raise SpecError("layers", f"needs depth={self.depth} entries (got {len(lay)})")
            object.__setattr__(self, "layers", lay)
            self._check_layer_norms(lay)
            for f in ("sink_logit", "sigmoid_bias", "diff_lambda"):
                if self.attention != "softmax" and any(getattr(x, f) is not None for x in lay):
                    raise SpecError(f"layers.{f}", "a map in place of the softmax needs softmax "
                                                   f"attention (got {self.attention!r})")
        if self.memory_len is not None:
            check_int("memory_len", self.memory_len, 1, MAX_SEQ_LEN)
            check_float("memory_q", self.memory_q, 0.0, 1e12, lo_open=True)
            check_float("memory_rho", self.memory_rho, 0.0, 1.0)
        if self.layers is not None and any(x.cross_sigma_s is not None for x in self.layers) \
                and self.memory_len is None:
            raise SpecError("memory_len", "layers with cross-attention need the encoder "
                                          "output's memory_len, memory_q and memory_rho")

    def _check_layer_norms(self, lay: tuple[LayerSpec, ...]) -> None:
        """Per-block norms, Dynamic Tanh and value residuals that the stack can hold."""
        if lay[0].value_mix is not None:
            raise SpecError("layers.value_mix", "the first block has no earlier values to mix "
                                                "in (give it from the second block on)")
        for x in lay:
            if x.dyt is not None and (x.norm or self.norm) == "none":
                raise SpecError("layers.dyt", "Dynamic Tanh takes the place of a norm; this "
                                              "block has none (norm none)")
            if (x.norm or self.norm) != self.norm and self.parallel:
                raise SpecError("layers.norm", "a per-block norm placement needs sequential "
                                               "blocks (parallel is true)")

    # ---------------------------------------------------------------- resolved widths/variances
    @property
    def d_head(self) -> int:
        return self.d_model // self.heads

    @property
    def ff(self) -> int:
        """MLP width (``d_ff``, default 4 d)."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def mean_field_mode(self) -> bool:
        return self.sigma_v2 is not None or self.sigma_w2 is not None

    @property
    def var_v(self) -> float:
        """Value weight variance times fan-in (docs/theory.md §2.4)."""
        return self.sigma_v2 if self.sigma_v2 is not None else self.init_std**2 * self.d_model

    @property
    def var_w_in(self) -> float:
        """MLP first-matrix variance times fan-in (docs/theory.md §2.5)."""
        return self.sigma_w2 if self.sigma_w2 is not None else self.init_std**2 * self.d_model

    @property
    def var_w_out(self) -> float:
        """MLP second-matrix variance times fan-in ``d_ff``."""
        if self.sigma_w2_out is not None:
            return self.sigma_w2_out
        if self.mean_field_mode:
            return self.var_w_in
        return self.init_std**2 * self.ff

    @property
    def var_o(self) -> float | None:
        """Output-projection variance times fan-in, or None when there is no W_O."""
        if self.sigma_o2 is not None:
            return self.sigma_o2
        return None if self.mean_field_mode else self.init_std**2 * self.d_model

    @property
    def rho_init(self) -> float:
        return 0.0 if self.rho0 is None else float(self.rho0)

    @property
    def q_init(self) -> float:
        """Squared norm per dimension of the first block's input (``q0``; default 1). A
        post-LN stack whose embeddings are not normalised (ALBERT's and ELECTRA's projected
        embeddings) starts its first block from this raw input."""
        return 1.0 if self.q0 is None else float(self.q0)

    # ---------------------------------------------------------------- score scale (docs/theory.md
    # §2.1)
    @property
    def multiplier(self) -> float:
        """Score multiplier of the length scaling at ``seq_len`` (docs/theory.md §3.2)."""
        return float(score_multiplier(self.scaling, self.seq_len, self.scaling_param))

    @property
    def sigma_s(self) -> float:
        """Score std for inputs with q = 1, including the length scaling (docs/theory.md §2.1).

        ``layers`` given (read from weights): the root mean square over layers and heads of
        their score stds (attention layers only: a measured mixer has none); else ``beta``
        given: ``sigma_s = beta sqrt(log T)`` (REM initialisation); otherwise ``sigma_s =
        qk_std^2 d`` (``sigma_q = sigma_k = qk_std``, any number of heads).
        """
        if self.layers is not None:
            att = [x for x in self.layers if not x.measured] or list(self.layers)
            base = float(np.sqrt(np.mean([np.mean(np.square(x.sigma_s)) for x in att])))
        elif self.beta is not None:
            base = self.beta * math.sqrt(math.log(self.seq_len))
        else:
            s = self.qk_std if self.qk_std is not None else self.init_std
            base = s * s * self.d_model
        return base * self.multiplier

    @property
    def beta_eff(self) -> float:
        """gg25's effective inverse temperature ``sigma_s / sqrt(log T)`` (gg25 B.1)."""
        return self.sigma_s / math.sqrt(math.log(self.seq_len))

    def rem_qk_std(self) -> float:
        """Q/K weight std giving this spec's beta for any number of heads (docs/theory.md §2.1):
        ``sigma_q = sigma_k = sqrt(beta sqrt(log T) / d)`` (before the length scaling)."""
        return math.sqrt(self.sigma_s / self.multiplier / self.d_model)

    def derived(self, rho: float | None = None) -> dict[str, float]:
        """docs/theory.md §6: the first layer's score scale in the five papers' terms, at input
        cosine
        ``rho`` (default the spec's ``rho0``, else 0). noci22's ``tau_star`` needs the uniform
        attention theory and is added by :mod:`sigprop.theory.uniform` where available."""
        r = self.rho_init if rho is None else float(rho)
        T = self.seq_len
        logT = math.log(T)
        s = self.sigma_s
        beta = self.beta_eff
        bc = math.inf if r >= 1 else math.sqrt(2.0 / (1.0 - r))
        with np.errstate(over="ignore"):
            sigma_a = float(np.sqrt(np.expm1(s * s * (1.0 - r))))
        return {
            "sigma_s": s,
            "beta": beta,
            "beta_c": bc,
            "beta_over_beta_c": beta / bc,
            "gamma": s / logT,
            "gamma_c": math.inf if r >= 1 else 1.0 / (1.0 - r),
            "gamma_one_minus_rho": s / logT * (1.0 - r),
            "deshpande_ratio": s * math.sqrt(1.0 - r) / math.sqrt(2.0 * logT),
            "sigma_A": sigma_a,
            "tau": self.scaling_param if self.scaling == "tau" and self.scaling_param else 1.0,
            "rho0": r,
            "d_head": self.d_head,
            "multiplier": self.multiplier,
        }

    # ---------------------------------------------------------------- conversions
    def layer_at(self, layer: int) -> LayerSpec:
        """The ``LayerSpec`` of block ``layer`` (1-based; beyond the last layer the last
        one's). Needs ``layers``."""
        return self.layers[min(max(layer, 1), len(self.layers)) - 1]

    def layer_sigma(self, layer: int) -> np.ndarray:
        """Effective per-head score stds of block ``layer`` (1-based; beyond the last layer the
        last one's), including the length scaling; one entry when the spec has no ``layers``."""
        if self.layers is None:
            return np.array([self.sigma_s])
        return np.asarray(self.layer_at(layer).sigma_s) * self.multiplier

    def with_beta(self, beta: float) -> ArchSpec:
        """This spec with the effective beta (at ``seq_len``, length scaling included) set to
        ``beta``. A spec read from weights keeps its per-layer, per-head structure: every
        layer's heads are rescaled together so that the layer's RMS beta is ``beta`` (what
        rescaling each layer's W_Q and W_K does); otherwise ``qk_std`` is set (REM init)."""
        check_float("beta", beta, 0.0, 1e4)
        if self.layers is None:
            new = replace(self, beta=float(beta), qk_std=None)
            return replace(new, qk_std=new.rem_qk_std(), beta=None)
        target = float(beta) * math.sqrt(math.log(self.seq_len)) / self.multiplier
        lay = []
        for x in self.layers:
            f = target / x.sigma_rms if x.sigma_rms > 0 else 0.0
            lay.append(replace(x, sigma_s=tuple(v * f for v in x.sigma_s)))
        return replace(self, layers=tuple(lay))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArchSpec:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecError(unknown[0], f"unknown field; allowed: {', '.join(sorted(names))}")
        return cls(**data)

    def replace(self, **changes: Any) -> ArchSpec:
        return replace(self, **changes)
