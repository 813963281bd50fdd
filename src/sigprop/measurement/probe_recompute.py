"""Attention probabilities recomputed from captured Q/K, and the per-head statistics of
probability maps: the part of :class:`~sigprop.measurement.probe.Probe` that works on attention
maps (a mixin reading the probe's settings ``dtype``, ``rope``, ``spectral``, ``keep_probs``,
``model_has_rope``, ``anatomy``, ``special_keys`` and writing ``info``).

``softmax(q k^T * scale + mask)``: grouped-query KV heads are repeated as HF ``repeat_kv``
does; mask: the module's ``attention_mask`` argument (bool or 0/1 integer "visible", or
additive float) and a causal triangle when its ``is_causal`` (or ``causal=``) holds.
``T x Tk`` maps are formed in chunks of heads and reduced at once.

RoPE: ``position_embeddings = (cos, sin)`` received by the attention module (HF LLaMA family,
GPT-NeoX) are applied in HF's ``rotate_half`` convention (partial rotary on the first
``cos.shape[-1]`` dims), making the recomputation exact. A model with a rotary module whose
attention gets no ``(cos, sin)`` is recomputed without RoPE and flagged (``info["rope"] ==
"missing"``, ``info["approximate"]``); so is an ``alibi`` / ``position_bias`` argument (BLOOM,
T5), which is not added (``info["bias"] == "missing"``).
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch

from . import anatomy_stats as anat
from . import observables as obs
from .probe_sites import AttentionSite
from .threads import cpu_settings, map_tasks


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


#: elements of one chunk of score maps: (chunk heads) x T x Tk; 2**19 float32 values (2 MiB,
#: with the exponentials beside them in the 2 x 1 MiB L2 of the development machine) made the
#: statistics of bert-base's 2 x 12 x 512 x 512 maps 25 ms per layer on one thread against
#: 31-65 ms for 2**21-2**23 (and 464 ms for the former float64 log-softmax path)
CHUNK = 2**19


#: the statistics run with torch's CPU pool at one thread (``cpu_settings(threads=1)``): on the
#: shared 2-core machine two OpenMP threads made a (2 x 512 x 512) chunk's reductions 10-40x
#: slower whenever another process held a core (the pool's barrier waits for a descheduled
#: thread); one thread is never slower than ~2x the best two-thread case


def _score_rms_gram(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Per head: the root mean square of the logits ``q.k * scale`` over pairs of distinct
    tokens, before any position bias -- the measured score std sigma_s (docs/theory.md §2.1:
    for inputs with q = 1 its expectation over the weights is sigma_s whatever the tokens'
    cosine). Unmasked maps only, without forming the scores: over all pairs,
    ``sum_ab (q_a.k_b)^2 = <Q^T Q, K^T K>_F`` (two d_head x d_head Gram matrices, O(T d_head^2)
    instead of O(T Tk d_head)), less the diagonal pairs ``sum_a (q_a.k_a)^2`` when T = Tk."""
    T, Tk = q.shape[-2], k.shape[-2]
    gq, gk = q.transpose(-1, -2) @ q, k.transpose(-1, -2) @ k
    total = (gq * gk).sum((-1, -2))
    n = T * Tk
    if T == Tk:
        total = total - (q * k).sum(-1).square().sum(-1)
        n = T * (T - 1)
    return (total.clamp_min(0.0) / max(n, 1)).sqrt() * abs(scale)


