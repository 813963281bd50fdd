"""noci22 §3.2-3.3, the forward pass under uniform attention, linear activation and no
LayerNorm: ``noci22.lemma3_2`` (Eqs. 10-11), ``noci22.lemma3_3`` (Eqs. 12-13), ``noci22.thm3_3``
(Eqs. 15-16) and ``noci22.fig8`` (norm and correlation with and without depth-scaled
residuals). Each item is a data function, a checks function and a plot function composed by
the registered item."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...theory import uniform as U
from .. import args
from ..core import Check, Experiment, frame, mean_se, one_thread, register, slope
from ..plots import axes_row, decorate
from .common import Z, log_x, ratio_diff_se, slope_se
from .network import (
    CONFIGS,
    ForwardSizes,
    residual_alphas,
    rho_of,
    simulate,
    simulate_nn,
)

__all__ = ["lemma3_2", "lemma3_3", "thm3_3", "fig8", "moment_data", "moment_checks",
           "plot_moments", "thm3_3_data", "thm3_3_checks", "plot_thm3_3", "fig8_data",
           "fig8_checks", "plot_fig8"]

_EQ = {"C": ("Eq. 10", "Eq. 11", "E C(X^ℓ) / C(X⁰)", "lemma32_C"),
       "F": ("Eq. 12", "Eq. 13", "E ‖X^ℓ‖²_F / ‖X⁰‖²_F", "lemma33_norm")}


def _moment_theory(which, ell, a1, a2, C0, F0, n):
    return (U.lemma32_C(ell, a1, a2, C0) if which == "C"
            else U.lemma33_norm(ell, a1, a2, C0, F0, n))


def _moment_nn(recs, *, depth, n, d, inp, nn_seeds, seed, sim0) -> float:
    """The same network on sigprop.nn (noci_spec gauge), other weight draws: its records and
    the largest deviation from Eq. 10 in units of its tolerance."""
    ell = np.arange(depth + 1)
    c_nn = simulate_nn(depth, 0.5, 0.5, n, d, inp, nn_seeds, seed) / sim0["C0"]
    th = U.lemma32_C(ell, 0.5, 0.5, sim0["C0"]) / sim0["C0"]
    m, se = mean_se(c_nn)
    for i in ell:
        recs.append(dict(observable="C_ratio_nn", source="measured", value=m[i],
                         stderr=se[i], layer=int(i), config="α₁ = α₂ = 0.5 (sigprop.nn)",
                         depth=depth))
    return float(np.max(np.abs(m[1:] - th[1:]) / (Z * se[1:] + 0.01 * th[1:])))


def moment_data(which: str, *, seed, device, n, d, rho0, depth, seeds, depths, at,
                sweep_seeds, nn_seeds=0) -> dict:
    """lemma3_2's (``which = "C"``) or lemma3_3's (``"F"``) data: the tidy frame and the
    numbers its checks rest on."""
    inp = ("rho", rho0)
    recs, per_layer_err, per_layer_se = [], [], []
    ell = np.arange(depth + 1)
    sim0 = None
    for label, kind, c1, c2 in CONFIGS:
        a1, a2 = residual_alphas(kind, depth, *((at, at) if kind == "scaled" else (c1, c2)))
        sim = simulate(depth, a1, a2, n, d, inp, seeds, seed, device=device)
        sim0 = sim
        C0, F0 = sim["C0"], sim["F0"]
        norm0 = C0 if which == "C" else F0
        th = _moment_theory(which, ell, a1, a2, C0, F0, n) / norm0
        m, se = mean_se(sim[which] / norm0)
        per_layer_err.append(np.abs(m[1:] / th[1:] - 1.0))
        per_layer_se.append(np.abs(m[1:] - th[1:]) / (Z * se[1:] + 0.01 * th[1:]))
        for i in ell:
            recs.append(dict(observable=which + "_ratio", source="measured", value=m[i],
                             stderr=se[i], layer=int(i), config=label, depth=depth))
            recs.append(dict(observable=which + "_ratio", source="theory", value=th[i],
                             layer=int(i), config=label, depth=depth))
    # the same numbers from sigprop's (q, p) recursion (depth.propagate via propagate_noci)
    C0, F0 = sim0["C0"], sim0["F0"]
    rho_in = C0 / ((n - 1) * F0) - 1 / (n - 1)
    tr = U.propagate_noci(depth, 0.3, 0.8, n, rho_in, d=d, sigma_x2=F0 / (n * d))
    closed = _moment_theory(which, ell, 0.3, 0.8, C0, F0, n)
    same = float(np.max(np.abs(getattr(tr, which) / closed - 1.0)))
    # vs total depth L, depth-scaled residuals: the limit (Eq. 11 / 13)
    lim = (math.exp(2 * at) if which == "C"
           else math.exp(at) * ((math.exp(at) - 1) * C0 / n + F0) / F0)
    final = []
    for L in depths:
        a1, a2 = residual_alphas("scaled", int(L), at, at)
        sim = simulate(int(L), a1, a2, n, d, inp, sweep_seeds, seed, device=device)
        norm0 = sim["C0"] if which == "C" else sim["F0"]
        m, se = mean_se(sim[which][-1] / norm0)
        th = _moment_theory(which, L, a1, a2, sim["C0"], sim["F0"], n) / norm0
        final.append((int(L), m, se, float(th)))
        recs.append(dict(observable=which + "_final", source="measured", value=m, stderr=se,
                         depth=int(L), config="α² = α̃/L"))
        recs.append(dict(observable=which + "_final", source="theory", value=float(th),
                         depth=int(L), config="α² = α̃/L"))
    recs.append(dict(observable=which + "_limit", source="theory", value=lim,
                     config="α² = α̃/L"))
    dev_nn = None
    if which == "C":
        dev_nn = _moment_nn(recs, depth=depth, n=n, d=d, inp=inp, nn_seeds=nn_seeds,
                            seed=seed, sim0=sim0)
    return dict(frame=frame(recs), which=which, eq=_EQ[which], depth=depth, seeds=seeds,
                nn_seeds=nn_seeds, at=at, per_layer_err=per_layer_err,
                per_layer_se=per_layer_se, same=same, lim=lim, final=final, dev_nn=dev_nn)


def moment_checks(data: dict) -> list[Check]:
    """The claims of Lemma 3.2 / 3.3 held to :func:`moment_data`'s numbers."""
    eq, depth, seeds, lim = data["eq"], data["depth"], data["seeds"], data["lim"]
    dev = float(np.max(np.concatenate(data["per_layer_se"])))
    Lmax, mL, seL, thL = data["final"][-1]
    checks = [
        Check.within(f"noci22 {eq[0]}: {eq[2]} of the simulated network equals the formula at "
                     f"every layer (3 residual settings, L = {depth}); largest deviation in "
                     "units of its tolerance", dev, hi=1.0,
                     why=f"tolerance per point {Z:g} standard errors ({seeds} weight draws; "
                         "the product of random layers is heavy-tailed) + 1%"),
        Check.within(f"noci22 {eq[0]} is sigprop's (q, p) recursion with uniform attention "
                     f"(uniform.propagate_noci vs uniform.{eq[3]})", data["same"], hi=1e-10,
                     why="both exact; 1e-10 relative is roundoff over L layers"),
        Check.within(f"noci22 {eq[1]}: with α_i² = α̃/L the deepest network (L = {Lmax}) "
                     f"reaches the limit {lim:.4g}", mL, lim - abs(thL - lim) - Z * seL,
                     lim + abs(thL - lim) + Z * seL,
                     why=f"finite-L correction |{eq[0]}(L) - limit| = {abs(thL - lim):.3g} "
                         f"plus {Z:g} standard errors"),
    ]
    if data["dev_nn"] is not None:
        checks.append(Check.within(
            "noci22 Eq. 10 also holds for sigprop.nn's SigpropTransformer built from "
            "uniform.noci_spec (α₁ = α₂ = 0.5 folded into W_V, W_2); largest deviation in units "
            "of its tolerance", data["dev_nn"], hi=1.0,
            why=f"{Z:g} standard errors of {data['nn_seeds']} draws + 1% per layer"))
    return checks


