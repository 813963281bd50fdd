"""hyper-connections: ``n`` residual streams in place of one, mixed by learned matrices
(Zhu et al. 2024, "Hyper-Connections", ICLR 2025), and the manifold-constrained variant mHC
(DeepSeek 2025, "mHC: Manifold-Constrained Hyper-Connections"), on pre-LN decoder blocks
(GPT-2, Llama family; :mod:`.streams`).

Each sub-layer ``T`` (a block's attention, then its MLP, each its own) reads a weighted sum of
the streams and writes its output to every stream, which it mixes:
``h_in = sum_i pre_i H_i``, ``y = T(h_in)``, ``H'_j = post_j y + sum_i res_ij H_i``. The
first block's input fills the ``n`` streams with copies; every block's visible output (what
the next block, the final norm and the probes read) is the streams' mean (the paper sums them
before the final norm, which the norm does not see but for its epsilon).

``kind=hc``: static hyper-connections with the paper's initialisation, which makes them the
pre-LN residual connection: ``pre = e_(k mod n)`` for sub-layer ``k``, ``post = 1``,
``res = I``. ``kind=mhc``: ``res`` constrained doubly stochastic, ``Sinkhorn-Knopp(exp R)``
(20 alternating row and column normalisations in log space, mHC's ``t_max``), ``pre =
sigmoid(P)``, ``post = 2 sigmoid(Q)``. Its initialisation (ours, stated): ``Q = 0`` (post 1),
``res`` 0.9 on the diagonal and ``0.1 / (n - 1)`` elsewhere, ``pre`` 0.9 on stream
``k mod n`` and ``0.1 / (n - 1)`` on the others. Both reduce to the plain residual connection
at init: the streams start equal, a doubly stochastic ``res`` keeps equal streams equal, the
``pre`` weights sum to 1 and every ``post`` is 1; the unequal ``pre`` break the streams'
symmetry, as ``e_(k mod n)`` does for HC. The dynamic (input-dependent) part of both papers
is not implemented. The matrices are parameters ``sigprop_hc_pre``, ``sigprop_hc_post``,
``sigprop_hc_res`` on each attention and MLP module (``P``, ``Q``, ``R`` for mHC), restored
by sigprop's loader.

Theory: at init the model is the unpatched one, so the theory's prediction is the unpatched
model's; training moves the streams apart, which the theory does not follow (measured only).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...spec import SpecError
from . import streams
from .base import Method, Param, register
from .parts import remember_hook

PRE, POST, RES = "sigprop_hc_pre", "sigprop_hc_post", "sigprop_hc_res"
STATE = "_sigprop_hc"
SINKHORN_ITERS = 20
#: mHC's init: the share of the main stream in pre and of the diagonal in res
MAIN = 0.9


def sinkhorn(logits: torch.Tensor, iters: int = SINKHORN_ITERS) -> torch.Tensor:
    """``exp(logits)`` made doubly stochastic by ``iters`` alternating row and column
    normalisations, in log space (the columns sum to 1 exactly, the rows to the iteration's
    tolerance)."""
    x = logits
    for _ in range(iters):
        x = x - torch.logsumexp(x, dim=-1, keepdim=True)
        x = x - torch.logsumexp(x, dim=-2, keepdim=True)
    return x.exp()


def mixing(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sub-layer's ``(pre (n,), post (n,), res (n, n))`` as the forward pass uses them."""
    pre, post, res = (getattr(module, k) for k in (PRE, POST, RES))
    if module._sigprop_hc_kind == "mhc":
        return torch.sigmoid(pre), 2.0 * torch.sigmoid(post), sinkhorn(res)
    return pre, post, res


