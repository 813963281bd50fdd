"""The linear maps, norms and activations of any ``nn.Module`` as the weight reader
(:mod:`.weights`) reads them: a module's ``(W, b)`` whatever its class, a norm's per-feature
gains fitted on a Gaussian input, the activation an elementwise module computes, and a cheap
fingerprint of a module's input (module docstring of :mod:`.weights`)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

#: rows of the Gaussian input a norm module's gains are read on
GAIN_ROWS = 64
#: a norm's fit counts as affine per feature when its residual is below this (relative)
GAIN_FIT_TOL = 1e-3


def matrix(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(W (out, in), bias or None)`` of a linear map: ``nn.Linear``, HF ``Conv1D`` (weight
    stored ``(in, out)``) or any module with a 2-D ``weight`` and ``in_features``; else None."""
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.ndim != 2:
        return None
    b = getattr(m, "bias", None)
    b = b.detach() if isinstance(b, torch.Tensor) else None
    if isinstance(m, nn.Linear) or getattr(m, "in_features", None) == w.shape[1]:
        return w.detach(), b
    nf = getattr(m, "nf", None)
    if isinstance(nf, int) and w.shape[1] == nf:  # HF Conv1D: y = x W + b
        return w.detach().T, b
    return None


def col_sq(W: torch.Tensor) -> torch.Tensor:
    """Per column (input feature) of ``W``: the sum of squares, float64 out, accumulated in
    the weights' own float32 by one fused dot product per column: within ~2e-7 relative of the
    float64 sum (torch's blocked summation; tests/measurement/test_weights.py), far below the
    sampling noise of a variance read from one draw (~sqrt(2 / rows)), and without a squared
    copy of the matrix (bert-base's 3072 x 768 MLP maps: ~1.2 ms against ~3.4 ms through
    ``square().sum(dtype=float64)``, per matrix and draw)."""
    W = W.detach()
    W = W if W.dtype in (torch.float32, torch.float64) else W.float()  # bf16 squares: 3 digits
    return torch.linalg.vecdot(W.mT, W.mT).double().cpu()


def is_norm(m: nn.Module) -> bool:
    name = type(m).__name__.lower()
    return "norm" in name and not isinstance(m, nn.ModuleList) and not any(
        isinstance(c, nn.Linear) for c in m.children())


def norm_width(m: nn.Module) -> int | None:
    w = getattr(m, "weight", None)
    if isinstance(w, torch.Tensor) and w.ndim == 1:
        return int(w.numel())
    shape = getattr(m, "normalized_shape", None)
    if isinstance(shape, tuple | list) and shape:
        return int(np.prod(shape))
    for attr in ("hidden_size", "dim", "d_model"):
        v = getattr(m, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


@torch.no_grad()
def norm_gains(m: nn.Module, width: int | None = None, seed: int = 0) -> np.ndarray | None:
    """Per-feature gains of a normalisation module (module docstring); None when it is not
    affine per feature in its normalised input (then it is not treated as a norm)."""
    width = width or norm_width(m)
    if not width:
        return None
    p = next(m.parameters(), None)
    dtype = p.dtype if p is not None else torch.float32
    device = p.device if p is not None else "cpu"
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(GAIN_ROWS, width, generator=g, dtype=torch.float64)
    try:
        y = m(z.to(device=device, dtype=dtype))
    except Exception:  # noqa: BLE001 - a module that cannot run on a plain (rows, d) input
        return None
    y = y[0] if isinstance(y, tuple | list) else y
    if not torch.is_tensor(y) or tuple(y.shape) != (GAIN_ROWS, width):
        return None
    y = y.detach().to(torch.float64).cpu()
    best = None
    for zn in (z / z.pow(2).mean(-1, keepdim=True).sqrt(),
               (z - z.mean(-1, keepdim=True)) / z.std(-1, unbiased=False, keepdim=True)):
        zc, yc = zn - zn.mean(0), y - y.mean(0)
        slope = (zc * yc).sum(0) / zc.pow(2).sum(0)
        resid = (yc - slope * zc).pow(2).sum() / max(float(yc.pow(2).sum()), 1e-300)
        if best is None or resid < best[0]:
            best = (float(resid), slope)
    if best is None or best[0] > GAIN_FIT_TOL:
        return None
    return best[1].numpy()


#: activations a module is compared with (docs/theory.md §2.5 kernels), on [-5, 5]
ACT_REFERENCE = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "linear": lambda x: x,
}
#: a module within this (max abs, on [-5, 5]) of a reference *is* that activation
ACT_EXACT = 2e-3
#: within this of GELU it is read as GELU with a note (tanh-approximate GELU differs by ~5e-4,
#: CLIP's quick-GELU x sigmoid(1.702 x) by ~0.02)
ACT_APPROX = 0.03


def _erf(x):
    from scipy import special

    return special.erf(x)


@torch.no_grad()
def classify_activation(m: nn.Module) -> tuple[str | None, float]:
    """``(name, max abs difference)`` of the closest activation in docs/theory.md §2.5's set
    for a parameter-free elementwise module (evaluated on [-5, 5]); ``(None, inf)`` when the
    module is not elementwise or not close to any (within :data:`ACT_APPROX` of GELU, or
    :data:`ACT_EXACT` of another)."""
    x = np.linspace(-5.0, 5.0, 201)
    try:
        y = m(torch.tensor(x, dtype=torch.float32))
    except Exception:  # noqa: BLE001 - not callable on a plain vector
        return None, math.inf
    if not torch.is_tensor(y) or tuple(y.shape) != x.shape:
        return None, math.inf
    y = y.double().numpy()
    errs = {k: float(np.max(np.abs(f(x) - y))) for k, f in ACT_REFERENCE.items()}
    name = min(errs, key=errs.get)
    if errs[name] <= ACT_EXACT or (name == "gelu" and errs[name] <= ACT_APPROX):
        return name, errs[name]
    return None, math.inf


def fingerprint(args, kwargs):
    """A cheap identity of a module's first tensor input: (shape, sum, sum of squares). The
    sums are taken per row in float32 and then over the rows in float64: a float64
    accumulation over the whole tensor (``sum(dtype=torch.float64)``) took ~1.5 ms per
    bert-base activation against ~0.1 ms this way, once per norm and seed. Equal inputs give
    equal fingerprints (the same reduction of the same values); that is all the reader asks."""
    t = next((a for a in list(args) + list(kwargs.values()) if torch.is_tensor(a)), None)
    if t is None or not t.is_floating_point():
        return None
    t = t.detach().float()
    if t.dim() == 0:
        t = t.reshape(1)
    return tuple(t.shape), float(t.sum(dim=-1).double().sum()), float(
        torch.linalg.vecdot(t, t).double().sum())
