"""gg25 Appendix B: the REM order parameter Y2 over beta (``gg25.figB1``, Eq. B.12), the
norm and overlap after one head (``gg25.figB2``, B.5-B.6), and the row entropy and the
participation ratio's exponent (``gg25.eqB18``, B.18-B.19). Single heads come from
:func:`~.common.head_sweep`, i.i.d. REM rows are drawn here; the theory is sigprop's exact
finite-T REM (:mod:`sigprop.theory.rem`, docs/theory.md §2.3)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...theory import attention, blocks, rem
from .. import args
from ..core import Check, Experiment, frame, mean_se, register, slope
from ..plots import axes_row, decorate
from .common import BETAS11, BETAS13, head_sweep, sweep_records

__all__ = ["figB1", "figB1_data", "figB1_checks", "plot_figB1", "figB2", "figB2_data",
           "figB2_checks", "plot_figB2", "eqB18", "eqB18_data", "eqB18_checks",
           "plot_eqB18"]


# ============================================================================================
# Fig. B.1: the REM order parameter


def figB1_data(*, seed: int, T: int, d_head: int, seeds: int, rhos: np.ndarray,
               betas: np.ndarray, T_large: int) -> dict:
    """Simulated Y2 and its lines (Eq. B.12, finite-T REM at T and at T_large) per rho_in,
    with the table of the three at 0.5 and 1.5 beta_c."""
    fine = np.linspace(0.0, float(betas.max()), 241)
    sw = head_sweep(betas, rhos, T, d_head, None, seeds, seed=seed)
    recs = sweep_records(sw, betas, rhos, T, ("y2",))
    meas = sw["y2"].mean(axis=-1)
    lines, rows, gaps = {}, [], []
    for j, r in enumerate(rhos):
        asym = rem.y2_asymptotic(fine, r)
        fin = attention.attention_stats(fine * math.sqrt(math.log(T)), r, T, d_head=d_head).y2
        big = attention.attention_stats(fine * math.sqrt(math.log(T_large)), r, T_large).y2
        pts = attention.attention_stats(betas * math.sqrt(math.log(T)), r, T, d_head=d_head).y2
        gaps.append(float(np.max(np.abs(meas[:, j] - pts))))
        lines[r] = (asym, fin, big)
        for src, arr, TT in (("theory_asymptotic", asym, None), ("theory", fin, T),
                             ("theory", big, T_large)):
            for b, v in zip(fine, arr, strict=True):
                recs.append(dict(observable="y2", source=src, value=v, beta=b, rho_in=r,
                                 T=TT))
        bc = float(rem.beta_c(r))
        for b in (0.5 * bc, 1.5 * bc):
            k = int(np.argmin(np.abs(fine - b)))
            rows.append(dict(rho_in=r, beta=fine[k], beta_over_beta_c=fine[k] / bc,
                             y2_asymptotic=asym[k], y2_T=fin[k], y2_T_large=big[k]))
    return dict(recs=recs, table=pd.DataFrame(rows), sw=sw, lines=lines, gaps=gaps, fine=fine,
                T=T, T_large=T_large, d_head=d_head, seeds=seeds, rhos=rhos, betas=betas)


def figB1_checks(data: dict) -> list[Check]:
    """Simulation on the finite-T REM, Y2 -> 0 below beta_c, convergence above."""
    table, T, T_large = data["table"], data["T"], data["T_large"]
    below, above = table[table.beta_over_beta_c < 1], table[table.beta_over_beta_c > 1]
    return [
        Check.within(f"gg25 Fig. B.1: simulated Y2 (T = {T}) on the finite-T REM, max over "
                     "beta and rho_in", max(data["gaps"]), 0.0, 0.05,
                     why=f"{data['seeds']} seed(s) of {T} rows; at rho_in > 0 the queries "
                         "share a component whose norm varies from sequence to sequence, "
                         f"beyond the chi2(d_H = {data['d_head']}) spread the theory averages "
                         "over (docs/theory.md §2.3: 0.01-0.03 at rho = 0)"),
        Check.within(f"gg25 Eq. B.12: below beta_c Y2 -> 0 (finite-T REM at T = {T_large}, "
                     "beta = 0.5 beta_c)", float(below.y2_T_large.max()), 0.0, 0.01,
                     why="annealed decay ~T^-(1 - 2x^2) = T^-0.5 at x = 0.5: ~1e-3 at "
                         "T = 2^20"),
        Check.that("gg25 Eq. B.12: above beta_c the finite-T value approaches 1 - beta_c/beta "
                   f"as T grows (T = {T} -> {T_large}, beta = 1.5 beta_c)",
                   bool(np.all(np.abs(above.y2_T_large - above.y2_asymptotic)
                               < np.abs(above.y2_T - above.y2_asymptotic))),
                   float(np.max(np.abs(above.y2_T_large - above.y2_asymptotic))),
                   "closer at the larger T",
                   why="convergence in log T is slow; only the direction is claimed"),
    ]


def plot_figB1(data: dict, ax=None):
    """Y2 over beta: Eq. B.12, the finite-T REM at both lengths and the simulated dots."""
    fig, (ax,) = axes_row(ax, 1, (5.2, 3.8))
    T, fine = data["T"], data["fine"]
    for j, r in enumerate(data["rhos"]):
        c = f"C{j}"
        asym, fin, big = data["lines"][r]
        m, e = mean_se(data["sw"]["y2"][:, j])
        ax.plot(fine, asym, "-", color=c, lw=1.6, label=f"Eq. B.12 (T → ∞), ρ = {r:g}")
        ax.plot(fine, fin, "--", color=c, lw=1.0, label=f"finite-T REM, T = {T}")
        ax.plot(fine, big, ":", color=c, lw=1.0,
                label=f"finite-T REM, T = 2^{int(math.log2(data['T_large']))}")
        ax.errorbar(data["betas"], m, yerr=np.nan_to_num(e), fmt="o", ms=4, color=c,
                    label=f"simulation, T = {T}")
    decorate(ax, "β", "Y2 = E Σ_b A_ab²", "gg25 Fig. B.1: REM order parameter", size=10, legend=6)
    return fig


@register("gg25.figB1",
          tiny=dict(T=128, d_head=256, seeds=3, betas=tuple(np.linspace(0.25, 4.0, 9))),
          quick=dict(T=1024, d_head=256, seeds=2),
          runtime={"tiny": 0.4, "quick": 2.7, "default": 2.7})
def figB1(*, seed: int = 0, device: str = "cpu", T: int = 1024, d_head: int = 256,
          seeds: int = 2, rhos=(0.0, 0.5), betas=BETAS13,
          T_large: int = 2**20) -> Experiment:
    args.integer("T", T, 8, 4096)
    args.integer("d_head", d_head, 4, 4096)
    args.integer("seeds", seeds, 1, 64)
    args.integer("T_large", T_large, T, 2**22)
    rhos = args.reals("rhos", rhos, 0.0, 0.95)
    betas = args.reals("betas", betas, 0.0, 50.0)
    data = figB1_data(seed=seed, T=T, d_head=d_head, seeds=seeds, rhos=rhos, betas=betas,
                      T_large=T_large)
    return Experiment(frame(data["recs"]), data["table"], figB1_checks(data), plot_figB1, data)


# ============================================================================================
# Fig. B.2: norm and overlap after one head


def _figB2_theory(fine: np.ndarray, betas: np.ndarray, r: float, T: int, d_head: int) -> dict:
    """q_att and p_att of one head (finite T and T -> inf) on the fine grid (``line``) and at
    the simulated betas (``pts``), keyed ``(rho_in, source, grid)``."""
    theory = {}
    for src, asym in (("theory", False), ("theory_asymptotic", True)):
        for x, key in ((fine, "line"), (betas, "pts")):
            st = attention.attention_stats(x * math.sqrt(math.log(T)), r, T,
                                        d_head=None if asym else d_head, asymptotic=asym)
            qa, pa = blocks.attention_map(1.0, r, st, variant="softmax", var_v=1.0,
                                          var_b=0.0)
            theory[(r, src, key)] = (np.broadcast_to(qa, x.shape),
                                     np.broadcast_to(pa, x.shape))
    return theory


def figB2_data(*, seed: int, T: int, d_head: int, d_v: int | None, seeds: int,
               rhos: np.ndarray, betas: np.ndarray) -> dict:
    """Simulated q_att and p_att against the finite-T and T -> inf theory per rho_in, with
    the table of their ends and largest gaps, and ``values``: the head's values in words."""
    fine = np.linspace(0.0, float(betas.max()), 201)
    sw = head_sweep(betas, rhos, T, d_head, d_v, seeds, seed=seed)
    recs = sweep_records(sw, betas, rhos, T, ("q_att", "p_att"))
    theory, rows, gq, gp = {}, [], [], []
    for j, r in enumerate(rhos):
        theory.update(_figB2_theory(fine, betas, r, T, d_head))
        for src in ("theory", "theory_asymptotic"):
            qa, pa = theory[(r, src, "line")]
            for b, vq, vp in zip(fine, qa, pa, strict=True):
                recs.append(dict(observable="q_att", source=src, value=vq, beta=b, rho_in=r))
                recs.append(dict(observable="p_att", source=src, value=vp, beta=b, rho_in=r))
        mq, mp = sw["q_att"][:, j].mean(-1), sw["p_att"][:, j].mean(-1)
        tq, _ = theory[(r, "theory", "pts")]
        gq.append(float(np.max(np.abs(mq - tq))))
        gp.append(float(np.max(np.abs(mp - r))))
        rows.append(dict(rho_in=r, q_att_first=mq[0], q_att_last=mq[-1], p_att_min=mp.min(),
                         p_att_max=mp.max(), max_gap_q=gq[-1], max_dev_p=gp[-1]))
    values = ("whose values are the tokens themselves at exact cosine rho_in (an orthogonal W_V)"
              if d_v is None else f"with random values W_V ~ N(0, 1/d) of width {d_v}")
    return dict(recs=recs, table=pd.DataFrame(rows), sw=sw, theory=theory, gq=gq, gp=gp,
                fine=fine, T=T, d_head=d_head, d_v=d_v, seeds=seeds, rhos=rhos, betas=betas,
                values=values)


