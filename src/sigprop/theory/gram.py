"""Gram-matrix (position- and token-resolved) mean field for a *known* input sequence.

The homogeneous theory (:mod:`.blocks`) carries two numbers per layer, ``q`` and ``p``, i.e.
it assumes every pair of tokens has the same overlap and every token the same norm. Two
things break that in real decoders measured on text:

* **positions** -- in a causal pre-LN stack the query at position t averages t values, so the
  norm of the attention output (and, once it dominates the tiny embeddings, of the residual
  stream) falls like ~1/t and the cosine of a pair (a < c) depends on a/c. The measured
  ``cos`` is the mean of per-pair cosines, the homogeneous map a ratio of averages dominated
  by the first positions;
* **tokens** -- without position embeddings (LLaMA, Qwen, Mistral) a token repeated at two
  positions enters with cosine 1, all other pairs with ~0: the input is a mixture of pair
  classes, and the nonlinear block map of the average overlap is not the average of the map.

Here the state is the expected Gram matrix ``G[a, c] = E<x_a, x_c>/d`` of one sequence
(T x T, float64; the expectation over the weights at initialisation), propagated through the
blocks with the same ingredients as :mod:`.blocks`:

* norm: ``C = G / sqrt(diag G diag G^T)`` (RMSNorm / LayerNorm with gain 1);
* attention: ``var_o var_v E[sum_bb' A_ab A_cb' C_bb']`` with the expectation over the
  attention weights taken one of four ways (``attn=``):

  - ``"sampled"`` (default, :func:`attention_gram_sampled`): heads of width d_head drawn
    with query/key covariance C (so score covariances are exactly ``sigma_s^2 C_ac C_bb'``,
    gg25 Eq. 10 for any geometry), the model's RoPE rotations, the causal mask, softmax;
    only this expectation is sampled (fixed seed), the rest of the map is analytic;
  - ``"corr"`` / ``"tilt"`` (:func:`attention_gram_corr`, :func:`attention_gram_tilt`): the
    same covariance in closed form (lognormal weights normalised per row pair, Hadamard
    series); right in sign and RoPE dependence, overshoots the text effect by ~0.04;
  - ``"exch"`` (:func:`attention_gram`): the homogeneous theory's row statistics per row:
    mean ``1/n_a`` and exchangeable fluctuations of size ``Y2(n_a, v_a)`` (REM tables),
    pairs of rows sharing keys with ``Yx`` at their own query overlap (docs/theory.md
    §2.4.1). Exact enough for distinct tokens; blind to copies of one token sharing their
    score (a row concentrates on token *types*), 0.15-0.2 too high on LLaMA text;

* attention sinks (docs/theory.md §2.4.3): the sampled heads' softmax gets each head's sink
  logit in its denominator (the other forms do not take sinks); an output gate (§2.4.4)
  multiplies the heads' Gram matrix entrywise by the gate kernel of ``C``
  (:func:`gate_gram`);
* MLP: the kernel of :mod:`.kernels` applied entrywise to ``C`` (each pair has its own
  overlap);
* residual: sums (zero-mean weights: no cross terms).

Vectorised float64 NumPy, a batch of sequences on a leading axis: O(T^2) per layer for
``exch``, O(order T^2) for ``corr``, O(T^3) for ``tilt`` and ``sampled`` (~0.2 s per layer and
sequence at T = 256, 32 draws). Only numpy and sibling theory modules are imported.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from ..spec import ArchSpec, SpecError
from . import kernels, rem
from .blocks import BlockParams, mlp_map

#: number of log-spaced row lengths at which the REM tables are evaluated (then interpolated)
N_NODES = 16


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
def input_gram(ids, *, w_token: float = 1.0, w_position: float = 0.0, w_shared: float = 0.0
               ) -> np.ndarray:
    """Expected cosine matrix of the embeddings of token ids ``(..., T)``: a sum of i.i.d.
    tables (unit total weight): token table (identical ids: 1), a learned position table
    (distinct positions: 0) and a table shared by all positions (BERT's token type):
    ``C[a, c] = w_token [id_a == id_c] + w_position [a == c] + w_shared``.
    LLaMA/Qwen/Mistral: (1, 0, 0); GPT-2: (1/2, 1/2, 0); BERT: (1/3, 1/3, 1/3)."""
    ids = np.asarray(ids)
    T = ids.shape[-1]
    tot = w_token + w_position + w_shared
    same = (ids[..., :, None] == ids[..., None, :]).astype(np.float64)
    return (w_token * same + w_position * np.eye(T) + w_shared) / tot


def token_classes(ids) -> tuple[float, float]:
    """(fraction of ordered pairs a != c carrying the same id, mean over sequences): the two
    pair classes of a position-free input (identical tokens at cosine 1, distinct ones at 0),
    so the homogeneous theory's rho0 of a position-free text input."""
    ids = np.atleast_2d(np.asarray(ids))
    T = ids.shape[-1]
    same = (ids[:, :, None] == ids[:, None, :]).sum(axis=(1, 2)) - T
    f = same / (T * (T - 1))
    return float(f.mean()), float(f.std())


def normalise(G: np.ndarray) -> np.ndarray:
    """Cosine matrix of a Gram matrix (a token of zero norm: cosine 0)."""
    d = np.sqrt(np.clip(np.diagonal(G, axis1=-2, axis2=-1), 0.0, None))
    s = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    return G * s[..., :, None] * s[..., None, :]


def mean_cos(G: np.ndarray) -> np.ndarray:
    """Mean over pairs a != c of the cosine ``G_ac / sqrt(G_aa G_cc)`` (the measured ``cos``
    of docs/theory.md §1), over the last two axes."""
    C = normalise(G)
    T = C.shape[-1]
    return (C.sum(axis=(-1, -2)) - np.trace(C, axis1=-2, axis2=-1)) / (T * (T - 1))


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------
def rope_gamma_from_r(r) -> np.ndarray:
    """:func:`rope_gamma` from the offset correlations ``R[k]`` of :func:`rope_corr`:
    ``gamma_n = (1/n^2) sum_{j,k<n} R(j - k) = (1/n^2)(n + 2 sum_{k=1}^{n-1} (n - k) R[k])``."""
    r = np.asarray(r, dtype=np.float64)
    T = len(r)
    n = np.arange(1, T + 1, dtype=np.float64)
    k = np.arange(T, dtype=np.float64)
    # sum_{k<n} (n - k) R[k] = n S0(n) - S1(n), prefix sums of R and k R
    s0, s1 = np.cumsum(r), np.cumsum(k * r)
    return (2.0 * (n * s0 - s1) - n * r[0]) / n**2


def rope_gamma(inv_freq, T: int) -> np.ndarray:
    """``gamma[n-1] = mean_f |(1/n) sum_{k<n} exp(i theta_f k)|^2`` for n = 1..T: the share of
    a key component common to n consecutive positions that still cancels in the softmax after
    the rotations by ``theta_f k`` (1 without RoPE or for theta_f -> 0)."""
    th = np.asarray(inv_freq, dtype=np.float64)[None, :]
    n = np.arange(1, T + 1, dtype=np.float64)[:, None]
    half = 0.5 * th
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(np.abs(np.sin(half)) > 1e-300,
                     np.sin(n * half) / (n * np.sin(half)), 1.0)
    return np.mean(r**2, axis=1)


# --------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------
def _row_lengths(T: int, causal: bool) -> np.ndarray:
    return np.arange(1, T + 1, dtype=np.float64) if causal else np.full(T, float(T))


def _nodes(T: int, causal: bool) -> np.ndarray:
    """Row lengths at which the REM tables are evaluated (then interpolated in log n)."""
    if not causal or T <= 2:
        return np.array([float(T)])
    return np.unique(np.round(np.geomspace(2, T, min(N_NODES, T - 1))).astype(int)).astype(float)


def _pick(vals: np.ndarray, nodes: np.ndarray, n) -> np.ndarray:
    """``vals`` (nodes first) at row lengths ``n`` (broadcast to ``vals.shape[1:]``), linear
    in log n between nodes (constant beyond them)."""
    if len(nodes) == 1:
        return vals[0]
    ln = np.log(nodes)
    lx = np.broadcast_to(np.log(np.asarray(n, dtype=np.float64)), vals.shape[1:])
    idx = np.clip(np.searchsorted(ln, lx) - 1, 0, len(ln) - 2)
    w = np.clip((lx - ln[idx]) / (ln[idx + 1] - ln[idx]), 0.0, 1.0)
    lo = np.take_along_axis(vals, idx[None], axis=0)[0]
    hi = np.take_along_axis(vals, idx[None] + 1, axis=0)[0]
    return (1 - w) * lo + w * hi


def attention_gram(C: np.ndarray, sigma_s, *, causal: bool, d_head: int | None = None,
                   rope: np.ndarray | None = None, fluct: bool = True) -> np.ndarray:
    """``E[sum_{b, b'} A_ab A_cb' C_bb']`` for softmax attention with score std ``sigma_s`` on
    unit tokens with cosine matrix ``C`` (..., T, T) (module docstring). ``rope``: the
    :func:`rope_gamma` array (length >= T) or None. ``fluct=False``: uniform attention
    (the mean M only)."""
    C = np.asarray(C, dtype=np.float64)
    T = C.shape[-1]
    n = _row_lengths(T, causal)
    # sums of C over the key sets: causal prefix sums P[a, c] = sum_{b<=a, b'<=c} C_bb'
    if causal:
        P = np.cumsum(np.cumsum(C, axis=-1), axis=-2)
    else:
        P = np.broadcast_to(C.sum(axis=(-1, -2))[..., None, None], C.shape)
    mean = P / (n[:, None] * n[None, :])  # sum_bb' M_ab M_cb' C_bb'
    if not fluct:
        return mean
    own = np.diagonal(P, axis1=-2, axis2=-1)  # sum over row a's key block
    with np.errstate(invalid="ignore", divide="ignore"):
        cbar = np.where(n > 1, (own - n) / (n * (n - 1)), 1.0)  # mean key overlap of row a
    cbar = np.clip(cbar, 0.0, 1.0)
    if rope is None:
        common = cbar
    else:  # row a's keys span n_a consecutive positions
        g = np.asarray(rope, dtype=np.float64)
        common = cbar * (g[:T] if causal else g[T - 1])
    v = np.asarray(sigma_s, dtype=np.float64) ** 2 * (1.0 - common)  # (..., T) row variance
    nodes = _nodes(T, causal)
    # n * (Y2 - 1/n) at the nodes, as a function of v: evaluated on every row's v
    ex2 = np.stack([k * (rem.y2_table(int(k), d_head)(v) - 1.0 / k) for k in nodes])
    y2ex = _pick(ex2, nodes, n) / n  # Y2_a - 1/n_a at each row
    y2ex = np.where(n > 1, y2ex, 0.0)
    diag = y2ex * (1.0 - cbar)
    # pair (a, c): the shorter row's n_s = min(n_a, n_c) shared keys, Yx(n_s) at the pair's
    # query overlap, row-length ratio n_s / n_l (the longer row's mass on the shared keys)
    ns = np.minimum(n[:, None], n[None, :])
    nl = np.maximum(n[:, None], n[None, :])
    if causal:
        short = np.where(n[:, None] <= n[None, :], np.arange(T)[:, None], np.arange(T)[None, :])
        vs = np.take_along_axis(np.broadcast_to(v[..., None, :], C.shape),
                                np.broadcast_to(short, C.shape), axis=-1)
        cs = np.take_along_axis(np.broadcast_to(cbar[..., None, :], C.shape),
                                np.broadcast_to(short, C.shape), axis=-1)
    else:
        vs = np.broadcast_to(v[..., :, None], C.shape)
        cs = np.broadcast_to(cbar[..., :, None], C.shape)
    rho = np.clip(C, 0.0, 1.0)
    exx = np.stack([k * (rem.yx_table(int(k), d_head)(vs, rho) - 1.0 / k) for k in nodes])
    yxex = _pick(exx, nodes, ns) / ns
    yxex = np.where(ns > 1, yxex, 0.0)
    cross = (ns / nl) * yxex * (1.0 - cs)
    out = mean + cross
    idx = np.arange(T)
    out[..., idx, idx] = mean[..., idx, idx] + diag
    return out


# --------------------------------------------------------------------------------------------
# blocks and depth
# --------------------------------------------------------------------------------------------
def mlp_gram(C: np.ndarray, bp: BlockParams) -> np.ndarray:
    """Entrywise MLP kernel on unit tokens with cosine matrix C; a mixture of experts
    (``bp.moe``, docs/theory.md §2.5.2) through :func:`.blocks.mlp_map` entrywise (routing
    factors ``A`` on the diagonal, ``B(C)`` off it, plus the shared expert)."""
    if getattr(bp, "moe", None) is not None or getattr(bp, "glu_shift", 0.0):  # §2.5.3
        qd, pd = mlp_map(np.ones(C.shape), C, activation=bp.activation,
                         var_w_in=bp.var_w_in, var_w_out=bp.var_w_out, var_b=bp.var_b,
                         moe=bp.moe, glu_shift=bp.glu_shift)
        out = np.array(pd, dtype=np.float64)
        idx = np.arange(C.shape[-1])
        out[..., idx, idx] = qd[..., idx, idx]
        return out
    q1 = np.full(C.shape, float(bp.var_w_in)) + bp.var_b
    p1 = bp.var_w_in * C + bp.var_b
    kd, ko = kernels.kernel(bp.activation, q1, p1)
    out = bp.var_w_out * ko + bp.var_b
    idx = np.arange(C.shape[-1])
    out[..., idx, idx] = (bp.var_w_out * kd + bp.var_b)[..., idx, idx]
    return out


def gate_gram(C: np.ndarray, bp: BlockParams) -> np.ndarray:
    """``E[sigmoid(g_a) sigmoid(g_c)]`` of the block's output gate for unit tokens with
    cosine matrix ``C`` (docs/theory.md §2.4.4): the gate kernel at ``q1 = var_g + b2``,
    evaluated on 2049 cosines in [-1, 1] and interpolated linearly (error ~1e-8: the kernel
    is analytic in the cosine), the diagonal exact."""
    var_g, b2 = bp.gate
    q1 = var_g + b2
    c = np.linspace(-1.0, 1.0, 2049)
    kd, ko = kernels.gate_kernel(np.full(c.shape, q1), var_g * c + b2)
    out = np.interp(np.clip(C, -1.0, 1.0), c, ko)
    idx = np.arange(C.shape[-1])
    out[..., idx, idx] = kd[-1]
    return out


def _attn_out(C, bp: BlockParams, rope, fluct, attn="sampled", first=None):
    """The attention branch's Gram matrix; ``rope``: the model's RoPE frequencies or None;
    ``first``: the first block's value covariance, which a value-residual block mixes in."""
    T = C.shape[-1]
    special = bp.sink is not None or bp.sigmoid_bias is not None or bp.value_mix is not None
    if special and (attn != "sampled" or not fluct):
        raise ValueError("attention sinks, sigmoid rows and value residuals are taken only "
                         "by attn='sampled'")
    values = None
    if bp.value_mix is not None:
        if first is None:
            raise ValueError("a value-residual block needs the first block's values")
        ls, lf = bp.value_mix
        values = ls * ls * (bp.var_v * C + bp.var_b) + lf * lf * first
    if not fluct:
        att = attention_gram(C, bp.sigma_s0, causal=bp.causal, fluct=False)
    elif attn == "sampled":
        att = attention_gram_sampled(C, bp.sigma_s0, causal=bp.causal,
                                     d_head=int(bp.d_head or 64), inv_freq=rope,
                                     sink=bp.sink, head_scale=bp.head_scale,
                                     sigmoid_bias=bp.sigmoid_bias, values=values)
    elif attn in ("corr", "tilt"):
        r = None if rope is None else rope_corr(rope, T)
        fn = attention_gram_corr if attn == "corr" else attention_gram_tilt
        att = fn(C, bp.sigma_s0, causal=bp.causal, rope_r=r)
    elif attn == "exch":
        att = attention_gram(C, bp.sigma_s0, causal=bp.causal, d_head=bp.d_head,
                             rope=None if rope is None else rope_gamma(rope, T))
    else:
        raise ValueError(f"attn must be sampled, corr, tilt or exch (got {attn!r})")
    mass = None
    if bp.sink is not None or bp.sigmoid_bias is not None:  # rows' masses (sampled, exact)
        att, mass = att
    if values is not None:  # the mixed values' covariance, their biases included
        g = att
    elif mass is not None:  # the value bias is carried by the rows' masses
        g = bp.var_v * att + bp.var_b * mass
    else:
        g = bp.var_v * att + bp.var_b
    if bp.gate is not None:
        g = g * gate_gram(C, bp)
    if bp.var_o is not None:
        g = bp.var_o * g + bp.var_b
    return g


def block_gram(G: np.ndarray, bp: BlockParams, *, rope=None, fluct: bool = True,
               raw_input: bool = False, attn: str = "sampled", first=None) -> np.ndarray:
    """One block on the Gram matrix (docs/theory.md §2.6 with matrices for numbers).
    ``rope``: the model's RoPE frequencies ``inv_freq`` (None: no RoPE); ``attn``: how the
    attention expectation is taken: ``"sampled"`` (:func:`attention_gram_sampled`, default),
    ``"corr"`` / ``"tilt"`` (:func:`attention_gram_corr` / :func:`attention_gram_tilt`,
    analytic, correlated energies), ``"exch"`` (:func:`attention_gram`, exchangeable keys);
    ``fluct=False``: uniform attention; ``first``: the first block's value covariance
    (:func:`first_values`), for a value-residual block."""
    a2 = float(np.asarray(bp.alpha_attn)) ** 2
    m2 = float(np.asarray(bp.alpha_mlp)) ** 2
    if bp.norm == "pre":
        C = normalise(G)
        att, gb = _attn_out(C, bp, rope, fluct, attn, first), bp.branch_gain2
        if gb is not None:  # normalised branch outputs (Gemma 2): per token, gain^2 each
            att = gb[0] * normalise(att)
        G = a2 * G + att
        mlp = mlp_gram(C if bp.parallel else normalise(G), bp)
        if gb is not None:
            mlp = gb[1] * normalise(mlp)
        return G + mlp if bp.parallel else m2 * G + mlp
    if bp.norm == "post":
        C = G if raw_input else normalise(G)
        Z = normalise(a2 * C + _attn_out(C, bp, rope, fluct, attn, first))
        return normalise(m2 * Z + mlp_gram(Z, bp))
    raise ValueError(f"norm {bp.norm!r}: only pre and post are covered here")


def propagate_gram(spec: ArchSpec, C0: np.ndarray, *, rope=None, fluct: bool = True,
                   depth: int | None = None, attn: str = "sampled") -> np.ndarray:
    """Mean pairwise cosine at layers 0..L (shape (L+1,) + batch shape) from the input
    cosine matrix ``C0`` (..., T, T) of :func:`input_gram`. The embeddings enter at q = 1
    (pre-LN: ``spec``'s branch variances are in units of the embedding's q0, as
    :func:`sigprop.models.spec_from_config` absorbs it), or at ``spec.q0`` where the spec
    carries it in absolute units; a post-LN first block then reads that raw input (as
    :mod:`.depth` does), e.g. Mix-LN's first blocks on a pre-LN model."""
    if spec.layers is not None and any(x.dyt is not None or x.diff_lambda is not None
                                       for x in spec.layers):
        raise SpecError("layers", "Dynamic Tanh and differential attention are in the "
                                  "homogeneous theory only (sigprop.theory.depth), not the "
                                  "Gram one")
    G = spec.q_init * np.asarray(C0, dtype=np.float64)
    out = [mean_cos(G)]
    first = first_values(spec, G)
    L = spec.depth if depth is None else depth
    for layer in range(1, L + 1):
        bp = BlockParams.from_spec(spec, layer)
        G = block_gram(G, bp, rope=rope, fluct=fluct, attn=attn,
                       raw_input=layer == 1 and spec.q0 is not None, first=first)
        out.append(mean_cos(G))
    return np.stack(out)


def first_values(spec: ArchSpec, G0: np.ndarray) -> np.ndarray | None:
    """The first block's value covariance ``s_v^2 C_1 + s_b^2`` on the stack's input Gram
    matrix ``G0`` (``C_1`` the block's attention input: the normalised tokens, or the raw ones
    where a post-LN first block reads them), which value residual learning (docs/theory.md
    §2.4.6) mixes into the later blocks' values; None when no block mixes it in. The two
    blocks' value weights are independent, so the mix has no cross term."""
    if spec.layers is None or all(x.value_mix is None for x in spec.layers):
        return None
    bp = BlockParams.from_spec(spec, 1)
    raw = spec.q0 is not None and bp.norm == "post"
    return bp.var_v * (G0 if raw else normalise(G0)) + bp.var_b


# --------------------------------------------------------------------------------------------
# attention with correlated energies: the lognormal / Hadamard-series form
# --------------------------------------------------------------------------------------------
def rope_corr(inv_freq, T: int) -> np.ndarray:
    """``R[k] = mean_f cos(theta_f k)`` for offsets k = 0..T-1: the correlation of the scores
    of one query with two copies of a key ``k`` positions apart under RoPE (1 without)."""
    th = np.asarray(inv_freq, dtype=np.float64)
    return np.mean(np.cos(np.outer(np.arange(T, dtype=np.float64), th)), axis=1)


def _prefix(M: np.ndarray, causal: bool) -> np.ndarray:
    if causal:
        return np.cumsum(np.cumsum(M, axis=-1), axis=-2)
    return np.broadcast_to(M.sum(axis=(-1, -2))[..., None, None], M.shape)


def attention_gram_corr(C: np.ndarray, sigma_s, *, causal: bool, rope_r: np.ndarray | None = None,
                        order: int | None = None) -> np.ndarray:
    """``E[sum_{b, b'} A_ab A_cb' C_bb']`` with the energies' full covariance
    ``Cov(s_ab, s_cb') = sigma_s^2 C_ac C_bb'`` (gg25 Eq. 10 for any geometry; RoPE multiplies
    it by ``R(b - b')`` on the keys and ``R(a - c)`` on the queries, :func:`rope_corr`).

    Lognormal weights normalised per row pair (``sum_bb' E[A_ab A_cb'] = 1`` exactly):
    ``E[A_ab A_cb'] = K_bb' / sum K`` with ``K_bb' = exp(lam_ac Ct_bb')``, ``lam_ac = sigma_s^2
    C_ac R(a-c)``, ``Ct = C o R``. At homogeneous overlap rho this gives the row's
    ``Y2 = e^v / (e^v + n - 1)``, ``v = sigma_s^2 (1 - rho)`` (the REM's large-n law). Keys
    that are copies of one token (Ct = 1) share their energy, so a row concentrates on token
    *types*: this is what the exchangeable form (:func:`attention_gram`) misses on text.
    Sums over the key blocks use Hadamard powers, ``exp(lam Ct) = sum_k lam^k Ct^(ok) / k!``,
    each summed by 2-D prefix sums: O(order T^2)."""
    C = np.asarray(C, dtype=np.float64)
    T = C.shape[-1]
    s2 = float(np.asarray(sigma_s)) ** 2
    if rope_r is not None:
        r = np.asarray(rope_r, dtype=np.float64)[:T]
        off = np.abs(np.subtract.outer(np.arange(T), np.arange(T)))
        Rm = r[off]
        Ct, lam = C * Rm, s2 * C * Rm
    else:
        Ct, lam = C, s2 * C
    lmax = float(np.max(np.abs(lam))) if lam.size else 0.0
    K = order if order is not None else int(np.ceil(np.e * lmax)) + 12
    num = np.zeros(C.shape)
    den = np.zeros(C.shape)
    power = np.ones(C.shape)  # Ct^(ok)
    coef = np.ones(C.shape)  # lam^k / k!
    for k in range(K + 1):
        Pk = _prefix(power, causal)
        Pn = _prefix(power * C, causal)  # the value overlap C_bb' (not rotated)
        den += coef * Pk
        num += coef * Pn
        power = power * Ct
        coef = coef * lam / (k + 1)
    return num / den


def attention_gram_tilt(C: np.ndarray, sigma_s, *, causal: bool,
                        rope_r: np.ndarray | None = None, power=(2.0, 1.0),
                        order: int | None = None) -> np.ndarray:
    """:func:`attention_gram_corr` with each row's partition function tilted by the keys it
    is weighted on: ``E[w_ab w_cb' / (Z_a Z_c)] ~ E[w_ab w_cb'] / (Z~_a Z~_c)`` with
    ``Z~_a ~ z_ab = sum_{j in row a} exp(sigma_s^2 Ct_jb)`` (the keys correlated with b --
    copies of b's token above all -- grow with w_ab), used separably: key b of row a gets the
    factor ``(n_a / z_ab)^p``, ``p = power[0]`` on the diagonal (a row with itself: both
    keys tilt the same Z) and ``power[1]`` for distinct rows. Normalised per pair of rows
    (``sum_bb' E[A_ab A_cb'] = 1``). Matrix products: O(order T^3)."""
    C = np.asarray(C, dtype=np.float64)
    if C.ndim > 2:
        return np.stack([attention_gram_tilt(c, sigma_s, causal=causal, rope_r=rope_r,
                                             power=power, order=order) for c in C])
    T = C.shape[-1]
    s2 = float(np.asarray(sigma_s)) ** 2
    if rope_r is not None:
        r = np.asarray(rope_r, dtype=np.float64)[:T]
        Rm = r[np.abs(np.subtract.outer(np.arange(T), np.arange(T)))]
    else:
        Rm = np.ones((T, T))
    Ct, lam = C * Rm, s2 * C * Rm
    E = np.exp(s2 * Ct)
    mask = np.tril(np.ones((T, T))) if causal else np.ones((T, T))
    z = (np.cumsum(E, axis=0) if causal else np.broadcast_to(E.sum(axis=0), (T, T)))
    n = mask.sum(axis=1)
    g = mask * (n[:, None] / z)  # row a, key b
    lmax = float(np.max(np.abs(lam)))
    K = order if order is not None else int(np.ceil(np.e * lmax)) + 12
    out = np.empty((T, T))
    idx = np.arange(T)
    for which, p in enumerate(power):
        H = g**p
        num, den = np.zeros((T, T)), np.zeros((T, T))
        powk, coef = np.ones((T, T)), np.ones((T, T))
        for k in range(K + 1):
            den += coef * (H @ powk @ H.T)
            num += coef * (H @ (powk * C) @ H.T)
            powk = powk * Ct
            coef = coef * lam / (k + 1)
        res = num / den
        if which == 0:
            out[idx, idx] = res[idx, idx]
        else:
            off = ~np.eye(T, dtype=bool)
            out[off] = res[off]
    return out


def attention_gram_sampled(C: np.ndarray, sigma_s, *, causal: bool, d_head: int = 64,
                           inv_freq=None, draws: int = 32, seed: int = 0, sink=None,
                           head_scale=None, sigmoid_bias=None, values=None):
    """``E[A C A^T]`` by sampling the attention weights: query and key heads of width
    ``d_head`` drawn as ``F W`` with ``F F^T = C`` (so every score covariance is exactly
    ``sigma_s^2 C_ac C_bb'``, the chi2 spread of finite heads included), RoPE rotations at
    the model's frequencies ``inv_freq`` (pairs (i, i + d_head/2), as HF; more than d_head/2
    frequencies: d_head/2 of them spread over their range), causal mask,
    softmax. The mean field of the values and the MLP stays analytic; only the attention
    expectation is sampled (``draws`` heads, fixed ``seed``: deterministic).

    ``sink``: per-head attention sink logits (docs/theory.md §2.4.3): draw i takes head
    ``i mod H``'s sink (and score std factor ``head_scale``); the rows' weights are then the
    softmax times their mass ``W = sigmoid(logsumexp - sink)``, and the function returns
    ``(E[A C A^T], E[W W^T])`` (the second carries the value bias). ``sigmoid_bias``
    ``(k, b0)`` (docs/theory.md §2.4.7): the weights are ``sigmoid(z + b0 - k log n_a)`` of
    each visible key (``n_a`` the row's visible keys), rows not normalised, and the function
    returns the same pair with ``W`` the rows' sums. ``values``: the values' covariance where
    it is not ``C`` (value residual learning, §2.4.6: the first block's values mixed in), same
    shape as ``C``; the product is then ``E[A values A^T]``."""
    C = np.asarray(C, dtype=np.float64)
    if C.ndim > 2:
        vs = [None] * len(C) if values is None else np.asarray(values, dtype=np.float64)
        res = [attention_gram_sampled(c, sigma_s, causal=causal, d_head=d_head,
                                      inv_freq=inv_freq, draws=draws, seed=seed, sink=sink,
                                      head_scale=head_scale, sigmoid_bias=sigmoid_bias,
                                      values=v) for c, v in zip(C, vs, strict=True)]
        if sink is None and sigmoid_bias is None:
            return np.stack(res)
        return np.stack([r[0] for r in res]), np.stack([r[1] for r in res])
    T = C.shape[-1]
    w, V = np.linalg.eigh((C + C.T) / 2)
    F = V * np.sqrt(np.clip(w, 0.0, None))
    rng = np.random.default_rng(seed)
    q = np.einsum("tr,drh->dth", F, rng.standard_normal((draws, T, d_head)))
    k = np.einsum("tr,drh->dth", F, rng.standard_normal((draws, T, d_head)))
    if inv_freq is not None:
        f = np.asarray(inv_freq, dtype=np.float64)
        if 2 * f.size > d_head:  # more rotated pairs than the sampled head has (MLA's RoPE
            # part is wider than width / heads, docs/theory.md §2.4.5): d_head / 2 of them,
            # spread over the same range (the fastest and the slowest kept)
            f = f[np.linspace(0, f.size - 1, max(d_head // 2, 1)).round().astype(int)]
        ang = np.arange(T, dtype=np.float64)[:, None] * f[None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        h = len(f)

        def rot(z):
            z1, z2 = z[..., :h], z[..., h: 2 * h]
            return np.concatenate([z1 * cos - z2 * sin, z2 * cos + z1 * sin, z[..., 2 * h:]],
                                  axis=-1)

        q, k = rot(q), rot(k)
    scale = float(np.asarray(sigma_s)) / np.sqrt(d_head)
    if head_scale is not None and sink is not None:
        hs = np.asarray(head_scale, dtype=np.float64)
        scale = scale * hs[np.arange(draws) % hs.size][:, None, None]
    s = scale * (q @ k.transpose(0, 2, 1))
    Cv = C if values is None else np.asarray(values, dtype=np.float64)
    if sigmoid_bias is not None:
        return _sigmoid_rows(s, Cv, sigmoid_bias, causal)
    if causal:
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    A = np.exp(s - top)
    Z = A.sum(axis=-1, keepdims=True)
    A /= Z
    if sink is not None:
        sk = np.asarray(sink, dtype=np.float64)
        sk = sk[np.arange(draws) % sk.size][:, None, None]
        W = 1.0 / (1.0 + np.exp(sk - top - np.log(Z)))  # (draws, T, 1)
        A *= W
        return (np.mean(A @ Cv @ A.transpose(0, 2, 1), axis=0),
                np.mean(W @ W.transpose(0, 2, 1), axis=0))
    return np.mean(A @ Cv @ A.transpose(0, 2, 1), axis=0)


def _sigmoid_rows(s: np.ndarray, Cv: np.ndarray, sigmoid_bias, causal: bool):
    """``(E[A Cv A^T], E[W W^T])`` of sigmoid rows ``A = sigmoid(s + b0 - k log n_a)`` over
    the sampled scores ``s`` (draws, T, T), hidden keys at weight 0, ``W`` the rows' sums."""
    T = s.shape[-1]
    k, b0 = (float(x) for x in sigmoid_bias)
    n = _row_lengths(T, causal).astype(np.float64)
    A = expit(s + (b0 - k * np.log(n))[:, None])
    if causal:
        A = np.where(np.tril(np.ones((T, T), bool)), A, 0.0)
    W = A.sum(axis=-1, keepdims=True)
    return (np.mean(A @ Cv @ A.transpose(0, 2, 1), axis=0),
            np.mean(W @ W.transpose(0, 2, 1), axis=0))