def softmax_stats(sc: torch.Tensor, keys: torch.Tensor | None, want_probs: bool = False,
                  extra=None) -> tuple[dict, torch.Tensor | None]:
    """``ipr, ipr_cross, wmax, entropy`` (per map: the leading dims of ``sc``) of
    ``softmax(sc)`` over its last dim, from the logits ``sc`` (..., T, Tk) whose masked entries
    hold the dtype's most negative finite value (they then get probability exactly 0, as in HF
    eager). ``sc`` is overwritten (``sc - rowmax``). ``keys``: visible keys per row
    (broadcastable to (..., T); None: Tk); rows with fewer than two keys are left out of the
    entropy. Also the probabilities when ``want_probs``. ``extra(mx, d, e, rz, ed)``, if
    given, adds its dict of statistics from the row maxima, ``d``, ``e``, ``1 / Z`` and
    ``sum_b e_ab d_ab`` below (it must leave ``e`` as it found it): the anatomy of
    :mod:`.anatomy_stats`.

    One exponential per entry, no logarithm of a probability: with ``m_a`` the row maximum,
    ``e = exp(z - m)`` and ``Z_a = sum_b e_ab``, the largest weight is ``1 / Z_a`` (e = 1 at
    the maximum), ``ipr_a = sum_b e_ab^2 / Z_a^2``, the entropy ``H_a = log Z_a - sum_b e_ab
    (z_ab - m_a) / Z_a`` (every term finite: a masked entry has e = 0), the column sums of
    ``A`` are ``(1/Z)^T e``; 7 passes over the map against ~25 for log-softmax, exp and the
    observables' functions. The entropy's cancellation at large logits is the only loss
    (float32 at |z| ~ 300: ~1e-5 nats); each row is clamped to [0, log n_a], the range its
    exact value lies in (tests/measurement/test_probe_precision.py compares with float64)."""
    T, Tk = sc.shape[-2], sc.shape[-1]
    mx = sc.amax(-1, keepdim=True)
    d = sc.sub_(mx)
    e = d.exp()
    rz = e.sum(-1).reciprocal()
    # a row's squared norm as vector_norm's square: vecdot(e, e) measured 4x slower (it
    # forms the elementwise product first)
    row_sq = torch.linalg.vector_norm(e, dim=-1).square_() * rz.square()
    ed = torch.linalg.vecdot(e, d)
    h = (ed.mul_(rz) if extra is None else ed * rz).neg_().sub_(rz.log())
    n = torch.full((), float(Tk), dtype=sc.dtype, device=sc.device) if keys is None \
        else torch.broadcast_to(keys.to(sc.dtype), h.shape)
    h = torch.minimum(h.clamp_min(0.0), torch.log(n.clamp_min(1.0)))
    col = (rz.unsqueeze(-2) @ e).squeeze(-2)
    if T > 1:
        cross = (col.square().sum(-1) - row_sq.sum(-1)) / (T * (T - 1))
    else:
        cross = torch.full(sc.shape[:-2], float("nan"), dtype=sc.dtype, device=sc.device)
    out = {"ipr": row_sq.mean(-1), "ipr_cross": cross, "wmax": rz.mean(-1),
           "entropy": obs.normalised_row_mean(h, n)}
    if extra is not None:
        out.update(extra(mx, d, e, rz, ed))
    return out, (e.mul_(rz.unsqueeze(-1)) if want_probs else None)


