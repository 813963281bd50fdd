"""Multi-head self-attention for S independent initialisations at once (docs/theory.md §2.1, §2.4).

Every weight carries the seed as its leading dimension, ``(S, ...)``, and the forward pass is a
handful of batched matmuls over that dimension; there is no loop over seeds. Activations have
shape ``(S, B, T, d)``, attention matrices ``(S, B, H, T, T)``.

Scores (docs/theory.md §2.1): ``s_ab = (x_a W_Q^h) . (x_b W_K^h) / sqrt(d_H) * m(n)`` with head
``h``
the ``h``-th block of ``d_H`` columns and ``m`` the length scaling of docs/theory.md §3.2
(:func:`sigprop.spec.score_multiplier`) at ``n`` = the number of keys a query sees: ``T`` for
bidirectional attention and ``t`` for the query at (1-based) position ``t`` under a causal mask.
With ``W ~ N(0, sigma^2)`` and ``|x|^2 = d`` the score variance is ``(sigma^2 d m)^2`` for any
number of heads, which the ``spec`` initialisation sets to ``spec.sigma_s^2``.

Variants (docs/theory.md §2.4): ``softmax``; ``centred`` = ``A - 1 1^T / n`` on the visible keys
(computed as ``A v`` minus the running mean of the values, never as a matrix); ``uniform`` =
every visible key weighted ``1 / n``; ``identity`` = each token attends only to itself (shaped
attention at init, docs/fixes.md): the output is the token's own value.

Per layer (a spec's ``layers``, docs/theory.md §2.4.3-2.4.4): **attention sinks**
(``LayerSpec.sink_logit``: one logit per head in the softmax's denominator, no value), so a
row's key weights are the softmax times its mass ``W = sigmoid(logsumexp(z) - sink)``; the
row statistics are those of the renormalised rows ``w / W`` (the ordinary softmax, which the
sink does not change) and ``probs`` the weights themselves (the sink's column dropped, as HF
gpt-oss returns them). **Output gate** (``LayerSpec.gate_var``): the head outputs are
multiplied elementwise by ``sigmoid(x W_g + b_g)`` (``x`` the attention's input) before
``W_O``. **Value residual** (``LayerSpec.value_mix = (lambda_self, lambda_first)``): the
values are ``lambda_self V + lambda_first V_1`` with ``V_1`` the first block's values of the
same forward pass (a :class:`FirstValues` holder the first block fills). **Sigmoid rows**
(``LayerSpec.sigmoid_bias = (k, b0)``): ``w = sigmoid(z + b0 - k log n)`` in place of the
softmax, n the row's visible keys; the statistics are those of the renormalised rows ``w /
W``. **Differential rows** (``LayerSpec.diff_lambda = (lambda_init, lambda_std)``): ``A1 -
lambda A2``, the softmaxes of each head's first and second halves of q and k channels at
``1/sqrt(d_H/2)``, ``lambda = exp(l1 . l2) - exp(l3 . l4) + lambda_init`` per seed slice
(the four vectors drawn N(0, lambda_std^2)); statistics of ``A1``. **Head norm**
(``LayerSpec.head_norm2``): each head's output RMS-normalised (eps 1e-5) times the square
root of that gain, before the gate and ``W_O``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..spec import ArchSpec, LayerSpec, score_multiplier

STAT_NAMES = ("ipr", "ipr_cross", "entropy", "wmax")


class AttentionOutput(NamedTuple):
    """``out`` (S, B, T, d); ``stats`` name -> (S, B, H) tensor or None; ``probs``
    (S, B, H, T, T) or None (the softmax probabilities, also for centred attention)."""

    out: Tensor
    stats: dict[str, Tensor] | None
    probs: Tensor | None


class FirstValues:
    """The first block's values (S, B, H, T, d_head) of one forward pass, for the value
    residual of the later blocks: the first block to see an empty holder fills it."""

    def __init__(self):
        self.v: Tensor | None = None


#: epsilon of the per-head output norm (``LayerSpec.head_norm2``; differential attention's)
HEAD_EPS = 1e-5
#: logits per chunk of :meth:`BatchedAttention._chunked` (float32: 2 MiB, about the L2 cache)
CHUNK = 2**19


def causal_mask(T: int, device=None) -> Tensor:
    """Boolean (T, T) mask, True where key b lies in the future of query a (b > a)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)


