"""Forward-hook probe for any ``nn.Module`` (HF models included): docs/theory.md §1 observables per
layer.

    with Probe(model) as p:        # blocks and attention sites found automatically
        model(**inputs)
    traj = to_trajectory(p)        # Trajectory rows, mean ± stderr over sequences (or seeds)

Layer 0 is the input of the first block (embeddings), layer ``l`` the output of block ``l`` and
where block ``l``'s attention statistics go, as in ``theory.depth.propagate``. Attention
probabilities (``p.info[i]["source"]``) are ``returned`` when the attention module outputs them
after its output (HF eager attention, second; transformers 5 does so even without
``output_attentions``; a returned tensor counts only if its rows are probabilities), else
``recomputed`` as ``softmax(q k^T * scale + mask)`` from hooked Q/K projections. Which modules
are blocks and which own Q/K (split, fused ``[q | k | v]`` or per-head interleaved projections;
head counts, scale): :mod:`.probe_sites`. The recomputation (masks, grouped-query KV, RoPE, and
what is flagged ``info["approximate"]``): :mod:`.probe_recompute`. Neither reproduced nor
flagged: logit soft-capping (Gemma 2), sliding windows that exist only inside a kernel.

``T x Tk`` maps are formed transiently (chunks of heads) and reduced to per-head ``ipr,
ipr_cross, entropy, wmax`` (``gap``, ``s2_sqrtT`` with ``spectral=True``; with
``anatomy=True`` where each head's mass goes, :mod:`.anatomy_stats`); ``keep_probs=True``
keeps them. Padding query rows count in the statistics (padded keys do not): measure unpadded
batches. The probe never changes ``model.training``: call ``model.eval()`` first.
"""

from __future__ import annotations

import inspect
import re
import weakref
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import nn

from .. import trajectory as _traj
from . import observables as obs
from .anatomy_stats import ANATOMY_STATS
from .handles import HookHandles
from .probe_recompute import RecomputeMixin
from .probe_sites import (
    AttentionSite,
    describe_attention,
    find_attention,
    find_blocks,
)
from .threads import cpu_settings

__all__ = ["AttentionSite", "describe_attention", "find_attention", "find_blocks", "Probe",
           "to_trajectory"]

ATTENTION_STATS = ("ipr", "ipr_cross", "entropy", "wmax")
HIDDEN_STATS = ("cos", "q", "stable_rank")


# --------------------------------------------------------------------------------------------
def first_tensor(out):
    if torch.is_tensor(out):
        return out
    if isinstance(out, tuple | list):
        return next((o for o in out if torch.is_tensor(o)), None)
    return getattr(out, "last_hidden_state", None)


def _returned_probs(out):
    """The attention probabilities an attention module returned: the first tensor after
    the output (second place in HF eager attention) that is a probability map (rows >= 0
    summing to 1), so that another tensor there is never read as one (T5 returns its
    ``position_bias`` second and the probabilities third); None if there is none."""
    if not isinstance(out, tuple | list):
        return None
    for t in out[1:]:
        if torch.is_tensor(t) and t.ndim >= 3 and t.is_floating_point() and t.numel():
            rows = t.detach().float().sum(-1)  # bf16 maps sum to 1 within ~1e-2
            if bool((t >= 0).all()) and bool(torch.allclose(rows, torch.ones_like(rows),
                                                            atol=2e-2)):
                return t
    return None


#: the forward signatures read so far, by the function a module's forward runs (weak keys:
#: a function that goes takes its entry with it)
_SIGNATURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(module) -> inspect.Signature:
    """``inspect.signature(module.forward)``, read once per forward function (the hooks run it
    at every call of every attention module)."""
    fwd = module.forward
    key = getattr(fwd, "__func__", fwd)
    try:
        sig = _SIGNATURES.get(key)
        if sig is None:
            sig = _SIGNATURES[key] = inspect.signature(fwd)
        return sig
    except TypeError:  # a callable that takes no weak reference: read it each time
        return inspect.signature(fwd)


def _bound(module, args, kwargs) -> dict:
    try:
        b = _signature(module).bind_partial(*args, **kwargs).arguments
    except TypeError:
        b = dict(kwargs)
    extra = b.pop("kwargs", None)
    return {**b, **extra} if isinstance(extra, dict) else b


def _heads_third_last(A: torch.Tensor, H: int) -> torch.Tensor:
    """Returned maps ``(B, H, T, Tk)``; maps with more axes (windowed attention: Hiera's
    ``(B, H, windows, T, Tk)``) get their heads axis moved third from last and the others
    folded into the batch. A layout without an axis of ``H`` raises (the layer is then noted
    unreadable)."""
    if A.ndim <= 4:
        return A
    ax = next((i for i in range(1, A.ndim - 2) if A.shape[i] == H), None)
    if ax is None:
        raise RuntimeError(f"returned maps {tuple(A.shape)} have no axis of {H} heads")
    A = A.movedim(ax, -3)
    return A.reshape(-1, *A.shape[-3:])


