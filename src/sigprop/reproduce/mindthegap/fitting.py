"""The training behind mindthegap's Figs. 8(a), 8(b) and 12
(docs/reproduce/mindthegap_training_figs.md; the items are in :mod:`.training`).

All three fit an attention-only transformer to the entrywise Heaviside of isometric inputs
(mindthegap A.3): the input ``X_0`` (T, d) has orthonormal rows, the target is ``1[X_0 > 0]``
entrywise, the loss is the mean squared error over a fixed set of ``n_points`` inputs (full
batch), optimised with Adam; each variant gets the best learning rate of a small grid (the
paper's protocol: a grid search, the best average training performance over the runs), and
every learning rate trains ``n_seeds`` seeds. A layer is the paper's single-head block

    X_l = A_l X_(l-1) W_l^V W_l^h  (+ X_(l-1) with a skip connection),

``W^h`` initialised to the identity and trained, ``W^V`` i.i.d. ``N(0, sigma_V^2)``; the
attention ``A_l`` is key-query softmax ``softmax(X W^Q (X W^K)^T / sqrt(d))`` with i.i.d.
``N(0, sigma_qk^2)`` ``W^Q, W^K`` ("A(X)"; Xavier: ``sigma_qk^2 = 1/d``), or a trained
Random Markov matrix ``softmax(B)`` with i.i.d. ``N(0, s^2)`` ``B``, ``e^(s^2) - 1 =
sigma_A^2`` ("A"); gap removed: ``A - 11^T / T`` at every step (Eq. 9).

:func:`fit` trains every learning rate and seed of a variant side by side as slices of one
batched model, in sigprop's training loop (:func:`sigprop.training.steps.run`) with
:class:`sigprop.training.optim.SliceAdam`, Adam with one learning rate per slice (torch's Adam
takes one per parameter group); the slices never interact. Seed ``j`` fixes the data and the
standard-normal draws of every weight, shared by all variants and learning rates, so variants
are compared on paired draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ...measurement.observables import mean_cos
from ...theory import spectral as sp
from ...training.optim import SliceAdam
from ...training.steps import run
from .. import args
from ..core import Check, one_thread
from .common import new_axes, sub, tokens

__all__ = ["CONST_LOSS", "ZERO_LOSS", "Variant", "heaviside_data", "forward", "fit",
           "validate", "tail", "train_all", "rel_sd", "records", "summary", "draw",
           "margin_check"]

#: Loss of the best constant predictor (the target's variance: entries are 0/1 with mean 1/2)
#: and of the zero output (the target's mean square).
CONST_LOSS, ZERO_LOSS = 0.25, 0.5
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_COLOURS = ("#d1495b", "#edae49", "#4c72b0", "#66a182")


@dataclass(frozen=True)
class Variant:
    """One curve of a figure: ``perp`` removes the gap; ``qk_std`` the std of W^Q, W^K entries
    (``None``: trained Random Markov attention of parameter ``sigma_A``); ``v_std`` the std of
    W^V entries."""

    label: str
    perp: bool
    qk_std: float | None
    v_std: float
    sigma_A: float = 1.0


# ---------------------------------------------------------------------------------------------
# data, model, training
# ---------------------------------------------------------------------------------------------


def heaviside_data(n_points: int, T: int, d: int, seed) -> tuple[np.ndarray, np.ndarray]:
    """``n_points`` isometric inputs (n, T, d) (orthonormal rows, :func:`tokens`) and their
    entrywise Heaviside targets ``1[X_0 > 0]`` (mindthegap A.3)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    X = np.stack([tokens(T, d, 0.0, seed=rng) for _ in range(n_points)])
    return X, (X > 0).astype(np.float64)


def forward(p: dict, X, v: Variant, depth: int, skip: bool, T: int, keep_first: bool = False):
    """Output (R, S, n, T, d) of the stack for the parameter slices ``p`` (leading dims
    layer, R learning rates, S seeds; X is (S, n, T, d) and broadcasts), and the first
    layer's attention when ``keep_first``."""
    h, first = X, None
    d = X.shape[-1]
    for l in range(depth):
        if v.qk_std is None:
            A = torch.softmax(p["B"][l], dim=-1)
        else:
            A = torch.softmax((h @ p["Wq"][l]) @ (h @ p["Wk"][l]).transpose(-1, -2)
                              / math.sqrt(d), dim=-1)
        if keep_first and l == 0:
            first = A.detach()
        if v.perp:
            A = A - 1.0 / T
        y = A @ (h @ (p["Wv"][l] @ p["Wh"][l]))
        h = y + h if skip else y
    return h, first


