"""noci22's appendix figures of the forward pass without LayerNorm, beyond uniform attention:
``noci22.fig10`` (linear vs ReLU, and why the linear theory misses a softmax network) and
``noci22.fig11`` (densities of ``||X^L||_F^2`` against Lemma 3.3's mean)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...theory import uniform as U
from .. import args
from ..core import Check, Experiment, frame, mean_se, one_thread, register
from ..plots import axes_row, decorate
from .common import Z, ratio_se
from .network import ForwardSizes, rho_of, simulate, theory_cos

__all__ = ["fig10", "fig11", "fig10_data", "fig10_checks", "plot_fig10", "fig11_data",
           "fig11_checks", "plot_fig11"]


def _fig10_recs(recs, res_key, r, L):
    act, lab, att = res_key
    for i in range(L + 1):
        key = dict(layer=i, activation=act, residual=lab, attention=att)
        recs += [dict(observable="rho", source="measured", value=r["m"][i],
                      stderr=r["se"][i], **key),
                 dict(observable="rho", source="theory", value=r["th"][i],
                      theory="sigprop recursion", **key)]
        if att == "uniform" and act == "linear":
            recs.append(dict(observable="rho", source="theory", value=r["lin"][i],
                             theory="noci22 Thm 3.3 (linear, uniform)", **key))
        if i > 0:
            recs.append(dict(observable="entropy", source="measured",
                             value=r["ent"][i - 1], **key))


def fig10_data(*, seed, device, n, d, rho0, depth, seeds, at) -> dict:
    """Fig. 10's data: ρ per layer for linear and ReLU networks, two residual settings,
    softmax and uniform attention (the same weights), with sigprop's and noci22's theory."""
    inp = ("rho", rho0)
    res, recs = {}, []
    alphas = (("α = 1", 1.0), (f"α² = {at:g}/L", math.sqrt(at / depth)))
    for act in ("linear", "relu"):
        for lab, a in alphas:
            base = U.noci_spec(depth, a, a, n, d).replace(activation=act, d_ff=d)
            for att in ("uniform", "softmax"):
                sim = simulate(depth, a, a, n, d, inp, seeds, seed, attention=att,
                               activation=act, device=device)
                r_in = sim["C0"] / ((n - 1) * sim["F0"]) - 1 / (n - 1)
                m, se = rho_of(sim, n)
                ent = sim["ent"].mean(-1)
                spec = base.replace(attention=att, qk_std=1 / math.sqrt(d))
                th = theory_cos(spec, r_in)
                lin = U.propagate_noci(depth, a, a, n, r_in, d=d).rho
                per_draw = sim["C"][-1] / ((n - 1) * sim["F"][-1]) - 1 / (n - 1)
                res[(act, lab, att)] = dict(m=m, se=se, th=th, lin=lin, ent=ent,
                                            per_draw=per_draw)
                _fig10_recs(recs, (act, lab, att), res[(act, lab, att)], depth)
    return dict(frame=frame(recs), res=res, alphas=alphas, L=depth, seeds=seeds, d=d,
                rho0=rho0, at=at)


def fig10_checks(data: dict) -> list[Check]:
    """Fig. 10's claims, and where the linear theory misses the softmax network."""
    res, alphas, L, seeds, d = data["res"], data["alphas"], data["L"], data["seeds"], data["d"]
    rho0, at = data["rho0"], data["at"]
    lab1, lab2 = (a[0] for a in alphas)

    def dev(act, tol):
        return max(float(np.max(np.abs(r["m"][1:] - r["th"][1:]) / (Z * r["se"][1:] + tol)))
                   for (ac, _, at_), r in res.items() if ac == act and at_ == "uniform")

    soft_lin = res[("linear", lab1, "softmax")]
    gaps = []  # per weight draw (linear and ReLU runs share every weight): light-tailed
    for lab in (lab1, lab2):
        g_m, g_se = mean_se(res[("relu", lab, "softmax")]["per_draw"]
                            - res[("linear", lab, "softmax")]["per_draw"])
        gaps.append((g_m - Z * g_se, g_m, g_se))
    _, gap, gap_se = min(gaps)
    # the assumption's share: uniform minus softmax attention, same weights, per draw
    off, off_se = mean_se(res[("linear", lab1, "uniform")]["per_draw"] - soft_lin["per_draw"])
    soft_pd = float(soft_lin["per_draw"].mean())
    relu2 = res[("relu", lab2, "softmax")]
    relu2_th = res[("relu", lab2, "uniform")]["th"][L]
    lin_th = soft_lin["lin"][L]
    return [
        Check.within("noci22 Thm 3.3's recursion holds for the linear network once uniform "
                     "attention is imposed (both residual settings, every layer); largest "
                     "deviation in units of its tolerance", dev("linear", 0.01), hi=1.0,
                     why=f"{Z:g} standard errors of the ratio of means ({seeds} draws) + 0.01: "
                         "the linear theory itself has no slip"),
        Check.within("sigprop's ReLU recursion (depth.propagate, uniform attention; beyond "
                     "noci22) matches the ReLU network with uniform attention at every layer; "
                     "largest deviation in units of its tolerance", dev("relu", 0.02), hi=1.0,
                     why=f"{Z:g} standard errors + 0.02 (arc-cosine kernel at finite d = {d})"),
        Check.that("noci22 Fig. 10: with ReLU the correlation grows faster than with a linear "
                   f"activation (softmax network, per-draw correlation at L = {L}, ReLU minus "
                   "linear with the same weights; the less significant residual setting)",
                   gap > Z * gap_se, gap, f"> {Z * gap_se:.3g} ({Z:g} standard errors)",
                   why=f"{Z:g} standard errors of the paired per-draw difference"),
        Check.that(f"Assumption 3.1 fails in the α = 1 linear network: the attention's "
                   f"normalised entropy at layer {L} (1 = uniform)",
                   soft_lin["ent"][L - 1] < 0.5, float(soft_lin["ent"][L - 1]), "< 0.5",
                   why="the norm grows like 4^ℓ without LayerNorm and the logit variance "
                       "like its square; uniform attention has entropy 1"),
        Check.differs(f"noci22 Fig. 10 (left) vs the linear theory: correlation at L = {L} of "
                      "the linear network (α = 1) with uniform minus with softmax attention, "
                      "same weights (mean over draws of the per-draw correlation)", off,
                      Z * off_se + 0.01, lin_th - rho0 - Z * off_se,
                      paper=f"Thm 3.3's linear recursion gives {lin_th:.3f} and holds with "
                            "uniform attention; the softmax network's mean per-draw correlation "
                            f"is {soft_pd:.3f} (ratio of expectations {soft_lin['m'][L]:.3f}; "
                            f"sigprop's softmax REM recursion {soft_lin['th'][L]:.3f}): an "
                            "assumption, not a slip — attention leaves the uniform regime as "
                            "the unnormalised norm grows (entropy "
                            f"{soft_lin['ent'][L - 1]:.1e} at layer {L})",
                      why=f"band: more than {Z:g} SE + 0.01 above 0 (attention matters) and "
                          "less than the linear theory's whole growth ρ_L - ρ_0 (the "
                          "correlation still grows)"),
        Check.differs(f"noci22 Fig. 10 (right) vs the linear theory: the ReLU network (softmax, "
                      f"α² = {at:g}/L) at L = {L}", relu2["m"][L],
                      relu2_th - Z * relu2["se"][L] - 0.03, relu2_th + Z * relu2["se"][L] + 0.03,
                      paper=f"the linear theory gives {relu2['lin'][L]:.3f}, the ReLU network "
                            f"measures {relu2['m'][L]:.3f} (offset "
                            f"{relu2['m'][L] - relu2['lin'][L]:.3f}): ReLU is outside the "
                            "linear theory; sigprop's ReLU recursion gives "
                            f"{relu2_th:.3f}",
                      why="band: sigprop's ReLU recursion (uniform attention) ± 4 SE ± 0.03 "
                          "(the logits stay O(1) with α² = α̃/L)"),
    ]


