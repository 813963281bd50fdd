"""Forward-hook probe for any ``nn.Module`` (HF models included): THEORY §1 observables per layer.

    with Probe(model) as p:        # blocks and attention sites found automatically
        model(**inputs)
    traj = to_trajectory(p)        # Trajectory rows, mean ± stderr over sequences (or seeds)

Layer 0 is the input of the first block (embeddings), layer ``l`` the output of block ``l`` and
where block ``l``'s attention statistics go, as in ``theory.blocks.propagate``. Attention
probabilities (``p.info[i]["source"]``) are ``returned`` when the attention module outputs them
second (HF eager attention; transformers 5 does so even without ``output_attentions``), else
``recomputed`` as ``softmax(q k^T * scale + mask)`` from hooked Q/K projections: split ones
(``query/key``, ``q_proj/k_proj``, ``q_lin/k_lin``, ``wq/wk``, ``q/k``; with ``q_norm/k_norm``
after them as in Qwen3 / OLMo2), fused ``[q | k | v]`` (GPT-2 ``c_attn``, ``qkv_proj``,
``Wqkv``) or per-head interleaved ``(H, 3, d_H)`` (GPT-NeoX ``query_key_value``, no grouped
KV). Grouped-query KV heads are repeated as HF ``repeat_kv`` does. Scale: the module's
``scaling`` (HF) or ``head_dim ** -0.5``; mask: the module's ``attention_mask`` argument (bool
"visible" or additive float) and a causal triangle when its ``is_causal`` (or ``causal=``) holds.

RoPE: ``position_embeddings = (cos, sin)`` received by the attention module (HF LLaMA family,
GPT-NeoX) are applied in HF's ``rotate_half`` convention (partial rotary on the first
``cos.shape[-1]`` dims), making the recomputation exact. A model with a rotary module whose
attention gets no ``(cos, sin)`` is recomputed without RoPE and flagged (``info["rope"] ==
"missing"``, ``info["approximate"]``); so is an ``alibi`` / ``position_bias`` argument (BLOOM,
T5), which is not added (``info["bias"] == "missing"``). Neither reproduced nor flagged:
logit soft-capping (Gemma 2), sliding windows that exist only inside a kernel.

``T x Tk`` maps are formed transiently (chunks of heads) and reduced to per-head ``ipr,
ipr_cross, entropy, wmax`` (``gap``, ``s2_sqrtT`` with ``spectral=True``); ``keep_probs=True``
keeps them. Padding query rows count in the statistics (padded keys do not): measure unpadded
batches. The probe never changes ``model.training``: call ``model.eval()`` first.
"""

from __future__ import annotations

import inspect
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .. import trajectory as _traj
from . import observables as obs

__all__ = ["AttentionSite", "describe_attention", "find_attention", "find_blocks", "Probe",
           "to_trajectory"]

_SPLIT_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"),
                ("q_lin", "k_lin", "v_lin"), ("wq", "wk", "wv"), ("q", "k", "v"))
_FUSED = {"c_attn": "concat", "qkv_proj": "concat", "Wqkv": "concat",
          "query_key_value": "per_head"}
_KNOWN_BLOCKS = ("encoder.layer", "transformer.h", "h", "model.layers", "layers", "blocks",
                 "encoder.layers", "decoder.layers", "block")
ATTENTION_STATS = ("ipr", "ipr_cross", "entropy", "wmax")
HIDDEN_STATS = ("cos", "q", "stable_rank")


@dataclass
class AttentionSite:
    """Where one attention layer's Q/K live and how to turn them into probabilities.

    ``module`` receives ``attention_mask`` / ``position_embeddings`` and may return the
    probabilities; ``q``/``k``/``v`` are the projections (one module when ``fused`` is
    ``"concat"``, output ``[q | k | v]``, or ``"per_head"``, output ``(H, 3, d_H)``);
    ``q_post``/``k_post``: modules applied to the projections before the scores (hooked instead).
    """

    module: nn.Module
    q: nn.Module
    k: nn.Module
    v: nn.Module | None
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scale: float
    causal: bool
    fused: str | None = None
    q_post: nn.Module | None = None
    k_post: nn.Module | None = None
    name: str = ""