def _init(kind: str, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sub-layer ``k``'s stored parameters at init (module docstring)."""
    main = k % n
    if kind == "hc":
        pre = torch.zeros(n)
        pre[main] = 1.0
        return pre, torch.ones(n), torch.eye(n)
    other = (1.0 - MAIN) / (n - 1)
    pre = torch.full((n,), math.log(other / (1.0 - other)))
    pre[main] = math.log(MAIN / (1.0 - MAIN))
    res = torch.eye(n) * math.log(MAIN / other)  # exp: MAIN / other on the diagonal, 1 off it
    return pre, torch.zeros(n), res


def _block_pre(module, args, kwargs):
    st = getattr(module, STATE)
    h = streams.block_input(args, kwargs)
    st.h = h
    if module._sigprop_hc_first:
        st.H = h.unsqueeze(-2).expand(*h.shape[:-1], st.n, h.shape[-1])
    return None


def _norm_pre(module, args):
    branch = module._sigprop_hc_of
    st = getattr(branch, STATE)
    pre, _post, _res = mixing(branch)
    return (torch.einsum("i,...id->...d", pre.to(st.H.dtype), st.H), *args[1:])


def _write(module, y: torch.Tensor) -> torch.Tensor:
    """The streams after this sub-layer; returns their mean."""
    st = getattr(module, STATE)
    _pre, post, res = (t.to(y.dtype) for t in mixing(module))
    st.H = post[:, None] * y.unsqueeze(-2) + torch.einsum("ij,...id->...jd", res, st.H)
    return st.H.mean(-2)


def _attn_hook(module, _args, out):
    st = getattr(module, STATE)
    delta = _write(module, streams.branch_output(out)) - st.h
    st.res = st.h + delta  # the block's own sum, bitwise
    return streams.with_branch_output(out, delta)


def _mlp_hook(module, _args, out):
    st = getattr(module, STATE)
    return streams.with_branch_output(out, _write(module, streams.branch_output(out)) - st.res)


def _install(model, parts, params, ctx, method: str) -> None:
    streams.check_unstreamed(parts, method)
    lays = streams.decoder_layout(parts, ctx, method)
    n, kind = int(params["n"]), params["kind"]
    st = streams.State(H=None, n=n)
    for i, lay in enumerate(lays):
        dev = lay.part.o.weight.device
        for j, (mod, norm, hook) in enumerate(((lay.attn, lay.attn_norm, _attn_hook),
                                               (lay.mlp, lay.mlp_norm, _mlp_hook))):
            for key, val in zip((PRE, POST, RES), _init(kind, n, 2 * i + j), strict=True):
                mod.register_parameter(key, nn.Parameter(val.to(dev)))
            object.__setattr__(mod, "_sigprop_hc_kind", kind)
            object.__setattr__(mod, STATE, st)
            remember_hook(mod, "hc", mod.register_forward_hook(hook))
            nm = getattr(*norm)
            object.__setattr__(nm, "_sigprop_hc_of", mod)
            remember_hook(nm, "hc", nm.register_forward_pre_hook(_norm_pre))
        object.__setattr__(lay.block, STATE, st)
        object.__setattr__(lay.block, "_sigprop_hc_first", i == 0)
        remember_hook(lay.block, streams.KEY, lay.block.register_forward_pre_hook(
            _block_pre, with_kwargs=True))


@register
class HyperConnections(Method):
    name = "hyper-connections"
    params = (
        Param("n", "expansion rate: the number of residual streams (both papers: 4)", 4.0,
              lo=1, hi=16),
        Param("kind", "hc: static hyper-connections (Zhu et al.); mhc: the residual mix "
                      "doubly stochastic by Sinkhorn, pre and post through sigmoids (mHC)",
              "hc", choices=("hc", "mhc")),
    )

    def validate(self, ctx, params):
        if params["n"] != int(params["n"]):
            raise SpecError(f"{self.name}.n", f"must be a whole number (got {params['n']:g})")
        params["n"] = int(params["n"])
        if params["kind"] == "mhc" and params["n"] < 2:
            raise SpecError(f"{self.name}.n", "mhc mixes two or more streams (n >= 2)")

    def apply(self, model, parts, params, ctx, effect):
        what = (f"{params['n']} residual streams, {params['kind']}: each attention and MLP "
                "reads a weighted sum and writes to every stream, mixed by res")
        if not parts:
            return [what]
        _install(model, parts, params, ctx, self.name)
        return [f"{what} (the paper's init: the plain residual connection at init); the "
                "blocks' visible output is the streams' mean"]

    def restore(self, model, parts, params):
        _install(model, parts, params, None, self.name)
