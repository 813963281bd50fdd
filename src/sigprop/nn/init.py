"""Initialisation schemes for the batched sigprop model and for foreign ``nn.Module``s.

Every scheme is a rule ``(role, fan_in, fan_out) -> law`` where the role is one of ``q, k, v,
o, mlp_in, mlp_out, bias, embed``. The laws (docs/theory.md §2.1, §2.4-2.5; variances "times fan-in"
as in :mod:`sigprop.spec`):

* ``spec`` (default): ``W_Q, W_K ~ N(0, s^2)`` with ``s = spec.rem_qk_std()`` (this is
  ``sqrt(beta sqrt(log T) / d)`` when ``beta`` is set and ``qk_std`` otherwise, so that the score
  std is ``spec.sigma_s`` for any number of heads); ``W_V ~ N(0, var_v / d)``,
  ``W_O ~ N(0, var_o / d)``, ``W1 ~ N(0, var_w_in / d)``, ``W2 ~ N(0, var_w_out / d_ff)``,
  biases ``N(0, sigma_b2)``.
* ``rem``: Q/K from a target beta, ``sigma_q = sigma_k = sqrt(beta sqrt(log T) / d)``
(docs/theory.md
  §2.1, gg25 Eq. 11 for H heads), everything else as ``spec``.
* ``hf``: every weight ``N(0, std^2)`` (``std`` default ``spec.init_std``), biases 0.
* ``xavier``: ``N(0, 2 / (fan_in + fan_out))``; ``xavier_uniform``: the uniform law with the
  same variance (Glorot & Bengio 2010); ``he``: ``N(0, 2 / fan_in)``; biases 0.

Embedding tables (token and position) are always ``N(0, 1)``: the model RMS-normalises their
sum, so only their relative scale matters.

Randomness: all draws are float64 standard normals (or uniforms) from a ``torch.Generator``,
scaled by the law's std and cast to the parameter's dtype, so a float32 and a float64 model
built from the same seed hold the same weights up to rounding, and changing a variance (e.g.
beta) only rescales the same draws.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from ..spec import ArchSpec

SCHEMES = ("spec", "rem", "hf", "xavier", "xavier_uniform", "he")
ROLES = ("q", "k", "v", "o", "mlp_in", "mlp_out", "bias", "embed", "gate", "gate_bias",
         "router", "shared_in", "shared_out", "shared_gate", "diff_lambda")
#: roles whose law comes from the block's LayerSpec (output gate, mixture of experts,
#: differential attention's lambda vectors)
_LAYER_ROLES = ("gate", "gate_bias", "router", "shared_in", "shared_out", "shared_gate",
                "diff_lambda")


def rem_qk_std(beta: float, seq_len: int, d_model: int) -> float:
    """Q/K weight std giving inverse temperature ``beta`` at length ``seq_len`` for inputs with
    ``|x|^2 = d_model`` (docs/theory.md §2.1): ``sqrt(beta sqrt(log T) / d)``, independent of
    heads."""
    if beta < 0 or seq_len < 2 or d_model < 1:
        raise ValueError(f"need beta >= 0, seq_len >= 2, d_model >= 1 (got {beta}, {seq_len}, "
                         f"{d_model})")
    return math.sqrt(beta * math.sqrt(math.log(seq_len)) / d_model)


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"init scheme must be one of {', '.join(SCHEMES)} (got {scheme!r})")


def law(scheme: str, role: str, fan_in: int, fan_out: int, *, spec: ArchSpec | None = None,
        beta: float | None = None, seq_len: int | None = None, d_model: int | None = None,
        std: float | None = None) -> tuple[float, bool]:
    """``(std, uniform)`` of one tensor under ``scheme`` (module docstring). ``uniform`` means
    ``U(-sqrt(3) std, sqrt(3) std)``; otherwise ``N(0, std^2)``.

    ``spec`` gives the variances of ``spec`` / ``rem`` and the default ``std`` of ``hf``.
    Without a spec (foreign models), ``spec`` / ``rem`` fall back to ``N(0, std^2)`` weights
    and zero biases for every role but Q/K. ``rem`` Q/K: ``rem_qk_std(beta, seq_len, d_model)``
    with ``seq_len`` / ``d_model`` defaulting to the spec's (``d_model`` then to ``fan_in``);
    without ``beta`` the spec's own Q/K std."""
    _check_scheme(scheme)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)} (got {role!r})")
    if role == "embed":
        return 1.0, False
    if role in _LAYER_ROLES and (scheme in ("spec", "rem") or role == "gate_bias"):
        # an output gate's law comes from its LayerSpec (init_batched); without one it is
        # drawn like any weight (HF law) and its bias is 0
        return (0.0 if role == "gate_bias" else hf_std_default(std, spec)), False
    if scheme in ("xavier", "xavier_uniform", "he"):
        if role == "bias":
            return 0.0, False
        if scheme == "he":
            return math.sqrt(2.0 / fan_in), False
        return math.sqrt(2.0 / (fan_in + fan_out)), scheme == "xavier_uniform"
    hf_std = std if std is not None else (spec.init_std if spec is not None else 0.02)
    if scheme == "hf":
        return (0.0 if role == "bias" else hf_std), False
    if role in ("q", "k"):
        if scheme == "rem" and beta is not None:
            T = seq_len if seq_len is not None else (spec.seq_len if spec else None)
            if T is None:
                raise ValueError("scheme 'rem' needs seq_len (or a spec)")
            d = d_model if d_model is not None else (spec.d_model if spec else fan_in)
            return rem_qk_std(beta, T, d), False
        if spec is None:
            raise ValueError(f"scheme {scheme!r} needs a spec (or, for 'rem', beta)")
        return spec.rem_qk_std(), False
    if spec is None:
        return (0.0 if role == "bias" else hf_std), False
    if role == "bias":
        return math.sqrt(spec.sigma_b2), False
    var = {"v": spec.var_v, "o": spec.var_o, "mlp_in": spec.var_w_in,
           "mlp_out": spec.var_w_out}[role]
    if var is None:  # the spec has no W_O; a foreign model's W_O gets the HF law
        return hf_std, False
    return math.sqrt(var / fan_in), False