def _first_int(objs, names):
    for o in objs:
        for n in names:
            v = getattr(o, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _out_features(m: nn.Module) -> int | None:
    return _first_int([m], ("out_features", "nf"))  # nn.Linear, HF Conv1D


def describe_attention(module: nn.Module, name: str = "", causal: bool | None = None):
    """An :class:`AttentionSite` for ``module`` if it owns Q/K projections, else None.

    Head counts and sizes come from the module's attributes (``num_heads``,
    ``num_attention_heads``, ``head_dim``, ``attention_head_size`` ...), its ``config`` and the
    projections' output widths; ``causal`` overrides the module's ``is_causal``.
    """
    kids = dict(module.named_children())
    v = None
    for qn, kn, vn in _SPLIT_NAMES:
        if qn in kids and kn in kids and _out_features(kids[qn]) is not None:
            q, k, v, fused = kids[qn], kids[kn], kids.get(vn), None
            break
    else:
        fn = next((n for n in _FUSED if n in kids and _out_features(kids[n])), None)
        if fn is None:
            return None
        q = k = v = kids[fn]
        fused = _FUSED[fn]
    cfg = getattr(module, "config", None)
    srcs = [module] + ([cfg] if cfg is not None else [])
    n_heads = _first_int(srcs, ("num_heads", "num_attention_heads", "n_head", "n_heads"))
    head_dim = _first_int(srcs[:1], ("head_dim", "attention_head_size", "head_size", "d_head"))
    head_dim = head_dim or _first_int(srcs[1:], ("head_dim",))
    q_out = _out_features(q)
    if fused:
        if n_heads is None:
            return None
        if head_dim is None:
            width = _first_int(srcs, ("embed_dim", "hidden_size", "n_embd"))
            head_dim = (width or q_out // 3) // n_heads
        n_kv = _first_int(srcs, ("num_key_value_heads", "num_kv_heads", "n_kv_heads"))
        n_kv = n_kv or (q_out // head_dim - n_heads) // 2
        if fused == "per_head" and q_out != 3 * n_heads * head_dim:
            return None  # grouped / multi-query interleaved layouts (Falcon) are not handled
    else:
        if head_dim is None and n_heads is None:
            return None
        head_dim = head_dim or q_out // n_heads
        n_heads = q_out // head_dim
        n_kv = _out_features(k) // head_dim
    scale = getattr(module, "scaling", None)
    scale = scale if isinstance(scale, float | int) and scale > 0 else head_dim ** -0.5
    is_causal = bool(getattr(module, "is_causal", False)) if causal is None else causal
    qp, kp = kids.get("q_norm"), kids.get("k_norm")
    return AttentionSite(module, q, k, v, n_heads, n_kv, head_dim, float(scale), is_causal,
                         fused, qp if kp is not None else None, kp if qp is not None else None,
                         name)


def find_attention(block: nn.Module, causal: bool | None = None, prefix: str = ""):
    """The first submodule of ``block`` (itself included) that :func:`describe_attention`
    accepts, so self-attention wins over a later cross-attention; None if there is none."""
    for name, m in block.named_modules():
        site = describe_attention(m, f"{prefix}.{name}".strip("."), causal)
        if site is not None:
            return site
    return None


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``[(qualified name, block), ...]`` of the model's transformer blocks.

    Candidates are the ``nn.ModuleList`` containers whose children all share one class; ranked
    by (children contain an attention site, name ends with a known container — HF BERT
    ``encoder.layer``, GPT-2 ``h`` / ``transformer.h``, LLaMA/Qwen ``model.layers``, ``layers``,
    ``blocks`` ... —, length), first in module order on ties (so an encoder wins over its
    decoder). Raises ``ValueError`` when the model has no such list.
    """
    best, best_key = None, None
    for name, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) == 0 or len({type(c) for c in m}) != 1:
            continue
        known = any(name == s or name.endswith("." + s) for s in _KNOWN_BLOCKS)
        key = (find_attention(m[0]) is not None, known, len(m))
        if best_key is None or key > best_key:
            best, best_key = name, key
    if best is None:
        raise ValueError("no block list found: pass layers= (modules, names or a regex)")
    mods = dict(model.named_modules())
    return [(f"{best}.{i}".strip("."), c) for i, c in enumerate(mods[best])]


# --------------------------------------------------------------------------------------------
def _as_tensor(out):
    if torch.is_tensor(out):
        return out
    if isinstance(out, tuple | list):
        return next((o for o in out if torch.is_tensor(o)), None)
    return getattr(out, "last_hidden_state", None)


def _bound(module, args, kwargs) -> dict:
    try:
        b = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except TypeError:
        b = dict(kwargs)
    extra = b.pop("kwargs", None)
    return {**b, **extra} if isinstance(extra, dict) else b


def _heads(t: torch.Tensor, n: int, dh: int) -> torch.Tensor:
    """(..., T, n*dh) or (..., T, n, dh) -> (..., n, T, dh)."""
    if not (t.ndim >= 4 and tuple(t.shape[-2:]) == (n, dh)):
        t = t.unflatten(-1, (n, dh))
    return t.movedim(-2, -3)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF ``apply_rotary_pos_emb`` (rotate-half convention) on the first ``cos.shape[-1]`` dims."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((xr * cos + rotated * sin, rest), dim=-1)


class Probe:
    """Context manager recording per-layer hidden states and attention statistics.

    Parameters: ``layers`` — None (:func:`find_blocks`), a regex matched (``re.fullmatch``)
    against qualified module names, or a list of modules / names / ``(name, module)`` pairs;
    ``attention`` — ``"auto"`` (:func:`find_attention` in each block), None (no attention
    statistics), or a per-block list of :class:`AttentionSite` / attention modules / names /
    None; ``probs`` — ``"auto"`` (returned if available, else recomputed), ``"returned"``,
    ``"recomputed"``; ``causal`` overrides every site's causality; ``rope=False`` ignores
    ``(cos, sin)`` (to quantify the no-RoPE approximation); ``spectral`` adds ``gap``;
    ``dtype`` is the precision of the recomputation and of every statistic (float64 default).

    After the forward pass(es): ``hidden`` (L+1 tensors, layer 0 = embeddings),
    ``hidden_stats`` (L+1 dicts name -> tensor over the leading dims), ``attention_stats``
    (L dicts name -> tensor ``(..., H)``), ``probs`` (L tensors ``(..., H, T, Tk)`` or None),
    ``info`` (L dicts: site, source, rope, approximate). Several forward calls inside one
    ``with`` concatenate along the first (batch) dimension.
    """

    def __init__(self, model: nn.Module, layers=None, attention="auto", *, keep_probs=False,
                 keep_hidden=True, probs="auto", causal: bool | None = None, rope=True,
                 spectral=False, hidden_stats: Sequence[str] = HIDDEN_STATS,
                 dtype=torch.float64):
        if probs not in ("auto", "returned", "recomputed"):
            raise ValueError(f"probs must be auto, returned or recomputed (got {probs!r})")
        self.model, self.keep_probs, self.keep_hidden = model, keep_probs, keep_hidden
        self.probs_mode, self.rope, self.spectral, self.dtype = probs, rope, spectral, dtype
        self.hidden_stat_names = tuple(hidden_stats)
        self.blocks = self._resolve_layers(model, layers)
        self.sites = self._resolve_sites(attention, causal)
        self.model_has_rope = any("rotary" in type(m).__name__.lower() for m in model.modules())
        self._handles: list = []
        L = len(self.blocks)
        self._hid = [[] for _ in range(L + 1)]
        self._hst = [defaultdict(list) for _ in range(L + 1)]
        self._ast = [defaultdict(list) for _ in range(L)]
        self._pending = [{} for _ in range(L)]
        self.info = [{"site": s.name if s else None, "source": None, "rope": None,
                      "bias": None, "approximate": False} for s in self.sites]

    # ---- resolution ------------------------------------------------------------------------
    @staticmethod
    def _resolve_layers(model, layers):
        if layers is None:
            return find_blocks(model)
        named = dict(model.named_modules())
        if isinstance(layers, str):
            out = [(n, m) for n, m in named.items() if re.fullmatch(layers, n)]
            if not out:
                raise ValueError(f"no module name matches {layers!r}")
            return out
        by_id = {id(m): n for n, m in named.items()}
        return [it if isinstance(it, tuple) else (it, named[it]) if isinstance(it, str)
                else (by_id.get(id(it), ""), it) for it in layers]

    def _resolve_sites(self, attention, causal):
        if attention is None or attention is False:
            return [None] * len(self.blocks)
        if attention == "auto":
            return [find_attention(b, causal, n) for n, b in self.blocks]
        if len(attention) != len(self.blocks):
            raise ValueError("attention= needs one entry per block")
        named, sites = dict(self.model.named_modules()), []
        for a in attention:
            site = a
            if not (a is None or isinstance(a, AttentionSite)):
                mod, name = (named[a], a) if isinstance(a, str) else (a, "")
                if (site := describe_attention(mod, name, causal)) is None:
                    raise ValueError(f"no Q/K projections recognised in {name or mod!r}")
            sites.append(site)
        return sites

    # ---- hooks -----------------------------------------------------------------------------
    def __enter__(self):
        first = self.blocks[0][1]
        self._handles.append(first.register_forward_pre_hook(
            lambda m, a, kw: self._record_hidden(0, _as_tensor(list(a) + list(kw.values()))),
            with_kwargs=True))
        for i, (_, block) in enumerate(self.blocks):
            self._handles.append(block.register_forward_hook(
                lambda m, a, out, i=i: self._record_hidden(i + 1, _as_tensor(out))))
        for i, site in enumerate(self.sites):
            if site is not None:
                self._hook_site(i, site)
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def _hook_site(self, i, s: AttentionSite):
        pend = self._pending[i]

        def pre(m, args, kwargs):
            b = _bound(m, args, kwargs)
            pend.clear()
            pend["mask"] = b.get("attention_mask")
            pend["pos"] = b.get("position_embeddings")
            pend["bias"] = any(torch.is_tensor(b.get(n)) for n in ("alibi", "position_bias"))

        def grab(key):
            return lambda m, a, out: pend.__setitem__(key, out)

        H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim

        def grab_fused(m, a, out):
            if s.fused == "per_head":
                out = out.unflatten(-1, (H, 3 * dh))  # (..., T, H, dh) pieces
                pend["q"], pend["k"] = out[..., :dh], out[..., dh: 2 * dh]
            else:
                pend["q"], pend["k"] = out[..., : H * dh], out[..., H * dh: (H + Hkv) * dh]

        reg = self._handles.append
        reg(s.module.register_forward_pre_hook(pre, with_kwargs=True))
        if s.fused:
            reg(s.q.register_forward_hook(grab_fused))
        else:
            reg((s.q_post or s.q).register_forward_hook(grab("q")))
            reg((s.k_post or s.k).register_forward_hook(grab("k")))
        reg(s.module.register_forward_hook(lambda m, a, out: self._attention_done(i, s, out)))

    @torch.no_grad()
    def _record_hidden(self, layer, x):
        if x is None:
            return
        x = x.detach()
        if self.keep_hidden:
            self._hid[layer].append(x)
        xd = x.to(self.dtype)
        fns = {"cos": obs.mean_cos, "q": obs.mean_q, "stable_rank": obs.stable_rank}
        for name in self.hidden_stat_names:
            self._hst[layer][name].append(fns[name](xd).cpu())

    @torch.no_grad()
    def _attention_done(self, i, s: AttentionSite, out):
        pend, info = self._pending[i], self.info[i]
        ret = out[1] if isinstance(out, tuple | list) and len(out) > 1 else None
        ret = ret if torch.is_tensor(ret) and ret.ndim >= 3 else None
        use_returned = self.probs_mode == "returned" or (self.probs_mode == "auto"
                                                        and ret is not None)
        if use_returned and ret is None:
            raise RuntimeError(f"{s.name}: the module returned no attention probabilities")
        if not use_returned and ("q" not in pend or "k" not in pend):
            raise RuntimeError(f"{s.name}: Q/K projections were not called inside the module")
        if use_returned:
            A = ret.detach().to(self.dtype)
            allowed, _ = self._mask(s, pend.get("mask"), A.shape[-2], A.shape[-1], A.device)
            stats = self._stats(A, None, allowed)
            info.update(source="returned", rope=None, bias=None, approximate=False)
        else:
            stats = self._recompute(i, s, pend)
        for k, v in stats.items():
            self._ast[i][k].append(v.cpu())
        pend.clear()

    def _mask(self, s, mask, T, Tk, device):
        """(allowed bool (..., T, Tk) or None, additive finite bias or None)."""
        allowed, bias = None, None
        if s.causal:
            allowed = torch.ones(T, Tk, dtype=torch.bool, device=device).tril(Tk - T)
        if torch.is_tensor(mask) and mask.ndim >= 2:
            mask = mask[..., -T:, :Tk] if mask.shape[-2] >= T else mask[..., :Tk]
            if mask.dtype == torch.bool:
                vis = mask
            else:
                vis = mask > torch.finfo(mask.dtype).min / 2
                bias = mask.to(self.dtype).masked_fill(~vis, 0.0)
                bias = None if not bias.any() else bias
            allowed = vis if allowed is None else allowed & vis
        return allowed, bias

    def _stats(self, A, logp, allowed):
        out = {"ipr": obs.ipr(A), "ipr_cross": obs.ipr_cross(A), "wmax": obs.wmax(A)}
        keys = None if allowed is None else allowed.sum(-1)
        if logp is None:
            out["entropy"] = obs.entropy(A, n_keys=keys)
        else:
            h = obs.row_entropy_from_log_probs(logp, allowed)
            if keys is None:
                keys = torch.full(A.shape[-2:-1], A.shape[-1], device=A.device)
            out["entropy"] = obs.normalised_row_mean(h, keys)
        if self.spectral:
            out["gap"], out["s2_sqrtT"] = obs.gap(A)
        if self.keep_probs:
            out["_probs"] = A.float()
        return out

    def _recompute(self, i, s: AttentionSite, pend):
        q = _heads(pend["q"].detach().to(self.dtype), s.n_heads, s.head_dim)
        k = _heads(pend["k"].detach().to(self.dtype), s.n_kv_heads, s.head_dim)
        pos, rope = pend.get("pos"), "none"
        if self.rope and isinstance(pos, tuple | list) and len(pos) == 2:
            cos, sin = (t.detach().to(self.dtype).unsqueeze(-3) for t in pos)
            q, k, rope = _rope(q, cos, sin), _rope(k, cos, sin), "applied"
        elif self.model_has_rope:
            rope = "missing"
        if s.n_kv_heads != s.n_heads:
            k = k.repeat_interleave(s.n_heads // s.n_kv_heads, dim=-3)
        T, Tk = q.shape[-2], k.shape[-2]
        allowed, bias = self._mask(s, pend.get("mask"), T, Tk, q.device)
        lead = q[..., 0, 0, 0].numel()
        chunk = max(1, 2**24 // max(1, lead * T * Tk))
        parts = defaultdict(list)
        for h0 in range(0, s.n_heads, chunk):
            sc = q[..., h0:h0 + chunk, :, :] @ k[..., h0:h0 + chunk, :, :].transpose(-1, -2)
            sc = sc * s.scale
            if bias is not None:
                sc = sc + bias
            if allowed is not None:  # finfo.min as HF eager: a fully masked row stays finite
                sc = sc.masked_fill(~allowed, torch.finfo(sc.dtype).min)
            logp = torch.log_softmax(sc, dim=-1)
            for key, v in self._stats(logp.exp(), logp, allowed).items():
                parts[key].append(v)
        bias_missing = bool(pend.get("bias"))
        self.info[i].update(source="recomputed", rope=rope, bias="missing" if bias_missing
                            else None, approximate=rope == "missing" or bias_missing)
        return {key: torch.cat(v, dim=-3 if key == "_probs" else -1) for key, v in parts.items()}

    # ---- results ---------------------------------------------------------------------------
    @staticmethod
    def _cat(chunks):  # a list stays a list when calls had different sequence lengths
        same = chunks and len({c.shape[1:] for c in chunks}) == 1
        return torch.cat(chunks) if same else (chunks or None)

    @property
    def hidden(self):
        return [self._cat(c) for c in self._hid]

    @property
    def hidden_stats(self):
        return [{k: torch.cat(v) for k, v in d.items()} for d in self._hst]

    @property
    def attention_stats(self):
        return [{k: torch.cat(v) for k, v in d.items() if k != "_probs"} for d in self._ast]

    @property
    def probs(self):
        if not self.keep_probs:
            return None
        return [self._cat(d.get("_probs", [])) for d in self._ast]


def to_trajectory(probe_results, spec=None, source: str = "measured", per_head: bool = False):
    """Trajectory rows (``sigprop.trajectory.make``) from one :class:`Probe` or a list of them.

    Rows per layer: ``cos``, ``q``, ``stable_rank`` of the hidden states and, for attention
    layers, ``ipr``, ``ipr_cross``, ``entropy``, ``wmax`` (``gap`` with an extra column
    ``s2_sqrtT`` when measured). Attention statistics are averaged over heads within each
    sequence first. One probe (one initialisation): mean and ``stderr = std(ddof=1)/sqrt(n)``
    over its sequences (every leading dimension). A list of probes (one per seed): each seed's
    sequence mean is one sample, and the stderr is over seeds, since sequences that share
    weights are not independent draws of the initialisation (as ``measure.engine``). NaN stderr
    (JSON null) when there is one sample. ``per_head=True`` adds rows with a ``head`` column.
    """
    probes = [probe_results] if isinstance(probe_results, Probe) else list(probe_results)
    rows = []

    def add(layer, name, per_probe, **extra):
        v = per_probe[0] if len(per_probe) == 1 else torch.stack([x.nanmean() for x in per_probe])
        m, se = obs.summarise(v)
        rows.append(dict(layer=layer, observable=name, source=source, value=float(m),
                         stderr=float(se), **extra))

    for layer in range(len(probes[0]._hid)):
        for name in probes[0].hidden_stat_names:
            vals = [p.hidden_stats[layer][name].reshape(-1) for p in probes]
            if all(v.numel() for v in vals):
                add(layer, name, vals)
        st = [p.attention_stats[layer - 1] for p in probes] if layer else [{}]
        if not st[0]:
            continue
        H = st[0]["ipr"].shape[-1]
        for name in (*ATTENTION_STATS, "gap"):
            if name not in st[0]:
                continue
            extra = {}
            if name == "gap":
                s2 = torch.cat([d["s2_sqrtT"].reshape(-1) for d in st])
                extra["s2_sqrtT"] = float(s2.mean())
            add(layer, name, [d[name].reshape(-1, H).mean(-1) for d in st], **extra)
            if per_head:
                for h in range(H):
                    add(layer, name, [d[name].reshape(-1, H)[:, h] for d in st], head=h)
    return _traj.make(rows, spec)