def plot_moments(data: dict, ax=None):
    """Lemma 3.2 / 3.3's figure: the ratio over layers for the three residual settings, and
    the final ratio over depth against the limit. ``ax``: two axes to draw on."""
    fig, (ax1, ax2) = axes_row(ax, 2, (9.0, 3.5))
    which, eq, df, final = data["which"], data["eq"], data["frame"], data["final"]
    for i, (label, _, _, _) in enumerate(CONFIGS):
        sub = df[(df["config"] == label) & (df["observable"] == which + "_ratio")]
        t = sub[sub["source"] == "theory"]
        mm = sub[sub["source"] == "measured"]
        ax1.plot(t["layer"], t["value"], "-", color=f"C{i}", lw=1.2)
        ax1.errorbar(mm["layer"], mm["value"], yerr=Z / 2 * mm["stderr"], fmt="o", ms=3.5,
                     color=f"C{i}", label=label)
    ax1.set_yscale("log")
    decorate(ax1, "layer ℓ", eq[2],
             f"noci22 Lemma {'3.2' if which == 'C' else '3.3'} ({eq[0]}), L = {data['depth']}",
             frameon=False, legend_title=f"lines: {eq[0]}; markers ±2 SE", title_fontsize=7)
    Ls = np.array([f[0] for f in final])
    ax2.plot(Ls, [f[3] for f in final], "-", color="C2", label=f"{eq[0]} at α² = α̃/L")
    ax2.errorbar(Ls, [f[1] for f in final], yerr=[Z / 2 * f[2] for f in final], fmt="o",
                 ms=4, color="C2", label="simulation")
    ax2.axhline(data["lim"], ls="--", color="k", lw=1, label=f"{eq[1]} limit")
    log_x(ax2, Ls)
    decorate(ax2, "depth L", eq[2].replace("ℓ", "L"), f"noci22 {eq[1]}: α̃₁ = α̃₂ = {data['at']:g}",
             frameon=False)
    return fig


