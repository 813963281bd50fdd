"""gg25 Fig. 1(c): the (beta, alpha_attn) trainability diagram of a 60-layer post-LN ReLU
transformer from sigprop's theory (:mod:`sigprop.theory.diagram`), cross-checked against
:func:`gg25_block_map`, gg25's block equations as printed, coded here independently of
:mod:`sigprop.theory.blocks`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...plotting.figures import REGIME_COLOURS
from ...spec import ArchSpec
from ...theory import depth as tdepth
from ...theory import diagram
from .. import args
from ..core import Check, Experiment, frame, register
from ..plots import axes_row, decorate
from .common import BETA_HF, GG25_VARS, SQRT2

__all__ = ["gg25_block_map", "fig1c", "fig1c_data", "fig1c_checks", "plot_fig1c"]


# --------------------------------------------------------------------------------------------
# gg25's asymptotic block map, written out independently of sigprop.theory (for cross-checks)


def gg25_block_map(rho, beta, *, alpha_attn, alpha_mlp=1.0, var_v=0.2, var_w=0.2,
                   var_b=4e-4):
    """One post-LN ReLU block of gg25 (Eqs. 13, 14, 16-19) in the T -> infinity limit, coded
    from the equations as printed (docs/theory.md §2.2, §2.4-2.6): Y2 = max(0, 1 - beta_c /
    beta), Yx = 0, arc-cosine ReLU kernel. Vectorised; kept apart from
    :mod:`sigprop.theory.blocks` on purpose, as the independent computation that
    ``gg25.fig1c`` checks the library against."""
    rho = np.asarray(rho, dtype=np.float64)
    with np.errstate(divide="ignore"):
        bc = np.sqrt(2.0 / (1.0 - rho))
    y2 = np.where(beta > bc, 1.0 - bc / np.maximum(beta, 1e-300), 0.0)
    q_att = var_v * (rho + (1.0 - rho) * y2) + var_b
    p_att = var_v * rho + var_b
    a2 = alpha_attn**2
    r1 = np.clip((a2 * rho + p_att) / (a2 + q_att), -1.0, 1.0)
    q1, p1 = var_w + var_b, var_w * r1 + var_b
    c = np.clip(p1 / q1, -1.0, 1.0)
    k = (np.sqrt(1.0 - c * c) + c * (np.pi - np.arccos(c))) / np.pi
    qh, ph = var_w * q1 / 2 + var_b, var_w * q1 / 2 * k + var_b
    m2 = alpha_mlp**2
    return (m2 * r1 + ph) / (m2 + qh)


def _alpha_crit_reference(depth: int, beta: float, rho0: float, rho_max: float,
                          lo: float = 0.0, hi: float = 50.0, rounds: int = 60) -> float:
    """Bisection on :func:`gg25_block_map` iterated ``depth`` times (a plain loop)."""
    def final(a):
        r = rho0
        for _ in range(depth):
            r = float(gg25_block_map(r, beta, alpha_attn=a))
        return r
    if final(lo) < rho_max:
        return lo
    for _ in range(rounds):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if final(mid) < rho_max else (mid, hi)
    return hi


# ============================================================================================
# Fig. 1(c): the trainability diagram


def fig1c_data(*, depth: int, T: int, d_model: int, heads: int, n_beta: int, n_alpha: int,
               depths: list[int], rho_max: float, marks) -> dict:
    """The diagram, alpha_crit at HF's beta (library finite-T and T -> inf, the independent
    reference, over ``depths``), the theory's regime at each mark, records and table."""
    spec = ArchSpec(depth=depth, d_model=d_model, heads=heads, seq_len=T, beta=BETA_HF,
                    rho_max=rho_max, **GG25_VARS)
    dg = diagram.compute(spec, n_beta=n_beta, n_alpha=n_alpha, beta_max=3.5, alpha_max=3.0,
                         rho0=0.0)
    crit_asym = diagram.alpha_crit(spec, dg.betas, rho0=0.0, asymptotic=True)
    a_ref = _alpha_crit_reference(depth, BETA_HF, 0.0, rho_max)
    a_lib = float(diagram.alpha_crit(spec, [BETA_HF], rho0=0.0, asymptotic=True)[0])
    a_fin = float(diagram.alpha_crit(spec, [BETA_HF], rho0=0.0)[0])
    by_depth = [float(diagram.alpha_crit(spec.replace(depth=L), [BETA_HF], rho0=0.0)[0])
                for L in depths]
    recs = []
    for i, b in enumerate(dg.betas):
        recs.append(dict(observable="alpha_crit", source="theory", value=dg.alpha_crit[i],
                         beta=b, depth=depth))
        recs.append(dict(observable="alpha_crit", source="theory_asymptotic",
                         value=crit_asym[i], beta=b, depth=depth))
        for j, a in enumerate(dg.alphas):
            recs.append(dict(observable="regime", source="theory", value=int(dg.regime[i, j]),
                             beta=b, alpha=a, depth=depth))
    for L, a in zip(depths, by_depth, strict=True):
        recs.append(dict(observable="alpha_crit", source="theory", value=a, beta=BETA_HF,
                         depth=L))
    names = []
    for b, a in marks:
        sp = spec.replace(beta=float(b), alpha_attn=float(a))
        names.append(tdepth.verdict(sp, rho0=0.0))
        recs.append(dict(observable="marked_regime", source="theory",
                         value=diagram.REGIMES.index(names[-1]), beta=float(b), alpha=float(a),
                         depth=depth))
    table = pd.DataFrame([dict(depth=L, beta=BETA_HF, alpha_crit=a)
                          for L, a in zip(depths, by_depth, strict=True)])
    table["alpha_crit_asymptotic_60"] = a_lib
    table["alpha_crit_reference_60"] = a_ref
    return dict(dg=dg, crit_asym=crit_asym, a_ref=a_ref, a_lib=a_lib, a_fin=a_fin,
                by_depth=by_depth, names=names, recs=recs, table=table, depth=depth, T=T,
                depths=depths, rho_max=rho_max, marks=marks)


