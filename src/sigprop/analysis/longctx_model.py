"""Long context for a real model: every attention layer with its own weights, norm and rotary
embedding, streamed at context lengths far beyond what the model can run (docs/theory.md §3.3).

Pipeline (:func:`sweep_model`):

1. **Reference pass.** One forward pass at the reference length (``seq_len``, default
   ``min(512, max positions)``) over built-in text records, for every attention layer, what
   the attention computes with: its queries, keys and values as the module forms them (after
   the projections and any query/key norm, *before* RoPE), the (cos, sin) it receives, and
   the token cosine of its input. Big models are stored in bfloat16 and run block by block in
   float32 (the note says so).
2. **Input geometry at long T.** Per layer, keys and values at every position are drawn from
   a Gaussian with the mean and covariance measured in the reference pass (keys and values
   independently), queries of the sampled rows likewise: the layer sees tokens with its own
   norm, mean direction and covariance, hence its own cosine structure, at any length. What
   this leaves out: the dependence of hidden states on position (e.g. the first token's
   special state) and on the context length itself (checked against real forward passes in the
   tests: ``tests/measurement/test_longctx_model.py``).
3. **Streaming.** :func:`sigprop.measurement.stream_model.stream_layer` over the longest
   length, with the model's rotary module evaluated at the true positions (its own
   ``rope_scaling``: llama3, yarn, linear, ...; length-dependent kinds such as ``dynamic`` get
   one pass per length), rows of every length in the same pass (a length-T context is the
   first T positions of the longest one), every scaling on the same scores.
4. **Theory** per layer from the same moments (:func:`layer_theory`): per head the REM
   energy variance over keys ``v_h = scale^2 E_a[q_a^T C_k q_a]`` plus, with RoPE, the variance
   of the rotating mean-key term over the row's window; finite-T tables of docs/theory.md §2.3
   and the T -> infinity limit; the output cosine from the value moments through W_O.
5. **Recommendation** (:func:`recommend`): the smallest change of the logits (length scaling and
   parameter, or a constant Q/K rescale) whose predicted entropy stays within ``band`` of the
   training-length entropy in every layer up to the longest length; streamed in the same pass
   so the JSON carries its re-measured effect.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..measurement import stream_model as sm
from ..spec import SpecError, score_multiplier
from .result import Result

#: the scalings a run can stream or predict (docs/theory.md §3.2)
KINDS = ("none", "sqrt-log-n", "log-n", "qwen", "sqrt-qwen", "ssmax", "yarn", "tau")
#: ``--compare`` without a list: every kind at its default parameter
COMPARE_ALL = ("none", "sqrt-log-n", "log-n", "qwen", "sqrt-qwen")
#: float32 bytes above which the blocks are stored in bfloat16 during the reference pass
BF16_ABOVE = 1.5 * 2**30
DEFAULT_BAND = 0.05
#: a layer whose measured ipr leaves the theory by more than this gets a note saying why
GAP_NOTE = 0.03
MAX_QUERIES = 4096


def default_lengths() -> list[int]:
    """2^12, 2^14, 2^16, 2^18, 2^20."""
    return [2**k for k in range(12, 21, 2)]


# ------------------------------------------------------------------------------------ scalings
@dataclass(frozen=True)
class Scaling:
    """A logit multiplier ``m(n)`` of the number ``n`` of visible keys
    (:func:`sigprop.spec.score_multiplier`), ``label`` as it appears in the ``scaling`` column."""

    kind: str
    param: float | None = None
    label: str = ""

    def mult(self, n) -> np.ndarray:
        return score_multiplier(self.kind, np.asarray(n, dtype=np.float64), self.param)


def _label(kind: str, param: float | None, train_len: int) -> str:
    if kind == "none" or (kind in ("log-n", "sqrt-log-n", "qwen", "sqrt-qwen") and
                          (param is None or param == train_len)):
        return kind
    return f"{kind}({param:.4g})"


def parse_scaling(text: str, train_len: int) -> Scaling:
    """``kind`` or ``kind:param`` (``log-n``, ``sqrt-log-n``, ``qwen``, ``sqrt-qwen``: param is the
    reference
    length, default the training length; ``ssmax``: s, default ``1 / log(train_len)``;
    ``yarn``: extension factor s >= 1; ``tau``: temperature)."""
    kind, _, raw = text.strip().partition(":")
    if kind not in KINDS:
        raise SpecError("scalings", f"each must be one of {', '.join(KINDS)}, optionally "
                                    f"kind:param (got {text!r})")
    param: float | None = None
    if raw:
        try:
            param = float(raw)
        except ValueError:
            raise SpecError("scalings", f"{text!r}: the parameter must be a number") from None
        if not math.isfinite(param) or param <= 0:
            raise SpecError("scalings", f"{text!r}: the parameter must be a positive number")
        if kind in ("log-n", "sqrt-log-n", "qwen", "sqrt-qwen") and param <= 1:
            raise SpecError("scalings", f"{text!r}: the reference length must be > 1")
        if kind == "yarn" and param < 1:
            raise SpecError("scalings", f"{text!r}: the yarn factor must be >= 1")
    if param is None:
        param = {"log-n": train_len, "sqrt-log-n": train_len, "qwen": train_len,
                 "sqrt-qwen": train_len,
                 "ssmax": 1.0 / math.log(train_len), "yarn": 1.0, "tau": 1.0,
                 "none": None}[kind]
    param = None if param is None else float(param)
    return Scaling(kind, param, _label(kind, param, train_len))


# ------------------------------------------------------------------------------------ capture
@dataclass
class LayerFit:
    """One attention layer as the long-context sweep uses it (all moments float64)."""

    index: int
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    causal: bool
    window: int | None
    q: sm.GaussianFit
    k: sm.GaussianFit
    v: sm.GaussianFit
    w_o: torch.Tensor | None
    b_o: torch.Tensor | None
    rho: float
    rope: Callable | None = None
    rope_gain: float = 1.0
    inv_freq: np.ndarray | None = None
    rope_dims: int = 0
    length_dependent_rope: bool = False
    notes: list[str] = field(default_factory=list)
    #: largest difference between the module's probabilities and the stream's model of them
    check: float | None = None
    #: layers with query/key norms: Gaussian fits of the projections before the norms, and the
    #: norms themselves (``(n, heads, d_H) -> (n, heads, d_H)``); draws are normed as in the model
    q_gen: sm.GaussianFit | None = None
    k_gen: sm.GaussianFit | None = None
    q_norm: Callable | None = None
    k_norm: Callable | None = None

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def _bound(module, args, kwargs) -> dict:
    import inspect

    try:
        return dict(inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


def module_window(mod) -> int | None:
    """A sliding window of an attention module: its ``sliding_window`` attribute, else its
    config's (Mistral-style modules read it at call time) unless the config turns windows off
    (``use_sliding_window = False``) or lists this layer as full attention."""
    if hasattr(mod, "sliding_window"):
        w = mod.sliding_window
    else:
        cfg = getattr(mod, "config", None)
        w = getattr(cfg, "sliding_window", None)
        lt, idx = getattr(cfg, "layer_types", None), getattr(mod, "layer_idx", None)
        if getattr(cfg, "use_sliding_window", True) is False or (
                isinstance(lt, list | tuple) and isinstance(idx, int) and idx < len(lt)
                and lt[idx] != "sliding_attention"):
            w = None
    return int(w) if isinstance(w, int) and not isinstance(w, bool) and w > 0 else None


#: largest relative difference between the module's own logits and the stream's model of
#: them (q.k x scale, the (cos, sin) received, the mask; :func:`_mismatch`) that a layer may
#: show in the reference pass
MODEL_TOL = 1e-2


def _mismatch(P: torch.Tensor, A: torch.Tensor) -> float:
    """How far the module's probabilities ``A`` are from the modelled ``P`` (both ``(H, T,
    T)``): infinite if they mask different keys, else per head the norm of the difference of
    the row-centred log-probabilities (the logits up to a row constant) over the norm of the
    modelled ones; the largest over heads. Relative, so a wrong scale or rotation shows even
    when attention is nearly uniform at init."""
    vis = P > 0
    if not torch.equal(vis, A > 0):
        return math.inf
    n = vis.sum(-1, keepdim=True).clamp_min(1)

    def centred(x):
        lx = torch.where(vis, torch.log(torch.where(vis, x, torch.ones_like(x))),
                         torch.zeros_like(x))
        return torch.where(vis, lx - lx.sum(-1, keepdim=True) / n, torch.zeros_like(lx))

    lp, la = centred(P), centred(A)
    num = (la - lp).pow(2).sum((-1, -2)).sqrt()
    den = lp.pow(2).sum((-1, -2)).sqrt().clamp_min(1e-300)
    return float((num / den).max())


def _stream_view(q, k, pos, s, causal: bool, window: int | None,
                 mult: Callable | None = None) -> torch.Tensor:
    """The probabilities the stream's model of a layer gives on one captured sequence:
    ``(H, T, T)`` float64 (the check of :class:`_Capture`)."""
    H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim
    T = q.shape[-2] if q.dim() >= 3 and q.shape[-1] == H * dh else q.shape[-3]
    q = q.reshape(-1, T, H, dh)[0]
    k = k.reshape(-1, T, Hkv, dh)[0]
    if pos is not None:
        q, k = sm.apply_rope(q, *pos), sm.apply_rope(k, *pos)
    k = k[:, torch.arange(H) // (H // Hkv)]
    sc = torch.einsum("ahd,bhd->hab", q, k) * s.scale
    a, b = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hide = torch.zeros(T, T, dtype=torch.bool)
    if causal:
        hide |= b > a
        if window:
            hide |= b <= a - window
    elif window:
        hide |= (a - b).abs() >= window
    if mult is not None:  # the model's own length scaling (a `sigprop fix`), per row's keys
        n = (~hide).sum(-1).double().numpy()
        sc = sc * torch.as_tensor(mult(n), dtype=sc.dtype)[None, :, None]
    return torch.softmax(sc.masked_fill(hide, float("-inf")), dim=-1)


class _Capture:
    """Hooks on every attention site: q/k/v outputs (pre-RoPE; the first output of each
    projection per call of the module: DeBERTa runs them again on relative embeddings), the
    input's token cosine, the (cos, sin) the module receives, causality and the check that the
    stream's model of the layer reproduces the module's own probabilities (eager attention
    returns them): ``check`` is the largest difference seen."""

    def __init__(self, sites, check: bool = True, mult: Callable | None = None):
        self.sites, self.check, self.mult = sites, check, mult
        self.handles: list = []
        self.data = [{"q": [], "k": [], "v": [], "q_pre": [], "k_pre": [], "cos": [],
                      "pos": None, "causal": None,
                      "bias": False, "check": None, "got": None, "call_pos": None}
                     for _ in sites]

    def __enter__(self):
        from ..measurement import observables as obs

        bias_args = ("alibi", "position_bias", "relative_pos", "rel_embeddings")
        for i, s in enumerate(self.sites):
            d = self.data[i]

            def pre(m, args, kwargs, d=d):
                b = _bound(m, args, kwargs)
                pe = b.get("position_embeddings")
                d["got"], d["call_pos"] = set(), None
                if isinstance(pe, tuple | list) and len(pe) == 2:
                    d["call_pos"] = tuple(t.detach()[0].double().cpu() for t in pe)
                    if d["pos"] is None:
                        d["pos"] = d["call_pos"]
                d["bias"] = d["bias"] or any(torch.is_tensor(b.get(n)) for n in bias_args) \
                    or bool(getattr(m, "has_relative_attention_bias", False)) \
                    or bool(getattr(m, "relative_attention", False))

            def post(m, args, out, d=d, s=s):
                got, d["got"] = d["got"], None
                # eager attention returns its probabilities: a causal mask shows as zeros
                # above the diagonal (the module may not say, e.g. BLOOM)
                A = out[1] if isinstance(out, tuple) and len(out) > 1 else None
                if not (torch.is_tensor(A) and A.dim() == 4 and A.shape[-1] == A.shape[-2] > 1):
                    return
                A = A.detach()
                T = A.shape[-1]
                up = torch.ones(T, T, dtype=torch.bool, device=A.device).triu(1)
                seen = bool(A[..., up].abs().max() == 0)
                d["causal"] = seen if d["causal"] is None else d["causal"] and seen
                if self.check and got and {"q", "k"} <= got:
                    try:
                        P = _stream_view(d["q"][-1], d["k"][-1], d["call_pos"], s, seen,
                                         module_window(s.module), self.mult)
                        diff = _mismatch(P, A[0].double().cpu())
                    except (RuntimeError, ValueError):  # a layout the model cannot split
                        diff = math.inf
                    d["check"] = diff if d["check"] is None else max(d["check"], diff)

            def x_in(m, args, d=d):
                x = args[0] if args else None
                if torch.is_tensor(x) and x.dim() >= 2 and x.shape[-2] > 1 and \
                        (d["got"] is None or "x" not in d["got"]):
                    d["cos"].append(obs.mean_cos(x.detach().double()).reshape(-1).cpu())
                    if d["got"] is not None:
                        d["got"].add("x")

            def keep(key, out, d=d):
                if d["got"] is not None:  # inside a call of the module: its first output only
                    if key in d["got"]:
                        return
                    d["got"].add(key)
                d[key].append(out)

            def grab(key, keep=keep):
                return lambda m, a, out: keep(key, out.detach().double().cpu())

            H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim

            def fused(m, a, out, s=s, H=H, Hkv=Hkv, dh=dh, keep=keep):
                out = out.detach().double().cpu()
                if s.fused == "per_head":
                    o = out.unflatten(-1, (H, 3 * dh))
                    parts = (o[..., :dh].flatten(-2), o[..., dh:2 * dh].flatten(-2),
                             o[..., 2 * dh:].flatten(-2))
                else:
                    parts = (out[..., :H * dh], out[..., H * dh:(H + Hkv) * dh],
                             out[..., (H + Hkv) * dh:])
                for key, part in zip("qkv", parts, strict=True):
                    keep(key, part)

            reg = self.handles.append
            reg(s.module.register_forward_pre_hook(pre, with_kwargs=True))
            reg(s.module.register_forward_hook(post))
            reg(s.q.register_forward_pre_hook(x_in))
            if s.fused:
                reg(s.q.register_forward_hook(fused))
            else:
                reg((s.q_post or s.q).register_forward_hook(grab("q")))
                reg((s.k_post or s.k).register_forward_hook(grab("k")))
                if s.q_post is not None and s.k_post is not None:  # before the q/k norms
                    reg(s.q.register_forward_hook(grab("q_pre")))
                    reg(s.k.register_forward_hook(grab("k_pre")))
                if s.v is not None:
                    reg(s.v.register_forward_hook(grab("v")))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        return False


def _norm_fn(module, heads: int, dh: int) -> Callable:
    """A query/key norm as a function of ``(n, heads, d_H)``: a float32 copy of the module,
    applied per head (weight of ``d_H``, Qwen3) or over the whole projection (OLMo 2)."""
    import copy

    mod = copy.deepcopy(module).float().cpu().eval()
    w = getattr(mod, "weight", None)
    per_head = not (torch.is_tensor(w) and w.numel() == heads * dh)

    def fn(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        with torch.no_grad():
            y = mod(x.float().reshape(1, n, heads, dh) if per_head
                    else x.float().reshape(1, n, heads * dh))
        return y.reshape(n, heads, dh).to(device=x.device, dtype=x.dtype)

    return fn


def _flat(chunks: list[torch.Tensor], width: int) -> torch.Tensor:
    """(N, width) samples from hook outputs (..., T, width) or (..., T, heads, d)."""
    return torch.cat([c.reshape(-1, width) for c in chunks])


def _o_proj(site, width: int):
    """The output projection of an attention module: its linear child (not Q/K/V) reading
    the ``width = H * d_V`` concatenated heads; ``(W (in, out), bias)`` or None."""
    from ..measurement.weights import matrix

    skip = {id(site.q), id(site.k), id(site.v)}
    for _, m in site.module.named_children():
        if id(m) in skip:
            continue
        wb = matrix(m)
        if wb is not None and wb[0].shape[1] == width:
            w, b = wb  # float32 storage: 16 layers of 2048^2 are 256 MB
            return w.float().T.contiguous().cpu(), None if b is None else b.float().cpu()
    return None


def rotary_modules(model) -> list:
    """Modules of ``model`` carrying RoPE frequencies (an ``inv_freq`` tensor)."""
    return [m for m in model.modules()
            if torch.is_tensor(getattr(m, "inv_freq", None)) and m.inv_freq.ndim == 1]


def rope_table(rot, n_max: int | None = None, layer_type: str | None = None):
    """``positions -> (cos, sin)`` float64 from the model's rotary module ``rot`` (its own
    forward, so its ``rope_scaling`` kind applies; float32 angles as in the model). Modules
    whose frequencies depend on the context length (dynamic NTK, longrope) see the position
    ``n_max - 1`` in every call, as in a forward pass over ``n_max`` tokens."""

    def fn(pos: torch.Tensor):
        p = torch.as_tensor(pos, dtype=torch.long).reshape(-1)
        extra = n_max is not None
        if extra:
            p = torch.cat([p, torch.tensor([n_max - 1])])
        dev = rot.inv_freq.device
        x = torch.zeros(1, dtype=torch.float32, device=dev)
        kw = {"layer_type": layer_type} if layer_type is not None else {}
        cos, sin = rot(x, p[None].to(dev), **kw)
        cos, sin = cos[0].double().cpu(), sin[0].double().cpu()
        return (cos[:-1], sin[:-1]) if extra else (cos, sin)

    return fn


def _match_rope(fit_pos, rotaries, T: int, long_T: int):
    """The rotary module (and layer type) whose output at positions 0..T-1 equals the
    (cos, sin) a layer received; ``(fn_for_length, inv_freq, dims, gain, length_dependent)``
    or None."""
    cos0, sin0 = fit_pos
    pos = torch.arange(T)
    for rot in rotaries:
        types = [None]
        cfg = getattr(rot, "config", None)
        lt = getattr(cfg, "layer_types", None)
        if isinstance(lt, list | tuple) and isinstance(rot.inv_freq, torch.Tensor):
            import inspect

            if "layer_type" in inspect.signature(rot.forward).parameters:
                types += sorted({t for t in lt if isinstance(t, str)})
        for t in types:
            try:
                c, s = rope_table(rot, layer_type=t)(pos)
            except Exception:  # noqa: BLE001 - a module that does not take this call
                continue
            if c.shape != cos0.shape:
                continue
            tol = 1e-4 * max(1.0, float(cos0.abs().max()))
            if float((c - cos0).abs().max()) > tol or float((s - sin0).abs().max()) > tol:
                continue
            # frequencies that change with the context length (dynamic, longrope)
            c1, _ = rope_table(rot, n_max=long_T, layer_type=t)(torch.tensor([1, T - 1]))
            c0, _ = rope_table(rot, n_max=T, layer_type=t)(torch.tensor([1, T - 1]))
            dep = float((c1 - c0).abs().max()) > 1e-7
            gain = float(torch.sqrt(c[0, 0] ** 2 + s[0, 0] ** 2))
            inv = rot.inv_freq.detach().double().cpu().numpy().copy()
            return (lambda n, rot=rot, t=t: rope_table(rot, n_max=n, layer_type=t)), inv, \
                int(c.shape[-1]), gain, dep
    return None


def fit_layers(model, sites, inputs: dict, forward: Callable, *, long_T: int,
               mult: Callable | None = None) -> list[LayerFit]:
    """Run the reference pass (``forward(model, inputs)``) with capture hooks and fit every
    site's moments (:class:`LayerFit`); ``mult(n)``: the logit multiplier the model applies
    itself (a recorded ``sigprop fix`` scaling), for the model check."""
    cap = _Capture(sites, mult=mult)
    with cap, torch.no_grad():
        forward(model, inputs)
    rotaries = rotary_modules(model)
    fits = []
    for i, (s, d) in enumerate(zip(sites, cap.data, strict=True)):
        H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim
        if not d["q"] or not d["k"] or not d["v"]:
            raise SpecError("model", f"attention layer {i} ({s.name}): its Q/K/V projections "
                                     "were not called inside the module")
        q, k = _flat(d["q"], H * dh), _flat(d["k"], Hkv * dh)
        n_v = sum(c.numel() for c in d["v"])
        if k.shape[0] != q.shape[0] or n_v % max(q.shape[0], 1):
            raise SpecError("model", f"attention layer {i} ({s.name}): its Q/K/V projections "
                                     "run on other inputs too (relative embeddings?): not a "
                                     "layout the long-context stream models")
        v = torch.cat([c.reshape(-1, n_v // q.shape[0]) for c in d["v"]])
        dv = v.shape[1] // Hkv
        wo = _o_proj(s, H * dv)
        window = module_window(s.module)
        if d["check"] is None and i == 0:
            notes_check = ("the module returns no probabilities (not eager attention): the "
                           "stream's model of each layer was not checked against it")
        else:
            notes_check = None
        if d["bias"]:
            raise SpecError("model", f"attention layer {i} ({s.name}) adds a position bias "
                                     "(ALiBi or relative buckets) that the long-context stream "
                                     "does not model")
        if d["check"] is not None and not d["check"] <= MODEL_TOL:
            raise SpecError("model", f"attention layer {i} ({s.name}): its own probabilities "
                                     f"differ from the stream's model of it (q.k x scale "
                                     f"{s.scale:.4g}, the (cos, sin) it receives, its mask) by "
                                     f"{d['check']:.2g} in the reference pass: something the "
                                     "stream does not model (soft-capping, attention sinks, "
                                     "interleaved or in-module RoPE, an unexposed scale)")
        rho = float(torch.cat(d["cos"]).mean()) if d["cos"] else float("nan")
        causal = bool(s.causal) if d["causal"] is None else d["causal"]
        f = LayerFit(i, s.name, H, Hkv, dh, float(s.scale), causal, window,
                     sm.GaussianFit.from_samples(q), sm.GaussianFit.from_samples(k),
                     sm.GaussianFit.from_samples(v), None if wo is None else wo[0],
                     None if wo is None else wo[1], rho)
        if wo is None:
            f.notes.append(f"layer {i}: no output projection recognised: the output cosine "
                           "is that of the concatenated heads")
        if notes_check:
            f.notes.append(notes_check)
        f.check = d["check"]
        if d["q_pre"] and d["k_pre"] and len(d["q_pre"]) == len(d["q"]):
            f.q_gen = sm.GaussianFit.from_samples(_flat(d["q_pre"], H * dh))
            f.k_gen = sm.GaussianFit.from_samples(_flat(d["k_pre"], Hkv * dh))
            f.q_norm, f.k_norm = _norm_fn(s.q_post, H, dh), _norm_fn(s.k_post, Hkv, dh)
        if d["pos"] is not None:
            T = d["pos"][0].shape[0]
            m = _match_rope(d["pos"], rotaries, T, long_T)
            if m is None:
                raise SpecError("model", f"attention layer {i} ({s.name}) receives a rotary "
                                         "(cos, sin) that no rotary module of the model "
                                         "reproduces: long-context positions unknown")
            f.rope, f.inv_freq, f.rope_dims, f.rope_gain, f.length_dependent_rope = m
        elif rotaries:
            f.notes.append(f"layer {i}: the model has a rotary module but this layer gets no "
                           "(cos, sin): streamed without RoPE")
        fits.append(f)
    return fits


# ------------------------------------------------------------------------------------ theory
def _blocks(mat: torch.Tensor, n: int, w: int) -> torch.Tensor:
    """Diagonal blocks ``(n, w, w)`` of an ``(n w, n w)`` matrix."""
    idx = torch.arange(n)
    return mat.view(n, w, n, w)[idx, :, idx, :]


#: query draws over which the theory averages (quantiles of a head's score variance matter)
THEORY_QUERIES = 128


@dataclass
class LayerMoments:
    """The theory's view of one layer (float64 NumPy). Per drawn query ``a`` and head ``h``:
    ``v_fluct (Q, H)`` the variance over keys of its scores from the keys' covariance, ``amp
    (Q, H, P)`` the squared amplitude per RoPE plane of its score against the mean key (a term
    that rotates with the distance, so it adds variance over a window of keys), ``theta (P,)``
    the plane frequencies; ``rho (H,)`` the fraction of the score variance two rows share (their
    queries' common mean); the output-cosine terms ``m2 = |E out|^2`` and ``V (H, H)`` (value
    fluctuations through W_O)."""

    v_fluct: np.ndarray
    rho: np.ndarray
    amp: np.ndarray
    theta: np.ndarray
    m2: float
    V: np.ndarray

    def variance(self, n) -> np.ndarray:
        """``(Q, H)``: each query's score variance over a window of ``n`` keys."""
        if self.theta.size == 0:
            return self.v_fluct
        half = 0.5 * self.theta
        with np.errstate(invalid="ignore", divide="ignore"):
            dk = np.where(np.abs(np.sin(half)) < 1e-300, 1.0,
                          np.sin(n * half) / (n * np.sin(half)))
        return self.v_fluct + np.sum(self.amp * 0.5 * (1.0 - dk**2), axis=-1)