def _moment_item(which: str, *, seed, device, n, d, rho0, depth, seeds, depths, alpha_tilde,
                 sweep_seeds, nn_seeds=0):
    """Shared body of lemma3_2 (``which = "C"``) and lemma3_3 (``"F"``)."""
    device = args.device(device)
    sz = ForwardSizes.checked(n=n, d=d, rho0=rho0, depth=depth, seeds=seeds, depths=depths,
                              alpha_tilde=alpha_tilde)
    sweep_seeds = args.integer("sweep_seeds", sweep_seeds, 4, 100_000)
    data = moment_data(which, seed=seed, device=device, **sz.data_kw(), sweep_seeds=sweep_seeds,
                       nn_seeds=nn_seeds)
    checks = moment_checks(data)
    Lmax, mL, _, thL = data["final"][-1]
    table = pd.DataFrame([dict(config=c[0], max_rel_err=float(e.max()))
                          for c, e in zip(CONFIGS, data["per_layer_err"], strict=True)]
                         + [dict(config=f"L = {Lmax} (scaled)", measured=mL, theory=thL,
                                 limit=data["lim"])])
    return Experiment(data["frame"], table, checks, plot_moments, data)


@register("noci22.lemma3_2",
          tiny=dict(n=8, d=16, depth=4, seeds=48, depths=(4, 16), sweep_seeds=32, nn_seeds=32),
          quick=dict(seeds=400, sweep_seeds=200, nn_seeds=128),
          runtime={"tiny": 0.1, "quick": 1.2, "default": 0.5})