class Probe(RecomputeMixin, HookHandles):
    """Context manager recording per-layer hidden states and attention statistics.

    Parameters: ``layers`` — None (:func:`find_blocks`), a regex matched (``re.fullmatch``)
    against qualified module names, or a list of modules / names / ``(name, module)`` pairs;
    ``attention`` — ``"auto"`` (:func:`find_attention` in each block), None (no attention
    statistics), or a per-block list of :class:`AttentionSite` / attention modules / names /
    None; ``probs`` — ``"auto"`` (returned if available, else recomputed), ``"returned"``,
    ``"recomputed"``; ``causal`` overrides every site's causality; ``rope=False`` ignores
    ``(cos, sin)`` (to quantify the no-RoPE approximation); ``spectral`` adds ``gap``;
    ``dtype`` is the precision of the recomputation and of every statistic (float64 default);
    ``repeats``: each block is applied this many times in a row per forward pass (weight
    sharing, ALBERT), and every application is one layer (``len(blocks) * repeats`` layers).
    ``anatomy=True`` adds per head ``sink, special, prev, self, next, content_mass,
    content_entropy, top_key, copy, induction, max_logit`` (:mod:`.anatomy_stats`; what a
    layer's maps leave out is said in ``info[i]["anatomy"]``); ``special_keys``: bool
    ``(B, Tk)`` (or ``(Tk,)``) of the keys [CLS] / [SEP] / BOS sit on, read at each forward
    call (set ``probe.special_keys`` between calls of different inputs); None: ``special`` is
    not recorded. ``token_ids``: the input ids ``(B, T)`` (or ``(T,)``), read the same way;
    None: ``copy`` and ``induction`` are not recorded.

    After the forward pass(es): ``hidden`` (L+1 tensors, layer 0 = embeddings),
    ``hidden_stats`` (L+1 dicts name -> tensor over the leading dims), ``attention_stats``
    (L dicts name -> tensor ``(..., H)``), ``probs`` (L tensors ``(..., H, T, Tk)`` or None),
    ``info`` (L dicts: site, source, rope, approximate). Several forward calls inside one
    ``with`` concatenate along the first (batch) dimension.
    """

    def __init__(self, model: nn.Module, layers=None, attention="auto", *, keep_probs=False,
                 keep_hidden=True, probs="auto", causal: bool | None = None, rope=True,
                 spectral=False, hidden_stats: Sequence[str] = HIDDEN_STATS,
                 dtype=torch.float64, repeats: int = 1, batch: int | None = None,
                 anatomy: bool = False, special_keys=None, token_ids=None):
        if probs not in ("auto", "returned", "recomputed"):
            raise ValueError(f"probs must be auto, returned or recomputed (got {probs!r})")
        if special_keys is not None and not anatomy:
            raise ValueError("special_keys are read only with anatomy=True")
        if token_ids is not None and not anatomy:
            raise ValueError("token_ids are read only with anatomy=True")
        self.anatomy, self.special_keys = bool(anatomy), special_keys
        self.token_ids = token_ids
        self.model, self.keep_probs, self.keep_hidden = model, keep_probs, keep_hidden
        self.probs_mode, self.rope, self.spectral, self.dtype = probs, rope, spectral, dtype
        self.hidden_stat_names = tuple(hidden_stats)
        self.blocks = self._resolve_layers(model, layers)
        self.sites = self._resolve_sites(attention, causal)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be a positive integer (got {repeats!r})")
        self.repeats = repeats
        self.batch, self.time_major = batch, False
        self._calls = [0] * len(self.blocks)
        self.model_has_rope = any("rotary" in type(m).__name__.lower() for m in model.modules())
        self._handles: list = []
        L = len(self.blocks) * repeats
        self._hid = [[] for _ in range(L + 1)]
        self._hst = [defaultdict(list) for _ in range(L + 1)]
        self._ast = [defaultdict(list) for _ in range(L)]
        self._pending = [{} for _ in range(L)]
        self.info = [{"site": s.name if s else None, "source": None, "rope": None,
                      "bias": None, "approximate": False, "causal": None}
                     for s in self.sites for _ in range(repeats)]

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

        def first_in(m, a, kw):
            if self._calls[0] % self.repeats == 0:  # a shared block: its first application
                x = first_tensor(list(a) + list(kw.values()))
                B = self.batch  # (tokens, batch, width) states: FSMT, XLNet, fairseq ports
                if torch.is_tensor(x) and x.dim() == 3 and B and x.shape[1] == B != x.shape[0]:
                    self.time_major = True
                self._record_hidden(0, x)

        def block_out(i, out):
            self._record_hidden(self._layer(i) + 1, first_tensor(out))
            self._calls[i] += 1

        self._handles.append(first.register_forward_pre_hook(first_in, with_kwargs=True))
        for i, (_, block) in enumerate(self.blocks):
            self._handles.append(block.register_forward_hook(
                lambda m, a, out, i=i: block_out(i, out)))
        for i, site in enumerate(self.sites):
            if site is not None:
                self._hook_site(i, site)
        return self

    def _layer(self, i):
        """Layer index (0-based) of block ``i``'s current application: ``i * repeats`` plus
        the calls seen so far (ALBERT applies each shared group ``repeats`` times in a row)."""
        return i * self.repeats + self._calls[i] % self.repeats

    def _hook_site(self, i, s: AttentionSite):
        pends = self._pending

        def pre(m, args, kwargs):
            if not self._wants():
                return
            try:
                b = _bound(m, args, kwargs)
            except (TypeError, ValueError):  # a signature we cannot bind: no mask, no RoPE
                b = {}
            pend = pends[self._layer(i)]
            pend.clear()
            pend["mask"] = b.get("attention_mask")
            pend["pos"] = b.get("position_embeddings")
            pend["bias"] = any(torch.is_tensor(b.get(n)) for n in ("alibi", "position_bias"))

        H, Hkv, dh = s.n_heads, s.n_kv_heads, s.head_dim

        def grab(key, n):
            def hook(m, a, out):
                if not self._wants():
                    return
                out = self._batch_first(_first_of(out))
                x = a[0] if a and torch.is_tensor(a[0]) else None
                if torch.is_tensor(out) and out.ndim == 4 and x is not None and x.ndim >= 2:
                    T = x.shape[-2]  # a projection that returns heads first, (B, n, T, dh)
                    if T != n and tuple(out.shape[-3:]) == (n, T, dh):  # (Inkling 2)
                        out = out.transpose(-2, -3)
                pends[self._layer(i)][key] = out
            return hook

        def grab_fused(m, a, out):
            if not self._wants():
                return
            pend, out = pends[self._layer(i)], self._batch_first(_first_of(out))
            if not torch.is_tensor(out) or out.shape[-1] < (H + 2 * Hkv) * dh:
                return  # not the layout read from the module: the layer is noted unreadable
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
            reg((s.q_post or s.q).register_forward_hook(grab("q", H)))
            reg((s.k_post or s.k).register_forward_hook(grab("k", Hkv)))
        reg(s.module.register_forward_hook(
            lambda m, a, out: self._attention_done(self._layer(i), s, out)))

    def _wants(self) -> bool:
        """Whether the hooks read this forward call (always, for the probe; a subclass may
        say no -- the in-step telemetry on the steps it skips -- and the hooks then cost a
        call)."""
        return True

    def _batch_first(self, t):
        """``t`` with its batch axis first: in a time-major model (``(tokens, batch, width)``
        at the first block's input) a tensor laid out that way is transposed; one the module
        has already made batch-first is left as it is."""
        B = self.batch
        if self.time_major and torch.is_tensor(t) and t.dim() >= 3 and t.shape[1] == B != \
                t.shape[0]:
            return t.transpose(0, 1)
        return t

    @torch.no_grad()
    def _record_hidden(self, layer, x):
        if x is None:
            return
        x = self._batch_first(x.detach())
        if x.dim() == 2:  # (tokens, d): a vision tower over flattened patches, one sequence
            x = x.unsqueeze(0)
        if self.keep_hidden:
            self._hid[layer].append(x)
        xd = x.to(self.dtype)
        fns = {"cos": obs.mean_cos, "q": obs.mean_q,
               "stable_rank": lambda t: obs.stable_rank(t, lanczos=True)}
        with cpu_settings(threads=1):  # small reductions: threads only cost
            for name in self.hidden_stat_names:
                if name != "stable_rank":
                    self._hst[layer][name].append(fns[name](xd).cpu())
        if "stable_rank" in self.hidden_stat_names:  # its Gram on every thread (its LAPACK
            self._hst[layer]["stable_rank"].append(fns["stable_rank"](xd).cpu())  # on one)

    @torch.no_grad()
    def _attention_done(self, i, s: AttentionSite, out):
        """The layer's statistics; a layout this probe misread (q / k of another shape, a
        module returning something else) leaves the layer without attention statistics and
        its reason in ``info[i]["unreadable"]``, never an error inside the model's forward."""
        try:
            self._attention_stats(i, s, out)
        except MISREAD as e:
            self.info[i]["unreadable"] = misread(e)
            self._pending[i].clear()

    def _attention_stats(self, i, s: AttentionSite, out):
        pend, info = self._pending[i], self.info[i]
        ret = _returned_probs(out)
        use_returned = self.probs_mode == "returned" or (self.probs_mode == "auto"
                                                        and ret is not None)
        if use_returned and ret is None:
            raise RuntimeError(f"{s.name}: the module returned no attention probabilities")
        if not use_returned and ("q" not in pend or "k" not in pend):
            raise RuntimeError(f"{s.name}: Q/K projections were not called inside the module")
        if use_returned:
            A = _heads_third_last(ret.detach().to(self.dtype), s.n_heads)
            allowed, _ = self._mask(s, pend.get("mask"), A.shape[-2], A.shape[-1], A.device)
            if info.get("causal") is None and A.shape[-1] == A.shape[-2] > 1:
                T = A.shape[-1]
                upper = torch.ones(T, T, dtype=torch.bool, device=A.device).triu(1)
                info["causal"] = bool(A.masked_select(upper).abs().max() == 0)
            stats = self._stats(A, allowed, i, s)
            info.update(source="returned", rope=None, bias=None, approximate=False)
            if "q" in pend and "k" in pend:  # the score std (and max_logit), same q and k
                try:
                    stats.update(self._recompute(i, s, pend, scores_only=True))
                except (RuntimeError, ValueError):  # q / k of a layout we cannot split
                    pass
        else:
            stats = self._recompute(i, s, pend)
        for k, v in stats.items():
            self._ast[i][k].append(v.cpu())
        pend.clear()

    def release(self) -> Probe:
        """Drop the references to the model (its modules), keeping every statistic, so that a
        list of probes over many draws does not keep every draw's model alive. ``blocks`` keep
        their names and ``sites`` their names (None where a block had no attention site)."""
        self.model = None
        self.blocks = [(n, None) for n, _ in self.blocks]
        self.sites = [None if st is None else st.name or "site" for st in self.sites]
        return self

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
    ``s2_sqrtT`` when measured; ``sigma_s`` and the anatomy statistics where recorded).
    Attention statistics are averaged over heads within each sequence first. One probe (one
    initialisation): mean and ``stderr = std(ddof=1)/sqrt(n)`` over its sequences (every
    leading dimension). A list of probes (one per seed): each seed's
    sequence mean is one sample, and the stderr is over seeds, since sequences that share
    weights are not independent draws of the initialisation (as ``measure.engine``). NaN stderr
    (JSON null) when there is one sample. ``per_head=True`` adds rows with a ``head`` column.
    """
    probes = [probe_results] if isinstance(probe_results, Probe) else list(probe_results)
    rows = []

    def add(layer, name, per_probe, **extra):
        v = per_probe[0] if len(per_probe) == 1 else torch.stack([x.nanmean() for x in per_probe])
        m, se = obs.summarise(v)
        if name in ANATOMY_STATS and not torch.isfinite(torch.as_tensor(float(m))):
            return  # undefined here (no row with two content keys, T = 2): no row, no NaN
        rows.append(dict(layer=layer, observable=name, source=source, value=float(m),
                         stderr=float(se), **extra))

    for layer in range(len(probes[0]._hid)):
        for name in probes[0].hidden_stat_names:
            if any(name not in p.hidden_stats[layer] for p in probes):
                continue  # a block whose output is not (B, T, d) hidden states
            vals = [p.hidden_stats[layer][name].reshape(-1) for p in probes]
            if all(v.numel() for v in vals):
                add(layer, name, vals)
        st = [p.attention_stats[layer - 1] for p in probes] if layer else [{}]
        if not st[0]:
            continue
        H = st[0]["ipr"].shape[-1]
        for name in (*ATTENTION_STATS, "sigma_s", "gap", *ANATOMY_STATS):
            if name not in st[0] or any(name not in d or d[name].numel() % H for d in st):
                continue  # absent, or of another layout than the maps' heads
            extra = {}
            if name == "gap":
                s2 = torch.cat([d["s2_sqrtT"].reshape(-1) for d in st])
                extra["s2_sqrtT"] = float(s2.mean())
            # a head where an anatomy statistic is undefined (NaN) leaves the layer's average
            mean = torch.nanmean if name in ANATOMY_STATS else torch.mean
            add(layer, name, [mean(d[name].reshape(-1, H), -1) for d in st], **extra)
            if per_head:
                for h in range(H):
                    add(layer, name, [d[name].reshape(-1, H)[:, h] for d in st], head=h)
    return _traj.make(rows, spec)


def _first_of(out):
    """A projection's output tensor: the first element where the layer returns a tuple (a
    quantised linear layer's ``(output, scaling factor)``, I-BERT), else ``out``."""
    if isinstance(out, tuple | list) and out and torch.is_tensor(out[0]):
        return out[0]
    return out


#: what reading a layer it misread raises (never let out of the model's forward)
MISREAD = (RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError)


def misread(e: BaseException) -> str:
    """A misread layer's reason in one line: the error's type and first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}" if str(e) else \
        type(e).__name__
