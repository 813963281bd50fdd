"""Per block, the modules a method touches, found in any HF model the way ``diagnose`` finds
them (:func:`sigprop.models.names.qkv_names`, :mod:`sigprop.measurement.probe_sites`), and the
few weight operations the methods share: scaling a projection (or its slice of a fused QKV
layer), its spectral norm, and forward hooks for gates and q/k norms that
``save_pretrained`` does not keep (the record in config.json does, :mod:`.runtime`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...measurement.probe_sites import AttentionSite, find_attention
from ...spec import SpecError
from ..names import qkv_names

#: a projection's output rows: (module, (start, stop) or None, axis of the out features)
Target = tuple[nn.Module, tuple[int, int] | None, int]

_NORM_TYPES = ("LayerNorm", "RMSNorm", "T5LayerNorm")


@dataclass
class Part:
    """One block: its name, attention site, Q/K/V targets (slices of a fused layer), output
    projection ``o``, MLP layers, the modules whose outputs the branch gates multiply
    (``o`` / ``mlp_out``, or the norms on the branch outputs of Gemma 2 / OLMo 2 style
    blocks) and its norm modules as ``(parent, attribute)`` (T-Fixup removes them)."""

    name: str
    block: nn.Module
    site: AttentionSite | None
    q: list[Target] = field(default_factory=list)
    k: list[Target] = field(default_factory=list)
    v: list[Target] = field(default_factory=list)
    o: nn.Module | None = None
    mlp_in: list[nn.Module] = field(default_factory=list)
    mlp_out: nn.Module | None = None
    gate_attn_at: nn.Module | None = None
    gate_mlp_at: nn.Module | None = None
    norms: list[tuple[nn.Module, str]] = field(default_factory=list)

    @property
    def heads(self) -> int:
        return self.site.n_heads if self.site is not None else 1

    @property
    def head_dim(self) -> int:
        return self.site.head_dim if self.site is not None else 0


def is_norm(m: nn.Module) -> bool:
    n = type(m).__name__
    return isinstance(m, nn.LayerNorm) or n.endswith(_NORM_TYPES) or n.endswith("Norm")


def block_parts(model: nn.Module) -> list[Part]:
    """One :class:`Part` per transformer block of ``model`` (module order)."""
    mods = dict(model.named_modules())
    out = []
    for e in qkv_names(model):
        block = mods[e["block"]]
        site = find_attention(block)
        p = Part(e["block"], block, site)
        if e.get("qkv") is not None:
            fused = mods[e["qkv"]]
            if e.get("fused") != "concat":
                p.q = p.k = p.v = []  # interleaved heads: refused by the methods that need them
            else:
                ax = e["out_axis"]
                p.q = [(fused, e["qkv_slices"]["q"], ax)]
                p.k = [(fused, e["qkv_slices"]["k"], ax)]
                p.v = [(fused, e["qkv_slices"]["v"], ax)]
        else:
            for role in ("q", "k", "v"):
                if e.get(role) is not None:
                    setattr(p, role, [(mods[e[role]], None, 0)])
        p.o = mods[e["o"]] if e.get("o") else None
        p.mlp_in = [mods[n] for n in e.get("mlp_in", [])]
        p.mlp_out = mods[e["mlp_out"]] if e.get("mlp_out") else None
        kids = dict(block.named_children())
        if "post_feedforward_layernorm" in kids and "post_attention_layernorm" in kids:
            p.gate_attn_at = kids["post_attention_layernorm"]   # branch outputs normalised
            p.gate_mlp_at = kids["post_feedforward_layernorm"]
        else:
            p.gate_attn_at, p.gate_mlp_at = p.o, p.mlp_out
        for name, m in block.named_modules():
            if name and is_norm(m):
                parent_name, _, attr = name.rpartition(".")
                parent = block.get_submodule(parent_name) if parent_name else block
                if site is not None and m in (site.q_post, site.k_post):
                    continue  # a model's own QK-norm stays
                p.norms.append((parent, attr))
        out.append(p)
    return out


def need(part: Part, role: str, method: str) -> Any:
    """``part``'s ``role`` (q, k, v, o, mlp_out, gate_attn_at, ...) or a SpecError."""
    val = getattr(part, role)
    if val is None or val == []:
        raise SpecError(method, f"{part.name}: no {role.replace('_at', '')} module found "
                                "(the method needs it)")
    return val


def weight_of(t: Target) -> torch.Tensor:
    """The target's weight as (out, in) (a view for ``nn.Linear`` rows; GPT-2's ``Conv1D``
    stores (in, out): transposed)."""
    m, sl, ax = t
    w = m.weight
    if sl is not None:
        w = w.narrow(ax, sl[0], sl[1] - sl[0])
    return w.t() if ax == 1 or type(m).__name__ == "Conv1D" else w


@torch.no_grad()
def scale(t: Target | nn.Module, factor: float) -> None:
    """Multiply a projection's weight and bias (or its slice's) by ``factor``."""
    from ...nn.init import scale_linear_

    if isinstance(t, nn.Module):
        scale_linear_(t, float(factor))
        return
    m, sl, ax = t
    scale_linear_(m, float(factor), out_slice=sl, out_axis=ax)