def moments(f: LayerFit, n_queries: int = THEORY_QUERIES, seed: int = 0) -> LayerMoments:
    """The theory's inputs from a layer's fits (module docstring, step 4). The queries are
    drawn from the query fit, so the REM tables are averaged over the real spread of query
    norms and directions (instead of docs/theory.md §2.3's chi2(d_H) model of it)."""
    H, Hkv, dh, g = f.heads, f.kv_heads, f.head_dim, f.group
    c2 = f.scale ** 2 * (f.rope_gain ** 4 if f.rope is not None else 1.0)
    kv_of = torch.arange(H) // g
    Ck = _blocks(f.k.cov, Hkv, dh)[kv_of]  # (H, dh, dh)
    mq = f.q.mu.view(H, dh)
    mk = f.k.mu.view(Hkv, dh)[kv_of]
    g = f.q_gen or f.q
    z = sm.random_normal(seed, 51, f.index, n_queries, g.rank, torch.float64)
    qs = (g.mu + z @ g.F).view(n_queries, H, dh)
    if f.q_norm is not None and f.q_gen is not None:
        qs = f.q_norm(qs)
    vfl = c2 * torch.einsum("ahi,hij,ahj->ah", qs, Ck, qs)
    shared = c2 * torch.einsum("hi,hij,hj->h", mq, Ck, mq)
    mean_v = vfl.mean(0)
    rho = torch.where(mean_v > 0, shared / mean_v.clamp_min(1e-300),
                      torch.zeros_like(mean_v)).clamp(0.0, 1.0)
    if f.rope is not None and f.inv_freq is not None and f.rope_dims:
        r = f.rope_dims
        P = r // 2
        eq = qs[..., :P] ** 2 + qs[..., P:r] ** 2  # (Q, H, P)
        ek = mk[:, :P] ** 2 + mk[:, P:r] ** 2  # (H, P)
        amp = (c2 * eq * ek).numpy()
        theta = np.asarray(f.inv_freq[:P], dtype=np.float64)
    else:
        amp, theta = np.zeros((n_queries, H, 0)), np.zeros(0)
    # output: E out = mu_v (per query head) @ W_O + b_O; fluctuations per pair of heads
    dv = f.v.mu.numel() // Hkv
    mv = f.v.mu.view(Hkv, dv)[kv_of].reshape(-1)
    Cv = f.v.cov.view(Hkv, dv, Hkv, dv)[kv_of][:, :, kv_of].reshape(H * dv, H * dv)
    if f.w_o is not None:
        wo = f.w_o.double()
        mean = mv @ wo + (f.b_o.double() if f.b_o is not None else 0.0)
        G = wo @ wo.T
    else:
        mean, G = mv, torch.eye(H * dv, dtype=torch.float64)
    V = (Cv * G).view(H, dv, H, dv).sum((1, 3))
    return LayerMoments(vfl.numpy(), rho.numpy(), amp, theta, float(mean @ mean), V.numpy())