@one_thread
def lemma3_2(*, seed: int = 0, device: str = "cpu", n: int = 16, d: int = 32,
             rho0: float = 0.2, depth: int = 10, seeds: int = 200,
             depths: Sequence[int] = (4, 16, 64), alpha_tilde: float = 1.0,
             sweep_seeds: int = 100, nn_seeds: int = 64) -> Experiment:
    return _moment_item("C", seed=seed, device=device, n=n, d=d, rho0=rho0, depth=depth,
                        seeds=seeds, depths=depths, alpha_tilde=alpha_tilde,
                        sweep_seeds=sweep_seeds,
                        nn_seeds=args.integer("nn_seeds", nn_seeds, 4, 100_000))


@register("noci22.lemma3_3",
          tiny=dict(n=8, d=16, depth=4, seeds=48, depths=(4, 16), sweep_seeds=32),
          quick=dict(seeds=400, sweep_seeds=200),
          runtime={"tiny": 0.05, "quick": 0.1, "default": 0.1})
@one_thread
def lemma3_3(*, seed: int = 0, device: str = "cpu", n: int = 16, d: int = 32,
             rho0: float = 0.2, depth: int = 10, seeds: int = 200,
             depths: Sequence[int] = (4, 16, 64), alpha_tilde: float = 1.0,
             sweep_seeds: int = 100) -> Experiment:
    return _moment_item("F", seed=seed, device=device, n=n, d=d, rho0=rho0, depth=depth,
                        seeds=seeds, depths=depths, alpha_tilde=alpha_tilde,
                        sweep_seeds=sweep_seeds)


def _rho_recs(label, m, se, cm, cse, th, depth):
    return [rec for i in range(depth + 1) for rec in (
        dict(observable="rho", source="measured", value=m[i], stderr=se[i], layer=i,
             config=label, depth=depth),
        dict(observable="mean_cos", source="measured", value=cm[i], stderr=cse[i], layer=i,
             config=label, depth=depth),
        dict(observable="rho", source="theory", value=th[i], layer=i, config=label,
             depth=depth))]


def _rho_final(recs, L, a1, a2, *, n, d, inp, seeds, seed, device, r_in, label):
    """The correlation at the last layer of an L-layer network and its recursion value."""
    sim = simulate(int(L), a1, a2, n, d, inp, seeds, seed, device=device)
    m, se = rho_of(sim, n)
    th = float(U.propagate_noci(int(L), a1, a2, n, r_in, d=d).rho[-1])
    recs += [dict(observable="rho_final", source="measured", value=m[-1], stderr=se[-1],
                  depth=int(L), config=label),
             dict(observable="rho_final", source="theory", value=th, depth=int(L),
                  config=label)]
    return sim, m[-1], se[-1], th