def plot_fig10(data: dict, ax=None):
    """Fig. 10: ρ over layers, linear (left) and ReLU (right)."""
    res, alphas, L = data["res"], data["alphas"], data["L"]
    fig, axes = axes_row(ax, 2, (9.0, 3.6), sharey=True)
    for ax, act in zip(axes, ("linear", "relu"), strict=True):
        for i, (lab, _) in enumerate(alphas):
            r_s, r_u = res[(act, lab, "softmax")], res[(act, lab, "uniform")]
            ell = np.arange(L + 1)
            ax.plot(ell, r_u["lin"], "--", color=f"C{i}", lw=1,
                    label=f"{lab}: noci22 linear theory")
            if act == "relu":
                ax.plot(ell, r_u["th"], "-", color=f"C{i}", lw=1.2,
                        label=f"{lab}: sigprop ReLU recursion")
            else:
                ax.plot(ell, r_s["th"], ":", color=f"C{i}", lw=1.2,
                        label=f"{lab}: sigprop softmax recursion")
            ax.errorbar(ell, r_s["m"], yerr=2 * r_s["se"], fmt="o", ms=3.5, color=f"C{i}",
                        label=f"{lab}: network (softmax)")
            ax.plot(ell, r_u["m"], "s", mfc="none", ms=4, color=f"C{i}",
                    label=f"{lab}: network (uniform attention)")
        decorate(ax, "layer ℓ", None,
                 f"noci22 Fig. 10 ({'left' if act == 'linear' else 'right'}): {act}", frameon=False)
    axes[0].set_ylabel("token correlation ρ^ℓ")
    return fig