def figB2_checks(data: dict) -> list[Check]:
    """B.5's q_att on the theory, B.6's p_att = p, and q_att's interpolation from p to 1."""
    table, d_v, betas = data["table"], data["d_v"], data["betas"]
    return [
        Check.within("gg25 B.5 / Fig. B.2: measured q_att on the finite-T theory p + (1 - p) Y2 "
                     "(max over beta, rho_in)", max(data["gq"]), 0.0, 0.05,
                     why=f"{data['seeds']} seed(s) of {data['T']} rows; scores correlated "
                         f"through the keys and a chi2(d_H = {data['d_head']}) spread of query "
                         "norms"
                         + ("" if d_v is None else f"; values of width d_v = {d_v} scatter by "
                            f"~sqrt(2/d_v) = {math.sqrt(2 / d_v):.3f}")),
        Check.within("gg25 B.6: the overlap is not updated, p_att = p (max over beta, rho_in "
                     "of |p_att - rho_in|)", max(data["gp"]), 0.0, 0.05,
                     why="finite T adds (1 - p) Yx ~ (1 - p)/T"
                         + ("" if d_v is None else f"; finite d_v = {d_v} adds O(1/sqrt(d_v)) "
                            "to the realised overlap")),
        Check.that("gg25 B.5: q_att interpolates from p (small beta) towards 1 (large beta)",
                   bool(np.all(table.q_att_first < table.rho_in + 0.1)
                        and np.all(table.q_att_last > table.rho_in
                                   + 0.5 * (1 - table.rho_in))),
                   float(table.q_att_last.min()),
                   "q_att(beta_min) < p + 0.1 and q_att(beta_max) > p + (1 - p)/2",
                   why=f"beta from {betas[0]:g} to {betas[-1]:g}; the T -> inf limit "
                       "reaches 1 only as beta -> inf"),
    ]