class RecomputeMixin:
    """Masks, statistics and recomputation of attention probabilities (methods of ``Probe``)."""

    def _mask(self, s, mask, T, Tk, device, batch: int | None = None):
        """(allowed bool (..., T, Tk) or None, additive finite bias or None). ``batch``: the
        sequences of the call; a 2-D mask of shape ``(batch, Tk)`` (with ``batch != T``) is
        then a per-sequence key mask as the tokenizer gives it (a module that receives the
        raw ``attention_mask``: YOSO, MRA), its 0 / 1 values visibility."""
        allowed, bias = None, None
        if s.causal:
            allowed = torch.ones(T, Tk, dtype=torch.bool, device=device).tril(Tk - T)
        if torch.is_tensor(mask) and mask.ndim == 2 and batch is not None and \
                tuple(mask.shape) == (batch, Tk) and batch != T:
            if not mask.dtype.is_floating_point or not bool(((mask != 0) & (mask != 1)).any()):
                vis = (mask != 0)[:, None, None, :]  # 0 / 1 (or bool): which keys are seen
                return (vis if allowed is None else allowed & vis), None
            mask = mask[:, None, None, :]  # additive, per sequence
        if torch.is_tensor(mask) and mask.ndim >= 2:
            mask = mask[..., -T:, :Tk] if mask.shape[-2] >= T else mask[..., :Tk]
            if mask.dtype == torch.bool:
                vis = mask
            elif not mask.dtype.is_floating_point:  # 0/1 integer mask (DeBERTa-v2)
                vis = mask != 0
            else:
                vis = mask > torch.finfo(mask.dtype).min / 2
                bias = mask.to(self.dtype).masked_fill(~vis, 0.0)
                bias = None if not bias.any() else bias
            allowed = vis if allowed is None else allowed & vis
        return allowed, bias

    def _stats(self, A, allowed, i=None, s=None):
        """Statistics of probability maps ``A`` (..., T, Tk) a module returned (with the
        anatomy of layer ``i``, site ``s`` when ``anatomy``)."""
        keys = None if allowed is None else allowed.sum(-1)
        with cpu_settings(threads=1):
            out = {"ipr": obs.ipr(A), "ipr_cross": obs.ipr_cross(A), "wmax": obs.wmax(A)}
            # the terms A log A, shared by the entropy and the anatomy
            alog = torch.xlogy(A, A) if self.anatomy and i is not None else None
            out["entropy"] = obs.entropy(A, n_keys=keys, alog=alog)
            if alog is not None:
                out.update(self._map_anatomy(i, s, A, allowed, alog))
            if self.spectral:
                out["gap"], out["s2_sqrtT"] = obs.gap(A)
        if self.keep_probs:
            out["_probs"] = A.float()
        return out

    def _anatomy_plan(self, i, s, allowed, lead, T, Tk, device):
        """The layer's :class:`~.anatomy_stats.AnatomyPlan` (None without ``anatomy``), the
        previous layer's when nothing it depends on changed (``special_keys`` and ``token_ids``:
        the same tensor objects, held by the cache, at the same in-place versions; keys of
        another kind are read again); its note goes to ``info[i]["anatomy"]``."""
        if not self.anatomy:
            return None
        causal = bool(s.causal or self.info[i].get("causal")) or anat.is_causal(allowed, T, Tk)
        sk, ids = self.special_keys, getattr(self, "token_ids", None)
        key = (getattr(sk, "_version", None), getattr(ids, "_version", None), tuple(lead), T,
               Tk, causal, str(device), self.dtype)
        cached = getattr(self, "_plan_cache", None)
        if cached is None or cached[0] is not sk or cached[1] is not ids or cached[2] != key \
                or not all(x is None or torch.is_tensor(x) for x in (sk, ids)):
            cached = self._plan_cache = (sk, ids, key, anat.plan(
                sk, lead, T, Tk, causal, device, self.dtype, token_ids=ids))
        self.info[i]["anatomy"] = cached[3].note
        return cached[3]

    def _map_anatomy(self, i, s, A, allowed, alog):
        """The anatomy statistics of returned maps ``A`` (*lead, H, T, Tk), ``alog`` their
        terms ``A log A``."""
        plan = self._anatomy_plan(i, s, allowed, A.shape[:-3], A.shape[-2], A.shape[-1],
                                  A.device)
        return anat.from_probs(A, allowed, plan, alog)

    def _qk(self, s: AttentionSite, pend) -> tuple[torch.Tensor, torch.Tensor, str]:
        """The captured q ``(..., H, T, d)`` and k ``(..., H, Tk, d)`` as attention uses them
        (in ``self.dtype``, detached): RoPE applied from the ``(cos, sin)`` the module
        received, grouped KV heads repeated, leading dims broadcast; and whether RoPE was
        ``applied``, ``missing`` (the model has a rotary module, the layer got no ``(cos,
        sin)``) or ``none``."""
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
        if q.shape[:-2] != k.shape[:-2]:  # leading dims broadcast, as q @ k^T would
            both = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
            q, k = q.expand(*both, *q.shape[-2:]), k.expand(*both, *k.shape[-2:])
        return q, k, rope

    def _recompute(self, i, s: AttentionSite, pend, scores_only: bool = False):
        """Statistics of ``softmax(q k^T scale + mask)`` from the captured q, k;
        ``scores_only``: just the per-head score RMS ``sigma_s`` (no softmax).

        The maps are formed :data:`CHUNK` entries at a time (a sequence's heads), on one CPU
        thread, each reduced at once by :func:`softmax_stats`; without a
        mask ``sigma_s`` comes from the Gram matrices (:func:`_score_rms_gram`)."""
        q, k, rope = self._qk(s, pend)
        T, Tk, H = q.shape[-2], k.shape[-2], s.n_heads
        lead = q.shape[:-3]
        allowed, bias = self._mask(s, pend.get("mask"), T, Tk, q.device)
        plan = (self.anatomy or None) if scores_only else self._anatomy_plan(
            i, s, allowed, lead, T, Tk, q.device)
        workers = max(1, torch.get_num_threads())  # the caller's threads, as workers
        with cpu_settings(threads=1):
            out = self._chunked(q.reshape(-1, H, T, s.head_dim),
                                k.reshape(-1, H, Tk, s.head_dim), s.scale, allowed, bias,
                                lead, scores_only, workers, plan)
        if scores_only:
            return out
        bias_missing = bool(pend.get("bias"))
        self.info[i].update(source="recomputed", rope=rope, bias="missing" if bias_missing
                            else None, approximate=rope == "missing" or bias_missing)
        return out

    def _chunked(self, q, k, scale, allowed, bias, lead, scores_only, workers: int = 1,
                 plan=None):
        """:meth:`_recompute` on q (N, H, T, dh), k (N, H, Tk, dh): per sequence and chunk of
        heads, the scores, ``sigma_s`` and (unless ``scores_only``) :func:`softmax_stats`,
        with the anatomy statistics of ``plan`` (``scores_only``: ``max_logit`` alone, for
        any ``plan`` but None);
        results reshaped to ``(*lead, H)`` (``_probs``: ``(*lead, H, T, Tk)``). On CPU the
        chunks are shared among ``workers`` threads, each running torch on one thread
        (bert-base, 2 x 12 x 512 x 512 per layer on the 2-core machine: ~1.7x faster than
        one thread; the order of the results does not depend on which worker ran what)."""
        N, H, T, _ = q.shape
        Tk = k.shape[-2]
        full = (N, H, T, Tk)

        def per_seq(m):  # a mask / bias broadcast to (*lead, H, T, Tk), as (N, H, T, Tk)
            return None if m is None else torch.broadcast_to(
                m, (*lead, H, T, Tk)).reshape(full)

        al, bi = per_seq(allowed), per_seq(bias)
        eye = ~torch.eye(T, dtype=torch.bool, device=q.device) if T == Tk else None
        keys = None if al is None else al.sum(-1)
        parts = defaultdict(list)
        if al is None:
            parts["sigma_s"].append(_score_rms_gram(q, k, scale).reshape(-1))
        step = max(1, CHUNK // max(1, T * Tk))
        want = self.spectral or self.keep_probs
        qs, kt = q * scale, k.transpose(-1, -2)
        tasks = [] if al is None and scores_only and plan is None else [
            (n, h0, min(H, h0 + step)) for n in range(N) for h0 in range(0, H, step)]

        def chunk(n, h0, h1):
            out = {}
            sc = qs[n, h0:h1] @ kt[n, h0:h1]
            if al is not None:  # sigma_s over visible pairs of distinct tokens
                kp = al[n, h0:h1] if eye is None else al[n, h0:h1] & eye
                sq = sc.masked_fill(~kp, 0.0)
                cnt = kp.sum((-1, -2)).clamp_min(1).to(sc.dtype)
                out["sigma_s"] = torch.linalg.vecdot(sq, sq).sum(-1).div(cnt).sqrt()
            if scores_only:
                if plan is not None:  # the logits as they enter the softmax
                    z = sc if bi is None else sc + bi[n, h0:h1]
                    out["max_logit"] = anat.max_logit(z, None if al is None else al[n, h0:h1])
                return out
            if bi is not None:
                sc = sc + bi[n, h0:h1]
            if al is not None:  # finfo.min as HF eager: a fully masked row stays finite
                sc = sc.masked_fill(~al[n, h0:h1], torch.finfo(sc.dtype).min)
            kn = None if keys is None else keys[n, h0:h1]
            extra = None if plan is None else functools.partial(
                anat.from_logits, keys=kn, allowed=None if al is None else al[n, h0:h1],
                plan_=plan, n=n)
            stats, A = softmax_stats(sc, kn, want, extra)
            if self.spectral:
                stats["gap"], stats["s2_sqrtT"] = obs.gap(A)
            if self.keep_probs:
                stats["_probs"] = A.float()
            out.update(stats)
            return out

        # chunks on single-threaded workers (a GPU takes them one after another)
        done = map_tasks(chunk, tasks, workers if q.device.type == "cpu" else 1)
        for got in done:
            for key, v in got.items():
                parts[key].append(v)
        # chunks run sequence-major, heads within: concatenated they are (N * H, ...)
        return {key: torch.cat(v).reshape(*lead, H, *v[0].shape[1:])
                for key, v in parts.items()}