@one_thread
def fit(variant: Variant, X: np.ndarray, Y: np.ndarray, *, depth: int, lrs: Sequence[float],
        steps: int, seed: int, skip: bool = False, device: str = "cpu",
        dtype: str = "float32") -> dict:
    """Train ``variant`` on ``(X, Y)`` (S seeds x n points x T x d) at every learning rate of
    ``lrs``, all ``len(lrs) * S`` runs side by side; full-batch MSE, Adam (0.9, 0.999, 1e-8,
    no weight decay, no schedule, no clipping; a non-finite gradient entry counts as 0).

    Returns ``loss`` (R, S, steps + 1): the loss before each update and after the last;
    ``sigma_A`` (S,): the first layer's ``std(T A)`` at initialisation (mindthegap's sigma_A,
    mean over inputs); ``sr_excess`` (S,): ``sr(X_L X_L^T) - 1 = sum_(i>1) s_i^4 / s_1^4`` of
    the output at initialisation and ``cos`` (S,): its mean pairwise token cosine (both means
    over inputs). Seed ``j`` draws its weights from
    ``sub(seed, 9, j)``."""
    dev, dt = torch.device(device), _DTYPES[dtype]
    S, n, T, d = X.shape
    R = len(lrs)
    draws: dict[str, list] = {k: [] for k in ("Wq", "Wk", "Wv", "B")}
    for j in range(S):
        g = torch.Generator().manual_seed(sub(seed, 9, j))
        for k in ("Wq", "Wk", "Wv"):
            draws[k].append(torch.randn(depth, 1, d, d, generator=g, dtype=torch.float64))
        draws["B"].append(torch.randn(depth, 1, T, T, generator=g, dtype=torch.float64))
    base = {k: torch.stack(v, dim=1) for k, v in draws.items()}  # (L, S, 1, ., .)
    scale = {"Wv": variant.v_std}
    if variant.qk_std is None:
        scale["B"] = float(sp.logit_std_for_sigma_A(variant.sigma_A))
    else:
        scale["Wq"] = scale["Wk"] = variant.qk_std
    p = {k: (base[k] * s).unsqueeze(1).expand(depth, R, *base[k].shape[1:]).clone()
         for k, s in scale.items()}
    p["Wh"] = torch.eye(d, dtype=torch.float64).expand(depth, R, S, 1, d, d).clone()
    p = {k: t.to(device=dev, dtype=dt).requires_grad_(True) for k, t in p.items()}
    Xt = torch.as_tensor(X, dtype=dt, device=dev)
    Yt = torch.as_tensor(Y, dtype=dt, device=dev)
    with torch.no_grad():
        out, A1 = forward(p, Xt, variant, depth, skip, T, keep_first=True)
        sigma_A = (T * A1[0]).double().std(dim=(-2, -1)).mean(dim=-1).cpu().numpy()
        s = torch.linalg.svdvals(out[0].double())
        sr_excess = ((s[..., 1:] / s[..., :1]) ** 4).sum(-1).mean(-1).cpu().numpy()
        cos = mean_cos(out[0].double()).mean(-1).cpu().numpy()

    def losses_at(_step: int = 0) -> torch.Tensor:  # (R, S)
        return (forward(p, Xt, variant, depth, skip, T)[0] - Yt).square().mean(dim=(-3, -2, -1))

    params = list(p.values())
    opt = SliceAdam(params, lr=torch.as_tensor(np.asarray(lrs, dtype=np.float64)), dim=1)
    losses: list[torch.Tensor] = []
    run(losses_at, opt, steps, on_grads=lambda: _zero_nonfinite(params),
        after=lambda _k, loss: losses.append(loss))
    with torch.no_grad():
        losses.append(losses_at())
    loss = torch.stack(losses, dim=-1).double().cpu().numpy()
    return {"loss": np.where(np.isfinite(loss), loss, np.nan), "sigma_A": sigma_A,
            "sr_excess": sr_excess, "cos": cos}


