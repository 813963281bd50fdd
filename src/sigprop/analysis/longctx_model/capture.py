"""Step 1, the reference pass: one forward pass at the reference length over built-in text
records with hooks on every attention layer, recording what the attention computes with (its
queries, keys and values as the module forms them, after the projections and any query/key
norm, *before* RoPE; the (cos, sin) it receives; the token cosine of its input), then a
Gaussian fit of each layer's moments (:class:`LayerFit`).

The pass also checks the stream's model of every layer (q.k x scale, the rotary (cos, sin),
the mask) against the module's own probabilities where eager attention returns them, and
refuses a layer it does not model (a position bias, soft-capping, in-module RoPE).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np
import torch

from ...measurement import stream_model as sm
from ...measurement.handles import HookHandles
from ...spec import SpecError
from .model import Float32Blocks
from .rotary import match_rope, rotary_modules


@dataclass
class LayerFit:
    """One attention layer as the long-context stream uses it (all moments float64)."""

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
    #: real text: the first position's key and value (mean over the sequences, as attention
    #: reads them: after any key norm, before RoPE), kept as they are in the stream (a sink
    #: is one key, not a draw of the Gaussian); the fits then pool positions 1 .. T-1
    first_k: torch.Tensor | None = None
    first_v: torch.Tensor | None = None
    #: the ``resampled`` input model: the measured queries and (key, value) pairs (positions
    #: 1 .. T-1 where the first is pinned; at most :data:`POOL_MAX`), which the stream
    #: resamples in place of the Gaussian draws (``(N, heads, d)`` each, float32)
    pool_q: torch.Tensor | None = None
    pool_k: torch.Tensor | None = None
    pool_v: torch.Tensor | None = None

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def _bound(module, args, kwargs) -> dict:
    """The arguments of one call of ``module`` by name (only the keywords when its forward's
    signature does not take them)."""
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
    ``(H, T, T)`` float64 (the check of :class:`Capture`)."""
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


class Capture(HookHandles):
    """Hooks on every attention site: q/k/v outputs (pre-RoPE; the first output of each
    projection per call of the module: DeBERTa runs them again on relative embeddings), the
    input's token cosine, the (cos, sin) the module receives, causality and the check that the
    stream's model of the layer reproduces the module's own probabilities (eager attention
    returns them): ``check`` is the largest difference seen."""

    def __init__(self, sites, check: bool = True, mult: Callable | None = None):
        self.sites, self.check, self.mult = sites, check, mult
        self._handles: list = []
        self.data = [{"q": [], "k": [], "v": [], "q_pre": [], "k_pre": [], "cos": [],
                      "pos": None, "causal": None,
                      "bias": False, "check": None, "got": None, "call_pos": None,
                      "check_error": None}
                     for _ in sites]

    def __enter__(self):
        from ...measurement import observables as obs

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
                    except (RuntimeError, ValueError) as err:  # a layout it cannot split
                        diff = math.inf
                        d["check_error"] = (f"{type(err).__name__}: "
                                            f"{str(err).splitlines()[0][:120]}" if str(err)
                                            else type(err).__name__)
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

            reg = self._handles.append
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


def _positional(d: dict, qw: int, kw: int) -> bool:
    """Whether every captured q, k, v (and pre-norm q, k) chunk splits by position, with
    more than two positions (the first can then be kept apart)."""
    n_v = sum(c.numel() for c in d["v"])
    n_q = sum(c.numel() for c in d["q"]) // qw
    vw = n_v // max(n_q, 1)
    parts = [(c, qw) for c in d["q"] + d["q_pre"]] + [(c, kw) for c in d["k"] + d["k_pre"]] \
        + [(c, vw) for c in d["v"]]
    for c, w in parts:
        b = _by_position(c, w) if w > 0 and c.numel() % w == 0 else None
        if b is None or b.shape[1] <= 2:
            return False
    return True


