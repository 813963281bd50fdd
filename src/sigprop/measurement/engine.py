"""Measure an ArchSpec's torch model at initialisation, S seeds x B sequences at once.

The seeds are a batch dimension of :class:`sigprop.nn.model.SigpropTransformer` (stacked
weights, batched matmuls), so one forward pass measures every initialisation. Each observable
is averaged over the B sequences of a seed, then the mean and standard error are taken over
the S seed means (sequences of one seed share weights, so they are not independent samples;
with S = 1 the error is over sequences instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..spec import ArchSpec, SpecError
from . import inputs as _inputs
from . import observables as obs

STAT_NAMES = ("ipr", "ipr_cross", "entropy", "wmax")


@dataclass
class Measurement:
    """Measured Trajectory plus what the theory needs to sit beside it."""

    trajectory: object  # pandas DataFrame (Trajectory)
    rho0: float  # measured mean cosine of the layer-0 tokens
    seconds: float
    info: dict = field(default_factory=dict)


def _seed_stats(v: torch.Tensor) -> tuple[float, float]:
    """(mean, stderr) of an (S, B) sample: per-seed means, then across seeds."""
    v = v.detach().double()
    per_seed = v.mean(dim=1) if v.shape[0] > 1 else v[0]
    n = per_seed.numel()
    mean = float(per_seed.mean())
    err = float(per_seed.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.nan
    return mean, err


def make_inputs(spec: ArchSpec, kind: str, sequences: int, *, rho0: float | None, seed: int):
    """(inputs, vocab_size or None) for ``kind`` in rho | isometric | text; token vectors
    are scaled to ``|x|^2 = q0 d`` (``spec.q_init``)."""
    T, d = spec.seq_len, spec.d_model
    scale = math.sqrt(spec.q_init)
    if kind == "rho":
        x = _inputs.rho_tokens(sequences, T, d, 0.0 if rho0 is None else rho0, seed)
        return (x * scale if scale != 1.0 else x), None
    if kind == "isometric":
        x = _inputs.isometric_tokens(sequences, T, d, seed)
        return (x * scale if scale != 1.0 else x), None
    if kind == "text":
        return _inputs.text_ids(sequences, T, seed)
    raise SpecError("input", f"must be one of {', '.join(_inputs.INPUTS)} (got {kind!r})")


def _grad_norms(model, x, seed: int) -> dict[str, torch.Tensor]:
    """Per-seed ||dL/dW_Q||^2, ||dL/dW_V||^2 of every block for an MLM-style readout loss
    (:class:`sigprop.measurement.gradients.MLMReadoutLoss`; the loss is summed over seeds, so each
    seed's gradient is its own). Returns (L, S) tensors."""
    from .gradients import MLMReadoutLoss

    loss_fn = MLMReadoutLoss(seed=seed)
    params = [p for blk in model.blocks for p in (blk.attn.w_q, blk.attn.w_v)]
    with torch.enable_grad():
        out = model(x, return_hidden=False, return_stats=False).output
        loss = sum(loss_fn(out[s]) for s in range(out.shape[0]))
        # uniform attention never uses W_Q, W_K: their gradient is exactly zero, not an error
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
    sq = torch.stack([g.detach().double().pow(2).sum(dim=(1, 2)) for g in grads])
    return {"grad_qk": sq[0::2], "grad_v": sq[1::2]}


def measure(spec: ArchSpec, *, seeds: int = 4, sequences: int = 2, input: str = "rho",
            rho0: float | None = None, seed: int = 0, dtype: torch.dtype = torch.float32,
            grads: bool = False, stable_rank: bool = True, build=None) -> Measurement:
    """Measure cos, q, stable_rank (layers 0..L) and ipr, ipr_cross, entropy, wmax (and
    optionally grad_qk, grad_v) of layers 1..L, as Trajectory rows with source ``measured``.
    ``build``: the stack's constructor (default :class:`~sigprop.nn.SigpropTransformer`;
    a fixed stack's :meth:`~sigprop.models.methods.stack.StackFix.model`), called as
    ``build(spec, n_seeds=, seed=, dtype=, embeddings=)``."""
    import time

    from .. import trajectory
    from ..nn.model import SigpropTransformer

    if not 1 <= seeds <= 4096:
        raise SpecError("seeds", f"must be an integer in [1, 4096] (got {seeds})")
    if not 1 <= sequences <= 4096:
        raise SpecError("sequences", f"must be an integer in [1, 4096] (got {sequences})")
    from . import memory

    memory.check("measure", spec=spec, seeds=seeds, sequences=sequences, input=input,
                 dtype_bytes=torch.finfo(dtype).bits // 8, grads=grads,
                 shrink={"seq_len": 2, "sequences": 1, "seeds": 1})
    t0 = time.perf_counter()
    x, vocab = make_inputs(spec, input, sequences, rho0=rho0, seed=seed)
    model = (build or SigpropTransformer)(spec, n_seeds=seeds, seed=seed, dtype=dtype,
                                          embeddings=vocab)
    with torch.no_grad():
        out = model(x if vocab is not None else x.to(dtype), return_hidden=True,
                    return_stats=True)
    rows = []
    for layer, h in enumerate(out.hidden):
        per = {"cos": obs.mean_cos(h), "q": obs.mean_q(h)}
        if stable_rank:
            per["stable_rank"] = obs.stable_rank(h)
        if layer > 0:
            st = out.stats[layer - 1]
            per.update({k: st[k].mean(dim=-1) for k in STAT_NAMES})
        for name, v in per.items():
            m, e = _seed_stats(v)
            rows.append(dict(layer=layer, observable=name, source="measured", value=m, stderr=e))
    rho_measured = float(obs.mean_cos(out.hidden[0]).double().mean())
    if grads:
        g = _grad_norms(model, x if vocab is not None else x.to(dtype), seed)
        for name, t in g.items():
            for li in range(t.shape[0]):
                m, e = _seed_stats(t[li][:, None])
                rows.append(dict(layer=li + 1, observable=name, source="measured", value=m,
                                 stderr=e))
    traj = trajectory.make(rows, spec)
    return Measurement(traj, rho_measured, time.perf_counter() - t0,
                       {"seeds": seeds, "sequences": sequences, "input": input,
                        "dtype": str(dtype).replace("torch.", ""), "vocab_size": vocab})


def compare(theory, measured) -> dict[str, float]:
    """Max |theory - measured| per observable over the layers both have."""
    import pandas as pd

    t = theory[["layer", "observable", "value"]]
    m = measured[["layer", "observable", "value"]]
    j = pd.merge(t, m, on=["layer", "observable"], suffixes=("_t", "_m"))
    j["err"] = (j["value_t"] - j["value_m"]).abs()
    return {k: float(v) for k, v in j.groupby("observable")["err"].max().items()}