def _nodes(T: int, causal: bool):
    from ..theory import blocks

    if not causal:
        return np.array([float(T)]), np.array([1.0]), np.array([1.0]), 1.0 / T, 1.0 / T
    nodes, w = blocks.causal_position_nodes(T)
    pair, inv_cross = blocks.causal_pair_weights(T, nodes)
    return nodes, w, pair, float(np.sum(w / nodes)), float(inv_cross)


def _out_cos_theory(mom: LayerMoments, nodes, w, y2, yx, window: int | None) -> np.ndarray:
    """Mean pairwise cosine of the layer outputs (as measured: a mean of cosines, not a ratio
    of means). Row at node a: ``|out|^2 = m2 + sum_h V_hh Y2_h(a) + off / n_a`` (``off``: the
    cross-head value terms at the uniform level); a pair of rows (a <= b) shares ``ov`` keys
    and ``<out_a, out_b> = m2 + (ov / n_b) sum_h V_hh Yx_h(a) + off ov / (n_a n_b)``
    (docs/theory.md §2.4's causal pair rule, with a window's overlap)."""
    off = mom.V.sum() - np.trace(mom.V)
    diag = np.diag(mom.V)
    nodes = np.asarray(nodes, dtype=np.float64)
    n = np.minimum(nodes, window) if window else nodes
    lo = nodes - n
    q = mom.m2 + y2 @ diag + off / n[:, None]  # (nodes, C)
    a = np.minimum.outer(np.arange(len(nodes)), np.arange(len(nodes)))
    bi = np.maximum.outer(np.arange(len(nodes)), np.arange(len(nodes)))
    ov = np.maximum(0.0, nodes[a] - lo[bi])
    share = ov / n[bi]
    pa = (yx @ diag)[a]  # (nodes, nodes, C)
    p = mom.m2 + share[..., None] * pa + (off * ov / (n[a] * n[bi]))[..., None]
    cos = p / np.sqrt(q[:, None, :] * q[None, :, :])
    return np.einsum("i,j,ijc->c", w, w, cos)