def _flat(chunks: list[torch.Tensor], width: int, skip_first: bool = False) -> torch.Tensor:
    """(N, width) samples from hook outputs (..., T, width) or (..., T, heads, d);
    ``skip_first``: without each sequence's first position."""
    if skip_first:
        chunks = [_by_position(c, width)[:, 1:] for c in chunks]
    return torch.cat([c.reshape(-1, width) for c in chunks])


def _by_position(c: torch.Tensor, width: int) -> torch.Tensor | None:
    """A hook output as ``(sequences, T, width)`` (token dimension second from the end of
    ``(..., T, width)``, or third of ``(..., T, heads, d)``); None for another layout (a
    gated query's projection, twice as wide)."""
    if c.shape[-1] != width:
        if c.dim() < 4 or c.shape[-2] * c.shape[-1] != width:
            return None
        c = c.flatten(-2)
    return c.reshape(-1, c.shape[-2], width)


def output_projection(site, width: int):
    """The output projection of an attention module: its linear child (not Q/K/V) reading
    the ``width = H * d_V`` concatenated heads; ``(W (in, out), bias)`` or None."""
    from ...measurement.weight_maps import matrix

    skip = {id(site.q), id(site.k), id(site.v)}
    for _, m in site.module.named_children():
        if id(m) in skip:
            continue
        wb = matrix(m)
        if wb is not None and wb[0].shape[1] == width:
            w, b = wb  # float32 storage: 16 layers of 2048^2 are 256 MB
            return w.float().T.contiguous().cpu(), None if b is None else b.float().cpu()
    return None


#: measured positions kept per layer for the ``resampled`` input model (a seeded subset
#: beyond it): 16384 positions of a 4096-wide layer are 256 MB of float32
POOL_MAX = 16384


def _pools(q, k, v, H: int, Hkv: int, dh: int, dv: int, index: int):
    """``(q, k, v)`` pools of at most :data:`POOL_MAX` positions (the same positions for the
    three; a seeded subset of larger samples), float32 ``(N, heads, d)``."""
    n = q.shape[0]
    if n > POOL_MAX:
        g = torch.Generator().manual_seed(sm.block_seed(index, n, 53))
        sel = torch.randperm(n, generator=g)[:POOL_MAX].sort().values
        q, k, v = q[sel], k[sel], v[sel]
    return (q.float().reshape(-1, H, dh), k.float().reshape(-1, Hkv, dh),
            v.float().reshape(-1, Hkv, dv))


def _run_forward(forward: Callable, model, inputs: dict) -> None:
    """``forward(model, inputs)``; a failure of the model's own forward is one SpecError."""
    try:
        forward(model, inputs)
    except SpecError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of the user's forward: one line
        from ...measurement.memory import allocation_failure

        first = str(err).splitlines()[0][:160] if str(err) else ""
        raise SpecError("model", allocation_failure(err) or (
            f"its forward pass on token ids alone failed ({type(err).__name__}"
            f"{': ' + first if first else ''}): long context reads models whose forward "
            "takes token ids alone")) from None


