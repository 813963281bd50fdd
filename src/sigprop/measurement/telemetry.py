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
* on ``rows`` query rows of the first ``sequences`` (2) sequences of the batch, drawn
  uniformly without replacement (the same positions in each; seeded by ``(seed, step,
  layer)``: the step's seed mixed by :func:`~.stream_inputs.block_seed`): the normalised
  ``entropy`` (row entropy over the log of its visible keys),
  ``ipr``, ``wmax``, ``sink`` (mass on the first key) and ``sigma_s`` (RMS of the row's logits
  over its visible keys, itself left out), each averaged over the sampled rows;
  ``entropy_se`` is the standard error of the entropy mean over those rows (std / sqrt(n),
  n = rows x sequences, with the finite-population correction ``sqrt((T - R) / (T - 1))``:
  zero when every row is read). Rows with fewer than two visible keys carry no entropy.
  ``keys``: the sampled rows' mean number of visible keys (the ``n`` of beta = sigma_s /
  sqrt(log n)).

Cost. In the forward, per layer: the exact maximum (under a causal triangle alone, a chunk of
query rows reads only the keys its last row sees: 5/8 of the products at four chunks) and the
sampled rows' logits; at :meth:`end_step`, the sampled rows of every
layer (and call) of one shape are turned into statistics at once, so their dozen small
operations run once a step, not once a layer. Inside a training step a small operation costs
several times what it does alone (the model's kernels have evicted its code and data: 5-8x
measured on the 2-core machine), so the count of operations matters as much as the
products (one product of every row instead of four chunks at T 128 measured the same inside
the step, within the noise: 6.1-7.0% against 5.9-6.7% over two runs).
``sigprop bench monitor`` times it against the same step without.

Several forward calls in one step (gradient accumulation, activation checkpointing's
recomputation) are merged: the maximum of ``max_logit``, means of the rest. Forward calls
without gradients (evaluation between steps) are not read unless ``grad_only=False``.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..spec import SpecError
from .probe import MISREAD, Probe, misread
from .probe_sites import AttentionSite
from .stream_inputs import block_seed
from .telemetry_stats import SampledRows, statistics_of

__all__ = ["CHUNK", "STATS", "AttentionTelemetry"]

#: logits formed at a time for the exact maximum (float32: 8 MiB)
CHUNK = 2**21
#: what each layer reports per head
STATS = ("max_logit", "entropy", "entropy_se", "ipr", "wmax", "sink", "sigma_s", "keys")