def thm3_3_data(*, seed, device, n, d, rho0, depth, seeds, depths, at, alt, sweep_seeds,
                const_depths) -> dict:
    """Thm 3.3's data: ρ per layer for α = 1 and depth-scaled residuals, ρ at the last layer
    over depth for two α̃₂ and for α = 1, and Eq. 15's limit."""
    inp = ("rho", rho0)
    recs, devs = [], []
    configs = (("α₁ = α₂ = 1", "const"), (f"α² = {at:g}/L", "scaled"))
    for label, kind in configs:
        a1, a2 = residual_alphas(kind, depth, *((at, at) if kind == "scaled" else (1.0, 1.0)))
        sim = simulate(depth, a1, a2, n, d, inp, seeds, seed, device=device)
        r_in = sim["C0"] / ((n - 1) * sim["F0"]) - 1 / (n - 1)
        th = U.propagate_noci(depth, a1, a2, n, r_in, d=d).rho
        m, se = rho_of(sim, n)
        cm, cse = mean_se(sim["cos"])
        devs.append(np.abs(m[1:] - th[1:]) / (Z * se[1:] + 0.005))
        recs += _rho_recs(label, m, se, cm, cse, th, depth)
    sim_any = simulate(depth, 1.0, 1.0, n, d, inp, seeds, seed, device=device)
    C0, F0 = sim_any["C0"], sim_any["F0"]
    lim = float(U.thm33_rho_limit(at, C0, F0, n))
    r_in = C0 / ((n - 1) * F0) - 1 / (n - 1)
    kw = dict(n=n, d=d, inp=inp, seeds=sweep_seeds, seed=seed, device=device, r_in=r_in)
    finals = {}
    for a2t in (at, alt):
        for L in depths:
            a1, a2 = residual_alphas("scaled", int(L), at, a2t)
            sim, m, se, th = _rho_final(recs, L, a1, a2, label=f"α̃₂ = {a2t:g}", **kw)
            finals[(a2t, int(L))] = (m, se, th)
            finals[("sim", a2t, int(L))] = sim
    recs.append(dict(observable="rho_limit", source="theory", value=lim, config="Eq. 15"))
    const = []
    for L in const_depths:
        _, m, se, th = _rho_final(recs, L, 1.0, 1.0, label="α₁ = α₂ = 1", **kw)
        const.append((int(L), m, se, th))
    return dict(frame=frame(recs), n=n, depth=depth, seeds=seeds, depths=depths, at=at,
                alt=alt, configs=configs, devs=devs, lim=lim, finals=finals, const=const)


def thm3_3_checks(data: dict) -> list[Check]:
    """Thm 3.3's claims (Eqs. 15-16) held to :func:`thm3_3_data`'s numbers."""
    n, depth, at, alt, lim = data["n"], data["depth"], data["at"], data["alt"], data["lim"]
    finals, Lmax = data["finals"], int(data["depths"][-1])
    mA, seA, thA = finals[(at, Lmax)]
    sA, sB = finals[("sim", at, Lmax)], finals[("sim", alt, Lmax)]  # same weight draws
    dAB, dAB_se = ratio_diff_se(sA["C"][-1], sA["F"][-1], sB["C"][-1], sB["F"][-1])
    dAB, dAB_se = dAB / (n - 1), dAB_se / (n - 1)
    Lc, mc, sec, thc = data["const"][-1]
    return [
        Check.within("noci22 Thm 3.3: the correlation E C / ((n-1) E||X||²) - 1/(n-1) of the "
                     f"simulated network follows the recursion at every layer (L = {depth}, "
                     "α = 1 and depth-scaled); largest deviation in units of its tolerance",
                     float(np.max(np.concatenate(data["devs"]))), hi=1.0,
                     why=f"{Z:g} delta-method standard errors of a ratio of means over "
                         f"{data['seeds']} draws + 0.005 per layer"),
        Check.within(f"noci22 Eq. 15: with α_i² = α̃_i/L the correlation at L = {Lmax} reaches "
                     f"the limit {lim:.4f}", mA, lim - abs(thA - lim) - Z * seA,
                     lim + abs(thA - lim) + Z * seA,
                     why=f"finite-L correction {abs(thA - lim):.2g} (O(α̃²/L)) plus {Z:g} "
                         "standard errors"),
        Check.within(f"noci22 Eq. 15 does not depend on α̃₂: ρ^L at α̃₂ = {at:g} minus at "
                     f"α̃₂ = {alt:g} (L = {Lmax}, the same weight draws)", dAB,
                     -(Z * dAB_se + 0.005), Z * dAB_se + 0.005,
                     why=f"{Z:g} paired delta-method standard errors + 0.005 (E C and "
                         "E||X||² carry the same factor (1+α₂²)^L, so the difference is "
                         "exactly 0)"),
        Check.within(f"noci22 Eq. 16: with constant α = 1 the correlation tends to 1 (measured "
                     f"at L = {Lc}; recursion {thc:.6f})", mc, thc - Z * sec - 0.005, 1.0,
                     why=f"{Z:g} standard errors + 0.005 below the recursion's value"),
    ]


