"""noci22 Eqs. 45-47 and App. C.2-C.3: the logit temperature τ* that equalises query and value
gradients, and the paper's IWSLT'14 value (``noci22.eq47``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ...measurement.rho_tokens import rho_tokens
from ...theory import uniform as U
from .. import args
from ..core import Check, Experiment, frame, one_thread, register
from ..plots import axes_row, decorate
from .common import (
    Z,
    draw_weights,
    log_x,
    ratio_se,
    rng_of,
    z_dev,
)
from .jacobians import (
    jacobian_norms,
    verify_check,
    verify_closed_form,
)

__all__ = ["eq47", "eq47_data", "eq47_checks", "plot_eq47"]


def _sigprop_tau_attention(n: int, d: int, tau: float, seeds: int, seed: int):
    """sigprop's own attention layer with ``--scaling tau``: a one-block, one-head
    :class:`SigpropTransformer` (W ~ N(0, 1/d)) whose logits are multiplied by ``tau``."""
    from ...nn.model import SigpropTransformer
    from ...spec import ArchSpec

    spec = ArchSpec(depth=1, d_model=d, heads=1, seq_len=n, norm="none", attention="softmax",
                    qk_std=1 / math.sqrt(d), sigma_v2=1.0, sigma_w2=1.0, sigma_b2=0.0,
                    scaling="tau", scaling_param=float(tau))
    return SigpropTransformer(spec, n_seeds=seeds, seed=seed, dtype=torch.float64).blocks[0].attn


def eq47_data(*, seed, ns, ds, rhos, draws, taus, iwslt_d, iwslt_n, iwslt_rho, iwslt_draws,
              paper_tau) -> dict:
    """eq47's data: the tidy frame and the numbers its checks and figure rest on."""
    rng = rng_of(seed)
    recs, cells = [], []
    verify = None
    for n in ns:
        for d in ds:
            for rho in rhos:
                X = rho_tokens(int(n), int(d), float(rho), rng, n_seq=draws, law="gaussian")
                W = draw_weights(rng, draws, int(d))
                ts = float(U.tau_star(1.0, int(d), int(n), float(rho)))
                if verify is None:
                    verify = verify_closed_form(X, *W, tau=ts)
                gq, _, gv = jacobian_norms(X, *W, tau=ts, uniform=True)
                r, r_se = ratio_se(gq, gv)
                fac = float(U.isserlis_factor(int(d), int(n), float(rho)))
                cells.append(dict(n=int(n), d=int(d), rho=float(rho), tau_star=ts, ratio=r,
                                  se=r_se, factor=fac, untempered=r / ts**2))
                key = dict(n=int(n), d=int(d), rho=float(rho), tau=ts)
                recs += [dict(observable="query_over_value_at_tau_star", source="measured",
                              value=r, stderr=r_se, **key),
                         dict(observable="query_over_value_at_tau_star", source="theory",
                              value=fac, theory="1 + 4(1-ρ)/(nd)", **key),
                         dict(observable="query_over_value_untempered", source="measured",
                              value=r / ts**2, stderr=r_se / ts**2, **key)]
    dev = z_dev([c["ratio"] for c in cells], [c["se"] for c in cells],
                 [c["factor"] for c in cells])
    # sigprop's --scaling tau is Eq. 45's convention
    n0, d0, tau0 = 6, 8, 2.5
    attn = _sigprop_tau_attention(n0, d0, tau0, 2, seed)
    x = torch.tensor(rho_tokens(n0, d0, 0.3, rng, n_seq=2, law="gaussian"))[:, None]  # S, 1, n, d
    with torch.no_grad():
        sc = attn.scores(x)[:, 0, 0]
        ref = tau0 * (x[:, 0] @ attn.w_q) @ (x[:, 0] @ attn.w_k).transpose(-1, -2) \
            / math.sqrt(d0)
    conv = float((sc - ref).abs().max() / ref.abs().max())

    def f(wq, wk, wv):
        return torch.func.functional_call(attn, {"w_q": wq, "w_k": wk, "w_v": wv,
                                                 "b_v": attn.b_v.detach()}, (x,),
                                         {"return_probs": True}).out  # the explicit maps

    jq, jk, jv = torch.func.jacrev(f, argnums=(0, 1, 2))(attn.w_q.detach(), attn.w_k.detach(),
                                                          attn.w_v.detach())
    auto = np.array([float((j**2).sum()) for j in (jq, jk, jv)])
    closed = np.array([float(g.sum()) for g in jacobian_norms(
        x[:, 0].numpy(), attn.w_q.detach().numpy(), attn.w_k.detach().numpy(),
        attn.w_v.detach().numpy(), tau0)])
    conv_grad = float(np.max(np.abs(auto / closed - 1)))
    # IWSLT'14 (noci22 C.3): d = 512, n = 25, rho = 0.2, LayerNorm-ed tokens
    ts_iw = float(U.tau_star(1.0, iwslt_d, iwslt_n, iwslt_rho))
    X = rho_tokens(iwslt_n, iwslt_d, iwslt_rho, rng, n_seq=iwslt_draws, law="gaussian")
    W = draw_weights(rng, iwslt_draws, iwslt_d)
    gq1, _, gv1 = jacobian_norms(X, *W, tau=1.0, uniform=True)
    r1, r1_se = ratio_se(gq1, gv1)
    tau_eq = r1**-0.5
    tau_eq_se = 0.5 * tau_eq * r1_se / r1
    soft = []
    for t in taus:
        gq, _, gv = jacobian_norms(X, *W, tau=float(t))
        soft.append(ratio_se(gq, gv))
    lr = np.log([s[0] for s in soft])
    lt = np.log(taus)
    k = int(np.searchsorted(lr, 0.0)) if np.all(np.diff(lr) > 0) else -1
    tau_soft = float(np.exp(np.interp(0.0, lr, lt))) if 0 < k < len(lr) else float("nan")
    r_paper_soft = ratio_se(*jacobian_norms(X, *W, tau=paper_tau)[::2])
    for t, (rs, rs_se) in zip(taus, soft, strict=True):
        key = dict(tau=float(t), n=iwslt_n, d=iwslt_d, rho=iwslt_rho)
        recs += [dict(observable="iwslt_query_over_value", source="measured", value=rs,
                      stderr=rs_se, attention="softmax", **key),
                 dict(observable="iwslt_query_over_value", source="measured",
                      value=r1 * t**2, stderr=r1_se * t**2, attention="uniform", **key),
                 dict(observable="iwslt_query_over_value", source="theory",
                      value=float(U.isserlis_factor(iwslt_d, iwslt_n, iwslt_rho))
                      * (t / ts_iw) ** 2, attention="uniform", theory="Eqs. 46-47", **key)]
    recs += [dict(observable="tau_equalising", source="theory", value=ts_iw, theory="Eq. 47"),
             dict(observable="tau_equalising", source="measured", value=tau_eq,
                  stderr=tau_eq_se, attention="uniform"),
             dict(observable="tau_equalising", source="measured", value=tau_soft,
                  attention="softmax"),
             dict(observable="tau_equalising", source="paper", value=paper_tau,
                  theory="noci22 C.3 (IWSLT'14)")]
    return dict(frame=frame(recs), cells=cells, conv=conv, conv_grad=conv_grad, dev=dev,
                draws=draws, iwslt_d=iwslt_d, iwslt_draws=iwslt_draws, iwslt_n=iwslt_n,
                iwslt_rho=iwslt_rho, paper_tau=paper_tau, r1=r1, r1_se=r1_se,
                r_paper_soft=r_paper_soft, soft=soft, tau_eq=tau_eq, tau_eq_se=tau_eq_se,
                tau_soft=tau_soft, taus=taus, ts_iw=ts_iw, verify=verify)


