"""Forward hooks that record, beside a :class:`~sigprop.measurement.probe.Probe`, what the
diagnosis of a real model needs from its forward pass, and facts read off the probed model.

* :class:`InputGram`: the first block's input tokens, whose cosine matrices start the
  position-resolved theory of causal stacks (docs/theory.md §2.9);
* :class:`EncoderMemory`: the state of an encoder-decoder model's encoder output, the memory
  every cross-attention reads (:func:`merge_memory` averages it over draws);
* :func:`cross_probe`: a probe of the decoder blocks' cross-attention;
* :func:`rope_frequencies`, :func:`causal_seen`, :func:`position_bias`, :func:`has_qk_norm`:
  what the model and its attention sites show (RoPE, a causal mask, position biases,
  QK-norm), read before the probe lets the model go; :func:`probe_notes`: the layers whose
  attention statistics are missing or approximate.
"""

from __future__ import annotations

import numpy as np


class InputGram:
    """Forward pre-hook on the first block: the cosine matrix of its input tokens per
    sequence (the embeddings the theory starts from), averaged over draws. The inputs are
    kept and the matrices formed in :meth:`mean`, which only causal stacks call (~40 ms per
    draw of 2 x 512 tokens saved elsewhere). ``probe``: whose layout (batch-first or
    time-major) the inputs have."""

    def __init__(self, block, probe=None):
        self._xs: list = []
        self.probe = probe
        self.handle = block.register_forward_pre_hook(self._hook, with_kwargs=True)

    @property
    def xs(self) -> list:
        """The recorded inputs, batch-first ``(B, T, width)``."""
        if self.probe is not None and self.probe.time_major:
            return [x.transpose(0, 1) for x in self._xs]
        return self._xs

    def _hook(self, m, args, kwargs):
        from .probe import first_tensor

        x = first_tensor(list(args) + list(kwargs.values()))
        if x is None or x.ndim != 3 or self._xs and self._xs[0].shape[-2] != x.shape[-2]:
            return
        self._xs.append(x.detach().clone())

    def close(self):
        """Remove the hook (the recorded inputs stay)."""
        self.handle.remove()

    def mean(self):
        """The per-sequence token cosine matrices ``(B, T, T)`` averaged over the recorded
        calls (float64 NumPy), or None when nothing was recorded."""
        import torch

        if not self.xs:
            return None
        total = None
        with torch.no_grad():
            for x in self.xs:
                xd = x.double()
                xn = xd / xd.norm(dim=-1, keepdim=True).clamp_min(1e-300)
                c = (xn @ xn.transpose(-1, -2)).cpu().numpy()
                total = c if total is None else total + c
        return total / len(self.xs)


class EncoderMemory:
    """Forward hook on an encoder-decoder model's encoder: the state of its output (the
    memory every cross-attention reads): length, q and mean pairwise cosine, over draws. A
    model without ``get_encoder`` records nothing."""

    def __init__(self, model):
        self.rows: list[tuple[int, float, float]] = []
        enc = model.get_encoder() if hasattr(model, "get_encoder") else None
        self.handle = None if enc is None else enc.register_forward_hook(self._hook)

    def _hook(self, m, args, out):
        from . import observables as obs
        from .probe import first_tensor

        x = first_tensor(out)
        if x is not None:
            xd = x.detach().double()
            self.rows.append((int(xd.shape[-2]), float(obs.mean_q(xd).mean()),
                              float(obs.mean_cos(xd).mean())))

    def close(self):
        """Remove the hook (the recorded rows stay)."""
        if self.handle is not None:
            self.handle.remove()

    def state(self) -> dict | None:
        """``{memory_len, memory_q, memory_rho}`` over the recorded calls (the cosine clipped
        to [0, 1]), or None when nothing was recorded."""
        if not self.rows:
            return None
        return {"memory_len": self.rows[0][0],
                "memory_q": float(np.mean([r[1] for r in self.rows])),
                "memory_rho": float(np.clip(np.mean([r[2] for r in self.rows]), 0.0, 1.0))}