def plot_thm3_3(data: dict, ax=None):
    """Thm 3.3's figure: ρ over layers (left), ρ at the last layer over depth (right)."""
    fig, (ax1, ax2) = axes_row(ax, 2, (9.0, 3.5))
    df, finals, const, lim = data["frame"], data["finals"], data["const"], data["lim"]
    for i, (label, _) in enumerate(data["configs"]):
        sub = df[df["config"] == label]
        t = sub[(sub["observable"] == "rho") & (sub["source"] == "theory")]
        mm = sub[(sub["observable"] == "rho") & (sub["source"] == "measured")]
        cc = sub[sub["observable"] == "mean_cos"]
        ax1.plot(t["layer"], t["value"], "-", color=f"C{i}", lw=1.2)
        ax1.errorbar(mm["layer"], mm["value"], yerr=2 * mm["stderr"], fmt="o", ms=4,
                     color=f"C{i}", label=f"{label}: E C/((n-1)E‖X‖²) - 1/(n-1)")
        ax1.plot(cc["layer"], cc["value"], "s", mfc="none", ms=4, color=f"C{i}",
                 label=f"{label}: mean cosine")
    decorate(ax1, "layer ℓ", "token correlation ρ^ℓ",
             f"noci22 Thm 3.3: ρ^ℓ over depth (L = {data['depth']}; lines: recursion)",
             frameon=False)
    for j, a2t in enumerate((data["at"], data["alt"])):
        Ls = np.array(data["depths"])
        vals = [finals[(a2t, int(L))] for L in Ls]
        ax2.errorbar(Ls * (1 + 0.04 * j), [v[0] for v in vals], yerr=[2 * v[1] for v in vals],
                     fmt="o^"[j], ms=4, color=f"C{j + 2}", label=f"α² = α̃/L, α̃₂ = {a2t:g}")
        ax2.plot(Ls, [v[2] for v in vals], "-", color=f"C{j + 2}", lw=1)
    ax2.errorbar([c[0] for c in const], [c[1] for c in const], yerr=[2 * c[2] for c in const],
                 fmt="s", ms=4, color="C0", label="α = 1 (Eq. 16: → 1)")
    ax2.plot([c[0] for c in const], [c[3] for c in const], "-", color="C0", lw=1)
    ax2.axhline(lim, ls="--", color="k", lw=1, label=f"Eq. 15 limit {lim:.3f}")
    log_x(ax2, list(data["depths"]) + [c[0] for c in const])
    decorate(ax2, "depth L", "ρ^L", "noci22 Eqs. 15-16: ρ^L vs L", frameon=False)
    return fig


def _thm3_3_table(data: dict) -> pd.DataFrame:
    at, alt, lim, Lmax = data["at"], data["alt"], data["lim"], int(data["depths"][-1])
    mA, seA, thA = data["finals"][(at, Lmax)]
    mB, seB, _ = data["finals"][(alt, Lmax)]
    Lc, mc, sec, thc = data["const"][-1]
    return pd.DataFrame([dict(quantity=f"rho_L (L={Lmax}, alpha2~={at:g})", measured=mA,
                              stderr=seA, theory=thA, limit=lim),
                         dict(quantity=f"rho_L (L={Lmax}, alpha2~={alt:g})", measured=mB,
                              stderr=seB, theory=thA, limit=lim),
                         dict(quantity=f"rho_L (L={Lc}, alpha=1)", measured=mc, stderr=sec,
                              theory=thc, limit=1.0)])


@register("noci22.thm3_3",
          tiny=dict(n=8, d=16, depth=4, seeds=48, depths=(4, 16), sweep_seeds=32,
                    const_depths=(2, 4, 8)),
          quick=dict(seeds=400, sweep_seeds=200),
          runtime={"tiny": 0.15, "quick": 0.8, "default": 0.5})