def plot_figB2(data: dict, ax=None):
    """q_att (circles) and p_att (squares) over beta with their lines (dotted T -> inf)."""
    fig, (ax,) = axes_row(ax, 1, (5.2, 3.8))
    fine, theory, sw = data["fine"], data["theory"], data["sw"]
    for j, r in enumerate(data["rhos"]):
        for k, (obs, mk) in enumerate((("q_att", "o"), ("p_att", "s"))):
            c = f"C{2 * j + k}"
            line = theory[(r, "theory", "line")][k]
            asl = theory[(r, "theory_asymptotic", "line")][k]
            m, e = mean_se(sw[obs][:, j])
            ax.plot(fine, line, "-", color=c, lw=1.4, label=f"{obs}, ρ = {r:g} (finite T)")
            ax.plot(fine, asl, ":", color=c, lw=1.0)
            ax.errorbar(data["betas"], m, yerr=np.nan_to_num(e), fmt=mk, ms=4, color=c)
    decorate(ax, "β", "q_att, p_att (per dimension)",
             f"gg25 Fig. B.2: lengths after one head (T = {data['T']}; dotted T → ∞)")
    return fig


@register("gg25.figB2",
          tiny=dict(T=128, d_head=256, seeds=1, betas=tuple(np.linspace(0.25, 4.0, 7))),
          quick=dict(T=512, d_head=256, seeds=2),
          runtime={"tiny": 0.1, "quick": 0.4, "default": 0.4})