def scale_value_and_mlp(parts: list[Part], factor: float, effect) -> None:
    """W_V, W_O and every MLP weight of every block times ``factor`` (weights and biases),
    recorded on ``effect`` (:class:`.base.Effect`) as the same factor on their stds."""
    for p in parts:
        for t in p.v:
            scale(t, factor)
        for m in [p.o, *p.mlp_in, p.mlp_out]:
            if m is not None:
                scale(m, factor)
    for name in ("v", "o", "mlp_in", "mlp_out"):
        effect.scale(name, factor)


@torch.no_grad()
def spectral_norm(w: torch.Tensor) -> float:
    """Largest singular value of a 2-D weight, in float64: Lanczos on the smaller Gram matrix
    (:func:`~sigprop.measurement.observables.top_eigenvalue`, converged to 1e-12 relative;
    ~30 ms at 768 x 768 on one thread, a quarter of ``svdvals``), the exact ``svdvals`` where
    it does not converge."""
    from ...measurement.observables import top_eigenvalue
    from ...measurement.threads import cpu_settings

    with cpu_settings(threads=1):  # small sequential work: a second thread only waits
        w = w.detach().to(torch.float64)
        g = w.t() @ w if w.shape[0] >= w.shape[1] else w @ w.t()
        top = float(top_eigenvalue(g, steps=min(160, g.shape[0])))
        if not math.isfinite(top):
            return float(torch.linalg.svdvals(w)[0])
    return math.sqrt(max(top, 0.0))


# --------------------------------------------------------------------------------------------
# hooks: gates on branch outputs, norms on q and k
# --------------------------------------------------------------------------------------------
GATE = "sigprop_gate"
HOOKS = "_sigprop_hooks"


def _gate_hook(module, _args, out):
    g = getattr(module, GATE)
    if isinstance(out, tuple):
        return (out[0] * g.to(out[0].dtype),) + out[1:]
    return out * g.to(out.dtype)


def hooked(module: nn.Module, key: str) -> bool:
    """Whether ``module`` already holds sigprop's hook ``key`` (a method applied twice, or
    restored on a model that has it, installs it once)."""
    return key in getattr(module, HOOKS, {})


def remember_hook(module: nn.Module, key: str, handle) -> None:
    """Keep the handle of sigprop's hook ``key`` on ``module`` (see :func:`hooked`)."""
    if not hasattr(module, HOOKS):
        object.__setattr__(module, HOOKS, {})
    getattr(module, HOOKS)[key] = handle


def install_gate(module: nn.Module, init: torch.Tensor, *, trainable: bool) -> None:
    """A multiplier ``g`` on ``module``'s output (a scalar or one per channel), stored on the
    module as ``sigprop_gate`` (a parameter when ``trainable``, else a buffer; either way in
    the state dict, so ``save_pretrained`` writes it). A second gate multiplies into the
    first."""
    dev = next(module.parameters(), torch.empty(0)).device
    init = torch.as_tensor(init, dtype=torch.float32, device=dev)
    if hooked(module, GATE):
        old = getattr(module, GATE)
        with torch.no_grad():
            new = old.detach() * init
        delattr(module, GATE)
        trainable = trainable or isinstance(old, nn.Parameter)
        init = new
    else:
        remember_hook(module, GATE, module.register_forward_hook(_gate_hook))
    if trainable:
        module.register_parameter(GATE, nn.Parameter(init.clone()))
    else:
        module.register_buffer(GATE, init.clone())


def _qk_hook(module, _args, out):
    spec = module._sigprop_qk
    y = out
    for lo, hi, width, kind, gain in spec:
        part = y[..., lo:hi]
        shp = part.shape
        z = part.reshape(*shp[:-1], -1, width).float()
        if kind == "layernorm":
            z = z - z.mean(-1, keepdim=True)
        z = z * torch.rsqrt(z.square().mean(-1, keepdim=True) + 1e-6)
        g = getattr(module, gain)
        z = (z.reshape(shp) * g.to(z.dtype).repeat(shp[-1] // g.numel())).to(part.dtype)
        y = torch.cat([y[..., :lo], z, y[..., hi:]], dim=-1) if (lo, hi) != (0, y.shape[-1]) \
            else z
    return y


def install_qk_norm(t: Target, role: str, width: int, kind: str, gain_size: int) -> None:
    """Normalise each ``width``-sized group of a projection's output features (a head, or the
    whole projection) to unit RMS (``kind`` ``rms``; ``layernorm`` subtracts the mean first)
    times a trainable gain of ``gain_size`` entries (``sigprop_<role>_norm``, ones at init)."""
    m, sl, _ax = t
    out_features = getattr(m, "out_features", None) or m.nf
    lo, hi = sl if sl is not None else (0, out_features)
    gain = f"sigprop_{role}_norm"
    dev = m.weight.device
    m.register_parameter(gain, nn.Parameter(torch.ones(gain_size, device=dev)))
    spec = list(getattr(m, "_sigprop_qk", []))
    spec.append((lo, hi, width, kind, gain))
    object.__setattr__(m, "_sigprop_qk", spec)
    if not hooked(m, "qk"):
        remember_hook(m, "qk", m.register_forward_hook(_qk_hook))