@one_thread
def thm3_3(*, seed: int = 0, device: str = "cpu", n: int = 16, d: int = 32, rho0: float = 0.2,
           depth: int = 10, seeds: int = 200, depths: Sequence[int] = (4, 16, 64),
           alpha_tilde: float = 1.0, alpha2_alt: float = 4.0, sweep_seeds: int = 100,
           const_depths: Sequence[int] = (2, 4, 8, 16)) -> Experiment:
    device = args.device(device)
    sz = ForwardSizes.checked(n=n, d=d, rho0=rho0, depth=depth, seeds=seeds, depths=depths,
                              alpha_tilde=alpha_tilde)
    alt = args.real("alpha2_alt", alpha2_alt, 0.0, 8.0, lo_open=True)
    sweep_seeds = args.integer("sweep_seeds", sweep_seeds, 4, 100_000)
    const_depths = args.grid("const_depths", const_depths, 1, 64, ints=True)
    data = thm3_3_data(seed=seed, device=device, **sz.data_kw(), alt=alt, sweep_seeds=sweep_seeds,
                       const_depths=const_depths)
    return Experiment(data["frame"], _thm3_3_table(data), thm3_3_checks(data), plot_thm3_3, data)


def fig8_data(*, seed, device, n, d, rho0, depth, seeds, at) -> dict:
    """Fig. 8's data: norm and correlation per layer with α = 1 and α² = α̃/L, simulated and
    by Lemma 3.3 / Thm 3.3's recursion."""
    inp = ("rho", rho0)
    ell = np.arange(depth + 1)
    recs, res = [], {}
    for label, a in (("α = 1", 1.0), (f"α² = {at:g}/L", math.sqrt(at / depth))):
        sim = simulate(depth, a, a, n, d, inp, seeds, seed, device=device)
        C0, F0 = sim["C0"], sim["F0"]
        r_in = C0 / ((n - 1) * F0) - 1 / (n - 1)
        thF = U.lemma33_norm(ell, a, a, C0, F0, n) / F0
        thr = U.propagate_noci(depth, a, a, n, r_in, d=d).rho
        mF, seF = mean_se(sim["F"] / F0)
        mr, ser = rho_of(sim, n)
        res[label] = (thF, mF, seF, thr, mr, ser, C0, F0)
        for i in ell:
            recs += [dict(observable="norm_ratio", source="measured", value=mF[i],
                          stderr=seF[i], layer=int(i), config=label),
                     dict(observable="norm_ratio", source="theory", value=thF[i],
                          layer=int(i), config=label),
                     dict(observable="rho", source="measured", value=mr[i], stderr=ser[i],
                          layer=int(i), config=label),
                     dict(observable="rho", source="theory", value=thr[i], layer=int(i),
                          config=label)]
    _, _, _, _, _, _, C0, F0 = res[list(res)[1]]
    limr = float(U.thm33_rho_limit(at, C0, F0, n))
    return dict(frame=frame(recs), res=res, n=n, depth=depth, seeds=seeds, at=at, limr=limr)