def merge_memory(memories: list[EncoderMemory]) -> dict | None:
    """The encoder output's state averaged over the draws' :class:`EncoderMemory` (the first
    draw's length), or None when none recorded anything."""
    states = [st for st in (m.state() for m in memories) if st is not None]
    if not states:
        return None
    return {"memory_len": states[0]["memory_len"],
            "memory_q": float(np.mean([s["memory_q"] for s in states])),
            "memory_rho": float(np.mean([s["memory_rho"] for s in states]))}


def cross_probe(probe):
    """A probe of the decoder blocks' cross-attention (the second attention module of each
    block of ``probe``), recording no hidden states; None where a block has none."""
    from .probe import Probe
    from .probe_sites import describe_attention

    sites = []
    for name, block in probe.blocks:
        found = [describe_attention(m, f"{name}.{n}", False) for n, m in block.named_modules()]
        found = [x for x in found if x is not None]
        if len(found) < 2:
            return None
        sites.append(found[1])
    return Probe(probe.model, layers=probe.blocks, attention=sites, keep_hidden=False,
                 hidden_stats=())


def rope_frequencies(model):
    """The model's RoPE frequencies (the ``inv_freq`` buffer of its rotary module, float64
    NumPy), or None."""
    import torch

    for m in model.modules():
        f = getattr(m, "inv_freq", None)
        if torch.is_tensor(f) and f.ndim == 1 and f.numel():
            return f.detach().double().cpu().numpy()
    return None


def causal_seen(probe) -> bool:
    """Every measured attention map hid all later keys (a causal mask given as an argument,
    CLIP's text encoder, BLOOM ...)."""
    seen = [i.get("causal") for i in probe.info if i.get("causal") is not None]
    return bool(seen) and all(seen)


def position_bias(probe) -> bool:
    """Some attention module takes a position bias for its logits (ALiBi, T5's relative bias,
    DeBERTa's relative positions)."""
    import inspect

    names = {"alibi", "position_bias", "relative_pos", "rel_embeddings"}
    for s in probe.sites:
        if s is None:
            continue
        try:
            params = inspect.signature(s.module.forward).parameters
        except (TypeError, ValueError):
            continue
        if names & set(params):
            return True
    return any(i.get("bias") == "missing" for i in probe.info)


def has_qk_norm(probe) -> bool:
    """Whether the probed attention normalises q and k per head (a ``q_norm``/``k_norm``
    pair after the projections) in most layers."""
    sites = [x for x in probe.sites if x is not None and not isinstance(x, str)]
    return bool(sites) and sum(x.q_post is not None for x in sites) * 2 > len(sites)


def probe_notes(probe, meas) -> list[str]:
    """Notes on layers whose attention statistics are missing or approximate."""
    n = len(probe.info)
    have = {int(x) for x in meas[meas.observable == "entropy"]["layer"]}
    out = []
    missing = [i for i in range(1, n + 1) if i not in have]
    if missing:
        why = ("no attention module with recognised Q/K projections"
               if all(probe.sites[(i - 1) // probe.repeats] is None for i in missing)
               else "the attention module did not run or returned nothing readable")
        out.append(f"attention statistics could not be read for layer(s) "
                   f"{', '.join(map(str, missing))} ({why}); their cos / q / stable rank are "
                   "measured")
    odd = [(i + 1, d["unreadable"]) for i, d in enumerate(probe.info) if d.get("unreadable")]
    if odd:
        out.append(f"attention statistics of layer(s) {', '.join(str(i) for i, _ in odd)} not "
                   f"read: the module's q / k or output are not in the layout read from it "
                   f"({odd[0][1]})")
    rope = [i + 1 for i, d in enumerate(probe.info) if d.get("rope") == "missing"]
    bias = [i + 1 for i, d in enumerate(probe.info) if d.get("bias") == "missing"]
    if rope:
        out.append(f"layer(s) {', '.join(map(str, rope))}: attention recomputed without RoPE "
                   "(the module gets no (cos, sin)); approximate")
    if bias:
        out.append(f"layer(s) {', '.join(map(str, bias))}: attention recomputed without its "
                   "ALiBi / relative position bias; approximate")
    return out