def _zero_nonfinite(params: Sequence[torch.Tensor]) -> None:
    """Count a non-finite gradient entry as 0 (a diverging run then stops moving instead of
    turning every weight into NaN)."""
    for q in params:
        torch.nan_to_num_(q.grad, nan=0.0, posinf=0.0, neginf=0.0)


# ---------------------------------------------------------------------------------------------
# the shared driver: train every variant, pick its learning rate, tabulate, draw
# ---------------------------------------------------------------------------------------------


def validate(T, d, n_points, steps, lrs, n_seeds, dtype, device, depth=1) -> tuple:
    """Check the training items' shared keywords; returns the learning rates as a tuple."""
    args.integer("T", T, 4, 4096)
    args.need("d", isinstance(d, int | np.integer) and not isinstance(d, bool) and T <= d <= 4096,
              f"an integer in [T = {T}, 4096] (isometric inputs need d >= T; got {d!r})")
    args.integer("n_points", n_points, 1, 10_000)
    args.integer("steps", steps, 10, 1_000_000)
    args.integer("depth", depth, 1, 64)
    args.integer("n_seeds", n_seeds, 2, 64)  # the checks need a seed-to-seed spread
    lrs = tuple(float(x) for x in args.reals("lrs", lrs, 0.0, 10.0))
    args.need("lrs", all(x > 0 for x in lrs), f"learning rates in (0, 10] (got {lrs!r})")
    args.need("dtype", dtype in _DTYPES, f"one of {', '.join(_DTYPES)} (got {dtype!r})")
    args.device(device)
    return lrs