def eq47_checks(data: dict) -> list[Check]:
    """eq47's claims held to :func:`eq47_data`'s numbers."""
    cells, conv, conv_grad, dev = data["cells"], data["conv"], data["conv_grad"], data["dev"]
    draws, iwslt_d = data["draws"], data["iwslt_d"]
    iwslt_draws, iwslt_n = data["iwslt_draws"], data["iwslt_n"]
    iwslt_rho, paper_tau = data["iwslt_rho"], data["paper_tau"]
    r_paper_soft, tau_eq = data["r_paper_soft"], data["tau_eq"]
    tau_eq_se, tau_soft = data["tau_eq_se"], data["tau_soft"]
    ts_iw, verify = data["ts_iw"], data["verify"]
    return [
        verify_check("noci22 Eq. 45 (τ on the logits, softmax attention)", verify),
        Check.within("sigprop's --scaling tau multiplies the logits (Eq. 45): scores of "
                     "sigprop.nn's attention vs τ XW_Q (XW_K)ᵀ/√d_k (relative)", conv,
                     hi=1e-12, why="the same arithmetic; roundoff only"),
        Check.within("... and its autograd Jacobians through sigprop.nn (torch.func."
                     "functional_call) equal the closed form at τ = 2.5 (relative)", conv_grad,
                     hi=1e-8, why="both exact in float64"),
        Check.within(f"noci22 Eqs. 46-47: at τ = τ* the query/value gradient ratio is 1 times "
                     f"the exact factor 1 + 4(1-ρ)/(nd) over {len(cells)} cells (n, d, ρ); "
                     "largest deviation in units of its tolerance", dev, hi=1.0,
                     why=f"{Z:g} delta-method standard errors of {draws} draws"),
        Check.differs(f"noci22 C.3: the temperature that equalises query and value gradients of "
                      f"the IWSLT'14 model (d = {iwslt_d}, n = {iwslt_n}, ρ = {iwslt_rho:g}, "
                      "σ_x² = 1), measured by autograd under uniform attention", tau_eq,
                      ts_iw - Z * tau_eq_se - 0.02, ts_iw + Z * tau_eq_se + 0.02,
                      paper=f"the paper used τ = {paper_tau:g}; Eq. 47 at these values gives "
                            f"{ts_iw:.2f} and autograd {tau_eq:.2f} (softmax attention: "
                            f"{tau_soft:.2f}); {paper_tau:g} would need ρ ≈ 0.56 or "
                            "σ_x² ≈ 0.35",
                      why=f"{Z:g} standard errors of {iwslt_draws} draws + 0.02 around Eq. 47 "
                          "(the standard error of a few draws is itself uncertain)"),
        Check.within(f"with softmax attention τ = {paper_tau:g} still overshoots: the query "
                     f"gradient exceeds the value gradient (ratio at τ = {paper_tau:g})",
                     r_paper_soft[0], lo=1 + Z * r_paper_soft[1],
                     why=f"more than {Z:g} standard errors above 1"),
    ]


