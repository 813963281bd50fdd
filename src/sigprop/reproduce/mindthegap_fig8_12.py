"""mindthegap's training figures 8(a), 8(b) and 12 (docs/reproduce/mindthegap_training_figs.md).

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

The training loop is self-contained (:func:`fit`): every learning rate and seed of a variant
trains side by side as slices of one batched model, with Adam written out elementwise so that
each slice has its own learning rate (torch's Adam takes one per parameter group); the slices
never interact. Seed ``j`` fixes the data and the standard-normal draws of every weight, shared
by all variants and learning rates, so variants are compared on paired draws.

Items: ``fig8a`` (Xavier vs N(0, 1) Q/K, with and without the gap, one layer), ``fig8b``
(value scaling N(0, 1) vs N(0, 1/d) with skip connections, with and without the gap, one
layer), ``fig12`` (a 5-layer Random Markov stack that rank collapse stops from training, and
its gap-free version that trains).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..measurement.observables import mean_cos
from ..theory import spectral as sp
from .core import Check, Experiment, frame, register
from .mindthegap import _check, _check_device, _fig, _one_thread, _sub, tokens

__all__ = ["Variant", "fit", "fig8a", "fig8b", "fig12", "heaviside_data"]

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


def _forward(p: dict, X, v: Variant, depth: int, skip: bool, T: int, keep_first: bool = False):
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


@_one_thread
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
    ``_sub(seed, 9, j)``."""
    dev, dt = torch.device(device), _DTYPES[dtype]
    S, n, T, d = X.shape
    R = len(lrs)
    draws: dict[str, list] = {k: [] for k in ("Wq", "Wk", "Wv", "B")}
    for j in range(S):
        g = torch.Generator().manual_seed(_sub(seed, 9, j))
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
    lr = torch.as_tensor(np.asarray(lrs, dtype=np.float64), dtype=dt, device=dev)
    params = list(p.values())
    m1 = [torch.zeros_like(q) for q in params]
    m2 = [torch.zeros_like(q) for q in params]
    b1, b2, eps = 0.9, 0.999, 1e-8
    losses = []
    with torch.no_grad():
        out, A1 = _forward(p, Xt, variant, depth, skip, T, keep_first=True)
        sigma_A = (T * A1[0]).double().std(dim=(-2, -1)).mean(dim=-1).cpu().numpy()
        s = torch.linalg.svdvals(out[0].double())
        sr_excess = ((s[..., 1:] / s[..., :1]) ** 4).sum(-1).mean(-1).cpu().numpy()
        cos = mean_cos(out[0].double()).mean(-1).cpu().numpy()
    for t in range(steps + 1):
        out, _ = _forward(p, Xt, variant, depth, skip, T)
        loss = (out - Yt).square().mean(dim=(-3, -2, -1))  # (R, S)
        losses.append(loss.detach())
        if t == steps:
            break
        grads = torch.autograd.grad(loss.sum(), params)
        with torch.no_grad():
            c1, c2 = 1.0 - b1 ** (t + 1), 1.0 - b2 ** (t + 1)
            for q, g, a, b in zip(params, grads, m1, m2, strict=True):
                g = torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
                a.mul_(b1).add_(g, alpha=1 - b1)
                b.mul_(b2).addcmul_(g, g, value=1 - b2)
                step = (a / c1) / ((b / c2).sqrt() + eps)
                q.sub_(lr.view(1, R, *([1] * (q.dim() - 2))) * step)
    loss = torch.stack(losses, dim=-1).double().cpu().numpy()
    return {"loss": np.where(np.isfinite(loss), loss, np.nan), "sigma_A": sigma_A,
            "sr_excess": sr_excess, "cos": cos}


# ---------------------------------------------------------------------------------------------
# the shared driver: train every variant, pick its learning rate, tabulate, draw
# ---------------------------------------------------------------------------------------------


