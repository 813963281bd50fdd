"""noci22 Figs. 3 and 9 (Table 2): post-LN vs pre-LN networks at initialisation, token cosine
and query/value gradient norms over depth (``noci22.fig3_9``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ...theory import depth as _depth
from .. import args
from ..core import Check, Experiment, frame, one_thread, register
from ..plots import axes_grid, decorate
from .common import (
    Z,
)

__all__ = ["fig3_9", "fig3_9_data", "fig3_9_checks", "plot_fig3_9"]


def _table2_spec(norm: str, depth: int, d: int, heads: int, d_ff: int, n: int):
    """noci22 Table 2's network (Figs. 3, 9) as an ArchSpec: LayerNorm (post or pre), ReLU
    MLP, no W_O (noci22's S = A X W_V), Xavier-normal weights written as sigprop variances:
    W_Q, W_K, W_V ~ N(0, 1/d), W_1 (d x d_ff) and W_2 (d_ff x d) ~ N(0, 2/(d + d_ff))."""
    from ...spec import ArchSpec

    xav = 2.0 / (d + d_ff)
    return ArchSpec(depth=depth, d_model=d, heads=heads, d_ff=d_ff, seq_len=n, norm=norm,
                    ln_kind="layernorm", activation="relu", qk_std=1 / math.sqrt(d),
                    sigma_v2=1.0, sigma_w2=xav * d, sigma_w2_out=xav * d_ff, sigma_b2=0.0)


def fig3_9_data(*, seed, depth, d, heads, d_ff, n, seeds, rho0) -> dict:
    """fig3_9's data: the tidy frame and the numbers its checks and figure rest on."""
    from ...measurement.engine import measure

    recs, res = [], {}
    for norm in ("post", "pre"):
        spec = _table2_spec(norm, depth, d, heads, d_ff, n)
        m = measure(spec, seeds=seeds, sequences=1, input="rho", rho0=rho0, seed=seed,
                    dtype=torch.float64, grads=True, stable_rank=False)
        tr = m.trajectory
        th = _depth.propagate(spec, rho0=m.rho0)
        out = {}
        for obs in ("cos", "grad_qk", "grad_v", "entropy"):
            sub = tr[tr["observable"] == obs].sort_values("layer")
            out[obs] = (sub["layer"].to_numpy(), sub["value"].to_numpy(),
                        sub["stderr"].to_numpy())
            for lay, v, e in zip(*out[obs], strict=True):
                recs.append(dict(observable=obs, source="measured", value=float(v),
                                 stderr=float(e), layer=int(lay), norm=norm))
        sub = th[th["observable"] == "cos"].sort_values("layer")
        out["cos_theory"] = sub["value"].to_numpy()
        for lay, v in zip(sub["layer"], sub["value"], strict=True):
            recs.append(dict(observable="cos", source="theory", value=float(v),
                             layer=int(lay), norm=norm))
        res[norm] = out
    post, pre = res["post"], res["pre"]
    dcos = max(float(np.max(np.abs(r["cos"][1] - r["cos_theory"]))) for r in res.values())
    cos_gap = post["cos"][1][-1] - pre["cos"][1][-1]
    cos_gap_se = math.hypot(post["cos"][2][-1], pre["cos"][2][-1])

    def span(r):  # decades between the largest and smallest query gradient over layers
        return float(np.log10(r["grad_qk"][1].max() / r["grad_qk"][1].min()))

    def trend(r, key):  # log10 change per layer
        lay, v, _ = r[key]
        return float(np.polyfit(lay, np.log10(v), 1)[0])

    q_drop = post["grad_qk"][1][-1] / post["grad_qk"][1][0]
    v_drop = post["grad_v"][1][-1] / post["grad_v"][1][0]
    tv_post, tv_pre = trend(post, "grad_v"), trend(pre, "grad_v")
    return dict(frame=frame(recs), cos_gap=cos_gap, cos_gap_se=cos_gap_se, d=d, dcos=dcos,
                depth=depth, n=n, post=post, pre=pre, q_drop=q_drop, res=res, seeds=seeds,
                span=span, trend=trend, tv_post=tv_post, tv_pre=tv_pre, v_drop=v_drop)


def fig3_9_checks(data: dict) -> list[Check]:
    """fig3_9's claims held to :func:`fig3_9_data`'s numbers."""
    cos_gap, cos_gap_se, d, dcos = data["cos_gap"], data["cos_gap_se"], data["d"], data["dcos"]
    depth, n, post, pre = data["depth"], data["n"], data["post"], data["pre"]
    q_drop, seeds, span = data["q_drop"], data["seeds"], data["span"]
    tv_post, tv_pre, v_drop = data["tv_post"], data["tv_pre"], data["v_drop"]
    return [
        Check.within("sigprop's theory (depth.propagate, REM attention with LayerNorm) follows "
                     "the measured token cosine of both networks at every layer (largest "
                     "absolute difference)", dcos, hi=0.1,
                     why=f"finite width d = {d} and n = {n}: O(1/√d) departures of the "
                         "per-layer map, accumulated over depth"),
        Check.that(f"noci22 Figs. 3, 9: the correlation rises less with pre-LN (cosine at layer "
                   f"{depth}, post minus pre)", cos_gap > Z * cos_gap_se, cos_gap,
                   f"> {Z * cos_gap_se:.3g} ({Z:g} SE)",
                   why=f"{Z:g} combined standard errors over {seeds} seeds"),
        Check.that(f"noci22 Fig. 3: in post-LN the query gradients vanish with depth while the "
                   f"value gradients do not (layer {depth} over layer 1: queries "
                   f"{q_drop:.2g} vs values {v_drop:.2g})", q_drop < 0.1 * v_drop, q_drop,
                   f"< 0.1 × {v_drop:.3g}",
                   why="a factor 10 margin: the query gradient scales like (1-ρ)², the value "
                       "gradient like 1 + ρ(n-1) (Eqs. 17-18)"),
        Check.that("noci22 Fig. 9: pre-LN stabilises the query gradients (decades spanned over "
                   f"the layers: pre {span(pre):.2f} vs post {span(post):.2f})",
                   span(pre) < span(post), span(pre), f"< {span(post):.2f}",
                   why="the spans differ by decades; no tolerance needed"),
        Check.that("noci22 Fig. 9: the value gradients trend the opposite way over depth "
                   f"(log10 slope per layer: pre {tv_pre:.3f} vs post {tv_post:.3f})",
                   tv_pre < 0 and tv_post > tv_pre + 0.02, tv_pre,
                   f"< 0 and < {tv_post - 0.02:.3f}",
                   why="0.02 decades per layer margin over seed noise"),
    ]


def plot_fig3_9(data: dict, ax=None):
    """fig3_9's figure (``ax``: the axes to draw on, as the figure lays them out)."""
    res, seeds = data["res"], data["seeds"]
    fig, axs = axes_grid(ax, 2, 2, (10.0, 7.0), sharex=True)
    for col, norm in enumerate(("post", "pre")):
        r = res[norm]
        ax = axs[0, col]
        lay = np.arange(len(r["cos_theory"]))
        ax.plot(lay, r["cos_theory"], "-", color="C0", lw=1.2, label="sigprop theory")
        ax.errorbar(*r["cos"][:2], yerr=2 * r["cos"][2], fmt="o", ms=4, color="C0",
                    label=f"measured ({seeds} seeds)")
        ax.set_ylim(0, 1.02)
        decorate(ax, None, "mean token cosine",
                 f"noci22 Fig. {3 if norm == 'post' else 9}: {norm.upper()}-LN, correlation",
                 frameon=False)
        ax = axs[1, col]
        for j, (key, lab) in enumerate((("grad_qk", "‖∂L/∂W_Q‖²"), ("grad_v", "‖∂L/∂W_V‖²"))):
            ax.errorbar(*r[key][:2], yerr=2 * r[key][2], fmt="os"[j] + "-", ms=4,
                        color=f"C{j + 1}", label=lab)
        ax.set_yscale("log")
        decorate(ax, "layer", "squared gradient norm",
                 f"noci22 Fig. {3 if norm == 'post' else 9}: {norm.upper()}-LN, gradients",
                 frameon=False)
    return fig


def _fig3_9_table(data: dict):
    res, span, trend = data["res"], data["span"], data["trend"]
    return pd.DataFrame([dict(norm=k, cos_last=r["cos"][1][-1],
                               cos_last_theory=r["cos_theory"][-1],
                               grad_q_first=r["grad_qk"][1][0], grad_q_last=r["grad_qk"][1][-1],
                               grad_v_first=r["grad_v"][1][0], grad_v_last=r["grad_v"][1][-1],
                               q_decades=span(r), v_trend=trend(r, "grad_v"))
                          for k, r in res.items()])


@register("noci22.fig3_9", tiny=dict(depth=8, seeds=12), quick=dict(seeds=50),
          runtime={"tiny": 0.3, "quick": 1.2, "default": 0.6})
@one_thread
def fig3_9(*, seed: int = 0, device: str = "cpu", depth: int = 12, d: int = 32, heads: int = 4,
           d_ff: int = 128, n: int = 50, seeds: int = 24, rho0: float = 0.2) -> Experiment:
    args.device(device)
    depth = args.integer("depth", depth, 2, 200)
    d = args.integer("d", d, 2, 4096)
    heads = args.integer("heads", heads, 1, d)
    args.need("heads", d % heads == 0, f"a divisor of d = {d} (got {heads})")
    d_ff = args.integer("d_ff", d_ff, 1, 65536)
    n = args.integer("n", n, 2, 4096)
    seeds = args.integer("seeds", seeds, 2, 4096)
    rho0 = args.real("rho0", rho0, 0.0, 0.99)
    data = fig3_9_data(seed=seed, depth=depth, d=d, heads=heads, d_ff=d_ff, n=n, seeds=seeds,
                       rho0=rho0)
    checks = fig3_9_checks(data)
    return Experiment(data["frame"], _fig3_9_table(data), checks, plot_fig3_9, data)