def visible_keys(T: int, causal: bool, dtype=torch.float64, device=None) -> Tensor:
    """Number of keys each query row sees, shape (T,): all T, or t = 1..T when causal."""
    if causal:
        return torch.arange(1, T + 1, dtype=dtype, device=device)
    return torch.full((T,), float(T), dtype=dtype, device=device)


@torch.no_grad()
def row_stats(probs: Tensor, logp: Tensor, n_keys: Tensor) -> dict[str, Tensor]:
    """Summary statistics of attention rows (docs/theory.md §1), reduced over the last two dims.

    ``probs`` and ``logp`` (..., T, T) with masked entries 0 in ``probs`` and finite (any value)
    in ``logp`` (so that ``probs * logp`` is 0 there); ``n_keys`` (T,) the number of visible
    keys of each row. Returns

    * ``ipr`` = mean_a sum_b A_ab^2;
    * ``ipr_cross`` = mean over ordered pairs a != a' of sum_b A_ab A_a'b, computed from the
      column sums c_b = sum_a A_ab as (sum_b c_b^2 - sum_ab A_ab^2) / (T (T - 1));
    * ``entropy`` = mean over rows with n_a > 1 of -sum_b A_ab log A_ab / log n_a (from the
      log-probabilities, so no log(0));
    * ``wmax`` = mean_a max_b A_ab.
    """
    ent_rows = -torch.linalg.vecdot(probs, logp)  # (..., T)
    return _reduce_rows(probs, ent_rows, probs.amax(-1), n_keys)


