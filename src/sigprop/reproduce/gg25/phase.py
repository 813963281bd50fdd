"""gg25 Fig. 3: the one-head phase diagram over (beta, rho_in) (Eqs. 13-14) and the
finite-size shift of its transition (Sec. 3.2.2, B.7), one softmax head simulated exactly
(:func:`~.common.head_sweep`) against sigprop's finite-T block map and gg25's T -> inf map."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...spec import ArchSpec
from ...theory import depth as tdepth
from ...theory import rem
from .. import args
from ..core import Check, Experiment, frame, register, slope
from ..plots import axes_row, decorate
from .common import BETAS16, crossing, head_sweep, sweep_records

__all__ = ["fig3", "fig3_data", "fig3_checks", "plot_fig3", "one_head_cos"]


def _one_head_spec(T: int, d_head: int) -> ArchSpec:
    """One post-LN block that is a single softmax head: no residuals, a linear MLP (which
    keeps the cosine in the mean field), sigma_v^2 = 1. Its block map is the head's."""
    return ArchSpec(depth=1, d_model=d_head, heads=1, seq_len=T, beta=1.0, alpha_attn=0.0,
                    alpha_mlp=0.0, activation="linear", sigma_v2=1.0, sigma_w2=1.0)


def one_head_cos(betas, rhos, T: int, d_head: int, asymptotic: bool = False) -> np.ndarray:
    """Mean output cosine of one head, (n_beta, n_rho): the finite-T block map of a single
    softmax head (with the LayerNorm average of docs/theory.md §2.3.3), or gg25's Eq. 14 in
    the T -> inf limit."""
    return tdepth.final_cos(_one_head_spec(T, d_head), beta=np.asarray(betas)[:, None],
                            rho0=np.asarray(rhos)[None, :], asymptotic=asymptotic)


def _measured(data: dict, betas, rhos, Ts, d_head: int, seeds: int, seed: int) -> None:
    """Simulated heads at every length: mean cos, the finite-T theory at the same points and
    the measured transitions (``data["meas"]``, ``["fin"]``, ``["b_meas"]``)."""
    pos, lvl, recs = rhos[rhos > 0], data["lvl"], data["recs"]
    meas, fin, b_meas = {}, {}, {}
    for T in Ts:
        sw = head_sweep(betas, rhos, T, d_head, None, seeds, seed=seed + T)
        meas[T] = sw["cos"].mean(axis=-1)
        fin[T] = one_head_cos(betas, rhos, T, d_head)
        recs += sweep_records(sw, betas, rhos, T, ("cos",))
        for i, b in enumerate(betas):
            for j, r in enumerate(rhos):
                recs.append(dict(observable="cos", source="theory", value=fin[T][i, j],
                                 beta=b, rho_in=r, T=T))
        m_pos = meas[T][:, rhos > 0]
        b_meas[T] = np.array([crossing(betas, m_pos[:, j], lvl[j]) for j in range(pos.size)])
    data.update(meas=meas, fin=fin, b_meas=b_meas)