def plot_eq47(data: dict, ax=None):
    """eq47's figure (``ax``: the axes to draw on, as the figure lays them out)."""
    cells, iwslt_d = data["cells"], data["iwslt_d"]
    iwslt_n, iwslt_rho = data["iwslt_n"], data["iwslt_rho"]
    paper_tau, r1, r1_se, soft = data["paper_tau"], data["r1"], data["r1_se"], data["soft"]
    taus, ts_iw = data["taus"], data["ts_iw"]
    fig, (ax1, ax2) = axes_row(ax, 2, (9.5, 3.6))
    tt = np.geomspace(taus[0], taus[-1], 50)
    ax1.plot(tt, float(U.isserlis_factor(iwslt_d, iwslt_n, iwslt_rho)) * (tt / ts_iw) ** 2,
             "-", color="C0", lw=1.2, label="Eqs. 46-47: (τ/τ*)²")
    ax1.errorbar(taus, [r1 * t**2 for t in taus], yerr=[2 * r1_se * t**2 for t in taus],
                 fmt="o", ms=4, color="C0", label="autograd-checked, uniform attention")
    ax1.errorbar(taus, [s[0] for s in soft], yerr=[2 * s[1] for s in soft], fmt="s", ms=4,
                 color="C1", label="softmax attention")
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.axvline(ts_iw, color="C2", ls="--", lw=1, label=f"τ* (Eq. 47) = {ts_iw:.2f}")
    ax1.axvline(paper_tau, color="C3", ls=":", lw=1.2, label=f"paper's τ = {paper_tau:g}")
    log_x(ax1, taus)
    ax1.set_yscale("log")
    decorate(ax1, "logit multiplier τ", "||∂S/∂W_Q||² / ||∂S/∂W_V||²",
             f"noci22 C.3: IWSLT'14 (d = {iwslt_d}, n = {iwslt_n}, ρ = {iwslt_rho:g})",
             frameon=False)
    idx = np.arange(len(cells))
    ax2.errorbar(idx, [c["ratio"] for c in cells], yerr=[2 * c["se"] for c in cells],
                 fmt="o", ms=4, color="C0", label="at τ = τ*")
    ax2.plot(idx, [c["untempered"] for c in cells], "s", mfc="none", ms=4, color="C1",
             label="at τ = 1")
    ax2.plot(idx, [c["factor"] for c in cells], "_", ms=12, color="k",
             label="1 + 4(1-ρ)/(nd)")
    ax2.set_yscale("log")
    ax2.set_xticks(idx, [f"{c['n']},{c['d']},{c['rho']:g}" for c in cells], rotation=60,
                   fontsize=6)
    decorate(ax2, "n, d, ρ", "query / value gradient", "noci22 Eq. 47: τ* equalises the gradients",
             frameon=False)
    return fig