def _fig10_table(data: dict) -> pd.DataFrame:
    res, L = data["res"], data["L"]
    return pd.DataFrame([dict(activation=k[0], residual=k[1], attention=k[2],
                               rho_L=r["m"][L], stderr=r["se"][L], sigprop_theory=r["th"][L],
                               noci22_linear=r["lin"][L], entropy_L=r["ent"][L - 1])
                          for k, r in res.items()])


@register("noci22.fig10", tiny=dict(depth=6, seeds=64), quick=dict(seeds=400),
          runtime={"tiny": 0.3, "quick": 1.8, "default": 0.7})
@one_thread
def fig10(*, seed: int = 0, device: str = "cpu", n: int = 16, d: int = 32, rho0: float = 0.2,
          depth: int = 10, seeds: int = 100, alpha_tilde: float = 1.0) -> Experiment:
    device = args.device(device)
    sz = ForwardSizes.checked(n=n, d=d, rho0=rho0, depth=depth, seeds=seeds,
                              alpha_tilde=alpha_tilde)
    data = fig10_data(seed=seed, device=device, **sz.data_kw())
    checks = fig10_checks(data)
    return Experiment(data["frame"], _fig10_table(data), checks, plot_fig10, data)


_PANELS = ("uniform attention, std 1/√d", "softmax, std 1/√d", "softmax, std 1")


def _density_recs(recs, res_row, label, depth):
    ell = np.arange(depth + 1)
    m, se, th, med = res_row["m"], res_row["se"], res_row["th"], res_row["med"]
    for i in ell:
        recs += [dict(observable="mean_norm2", source="measured", value=m[i],
                      stderr=se[i], layer=int(i), panel=label),
                 dict(observable="mean_norm2", source="theory", value=th[i],
                      layer=int(i), panel=label),
                 dict(observable="median_over_mean", source="measured",
                      value=med[i] / m[i], layer=int(i), panel=label)]
    for i in range(depth):
        for c, v in zip(res_row["centres"], res_row["dens"][i], strict=True):
            recs.append(dict(observable="density_log10_norm2", source="measured",
                             value=float(v), layer=i + 1, panel=label,
                             norm2=float(10**c)))