def fig3_data(*, seed: int, Ts: list[int], betas: np.ndarray, rhos: np.ndarray, d_head: int,
              seeds: int, level: float, theory_Ts: list[int]) -> dict:
    """The T -> inf map on a fine beta grid, simulated heads and finite-T theory at every
    length, and the transitions (cos ``level`` of the way from 1 to rho_in) of all three."""
    fine = np.linspace(0.05, 6.0, 360)
    pos = rhos[rhos > 0]
    lvl = 1.0 - level * (1.0 - pos)       # 10% of the way from rank collapse (1) to rho_in
    bc = np.asarray(rem.beta_c(pos))
    asym = one_head_cos(fine, rhos, Ts[-1], d_head, asymptotic=True)
    a_pos = asym[:, rhos > 0]
    b_asym = np.array([crossing(fine, a_pos[:, j], lvl[j]) for j in range(pos.size)])
    # where the T -> inf map leaves 1: Eq. 13's beta_c(rho)
    leave = np.array([fine[np.argmax(a_pos[:, j] < 1.0 - 1e-12)] for j in range(pos.size)])
    recs, rows = [], []
    for i, b in enumerate(fine):
        for j, r in enumerate(rhos):
            recs.append(dict(observable="cos", source="theory_asymptotic", value=asym[i, j],
                             beta=b, rho_in=r))
    data = dict(recs=recs, lvl=lvl)
    _measured(data, betas, rhos, Ts, d_head, seeds, seed)
    b_meas, b_fin = data["b_meas"], {}
    for T in sorted(set(theory_Ts) | set(Ts)):
        c = one_head_cos(fine, pos, T, d_head)
        b_fin[T] = np.array([crossing(fine, c[:, j], lvl[j]) for j in range(pos.size)])
    for j, r in enumerate(pos):
        row = dict(rho_in=r, beta_c=bc[j], leaves_one_at=leave[j], crossing_asymptotic=b_asym[j])
        for T in Ts:
            row[f"crossing_measured_T{T}"] = b_meas[T][j]
        for T, v in b_fin.items():
            row[f"crossing_theory_T{T}"] = v[j]
            recs.append(dict(observable="shift", source="theory", value=b_asym[j] - v[j],
                             rho_in=r, T=T))
        for T in Ts:
            recs.append(dict(observable="shift", source="measured",
                             value=b_asym[j] - b_meas[T][j], rho_in=r, T=T))
        rows.append(row)
    data.update(table=pd.DataFrame(rows), fine=fine, pos=pos, bc=bc, asym=asym, leave=leave,
                b_fin=b_fin, Ts=Ts, betas=betas, rhos=rhos, d_head=d_head, seeds=seeds,
                theory_Ts=theory_Ts, shifts_meas={T: b_asym - b_meas[T] for T in Ts},
                th_shift=np.array([b_asym - b_fin[T] for T in sorted(b_fin)]))  # (n_T, n_rho)
    return data


def fig3_checks(data: dict) -> list[Check]:
    """Eq. 13-14's transition, theory vs measured, the shift's sign, its decrease in T and
    its (log T)^k closing."""
    Ts, theory_Ts, fine = data["Ts"], data["theory_Ts"], data["fine"]
    shifts_meas, th_shift, b_fin = data["shifts_meas"], data["th_shift"], data["b_fin"]
    step = fine[1] - fine[0]
    logT = np.log(np.array(sorted(b_fin), dtype=float))
    gap = max(float(np.max(np.abs(data["meas"][T] - data["fin"][T]))) for T in Ts)
    checks = [
        Check.within("gg25 Eq. 13-14: the T -> inf map leaves cos = 1 exactly at beta_c(rho) = "
                     "sqrt(2/(1 - rho)) (max over rho_in of |beta_leave - beta_c|)",
                     float(np.max(np.abs(data["leave"] - data["bc"]))), 0.0, step + 1e-9,
                     why=f"beta grid step {step:.3f}"),
        Check.within("gg25 Fig. 3 (right) vs sigprop's finite-T theory: max |theory - "
                     "measured| cos over the (beta, rho_in) grid", gap, 0.0, 0.04,
                     why=f"{data['seeds']} seed(s) per point, d_H = {data['d_head']}: the "
                         "query norms' chi2 spread and the rows' sampling (measured 0.011 at "
                         "T = 512, d = 1024 in tests/measurement/test_agreement.py)"),
        Check.that("gg25 Sec. 3.2.2: the measured transition (cos 10% of the way from 1 to "
                   "rho_in) lies below the T -> inf one at every rho_in > 0",
                   bool(np.all(shifts_meas[Ts[-1]] > 0)), float(np.min(shifts_meas[Ts[-1]])),
                   "beta_asymptotic - beta_measured > 0",
                   why="finite T: rows condense gradually, Y2 >= 1/T rises before beta_c"),
        Check.that("gg25 B.7: the finite-size shift shrinks as T grows (finite-T theory, "
                   f"T = {theory_Ts[0]} ... {theory_Ts[-1]}, every rho_in > 0)",
                   bool(np.all(np.diff(th_shift, axis=0) < 0)), float(th_shift[-1].mean()),
                   "decreasing in T",
                   why="exact finite-T REM (docs/theory.md §2.3); monotone at every rho_in"),
        Check.within("sigprop: the shift closes slowly, like (log T)^k: slope of log(shift) "
                     "against log log T", slope(logT, th_shift.mean(axis=1)), -0.85, -0.35,
                     why="fitted over the finite-T theory from T = 64 to 2^20 (measured "
                         "-0.55); B.7's entropy argument makes the shift vanish only "
                         "logarithmically in T"),
    ]
    if len(Ts) > 1:
        checks.append(Check.that(
            f"gg25 Sec. 3.2.2: the measured shift is smaller at T = {Ts[-1]} than at T = "
            f"{Ts[0]} (mean over rho_in > 0)",
            shifts_meas[Ts[-1]].mean() < shifts_meas[Ts[0]].mean(),
            float(shifts_meas[Ts[-1]].mean()), f"< {shifts_meas[Ts[0]].mean():.3f}",
            why="the finite-T theory predicts a decrease of "
                f"{(b_fin[Ts[0]] - b_fin[Ts[-1]]).mean():.2f} between these lengths"))
    return checks