def hf_std_default(std: float | None, spec: ArchSpec | None) -> float:
    """The ``hf`` scheme's weight std: ``std``, else the spec's ``init_std``, else 0.02."""
    return std if std is not None else (spec.init_std if spec is not None else 0.02)


def _draw(shape: Sequence[int], std: float, uniform: bool,
          generator: torch.Generator) -> torch.Tensor:
    """Draws are made in float32 (4x faster than float64 on CPU) and scaled in float64, so a
    float32 and a float64 model built with the same seed hold the same weights up to rounding."""
    if uniform:
        u = torch.rand(tuple(shape), generator=generator, dtype=torch.float32).double()
        return (2.0 * u - 1.0) * (math.sqrt(3.0) * std)
    if std == 0.0:
        return torch.zeros(tuple(shape), dtype=torch.float64)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32).double() * std


# --------------------------------------------------------------------------------------------
# the batched model
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def init_batched(model: nn.Module, scheme: str = "spec", seed: int = 0, *,
                 spec: ArchSpec | None = None, beta: float | None = None,
                 seq_len: int | None = None, std: float | None = None) -> nn.Module:
    """(Re)initialise a batched model in place and return it.

    ``model`` provides ``init_targets()`` -> iterable of ``(param, role, fan_in, fan_out)``
    with every ``param`` of shape ``(S, ...)`` (see :class:`sigprop.nn.model.SigpropTransformer`)
    and ``spec``. Seed slice ``i`` is drawn from its own generator seeded with ``seed + i``, in
    the order of ``init_targets()``: slice ``i`` of a model built with ``seed = k`` equals the
    single-seed model built with ``seed = k + i``, and no slice depends on ``S``."""
    _check_scheme(scheme)
    spec = spec if spec is not None else model.spec
    targets = list(model.init_targets())
    n_seeds = targets[0][0].shape[0]
    per_block = _block_specs(model, spec) if scheme == "spec" else {}
    for i in range(n_seeds):
        g = torch.Generator().manual_seed(int(seed) + i)
        for param, role, fan_in, fan_out in targets:
            bs = per_block.get(id(param))
            lay = bs[2] if bs else None
            if role in _LAYER_ROLES and lay is not None and (scheme in ("spec", "rem")
                                                             or role == "diff_lambda"):
                var = {"gate": lay.gate_var, "router": lay.moe_router_var,
                       "shared_in": lay.moe_shared_var_in, "shared_out": lay.moe_shared_var_out,
                       "shared_gate": lay.moe_shared_gate_var}.get(role)
                s, uni = (math.sqrt(lay.gate_bias2) if role == "gate_bias"
                          else lay.diff_lambda[1] if role == "diff_lambda"
                          else math.sqrt(var / fan_in)), False
            else:
                s, uni = law(scheme, role, fan_in, fan_out, spec=bs[0] if bs else spec,
                             beta=beta, seq_len=seq_len, std=std)
            w = _draw(param.shape[1:], s, uni, g)
            if bs is not None and role in ("q", "k", "o") and bs[1] is not None:
                w = _scale_heads(w, bs[1], role, spec.heads)
            param[i].copy_(w)
    return model