class AttentionTelemetry(Probe):
    """Per-head attention statistics of every training forward (module docstring).

    ``rows``: sampled query rows per attention call (>= 1), in each of the first
    ``sequences`` sequences of the batch (the largest logit reads them all); ``every``: read
    the forward calls of every ``every``-th step only (step numbers as given to
    :meth:`end_step`; the hooks do nothing on the others); ``seed``: the row sampling's;
    ``dtype``: of the recomputed logits (float32 default: the maximum is exact to float32
    rounding of the model's own q and k); ``grad_only``: read only forward calls made with
    gradients enabled. ``layers``: as :class:`~.probe.Probe`'s (default: the blocks of every
    block list with attention, :func:`every_stack`; layer ``i`` is the ``i``-th of them). A
    model in which no attention layer with Q/K projections is found is refused (SpecError,
    field ``model``)."""

    def __init__(self, model: nn.Module, *, rows: int = 16, every: int = 1, seed: int = 0,
                 dtype=torch.float32, grad_only: bool = True, layers=None, start: int = 0,
                 sequences: int = 2, keep_inputs: bool = False):
        for name, v, lo in (("rows", rows, 1), ("every", every, 1), ("sequences", sequences, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise SpecError(name, f"must be an integer >= {lo} (got {v!r})")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SpecError("seed", f"must be an integer (got {seed!r})")
        try:
            super().__init__(model, layers=every_stack(model) if layers is None else layers,
                             keep_hidden=False, hidden_stats=(), probs="recomputed",
                             dtype=dtype)
        except ValueError as err:  # no block list, or layers= naming nothing
            raise SpecError("model", f"{type(model).__name__}: {err}") from None
        self._own = _own_attention(self.blocks, self.sites)
        self._iface = _interface_attention(self.blocks, self.sites, self._own)
        self._undo: list = []
        if not any(s is not None for s in self.sites) and not self._own and not self._iface:
            raise SpecError("model", f"{type(model).__name__}: no attention layer with Q/K "
                                     "projections found (the telemetry reads q and k where "
                                     "they are projected)")
        self.rows, self.every, self.seed, self.grad_only = rows, every, seed, grad_only
        self.sequences = sequences
        #: keep each read layer's Q/K projection inputs (and mask, RoPE) of the step, so
        #: :meth:`max_logit_now` can form its logits again with the weights as they are now
        self.keep_inputs = bool(keep_inputs)
        self._kept: dict[int, list[dict]] = defaultdict(list)
        self._replaying = False
        self._last_kept: dict[int, list[dict]] = {}
        self._inputs: dict = {}
        self._causal: dict = {}  # the additive causal triangle per (T, Tk, dtype, device)
        self._step_seed = (-1, 0)  # (step, its row-sampling seed)
        self._ran: set[int] = set()  # blocks that ran in the step's read forward calls
        self.step = int(start)
        self.active = self.step % every == 0
        self._now: dict[int, list[dict]] = defaultdict(list)
        #: the last :meth:`end_step` result
        self.last: dict[int, dict[str, torch.Tensor]] = {}
        self._attached = False
        self.__enter__()

    def __enter__(self):
        if not self._attached:  # hooks on from construction; `with` is optional
            super().__enter__()
            for i, att in self._own.items():
                self._hook_own(i, att)
            for i, (name, att) in self._iface.items():
                self._hook_interface(i, name, att)
            self._attached = True
        return self

    def _hook_interface(self, i: int, name: str, att: nn.Module) -> None:
        """A block whose attention sigprop finds no Q/K projections in, but whose module
        calls transformers' attention interface (multi-head latent attention, and any other
        module that forms q and k its own way): q and k are read as the interface receives
        them (:mod:`.interface_capture`: after RoPE, latent up-projections, norms), with the
        mask, the scale and the causal flag of that call."""
        from .interface_capture import attach

        def read(m, query, key, mask, kwargs):
            if not self._reading() or query.dim() != 4 or key.dim() != 4:
                return
            H, Hkv, dh = query.shape[1], key.shape[1], query.shape[-1]
            scale = kwargs.get("scaling")
            causal = bool(kwargs.get("is_causal", getattr(m, "is_causal", False)))
            site = _OwnSite(f"{name} (attention interface)", H, Hkv, dh,
                            float(dh ** -0.5 if scale is None else scale),
                            causal and mask is None and query.shape[-2] > 1)
            pend = {"q": query.detach().transpose(1, 2), "k": key.detach().transpose(1, 2),
                    "mask": mask, "roped": True}
            try:  # never an error inside the model's forward: the layer is noted instead
                with torch.no_grad():
                    self._now[i].append(self._layer_stats(i, site, pend))
            except MISREAD as e:
                self.info[i]["unreadable"] = f"{name}: {misread(e)}"

        undo = attach(att, read)
        if isinstance(undo, str):
            self.info[i]["unreadable"] = f"{name}: {undo}"
        else:
            self._undo.append(undo)

    def _hook_own(self, i: int, att) -> None:
        """sigprop's own stack (:class:`sigprop.nn.attention.BatchedAttention`: Q/K as weight
        tensors, no projection modules to hook): its input is kept on the way in and its q and
        k formed again from it after the call (``(S, B, H, T, d_H)`` for ``S`` stacked
        initialisations, read as ``S x B`` sequences); the score factor ``m(n) / sqrt(d_H)``
        is applied to q (per row where a length scaling makes it depend on the row)."""
        got: dict = {}

        def pre(m, args, kwargs):
            if self._wants():
                got["x"] = args[0] if args else kwargs.get("x")

        def post(m, args, out):
            x = got.pop("x", None)
            if x is None or not self._reading():
                return
            if self.keep_inputs:
                self._kept[i].append({"own": m, "x": x.detach()})
            with torch.no_grad():
                self._now[i].append(self._own_stats(i, m, x.detach()))

        self._handles.append(att.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(att.register_forward_hook(post))

    def _own_stats(self, i: int, m, x: torch.Tensor, max_only: bool = False):
        q, k = m.qk(x)  # (S, B, H, T, d_H), the score factor on q
        S, B, H, T, dh = q.shape
        site = _OwnSite(f"{self.blocks[i][0]} (sigprop)", H, H, dh, 1.0, bool(m.spec.causal))
        pend = {"q": q.reshape(S * B, H, T, dh).transpose(1, 2),
                "k": k.reshape(S * B, H, T, dh).transpose(1, 2)}
        return self._layer_stats(i, site, pend, groups=S, max_only=max_only)

    def _hook_site(self, i, s: AttentionSite):
        super()._hook_site(i, s)
        if not self.keep_inputs or s.q_post is not None or s.k_post is not None:
            return  # (q / k normalised after the projection: QK-Clip leaves those heads)

        def keep(role):
            def pre(m, args):
                if self._wants() and not self._replaying and args and torch.is_tensor(args[0]):
                    self._inputs[role] = args[0].detach()
            return pre

        self._handles.append(s.q.register_forward_pre_hook(keep("q")))
        if not s.fused:
            self._handles.append(s.k.register_forward_pre_hook(keep("k")))

    def __exit__(self, *exc):
        self._attached = False
        while self._undo:
            self._undo.pop()()
        return super().__exit__(*exc)

    # ---- the probe's hooks, read differently -----------------------------------------------
    def _record_hidden(self, layer, x):  # hidden states are not read: which blocks ran
        if layer > 0 and self._reading():
            self._ran.add(layer - 1)

    def _reading(self) -> bool:
        return self.active and (torch.is_grad_enabled() or not self.grad_only)

    def _wants(self) -> bool:  # the probe's hooks do nothing on the steps not read
        return self._replaying or self._reading()

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
        if self.keep_inputs and not self._replaying and self._inputs.get("q") is not None:
            self._kept[i].append({"site": s, "q_in": self._inputs.get("q"),
                                  "k_in": self._inputs.get("k"), "mask": pend.get("mask"),
                                  "pos": pend.get("pos"), "bias": pend.get("bias")})
        self._inputs = {}
        pend.clear()

    def _layer_stats(self, i, s: AttentionSite, pend, groups: int | None = None,
                     max_only: bool = False):
        """One attention call's reading. ``groups``: the batch is ``groups`` independent
        models' batches one after the other (sigprop's stacked initialisations); the rows are
        then sampled in the first ``sequences`` sequences of each group, and ``slice:<stat>``
        holds every statistic per group, ``(groups, H)`` (the per-head values are their
        maximum / mean over groups).

        Returns the exact per-map maxima and the sampled rows' logits (a
        :class:`~.telemetry_stats.SampledRows`); the statistics of those rows are formed at
        :meth:`end_step`, every layer's at once (:func:`~.telemetry_stats.sampled_stats` on
        the rows stacked), so that their many small operations run once a step rather than
        once a layer. ``max_only``: the largest logits alone,
        ``{"max_logit": (H,)[, "slice:max_logit": (groups, H)]}``."""
        q, k, rope = self._qk(s, pend)
        if pend.get("roped"):  # read at the attention interface: RoPE already in q and k
            rope = "applied" if self.model_has_rope else "none"
        self.info[i].update(source="telemetry", rope=rope, approximate=rope == "missing")
        H, T, dh = s.n_heads, q.shape[-2], s.head_dim
        Tk = k.shape[-2]
        lead = q.shape[:-3]
        q = q.reshape(-1, T, dh)  # (N * H, T, dh): batched matrix products
        kt = k.reshape(-1, Tk, dh).transpose(1, 2)
        NH, scale = q.shape[0], float(s.scale)
        mask = pend.get("mask")
        # the mask and any bias as one additive term, (T, Tk) or (N * H, T, Tk); a causal
        # triangle alone (or no mask) is built once per shape
        plain = mask is None
        key = (T, Tk, bool(s.causal), q.dtype, q.device) if plain else None
        if key is not None and key in self._causal:
            add = self._causal[key]
        else:
            allowed, bias = self._mask(s, mask, T, Tk, q.device,
                                       batch=math.prod(lead) if lead else None)
            add = None
            if allowed is not None:
                add = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(
                    ~allowed, -math.inf)
            if bias is not None:
                add = bias.to(q.dtype) if add is None else add + bias.to(q.dtype)
            if add is not None and add.dim() > 2:
                add = torch.broadcast_to(add, (*lead, H, T, Tk)).reshape(NH, T, Tk)
            if key is not None:
                self._causal[key] = add

        def logits(rows, maps=None, keys=slice(None)):  # scale x q.k + the mask
            qm, km = (q, kt) if maps is None else (q[maps], kt[maps])
            if add is None:
                return torch.bmm(qm[:, rows], km[..., keys]).mul_(scale)
            a = add[maps] if add.dim() > 2 and maps is not None else add
            return torch.baddbmm(a[..., rows, keys], qm[:, rows], km[..., keys], alpha=scale)

        # the exact maximum, query rows in chunks (no T x Tk map kept); under a causal
        # triangle alone a chunk of rows reads only the keys its last row sees (4 chunks at
        # least: 5/8 of the products)
        causal = plain and bool(s.causal)
        step = max(1, CHUNK // max(1, NH * Tk))
        if causal:
            step = min(step, max(16, -(-T // 4)))
        # (each chunk's maxima written into one buffer, reduced once: every operation here
        # runs per layer and step, and inside a training step a small one costs several
        # times what it does alone -- module docstring, "Cost")
        starts = range(0, T, step)
        bests = torch.empty((len(starts), NH), dtype=q.dtype, device=q.device)
        sc = None
        G = int(groups or 1)
        per = NH // H // G  # sequences per group
        for c, r0 in enumerate(starts):
            r1 = min(T, r0 + step)
            kend = min(Tk, r1 + Tk - T) if causal else Tk
            part = logits(slice(r0, r1), keys=slice(0, kend))
            torch.amax(part, (-1, -2), out=bests[c])
            if r0 == 0 and r1 == T and kend == Tk:
                sc = part
        best = bests[0] if len(starts) == 1 else bests.amax(0)
        if max_only:
            by = best.reshape(G, per, H).amax(1)
            return {"max_logit": by.amax(0), **({"slice:max_logit": by} if G > 1 else {})}
        idx = self._rows_of(i, T, q.device)
        ns = min(self.sequences, per)  # sampled sequences per group
        if G == 1:
            seqs = slice(0, ns * H)
        else:  # the first `ns` sequences of every group, every head: (G * ns * H,) maps
            first = (torch.arange(G)[:, None] * per + torch.arange(ns)[None, :]).reshape(-1)
            seqs = (first[:, None] * H + torch.arange(H)[None, :]).reshape(-1).to(q.device)
        # the sampled rows of the first `sequences` sequences, (G * ns * H, R, Tk) masked
        # -inf, taken from the one chunk when it holds every row
        sc = sc[seqs][:, idx] if sc is not None else logits(idx, seqs)
        return SampledRows(sc, idx, best, (T, Tk, G, ns, per, H))

    def _rows_of(self, i: int, T: int, device=None) -> torch.Tensor:
        """The sorted query rows layer ``i`` samples this step: ``rows`` of ``T`` drawn
        without replacement from a generator seeded by ``(seed, step, layer)`` (the step's
        seed mixed once by :func:`block_seed`, the layer added by an odd multiplier)."""
        if self._step_seed[0] != self.step:
            self._step_seed = (self.step, block_seed(self.seed & (2**64 - 1), self.step,
                                                     salt=101))
        # Python's generator, not torch's: one tensor made per layer instead of five small
        # operations (a generator, its seed, randperm, a slice, a sort)
        g = random.Random((self._step_seed[1] + 0x9E3779B1 * (i + 1)) % 2**32)
        return torch.tensor(sorted(g.sample(range(T), min(self.rows, T))), device=device)

    # ---- steps -----------------------------------------------------------------------------
    def end_step(self, step: int | None = None) -> dict[int, dict[str, torch.Tensor]]:
        """The statistics of the forward calls since the last call (``{attention layer:
        {stat: (H,) float tensor}}``; empty on a step that was not read), and the hooks set
        for the next step (``step + 1``; ``step`` default: one after the last)."""
        step = self.step if step is None else int(step)
        out = {}
        for i, parts in sorted(statistics_of(self._now).items()):
            merged = dict(parts[0])
            if len(parts) > 1:  # the per-head STATS (and the per-group ``slice:`` ones)
                for key in parts[0]:
                    v = torch.stack([p[key] for p in parts])
                    merged[key] = v.amax(0) if key.endswith("max_logit") else v.nanmean(0)
            out[i] = merged  # (float32, on the CPU: :func:`~.telemetry_stats.statistics_of`)
        for i in self._ran - set(out):  # a block ran, its attention was never read
            info = self.info[i] if i < len(self.info) else None
            if info is not None and i in self.attention_layers and not info.get("source") \
                    and not info.get("unreadable"):
                info["unreadable"] = ("the attention module found in the block was not called "
                                      "in the forward (the model replaced or bypassed it at "
                                      "run time)")
        self._ran.clear()
        self._now.clear()
        self.last = out
        self._last_kept = dict(self._kept)
        self._kept = defaultdict(list)
        self.step = step + 1
        self.active = self.step % self.every == 0
        return out

    @torch.no_grad()
    def max_logit_now(self) -> dict[int, dict[str, torch.Tensor]]:
        """The largest logit per head of the last read step's inputs formed again with the
        weights as they are now (after the optimizer step): ``{attention layer:
        {"max_logit": (H,)[, "slice:max_logit": (S, H)]}}``, the maximum over the step's
        forward calls. Needs ``keep_inputs=True``; each layer's Q/K projections run again on
        the inputs they received (the mask and RoPE as they were), so for layer 0 this is the
        exact largest logit the same batch would give now, and for deeper layers the one their
        step inputs give (their inputs also move with the earlier layers' update). Layers
        not kept (q / k normalised after the projection, or not read) are left out."""
        if not self.keep_inputs:
            raise SpecError("keep_inputs", "max_logit_now needs AttentionTelemetry(..., "
                                           "keep_inputs=True)")
        out: dict[int, dict[str, torch.Tensor]] = {}
        self._replaying = True
        try:
            for i, calls in self._last_kept.items():
                parts = []
                for c in calls:
                    if "own" in c:
                        parts.append(self._own_stats(i, c["own"], c["x"], max_only=True))
                        continue
                    s = c["site"]
                    pend = self._pending[self._layer(i)]
                    pend.clear()
                    pend.update(mask=c["mask"], pos=c["pos"], bias=c["bias"])
                    s.q(c["q_in"])  # the probe's hooks put this call's q (and k) in pend
                    if not s.fused:
                        s.k(c["k_in"])
                    if "q" in pend and "k" in pend:
                        parts.append(self._layer_stats(i, s, pend, max_only=True))
                    pend.clear()
                if parts:
                    out[i] = {k: torch.stack([p[k] for p in parts]).amax(0).float().cpu()
                              for k in ("max_logit", "slice:max_logit") if k in parts[0]}
        finally:
            self._replaying = False
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
        return [i for i, s in enumerate(self.sites)
                if s is not None or i in self._own or i in self._iface]


@dataclass
class _OwnSite:
    """What the statistics read of a site, for sigprop's own attention."""

    name: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scale: float
    causal: bool


def _own_attention(blocks, sites) -> dict[int, nn.Module]:
    """``{block index: BatchedAttention}`` of the blocks without an attention site that hold
    sigprop's own attention."""
    from ..nn.attention import BatchedAttention

    out = {}
    for i, ((_, block), site) in enumerate(zip(blocks, sites, strict=True)):
        if site is None and block is not None:
            att = next((m for m in block.modules() if isinstance(m, BatchedAttention)), None)
            if att is not None:
                out[i] = att
    return out


def _interface_attention(blocks, sites, own) -> dict[int, tuple[str, nn.Module]]:
    """``{block index: (qualified name, module)}`` of the blocks without an attention site or
    sigprop's own attention whose attention module calls transformers' attention interface
    (the first such module of the block)."""
    from .interface_capture import interface_modules

    out = {}
    for i, ((bname, block), site) in enumerate(zip(blocks, sites, strict=True)):
        if site is None and i not in own and block is not None:
            found = interface_modules(block)
            if found:
                out[i] = (f"{bname}.{found[0][0]}".strip("."), found[0][1])
    return out


def every_stack(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The blocks of every block list with attention, in module order (a multimodal model's
    vision tower and its language model, an encoder and its decoder: whichever the training
    forward runs); None where there is none (the probe then says why)."""
    from .interface_capture import interface_modules
    from .probe_sites import blocks_of, candidate_stacks, stack_has_attention

    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    mods = dict(model.named_modules())

    def attends(n):  # Q/K projections sigprop reads, or a module calling the interface
        return stack_has_attention(model, n) or any(
            interface_modules(b) for b in mods.get(n, ()))

    names = sorted((n for n in candidate_stacks(model) if attends(n)), key=order.get)
    out, seen = [], set()
    for n in names:
        if any(n.startswith(m + ".") for m in names if m != n):
            continue  # a list inside another list's block
        for qn, b in blocks_of(model, n):
            if id(b) not in seen:
                seen.add(id(b))
                out.append((qn, b))
    return out or None


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