def figB2(*, seed: int = 0, device: str = "cpu", T: int = 512, d_head: int = 256,
          d_v: int | None = None, seeds: int = 2, rhos=(0.3, 0.6),
          betas=BETAS11) -> Experiment:
    args.integer("T", T, 8, 4096)
    args.integer("d_head", d_head, 4, 4096)
    if d_v is not None:
        args.integer("d_v", d_v, 4, 8192)
    args.integer("seeds", seeds, 1, 64)
    rhos = args.reals("rhos", rhos, 0.0, 0.95)
    betas = args.reals("betas", betas, 0.0, 50.0)
    data = figB2_data(seed=seed, T=T, d_head=d_head, d_v=d_v, seeds=seeds, rhos=rhos,
                      betas=betas)
    return Experiment(frame(data["recs"]), data["table"], figB2_checks(data), plot_figB2, data)


# ============================================================================================
# Eq. B.18-B.19: the row entropy and the participation ratio's exponent


def eqB18_data(*, seed: int, xs: np.ndarray, Ts: list[int], rows: int) -> dict:
    """Simulated i.i.d. REM rows at every (x, T): mean entropy / log T and Y2, with the
    finite-T REM up to T = 2^22 and B.18's limit."""
    rng = np.random.default_rng(seed)
    big = 2.0 ** np.arange(6, 23)
    recs, res = [], {}
    for x in xs:
        for T in Ts:
            v = 2.0 * x * x * math.log(T)       # beta = x sqrt 2 at rho = 0
            s = math.sqrt(v) * rng.standard_normal((rows, T))
            s -= s.max(axis=1, keepdims=True)
            logp = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
            p = np.exp(logp)
            ent = -(p * logp).sum(axis=1) / math.log(T)
            y2 = (p * p).sum(axis=1)
            res[(x, T)] = (ent.mean(), y2.mean())
            for obs, arr in (("entropy", ent), ("y2", y2)):
                m, e = mean_se(arr)
                recs.append(dict(observable=obs, source="measured", value=m, stderr=e, x=x,
                                 T=T))
        vb = 2.0 * x * x * np.log(big)
        for obs, arr in (("entropy", rem.entropy_finite(vb, big)),
                         ("y2", rem.y2_finite(vb, big))):
            for T, val in zip(big, arr, strict=True):
                recs.append(dict(observable=obs, source="theory", value=val, x=x, T=T))
        recs.append(dict(observable="entropy", source="theory_asymptotic", value=1 - x * x, x=x))
    table = pd.DataFrame([dict(x=x, T=T, entropy=res[(x, T)][0], y2=res[(x, T)][1],
                               entropy_B18=1 - x * x) for x in xs for T in Ts])
    ent_T = {x: rem.entropy_finite(2 * x * x * np.log(big), big) for x in xs}
    return dict(recs=recs, table=table, res=res, big=big, ent_T=ent_T, xs=xs, Ts=Ts,
                rows=rows)