def layer_theory(mom: LayerMoments, T: int, mult: Callable[[np.ndarray], np.ndarray], *,
                 causal: bool, window: int | None, d_head: int,
                 extra: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Head-mean ipr, entropy, wmax and the output cosine of a layer at length ``T`` with the
    logit multiplier ``mult(n)`` (finite-T REM tables, docs/theory.md §2.3; causal rows averaged
    over log-spaced positions, §2.4; a sliding window caps a row's keys). ``extra``: an array
    of constant multipliers broadcast in front (the recommendation search): every output then
    has that leading shape. Also ``asym_*``: the T -> infinity limit (beta = sigma/sqrt(log n))."""
    from ..theory import blocks, rem

    nodes, w, pair, inv_t, inv_cross = _nodes(T, causal)
    c = np.ones(1) if extra is None else np.asarray(extra, dtype=np.float64)
    per = {k: [] for k in ("ipr", "yx", "entropy", "wmax")}
    for t in nodes:
        n = min(t, window) if window else t
        if n <= 1:
            vals = {k: np.ones(c.shape + mom.rho.shape) for k in per}
        else:
            var = mom.variance(n) * (float(mult(np.array(n))) * c[:, None, None]) ** 2
            rho = np.broadcast_to(mom.rho, var.shape)
            stats = blocks.finite_stats(var, rho, int(n), None, True)
            vals = dict(zip(("ipr", "yx", "entropy", "wmax"),
                            (np.mean(x, axis=-2) for x in stats), strict=True))
        for k in per:
            per[k].append(vals[k])
    per = {k: np.stack(v) for k, v in per.items()}  # (nodes, C, H)
    out = {k: np.mean(np.tensordot(w, per[k], axes=(0, 0)), axis=-1)
           for k in ("ipr", "entropy", "wmax")}
    out["cos"] = _out_cos_theory(mom, nodes, w, per["ipr"], per["yx"], window)
    # T -> infinity: beta = sigma / sqrt(log T) at the longest row
    nT = min(T, window) if window else T
    var = mom.variance(nT) * (float(mult(np.array(nT))) * c[:, None, None]) ** 2
    rho = np.broadcast_to(mom.rho, var.shape)
    sig = np.sqrt(var / np.maximum(1.0 - rho, 1e-12))
    beta = sig / math.sqrt(math.log(max(nT, 2)))
    out["asym_ipr"] = np.mean(rem.y2_asymptotic(beta, rho), axis=(-2, -1))
    out["asym_entropy"] = np.mean(rem.entropy_asymptotic(beta, rho), axis=(-2, -1))
    out["asym_wmax"] = np.mean(rem.wmax_asymptotic(beta, rho), axis=(-2, -1))
    out["sigma_s"] = np.sqrt(np.mean(sig**2, axis=(-2, -1)))
    out["beta"] = out["sigma_s"] / math.sqrt(math.log(max(nT, 2)))
    if extra is None:
        out = {k: np.asarray(v).reshape(()) if np.size(v) == 1 else v for k, v in out.items()}
    return out


# ------------------------------------------------------------------------------------ model
def train_length(config) -> int:
    """The length a model was built for: RoPE's ``original_max_position_embeddings`` where
    a ``rope_scaling`` records one, else the maximum positions, else 512."""
    for key in ("rope_scaling", "rope_parameters"):
        rs = getattr(config, key, None)
        if isinstance(rs, dict):
            v = rs.get("original_max_position_embeddings")
            if isinstance(v, int) and v > 1:
                return v
    for key in ("max_position_embeddings", "n_positions", "max_source_positions", "n_ctx"):
        v = getattr(config, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return v
    return 512


def _param_bytes(config, vocab: int) -> float:
    """float32 bytes of the base model built from ``config`` (counted on the meta device)."""
    import copy

    from transformers import AutoModel

    cfg = copy.deepcopy(config)
    cfg.vocab_size = vocab
    try:
        with torch.device("meta"):
            m = AutoModel.from_config(cfg, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - counted again when the real build fails
        return 0.0
    return 4.0 * sum(p.numel() for p in m.parameters())


class _Float32Blocks:
    """Blocks stored in bfloat16 run in float32: each block's parameters are upcast before its
    forward and the bfloat16 copies put back after it; floating inputs are cast to float32."""

    def __init__(self, blocks):
        self.blocks, self.handles, self.saved = blocks, [], {}

    def __enter__(self):
        def cast(x):
            return x.float() if torch.is_tensor(x) and x.is_floating_point() else (
                tuple(cast(t) for t in x) if isinstance(x, tuple) else x)

        for _, b in self.blocks:
            def pre(m, args, kwargs):
                self.saved[id(m)] = [(p, p.data) for p in m.parameters()]
                for p, _ in self.saved[id(m)]:
                    p.data = p.data.float()
                return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

            def post(m, args, out):
                for p, data in self.saved.pop(id(m), []):
                    p.data = data

            self.handles.append(b.register_forward_pre_hook(pre, with_kwargs=True))
            self.handles.append(b.register_forward_hook(post))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False


def build_model(model, seed: int = 0, device: str = "cpu"):
    """``(module, config, name, notes, stored_bf16)``: a preset / path / config at init (a
    folder's safetensors replace the init), or an ``nn.Module`` as it is."""
    from torch import nn

    from .. import models as hf
    from . import diagnose as dg

    notes: list[str] = []
    if isinstance(model, nn.Module):
        return model, dg.module_config(model), type(model).__name__, notes, False
    config = hf.load_config(model)
    name = str(model) if isinstance(model, str) else getattr(config, "model_type", "config")
    vocab = dg.vocab_at_init(config, int(getattr(config, "vocab_size", 0) or 1))
    big = _param_bytes(config, vocab) > BF16_ABOVE
    dtype = torch.bfloat16 if big else torch.float32
    m = hf.model_at_init(config, seed=seed, attn_implementation="eager", vocab_size=vocab,
                         dtype=dtype)
    folder = dg.model_folder(model)
    if folder is not None:
        if hf.load_local_weights(m, folder).trained:
            notes.append(f"weights: {folder} (trained)")
    if big:
        from ..measurement.probe_sites import find_blocks

        inside = {id(p) for _, b in find_blocks(m) for p in b.parameters()}
        for p in m.parameters():
            if id(p) not in inside:
                p.data = p.data.float()
        for mod in m.modules():
            for k, buf in list(mod._buffers.items()):
                if buf is not None and buf.is_floating_point():
                    mod._buffers[k] = buf.float()
        notes.append("blocks stored in bfloat16 (rounded once after init) to fit memory; "
                     "each block runs in float32")
    return m.to(device), config, name, notes, big


# ------------------------------------------------------------------------------------ rows
@dataclass
class Rows:
    """Sampled query rows of every length, ordered for :func:`stream_layer` (``lo`` and ``hi``
    non-decreasing): ``pos``, ``lo``, ``hi``, ``group`` (index into ``lengths``) and the rows
    whose outputs are formed (``out``)."""

    lengths: list[int]
    pos: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    group: torch.Tensor
    out: torch.Tensor

    @property
    def n_keys(self) -> np.ndarray:
        return (self.hi - self.lo).numpy().astype(np.float64)

    def select(self, g: int) -> Rows:
        """The rows of one length (for a pass of its own)."""
        sel = torch.nonzero(self.group == g).flatten()
        out = torch.nonzero(torch.isin(sel, self.out)).flatten()
        return Rows([self.lengths[g]], self.pos[sel], self.lo[sel], self.hi[sel],
                    torch.zeros(len(sel), dtype=torch.long), out)


def sample_rows(lengths: Sequence[int], queries: int, out_queries: int, *, causal: bool,
                window: int | None, seed: int) -> Rows:
    """``min(queries, T)`` distinct positions per length T, uniform in ``[0, T)`` (seeded by
    ``(seed, T)``); causal rows see ``[max(0, a - W + 1), a]``, others ``[0, T)``."""
    pos, lo, hi, grp, out = [], [], [], [], []
    for g, T in enumerate(lengths):
        R = min(queries, T)
        gen = torch.Generator().manual_seed(sm.block_seed(seed, T, 31))
        p = (torch.randperm(T, generator=gen)[:R] if T <= 2**24 else
             torch.randint(0, T, (R,), generator=gen)).sort().values
        flag = torch.zeros(R, dtype=torch.bool)
        flag[torch.randperm(R, generator=gen)[:min(out_queries, R)]] = True
        if causal:
            h = p + 1
            lw = (p - window + 1).clamp_min(0) if window else torch.zeros_like(p)
        else:
            h = torch.full_like(p, T)
            lw = torch.zeros_like(p)
        pos.append(p)
        lo.append(lw)
        hi.append(h)
        grp.append(torch.full_like(p, g))
        out.append(flag)
    pos, lo, hi, grp, out = (torch.cat(x) for x in (pos, lo, hi, grp, out))
    order = torch.from_numpy(np.lexsort((lo.numpy(), hi.numpy())))
    pos, lo, hi, grp, out = (x[order] for x in (pos, lo, hi, grp, out))
    return Rows(list(lengths), pos, lo, hi, grp, torch.nonzero(out).flatten())


def _queries(fit: LayerFit, n: int, seed: int) -> torch.Tensor:
    """``(n, H, d_H)`` pre-RoPE queries drawn from the layer's query fit."""
    g = fit.q_gen or fit.q
    z = sm.random_normal(seed, 21, fit.index, n, g.rank, torch.float64)
    q = (g.mu + z @ g.F).view(n, fit.heads, fit.head_dim)
    return fit.q_norm(q) if fit.q_norm is not None and fit.q_gen is not None else q


def stream_fit(fit: LayerFit, rows: Rows, scalings: Sequence[Scaling], *, seed: int,
               chunk: int, workers: int | None, dtype=torch.float32, device: str = "cpu",
               on_chunk: Callable[[int], None] | None = None) -> list[sm.LayerResult]:
    """Stream one layer's rows under every scaling (one pass, or one per length when the
    rotary frequencies depend on the context length)."""
    layer_seed = sm.block_seed(seed, fit.index, 41)
    if fit.length_dependent_rope and len(rows.lengths) > 1:
        parts = [stream_fit(fit, rows.select(g), scalings, seed=seed, chunk=chunk,
                            workers=workers, dtype=dtype, device=device, on_chunk=on_chunk)
                 for g in range(len(rows.lengths))]
        return [_merge([p[k] for p in parts], rows) for k in range(len(scalings))]
    n_max = max(rows.lengths)
    q = _queries(fit, len(rows.pos), layer_seed)
    src = sm.GaussianKV(n_max, fit.k_gen or fit.k, fit.v, fit.kv_heads, seed=layer_seed,
                        dtype=dtype, device=device,
                        k_post=fit.k_norm if fit.k_gen is not None else None)
    mults = [s.mult(rows.n_keys) for s in scalings]
    rope = None
    if fit.rope is not None:
        rope = fit.rope(n_max if fit.length_dependent_rope else None)
    return sm.stream_layer(q, rows.pos, rows.lo, rows.hi, src, scale=fit.scale,
                           multipliers=mults, rope=rope, out_rows=rows.out, w_o=fit.w_o,
                           b_o=fit.b_o, chunk=chunk, workers=workers, device=device,
                           on_chunk=on_chunk)


def _merge(parts: list[sm.LayerResult], rows: Rows) -> sm.LayerResult:
    """Results of per-length passes back in the order of ``rows``."""
    idx = [torch.nonzero(rows.group == g).flatten() for g in range(len(parts))]
    R = len(rows.pos)

    def put(name):
        first = getattr(parts[0], name)
        out = torch.empty((R,) + tuple(first.shape[1:]), dtype=first.dtype)
        for i, p in zip(idx, parts, strict=True):
            out[i] = getattr(p, name)
        return out

    outs = torch.cat([p.out for p in parts])
    order = torch.cat([i[torch.isin(i, rows.out)] for i in idx])
    final = torch.empty_like(outs)
    final[torch.searchsorted(rows.out, order)] = outs
    return sm.LayerResult(put("ipr"), put("entropy"), put("wmax"), put("log_z"),
                          put("spread"), final)


# ------------------------------------------------------------------------------ recommendation
def _candidates(own: Scaling, train_len: int) -> list[tuple[Scaling, Scaling, float]]:
    """``(candidate, base scaling, constant factor)``: the candidate's multiplier is the base's
    times the factor. Order = preference on ties: the model as it is, the n-dependent kinds,
    SSMax multiples of log-n, temperatures."""
    out = [(own, own, 1.0)]
    for kind in ("sqrt-qwen", "qwen", "sqrt-log-n", "log-n"):
        s = parse_scaling(kind, train_len)
        out.append((s, s, 1.0))
    logn = parse_scaling("log-n", train_len)
    for c in np.geomspace(0.5, 2.0, 25):
        if abs(c - 1.0) > 1e-9:
            s_param = float(c / math.log(train_len))
            out.append((Scaling("ssmax", s_param, _label("ssmax", s_param, train_len)), logn,
                        float(c)))
    for t in np.geomspace(0.25, 4.0, 49):
        if abs(t - 1.0) > 1e-9 and own.kind == "none":
            out.append((Scaling("tau", float(t), _label("tau", float(t), train_len)), own,
                        float(t)))
    return out


def _size(s: Scaling, own: Scaling, lengths: Sequence[int]) -> float:
    """How large a change is: the largest |log| ratio of its multiplier to the model's own over
    the lengths from training to target."""
    n = np.asarray(lengths, dtype=np.float64)
    return float(np.max(np.abs(np.log(s.mult(n) / own.mult(n)))))


def recommend(moms: list[LayerMoments], fits: list[LayerFit], own: Scaling, train_len: int,
              lengths: Sequence[int], band: float,
              bands: dict[int, tuple[float, float]] | None = None) -> dict[str, Any]:
    """The smallest change keeping every layer's predicted entropy within ``band`` of its
    predicted entropy at ``train_len`` (the model as it is) at every length from ``train_len``
    to the longest: candidates of :func:`_candidates`, theory of :func:`layer_theory`.
    ``bands``: given bands per layer (their middle and half-width replace those)."""
    span = sorted({t for t in lengths if t >= train_len} | {train_len})
    cands = _candidates(own, train_len)
    bases: dict[str, tuple[Scaling, list[int]]] = {}
    for i, (_, base, _) in enumerate(cands):
        bases.setdefault(base.label, (base, []))[1].append(i)
    dev = np.zeros(len(cands))  # worst |entropy - centre| over layers and lengths
    for f, mom in zip(fits, moms, strict=True):
        centre = float(layer_theory(mom, train_len, own.mult, causal=f.causal,
                                    window=f.window, d_head=f.head_dim)["entropy"])
        width = band
        if bands and f.index in bands:
            lo, hi = bands[f.index]
            centre, width = 0.5 * (lo + hi), 0.5 * (hi - lo)
        for base, idx in bases.values():
            factors = np.array([cands[i][2] for i in idx])
            for T in span:
                th = layer_theory(mom, T, base.mult, causal=f.causal, window=f.window,
                                  d_head=f.head_dim, extra=factors)
                dev[idx] = np.maximum(dev[idx], np.abs(th["entropy"] - centre) - width + band)
    sizes = np.array([_size(c[0], own, span) for c in cands])
    ok = dev <= band
    if ok.any():
        pick = int(np.flatnonzero(ok)[np.argmin(sizes[ok])])
        reason = (f"smallest change keeping every layer's predicted entropy within +/-{band:g} "
                  f"of its value at the training length {train_len} up to {max(span)}")
    else:
        pick = int(np.argmin(dev))
        reason = (f"no candidate keeps every layer within +/-{band:g}; this one comes closest "
                  f"(worst predicted deviation {dev[pick]:.3f})")
    s = cands[pick][0]
    return {"scaling": s.kind, "scaling_param": s.param, "label": s.label,
            "size": float(sizes[pick]), "predicted_worst_deviation": float(dev[pick]),
            "holds_predicted": bool(ok[pick]), "reason": reason, "_scaling": s,
            "tried": int(len(cands))}


# ------------------------------------------------------------------------------------ sweep
@dataclass
class ModelSweep(Result):
    """Result of :func:`sweep_model`: tidy rows (``layer, observable, source, value, stderr,
    seq_len, scaling, sigma_s, beta``), the per-layer summary, the entropy band per layer,
    the recommendation and how the run went (``info``)."""

    model: str
    trajectory: Any  # pandas DataFrame
    layers: list[dict]
    band: dict[int, tuple[float, float]]
    recommendation: dict[str, Any]
    info: dict[str, Any]
    seconds: float

    def summary(self) -> str:
        r = self.recommendation
        out = sum(1 for x in self.layers if not x.get("in_band"))
        return (f"{self.model}: {len(self.layers)} attention layers, T up to "
                f"{max(self.info['lengths'])}; {out} layer(s) leave the entropy band as is; "
                f"recommended: {r['label']} ({r['fix_command']})")

    def plot(self, path: str | None = None):
        """Entropy and ipr against log2 T, one line per layer, one column per scaling, the
        band shaded (:func:`sigprop.plotting.longctx_model.plot_model_sweep`)."""
        from ..plotting.longctx_model import plot_model_sweep

        return plot_model_sweep(self.trajectory, path, band=self.band,
                                title=f"{self.model}: attention against context length")

    def to_json(self, timing: bool = True) -> dict[str, Any]:
        """The JSON of ``sigprop longctx MODEL --format json``."""
        import math as _m

        def clean(x):
            if isinstance(x, float) and not _m.isfinite(x):
                return None
            if isinstance(x, dict):
                return {str(k): clean(v) for k, v in x.items()}
            if isinstance(x, list | tuple):
                return [clean(v) for v in x]
            if isinstance(x, np.generic):
                return clean(x.item())
            return x

        info = {k: v for k, v in self.info.items()
                if timing or not k.startswith("seconds") and k != "stream_gflops"
                and k != "matmul_gflops" and k != "stream_fraction"}
        rows = self.trajectory.to_dict(orient="records")
        out = {"model": self.model, "rows": rows, "layers": self.layers,
               "band": {str(k): list(v) for k, v in self.band.items()},
               "recommendation": self.recommendation, **info}
        if timing:
            out["seconds"] = self.seconds
        return clean(out)


def _own_scaling(config, train_len: int) -> Scaling:
    """The multiplier a ``sigprop fix`` recorded in the config (else ``none``)."""
    rec = getattr(config, "sigprop_fix", None)
    kind = (rec.get("scaling") if isinstance(rec, dict) else None) or "none"
    if kind == "none":
        return Scaling("none", None, "none")
    param = rec.get("scaling_param")
    param = float(param) if param is not None else None
    return Scaling(kind, param, _label(kind, param, train_len) if param is not None else kind)


def _check(lengths, queries, out_queries, chunk, band):
    if not lengths:
        raise SpecError("lengths", "give at least one length")
    for T in lengths:
        if isinstance(T, bool) or not isinstance(T, int | np.integer) or not 2 <= T <= 2**30:
            raise SpecError("lengths", f"each length must be an integer in [2, 2^30] (got {T!r})")
    if isinstance(queries, bool) or not isinstance(queries, int) or \
            not 2 <= queries <= MAX_QUERIES:
        raise SpecError("queries", f"must be an integer in [2, {MAX_QUERIES}] (got {queries!r})")
    if isinstance(out_queries, bool) or not isinstance(out_queries, int) or \
            not 2 <= out_queries <= MAX_QUERIES:
        raise SpecError("out_queries", f"must be an integer in [2, {MAX_QUERIES}] "
                                       f"(got {out_queries!r})")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 16 <= chunk <= 2**20:
        raise SpecError("chunk", f"must be an integer in [16, 1048576] (got {chunk!r})")
    if not (isinstance(band, float | int) and 0 < band <= 1):
        raise SpecError("band", f"must be a number in (0, 1] (got {band!r})")


def _stats(values: torch.Tensor) -> tuple[float, float]:
    v = values[~torch.isnan(values)]
    if v.numel() == 0:
        return math.nan, math.nan
    err = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else math.nan
    return float(v.mean()), err


def _out_cos(out: torch.Tensor) -> tuple[float, float]:
    """Mean pairwise cosine of the output rows, stderr from the per-row means."""
    if out.shape[0] < 2:
        return math.nan, math.nan
    u = out / out.norm(dim=1, keepdim=True).clamp_min(1e-300)
    G = u @ u.T
    n = G.shape[0]
    per_row = (G.sum(1) - G.diagonal()) / (n - 1)
    return float(per_row.mean()), float(per_row.std() / math.sqrt(n))


def _spread_exponent(lengths: list[int], spread: list[float]) -> float | None:
    """Slope of log(spread) against log(log T): ~0.5-0.6 for random (REM) scores, ~0 when
    the largest score stays bounded (a fixed geometry)."""
    pts = [(math.log(math.log(T)), math.log(s)) for T, s in zip(lengths, spread, strict=True)
           if T > 2 and s > 0 and math.isfinite(s)]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < 0.1:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def sweep_model(model, lengths: Sequence[int] | None = None, *, queries: int = 128,
                out_queries: int = 32, train_len: int | None = None,
                seq_len: int | None = None, sequences: int = 2,
                scalings: Sequence[str] | None = None, compare: bool = False,
                band: float = DEFAULT_BAND, layers: Sequence[int] | None = None,
                bands: dict | None = None, chunk: int = 8192, seed: int = 0,
                device: str = "cpu",
                workers: int | None = None,
                on_progress: Callable[[int], None] | None = None) -> ModelSweep:
    """Every attention layer of ``model`` at every context length (module docstring).

    ``scalings``: extra scalings to stream (``kind`` or ``kind:param``); ``compare``: also every
    kind of :data:`COMPARE_ALL`. The model as it is and the recommendation are always streamed;
    every streamed scaling gets theory rows. ``band``: half-width of the entropy band.
    ``queries`` rows per length (``out_queries`` of them also form the layer output for the
    output cosine). ``train_len``: the length the model was built for (default
    :func:`train_length`), added to the lengths; ``seq_len``: the reference pass (default
    ``min(512, train_len)``)."""
    import pandas as pd

    from ..measurement.probe_sites import find_attention, find_blocks
    from ..models.arch import input_kind
    from . import diagnose as dg

    t0 = time.perf_counter()
    lengths = default_lengths() if lengths is None else [int(t) if isinstance(t, np.integer)
                                                         else t for t in lengths]
    _check(lengths, queries, out_queries, chunk, band)
    if device not in ("cpu", "cuda"):
        raise SpecError("device", f"must be cpu or cuda (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device", "cuda requested but no CUDA device is available")
    module, config, name, notes, bf16 = build_model(model, seed=seed, device="cpu")
    tl = int(train_len) if train_len is not None else train_length(config)
    if tl < 2:
        raise SpecError("train_len", f"must be an integer >= 2 (got {train_len!r})")
    all_lengths = sorted(set(lengths) | {tl})
    if max(all_lengths) > 2**30:
        raise SpecError("lengths", "the longest length must be <= 2^30")
    T_ref = int(seq_len) if seq_len is not None else min(512, tl)
    if not 2 <= T_ref <= 8192:
        raise SpecError("seq_len", f"must be an integer in [2, 8192] (got {seq_len!r})")
    own = _own_scaling(config, tl)
    extra = [parse_scaling(s, tl) for s in (scalings or [])]
    if compare:
        extra += [parse_scaling(k, tl) for k in COMPARE_ALL]
    blocks = find_blocks(module)
    sites = [s for s in (find_attention(b, None, n) for n, b in blocks) if s is not None]
    if not sites:
        raise SpecError("model", "no attention layer with Q/K projections found")
    chosen = list(range(len(sites)))
    if layers is not None:
        bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int)
               or not 0 <= i < len(sites)]
        if bad or not layers:
            raise SpecError("layers", f"each must be an attention-layer index in "
                                      f"[0, {len(sites) - 1}] (got {bad[0] if bad else []!r})")
        chosen = sorted(set(layers))
    kind = input_kind(config)
    if kind != "text":
        raise SpecError("model", f"long context needs a text model ({config.model_type} "
                                 f"takes {kind} input)")
    vocab = dg.vocab_at_init(config, int(getattr(config, "vocab_size", 0) or 1))
    inputs = dg.text_inputs(sequences, T_ref, vocab, seed, "cpu")
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    if enc_dec:
        notes.append("encoder-decoder: the encoder's self-attention layers are streamed")
    if dg.repeats_of(config) > 1:
        notes.append(f"shared layers ({config.model_type}): each shared attention module is "
                     f"applied {dg.repeats_of(config)} times per pass; its applications are "
                     "pooled into one fit (one row per shared module)")
    was_training = module.training
    module.eval()
    try:
        ctx = _Float32Blocks(blocks) if bf16 else None
        if ctx is not None:
            ctx.__enter__()
        try:
            fits = fit_layers(module, [sites[i] for i in chosen], inputs,
                              lambda m, x: dg.forward_once(m, x, enc_dec), long_T=max(all_lengths),
                              mult=None if own.kind == "none" else own.mult)
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
    finally:
        module.train(was_training)
    # the fits hold what the stream needs (moments, W_O, the rotary module): let a model we
    # built go before streaming (Llama-3.2-1B: 2 GB of weights)
    del module, blocks, sites, ctx
    gc.collect()
    for f, i in zip(fits, chosen, strict=True):
        f.index = i
        notes += f.notes
    t_fit = time.perf_counter() - t0
    moms = [moments(f) for f in fits]
    bands = _given_bands(bands, [f.index for f in fits])
    rec = recommend(moms, fits, own, tl, all_lengths, band, bands)
    streamed = [own]
    for s in [rec["_scaling"]] + extra:
        if s.label not in {x.label for x in streamed}:
            streamed.append(s)
    theory_only = [parse_scaling(k, tl) for k in COMPARE_ALL]
    theory_only = [x for x in theory_only if x.label not in {y.label for y in streamed}]
    records: list[dict] = []
    layer_rows: list[dict] = []
    t_stream = 0.0
    keys_streamed = 0
    flops = 0.0
    for f, mom in zip(fits, moms, strict=True):
        rows = sample_rows(all_lengths, queries, out_queries, causal=f.causal,
                           window=f.window, seed=seed)
        ts = time.perf_counter()
        res = stream_fit(f, rows, streamed, seed=seed, chunk=chunk, workers=workers,
                         device=device, on_chunk=on_progress)
        t_stream += time.perf_counter() - ts
        keys_streamed += max(all_lengths)
        flops += _stream_flops(f, rows, len(streamed))
        spread = []
        for g, T in enumerate(all_lengths):
            sel = (rows.group == g)
            osel = sel[rows.out]
            base = dict(layer=f.index, seq_len=T)
            for s, r in zip(streamed, res, strict=True):
                th = layer_theory(mom, T, s.mult, causal=f.causal, window=f.window,
                                  d_head=f.head_dim)
                extra_cols = dict(scaling=s.label, sigma_s=float(th["sigma_s"]),
                                  beta=float(th["beta"]), **base)
                for obs in ("ipr", "entropy", "wmax"):
                    v, e = _stats(getattr(r, obs)[sel].nanmean(dim=1))
                    records.append(dict(observable=obs, source="measured", value=v, stderr=e,
                                        **extra_cols))
                    records.append(dict(observable=obs, source="theory",
                                        value=float(th[obs]), **extra_cols))
                    records.append(dict(observable=obs, source="theory_asymptotic",
                                        value=float(th["asym_" + obs]), **extra_cols))
                v, e = _out_cos(r.out[osel])
                records.append(dict(observable="cos", source="measured", value=v, stderr=e,
                                    **extra_cols))
                records.append(dict(observable="cos", source="theory",
                                    value=float(th["cos"]), **extra_cols))
            for s in theory_only:
                th = layer_theory(mom, T, s.mult, causal=f.causal, window=f.window,
                                  d_head=f.head_dim)
                cols = dict(scaling=s.label, sigma_s=float(th["sigma_s"]),
                            beta=float(th["beta"]), **base)
                for obs in ("ipr", "entropy", "wmax", "cos"):
                    records.append(dict(observable=obs, source="theory", value=float(th[obs]),
                                        **cols))
                    if obs != "cos":
                        records.append(dict(observable=obs, source="theory_asymptotic",
                                            value=float(th["asym_" + obs]), **cols))
            v, e = _stats(res[0].spread[sel].nanmean(dim=1))
            spread.append(v)
            records.append(dict(observable="spread", source="measured", value=v, stderr=e,
                                scaling=own.label, **base))
        layer_rows.append(dict(layer=f.index, name=f.name, heads=f.heads,
                               kv_heads=f.kv_heads, causal=f.causal, window=f.window,
                               rope=f.rope is not None, rho=f.rho, model_check=f.check,
                               gamma_c=1.0 / (1.0 - f.rho) if f.rho < 1 else math.inf,
                               spread_exponent=_spread_exponent(all_lengths, spread)))
    traj = pd.DataFrame.from_records(records)
    _summarise(traj, layer_rows, bands, own, rec, tl, band, notes)
    rec.pop("_scaling")
    fix = f"sigprop fix {name} --out FIXED"
    if rec["scaling"] != own.kind or rec["scaling_param"] != own.param:
        fix += f" --scaling {rec['scaling']}"
        if rec["scaling_param"] is not None:
            fix += f" --scaling-param {rec['scaling_param']:.6g}"
        rec["fix_command"] = fix
    else:
        rec["fix_command"] = "no change needed"
    base_rate = matmul_rate(workers, device=device)
    seconds = time.perf_counter() - t0
    info = {"lengths": all_lengths, "requested_lengths": list(lengths), "train_len": tl,
            "seq_len": T_ref, "sequences": sequences, "queries": queries,
            "out_queries": out_queries, "band_width": band, "chunk": chunk, "seed": seed,
            "scalings": [s.label for s in streamed], "own_scaling": own.label,
            "n_layers": len(fits), "bf16_storage": bf16, "notes": notes,
            "seconds_reference": t_fit, "seconds_stream": t_stream, "device": device,
            "keys_streamed": keys_streamed, "stream_gflops": flops / max(t_stream, 1e-9) / 1e9,
            "matmul_gflops": base_rate, "stream_fraction": flops / max(t_stream, 1e-9) / 1e9
            / base_rate,
            "theory_only": [x.label for x in theory_only],
            "inputs": "Gaussian keys/values/queries with each layer's measured mean and "
                      "covariance (reference pass at seq_len)"}
    return ModelSweep(name, traj, layer_rows, bands, rec, info, seconds)


def _given_bands(bands, layers: list[int]) -> dict[int, tuple[float, float]]:
    """Bands carried over from an earlier run (``{layer: (lo, hi)}``, keys may be strings as
    in its JSON), checked: one per streamed layer, ``0 <= lo <= hi <= 1``."""
    if not bands:
        return {}
    if not isinstance(bands, dict):
        raise SpecError("bands", f"must map each attention layer to (lo, hi) (got {bands!r})")
    out = {}
    for L in layers:
        b = bands.get(L, bands.get(str(L)))
        if b is None:
            raise SpecError("bands", f"no band for attention layer {L} (the earlier run "
                                     "streamed other layers)")
        try:
            lo, hi = (float(x) for x in b)
        except (TypeError, ValueError):
            raise SpecError("bands", f"layer {L}: a band is a pair (lo, hi) (got {b!r})") \
                from None
        if not 0.0 <= lo <= hi <= 1.0:
            raise SpecError("bands", f"layer {L}: need 0 <= lo <= hi <= 1 (got {b!r})")
        out[L] = (lo, hi)
    return out


def _stream_flops(f: LayerFit, rows: Rows, n_scalings: int) -> float:
    """Matrix-multiply flops of one layer's pass: drawing keys and values (``2 rank D`` per
    position), scores (``2 H d_H`` per visible key and row), value sums of the output rows
    (``2 H d_V`` per visible key, per scaling). The elementwise softmax work is not counted."""
    n_max = max(rows.lengths)
    gen = 2.0 * n_max * (f.k.rank * f.k.mu.numel() + f.v.rank * f.v.mu.numel())
    nk = rows.n_keys
    scores = 2.0 * f.heads * f.head_dim * float(nk.sum())
    dv = f.v.mu.numel() // f.kv_heads
    outs = 2.0 * f.heads * dv * float(nk[rows.out.numpy()].sum()) * n_scalings
    return gen + scores + outs


def matmul_rate(workers: int | None = None, n: int = 1024, repeats: int = 4,
                device: str = "cpu") -> float:
    """This machine's float32 matrix-multiply rate in GFLOP/s (``n x n`` products on the
    threads a stream uses, or on the GPU), the baseline the streaming rate is stated against."""
    from ..measurement.threads import cpu_settings

    a = torch.randn(4 * n, n, device=device)
    b = torch.randn(n, n, device=device)

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    with cpu_settings(threads=max(1, int(workers or torch.get_num_threads()))):
        a @ b
        sync()
        t = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync()
        dt = time.perf_counter() - t
    return 2.0 * 4 * n * n * n * repeats / dt / 1e9


def _summarise(traj, layer_rows, bands, own: Scaling, rec, train_len: int, band: float,
               notes: list[str]):
    """Per layer: band (measured entropy at the training length +/- band), whether the model
    as it is and the recommendation stay in it, the worst ipr gap to theory, sigma_s / beta at
    the training length and which theory describes the score spread."""
    m = traj[traj.source == "measured"]
    t = traj[traj.source == "theory"]
    holds = True
    for row in layer_rows:
        L = row["layer"]

        def val(df, obs, scaling, T, L=L):
            x = df[(df.layer == L) & (df.observable == obs) & (df.scaling == scaling)
                   & (df.seq_len == T)]["value"]
            return float(x.iloc[0]) if len(x) else math.nan

        centre = val(m, "entropy", own.label, train_len)
        if L not in bands:  # else a band carried over from an earlier run (--band-from)
            bands[L] = (centre - band, centre + band)
        lo, hi = bands[L]
        lens = sorted(int(T) for T in m[m.layer == L].seq_len.unique() if T >= train_len)

        def inside(scaling, lens=lens, val=val, lo=lo, hi=hi):
            return all(lo <= val(m, "entropy", scaling, T) <= hi for T in lens)

        row["entropy_train"] = centre
        row["in_band"] = inside(own.label)
        row["recommended_in_band"] = inside(rec["label"])
        holds = holds and row["recommended_in_band"]
        gi = m[(m.layer == L) & (m.observable == "ipr") & (m.scaling == own.label)]
        ti = t[(t.layer == L) & (t.observable == "ipr") & (t.scaling == own.label)]
        gap = (gi.set_index("seq_len")["value"] - ti.set_index("seq_len")["value"]).abs()
        row["worst_gap"] = float(gap.max()) if len(gap) else None
        if row["worst_gap"] is not None and row["worst_gap"] > GAP_NOTE:
            why = ("RoPE rotates an anisotropic key covariance, so the score variance varies "
                   "with the distance (a mixture with a heavier tail than the REM's one "
                   "Gaussian; docs/theory.md §3.2.3)" if row["rope"] else
                   "beyond the REM tables' accuracy at this beta, or sampling (stderr above)")
            notes.append(f"layer {L}: measured ipr {row['worst_gap']:.3f} from theory: {why}")
        tr = t[(t.layer == L) & (t.observable == "ipr") & (t.scaling == own.label)
               & (t.seq_len == train_len)]
        row["sigma_s"] = float(tr["sigma_s"].iloc[0]) if len(tr) else None
        row["beta"] = float(tr["beta"].iloc[0]) if len(tr) else None
        nu = row["spread_exponent"]
        row["theory_fit"] = "n/a" if nu is None else ("gg25" if nu >= 0.25 else "clpr25")
    rec["holds_measured"] = holds