def softmax_with_stats(logits: Tensor, n_keys: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``softmax(logits)`` and :func:`row_stats` of it, without forming log-probabilities.

    One softmax pass plus two row maxima and a row dot product: with m_a = max_b z_ab and
    A_ab = exp(z_ab - m_a) / Z_a, the row maximum of A is 1 / Z_a, so log Z_a = -log max_b A_ab
    and the entropy is H_a = log Z_a + m_a - sum_b A_ab z_ab. Masked logits must be finite
    (the most negative float, see the causal mask) so that 0 * z = 0. In float32 at score
    std 100 (|z| ~ 300) the cancellation costs ~1e-5 nats, far below any tolerance used, but
    it can push a frozen row (exact entropy 0) to -1e-5 or a uniform row above log n: each
    row is therefore clamped to [0, log n_a], the range its exact value lies in (the clamp
    moves a row by at most that roundoff; a test compares with float64).
    The probabilities keep their autograd history; the statistics are detached.
    """
    a = torch.softmax(logits, dim=-1)
    with torch.no_grad():
        ad, z = a.detach(), logits.detach()
        amax = ad.amax(-1)
        # vecdot, not einsum: einsum ran each row as a (1, T) x (T, 1) product, 3x slower
        ent_rows = (z.amax(-1) - torch.log(amax)) - torch.linalg.vecdot(ad, z)
        log_n = torch.log(n_keys.to(ad.dtype).clamp_min(1.0))
        ent_rows = torch.minimum(ent_rows.clamp_min(0.0), log_n)
        return a, _reduce_rows(ad, ent_rows, amax, n_keys)


def _reduce_rows(probs: Tensor, ent_rows: Tensor, row_max: Tensor,
                 n_keys: Tensor) -> dict[str, Tensor]:
    """Row statistics reduced over rows. Each row's ipr and largest weight lie in
    [1/n_a, 1] and its normalised entropy in [0, 1]; float32 rounding (a uniform row's ipr
    1 ulp below 1/n, a mean 1 ulp above 1) is clamped back into those ranges."""
    T = probs.shape[-1]
    n = n_keys.to(probs.dtype)
    # (..., T), no (T, T) temporary; the norm's kernel is 4x faster than einsum's row products
    row_sq = torch.linalg.vector_norm(probs, dim=-1).square()
    row_sq = torch.minimum(torch.maximum(row_sq, 1.0 / n), torch.ones_like(n))
    ipr = row_sq.mean(-1)
    col = probs.sum(-2)
    cross = (col.square().sum(-1) - row_sq.sum(-1)) / (T * (T - 1)) if T > 1 else ipr
    keep = n > 1
    inv_log = torch.where(keep, 1.0 / torch.log(n.clamp_min(2.0)), torch.zeros_like(n))
    entropy = ((ent_rows * inv_log).sum(-1) / keep.sum().clamp_min(1)).clamp(0.0, 1.0)
    wmax = torch.minimum(torch.maximum(row_max, 1.0 / n), torch.ones_like(n)).mean(-1)
    return {"ipr": ipr, "ipr_cross": cross.clamp_min(0.0), "entropy": entropy, "wmax": wmax}


class BatchedAttention(nn.Module):
    """Self-attention of ``spec`` for ``n_seeds`` stacked initialisations.

    Parameters: ``w_q, w_k, w_v`` (S, d, d) acting as ``x @ W`` (heads = column blocks of
    ``d_head``), value bias ``b_v`` (S, d) and, when ``spec.var_o`` is not None, ``w_o`` (S, d, d)
    and ``b_o`` (S, d). Q and K have no bias. Created empty: the owner initialises them
    (:func:`sigprop.nn.init.init_batched`).
    """

    def __init__(self, spec: ArchSpec, n_seeds: int = 1, dtype: torch.dtype = torch.float32,
                 layer: LayerSpec | None = None):
        super().__init__()
        self.spec = spec
        self.layer = layer
        self.n_seeds = int(n_seeds)
        self.heads = spec.heads
        self.d_head = spec.d_head
        S, d = self.n_seeds, spec.d_model

        def p(*shape):
            return nn.Parameter(torch.zeros(*shape, dtype=dtype))

        self.w_q, self.w_k, self.w_v = p(S, d, d), p(S, d, d), p(S, d, d)
        self.b_v = p(S, d)
        self.has_out = spec.var_o is not None
        if self.has_out:
            self.w_o, self.b_o = p(S, d, d), p(S, d)
        # per-layer designs (module docstring): sinks are set from the spec, not drawn
        self.sink = None
        if layer is not None and layer.sink_logit is not None:
            if len(layer.sink_logit) != self.heads:
                raise ValueError(f"layers.sink_logit: {len(layer.sink_logit)} heads, the spec "
                                 f"has {self.heads}")
            self.sink = nn.Parameter(torch.tensor(layer.sink_logit, dtype=dtype)
                                     .expand(S, self.heads).clone())
        self.has_gate = layer is not None and layer.gate_var is not None
        if self.has_gate:
            self.w_g, self.b_g = p(S, d, d), p(S, d)
        self.sigmoid_bias = None if layer is None else layer.sigmoid_bias
        self.diff = None if layer is None else layer.diff_lambda
        self.head_norm2 = None if layer is None else layer.head_norm2
        if self.diff is not None:  # lambda's four vectors of d_head / 2 entries
            if self.d_head % 2:
                raise ValueError(f"layers.diff_lambda: head dim {self.d_head} is odd")
            self.lam = p(S, 4, self.d_head // 2)
        #: plain softmax rows (the chunked and fused paths)
        self.softmax_rows = (self.sink is None and self.sigmoid_bias is None
                             and self.diff is None and self.head_norm2 is None)

    def init_targets(self):
        """(param, role, fan_in, fan_out) in a fixed draw order (see nn.init)."""
        d = self.spec.d_model
        out = [(self.w_q, "q", d, d), (self.w_k, "k", d, d), (self.w_v, "v", d, d),
               (self.b_v, "bias", d, d)]
        if self.has_out:
            out += [(self.w_o, "o", d, d), (self.b_o, "bias", d, d)]
        if self.has_gate:  # last, so that models without a gate draw as before
            out += [(self.w_g, "gate", d, d), (self.b_g, "gate_bias", d, d)]
        if self.diff is not None:
            out += [(self.lam, "diff_lambda", self.d_head // 2, self.d_head // 2)]
        return out

    # ---------------------------------------------------------------- pieces
    def _heads(self, x2: Tensor, w: Tensor, B: int, T: int, bias: Tensor | None = None):
        """(S, B*T, d) @ (S, d, d) [+ bias] -> (S, B, H, T, d_head)."""
        y = torch.bmm(x2, w) if bias is None else torch.baddbmm(bias.unsqueeze(1), x2, w)
        return y.view(self.n_seeds, B, T, self.heads, self.d_head).transpose(2, 3)

    def _scale(self, T: int, dtype, device) -> Tensor | float:
        """Score factor m(n)/sqrt(d_H): a float, or (T, 1) per query row when it depends on
        the causal row length."""
        base = 1.0 / math.sqrt(self.d_head)
        kind, param = self.spec.scaling, self.spec.scaling_param
        if kind == "none":
            return base
        if self.spec.causal and kind in ("log-n", "sqrt-log-n", "qwen", "sqrt-qwen", "ssmax"):
            m = score_multiplier(kind, range(1, T + 1), param)
            return torch.as_tensor(m * base, dtype=dtype, device=device).unsqueeze(-1)
        return float(score_multiplier(kind, T, param)) * base

    def _prepare(self, x: Tensor) -> Tensor:
        if x.dim() == 3:
            x = x.unsqueeze(0).expand(self.n_seeds, *x.shape)
        if x.dim() != 4 or x.shape[0] != self.n_seeds or x.shape[-1] != self.spec.d_model:
            raise ValueError(f"expected input (S={self.n_seeds} or none, B, T, "
                             f"d={self.spec.d_model}), got {tuple(x.shape)}")
        return x.to(self.w_q.dtype)

    def qk(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(q, k)``, each (S, B, H, T, d_head), with the score factor ``m(n)/sqrt(d_H)``
        already on q (per query row where a length scaling makes it depend on the row): the
        logits are ``q k^T``."""
        x = self._prepare(x)
        S, B, T, d = x.shape
        x2 = x.reshape(S, B * T, d)
        q = self._heads(x2, self.w_q, B, T)
        k = self._heads(x2, self.w_k, B, T)
        return q * self._scale(T, q.dtype, q.device), k

    def scores(self, x: Tensor) -> Tensor:
        """Scaled logits (S, B, H, T, T) before masking (docs/theory.md §2.1)."""
        q, k = self.qk(x)
        return torch.matmul(q, k.transpose(-1, -2))

    # ---------------------------------------------------------------- forward
    def _mixed(self, v: Tensor, values: FirstValues | None) -> Tensor:
        """The values this block attends over: its own, or mixed with the first block's
        (``LayerSpec.value_mix``); an empty ``values`` holder is filled with them."""
        mix = None if self.layer is None else self.layer.value_mix
        if mix is not None:
            if values is None or values.v is None:
                raise RuntimeError("value residual: the first block's values were not computed "
                                   "in this forward pass (run the whole SigpropTransformer)")
            return mix[0] * v + mix[1] * values.v
        if values is not None and values.v is None:
            values.v = v
        return v

    def forward(self, x: Tensor, return_stats: bool = False, return_probs: bool = False,
                values: FirstValues | None = None) -> AttentionOutput:
        """Attention output for x of shape (S, B, T, d) or (B, T, d) (shared by all seeds);
        ``values``: the first block's values (value residual, module docstring)."""
        x = self._prepare(x)
        S, B, T, d = x.shape
        x2 = x.reshape(S, B * T, d)
        causal = self.spec.causal
        kind = self.spec.attention
        plain = self.softmax_rows and not self.has_gate and values is None
        if (return_stats and not return_probs and not torch.is_grad_enabled() and plain
                and x.device.type == "cpu" and S * B > 1 and kind == "softmax"):
            mask = causal_mask(T, x.device) if causal else None
            return self._chunked(x2, B, T, mask, visible_keys(T, causal, x.dtype, x.device))
        v = self._mixed(self._heads(x2, self.w_v, B, T, self.b_v), values)  # (S, B, H, T, dh)
        mask = causal_mask(T, x.device) if causal else None
        n_keys = visible_keys(T, causal, x.dtype, x.device)
        stats = probs = None

        if kind in ("uniform", "identity"):
            out = self._running_mean(v, n_keys) if kind == "uniform" else v
            if return_stats or return_probs:
                if kind == "identity":
                    a = torch.eye(T, dtype=x.dtype, device=x.device)
                else:
                    a = torch.ones(T, T, dtype=x.dtype, device=x.device)
                    if causal:
                        a = a.masked_fill(mask, 0.0)
                    a = a / n_keys.unsqueeze(-1)
                if return_stats:
                    logp = torch.log(a.clamp_min(torch.finfo(a.dtype).tiny))
                    stats = {k: val.expand(S, B, self.heads).clone()
                             for k, val in row_stats(a, logp, n_keys).items()}
                if return_probs:
                    probs = a.expand(S, B, self.heads, T, T)
        elif not (return_stats or return_probs) and self.softmax_rows and isinstance(
                scale := self._scale(T, x.dtype, x.device), float):
            out = self._fused(x2, v, B, T, scale, causal)
            if kind == "centred":
                out = out - self._running_mean(v, n_keys)
        else:
            q = self._heads(x2, self.w_q, B, T)
            k = self._heads(x2, self.w_k, B, T)
            if self.diff is not None:
                a, stats = self._diff_rows(q, k, mask, n_keys, return_stats)
            logits = self._logits(q, k, mask) if self.diff is None else None
            del q, k
            if self.sigmoid_bias is not None:
                a, stats = self._sigmoid_rows(logits, n_keys, return_stats)
            elif logits is not None and return_stats:
                a, stats = softmax_with_stats(logits, n_keys)
            elif logits is not None:
                a = torch.softmax(logits, dim=-1)
            if self.sink is not None:  # the rows' mass on the keys, W = 1 - p0
                sk = self.sink.to(logits.dtype).view(S, 1, self.heads, 1)
                a = a * torch.sigmoid(torch.logsumexp(logits, dim=-1) - sk).unsqueeze(-1)
            del logits
            out = torch.matmul(a, v)
            if self.head_norm2 is not None:  # each head's output RMS-normalised
                out = out * (torch.rsqrt(out.square().mean(-1, keepdim=True) + HEAD_EPS)
                             * math.sqrt(self.head_norm2))
            if kind == "centred":
                out = out - self._running_mean(v, n_keys)
            if return_probs:
                probs = a
            del a

        out = out.transpose(2, 3).reshape(S, B * T, d)
        if self.has_gate:
            out = out * torch.sigmoid(torch.baddbmm(self.b_g.unsqueeze(1), x2, self.w_g))
        if self.has_out:
            out = torch.baddbmm(self.b_o.unsqueeze(1), out, self.w_o)
        return AttentionOutput(out.view(S, B, T, d), stats, probs)

    def _logits(self, q: Tensor, k: Tensor, mask, factor: float = 1.0) -> Tensor:
        """Scaled logits ``q k^T m(n) / sqrt(d_H)`` (times ``factor``), the hidden keys at
        the most negative finite number, not -inf: their probability is exactly 0 and their
        log-probability stays finite, so 0 * logp = 0 in the entropy."""
        T = q.shape[-2]
        z = torch.matmul(q * (self._scale(T, q.dtype, q.device) * factor), k.transpose(-1, -2))
        return z if mask is None else z.masked_fill(mask, torch.finfo(z.dtype).min)

    def _sigmoid_rows(self, logits: Tensor, n_keys: Tensor, stats: bool):
        """Sigmoid rows ``sigmoid(z + b0 - k log n)`` (``LayerSpec.sigmoid_bias``, n the
        row's visible keys) and, with ``stats``, the statistics of the renormalised rows
        ``w / W`` (``W`` the row's mass)."""
        kk, b0 = self.sigmoid_bias
        z = logits + (b0 - kk * torch.log(n_keys.to(logits.dtype))).unsqueeze(-1)
        a = torch.sigmoid(z)
        if not stats:
            return a, None
        with torch.no_grad():
            mass = a.sum(-1, keepdim=True)
            return a, row_stats(a / mass, F.logsigmoid(z) - torch.log(mass), n_keys)

    def diff_lambda(self) -> Tensor:
        """lambda per seed slice (S,): ``exp(l1 . l2) - exp(l3 . l4) + lambda_init``."""
        lv = self.lam
        return (torch.exp((lv[:, 0] * lv[:, 1]).sum(-1)) - torch.exp((lv[:, 2] * lv[:, 3])
                                                                     .sum(-1)) + self.diff[0])

    def _diff_rows(self, q: Tensor, k: Tensor, mask, n_keys: Tensor, stats: bool):
        """Differential rows ``A1 - lambda A2`` (``LayerSpec.diff_lambda``): the softmaxes of
        the heads' first and second halves of channels, each at ``1/sqrt(d_H/2)``; the
        statistics are those of ``A1``."""
        h = self.d_head // 2
        z1 = self._logits(q[..., :h], k[..., :h], mask, math.sqrt(2.0))
        a1, st = softmax_with_stats(z1, n_keys) if stats else (torch.softmax(z1, -1), None)
        a2 = torch.softmax(self._logits(q[..., h:], k[..., h:], mask, math.sqrt(2.0)), -1)
        lam = self.diff_lambda().to(a1.dtype).view(-1, *(1,) * (a1.dim() - 1))
        return a1 - lam * a2, st

    def _fused(self, x2: Tensor, v: Tensor, B: int, T: int, scale: float, causal: bool):
        """Softmax attention through torch's fused kernel when nothing but the output is
        asked for (training, evaluation): the scores, their scaling and the softmax never
        reach memory as (S, B, H, T, T) tensors, nor do the contiguous copies of q, k, v that
        the batched matmuls made, and the backward pass recomputes them the same way. Same
        scores as :meth:`scores` (a fixed factor ``scale``; the causal mask as
        ``is_causal``); the outputs agree with the explicit path to float32 roundoff
        (tests/nn/test_model.py). Trainability grid step (issue 19): see docs/bench.md."""
        S, H, dh = self.n_seeds, self.heads, self.d_head
        q = self._heads(x2, self.w_q, B, T).reshape(S * B, H, T, dh)
        k = self._heads(x2, self.w_k, B, T).reshape(S * B, H, T, dh)
        out = F.scaled_dot_product_attention(q, k, v.reshape(S * B, H, T, dh),
                                             is_causal=causal, scale=scale)
        return out.view(S, B, H, T, dh)

    def _chunked(self, x2: Tensor, B: int, T: int, mask, n_keys: Tensor) -> AttentionOutput:
        """Softmax attention and its statistics without gradients, a few sequences at a time
        (:data:`CHUNK` logits): each chunk's logits, probabilities and statistics stay in
        cache, where the whole (S, B, H, T, T) maps took a fresh allocation (page faults) and
        a pass over memory per step (the engine benchmark, 8 x 4 x 4 heads x 256^2 per layer:
        the forward ~1.2x faster). Same arithmetic per map as the unchunked path up to where
        two constants enter, so the results agree to float32 roundoff (tests/nn/test_model.py):
        a float score factor scales ``W_Q`` (d^2 numbers) instead of q (S B T d), and the
        value bias, which every softmax row (summing to 1) passes on unchanged, is added to
        the output (or folded into the output bias) instead of to every value."""
        S, H, dh = self.n_seeds, self.heads, self.d_head
        d = H * dh
        scale = self._scale(T, x2.dtype, x2.device)
        w_q = self.w_q * scale if isinstance(scale, float) else self.w_q
        q = self._heads(x2, w_q, B, T).reshape(S * B, H, T, dh)
        if not isinstance(scale, float):
            q = q * scale
        k = self._heads(x2, self.w_k, B, T).reshape(S * B, H, T, dh)
        vv = self._heads(x2, self.w_v, B, T).reshape(S * B, H, T, dh)
        # written head by head into the (S B, T, H, dh) layout the output projection reads
        buf = torch.empty(S * B, T, H, dh, dtype=x2.dtype, device=x2.device)
        out = buf.transpose(1, 2)
        step = max(1, CHUNK // (H * T * T))
        parts: list[dict[str, Tensor]] = []
        for i in range(0, S * B, step):
            j = min(S * B, i + step)
            logits = torch.matmul(q[i:j], k[i:j].transpose(-1, -2))
            if mask is not None:
                logits = logits.masked_fill(mask, torch.finfo(logits.dtype).min)
            a, st = softmax_with_stats(logits, n_keys)
            out[i:j] = torch.matmul(a, vv[i:j])
            parts.append(st)
        stats = {key: torch.cat([p[key] for p in parts]).view(S, B, H) for key in parts[0]}
        o = buf.view(S, B * T, d)
        b_v = self.b_v.unsqueeze(1)
        if self.has_out:
            o = torch.baddbmm(torch.baddbmm(self.b_o.unsqueeze(1), b_v, self.w_o), o, self.w_o)
        else:
            o = o.add_(b_v)
        return AttentionOutput(o.view(S, B, T, d), stats, None)

    @staticmethod
    def _running_mean(v: Tensor, n_keys: Tensor) -> Tensor:
        """Mean of the values over each query's visible keys, broadcastable to v's shape."""
        T = v.shape[-2]
        if int(n_keys[0]) == T:  # bidirectional: one mean for all rows
            return v.mean(dim=-2, keepdim=True).expand_as(v)
        return v.cumsum(dim=-2) / n_keys.to(v.dtype).unsqueeze(-1)