def _eq47_table(data: dict):
    cells, iwslt_d = data["cells"], data["iwslt_d"]
    iwslt_n, iwslt_rho = data["iwslt_n"], data["iwslt_rho"]
    paper_tau, tau_eq = data["paper_tau"], data["tau_eq"]
    tau_soft, ts_iw = data["tau_soft"], data["ts_iw"]
    return pd.DataFrame(cells + [dict(n=iwslt_n, d=iwslt_d, rho=iwslt_rho, tau_star=ts_iw,
                                       ratio=1.0, factor=1.0, tau_measured=tau_eq,
                                       tau_softmax=tau_soft, tau_paper=paper_tau)])


@register("noci22.eq47",
          tiny=dict(ns=(8,), ds=(16,), rhos=(0.1, 0.7), draws=100, iwslt_draws=12,
                    taus=(1.0, 3.0, 8.5)),
          quick=dict(draws=800, iwslt_draws=24),
          runtime={"tiny": 0.3, "quick": 2.1, "default": 1.0})
@one_thread
def eq47(*, seed: int = 0, device: str = "cpu", ns: Sequence[int] = (8, 32),
         ds: Sequence[int] = (16, 64), rhos: Sequence[float] = (0.1, 0.4, 0.7),
         draws: int = 400, taus: Sequence[float] = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.5),
         iwslt_d: int = 512, iwslt_n: int = 25, iwslt_rho: float = 0.2, iwslt_draws: int = 12,
         paper_tau: float = 8.5) -> Experiment:
    args.device(device)
    ns = args.grid("ns", ns, 2, 1024, ints=True, n_min=1)
    ds = args.grid("ds", ds, 1, 1024, ints=True, n_min=1)
    rhos = args.grid("rhos", rhos, 0.0, 0.99, n_min=1)
    draws = args.integer("draws", draws, 8, 10**6)
    taus = args.grid("taus", taus, 0.01, 100.0, n_min=2)
    iwslt_d = args.integer("iwslt_d", iwslt_d, 2, 4096)
    iwslt_n = args.integer("iwslt_n", iwslt_n, 2, 1024)
    iwslt_rho = args.real("iwslt_rho", iwslt_rho, 0.0, 0.99)
    iwslt_draws = args.integer("iwslt_draws", iwslt_draws, 6, 10**4)
    paper_tau = args.real("paper_tau", paper_tau, 0.01, 100.0)
    data = eq47_data(seed=seed, ns=ns, ds=ds, rhos=rhos, draws=draws, taus=taus, iwslt_d=iwslt_d,
                     iwslt_n=iwslt_n, iwslt_rho=iwslt_rho, iwslt_draws=iwslt_draws,
                     paper_tau=paper_tau)
    checks = eq47_checks(data)
    return Experiment(data["frame"], _eq47_table(data), checks, plot_eq47, data)