def plot_fig3(data: dict, ax=None):
    """Three panels: the T -> inf diagram, the measured one at the largest T with its
    transition, and the shift over T (lines theory, dots measured)."""
    fig, (ax0, ax1, ax2) = axes_row(ax, 3, (13.0, 3.8))
    Ts, betas, rhos, pos = data["Ts"], data["betas"], data["rhos"], data["pos"]
    rr = np.linspace(0.0, 0.95, 200)
    for a, z, x, title in ((ax0, data["asym"], data["fine"], "theory, T → ∞ (Eq. 14)"),
                           (ax1, data["meas"][Ts[-1]], betas, f"measured, T = {Ts[-1]}")):
        im = a.pcolormesh(x, rhos, z.T, vmin=0.0, vmax=1.0, cmap="viridis", shading="nearest")
        a.plot(np.sqrt(2.0 / (1.0 - rr)), rr, "w--", lw=1.2, label="β_c(ρ) = √(2/(1-ρ))")
        a.set_xlim(betas[0], betas[-1])
        decorate(a, "β", "ρ_in", f"gg25 Fig. 3: {title}", legend=None)
        fig.colorbar(im, ax=a, label="ρ_out")
    ax1.plot(data["b_meas"][Ts[-1]], pos, "ro", ms=4, label="measured transition")
    ax1.legend(fontsize=7, loc="lower right")
    grid_T = np.array(sorted(data["b_fin"]), dtype=float)
    for j, r in enumerate(pos):
        c = f"C{j}"
        ax2.plot(grid_T, data["th_shift"][:, j], "-", color=c, lw=1.2, label=f"ρ_in = {r:g}")
        ax2.plot(Ts, [data["shifts_meas"][T][j] for T in Ts], "o", color=c, ms=5)
    ax2.set_xscale("log", base=2)
    decorate(ax2, "T", "β_∞ − β_T (transition shift)",
             "finite-size shift: lines theory, dots measured")
    return fig


@register("gg25.fig3",
          tiny=dict(Ts=(64,), betas=tuple(np.round(np.linspace(0.25, 4.0, 11), 3)),
                    rhos=(0.0, 0.3, 0.6), d_head=64, seeds=1, theory_Ts=(64, 2**10, 2**16)),
          quick=dict(Ts=(64, 512), betas=tuple(np.round(np.linspace(0.25, 4.0, 16), 3)),
                     rhos=(0.0, 0.15, 0.3, 0.45, 0.6, 0.75), d_head=256, seeds=2),
          runtime={"tiny": 0.7, "quick": 6.8, "default": 6.8})
def fig3(*, seed: int = 0, device: str = "cpu", Ts=(64, 512), betas=BETAS16,
         rhos=(0.0, 0.15, 0.3, 0.45, 0.6, 0.75), d_head: int = 256, seeds: int = 2,
         level: float = 0.1, theory_Ts=(2**6, 2**8, 2**10, 2**12, 2**16, 2**20)) -> Experiment:
    Ts = args.integers("Ts", Ts, 8, 4096, increasing=True)
    betas = args.reals("betas", betas, 0.0, 50.0)
    rhos = args.reals("rhos", rhos, 0.0, 0.95)
    args.need("betas", betas.size >= 4 and bool(np.all(np.diff(betas) > 0)),
              f"an increasing list of >= 4 values (got {betas!r})")
    args.need("rhos", bool(np.any(rhos > 0)), f"a list with some rho_in > 0 (got {rhos!r})")
    args.integer("d_head", d_head, 4, 4096)
    args.integer("seeds", seeds, 1, 64)
    args.need("level", 0.0 < level < 0.5, f"in (0, 0.5) (got {level!r})")
    theory_Ts = args.integers("theory_Ts", theory_Ts, 8, 2**22, increasing=True)
    data = fig3_data(seed=seed, Ts=Ts, betas=betas, rhos=rhos, d_head=d_head, seeds=seeds,
                     level=level, theory_Ts=theory_Ts)
    return Experiment(frame(data["recs"]), data["table"], fig3_checks(data), plot_fig3, data)