def _validate(T, d, n_points, steps, lrs, n_seeds, dtype, device, depth=1) -> tuple:
    _check("T", isinstance(T, int | np.integer) and 4 <= T <= 4096, "an integer in [4, 4096]")
    _check("d", isinstance(d, int | np.integer) and T <= d <= 4096,
           f"an integer in [T = {T}, 4096] (isometric inputs need d >= T)")
    _check("n_points", isinstance(n_points, int | np.integer) and 1 <= n_points <= 10_000,
           "an integer in [1, 10000]")
    _check("steps", isinstance(steps, int | np.integer) and 10 <= steps <= 1_000_000,
           "an integer in [10, 1000000]")
    _check("depth", isinstance(depth, int | np.integer) and 1 <= depth <= 64,
           "an integer in [1, 64]")
    _check("n_seeds", isinstance(n_seeds, int | np.integer) and 2 <= n_seeds <= 64,
           "an integer in [2, 64] (the checks need a seed-to-seed spread)")
    lrs = tuple(float(x) for x in np.atleast_1d(np.asarray(lrs, dtype=np.float64)))
    _check("lrs", len(lrs) >= 1 and all(0 < x <= 10 for x in lrs),
           "a non-empty list of learning rates in (0, 10]")
    _check("dtype", dtype in _DTYPES, f"one of {', '.join(_DTYPES)}")
    _check_device(device)
    return lrs