def tail(steps: int) -> int:
    """Steps averaged into the final loss (the last 5 %, at least one)."""
    return max(1, steps // 20)


def train_all(variants: Sequence[Variant], *, T, d, n_points, steps, lrs, n_seeds, depth,
               skip, seed, device, dtype) -> dict:
    """Train every variant at every learning rate; select each variant's learning rate by the
    lowest run-averaged training loss (mean over seeds, a diverged run counts as +inf)."""
    data = [heaviside_data(n_points, T, d, np.random.default_rng(sub(seed, 8, j)))
            for j in range(n_seeds)]
    X = np.stack([x for x, _ in data])
    Y = np.stack([y for _, y in data])
    res, grid = {}, []
    for v in variants:
        r = fit(v, X, Y, depth=depth, lrs=lrs, steps=steps, seed=seed, skip=skip,
                device=device, dtype=dtype)
        L = r["loss"]  # (R, S, steps + 1)
        avg = np.nanmean(L, axis=-1)
        avg = np.where(np.isfinite(L).all(axis=-1), avg, np.inf)
        fin = L[..., -tail(steps):].mean(axis=-1)
        score = avg.mean(axis=1)
        i = int(np.argmin(score))
        for k, lr in enumerate(lrs):
            grid.append(dict(variant=v.label, lr=lr, avg_loss=float(score[k]),
                             final_loss=float(np.mean(fin[k])),
                             final_loss_sd=float(np.std(fin[k], ddof=1)),
                             selected=k == i))
        res[v.label] = dict(variant=v, lr=lrs[i], loss=L[i], final=fin[i], avg=avg[i],
                            sigma_A=r["sigma_A"], sr_excess=r["sr_excess"], cos=r["cos"],
                            t10=_t10(L[i]))
    return {"res": res, "grid": grid}


def _t10(L: np.ndarray) -> np.ndarray:
    """Per seed, the first step at which the loss is 10 % below its initial value (the length
    of the initial plateau; ``steps + 1`` if never)."""
    below = L[:, 1:] <= 0.9 * L[:, :1]
    return np.where(below.any(axis=1), below.argmax(axis=1) + 1, L.shape[1]).astype(float)


def rel_sd(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.std(x, ddof=1) / abs(np.mean(x))) if x.size > 1 else math.nan


def records(out: dict, steps: int, **coords) -> list[dict]:
    """Per variant (its selected learning rate) the loss curve, mean and stderr over seeds,
    at every step (at most ~400 steps shown: evenly thinned beyond)."""
    idx = np.unique(np.linspace(0, steps, min(steps + 1, 401)).round().astype(int))
    rows = []
    for lab, r in out["res"].items():
        L = r["loss"][:, idx]
        m = np.nanmean(L, axis=0)
        se = np.nanstd(L, axis=0, ddof=1) / math.sqrt(L.shape[0])
        rows += [dict(observable="loss", source="measured", value=float(a), stderr=float(b),
                      step=int(s), variant=lab, lr=r["lr"], **coords)
                 for s, a, b in zip(idx, m, se, strict=True)]
        rows.append(dict(observable="final_loss", source="measured", value=float(
            np.mean(r["final"])), stderr=float(np.std(r["final"], ddof=1)
                                               / math.sqrt(r["final"].size)),
            step=steps, variant=lab, lr=r["lr"], **coords))
    # the learning-rate grid behind each selection (run-averaged and final loss per rate)
    for g in out["grid"]:
        for key in ("avg_loss", "final_loss"):
            rows.append(dict(observable=f"grid_{key}", source="measured", value=g[key],
                             step=steps, variant=g["variant"], lr=g["lr"],
                             selected=g["selected"], **coords))
    return rows


def summary(out: dict) -> pd.DataFrame:
    rows = []
    for lab, r in out["res"].items():
        rows.append(dict(variant=lab, lr=r["lr"], final_loss=float(np.mean(r["final"])),
                         final_loss_sd=float(np.std(r["final"], ddof=1)),
                         avg_loss=float(np.mean(r["avg"])),
                         avg_loss_sd=float(np.std(r["avg"], ddof=1)),
                         initial_loss=float(np.nanmean(r["loss"][:, 0])),
                         plateau_steps=float(np.mean(r["t10"])),
                         sigma_A_init=float(np.mean(r["sigma_A"])),
                         sr_excess_init=float(np.mean(r["sr_excess"])),
                         cos_init=float(np.mean(r["cos"])),
                         **{f"final_seed{j}": float(x) for j, x in enumerate(r["final"])}))
    return pd.DataFrame(rows)


def draw(out: dict, title: str, steps: int, *, logy: bool = True, theory: dict | None = None,
          xlog: bool = False):
    fig, ax = new_axes(1, 1, 5.0, 3.6)
    a = ax[0][0]
    for c, (lab, r) in zip(_COLOURS, out["res"].items(), strict=False):
        L = r["loss"]
        x = np.arange(L.shape[1])
        m = np.nanmean(L, axis=0)
        se = np.nanstd(L, axis=0, ddof=1) / math.sqrt(L.shape[0])
        a.plot(x + xlog, m, color=c, lw=1.4, label=f"{lab} (lr {r['lr']:g})")
        a.fill_between(x + xlog, np.clip(m - se, 1e-12, None), m + se, color=c, alpha=0.25,
                       lw=0)
    a.axhline(CONST_LOSS, color="k", ls="--", lw=0.8, label="best constant output (0.25)")
    for lab, (x, y) in (theory or {}).items():
        a.plot(x, y, "k*", ms=8, label=lab)
    if logy:
        a.set_yscale("log")
    if xlog:
        a.set_xscale("log")
    a.set_xlabel("training step" + (" + 1" if xlog else ""))
    a.set_ylabel("training loss (MSE)")
    a.set_xlim(right=steps + 1 + xlog)
    a.legend(fontsize=7)
    a.set_title(title, fontsize=9)
    return fig


def margin_check(claim: str, worse: dict, better: dict, key: str, why: str,
                  floor: float = 0.0) -> Check:
    """``mean(worse) / mean(better) >= 1 + max(floor, 2 x the larger relative seed sd)``."""
    w, b = np.asarray(worse[key]), np.asarray(better[key])
    spread = max(rel_sd(w), rel_sd(b))
    lo = 1.0 + max(floor, 2.0 * spread)
    return Check.within(claim, float(np.mean(w) / np.mean(b)), lo, math.inf,
                        why=f"{why}; band: 2 x the larger relative seed-to-seed sd "
                            f"({spread:.3g}, {w.size} seeds)")