def fig11_data(*, seed, device, n, d, depth, seeds, alpha, bins) -> dict:
    """Fig. 11's data: per panel (attention, input std) the mean, median and density of
    ``||X^ℓ||²`` per layer, Lemma 3.3's mean, and softmax over uniform attention with the
    same weights."""
    panels = ((_PANELS[0], "uniform", 1 / math.sqrt(d)),
              (_PANELS[1], "softmax", 1 / math.sqrt(d)),
              (_PANELS[2], "softmax", 1.0))
    ell = np.arange(depth + 1)
    recs, res = [], {}
    for label, att, std in panels:
        sim = simulate(depth, alpha, alpha, n, d, ("gauss", std), seeds, seed, attention=att,
                       device=device)
        F, C0, F0 = sim["F"], sim["C0"], sim["F0"]
        th = U.lemma33_norm(ell, alpha, alpha, C0, F0, n)
        m, se = mean_se(F)
        logF = np.log10(F[1:])
        edges = np.linspace(logF.min(), logF.max(), bins + 1)
        centres = 0.5 * (edges[1:] + edges[:-1])
        dens = np.stack([np.histogram(row, edges, density=True)[0] for row in logF])
        med = np.median(F, axis=1)
        res[label] = dict(m=m, se=se, th=th, med=med, dens=dens, centres=centres, F=F)
        _density_recs(recs, res[label], label, depth)
    ru, rs, r1 = (res[p[0]] for p in panels)
    # softmax over uniform attention with the same W_V, W_1, W_2 (paired, :func:`simulate`);
    # at std 1 the uniform network's norm is d times that at std 1/sqrt(d) (homogeneity)
    ps, ps_se = ratio_se(rs["F"], ru["F"])
    p1, p1_se = ratio_se(r1["F"], d * ru["F"])
    for i in ell:
        recs += [dict(observable="softmax_over_uniform", source="measured", value=ps[i],
                      stderr=ps_se[i], layer=int(i), panel=panels[1][0]),
                 dict(observable="softmax_over_uniform", source="measured", value=p1[i],
                      stderr=p1_se[i], layer=int(i), panel=panels[2][0])]
    return dict(frame=frame(recs), res=res, panels=panels, d=d, depth=depth, seeds=seeds,
                alpha=alpha, ps=ps, ps_se=ps_se, p1=p1)


def fig11_checks(data: dict, ok_layers: int) -> list[Check]:
    """Fig. 11's claims; softmax attention departs from the uniform mean after a few layers
    (``ok_layers``: the layers where it should not yet)."""
    res, d, L, seeds, alpha = data["res"], data["d"], data["depth"], data["seeds"], data["alpha"]
    ps, ps_se = data["ps"], data["ps_se"]
    ru, rs, r1 = (res[p[0]] for p in data["panels"])
    qu, qu_se = ru["m"][L] / ru["th"][L], ru["se"][L] / ru["th"][L]
    early = float(np.max(np.abs(ps[1:ok_layers + 1] - 1)
                         / (Z * ps_se[1:ok_layers + 1] + 0.02)))
    mm1, mmL = ru["med"][1] / ru["m"][1], ru["med"][L] / ru["m"][L]
    # typical (per weight draw) excess: mean of log(F_softmax / F_uniform), light-tailed
    ls, ls_se = mean_se(np.log(rs["F"][L] / ru["F"][L]))
    l1, l1_se = mean_se(np.log(r1["F"][L] / (d * ru["F"][L])))
    return [
        Check.within(f"noci22 Fig. 11 (left): uniform attention, mean of ||X^L||² / Lemma 3.3 "
                     f"at L = {L}", qu, 1 - Z * qu_se, 1 + Z * qu_se,
                     why=f"{Z:g} standard errors of the mean of {seeds} heavy-tailed samples"),
        Check.that(f"noci22 Fig. 11: the densities become more heavy-tailed with depth "
                   f"(median / mean of ||X^L||², uniform panel, L = {L} vs L = 1: "
                   f"{mmL:.3f} vs {mm1:.3f})", mmL < mm1 - 0.05, mmL, f"< {mm1 - 0.05:.3f}",
                   why="a heavier right tail pulls the mean above the median; 0.05 margin "
                       "over sampling noise"),
        Check.within(f"noci22 Fig. 11 (centre): softmax with std 1/√d has the uniform-attention "
                     f"mean while the logits are small (layers 1-{ok_layers}; mean over the "
                     "same weights with uniform attention); largest deviation in units of its "
                     "tolerance", early, hi=1.0,
                     why=f"{Z:g} standard errors of the paired ratio + 2% (logit variance "
                         "σ_x⁴ = 1/d² at the input)"),
        Check.differs(f"noci22 Fig. 11 (centre): softmax with std 1/√d over uniform attention "
                      f"(same weights), typical factor exp E log(||X^L||²_soft / "
                      f"||X^L||²_unif) at L = {L}", math.exp(ls), math.exp(Z * ls_se),
                      math.exp(l1),
                      paper="the paper calls uniform attention an excellent approximation at "
                            f"std 1/√d; sigprop measures a typical factor {math.exp(ls):.3f} "
                            f"(ratio of means {ps[L]:.3f} ± {ps_se[L]:.3f}) at L = {L} with "
                            f"α = {alpha:g}: without LayerNorm the norm (and the logits) grow "
                            "like 4^ℓ, so attention stops being uniform after a few layers",
                      why=f"band: above 1 by more than {Z:g} SE of the mean log ratio (per "
                          "draw, light-tailed; the ratio of means is carried by rare draws) "
                          f"and below the std-1 panel's factor ({math.exp(l1):.3f})"),
        Check.within(f"noci22 Fig. 11 (right): with std 1 the norm departs from the uniform-"
                     f"attention one at L = {L} (typical factor, same weights)", math.exp(l1),
                     lo=math.exp(Z * l1_se),
                     why=f"more than {Z:g} standard errors of the mean log ratio above 1"),
    ]