def _block_specs(model: nn.Module, spec: ArchSpec) -> dict:
    """For a spec with per-layer ``layers`` (docs/theory.md §2.8): ``id(param) -> (block spec,
    per-head factors)``. The block spec holds the layer's variances and RMS score std; the
    factors are ``(score std / RMS, output share)`` per head, applied to the Q/K columns
    (square root each) and the W_O rows (square root) of that head."""
    if spec.layers is None or not hasattr(model, "blocks"):
        return {}
    out = {}
    for blk, lay in zip(model.blocks, spec.layers, strict=True):
        base = math.sqrt(lay.sigma_rms / spec.d_model)
        bs = spec.replace(layers=None, qk_std=base, sigma_v2=lay.var_v, sigma_w2=lay.var_w_in,
                          sigma_w2_out=lay.var_w_out, sigma_o2=lay.var_o, sigma_b2=lay.var_b)
        sig = torch.tensor(lay.sigma_s, dtype=torch.float64)
        rel = sig / lay.sigma_rms if lay.sigma_rms > 0 else torch.ones_like(sig)
        share = torch.tensor(lay.head_weights or [1.0] * len(sig), dtype=torch.float64)
        for param, _, _, _ in blk.init_targets():
            out[id(param)] = (bs, (rel, share / share.mean()), lay)
    return out


