"""Transformer blocks as maps of the homogeneous token state (q, p) (docs/theory.md §2.4-2.6).

Every function is NumPy float64 and broadcasts over arrays of any parameter, so the same code
serves one spec (:func:`propagate`) and a whole trainability grid (:mod:`.diagram`).

State: ``q = E|x|^2/d``, ``p = E<x_a, x_b>/d``, ``rho = p/q`` (docs/theory.md §1). LayerNorm is the
RMS-style norm of gg25 (no mean subtraction); standard LayerNorm gives the same map at large d
(the feature mean of a token at init is O(1/sqrt d)), so ``ln_kind`` does not enter the theory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec import ArchSpec, SpecError
from . import attn_maps, causal_positions, fluct, kernels
from . import causal as causal_nodes
from . import moe as _moe
from .attention import AttentionStats, attention_stats, identity_stats, uniform_stats
from .attn_maps import cross_map
from .causal_positions import causal_grid


def attention_map(q, p, st: AttentionStats, *, variant: str, var_v, var_b, var_o=None,
                  gate=None, first=None, head_norm2=None):
    """(q, p) after one attention layer (docs/theory.md §2.4), before the residual.

    softmax/uniform: ``q_att = s_v^2 [p + (q-p) Y2] + s_b^2``, ``p_att = s_v^2 [p + (q-p) Yx]
    + s_b^2``; centred (A - 11^T/T): ``s_v^2 (q-p)(Y2 - 1/T)`` and ``s_v^2 (q-p)(Yx - 1/T)``
    (causal: the row means 1/t, see :class:`AttentionStats`). Attention sinks (``st.w2``,
    ``st.wx``, §2.4.3): the mean and value-bias terms carry the rows' masses,
    ``s_v^2 [p E W^2 + (q-p) Y2s] + s_b^2 E W^2`` (pairs: ``E W_a W_c``, ``Yxs``). ``gate``:
    ``(E sigmoid(g)^2, E sigmoid(g) sigmoid(g'))`` of an output gate (§2.4.4), multiplying
    the head outputs' moments before ``W_O``. ``first``: value residual learning
    (§2.4.6), a :class:`~.attn_maps.ValueMix` (``ls2`` = lambda_self^2, ``lf2``, ``k1``,
    ``c1``), ``(k1, c1)`` the first block's value kernel (diagonal, off-diagonal): the
    values' kernel is ``lambda_self^2`` times the block's own plus ``lambda_first^2 (k1,
    c1)``, which the same rows mix. ``head_norm2`` (§2.4.8): each head's output
    RMS-normalised to this mean square, its cosine kept. With an output projection:
    ``q -> s_o^2 q + s_b^2`` (same for p).
    """
    if variant == "centred":
        # E sum_b (A_ab - 1/t)^2 >= 0 and |E sum_b (A_ab - m_a)(A_cb - m_c)| <= the diagonal
        # term (Cauchy-Schwarz over exchangeable rows): clip the table roundoff to those bounds
        y2c = np.maximum(st.y2 - st.inv_t, 0.0)
        qa = var_v * (q - p) * y2c
        pa = var_v * (q - p) * np.clip(st.yx - st.inv_t_cross, -y2c, y2c)
    else:
        w2 = 1.0 if st.w2 is None else st.w2
        wx = 1.0 if st.wx is None else st.wx
        qa = var_v * (p * w2 + (q - p) * st.y2) + var_b * w2
        pa = var_v * (p * wx + (q - p) * st.yx) + var_b * wx
    if first is not None:  # the first block's values: the same rows, their own kernel
        ls2, lf2, k1, c1 = first.ls2, first.lf2, first.k1, first.c1
        q1, p1 = attention_map(k1, c1, st, variant=variant, var_v=1.0, var_b=0.0)
        qa, pa = ls2 * qa + lf2 * q1, ls2 * pa + lf2 * p1
    if head_norm2 is not None:
        qa, pa = _renorm(qa, pa, head_norm2)
    if gate is not None:
        qa, pa = gate[0] * qa, gate[1] * pa
    if var_o is not None:
        qa, pa = var_o * qa + var_b, var_o * pa + var_b
    return qa, pa


def mlp_map(q, p, *, activation: str, var_w_in, var_w_out, var_b, moe: MoEParams | None = None,
            glu_shift=0.0):
    """(q, p) after the two-layer MLP (docs/theory.md §2.5, gg25 Eqs. 17-18). ``moe``
    (:attr:`BlockParams.moe`, docs/theory.md §2.5.2): a mixture of experts, whose routed
    part is the dense map times the routing factors ``c^2 (A, B)`` of :func:`.moe.factors`,
    plus the shared expert's dense map (times its sigmoid gate's kernel). ``glu_shift``
    (gated MLPs, docs/theory.md §2.5.3): the up branch ``u + c`` (gpt-oss) has second
    moments ``(q1 + s, p1 + s)`` in the folded units, ``s`` = :attr:`LayerSpec.glu_shift`."""
    q1, p1 = var_w_in * q + var_b, var_w_in * p + var_b
    if glu_shift and activation in ("swiglu", "geglu"):
        kd, ko = kernels.kernel("silu" if activation == "swiglu" else "gelu", q1, p1)
        k_diag, k_off = kd * (q1 + glu_shift), ko * (p1 + glu_shift)
    else:
        k_diag, k_off = kernels.kernel(activation, q1, p1)
    qh, ph = var_w_out * k_diag + var_b, var_w_out * k_off + var_b
    if moe is None:
        return qh, ph
    A, B = _moe.factors(moe.experts, moe.top_k, moe.router_var, moe.weighting, q, p)
    qh, ph = moe.scale**2 * A * qh, moe.scale**2 * B * ph
    if moe.shared_var_in is not None:
        qs, ps = mlp_map(q, p, activation=activation, var_w_in=moe.shared_var_in,
                         var_w_out=moe.shared_var_out, var_b=var_b)
        if moe.shared_gate_var is not None:
            qq, g = np.asarray(q, dtype=np.float64), moe.shared_gate_var
            gd, go = kernels.gate_kernel(g * qq, g * np.clip(p, -qq, qq))
            qs, ps = gd * qs, go * ps
        qh, ph = qh + qs, ph + ps
    return qh, ph


@dataclass(frozen=True, kw_only=True)
class MoEParams:
    """A mixture-of-experts MLP (docs/theory.md §2.5.2, :class:`~sigprop.spec.LayerSpec`'s
    ``moe_*`` fields): ``experts`` routed experts of which ``top_k`` per token, the router's
    variance ``router_var``, its ``weighting`` rule and output ``scale``; a shared expert's
    ``shared_var_in``, ``shared_var_out`` and sigmoid gate ``shared_gate_var`` (None
    without)."""

    experts: int
    top_k: int
    router_var: float
    weighting: str
    scale: float
    shared_var_in: float | None
    shared_var_out: float | None
    shared_gate_var: float | None


@dataclass(frozen=True, kw_only=True)
class CrossParams:
    """Cross-attention over an encoder output (docs/theory.md §2.8): the per-head score stds
    ``sigma_s``, the value and output variances ``var_v``, ``var_o``, and the memory's length
    ``memory_len``, token state ``memory_q`` and cosine ``memory_rho``."""

    sigma_s: np.ndarray
    var_v: float
    var_o: float
    memory_len: int
    memory_q: float
    memory_rho: float


@dataclass(frozen=True, kw_only=True)
class MixerMap:
    """A measured residual map in place of a whole block (a hybrid stack's non-attention
    mixer, docs/theory.md §2.8.1): the measured input ``q_in``, ``cos_in`` and output
    ``q_out``, ``cos_out`` (:attr:`~sigprop.spec.LayerSpec.mixer_map`)."""

    q_in: float
    cos_in: float
    q_out: float
    cos_out: float


@dataclass(frozen=True)
class BlockParams:
    """The block map's parameters; numeric fields may be broadcastable arrays."""

    sigma_s0: object  # score std for attention inputs with q = 1
    alpha_attn: object
    alpha_mlp: object
    var_v: object
    var_w_in: object
    var_w_out: object
    var_b: object
    var_o: object
    norm: str
    attention: str
    activation: str
    seq_len: int
    d_head: int | None
    causal: bool
    heads: int = 1
    ln_fluct: bool = True
    parallel: bool = False
    cross: CrossParams | None = None  # cross-attention over an encoder output, or None
    #: normalised branch outputs (attention, MLP mean squared gains), or None
    branch_gain2: tuple | None = None
    head_scale: np.ndarray | None = None  # per-head score std / sigma_s0 (RMS 1)
    head_w: np.ndarray | None = None  # per-head share of the attention output (mean 1)
    #: per-head attention sink logits (docs/theory.md §2.4.3), or None
    sink: np.ndarray | None = None
    #: output gate ``(var_g, gate bias mean square)`` (docs/theory.md §2.4.4), or None
    gate: tuple | None = None
    #: mixture-of-experts MLP (docs/theory.md §2.5.2), or None
    moe: MoEParams | None = None
    #: a measured residual map in place of the whole block (a hybrid stack's non-attention
    #: mixer, docs/theory.md §2.8.1), or None
    mixer: MixerMap | None = None
    #: constant shift of a gated MLP's up branch (docs/theory.md §2.5.3), 0 for none
    glu_shift: float = 0.0
    #: Dynamic Tanh slopes ``(alpha_attn, alpha_mlp)`` in place of the norms (§2.6.2), or None
    dyt: tuple | None = None
    #: value residual ``(lambda_self, lambda_first)`` (docs/theory.md §2.4.6), or None
    value_mix: tuple | None = None
    #: the first block's value kernel ``(diagonal, off-diagonal)`` that ``value_mix`` mixes
    #: in (:func:`value_kernel`; filled by :mod:`.depth`, which carries it), or None
    value_first: tuple | None = None
    #: sigmoid rows ``(k, b0)`` (§2.4.7); differential rows ``(E lambda, E lambda^2)``
    #: (§2.4.8); the per-head output norm's mean squared gain (§2.4.8); None: without
    sigmoid_bias: tuple | None = None
    diff_lambda: tuple | None = None
    head_norm2: float | None = None

    @property
    def softmax_rows(self) -> bool:
        """No sink, output gate, sigmoid or differential map: plain softmax rows, which the
        LayerNorm averages of :mod:`.fluct` were derived for."""
        return (self.sink is None and self.gate is None and self.sigmoid_bias is None
                and self.diff_lambda is None)

    @classmethod
    def from_spec(cls, spec: ArchSpec, layer: int | None = None, **override) -> BlockParams:
        """The parameters of block ``layer`` (1-based): a spec with ``layers`` (read from
        weights, docs/theory.md §2.8) gives each block its own score stds per head and
        variances (beyond the last layer, the last one's); otherwise every block has the
        spec's. ``layer=None`` on a spec with layers: layer 1."""
        base = dict(
            sigma_s0=spec.sigma_s, alpha_attn=spec.alpha_attn, alpha_mlp=spec.alpha_mlp,
            var_v=spec.var_v, var_w_in=spec.var_w_in, var_w_out=spec.var_w_out,
            var_b=spec.sigma_b2, var_o=spec.var_o, norm=spec.norm, attention=spec.attention,
            activation=spec.activation, seq_len=spec.seq_len, d_head=spec.d_head,
            causal=spec.causal, heads=spec.heads, parallel=spec.parallel,
        )
        if spec.layers is not None:
            lay = spec.layer_at(layer or 1)
            sig = np.asarray(lay.sigma_s, dtype=np.float64)
            rms = float(np.sqrt(np.mean(sig**2)))
            base.update(sigma_s0=rms * spec.multiplier, var_v=lay.var_v, var_o=lay.var_o,
                        var_w_in=lay.var_w_in, var_w_out=lay.var_w_out, var_b=lay.var_b)
            if sig.size > 1 and np.ptp(sig) > 0:
                base["head_scale"] = sig / rms if rms > 0 else np.ones_like(sig)
            if lay.head_weights is not None and sig.size > 1:
                w = np.asarray(lay.head_weights, dtype=np.float64)
                base["head_w"] = w / w.mean() if w.mean() > 0 else None
            if lay.branch_gain2 is not None:
                base["branch_gain2"] = lay.branch_gain2
            if lay.sink_logit is not None:
                base["sink"] = np.asarray(lay.sink_logit, dtype=np.float64)
            if lay.gate_var is not None:
                base["gate"] = (lay.gate_var, lay.gate_bias2)
            if lay.moe_experts is not None:
                base["moe"] = MoEParams(
                    experts=lay.moe_experts, top_k=lay.moe_top_k,
                    router_var=lay.moe_router_var, weighting=lay.moe_weighting,
                    scale=lay.moe_scale, shared_var_in=lay.moe_shared_var_in,
                    shared_var_out=lay.moe_shared_var_out,
                    shared_gate_var=lay.moe_shared_gate_var)
            if lay.glu_shift:
                base["glu_shift"] = lay.glu_shift
            if lay.norm is not None:
                base["norm"] = lay.norm
            if lay.dyt is not None:
                base["dyt"] = lay.dyt
            if lay.value_mix is not None:
                base["value_mix"] = lay.value_mix
            if lay.sigmoid_bias is not None:
                base["sigmoid_bias"] = lay.sigmoid_bias
            if lay.diff_lambda is not None:
                base["diff_lambda"] = attn_maps.diff_lambda_moments(
                    *lay.diff_lambda, spec.d_head // 2)
            if lay.head_norm2 is not None:
                base["head_norm2"] = lay.head_norm2
            if lay.measured:
                if lay.mixer_map is None:
                    raise SpecError("layers.mixer_map", f"layer {layer or 1} is a measured "
                                    "mixer without its measured map (sigprop diagnose fills "
                                    "it from the measurement)")
                q_in, c_in, q_out, c_out = lay.mixer_map
                base["mixer"] = MixerMap(q_in=q_in, cos_in=c_in, q_out=q_out, cos_out=c_out)
            if lay.cross_sigma_s is not None:
                base["cross"] = CrossParams(
                    sigma_s=np.asarray(lay.cross_sigma_s, dtype=np.float64),
                    var_v=lay.cross_var_v, var_o=lay.cross_var_o, memory_len=spec.memory_len,
                    memory_q=spec.memory_q, memory_rho=spec.memory_rho)
        base.update(override)
        return cls(**base)


def cos_of(p, q):
    """p / q, with the 0/0 of a vanishing state read as its rho -> 0+ limit, cos = 1: in the
    T -> inf theory uniform-like attention on orthogonal tokens outputs the mean value, a
    zero vector, for every token (q_att = p_att = 0), i.e. complete rank collapse. A non-finite
    q or p (overflow) gives NaN, never a cosine: :mod:`.depth` keeps q finite or reports it."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(q > 0, p / np.where(q > 0, q, 1.0), 1.0)
        return np.where(np.isfinite(p) & np.isfinite(q), c, np.nan)


def _ln_fluct_inputs(qa, pa, bp: BlockParams):
    """What the LN averages of :mod:`.fluct` need from the attention input (q, p) = (qa, pa):
    ``b = s_o^2 s_v^2 (q - p)``, the weight of Y2 in a token's norm; ``rho`` = p / q; ``v``, a
    row's REM score variance (docs/theory.md §2.1)."""
    b = bp.var_v * (qa - pa)
    first = attn_maps.value_first(bp)
    if first is not None:  # value residual: the first block's values add to the spread
        b = first.ls2 * b + first.lf2 * (first.k1 - first.c1)
    b = b * (1.0 if bp.var_o is None else bp.var_o)
    rho = np.clip(cos_of(pa, qa), 0.0, 1.0)
    return b, rho, (bp.sigma_s0 * qa) ** 2 * (1.0 - rho)


def _ln_fluct_cos(q_z, p_z, qa, pa, bp: BlockParams, st: AttentionStats):
    """Cosine after the post-LN LayerNorm that follows attention + residual, averaged over
    the tokens' own norms rather than taken as a ratio of averages (:mod:`.fluct`):
    ``N_a = a0 + b Y2_a`` with ``b = s_o^2 s_v^2 (q - p)``, ``kappa = a0 / E N``, and
    ``cos = (p_z / q_z) r(v, kappa)`` (capped at 1). Only the variant it was derived and
    tested for: softmax, bidirectional, finite T."""
    b, rho, v = _ln_fluct_inputs(qa, pa, bp)
    kappa = np.clip((q_z - b * st.y2) / np.where(q_z > 0, q_z, 1.0), 0.0, 1.0)
    r = fluct.ln_factor(v, kappa, bp.seq_len, bp.d_head, bp.heads)
    return np.minimum(cos_of(p_z, q_z) * r, 1.0)


def _ln_fluct_cos_causal(q_z, p_z, qa, pa, bp: BlockParams, st: AttentionStats):
    """Causal version of :func:`_ln_fluct_cos`. The query at position t is a REM over t keys,
    so both the mean and the spread of its norm ``N_t = a0 + b Y2_t`` depend on t (N_1 =
    a0 + b: one visible key). Per token ``E[N_t^-1/2] = sqrt(r_t / E N_t)`` with r_t the
    factor of rows of t keys at ``kappa_t = a0 / E N_t``, evaluated at the
    :func:`causal_position_nodes` positions; pairs (a < c) have ``C = c0 + b (a/c) Yx(N = a)``
    (docs/theory.md §2.4 causal) and the cosine is the pair average of ``C E[N_a^-1/2]
    E[N_c^-1/2]`` (:func:`fluct.causal_pair_means`). ``a0``, ``c0``: the non-attention parts
    of ``q_z``, ``p_z`` (the same at every position). Uniform causal attention (weights 1/t)
    has no spread (r = 1) but the same position dependence, ``N_t = a0 + b / t``: without
    residual at rho = 0 the pair (a < c) has cosine sqrt(a/c), 2/3 on average, where the
    ratio of averages gives 0.31 at T = 256."""
    b, rho, v = _ln_fluct_inputs(qa, pa, bp)
    a0, c0 = q_z - b * st.y2, p_z - b * st.yx
    nodes = causal_grid(int(bp.seq_len)).nodes
    vb, rb, a0b, bb = np.broadcast_arrays(v, rho, a0, b)
    vf, a0f, bf = vb.ravel(), a0b.ravel(), bb.ravel()
    T = int(bp.seq_len)
    if bp.attention != "uniform" and causal_nodes.TABULATED and T >= 2:
        rf = rb.ravel()
        att = st.nodes
        if not (isinstance(att, causal_nodes.TabulatedNodes) and att.covers(vf, rf)):
            att = None  # not this block's attention (per-head statistics, another input)
        yxa = (att.yx_mean if att is not None
               else causal_nodes.tabulated_attention(vf, rf, T, bp.d_head)[1])
        p0, p1, ok = causal_nodes.tabulated_ln(vf, rf, a0f, bf, yxa, T, bp.d_head, bp.heads)
        if not ok.all():  # off the tables: the per-position path
            p0, p1 = causal_nodes.ln_off_tables(vf, rf, a0f, bf, p0, p1, ok, T, bp.d_head,
                                                bp.heads, att)
        cos = c0 * p0.reshape(vb.shape) + b * p1.reshape(vb.shape)
        cos = np.where(np.isfinite(cos), cos, cos_of(p_z, q_z))  # a vanishing token norm
        return np.minimum(cos, 1.0)
    if bp.attention == "uniform":  # weights 1/t: no spread, r = 1
        y2n = yxn = np.broadcast_to((1.0 / nodes)[:, None], (nodes.size, vf.size))
    elif isinstance(st.nodes, causal_nodes.NodeTables) and st.nodes.covers(vf, rb.ravel()):
        y2n, yxn = st.nodes.y2, st.nodes.yx  # this block's attention already has them
    else:
        y2n, yxn = causal_positions.node_tables(vf, rb.ravel(), nodes, bp.d_head)
    # every position at once (:mod:`.causal_positions`); t = 1 (one visible key): Y2 = Yx = 1, r = 1
    n_t = a0f + bf * y2n
    ok = n_t > 0
    safe = np.where(ok, n_t, 1.0)
    r = (np.ones(safe.shape) if bp.attention == "uniform" else
         causal_positions.ln_nodes(vf, np.clip(a0f / safe, 0.0, 1.0), nodes, bp.d_head, bp.heads))
    m = np.where(ok, np.sqrt(r / safe), np.nan)
    p0, p1 = causal_positions.pair_means(nodes, m, yxn, bp.seq_len)
    cos = c0 * p0.reshape(vb.shape) + b * p1.reshape(vb.shape)
    cos = np.where(np.isfinite(cos), cos, cos_of(p_z, q_z))  # a vanishing token norm
    return np.minimum(cos, 1.0)


def _head_stats(bp: BlockParams, qa, pa, *, asymptotic: bool, full: bool
                ) -> tuple[AttentionStats, AttentionStats]:
    """Attention statistics of a block, averaged over its heads when they differ
    (``bp.head_scale``: per-head score stds read from weights, docs/theory.md §2.8):
    ``(for the map, to report)``. The head average enters the (q, p) map linearly --
    ``q_att = s_v^2 [p + (q - p) mean_h w_h Y2_h]`` -- weighted by each head's share of the
    output (``bp.head_w``); the reported ipr, entropy, ... are the plain head means, as
    measured."""
    sig, rho = bp.sigma_s0 * qa, cos_of(pa, qa)
    maps = [x is not None for x in (bp.sigmoid_bias, bp.diff_lambda, bp.sink)]
    if any(maps[:2]) and asymptotic:
        raise SpecError("attention", "sigmoid and differential attention: finite T only")
    if any(maps) and not asymptotic:
        return attn_maps.head_map_stats(bp, sig, rho, full)
    if bp.head_scale is None and bp.head_w is None:
        st = attention_stats(sig, rho, bp.seq_len, d_head=bp.d_head, causal=bp.causal,
                             asymptotic=asymptotic, full=full)
        return st, st
    hs = (np.ones(np.size(bp.head_w)) if bp.head_scale is None
          else np.asarray(bp.head_scale, dtype=np.float64))
    sig = np.asarray(sig, dtype=np.float64)[..., None] * hs
    st = attention_stats(sig, np.asarray(rho, dtype=np.float64)[..., None], bp.seq_len,
                         d_head=bp.d_head, causal=bp.causal, asymptotic=asymptotic,
                         full=full)._replace(nodes=None)  # per head: not the LN's rows
    w = np.ones(sig.shape[-1]) if bp.head_w is None else np.asarray(bp.head_w, dtype=np.float64)
    w = np.broadcast_to(w, (sig.shape[-1],)) / np.mean(np.broadcast_to(w, (sig.shape[-1],)))

    def avg(x, weights):
        return None if x is None else np.mean(np.asarray(x) * weights, axis=-1)

    return (AttentionStats(*(avg(x, w) for x in st)),
            AttentionStats(*(avg(x, 1.0) for x in st)))


def gate_factors(bp: BlockParams, qa, pa):
    """``(E sigmoid(g_a)^2, E sigmoid(g_a) sigmoid(g_c))`` of the block's output gate for
    gate inputs at ``(qa, pa)`` (docs/theory.md §2.4.4), or None without a gate."""
    if bp.gate is None:
        return None
    var_g, b2 = bp.gate
    qa = np.asarray(qa, dtype=np.float64)
    pa = np.clip(np.asarray(pa, dtype=np.float64), -qa, qa)
    return kernels.gate_kernel(var_g * qa + b2, var_g * pa + b2)


def _branch_norm_cos(q_att, p_att, qa, pa, bp: BlockParams, st, asymptotic: bool):
    """Cosine of the attention branch's output after a per-token norm: the LayerNorm averages
    of :func:`_ln_fluct_cos` / :func:`_ln_fluct_cos_causal` where they apply (finite T,
    softmax or uniform attention), else the ratio of averages."""
    if bp.ln_fluct and not asymptotic and bp.cross is None and bp.softmax_rows:
        if bp.causal and bp.attention in ("softmax", "uniform"):
            return _ln_fluct_cos_causal(q_att, p_att, qa, pa, bp, st)
        if not bp.causal and bp.attention == "softmax":
            return _ln_fluct_cos(q_att, p_att, qa, pa, bp, st)
    return cos_of(p_att, q_att)


def _renorm(q, p, gain2):
    """A branch output after a norm with mean squared gain ``gain2``: ``(g^2, g^2 cos)``."""
    return np.full_like(np.asarray(q, dtype=np.float64), gain2), gain2 * cos_of(p, q)


def measured_map(q, p, bp: BlockParams, *, branch_scale=1.0):
    """A block that is a measured residual map (docs/theory.md §2.8.1): ``(q, p, None)``.

    pre-LN / no norm: additive in (q, p), ``q' = q + (q_out - q_in)``, ``p' = p + (p_out -
    p_in)`` with ``p = cos q`` of the measured input and output (``branch_scale`` as in
    :func:`block_step`: the state's scale S divides the measured increments), ``p'`` capped at
    ``q'``. post-LN: the block's output is normalised, so ``q' = 1`` and ``cos' = cos +
    (cos_out - cos_in)`` (clipped to [-1, 1]). Both return the measured output exactly when
    the theory's input is the measured one."""
    mx = bp.mixer
    q_in, c_in, q_out, c_out = mx.q_in, mx.cos_in, mx.q_out, mx.cos_out
    q = np.asarray(q, dtype=np.float64)
    if bp.norm == "post":
        c = np.clip(cos_of(p, q) + (c_out - c_in), -1.0, 1.0)
        return np.ones_like(q), c, None
    q2 = q + branch_scale * (q_out - q_in)
    p2 = np.asarray(p, dtype=np.float64) + branch_scale * (c_out * q_out - c_in * q_in)
    q2 = np.maximum(q2, 0.0)
    return q2, np.clip(p2, -q2, q2), None


def attention_input(q, p, bp: BlockParams, raw_input: bool = False):
    """The ``(q, p)`` the attention of a block reads from its input state ``(q, p)``
    (:func:`block_step`): normalised, ``(1, cos)``, behind a norm (post-LN: the previous
    block's output, unless ``raw_input``); Dynamic Tanh (``bp.dyt``, §2.6.2): pre-LN the
    tanh kernel of the stream, post-LN the stream itself (the previous block's tanh
    output); no norm: the state as it is."""
    if bp.dyt is not None:
        return kernels.dyt_kernel(bp.dyt[0], q, p) if bp.norm == "pre" else (q, p)
    if bp.norm in ("post", "pre") and not (raw_input and bp.norm == "post"):
        return np.ones_like(q), cos_of(p, q)
    return q, p


def _mlp_input(q, p, bp: BlockParams):
    """The ``(q, p)`` the MLP reads from the stream after the attention's add (and, post-LN,
    its norm): :func:`attention_input` with the MLP's own norm."""
    if bp.dyt is not None:
        return kernels.dyt_kernel(bp.dyt[1], q, p) if bp.norm == "pre" else (q, p)
    return (np.ones_like(q), cos_of(p, q)) if bp.norm in ("post", "pre") else (q, p)


def value_kernel(q, p, bp: BlockParams, raw_input: bool = False):
    """The kernel ``(diagonal, off-diagonal)`` of the values of a block whose input state is
    ``(q, p)``: ``(s_v^2 q_a + s_b^2, s_v^2 p_a + s_b^2)`` of its attention input
    (:func:`attention_input`). For value residual learning (§2.4.6) the depth driver keeps
    the first block's and hands it to the later ones (``BlockParams.value_first``)."""
    qa, pa = attention_input(q, p, bp, raw_input)
    return bp.var_v * qa + bp.var_b, bp.var_v * pa + bp.var_b


@dataclass(frozen=True, kw_only=True)
class BlockOut:
    """One block's output (:func:`block_out`): the state ``(q, p)``, the attention ``stats``
    to report, and ``u``, the stream's share of the first block's values (§2.4.6; None when
    not carried)."""

    q: np.ndarray
    p: np.ndarray
    stats: AttentionStats | None
    u: np.ndarray | None = None


def block_step(q, p, bp: BlockParams, *, asymptotic: bool = False, full: bool = False,
               branch_scale=1.0, raw_input: bool = False):
    """One transformer block (docs/theory.md §2.6): returns ``(q, p, attention stats)``
    (:func:`block_out` without a value residual's stream share)."""
    out = block_out(q, p, bp, asymptotic=asymptotic, full=full, branch_scale=branch_scale,
                    raw_input=raw_input)
    return out.q, out.p, out.stats


def _post_norm(q, p, u, bp: BlockParams, k: int):
    """post-LN after an add: the stream normalised (Dynamic Tanh ``bp.dyt[k]``: its tanh
    kernel) and its first-values share ``u`` divided by the norm, ``sqrt(q)``."""
    if bp.dyt is not None:
        return (*kernels.dyt_kernel(bp.dyt[k], q, p), u)
    return np.ones_like(q), cos_of(p, q), None if u is None else u / np.sqrt(q)


def block_out(q, p, bp: BlockParams, *, asymptotic: bool = False, full: bool = False,
              branch_scale=1.0, raw_input: bool = False, value_u=None) -> BlockOut:
    """One transformer block (docs/theory.md §2.6) as a :class:`BlockOut`.

    post-LN: attention on the normalised input, residual, LN, MLP, residual, LN.
    pre-LN: attention and MLP read LN(residual stream), the stream itself is not normalised.
    ``parallel`` (GPT-J, Falcon, Phi): attention and MLP read the same (normalised) input and
    add to one skip, ``x + A(LN x) + M(LN x)`` (post-LN: then LN; alpha_mlp unused).
    none: no normalisation; the score std then scales with the input's q (docs/theory.md §2.1).

    Finite-T post-LN softmax blocks average the first LayerNorm over the row-to-row spread of
    the attention's participation ratio (:mod:`.fluct`, ``bp.ln_fluct``); causal softmax and
    uniform blocks also over the positions' different row lengths
    (:func:`_ln_fluct_cos_causal`). The T -> inf theory, centred attention, pre-LN and no-LN
    use the ratio of averages.

    ``branch_scale`` (pre-LN only) multiplies both branch outputs: the state is then the true
    one divided by a scale S and ``branch_scale = 1/S`` (the branches read the normalised
    stream, so they do not depend on S); see :mod:`.depth`. ``raw_input`` (post-LN): the
    input is not the output of a LayerNorm (the first block of a stack whose embeddings are
    not normalised, ``ArchSpec.q0``), so the attention reads it as it is.

    Dynamic Tanh (``bp.dyt``, §2.6.2) in place of the norms: the branches read the tanh
    kernel of the stream (pre-LN) or the stream is the tanh kernel of the sum (post-LN). A
    value-residual block (``bp.value_mix``, §2.4.6) mixes the first block's value kernel
    (``bp.value_first``) into its values; ``value_u`` (true units, None: not carried) is the
    stream's share of those values, whose correlation with the block's attention output
    :func:`.attn_maps.stream_cross` adds where no output projection stands between."""
    if bp.mixer is not None:
        q, p, st = measured_map(q, p, bp, branch_scale=branch_scale)
        return BlockOut(q=q, p=p, stats=st, u=value_u)
    normed = bp.norm in ("post", "pre")
    qa, pa = attention_input(q, p, bp, raw_input)
    if asymptotic:
        # a mean pairwise cosine is >= -1/(T-1), so >= 0 as T -> inf; the limit maps (Y2 = 0
        # below beta_c gives q_att = s_v^2 p) need it: a roundoff-negative p (-1e-9) would
        # make q_att negative and the next cosine meaningless
        pa = np.maximum(pa, 0.0)
    if bp.attention == "uniform":
        st = rep = uniform_stats(np.shape(pa), bp.seq_len, causal=bp.causal,
                                 asymptotic=asymptotic)
    elif bp.attention == "identity":
        st = rep = identity_stats(np.shape(pa))
    else:
        st, rep = _head_stats(bp, qa, pa, asymptotic=asymptotic, full=full)
    q_att, p_att = attention_map(qa, pa, st, variant=bp.attention, var_v=bp.var_v,
                                 var_b=bp.var_b, var_o=bp.var_o, head_norm2=bp.head_norm2,
                                 gate=gate_factors(bp, qa, pa), first=attn_maps.value_first(bp))
    if bp.branch_gain2 is not None:  # normalised before the add, per token (_branch_norm_cos)
        c = _branch_norm_cos(q_att, p_att, qa, pa, bp, st, asymptotic)
        q_att = np.full_like(np.asarray(q_att, dtype=np.float64), bp.branch_gain2[0])
        p_att = bp.branch_gain2[0] * c
    dq, dp = attn_maps.stream_cross(bp, st, value_u, bp.attention)  # x.O + O.x
    u = None if value_u is None else bp.alpha_attn * value_u + attn_maps.first_weight(bp)
    a2 = np.asarray(bp.alpha_attn, dtype=np.float64) ** 2
    if bp.parallel:  # one skip; the MLP reads the attention's input (cross terms vanish)
        q_h, p_h = mlp_map(qa, pa, activation=bp.activation, var_w_in=bp.var_w_in,
                           var_w_out=bp.var_w_out, var_b=bp.var_b, moe=bp.moe,
                           glu_shift=bp.glu_shift)
        if bp.branch_gain2 is not None:
            q_h, p_h = _renorm(q_h, p_h, bp.branch_gain2[1])
        q = a2 * q + branch_scale * (q_att + q_h + dq)
        p = a2 * p + branch_scale * (p_att + p_h + dp)
        if bp.norm == "post":
            q, p, u = _post_norm(q, p, u, bp, 0)
        return BlockOut(q=q, p=p, stats=rep, u=u)
    q, p = a2 * q + branch_scale * (q_att + dq), a2 * p + branch_scale * (p_att + dp)
    if bp.cross is not None and bp.norm != "post":  # decoder: cross-attention, then the MLP
        qc_in, pc_in = (np.ones_like(q), cos_of(p, q)) if normed else (q, p)
        q_c, p_c = cross_map(qc_in, pc_in, bp)
        q, p = q + branch_scale * q_c, p + branch_scale * p_c
    if bp.norm == "post" and bp.dyt is not None:  # the stream is tanh(alpha (x + f))
        q, p = kernels.dyt_kernel(bp.dyt[0], q, p)
    elif bp.norm == "post":
        # sinks and gates: the ratio of averages (the LN averages of §2.3.3 do not carry
        # the rows' masses or the gates' per-token factors)
        ln_avg = bp.ln_fluct and not asymptotic and bp.cross is None and bp.softmax_rows
        u = None if u is None else u / np.sqrt(q)
        if ln_avg and bp.causal and bp.attention in ("softmax", "uniform"):
            p = _ln_fluct_cos_causal(q, p, qa, pa, bp, st)
        elif ln_avg and not bp.causal and bp.attention == "softmax":
            p = _ln_fluct_cos(q, p, qa, pa, bp, st)
        else:
            p = cos_of(p, q)
        q = np.ones_like(q)
        if bp.cross is not None:  # post-LN decoder: LN(x + cross(x, memory))
            q_c, p_c = cross_map(q, p, bp)
            q, p = np.ones_like(q), cos_of(p + p_c, q + q_c)
    qm, pm = _mlp_input(q, p, bp)
    q_h, p_h = mlp_map(qm, pm, activation=bp.activation, var_w_in=bp.var_w_in,
                       var_w_out=bp.var_w_out, var_b=bp.var_b, moe=bp.moe,
                       glu_shift=bp.glu_shift)
    if bp.branch_gain2 is not None:
        q_h, p_h = _renorm(q_h, p_h, bp.branch_gain2[1])
    m2 = np.asarray(bp.alpha_mlp, dtype=np.float64) ** 2
    q, p = m2 * q + branch_scale * q_h, m2 * p + branch_scale * p_h
    u = None if u is None else bp.alpha_mlp * u
    if bp.norm == "post":
        q, p, u = _post_norm(q, p, u, bp, 1)
    return BlockOut(q=q, p=p, stats=rep, u=u)
