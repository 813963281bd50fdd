"""mindthegap Sec. 3, Fig. 3: BERT and RoBERTa built from their configs at initialisation
(untrained, no download) collapse the rank of random token sequences in width and depth."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from .. import args
from ..core import Check, Experiment, frame, one_thread, register
from ..plots import axes_grid, decorate, titled
from .common import C_GAP, C_PERP, loglog_slope, plt_colours, sizes, sr_excess, sub

__all__ = ["fig3"]


def plot_fig3(r: dict, ax=None):
    """Fig. 3: the encoders' stable rank over T (left) and over depth (right); ``ax``: two
    Axes, or None for a new figure."""
    Ts, res = r["Ts"], r["res"]
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 2, (4.4 * 2, 3.5))
    a, b = ax[0]
    cols = plt_colours(len(Ts))
    for k, (name, ex) in enumerate(res.items()):
        mk_ = "os^D"[k % 4]
        for l in (0, ex.shape[1] - 1):
            a.plot(Ts, 1 + ex[:, l], marker=mk_, ls="-" if l == 0 else "--",
                   color=C_GAP if k == 0 else C_PERP, label=f"{name}, layer {l}")
        for i, T in enumerate(Ts):
            b.plot(np.arange(ex.shape[1]), 1 + ex[i], marker=mk_, ms=3, color=cols[i],
                   ls="-" if k == 0 else "--", label=f"T = {T}" if k == 0 else None)
    a.set_xscale("log")
    a.set_yscale("log")
    decorate(a, "T (tokens)", r"sr$(\Sigma)$", "(a) width", legend=6)
    b.set_yscale("log")
    decorate(b, "layer (0 = embeddings)", r"sr$(\Sigma_\ell)$",
             f"(b) depth ({', '.join(res)}: solid, dashed)", size=8, legend=6)
    return titled(fig, "mindthegap Fig. 3: encoders at initialisation", own)


@register("mindthegap.fig3", tiny=dict(models=("bert-base-uncased",), Ts=(16, 32, 64), small=True),
          quick=dict(models=("bert-base-uncased", "roberta-base"), Ts=(32, 64, 128, 256)),
          full=dict(models=("bert-base-uncased", "roberta-base"), Ts=(32, 64, 128, 256, 512)),
          runtime={"tiny": 4.3, "quick": 6.5, "default": 6.5})
@one_thread
def fig3(*, seed: int = 0, device: str = "cpu",
         models: Sequence[str] = ("bert-base-uncased", "roberta-base"),
         Ts: Sequence[int] = (32, 64, 128, 256), small: bool = False) -> Experiment:
    from ...models.loading import model_at_init
    from ...models.presets import PRESETS, shrink

    Ts = sizes("Ts", Ts, low=4)
    args.need("models", len(models) >= 1 and all(m in PRESETS for m in models),
              f"names from the presets ({', '.join(PRESETS)})")
    dev = torch.device(args.device(device))
    vocab = 2000
    rows, table = [], []
    res = {}
    for mi, name in enumerate(models):
        cfg = shrink(PRESETS[name], layers=3, hidden=768, heads=12, intermediate=3072,
                     vocab=vocab) if small else PRESETS[name]
        model = model_at_init(cfg, seed=sub(seed, 30, mi) % 2**31, vocab_size=vocab).to(dev)
        pos = int(cfg.get("max_position_embeddings", 512)) - (2 if "roberta" in name else 0)
        args.need("Ts", Ts[-1] <= pos, f"at most the model's {pos} positions")
        g = torch.Generator().manual_seed(sub(seed, 31, mi) % 2**31)
        out = []
        for T in Ts:
            ids = torch.randint(5, vocab, (1, T), generator=g).to(dev)
            with torch.no_grad():
                hs = model(input_ids=ids, output_hidden_states=True).hidden_states
            out.append([sr_excess(h[0].double().cpu().numpy()) for h in hs])
        ex = np.array([[e for e, _ in o] for o in out])  # (nT, L + 1)
        res[name] = ex
        for i, T in enumerate(Ts):
            for l in range(ex.shape[1]):
                rows.append(dict(observable="stable_rank", source="measured",
                                 value=1 + ex[i, l], layer=l, T=T, model=name))
        sl = loglog_slope(Ts, ex.T)  # per layer
        table.append(dict(model=name, layers=ex.shape[1] - 1, width_slope_max=float(sl.max()),
                          width_slope_min=float(sl.min()), sr_embed_Tmax=1 + ex[-1, 0],
                          sr_last_Tmax=1 + ex[-1, -1]))
    tab = pd.DataFrame(table)
    checks = []
    for name, ex in res.items():
        sl = loglog_slope(Ts, ex.T)
        checks.append(Check.within(
            f"Fig. 3(a): {name}, sr(Sigma_l) - 1 falls as T grows at every layer (largest "
            "log-log slope over layers)", float(sl.max()), -math.inf, -0.4,
            why="rank collapse in width: the tokens share a common direction (type and "
                "position embeddings, uniform-ish attention at init std 0.02), so sr - 1 ~ "
                "(1 - rho)^2 / (rho^2 T); -0.4 leaves room for the finite-T onset"))
        dec = float(np.max(ex[:, -1] / ex[:, 0]))
        checks.append(Check.within(
            f"Fig. 3(b): {name}, sr(Sigma_L) - 1 below sr(Sigma_0) - 1 (collapse in depth; "
            "largest ratio over T)", dec, 0.0, 0.9,
            why="each block averages tokens further; 0.9 for the seed"))
    r = dict(Ts=Ts, res=res, cut=", cut to 3 layers" if small else "")  # `cut`: for the notes
    return Experiment(frame(rows), tab, checks, plot_fig3, r)