def fig8_checks(data: dict, check_layers: int) -> list[Check]:
    """Fig. 8's claims: bounded norm and correlation with α² = α̃/L, growth with α = 1 (over
    the first ``check_layers`` layers)."""
    res, n, depth, seeds, at = data["res"], data["n"], data["depth"], data["seeds"], data["at"]
    ell = np.arange(depth + 1)
    lab1, lab2 = list(res)
    thF, mF, seF, thr, mr, ser, C0, F0 = res[lab2]
    limF = math.exp(at) * ((math.exp(at) - 1) * C0 / n + F0) / F0
    limr = data["limr"]
    uF, umF, useF, uthr, umr, user, _, _ = res[lab1]
    k = check_layers
    growth, growth_se = slope_se(np.exp(ell[1:k + 1]), umF[1:k + 1], useF[1:k + 1])
    th_growth = slope(np.exp(ell[1:k + 1]), uF[1:k + 1])  # d log F / d layer
    return [
        Check.within(f"noci22 Fig. 8: with α² = {at:g}/L the norm stays below the Eq. 13 "
                     f"bound {limF:.3g} ||X||² at every layer of L = {depth}",
                     float(np.max(mF - Z * seF)), hi=limF,
                     why=f"the sample mean minus {Z:g} standard errors ({seeds} draws)"),
        Check.within(f"noci22 Fig. 8: with α² = {at:g}/L the correlation stays below the Eq. 15 "
                     f"limit {limr:.3f} at every layer", float(np.max(mr - Z * ser)),
                     hi=limr + 0.005, why=f"{Z:g} standard errors + 0.005"),
        Check.within(f"noci22 Fig. 8: with α = 1 the norm grows by the factor of Eq. 12 per "
                     f"layer (log-slope over layers 1-{k}; Eq. 12: {th_growth:.3f})", growth,
                     th_growth - Z * growth_se - 0.05, th_growth + Z * growth_se + 0.05,
                     why=f"{Z:g} standard errors of the fit + 0.05 per layer: the "
                         "heavy-tailed product of random layers biases the sample mean low at "
                         "depth"),
        Check.within(f"noci22 Fig. 8: with α = 1 the correlation approaches 1 (layer {k}; "
                     f"recursion {uthr[k]:.4f})", float(umr[k]),
                     float(uthr[k]) - Z * float(user[k]) - 0.01, 1.0,
                     why=f"{Z:g} standard errors + 0.01 below the recursion"),
    ]


def plot_fig8(data: dict, ax=None):
    """Fig. 8: the norm (left) and the correlation (right) over layers."""
    fig, (ax1, ax2) = axes_row(ax, 2, (9.0, 3.5))
    df = data["frame"]
    for i, label in enumerate(data["res"]):
        sub = df[df["config"] == label]
        for ax_, obs in ((ax1, "norm_ratio"), (ax2, "rho")):
            t = sub[(sub["observable"] == obs) & (sub["source"] == "theory")]
            mm = sub[(sub["observable"] == obs) & (sub["source"] == "measured")]
            ax_.plot(t["layer"], t["value"], "-", color=f"C{i}", lw=1.2,
                     label=f"{label} (theory)")
            ax_.errorbar(mm["layer"], mm["value"], yerr=2 * mm["stderr"], fmt="o", ms=3,
                         color=f"C{i}", label=f"{label} (simulation)")
    ax1.set_yscale("log")
    decorate(ax1, "layer ℓ", "‖X^ℓ‖²_F / ‖X⁰‖²_F", "noci22 Fig. 8 (left): norm, no LN, linear",
             frameon=False)
    ax2.axhline(data["limr"], ls="--", color="k", lw=1, label="Eq. 15 limit")
    decorate(ax2, "layer ℓ", "token correlation ρ^ℓ", "noci22 Fig. 8 (right): correlation",
             frameon=False)
    return fig


@register("noci22.fig8", tiny=dict(n=8, d=32, depth=8, seeds=64, check_layers=4),
          quick=dict(seeds=300), runtime={"tiny": 0.1, "quick": 0.7, "default": 0.3})
@one_thread
def fig8(*, seed: int = 0, device: str = "cpu", n: int = 16, d: int = 32, rho0: float = 0.2,
         depth: int = 32, seeds: int = 150, alpha_tilde: float = 1.0,
         check_layers: int = 8) -> Experiment:
    device = args.device(device)
    sz = ForwardSizes.checked(n=n, d=d, rho0=rho0, depth=depth, seeds=seeds,
                              alpha_tilde=alpha_tilde)
    check_layers = args.integer("check_layers", check_layers, 1, sz.depth)
    data = fig8_data(seed=seed, device=device, **sz.data_kw())
    checks = fig8_checks(data, check_layers)
    table = pd.DataFrame([dict(config=lab, final_norm=r[1][-1], final_norm_theory=r[0][-1],
                               final_rho=r[4][-1], final_rho_theory=r[3][-1])
                          for lab, r in data["res"].items()])
    return Experiment(data["frame"], table, checks, plot_fig8, data)
