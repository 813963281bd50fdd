"""The batched transformer stack built from an ArchSpec (docs/architecture.md, docs/theory.md §2.6).

``SigpropTransformer(spec, n_seeds=S)`` holds S independent initialisations of the same
architecture; every weight has shape ``(S, ...)`` and one forward pass measures all of them.
Block structure, exactly as :func:`sigprop.theory.blocks.block_step`:

* post-LN: ``x = LN(alpha_A x + Attn(x))``; ``x = LN(alpha_M x + MLP(x))``
* pre-LN:  ``x = alpha_A x + Attn(LN(x))``; ``x = alpha_M x + MLP(LN(x))``
* none:    ``x = alpha_A x + Attn(x)``;     ``x = alpha_M x + MLP(x)``
* parallel (GPT-J, Falcon, Phi): ``x = alpha_A x + Attn(h) + MLP(h)`` with ``h = LN(x)``
  (pre) or ``x`` (none); post-LN normalises the sum
* a layer with ``branch_gain2`` (Gemma 2, OLMo 2, Peri-LN) normalises each branch's output
  before the add, times the square root of its mean squared gain
* a layer's own ``norm`` (Mix-LN) takes the place of the spec's for that block
* a layer with ``dyt`` (Dynamic Tanh) has ``tanh(alpha x)`` (the attention's or the MLP's
  alpha) wherever its LN would be
* a layer with ``value_mix`` (value residual) attends over ``lambda_self V + lambda_first
  V_1``, ``V_1`` the first block's values of the same forward pass (:meth:`SigpropTransformer.
  forward` hands them on; a block called on its own refuses)

LN has no affine part: ``rms`` is ``x / sqrt(mean(x^2) + eps)`` (gg25, no mean subtraction),
``layernorm`` the standard mean-and-variance normalisation. MLP (docs/theory.md §2.5):
``phi(x W1 + b1) W2 + b2``; SwiGLU: ``(silu(x W_gate + b_gate) * (x W_up + b_up)) W2 + b2``
(GeGLU: gelu).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..spec import ArchSpec, LayerSpec
from . import init as _init
from .attention import AttentionOutput, BatchedAttention, FirstValues

LN_EPS = 1e-6

_ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": lambda z: F.gelu(z, approximate="none"),
    "tanh": torch.tanh,
    "silu": F.silu,
    "linear": lambda z: z,
}
#: the same functions in place (the MLP's hidden layer when no gradient is taken)
_INPLACE = {"relu": torch.relu_, "tanh": torch.tanh_, "silu": lambda z: F.silu(z, inplace=True),
            "linear": lambda z: z}


def normalise(x: Tensor, kind: str, eps: float = LN_EPS) -> Tensor:
    """Affine-free LayerNorm over the last dim: ``rms`` (no mean subtraction) or ``layernorm``."""
    if kind == "rms":
        if x.requires_grad and torch.is_grad_enabled():
            return _RMSNorm.apply(x, eps)[0]
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    if kind == "layernorm":
        return F.layer_norm(x, x.shape[-1:], eps=eps)
    raise ValueError(f"ln_kind must be rms or layernorm (got {kind!r})")


class _RMSNorm(torch.autograd.Function):
    """``y = x r`` with ``r = 1 / sqrt(mean(x^2) + eps)`` (the same forward arithmetic as
    :func:`normalise`) and its derivatives in one expression each: ``dx = r (g - y mean(g y))``
    backward, ``dy = r (dx - y mean(y dx))`` forward. Autograd through the composite ran
    seven elementwise passes where this runs three (the trainability grid step, 48 norms per
    step, issue 19). Works under torch.func (vmap, jacrev, jacfwd); tested against autograd
    of the composite in float64 (tests/nn/test_model.py)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        r = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        return x * r, r

    @staticmethod
    def setup_context(ctx, inputs, output):
        y, r = output
        ctx.save_for_backward(y, r)
        ctx.save_for_forward(y, r)

    @staticmethod
    def _project(t: Tensor, y: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        """``(r (t - y mean(y t)), mean(y t))``."""
        m = torch.linalg.vecdot(t, y, dim=-1).unsqueeze(-1) / y.shape[-1]
        return torch.addcmul(t, y, m, value=-1).mul_(r), m

    @staticmethod
    def backward(ctx, g: Tensor, g_r: Tensor):
        # r is an output too (dr/dx = -r^2 y / d), so that second derivatives, which reach
        # r through this backward's own graph, are exact
        y, r = ctx.saved_tensors
        dx, _ = _RMSNorm._project(g, y, r)
        return torch.addcmul(dx, y, r.square() * g_r, value=-1.0 / y.shape[-1]), None

    @staticmethod
    def jvp(ctx, dx: Tensor, _deps):
        y, r = ctx.saved_tensors
        dy, m = _RMSNorm._project(dx, y, r)
        return dy, -r.square() * m


def skip(x: Tensor, branch: Tensor, alpha) -> Tensor:
    """``alpha x + branch``, the residual sum of a block, in one pass over memory (``add``
    with a float ``alpha``, ``addcmul`` with a tensor one) where ``alpha * x + branch`` took
    two and a temporary. The results agree with the two-pass expression to float32
    rounding of its terms (tests/nn/test_model.py)."""
    if isinstance(alpha, Tensor):
        return torch.addcmul(branch, x, alpha)
    alpha = float(alpha)
    return branch + x if alpha == 1.0 else torch.add(branch, x, alpha=alpha)


def _param(*shape, dtype):
    return nn.Parameter(torch.zeros(*shape, dtype=dtype))


class BatchedMLP(nn.Module):
    """Two-layer MLP (or SwiGLU) for S seeds: ``w1`` / ``w_gate`` + ``w_up`` (S, d, ff),
    biases (S, ff), ``w2`` (S, ff, d), ``b2`` (S, d)."""

    def __init__(self, spec: ArchSpec, n_seeds: int = 1, dtype: torch.dtype = torch.float32,
                 layer: LayerSpec | None = None):
        super().__init__()
        S, d, ff = n_seeds, spec.d_model, spec.ff
        self.spec = spec
        self.layer = layer
        self.moe = layer is not None and layer.moe_experts is not None
        if self.moe:  # docs/theory.md §2.5.2: E experts (S, E, ...), a router, a shared MLP
            self.experts = _MoEExperts(spec, n_seeds, dtype, layer)
            return
        self.swiglu = spec.activation in ("swiglu", "geglu")  # gated: gate * up
        self.gate_act = F.silu if spec.activation == "swiglu" else _ACTIVATIONS["gelu"]
        if self.swiglu:
            self.w_gate, self.b_gate = _param(S, d, ff, dtype=dtype), _param(S, ff, dtype=dtype)
            self.w_up, self.b_up = _param(S, d, ff, dtype=dtype), _param(S, ff, dtype=dtype)
        else:
            self.w1, self.b1 = _param(S, d, ff, dtype=dtype), _param(S, ff, dtype=dtype)
            self.act = _ACTIVATIONS[spec.activation]
        self.w2, self.b2 = _param(S, ff, d, dtype=dtype), _param(S, d, dtype=dtype)

    def init_targets(self):
        if self.moe:
            return self.experts.init_targets()
        d, ff = self.spec.d_model, self.spec.ff
        if self.swiglu:
            first = [(self.w_gate, "mlp_in", d, ff), (self.b_gate, "bias", d, ff),
                     (self.w_up, "mlp_in", d, ff), (self.b_up, "bias", d, ff)]
        else:
            first = [(self.w1, "mlp_in", d, ff), (self.b1, "bias", d, ff)]
        return first + [(self.w2, "mlp_out", ff, d), (self.b2, "bias", ff, d)]

    def forward(self, x: Tensor) -> Tensor:
        if self.moe:
            return self.experts(x)
        S, B, T, d = x.shape
        x2 = x.reshape(S, B * T, d)
        if self.swiglu:
            h = self.gate_act(torch.baddbmm(self.b_gate.unsqueeze(1), x2, self.w_gate))
            h = h * torch.baddbmm(self.b_up.unsqueeze(1), x2, self.w_up)
        else:
            h = torch.baddbmm(self.b1.unsqueeze(1), x2, self.w1)
            # in place without gradients: no second (S, B T, ff) buffer (fresh pages)
            h = _INPLACE[self.spec.activation](h) if (
                self.spec.activation in _INPLACE and not torch.is_grad_enabled()) \
                else self.act(h)
        return torch.baddbmm(self.b2.unsqueeze(1), h, self.w2).view(S, B, T, d)


def moe_gates(logits: Tensor, k: int, weighting: str) -> Tensor:
    """Routing weights (..., E) of router logits (..., E) (docs/theory.md §2.5.2, the same
    rule as :func:`sigprop.theory.moe.gates`): softmax over all E or sigmoid scores, the top-k
    kept (others 0), renormalised to sum 1 for the ``*_norm`` rules."""
    sc = torch.softmax(logits, dim=-1) if weighting.startswith("softmax") \
        else torch.sigmoid(logits)
    if k < logits.shape[-1]:
        idx = torch.topk(logits, k, dim=-1).indices
        mask = torch.zeros_like(sc, dtype=torch.bool).scatter_(-1, idx, True)
        sc = torch.where(mask, sc, torch.zeros_like(sc))
    if weighting.endswith("_norm"):
        sc = sc / sc.sum(-1, keepdim=True)
    return sc


class _MoEExperts(nn.Module):
    """A mixture-of-experts MLP for S seeds (``LayerSpec.moe_*``): E experts with the
    block's MLP variances, ``w1`` / ``w_gate`` + ``w_up`` (S, E, d, ff), ``w2`` (S, E, ff,
    d) and biases; a Gaussian router ``w_r`` (S, d, E); a shared expert (``ws1`` ... of
    width ``ff``) with an optional sigmoid gate ``w_sg`` (S, d, 1). Every expert runs on
    every token (dense compute, E times a dense MLP's), weighted by :func:`moe_gates`."""

    def __init__(self, spec: ArchSpec, n_seeds: int, dtype: torch.dtype, layer: LayerSpec):
        super().__init__()
        S, d, ff, E = n_seeds, spec.d_model, spec.ff, int(layer.moe_experts)
        self.spec, self.layer, self.E = spec, layer, E
        self.swiglu = spec.activation in ("swiglu", "geglu")
        self.act = F.silu if spec.activation == "swiglu" else (
            _ACTIVATIONS["gelu"] if spec.activation == "geglu" else _ACTIVATIONS[spec.activation])
        n_in = 2 if self.swiglu else 1
        self.w_in = nn.ParameterList(_param(S, E, d, ff, dtype=dtype) for _ in range(n_in))
        self.b_in = nn.ParameterList(_param(S, E, ff, dtype=dtype) for _ in range(n_in))
        self.w2, self.b2 = _param(S, E, ff, d, dtype=dtype), _param(S, E, d, dtype=dtype)
        self.w_r = _param(S, d, E, dtype=dtype)
        self.shared = layer.moe_shared_var_in is not None
        if self.shared:
            self.ws_in = nn.ParameterList(_param(S, d, ff, dtype=dtype) for _ in range(n_in))
            self.ws2 = _param(S, ff, d, dtype=dtype)
            self.has_sgate = layer.moe_shared_gate_var is not None
            if self.has_sgate:
                self.w_sg = _param(S, d, 1, dtype=dtype)

    def init_targets(self):
        d, ff = self.spec.d_model, self.spec.ff
        out = []
        for w, b in zip(self.w_in, self.b_in, strict=True):
            out += [(w, "mlp_in", d, ff), (b, "bias", d, ff)]
        out += [(self.w2, "mlp_out", ff, d), (self.b2, "bias", ff, d),
                (self.w_r, "router", d, self.E)]
        if self.shared:
            out += [(w, "shared_in", d, ff) for w in self.ws_in]
            out += [(self.ws2, "shared_out", ff, d)]
            if self.has_sgate:
                out += [(self.w_sg, "shared_gate", d, 1)]
        return out

    def _hidden(self, pre: list[Tensor]) -> Tensor:
        return self.act(pre[0]) * pre[1] if self.swiglu else self.act(pre[0])

    def forward(self, x: Tensor) -> Tensor:
        S, B, T, d = x.shape
        lay = self.layer
        x2 = x.reshape(S, B * T, d)
        g = moe_gates(torch.bmm(x2, self.w_r), lay.moe_top_k, lay.moe_weighting)
        pre = [torch.einsum("snd,sedf->senf", x2, w) + b.unsqueeze(2)
               for w, b in zip(self.w_in, self.b_in, strict=True)]
        y = torch.einsum("senf,sefd->send", self._hidden(pre), self.w2) + self.b2.unsqueeze(2)
        out = lay.moe_scale * torch.einsum("send,sne->snd", y, g)
        if self.shared:
            h = self._hidden([torch.bmm(x2, w) for w in self.ws_in])
            ys = torch.bmm(h, self.ws2)
            if self.has_sgate:
                ys = ys * torch.sigmoid(torch.bmm(x2, self.w_sg))
            out = out + ys
        return out.view(S, B, T, d)


class BatchedBlock(nn.Module):
    """One transformer block (module docstring) for S seeds."""

    def __init__(self, spec: ArchSpec, n_seeds: int = 1, dtype: torch.dtype = torch.float32,
                 ln_eps: float = LN_EPS, layer: LayerSpec | None = None):
        super().__init__()
        self.spec = spec
        self.ln_eps = ln_eps
        self.attn = BatchedAttention(spec, n_seeds, dtype, layer)
        self.mlp = BatchedMLP(spec, n_seeds, dtype, layer)
        #: norms on the branch outputs (``LayerSpec.branch_gain2``: Gemma 2, Peri-LN): each
        #: branch normalised, times the square root of its mean squared gain; None: none
        g2 = None if layer is None else layer.branch_gain2
        self.branch_gain = None if g2 is None else tuple(float(g) ** 0.5 for g in g2)
        #: this block's norm placement (a layer's own, Mix-LN) and Dynamic Tanh slopes
        self.norm = spec.norm if layer is None or layer.norm is None else layer.norm
        self.dyt = None if layer is None else layer.dyt

    def init_targets(self):
        return self.attn.init_targets() + self.mlp.init_targets()

    def _ln(self, x: Tensor, which: int = 0) -> Tensor:
        """The block's norm ``which`` (0: the attention's, 1: the MLP's): LN, or
        ``tanh(alpha x)`` with Dynamic Tanh."""
        if self.dyt is not None:
            return torch.tanh(x * self.dyt[which])
        return normalise(x, self.spec.ln_kind, self.ln_eps)

    def _out(self, y: Tensor, branch: int) -> Tensor:
        """A branch's output as added to the stream: normalised and times its gain where the
        layer normalises its branch outputs (``branch`` 0 attention, 1 MLP)."""
        if self.branch_gain is None:
            return y
        return normalise(y, self.spec.ln_kind, self.ln_eps) * self.branch_gain[branch]

    def forward(self, x: Tensor, return_stats: bool = False, return_probs: bool = False,
                values: FirstValues | None = None) -> tuple[Tensor, AttentionOutput]:
        """``values``: the first block's values of this forward pass (value residual; the
        first block fills it, the later ones read it)."""
        sp = self.spec
        a_att, a_mlp = sp.alpha_attn, sp.alpha_mlp
        if sp.parallel:  # one skip, both branches read the same input
            h = self._ln(x) if self.norm == "pre" else x
            att = self.attn(h, return_stats, return_probs, values)
            x = skip(x, self._out(att.out, 0), a_att) + self._out(self.mlp(h), 1)
            return (self._ln(x) if self.norm == "post" else x), att
        if self.norm == "post":
            att = self.attn(x, return_stats, return_probs, values)
            x = self._ln(skip(x, self._out(att.out, 0), a_att), 0)
            x = self._ln(skip(x, self._out(self.mlp(x), 1), a_mlp), 1)
        elif self.norm == "pre":
            att = self.attn(self._ln(x, 0), return_stats, return_probs, values)
            x = skip(x, self._out(att.out, 0), a_att)
            x = skip(x, self._out(self.mlp(self._ln(x, 1)), 1), a_mlp)
        else:
            att = self.attn(x, return_stats, return_probs, values)
            x = skip(x, self._out(att.out, 0), a_att)
            x = skip(x, self._out(self.mlp(x), 1), a_mlp)
        return x, att


@dataclass
class ModelOutput:
    """``output`` (S, B, T, d) = last hidden state; ``hidden``: L+1 tensors (S, B, T, d),
    index 0 the input / embeddings, index l the output of block l; ``stats``: L dicts
    ``{ipr, ipr_cross, entropy, wmax}`` of (S, B, H) tensors (block l at index l-1);
    ``probs``: L attention tensors (S, B, H, T, T). Unrequested fields are None."""

    output: Tensor
    hidden: list[Tensor] | None = None
    stats: list[dict[str, Tensor]] | None = None
    probs: list[Tensor] | None = None


class SigpropTransformer(nn.Module):
    """Transformer stack of ``spec`` holding ``n_seeds`` independent initialisations.

    ``init``: a scheme of :mod:`sigprop.nn.init` (``spec``, ``rem``, ``hf``, ``xavier``,
    ``xavier_uniform``, ``he``) or None to leave the weights at zero (to be filled by the
    caller). Seed slice ``i`` is drawn from ``seed + i``. ``embeddings`` (alias
    ``vocab_size``): vocabulary size for token embeddings (S, V, d) plus position embeddings
    (S, seq_len, d), both N(0, 1), whose sum is normalised with ``spec.ln_kind`` (q = 1 per
    token, the theory's layer-0 state); None: the model takes continuous inputs
    (S, B, T, d) or (B, T, d). ``beta`` / ``std`` are passed to the ``rem`` / ``hf`` schemes.
    """

    def __init__(self, spec: ArchSpec, n_seeds: int = 1, seed: int = 0, init: str | None = "spec",
                 dtype: torch.dtype = torch.float32, embeddings: int | None = None, *,
                 vocab_size: int | None = None, beta: float | None = None,
                 std: float | None = None, ln_eps: float = LN_EPS):
        super().__init__()
        if spec.memory_len is not None:
            from ..spec import SpecError

            raise SpecError("memory_len", "sigprop's torch model has no cross-attention; "
                                          "measure a decoder stack on its HF model (sigprop "
                                          "diagnose --stack decoder)")
        if n_seeds < 1:
            raise ValueError(f"n_seeds must be >= 1 (got {n_seeds})")
        if embeddings is not None and vocab_size is not None and embeddings != vocab_size:
            raise ValueError("give embeddings or vocab_size, not two different sizes")
        self.spec = spec
        self.n_seeds = int(n_seeds)
        self.seed = int(seed)
        self.dtype = dtype
        self.ln_eps = ln_eps
        self.vocab_size = embeddings if embeddings is not None else vocab_size
        if self.vocab_size is not None:
            self.tok_emb = _param(n_seeds, self.vocab_size, spec.d_model, dtype=dtype)
            self.pos_emb = _param(n_seeds, spec.seq_len, spec.d_model, dtype=dtype)
        self.blocks = nn.ModuleList(
            BatchedBlock(spec, n_seeds, dtype, ln_eps,
                         None if spec.layers is None else spec.layers[i])
            for i in range(spec.depth))
        self.init_scheme = init
        if init is not None:
            _init.init_batched(self, init, seed, spec=spec, beta=beta, std=std)

    def init_targets(self):
        """All parameters as (param, role, fan_in, fan_out), in the fixed draw order."""
        out = []
        if self.vocab_size is not None:
            d = self.spec.d_model
            out += [(self.tok_emb, "embed", self.vocab_size, d),
                    (self.pos_emb, "embed", self.spec.seq_len, d)]
        for blk in self.blocks:
            out += blk.init_targets()
        return out

    def reinit(self, scheme: str = "spec", seed: int | None = None, **kw) -> SigpropTransformer:
        """Redraw every weight with ``scheme`` (keywords as :func:`nn.init.init_batched`)."""
        self.seed = self.seed if seed is None else int(seed)
        self.init_scheme = scheme
        return _init.init_batched(self, scheme, self.seed, spec=self.spec, **kw)

    @torch.no_grad()
    def seed_slice(self, idx) -> SigpropTransformer:
        """A new model holding copies of the seeds ``idx`` (an int, slice or index list)."""
        if isinstance(idx, int):
            idx = [idx]
        idx = torch.arange(self.n_seeds)[idx].reshape(-1)
        new = SigpropTransformer(self.spec, len(idx), init=None, dtype=self.dtype,
                                 embeddings=self.vocab_size, ln_eps=self.ln_eps)
        src = dict(self.named_parameters())
        for name, p in new.named_parameters():
            p.copy_(src[name][idx])
        new.seed, new.init_scheme = self.seed, self.init_scheme
        return new

    def embed(self, ids: Tensor) -> Tensor:
        """Token ids (B, T) or (S, B, T) -> normalised embeddings (S, B, T, d)."""
        if self.vocab_size is None:
            raise ValueError("this model has no embeddings (built without a vocabulary size)")
        S = self.n_seeds
        if ids.dim() == 2:
            ids = ids.unsqueeze(0).expand(S, *ids.shape)
        if ids.dim() != 3 or ids.shape[0] != S:
            raise ValueError(f"token ids must be (B, T) or ({S}, B, T), got {tuple(ids.shape)}")
        T = ids.shape[-1]
        if T > self.spec.seq_len:
            raise ValueError(f"sequence of {T} tokens exceeds seq_len={self.spec.seq_len}")
        seeds = torch.arange(S, device=ids.device).view(S, 1, 1)
        x = self.tok_emb[seeds, ids] + self.pos_emb[:, :T].unsqueeze(1)
        return normalise(x, self.spec.ln_kind, self.ln_eps)

    def _inputs(self, x: Tensor) -> Tensor:
        if not torch.is_floating_point(x):
            return self.embed(x)
        if self.vocab_size is not None and x.shape[-1] != self.spec.d_model:
            raise ValueError("float inputs must be (S, B, T, d) or (B, T, d) embeddings")
        if x.dim() == 3:
            x = x.unsqueeze(0).expand(self.n_seeds, *x.shape)
        if x.dim() != 4 or x.shape[0] != self.n_seeds or x.shape[-1] != self.spec.d_model:
            raise ValueError(f"expected (S={self.n_seeds} or none, B, T, d={self.spec.d_model}) "
                             f"inputs, got {tuple(x.shape)}")
        return x.to(self.dtype)

    def forward(self, x: Tensor, return_hidden: bool = True, return_stats: bool = True,
                return_probs: bool = False) -> ModelOutput:
        """Run all blocks on ``x`` (float inputs, or token ids when built with embeddings)."""
        x = self._inputs(x)
        hidden = [x] if return_hidden else None
        stats = [] if return_stats else None
        probs = [] if return_probs else None
        lays = self.spec.layers or ()
        values = FirstValues() if any(y.value_mix is not None for y in lays) else None
        for blk in self.blocks:
            x, att = blk(x, return_stats, return_probs, values)
            if return_hidden:
                hidden.append(x)
            if return_stats:
                stats.append(att.stats)
            if return_probs:
                probs.append(att.probs)
        return ModelOutput(x, hidden, stats, probs)