def _tail(steps: int) -> int:
    """Steps averaged into the final loss (the last 5 %, at least one)."""
    return max(1, steps // 20)


def _train_all(variants: Sequence[Variant], *, T, d, n_points, steps, lrs, n_seeds, depth,
               skip, seed, device, dtype) -> dict:
    """Train every variant at every learning rate; select each variant's learning rate by the
    lowest run-averaged training loss (mean over seeds, a diverged run counts as +inf)."""
    data = [heaviside_data(n_points, T, d, np.random.default_rng(_sub(seed, 8, j)))
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
        fin = L[..., -_tail(steps):].mean(axis=-1)
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


def _rel_sd(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.std(x, ddof=1) / abs(np.mean(x))) if x.size > 1 else math.nan


def _records(out: dict, steps: int, **coords) -> list[dict]:
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


def _summary(out: dict) -> pd.DataFrame:
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


def _draw(out: dict, title: str, steps: int, *, logy: bool = True, theory: dict | None = None,
          xlog: bool = False):
    fig, ax = _fig(1, 1, 5.0, 3.6)
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


def _margin_check(claim: str, worse: dict, better: dict, key: str, why: str,
                  floor: float = 0.0) -> Check:
    """``mean(worse) / mean(better) >= 1 + max(floor, 2 x the larger relative seed sd)``."""
    w, b = np.asarray(worse[key]), np.asarray(better[key])
    spread = max(_rel_sd(w), _rel_sd(b))
    lo = 1.0 + max(floor, 2.0 * spread)
    return Check.within(claim, float(np.mean(w) / np.mean(b)), lo, math.inf,
                        why=f"{why}; band: 2 x the larger relative seed-to-seed sd "
                            f"({spread:.3g}, {w.size} seeds)")


def _notes(T, d, n_points, steps, lrs, n_seeds, dtype, extra="") -> str:
    return (f"CPU scale: T = {T}, d = {d}, {n_points} "
            f"inputs (paper: T = d = 500, 50 inputs), {steps} full-batch Adam steps, learning "
            f"rates {', '.join(f'{x:g}' for x in lrs)} (paper: {{1, 3, 5}} x 10^-(1..5)), "
            f"{n_seeds} seeds per rate (paper: 5), {dtype}. Each curve is at its variant's "
            "best rate (lowest run-averaged loss, mean over seeds); shaded: +- 1 stderr over "
            "seeds; log-log axes (step + 1). " + extra)


# ---------------------------------------------------------------------------------------------
# Fig. 8(a): Xavier vs N(0, 1) Q/K, with and without the gap
# ---------------------------------------------------------------------------------------------


@register(
    "mindthegap.fig8a", ref="Fig. 8(a)",
    title="One key-query layer on the Heaviside task: Xavier Q/K make A_perp ~ 0 (plateau); "
          "N(0, 1) Q/K make the gap-free model train as well as softmax",
    claim="mindthegap Fig. 8(a) / Sec. 3: with Xavier W^Q, W^K (N(0, 1/d_qk)) first-layer "
          "attention is uniform (Prop. 1), so removing the gap leaves A_perp ~ 0 and the "
          "gap-free model's training loss plateaus during the first steps; with the proposed "
          "N(0, 1) Q/K the gap-free model trains as well as the original softmax model.",
    trains=True,
    tiny=dict(T=16, d=16, n_points=8, steps=60, lrs=(0.03,), n_seeds=2),
    quick=dict(T=32, d=32, n_points=16, steps=200, lrs=(0.03, 0.1, 0.3), n_seeds=3),
    full=dict(T=500, d=500, n_points=50, steps=2000, lrs=(1e-4, 3e-4, 1e-3, 3e-3),
              n_seeds=3),
    runtime={"tiny": 0.3, "quick": 4.5, "default": 25.0})
@_one_thread
def fig8a(*, seed: int = 0, device: str = "cpu", T: int = 32, d: int = 32, n_points: int = 50,
          steps: int = 300, lrs: Sequence[float] = (0.01, 0.03, 0.1, 0.3), n_seeds: int = 3,
          dtype: str = "float32") -> Experiment:
    lrs = _validate(T, d, n_points, steps, lrs, n_seeds, dtype, device)
    xav = 1.0 / math.sqrt(d)
    variants = [Variant("A(X), Xavier", False, xav, 1.0),
                Variant("A(X) perp, Xavier", True, xav, 1.0),
                Variant("A(X)", False, 1.0, 1.0),
                Variant("A(X) perp", True, 1.0, 1.0)]
    out = _train_all(variants, T=T, d=d, n_points=n_points, steps=steps, lrs=lrs,
                     n_seeds=n_seeds, depth=1, skip=False, seed=seed, device=device,
                     dtype=dtype)
    r = out["res"]
    xa, xp, na, npp = (r[v.label] for v in variants)
    # logits of orthonormal tokens have std sigma_qk^2 (d_qk = d): Prop. 1
    th_x, th_n = float(sp.softmax_sigma_A(xav**2)), float(sp.softmax_sigma_A(1.0))
    rows = _records(out, steps)
    rows += [dict(observable="sigma_A_init", source=src, value=float(val), variant=lab,
                  step=0) for lab, src, val in
             (("A(X), Xavier", "measured", np.mean(xa["sigma_A"])),
              ("A(X), Xavier", "theory", th_x),
              ("A(X)", "measured", np.mean(na["sigma_A"])), ("A(X)", "theory", th_n))]
    tab = _summary(out)
    tab["sigma_A_theory"] = [th_x, th_x, th_n, th_n]
    t_xp, t_xa = float(np.mean(xp["t10"])), float(np.mean(xa["t10"]))
    spread = max(_rel_sd(npp["final"]), _rel_sd(na["final"]))
    tol = max(0.1, 2.0 * spread)
    checks = [
        Check.ratio("Prop. 1 under Xavier Q/K: sigma_A of first-layer attention (std of T A) "
                    "is ~ 1/d, so A_perp ~ 0", float(np.mean(xa["sigma_A"])), th_x, 1.5,
                    why=f"theory sqrt(exp(1/d^2) - 1) = {th_x:.3g} for logits of std "
                        "sigma_qk^2 = 1/d; finite d: the logit variance is a chi-square "
                        "average over d_qk = d terms (relative sd sqrt(2/d)) and the sample std "
                        "of T^2 entries; factor 1.5"),
        Check.ratio("Prop. 1 under N(0, 1) Q/K: sigma_A = sqrt(e - 1) = 1.31 (A_perp of order "
                    "one)", float(np.mean(na["sigma_A"])), th_n, 1.5,
                    why="lognormal entries at finite T: the sample std of T^2 entries of a "
                        "heavy-tailed law, and d_qk = T correlates the logits (mindthegap.fig1 "
                        "measures the edge within a few %); factor 1.5"),
        Check.that("Fig. 8(a): the gap-free Xavier model plateaus: steps until its loss is 10 % "
                   "below the initial one, over those of the Xavier softmax model (>= 3)",
                   t_xp >= 3.0 * t_xa, t_xp / t_xa, ">= 3",
                   why=f"plateau {t_xp:.1f} vs {t_xa:.1f} steps (means over seeds, each at its "
                       "selected rate). Adam moves each Q/K entry by ~lr per step: A_perp "
                       "becomes O(1) once the logit std (1/sqrt(d) + k lr)^2 reaches ~0.3, "
                       "i.e. after k ~ 0.5/lr steps, while the softmax model learns through "
                       "the uniform part of A from the first step; factor 3 leaves room for the "
                       "integer step counts at the largest rates"),
        Check.within("Fig. 8(a): with N(0, 1) Q/K the gap-free model trains as well as the "
                     "original: final loss ratio A_perp / A", float(np.mean(npp["final"])
                                                                   / np.mean(na["final"])),
                     0.0, 1.0 + tol,
                     why=f"'as well as' read as at most {100 * tol:.0f} % higher (10 %, or 2 x "
                         f"the larger relative seed sd {spread:.3g} if larger); lower is "
                         "allowed: at this scale the gap-free model often ends lower"),
    ]
    fig = _draw(out, f"mindthegap Fig. 8(a): Xavier Q/K, 1 layer (T = d = {T})", steps,
                xlog=True)
    return Experiment(frame(rows), tab, checks, fig,
                      notes=_notes(T, d, n_points, steps, lrs, n_seeds, dtype,
                                   "One key-query layer, no skip, no LayerNorm, W^V ~ N(0, 1), "
                                   "W^h = I. Xavier: W^Q, W^K ~ N(0, 1/d) (the paper's A.3 "
                                   "definition); proposed: N(0, 1). Plateau: first step with "
                                   "loss <= 0.9 x initial."))


# ---------------------------------------------------------------------------------------------
# Fig. 8(b): value scaling with skip connections
# ---------------------------------------------------------------------------------------------


@register(
    "mindthegap.fig8b", ref="Fig. 8(b)",
    title="Skip connections: W^V ~ N(0, 1/d) ('upscaled skip') trains worse than N(0, 1), "
          "with and without the gap",
    claim="mindthegap Fig. 8(b) / Sec. 3: with X_(l+1) = A X_l W^V + X_l and isometric X_0, "
          "values N(0, 1/d) shrink the attention branch by sqrt(d) against the skip (an "
          "'upscaled skip', a nearly linear model), values N(0, 1) balance them; the "
          "upscaled-skip variants train worse on the nonlinear Heaviside target, with or "
          "without the gap.",
    trains=True,
    tiny=dict(T=48, d=48, n_points=4, steps=60, lrs=(0.1,), n_seeds=2),
    quick=dict(T=64, d=64, n_points=6, steps=150, lrs=(0.03, 0.1, 0.3), n_seeds=3),
    full=dict(T=500, d=500, n_points=50, steps=2000, lrs=(1e-4, 3e-4, 1e-3, 3e-3),
              n_seeds=3),
    runtime={"tiny": 0.3, "quick": 6.0, "default": 32.0},
    differs="sigprop checks the run-averaged training loss (the height of the curve), not the "
            "final loss: at CPU width and a tuned rate Adam rescales W^V within ~(1 - d^-1/2)/lr "
            "steps, so the final losses end only a few % apart. The gap also shrinks as the "
            "number of inputs per width grows (run-averaged excess at d = 64: 12-15 % with 6 "
            "inputs, the paper's ratio n/d = 0.1; 7 % with 16; 2 % with 50).")
@_one_thread
def fig8b(*, seed: int = 0, device: str = "cpu", T: int = 96, d: int = 96, n_points: int = 10,
          steps: int = 200, lrs: Sequence[float] = (0.03, 0.1, 0.3), n_seeds: int = 3,
          dtype: str = "float32") -> Experiment:
    lrs = _validate(T, d, n_points, steps, lrs, n_seeds, dtype, device)
    up = 1.0 / math.sqrt(d)
    variants = [Variant("A(X) + skip, upscaled", False, 1.0, up),
                Variant("A(X) perp + skip, upscaled", True, 1.0, up),
                Variant("A(X) + skip", False, 1.0, 1.0),
                Variant("A(X) perp + skip", True, 1.0, 1.0)]
    out = _train_all(variants, T=T, d=d, n_points=n_points, steps=steps, lrs=lrs,
                     n_seeds=n_seeds, depth=1, skip=True, seed=seed, device=device,
                     dtype=dtype)
    r = out["res"]
    ua, up_, fa, fp = (r[v.label] for v in variants)
    rows = _records(out, steps)
    tab = _summary(out)
    why = ("the upscaled branch starts sqrt(d) smaller than the skip, and Adam grows W^V by "
           "~lr per step, so the curve lags by ~(1 - d^-1/2)/lr steps; the lag shrinks with "
           "the rate and grows with d")
    checks = [
        _margin_check("Fig. 8(b), softmax: the upscaled skip trains worse (run-averaged loss, "
                      "upscaled / N(0, 1) values)", ua, fa, "avg", why),
        _margin_check("Fig. 8(b), gap removed: the upscaled skip trains worse (run-averaged "
                      "loss, upscaled / N(0, 1) values)", up_, fp, "avg", why),
    ]
    fig = _draw(out, f"mindthegap Fig. 8(b): scaling of the skip, 1 layer (T = d = {T})",
                steps, xlog=True)
    return Experiment(frame(rows), tab, checks, fig,
                      notes=_notes(T, d, n_points, steps, lrs, n_seeds, dtype,
                                   "One key-query layer (W^Q, W^K ~ N(0, 1)) with a skip "
                                   "connection, no LayerNorm, W^h = I; values N(0, 1) vs "
                                   "N(0, 1/d) ('upscaled'). Inputs per width kept near the "
                                   "paper's n/d = 50/500. The checks compare the run-averaged "
                                   "loss; the final losses are in the table."))


# ---------------------------------------------------------------------------------------------
# Fig. 12: a 5-layer stack that rank collapse stops from training
# ---------------------------------------------------------------------------------------------


@register(
    "mindthegap.fig12", ref="Fig. 12",
    title="A 5-layer attention-only stack: rank collapse blocks training, removing the gap "
          "restores it",
    claim="mindthegap Fig. 12 / A.3: in a 5-layer attention-only transformer the spectral gap "
          "collapses the rank of the signal (Prop. 3) and training fails ('no training'); "
          "replacing A by A_perp at every layer (Eq. 9) removes the main cause and the model "
          "trains.",
    trains=True,
    tiny=dict(T=16, d=16, n_points=8, steps=100, lrs=(0.01,), n_seeds=2),
    quick=dict(T=32, d=32, n_points=16, steps=300, lrs=(0.003, 0.01, 0.03), n_seeds=3),
    full=dict(T=500, d=500, n_points=50, steps=2000, lrs=(1e-4, 1e-3, 1e-2), n_seeds=3),
    runtime={"tiny": 0.3, "quick": 6.5, "default": 16.0},
    differs="The paper does not say which attention Fig. 12 trains; sigprop uses trained Random "
            "Markov attention ('A', sigma_A = 1, the setting of Props. 3-6). A 5-layer "
            "key-query stack with N(0, 1) Q/K and values starts at a loss ~1e5 with and without "
            "the gap and neither version trains at CPU scale (T = d = 32).")
@_one_thread
def fig12(*, seed: int = 0, device: str = "cpu", T: int = 64, d: int = 64, n_points: int = 6,
          depth: int = 5, steps: int = 400, lrs: Sequence[float] = (0.003, 0.01, 0.03),
          n_seeds: int = 3, sigma_A: float = 1.0, dtype: str = "float32") -> Experiment:
    lrs = _validate(T, d, n_points, steps, lrs, n_seeds, dtype, device, depth=depth)
    _check("sigma_A", 0 < sigma_A <= 4, "a number in (0, 4]")
    variants = [Variant("A", False, None, 1.0, sigma_A),
                Variant("A perp", True, None, 1.0, sigma_A)]
    out = _train_all(variants, T=T, d=d, n_points=n_points, steps=steps, lrs=lrs,
                     n_seeds=n_seeds, depth=depth, skip=False, seed=seed, device=device,
                     dtype=dtype)
    ra, rp = out["res"]["A"], out["res"]["A perp"]
    # the gap's rank-one part 1 xbar^T W_1 ... W_L: ||.||_F^2 = (sigma_V^2 d)^L for
    # orthonormal rows; the gap-free part T (sigma_A sigma_V)^(2L) / gamma^L (Prop. 7)
    gamma = T / d
    th_init_a = ZERO_LOSS + (d**depth + T * (sigma_A**2 / gamma) ** depth) / (T * d)
    init_a = float(np.nanmean(ra["loss"][:, 0]))
    rows = _records(out, steps)
    rows += [dict(observable="initial_loss", source="theory", value=th_init_a, variant="A",
                  step=0),
             dict(observable="initial_loss", source="measured", value=init_a, variant="A",
                  step=0)]
    rows += [dict(observable=o, source="measured", value=float(np.mean(r[k])), variant=lab,
                  step=0) for lab, r in (("A", ra), ("A perp", rp))
             for o, k in (("sr_excess_init", "sr_excess"), ("cos_init", "cos"))]
    tab = _summary(out)
    tab["initial_loss_theory"] = [th_init_a, math.nan]
    fp = float(np.mean(rp["final"]))
    fac = max(1.5, math.exp(3.0 * math.sqrt(2.0 * depth / (d * n_seeds))))
    checks = [
        Check.ratio("Prop. 3 at init: the gap's rank-one part dominates the output, initial "
                    "loss 1/2 + ((d sigma_V^2)^L + T (sigma_A^2 / gamma)^L) / (T d)", init_a,
                    th_init_a, fac,
                    why=f"theory {th_init_a:.4g}: the mean token has norm T^-1/2 and each "
                        "N(0, 1) W^V multiplies a squared norm by a chi-square factor of mean d; "
                        "the product of L of them is lognormal with log-sd ~ sqrt(2L/d) per "
                        f"seed: factor exp(3 sqrt(2L / (d n_seeds))) = {fac:.2f}"),
        Check.within("Prop. 3 at init: with the gap the output's tokens are collinear (rank "
                     "collapse; mean pairwise cosine of X_L)", float(np.mean(ra["cos"])), 0.99,
                     1.0, why="the rank-one part 1 xbar^T W_1 ... W_L outweighs the rest by "
                              "~d^(L/2) (sr(X_L X_L^T) - 1 = O(T^(1-4L)), Prop. 3), so every "
                              "token is the same vector up to ~d^(-L/2)"),
        Check.within("Prop. 5 at init: without the gap the tokens stay uncorrelated (mean "
                     "pairwise cosine of X_L^perp)", float(np.mean(rp["cos"])), -0.1, 0.1,
                     why="W_L^V is symmetric in law, so E cos = 0; seed and input fluctuations "
                         "~ (T d)^(-1/2) per input, with heavy-tailed depth-5 products: 0.1"),
        _margin_check("Fig. 12: removing the gap restores training (final loss with the gap "
                      "over without)", ra, rp, "final",
                      "each at its best rate; the gap model starts ~d^(L-1)/T above the target "
                      "and its collapsed output (all tokens alike) cannot fit the per-token "
                      "target", floor=0.5),
        Check.within("Fig. 12: the gap-free model learns beyond the best constant (final loss "
                     "< 0.25, the target's variance)", fp, 0.0, CONST_LOSS,
                     why="a model that only learned the mean 1/2 sits at 0.25; finite steps"),
    ]
    fig = _draw(out, f"mindthegap Fig. 12: {depth} layers, Random Markov A (T = d = {T})",
                steps, theory={"initial loss with the gap (theory)": ([1], [th_init_a])},
                xlog=True)
    return Experiment(frame(rows), tab, checks, fig,
                      notes=_notes(T, d, n_points, steps, lrs, n_seeds, dtype,
                                   f"{depth} attention-only layers (no skip, no LayerNorm), "
                                   f"trained Random Markov attention softmax(B), B ~ N(0, s^2) "
                                   f"with sigma_A = {sigma_A:g}, W^V ~ N(0, 1), W^h = I. "
                                   f"Final loss: mean of the last {_tail(steps)} steps."))