def _scale_heads(w: torch.Tensor, factors, role: str, heads: int) -> torch.Tensor:
    """Q/K ``(d, d)`` columns of head h times ``sqrt(rel_h)`` (score std rel_h); W_O rows of
    head h times ``sqrt(share_h)``."""
    rel, share = factors
    f = (rel if role in ("q", "k") else share).sqrt()
    if f.numel() != heads:
        raise ValueError(f"layers: {f.numel()} heads per layer, the spec has {heads}")
    per = f.repeat_interleave(w.shape[-1] // heads)
    return w * (per if role in ("q", "k") else per[:, None])


# --------------------------------------------------------------------------------------------
# foreign modules (HF models ...)
# --------------------------------------------------------------------------------------------
def _weight_fans(module: nn.Module) -> tuple[int, int]:
    """(fan_in, fan_out) of a linear-like module: nn.Linear stores its weight as (out, in),
    transformers' Conv1D (GPT-2) as (in, out)."""
    w = module.weight
    if w.dim() != 2:
        raise TypeError(f"{type(module).__name__} has no 2-D weight")
    if type(module).__name__ == "Conv1D":
        return w.shape[0], w.shape[1]
    return w.shape[1], w.shape[0]


def _match(names: Iterable[str], patterns: Sequence[str]) -> list[str]:
    out = []
    for pat in patterns:
        hits = [n for n in names if n == pat or fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise KeyError(f"no submodule matches {pat!r}")
        out.extend(h for h in hits if h not in out)
    return out


@torch.no_grad()
def init_foreign(module: nn.Module, scheme: str, *, q: Sequence[str] = (),
                 k: Sequence[str] = (), v: Sequence[str] = (), mlp_in: Sequence[str] = (),
                 mlp_out: Sequence[str] = (), o: Sequence[str] = (), beta: float | None = None,
                 seq_len: int | None = None, std: float = 0.02,
                 generator: torch.Generator | None = None, seed: int = 0,
                 spec: ArchSpec | None = None) -> dict[str, str]:
    """Apply an init scheme to named linear submodules of any model; returns ``{name: role}``.

    Names are exact ``named_modules()`` names or ``fnmatch`` patterns (e.g.
    ``"encoder.layer.*.attention.self.query"``); a pattern matching nothing raises ``KeyError``.
    Unlisted submodules are left as they are. Laws as in the module docstring, with:

    * ``rem``: Q/K std ``rem_qk_std(beta, seq_len, d)`` with ``d`` the Q layer's input width;
      the other listed layers ``N(0, std^2)`` (or the spec's variances when ``spec`` is given);
      biases 0 (or ``spec.sigma_b2``).
    * ``hf``: ``N(0, std^2)``, biases 0. ``xavier`` / ``xavier_uniform`` / ``he`` as usual.
    * ``spec``: needs ``spec``; every listed group gets the spec's law with the module's fans.

    Fused QKV projections (GPT-2's ``c_attn``) cannot be split by name; give them as ``v`` to
    get one law for the whole matrix. Draws come from ``generator`` (default: a new generator
    seeded with ``seed``), in the order q, k, v, o, mlp_in, mlp_out, each in name order.
    """
    _check_scheme(scheme)
    if scheme == "spec" and spec is None:
        raise ValueError("scheme 'spec' needs a spec")
    if scheme == "rem" and beta is None and spec is None:
        raise ValueError("scheme 'rem' needs beta (or a spec)")
    if scheme == "rem" and seq_len is None and spec is None:
        raise ValueError("scheme 'rem' needs seq_len (or a spec)")
    g = generator if generator is not None else torch.Generator().manual_seed(int(seed))
    mods = dict(module.named_modules())
    groups = {"q": q, "k": k, "v": v, "o": o, "mlp_in": mlp_in, "mlp_out": mlp_out}
    applied: dict[str, str] = {}
    d_model = None
    if q:
        d_model = _weight_fans(mods[_match(mods, [q[0]])[0]])[0]
    for role, patterns in groups.items():
        for name in _match(mods, patterns):
            m = mods[name]
            fan_in, fan_out = _weight_fans(m)
            lspec = spec if scheme in ("spec", "rem") else None
            s, uni = law(scheme, role, fan_in, fan_out, spec=lspec, beta=beta,
                         seq_len=seq_len, d_model=d_model, std=std)
            m.weight.copy_(_draw(m.weight.shape, s, uni, g))
            if getattr(m, "bias", None) is not None:
                sb, _ = law(scheme, "bias", fan_in, fan_out, spec=lspec, std=std)
                m.bias.copy_(_draw(m.bias.shape, sb, False, g))
            applied[name] = role
    return applied


@torch.no_grad()
def scale_linear_(module: nn.Module, factor: float, *, out_slice: tuple[int, int] | None = None,
                  out_axis: int = 0) -> nn.Module:
    """Multiply a linear layer's weight and bias by ``factor`` in place (the rescaling form
    of a scheme: a weight drawn N(0, s^2) becomes N(0, (factor s)^2)). ``out_slice = (start,
    stop)`` limits it to those output features, found along the weight's ``out_axis`` (0 for
    ``nn.Linear``'s (out, in), 1 for GPT-2's ``Conv1D`` (in, out)); e.g. the Q block of a fused
    QKV projection. Works for trained weights as well as at init."""
    if not math.isfinite(factor):
        raise ValueError(f"factor must be finite (got {factor})")
    w, b = module.weight, getattr(module, "bias", None)
    if out_slice is None:
        w.mul_(factor)
        if b is not None:
            b.mul_(factor)
        return module
    lo, hi = out_slice
    w.narrow(out_axis, lo, hi - lo).mul_(factor)
    if b is not None:
        b.narrow(0, lo, hi - lo).mul_(factor)
    return module