def fit_layers(model, sites, inputs: dict, forward: Callable, *, long_T: int,
               mult: Callable | None = None, pin_first: bool = False,
               pools: bool = False) -> list[LayerFit]:
    """Run the reference pass (``forward(model, inputs)``) with capture hooks and fit every
    site's moments (:class:`LayerFit`); ``mult(n)``: the logit multiplier the model applies
    itself (a recorded ``sigprop fix`` scaling), for the model check. ``pin_first`` (real
    text): the first position's key and value are kept as measured and left out of the
    fits; ``pools``: the measured positions are kept for the ``resampled`` input model."""
    cap = Capture(sites, mult=mult)
    with cap, torch.no_grad():
        _run_forward(forward, model, inputs)
    rotaries = rotary_modules(model)
    fits = []
    for i, (s, d) in enumerate(zip(sites, cap.data, strict=True)):
        H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim
        if not d["q"] or not d["k"] or not d["v"]:
            raise SpecError("model", f"attention layer {i} ({s.name}): its Q/K/V projections "
                                     "were not called inside the module")
        q, k = _flat(d["q"], H * dh), _flat(d["k"], Hkv * dh)
        n_v = sum(c.numel() for c in d["v"])
        pin = pin_first and _positional(d, H * dh, Hkv * dh)
        if k.shape[0] != q.shape[0] or n_v % max(q.shape[0], 1):
            raise SpecError("model", f"attention layer {i} ({s.name}): its Q/K/V projections "
                                     "run on other inputs too (relative embeddings?): not a "
                                     "layout the long-context stream models")
        v = torch.cat([c.reshape(-1, n_v // q.shape[0]) for c in d["v"]])
        dv = v.shape[1] // Hkv
        wo = output_projection(s, H * dv)
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
        if d["check_error"] is not None:
            raise SpecError("model", f"attention layer {i} ({s.name}): the stream's model of "
                                     "it (q.k x scale, the (cos, sin) it receives, its mask) "
                                     "could not be formed from the q and k its projections "
                                     f"return ({d['check_error']}): a q / k layout the stream "
                                     "does not read")
        if d["check"] is not None and not d["check"] <= MODEL_TOL:
            raise SpecError("model", f"attention layer {i} ({s.name}): its own probabilities "
                                     f"differ from the stream's model of it (q.k x scale "
                                     f"{s.scale:.4g}, the (cos, sin) it receives, its mask) by "
                                     f"{d['check']:.2g} in the reference pass: something the "
                                     "stream does not model (soft-capping, attention sinks, "
                                     "interleaved or in-module RoPE, an unexposed scale)")
        rho = float(torch.cat(d["cos"]).mean()) if d["cos"] else float("nan")
        causal = bool(s.causal) if d["causal"] is None else d["causal"]
        if pin:
            q, k = _flat(d["q"], H * dh, True), _flat(d["k"], Hkv * dh, True)
            v_seq = [_by_position(c, Hkv * dv) for c in d["v"]]
            v = torch.cat([c[:, 1:].reshape(-1, Hkv * dv) for c in v_seq])
        f = LayerFit(i, s.name, H, Hkv, dh, float(s.scale), causal, window,
                     sm.GaussianFit.from_samples(q), sm.GaussianFit.from_samples(k),
                     sm.GaussianFit.from_samples(v), None if wo is None else wo[0],
                     None if wo is None else wo[1], rho)
        if pin:
            k_seq = torch.cat([_by_position(c, Hkv * dh)[:, 0] for c in d["k"]])
            f.first_k = k_seq.mean(0).view(Hkv, dh)
            f.first_v = torch.cat([c[:, 0] for c in v_seq]).mean(0).view(Hkv, dv)
        if pools and q.shape[0] == k.shape[0] == v.shape[0]:
            f.pool_q, f.pool_k, f.pool_v = _pools(q, k, v, H, Hkv, dh, dv, i)
        if wo is None:
            f.notes.append(f"layer {i}: no output projection recognised: the output cosine "
                           "is that of the concatenated heads")
        if notes_check:
            f.notes.append(notes_check)
        f.check = d["check"]
        if d["q_pre"] and d["k_pre"] and len(d["q_pre"]) == len(d["q"]):
            f.q_gen = sm.GaussianFit.from_samples(_flat(d["q_pre"], H * dh, pin))
            f.k_gen = sm.GaussianFit.from_samples(_flat(d["k_pre"], Hkv * dh, pin))
            f.q_norm, f.k_norm = _norm_fn(s.q_post, H, dh), _norm_fn(s.k_post, Hkv, dh)
        if d["pos"] is not None:
            T = d["pos"][0].shape[0]
            m = match_rope(d["pos"], rotaries, T, long_T)
            if m is None:
                raise SpecError("model", f"attention layer {i} ({s.name}) receives a rotary "
                                         "(cos, sin) that no rotary module of the model "
                                         "reproduces: long-context positions unknown")
            f.rope, f.inv_freq, f.rope_dims = m.table, m.inv_freq, m.dims
            f.rope_gain, f.length_dependent_rope = m.gain, m.length_dependent
        elif rotaries:
            f.notes.append(f"layer {i}: the model has a rotary module but this layer gets no "
                           "(cos, sin): streamed without RoPE")
        fits.append(f)
    return fits



def _chosen_layers(layers, n_sites: int) -> list[int]:
    """The attention-layer indices to stream (default all), checked against ``n_sites``."""
    if layers is None:
        return list(range(n_sites))
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int)
           or not 0 <= i < n_sites]
    if bad or not layers:
        raise SpecError("layers", f"each must be an attention-layer index in "
                                  f"[0, {n_sites - 1}] (got {bad[0] if bad else []!r})")
    return sorted(set(layers))


def chosen_sites(module, layers) -> tuple[list, list, list[int]]:
    """``(blocks, chosen sites, their attention-layer indices)`` of a model (a SpecError when
    it has no attention layer with Q/K projections or ``layers`` names one it lacks)."""
    from ...measurement.probe_sites import find_attention, find_blocks

    try:
        blocks = find_blocks(module)
    except ValueError:  # no list of blocks at all
        raise SpecError("model", "no attention layer with Q/K projections found (no list of "
                                 "transformer blocks)") from None
    sites = [s for s in (find_attention(b, None, n) for n, b in blocks) if s is not None]
    if not sites:
        raise SpecError("model", "no attention layer with Q/K projections found")
    chosen = _chosen_layers(layers, len(sites))
    return blocks, [sites[i] for i in chosen], chosen


def reference_pass(module, config, *, bf16: bool, layers, seq_len: int, sequences: int,
                   seed: int, long_T: int, mult: Callable | None, inputs: dict | None = None,
                   pin_first: bool = False, pools: bool = False
                   ) -> tuple[list[LayerFit], list[str]]:
    """Step 1 on a built model: ``sequences`` built-in text records of ``seq_len`` tokens
    (``inputs``: the model's own tokenizer's, :func:`sigprop.data.model_text.token_batch`)
    through ``module`` in eval mode (blocks stored in bfloat16 run in float32), every chosen
    attention layer fitted (:func:`fit_layers`, ``index`` = its attention-layer index;
    ``pin_first``, ``pools`` as there). Returns the fits and the notes the pass adds
    (encoder-decoder, shared layers, the fits' own)."""
    from ...models.arch import input_kind
    from .. import forward as fw

    blocks, sites, chosen = chosen_sites(module, layers)
    kind = input_kind(config)
    if kind != "text":
        raise SpecError("model", f"long context needs a text model ({config.model_type} "
                                 f"takes {kind} input)")
    if inputs is None:
        vocab = fw.vocab_at_init(config, int(getattr(config, "vocab_size", 0) or 1))
        inputs = fw.text_inputs(sequences, seq_len, vocab, seed, "cpu")
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    notes = []
    if enc_dec:
        notes.append("encoder-decoder: the encoder's self-attention layers are streamed")
    if fw.repeats_of(config) > 1:
        notes.append(f"shared layers ({config.model_type}): each shared attention module is "
                     f"applied {fw.repeats_of(config)} times per pass; its applications are "
                     "pooled into one fit (one row per shared module)")
    was_training = module.training
    module.eval()
    try:
        with ExitStack() as stack:
            if bf16:
                stack.enter_context(Float32Blocks(blocks))
            fits = fit_layers(module, sites, inputs,
                              lambda m, x: fw.forward_once(m, x, enc_dec), long_T=long_T,
                              mult=mult, pin_first=pin_first, pools=pools)
    finally:
        module.train(was_training)
    for f, i in zip(fits, chosen, strict=True):
        f.index = i
        notes += f.notes
    return fits, notes
