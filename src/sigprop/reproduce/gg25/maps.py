"""gg25 Fig. 1(a, b): the attention maps of one layer in rank collapse (nearly uniform rows
below beta_c = sqrt 2) and in entropy collapse (a few random keys per row above it), with the
measured participation ratio and row entropy against the finite-T REM (Eqs. 12-13, B.7,
B.18). Measured on sigprop's torch model (:class:`sigprop.nn.model.SigpropTransformer`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...spec import ArchSpec
from ...theory import attention, rem
from .. import args
from ..core import Check, Experiment, frame, mean_se, one_thread, register
from ..plots import axes_row, decorate, titled
from .common import GG25_VARS, SQRT2

__all__ = ["fig1ab", "fig1ab_data", "fig1ab_checks", "plot_fig1ab"]


def _one_beta(b: float, ids, vocab, *, T: int, d_model: int, seeds: int, seed: int,
              device: str) -> dict:
    """One layer at inverse temperature ``b``: its attention maps, the measured row
    statistics per seed and their finite-T and T -> inf REM values."""
    import torch

    from ...measurement.observables import mean_cos
    from ...nn.model import SigpropTransformer

    spec = ArchSpec(depth=1, d_model=d_model, heads=1, seq_len=T, beta=b, **GG25_VARS)
    model = SigpropTransformer(spec, n_seeds=seeds, seed=seed, dtype=torch.float64,
                               embeddings=vocab).to(device)
    with torch.no_grad():
        out = model(ids.to(device), return_hidden=True, return_stats=True, return_probs=True)
    A = out.probs[0][:, :, 0].double().cpu().numpy()            # (S, B, T, T)
    rho0 = float(np.clip(mean_cos(out.hidden[0]).double().mean().item(), 0.0, 1.0))
    top3 = np.sort(A, axis=-1)[..., -3:].sum(-1).mean(axis=(1, 2))   # per seed
    meas = {k: out.stats[0][k][..., 0].double().mean(dim=1).cpu().numpy()
            for k in ("ipr", "entropy", "wmax")}
    meas["top3"] = top3
    st = attention.attention_stats(spec.sigma_s, rho0, T, d_head=spec.d_head, full=True)
    th = {"ipr": float(st.y2), "entropy": float(st.entropy), "wmax": float(st.wmax)}
    asym = {"ipr": float(rem.y2_asymptotic(b, rho0)),
            "entropy": float(rem.entropy_asymptotic(b, rho0))}
    return dict(A=A, rho0=rho0, meas=meas, th=th, asym=asym)


def fig1ab_data(*, seed: int, device: str, betas: tuple[float, float], T: int, d_model: int,
                seeds: int, sequences: int) -> dict:
    """Both layers' records, summary rows (one per beta) and the maps of the first sequence
    of the first seed."""
    from ...measurement.engine import make_inputs

    recs, rows, maps = [], [], {}
    ids, vocab = make_inputs(ArchSpec(seq_len=T, d_model=d_model, heads=1), "text", sequences,
                             rho0=None, seed=seed)
    for b in betas:
        r = _one_beta(b, ids, vocab, T=T, d_model=d_model, seeds=seeds, seed=seed,
                      device=device)
        A, meas, th, asym = r["A"], r["meas"], r["th"], r["asym"]
        maps[b] = A[0, 0]
        for q in range(T):
            for k in range(T):
                recs.append(dict(observable="attention", source="measured", value=A[0, 0, q, k],
                                 beta=b, query=q, key=k))
        for k, v in meas.items():
            m, e = mean_se(v)
            recs.append(dict(observable=k, source="measured", value=m, stderr=e, beta=b))
            if k in th:
                recs.append(dict(observable=k, source="theory", value=th[k], beta=b))
            if k in asym:
                recs.append(dict(observable=k, source="theory_asymptotic", value=asym[k],
                                 beta=b))
        rows.append(dict(beta=b, rho0=r["rho0"], beta_c=float(rem.beta_c(r["rho0"])),
                         ipr=float(meas["ipr"].mean()), ipr_theory=th["ipr"],
                         ipr_asymptotic=asym["ipr"], entropy=float(meas["entropy"].mean()),
                         entropy_theory=th["entropy"], top3=float(meas["top3"].mean()),
                         uniform_ipr=1.0 / T))
    return dict(recs=recs, rows=rows, maps=maps, betas=tuple(betas), T=T, seeds=seeds,
                sequences=sequences)


def fig1ab_checks(data: dict) -> list[Check]:
    """Eqs. 12-13 and B.7 at both betas, then B.18's spread below beta_c and Fig. 1(b)'s
    condensed rows above it."""
    rows, T = data["rows"], data["T"]
    (b_lo, b_hi), checks = data["betas"], []
    why = (f"{data['seeds']} seeds x {data['sequences']} text sequences of T = {T}; text "
           "tokens repeat, so pairwise cosines scatter around the mean rho0 the REM is "
           "evaluated at")
    for row in rows:
        b = row["beta"]
        checks.append(Check.within(
            f"gg25 Eq. 12-13 at beta = {b:g}: measured ipr against the finite-T REM "
            f"({row['ipr_theory']:.3f})", row["ipr"] - row["ipr_theory"], -0.05, 0.05,
            why=why))
        checks.append(Check.within(
            f"gg25 B.7 at beta = {b:g}: measured row entropy / log T against the finite-T REM "
            f"({row['entropy_theory']:.3f})", row["entropy"] - row["entropy_theory"],
            -0.05, 0.05, why=why))
    lo, hi = rows
    lim = 1.0 - (b_lo / lo["beta_c"]) ** 2
    checks.append(Check.within(
        f"gg25 Fig. 1(a), B.18: at beta = {b_lo:g} < beta_c a row spreads over ~T^(1 - x^2) "
        f"keys, entropy / log T = 1 - (beta/beta_c)^2 = {lim:.3f}", lo["entropy"] - lim,
        -0.03, 0.05,
        why="B.18 is the T -> inf value; at small x it is reached at small T already "
            f"(finite-T REM {lo['entropy_theory']:.3f}); text tokens are not exactly "
            "homogeneous"))
    checks.append(Check.within(
        f"gg25 Fig. 1(b): at beta = {b_hi:g} >> beta_c the 3 largest weights of a row carry "
        "most of its mass", hi["top3"], 0.6, 1.0,
        why=f"uniform rows would give 3/T = {3 / T:.3f}; the T -> inf REM puts "
            f"Y2 = {hi['ipr_asymptotic']:.2f} of the mass in the top key"))
    return checks


def plot_fig1ab(data: dict, ax=None):
    """The two attention maps side by side (two axes when ``ax`` is given)."""
    own = ax is None  # the plot made the figure: it may title it
    fig, axes = axes_row(ax, 2, (9.0, 4.0))
    for a, b, cmap, row in zip(axes, data["betas"], ("YlOrBr", "Reds"), data["rows"],
                               strict=True):
        im = a.imshow(data["maps"][b], cmap=cmap, vmin=0.0, aspect="equal",
                      interpolation="nearest")
        decorate(a, "key position", "query position",
                 f"β = {b:g} ({'rank' if b < SQRT2 else 'entropy'} collapse)\n"
                 f"ipr {row['ipr']:.3f} (REM {row['ipr_theory']:.3f}), "
                 f"entropy {row['entropy']:.2f}", legend=None)
        fig.colorbar(im, ax=a, shrink=0.8)
    return titled(fig, "gg25 Fig. 1(a, b): one layer, one head, one text sequence", own)


@register("gg25.fig1ab", tiny=dict(T=32, d_model=64, seeds=2, sequences=2),
          quick=dict(T=64, d_model=128, seeds=4, sequences=4),
          runtime={"tiny": 0.7, "quick": 1.8, "default": 1.8})
@one_thread
def fig1ab(*, seed: int = 0, device: str = "cpu", betas=(0.5, 3.0), T: int = 64,
           d_model: int = 128, seeds: int = 4, sequences: int = 4) -> Experiment:
    b_lo, b_hi = (float(b) for b in args.reals("betas", betas, 0.0, 50.0))
    args.need("betas", b_lo < SQRT2 < b_hi,
              f"a pair (below sqrt 2, above sqrt 2) (got {betas!r})")
    args.integer("T", T, 8, 1024)
    args.integer("d_model", d_model, 8, 4096)
    args.integer("seeds", seeds, 1, 64)
    args.integer("sequences", sequences, 1, 64)
    data = fig1ab_data(seed=seed, device=device, betas=(b_lo, b_hi), T=T, d_model=d_model,
                       seeds=seeds, sequences=sequences)
    return Experiment(frame(data["recs"]), pd.DataFrame(data["rows"]), fig1ab_checks(data),
                      plot_fig1ab, data)