def eqB18_checks(data: dict, x_exponent: float) -> list[Check]:
    """B.18 on the exact finite-T REM and its limit; B.19's exponent against the simulated
    rows (a :meth:`Check.differs`)."""
    res, xs, Ts, ent_T = data["res"], data["xs"], data["Ts"], data["ent_T"]
    gap = max(abs(res[(x, T)][0] - float(rem.entropy_finite(2 * x * x * math.log(T), T)))
              for x in xs for T in Ts)
    conv = max(abs(float(ent_T[x][-1]) - (1 - x * x)) for x in xs if x <= 0.5)
    xe = float(x_exponent)
    sim_slope = slope(Ts, [res[(xe, T)][1] for T in Ts])
    return [
        Check.within("gg25 B.18: simulated row entropy / log T on the exact finite-T REM "
                     "(max over x, T)", gap, 0.0, 0.015,
                     why=f"{data['rows']} i.i.d. REM rows per point: standard error <~ 0.005"),
        Check.within("gg25 B.18: entropy / log T -> 1 - x^2 (finite-T REM at T = 2^22, "
                     "x <= 1/2)", conv, 0.0, 0.01,
                     why="the O(1/log T) correction is ~0.005 at T = 2^22 for x <= 1/2"),
        Check.differs(f"gg25 B.19: Y2 ~ e^-S = T^-(1 - x^2), exponent {-(1 - xe * xe):.3f} at "
                      f"x = {xe:g}", sim_slope, -(1 - 2 * xe * xe) - 0.08,
                      -(1 - 2 * xe * xe) + 0.08,
                      paper=f"B.19 reads Y2 as the inverse number of attended keys e^S, "
                            f"exponent -(1 - x^2) = {-(1 - xe * xe):.3f}; the simulated REM "
                            f"rows give {sim_slope:.3f} over T = {Ts[0]}..{Ts[-1]}, the "
                            f"annealed -(1 - 2x^2) = {-(1 - 2 * xe * xe):.3f}",
                      why="log-log slope over the simulated lengths; the exact finite-T REM "
                          "gives -0.48 over T = 2^6..2^12 at x = 1/2; band 0.08"),
    ]


def plot_eqB18(data: dict, ax=None):
    """Left entropy / log T over T, right Y2 over T with B.19's power law through the first
    point."""
    fig, (ax0, ax1) = axes_row(ax, 2, (10.0, 3.8))
    res, big, Ts = data["res"], data["big"], data["Ts"]
    for k, x in enumerate(data["xs"]):
        c = f"C{k}"
        ax0.plot(big, data["ent_T"][x], "-", color=c, lw=1.4, label=f"x = {x:g}")
        ax0.axhline(1 - x * x, color=c, ls=":", lw=1.0)
        ax0.plot(Ts, [res[(x, T)][0] for T in Ts], "o", color=c, ms=4)
        y2t = rem.y2_finite(2 * x * x * np.log(big), big)
        ax1.plot(big, y2t, "-", color=c, lw=1.4, label=f"x = {x:g}")
        ax1.plot(big, big ** -(1 - x * x) * y2t[0] * big[0] ** (1 - x * x), "--", color=c,
                 lw=0.8)
        ax1.plot(Ts, [res[(x, T)][1] for T in Ts], "o", color=c, ms=4)
    for a in (ax0, ax1):
        a.set_xscale("log", base=2)
        a.set_xlabel("T")
    ax1.set_yscale("log")
    ax0.set_ylabel("entropy / log T")
    ax1.set_ylabel("Y2")
    ax0.set_title("gg25 Eq. B.18: lines finite-T REM, dotted 1 − x², dots simulation",
                  fontsize=8)
    ax1.set_title("B.19: dashed T^−(1−x²) (through the first point), lines exact", fontsize=8)
    ax0.legend(fontsize=7)
    return fig


@register("gg25.eqB18", tiny=dict(Ts=(64, 256, 1024), rows=128),
          quick=dict(Ts=(64, 256, 1024, 4096), rows=512),
          runtime={"tiny": 0.1, "quick": 0.4, "default": 0.4})
def eqB18(*, seed: int = 0, device: str = "cpu", xs=(0.2, 0.35, 0.5, 0.7),
          Ts=(64, 256, 1024, 4096), rows: int = 512, x_exponent: float = 0.5) -> Experiment:
    xs = args.reals("xs", xs, 0.01, 0.99)
    Ts = args.integers("Ts", Ts, 8, 2**16, increasing=True, n_min=2)
    args.integer("rows", rows, 8, 100_000)
    args.need("x_exponent", x_exponent in set(xs.tolist()), f"one of xs (got {x_exponent!r})")
    data = eqB18_data(seed=seed, xs=xs, Ts=Ts, rows=rows)
    return Experiment(frame(data["recs"]), data["table"], eqB18_checks(data, x_exponent),
                      plot_eqB18, data)