def plot_fig11(data: dict, ax=None):
    """Fig. 11: the densities of ``log10 ||X^ℓ||²`` per layer, one panel per set-up."""
    res, depth, L = data["res"], data["depth"], data["depth"]
    fig, axes = axes_row(ax, 3, (12.0, 3.5))
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    for ax, (label, _, _) in zip(axes, data["panels"], strict=True):
        r = res[label]
        for i in range(depth):
            ax.plot(10 ** r["centres"], r["dens"][i], "-", lw=1,
                    color=cmap(i / max(depth - 1, 1)), label=f"L = {i + 1}" if i in (
                        0, depth - 1) else None)
        ax.axvline(r["m"][L], color="r", ls="--", lw=1, label=f"empirical mean, L = {L}")
        ax.axvline(r["th"][L], color="b", ls="--", lw=1, label="Lemma 3.3 mean")
        ax.set_xscale("log")
        decorate(ax, "‖X^L‖²_F", None, f"noci22 Fig. 11: {label}", frameon=False)
    axes[0].set_ylabel("density of log₁₀ ‖X^L‖²_F")
    return fig


def _fig11_table(data: dict) -> pd.DataFrame:
    res, panels, L, ps, p1 = data["res"], data["panels"], data["depth"], data["ps"], data["p1"]
    return pd.DataFrame([dict(panel=p[0], mean_over_lemma33=res[p[0]]["m"][L] /
                               res[p[0]]["th"][L], stderr=res[p[0]]["se"][L] /
                               res[p[0]]["th"][L], median_over_mean=res[p[0]]["med"][L] /
                               res[p[0]]["m"][L], over_uniform_same_weights=q)
                          for p, q in zip(panels, (1.0, ps[L], p1[L]), strict=True)])


@register("noci22.fig11", tiny=dict(seeds=300), quick=dict(seeds=2000),
          runtime={"tiny": 0.3, "quick": 2.7, "default": 0.9})
@one_thread
def fig11(*, seed: int = 0, device: str = "cpu", n: int = 10, d: int = 30, depth: int = 10,
          seeds: int = 600, alpha: float = 1.0, bins: int = 40,
          ok_layers: int = 3) -> Experiment:
    device = args.device(device)
    n = args.integer("n", n, 2, 4096)
    d = args.integer("d", d, 1, 65536)
    depth = args.integer("depth", depth, 2, 200)
    seeds = args.integer("seeds", seeds, 16, 100_000)
    alpha = args.real("alpha", alpha, 0.0, 4.0, lo_open=True)
    bins = args.integer("bins", bins, 4, 1000)
    ok_layers = args.integer("ok_layers", ok_layers, 1, depth)
    data = fig11_data(seed=seed, device=device, n=n, d=d, depth=depth, seeds=seeds,
                      alpha=alpha, bins=bins)
    checks = fig11_checks(data, ok_layers)
    return Experiment(data["frame"], _fig11_table(data), checks, plot_fig11, data)
