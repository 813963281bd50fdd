"""In-step attention telemetry: per layer and head, on the batch the model is training on, the
largest logit (exact), and entropy, ipr, largest weight, sink share and score std from a few
sampled query rows -- cheap enough to leave on at every step.

    tel = AttentionTelemetry(model, rows=16)     # hooks stay on until tel.close()
    for step, batch in enumerate(loader):
        loss = model(**batch).loss               # the hooks read q and k of this forward
        loss.backward(); opt.step(); opt.zero_grad()
        stats = tel.end_step(step)               # {layer: {max_logit: (H,), entropy: ...}}

What it reads. The hooks are the probe's (:class:`~.probe.Probe`: blocks and attention sites
found in any ``nn.Module``, split / fused / per-head projections, grouped KV heads, RoPE from
the ``(cos, sin)`` the module receives, its mask argument), so the statistics follow the q and
k the attention itself used -- whichever kernel (eager, SDPA, flash) then ran on them. Nothing
is written back: q and k are detached and copied, the work runs under ``torch.no_grad`` and the
row sampling has its own generator (the training run's RNG is never drawn from), so the
training numerics are those of the run without telemetry (a test compares the losses).

What it computes, per attention call (a layer):

* ``max_logit``: the largest pre-softmax logit ``q.k x scale (+ bias)`` over every visible
  (query, key) pair of every sequence: exact. The logits are formed in chunks of query rows
  (at most :data:`CHUNK` entries at a time), reduced to their maximum and dropped: no ``T x
  T`` softmax is kept. This is what QK-Clip reads.
* on ``rows`` query rows per call, drawn uniformly without replacement (seeded by ``(seed,
  step, layer)``): the normalised ``entropy`` (row entropy over the log of its visible keys),
  ``ipr``, ``wmax``, ``sink`` (mass on the first key) and ``sigma_s`` (RMS of the row's logits
  over its visible keys, itself left out), each averaged over the sampled rows and the batch;
  ``entropy_se`` is the standard error of the entropy mean over those rows (std / sqrt(n),
  n = rows x sequences, with the finite-population correction ``sqrt((T - R) / (T - 1))``:
  zero when every row is read). Rows with fewer than two visible keys carry no entropy.
  ``keys``: the sampled rows' mean number of visible keys (the ``n`` of beta = sigma_s /
  sqrt(log n)).

Several forward calls in one step (gradient accumulation, activation checkpointing's
recomputation) are merged: the maximum of ``max_logit``, means of the rest. Forward calls
without gradients (evaluation between steps) are not read unless ``grad_only=False``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import nn

from ..spec import SpecError
from .probe import Probe
from .probe_recompute import softmax_stats
from .probe_sites import AttentionSite

__all__ = ["CHUNK", "STATS", "AttentionTelemetry"]

#: logits formed at a time for the exact maximum (float32: 8 MiB)
CHUNK = 2**21
#: what each layer reports per head
STATS = ("max_logit", "entropy", "entropy_se", "ipr", "wmax", "sink", "sigma_s", "keys")


class AttentionTelemetry(Probe):
    """Per-head attention statistics of every training forward (module docstring).

    ``rows``: sampled query rows per attention call (>= 1); ``every``: read the forward
    calls of every ``every``-th step only (step numbers as given to :meth:`end_step`; the
    hooks do nothing on the others); ``seed``: the row sampling's; ``dtype``: of the
    recomputed logits (float32 default: the maximum is exact to float32 rounding of the
    model's own q and k); ``grad_only``: read only forward calls made with gradients
    enabled. ``layers``: as :class:`~.probe.Probe`'s. A model in which no attention layer
    with Q/K projections is found is refused (SpecError, field ``model``)."""

    def __init__(self, model: nn.Module, *, rows: int = 16, every: int = 1, seed: int = 0,
                 dtype=torch.float32, grad_only: bool = True, layers=None, start: int = 0):
        for name, v, lo in (("rows", rows, 1), ("every", every, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise SpecError(name, f"must be an integer >= {lo} (got {v!r})")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SpecError("seed", f"must be an integer (got {seed!r})")
        try:
            super().__init__(model, layers=layers, keep_hidden=False, hidden_stats=(),
                             probs="recomputed", dtype=dtype)
        except ValueError as err:  # no block list, or layers= naming nothing
            raise SpecError("model", f"{type(model).__name__}: {err}") from None
        if not any(s is not None for s in self.sites):
            raise SpecError("model", f"{type(model).__name__}: no attention layer with Q/K "
                                     "projections found (the telemetry reads q and k where "
                                     "they are projected)")
        self.rows, self.every, self.seed, self.grad_only = rows, every, seed, grad_only
        self.step = int(start)
        self.active = self.step % every == 0
        self._now: dict[int, list[dict]] = defaultdict(list)
        self._handles = []
        self._attached = False
        self.__enter__()

    def __enter__(self):
        if not self._attached:  # hooks on from construction; `with` is optional
            super().__enter__()
            self._attached = True
        return self

    def __exit__(self, *exc):
        self._attached = False
        return super().__exit__(*exc)

    # ---- the probe's hooks, read differently -----------------------------------------------
    def _record_hidden(self, layer, x):  # hidden states are not read
        return

    def _reading(self) -> bool:
        return self.active and (torch.is_grad_enabled() or not self.grad_only)

    def _attention_done(self, i, s: AttentionSite, out):
        if not self._reading():
            self._pending[i].clear()
            return
        super()._attention_done(i, s, out)

    def _attention_stats(self, i, s: AttentionSite, out):
        pend = self._pending[i]
        if "q" not in pend or "k" not in pend:
            raise RuntimeError(f"{s.name}: Q/K projections were not called inside the module")
        with torch.no_grad():
            self._now[i].append(self._layer_stats(i, s, pend))
        pend.clear()

    def _layer_stats(self, i, s: AttentionSite, pend) -> dict[str, torch.Tensor]:
        q, k, rope = self._qk(s, pend)
        self.info[i].update(source="telemetry", rope=rope, approximate=rope == "missing")
        H, T, dh = s.n_heads, q.shape[-2], s.head_dim
        Tk = k.shape[-2]
        q = q.reshape(-1, H, T, dh) * s.scale
        k = k.reshape(-1, H, Tk, dh)
        N = q.shape[0]
        allowed, bias = self._mask(s, pend.get("mask"), T, Tk, q.device)

        def part(m, rows):  # a mask / bias broadcast to (N, H, len(rows), Tk)
            if m is None:
                return None
            m = torch.broadcast_to(m, (*m.shape[:-2], T, Tk))[..., rows, :]
            lead = m.shape[:-2]
            if len(lead) == 0:
                m = m[None, None]
            elif len(lead) == 1:  # (B, rows, Tk): one mask per sequence, every head
                m = m[:, None]
            else:
                m = m.reshape(-1, *m.shape[-3:])
            return torch.broadcast_to(m, (N, H, m.shape[-2], Tk))

        kt = k.transpose(-1, -2)
        # the exact maximum, query rows in chunks
        step = max(1, CHUNK // max(1, N * H * Tk))
        best = torch.full((N, H), -math.inf, dtype=q.dtype, device=q.device)
        for r0 in range(0, T, step):
            rows = slice(r0, min(T, r0 + step))
            sc = q[:, :, rows] @ kt
            b = part(bias, rows)
            if b is not None:
                sc = sc + b
            a = part(allowed, rows)
            if a is not None:
                sc = sc.masked_fill(~a, -math.inf)
            best = torch.maximum(best, sc.amax((-1, -2)))
        # the sampled rows
        g = torch.Generator().manual_seed(hash((self.seed, self.step, i)) % 2**62)
        R = min(self.rows, T)
        idx = torch.randperm(T, generator=g)[:R].sort().values.to(q.device)
        sc = q[:, :, idx] @ kt
        b, a = part(bias, idx), part(allowed, idx)
        if b is not None:
            sc = sc + b
        vis = torch.ones(N, H, R, Tk, dtype=torch.bool, device=q.device) if a is None else a
        if T == Tk:  # sigma_s leaves each row's own key out, as the probe's
            vis_s = vis.clone()
            vis_s[..., torch.arange(R, device=q.device), idx] = False
        else:
            vis_s = vis
        cnt = vis_s.sum(-1)
        sq = sc.masked_fill(~vis_s, 0.0).square().sum(-1)
        sigma = (sq.sum(-1) / cnt.sum(-1).clamp_min(1)).sqrt()  # (N, H)
        keys = vis.sum(-1)
        sc = sc.masked_fill(~vis, torch.finfo(sc.dtype).min)
        st, A = softmax_stats(sc, keys, want_probs=True)
        # per-row entropies for the standard error (softmax_stats gives the row mean)
        logA = torch.where(A > 0, A.log(), torch.zeros_like(A))
        h = -(A * logA).sum(-1) / torch.log(keys.clamp_min(2).to(A.dtype))
        h = h.masked_fill(keys < 2, math.nan)  # (N, H, R)
        hh = h.transpose(0, 1).reshape(H, -1)  # (H, N * R)
        n = (~hh.isnan()).sum(-1)
        mean = torch.nanmean(hh, -1)
        var = torch.nanmean((hh - mean[:, None]).square(), -1) * n / (n - 1).clamp_min(1)
        fpc = math.sqrt((T - R) / (T - 1)) if T > 1 else 0.0
        se = (var / n.clamp_min(1)).sqrt() * fpc
        return {"max_logit": best.amax(0), "entropy": mean, "entropy_se": se,
                "ipr": st["ipr"].mean(0), "wmax": st["wmax"].mean(0),
                "sink": A[..., 0].mean((0, -1)), "sigma_s": sigma.square().mean(0).sqrt(),
                "keys": keys.to(q.dtype).mean((0, -1))}

    # ---- steps -----------------------------------------------------------------------------
    def end_step(self, step: int | None = None) -> dict[int, dict[str, torch.Tensor]]:
        """The statistics of the forward calls since the last call (``{attention layer:
        {stat: (H,) float tensor}}``; empty on a step that was not read), and the hooks set
        for the next step (``step + 1``; ``step`` default: one after the last)."""
        step = self.step if step is None else int(step)
        out = {}
        for i, parts in sorted(self._now.items()):
            if not parts:
                continue
            merged = {"max_logit": torch.stack([p["max_logit"] for p in parts]).amax(0)}
            for key in STATS[1:]:
                merged[key] = torch.stack([p[key] for p in parts]).nanmean(0)
            out[i] = {k: v.float().cpu() for k, v in merged.items()}
        self._now.clear()
        self.step = step + 1
        self.active = self.step % self.every == 0
        return out

    def close(self) -> None:
        """Remove the hooks (the model is as it was)."""
        self.__exit__(None, None, None)

    @property
    def unreadable(self) -> dict[int, str]:
        """Attention layers whose q / k could not be read, and why."""
        return {i: d["unreadable"] for i, d in enumerate(self.info) if d.get("unreadable")}

    @property
    def attention_layers(self) -> list[int]:
        """The attention-layer indices the telemetry reads (blocks with an attention site)."""
        return [i for i, s in enumerate(self.sites) if s is not None]


def rows_of(stats: dict[int, dict[str, torch.Tensor]], step: int,
            observables: Sequence[str] = STATS) -> list[dict]:
    """Tidy rows (``step, layer, head, observable, value``) of one :meth:`end_step` result;
    non-finite values stay (the caller decides what an event is)."""
    out = []
    for layer, st in stats.items():
        for name in observables:
            if name in st:
                for h, v in enumerate(st[name].tolist()):
                    out.append(dict(step=step, layer=layer, head=h, observable=name, value=v))
    return out