def fig1c_checks(data: dict) -> list[Check]:
    """beta_c, the library against the independent loop, the finite-T correction at HF's
    beta, alpha_crit over depth and the marks' regimes."""
    depth, T, depths, by_depth = data["depth"], data["T"], data["depths"], data["by_depth"]
    names = data["names"]
    return [
        Check.within("gg25 Eq. 13: beta_c = sqrt 2 for orthogonal tokens (the diagram's "
                     "entropy-collapse edge)", data["dg"].beta_c - SQRT2, -1e-12, 1e-12,
                     why="closed form; roundoff only"),
        Check.ratio(f"gg25 Fig. 1(c): alpha_crit({depth}) of sigprop's T -> inf map equals an "
                    "independent loop over gg25's printed block equations", data["a_lib"],
                    data["a_ref"], 1.001,
                    why="both bisect the same monotone map; the library's (K+1)-ary search "
                        "resolves ~3e-5"),
        Check.ratio(f"gg25 B.7: far below beta_c finite-T corrections are negligible: finite-T "
                    f"alpha_crit({depth}) at HF's beta_eff = {BETA_HF:.3f} close to the T -> inf "
                    "value", data["a_fin"], data["a_lib"], 1.05,
                    why=f"T = {T}: Y2 - 1/T ~ T^-(1 - 2x^2) is tiny at beta/beta_c = "
                        f"{BETA_HF / SQRT2:.2f}"),
        Check.that("gg25 Sec. 1: alpha_crit grows with the depth", bool(np.all(np.diff(by_depth)
                                                                              > 0)),
                   by_depth[-1], f"increasing over L = {depths}",
                   why="ReLU has no chaotic phase: rho_L -> 1 at any fixed alpha as L grows"),
        Check.that("gg25 Fig. 1(f) marks: HF init with alpha = 1 in rank collapse, with "
                   "alpha = 2 trainable, beta = 3 in entropy collapse",
                   names == ["rank_collapse", "trainable", "entropy_collapse"],
                   diagram.REGIMES.index(names[0]),
                   "rank_collapse, trainable, entropy_collapse",
                   why="regions decided by the finite-T theory at T = 512, rho_max = "
                       f"{data['rho_max']:g}"),
    ]


def plot_fig1c(data: dict, ax=None):
    """The regimes over (beta, alpha_attn) with alpha_crit (finite T and T -> inf), beta_c
    and the marks."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    fig, (ax,) = axes_row(ax, 1, (5.4, 4.2))
    dg, crit_asym = data["dg"], data["crit_asym"]
    ext = (dg.betas[0], dg.betas[-1], dg.alphas[0], dg.alphas[-1])
    ax.imshow(dg.regime.T, origin="lower", aspect="auto", extent=ext,
              cmap=ListedColormap(REGIME_COLOURS), vmin=0, vmax=2, interpolation="nearest")
    below = dg.betas <= dg.beta_c
    ax.plot(dg.betas[below], dg.alpha_crit[below], "k-", lw=1.6, label="α_crit(60), finite T")
    ax.plot(dg.betas[below], crit_asym[below], "w--", lw=1.2, label="α_crit(60), T → ∞")
    ax.axvline(dg.beta_c, color="k", ls=":", lw=1.0, label="β_c = √2")
    for (b, a), c in zip(data["marks"], ("#f2c14e", "#4c72b0", "#d1495b"), strict=True):
        ax.plot([b], [a], marker="o", ms=9, mfc=c, mec="k", ls="none")
    decorate(ax, "β (gg25 Eq. 11)", "α_attn (attention residual strength)",
             f"gg25 Fig. 1(c): L = {data['depth']}, post-LN, ReLU, T = {data['T']}", size=10,
             legend=None)
    hs = [Patch(color=c, label=n) for c, n in zip(
        REGIME_COLOURS, ("trainable", "rank collapse", "entropy collapse"), strict=True)]
    h2, _ = ax.get_legend_handles_labels()
    ax.legend(handles=hs + h2, fontsize=7, loc="upper right", framealpha=0.9)
    return fig


@register("gg25.fig1c", tiny=dict(n_beta=24, n_alpha=24, depths=(12, 60)),
          quick=dict(n_beta=96, n_alpha=96, depths=(6, 12, 24, 60, 120)),
          runtime={"tiny": 0.8, "quick": 2.1, "default": 2.1})
def fig1c(*, seed: int = 0, device: str = "cpu", depth: int = 60, T: int = 512,
          d_model: int = 768, heads: int = 6, n_beta: int = 128, n_alpha: int = 128,
          depths=(6, 12, 24, 60, 120), rho_max: float = 0.9,
          marks=((BETA_HF, 1.0), (BETA_HF, 2.0), (3.0, 1.0))) -> Experiment:
    args.integer("depth", depth, 2, 1000)
    args.integer("n_beta", n_beta, 8, 1024)
    args.integer("n_alpha", n_alpha, 8, 1024)
    depths = args.integers("depths", depths, 1, 2000, increasing=True)
    args.need("rho_max", 0.0 < rho_max < 1.0, f"in (0, 1) (got {rho_max!r})")
    data = fig1c_data(depth=depth, T=T, d_model=d_model, heads=heads, n_beta=n_beta,
                      n_alpha=n_alpha, depths=depths, rho_max=rho_max, marks=marks)
    return Experiment(frame(data["recs"]), data["table"], fig1c_checks(data), plot_fig1c, data)
