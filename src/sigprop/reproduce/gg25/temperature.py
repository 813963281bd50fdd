"""gg25 Eq. 11 and B.1: the effective inverse temperature ``beta_eff = sigma^2 d /
sqrt(log T)`` of standard initialisations (BERT-base ~ 0.12, far below beta_c = sqrt 2),
measured on the scores of one HuggingFace BERT layer (or of N(0, std^2) weights drawn here)
and read from :attr:`sigprop.spec.ArchSpec.beta_eff` for the listed models."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...spec import ArchSpec
from .. import args
from ..core import Check, Experiment, frame, register
from ..plots import axes_row, decorate
from .common import BETA_HF, SQRT2

__all__ = ["eqB1", "eqB1_data", "eqB1_checks", "plot_eqB1", "QKWeights", "qk_weights"]

#: the models whose beta_eff the table lists: (d_model, heads, T)
_MODELS = {"BERT-base": (768, 12, 512), "BERT-large": (1024, 16, 512),
           "GPT-2 small": (768, 12, 1024)}


@dataclass(frozen=True, kw_only=True)
class QKWeights:
    """One attention layer's query and key weights ``wq``, ``wk`` (d_model x d_model, applied
    as ``x @ wq``), their biases ``bq``, ``bk`` and ``source``, where they came from."""

    wq: np.ndarray
    wk: np.ndarray
    bq: np.ndarray
    bk: np.ndarray
    source: str


def qk_weights(rng: np.random.Generator, *, use_transformers: bool, seed: int, T: int,
               std: float, d_model: int, heads: int) -> QKWeights:
    """The query and key weights of one attention layer: HF's ``BertModel`` from its config
    (its own initialisation), or N(0, std^2) weights drawn from ``rng``."""
    if use_transformers:
        import torch
        from transformers import BertConfig, BertModel

        torch.manual_seed(seed)
        cfg = BertConfig(hidden_size=d_model, num_attention_heads=heads, num_hidden_layers=1,
                         intermediate_size=4 * d_model, initializer_range=std,
                         vocab_size=64, max_position_embeddings=T)
        att = BertModel(cfg).encoder.layer[0].attention.self
        return QKWeights(wq=att.query.weight.detach().double().numpy().T,
                         wk=att.key.weight.detach().double().numpy().T,
                         bq=att.query.bias.detach().double().numpy(),
                         bk=att.key.bias.detach().double().numpy(),
                         source="transformers BertModel from its config (HF's own "
                                "initialisation)")
    wq = std * rng.standard_normal((d_model, d_model))
    wk = std * rng.standard_normal((d_model, d_model))
    return QKWeights(wq=wq, wk=wk, bq=np.zeros(d_model), bk=np.zeros(d_model),
                     source="N(0, std^2) weights drawn here")


def eqB1_data(*, seed: int, use_transformers: bool, T: int, std: float, d_model: int,
              heads: int) -> dict:
    """Scores of ``T`` LayerNorm'd Gaussian tokens, their per-head std and beta_eff, the
    listed models' beta_eff, the score histogram against N(0, sigma_s^2) and the records."""
    rng = np.random.default_rng(seed)
    w = qk_weights(rng, use_transformers=use_transformers, seed=seed, T=T, std=std,
                   d_model=d_model, heads=heads)
    x = rng.standard_normal((T, d_model))
    x *= math.sqrt(d_model) / np.linalg.norm(x, axis=1, keepdims=True)   # after LayerNorm
    dh = d_model // heads
    q = (x @ w.wq + w.bq).reshape(T, heads, dh).transpose(1, 0, 2)
    k = (x @ w.wk + w.bk).reshape(T, heads, dh).transpose(1, 0, 2)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)                           # (H, T, T)
    per_head = s.std(axis=(1, 2))
    sig = float(np.sqrt(np.mean(per_head**2)))
    beta_meas = sig / math.sqrt(math.log(T))
    spec = ArchSpec(d_model=d_model, heads=heads, seq_len=T, init_std=std)
    rows = [dict(model=n, d_model=d, heads=h, T=t, init_std=0.02,
                 beta_eff=ArchSpec(d_model=d, heads=h, seq_len=t).beta_eff,
                 beta_over_beta_c=ArchSpec(d_model=d, heads=h, seq_len=t).beta_eff / SQRT2)
            for n, (d, h, t) in _MODELS.items()]
    rows.append(dict(model=f"measured ({'HF' if use_transformers else 'numpy'})",
                     d_model=d_model, heads=heads, T=T, init_std=std, beta_eff=beta_meas,
                     beta_over_beta_c=beta_meas / SQRT2))
    edges = np.linspace(-5 * sig, 5 * sig, 61)
    hist = np.histogram(s.ravel(), edges, density=True)[0]
    mid = 0.5 * (edges[1:] + edges[:-1])
    dens = [math.exp(-0.5 * (c / spec.sigma_s) ** 2) / (math.sqrt(2 * math.pi) * spec.sigma_s)
            for c in mid]
    recs = [dict(observable="score_density", source="measured", value=v, score=c)
            for c, v in zip(mid, hist, strict=True)]
    recs += [dict(observable="score_density", source="theory", value=v, score=c)
             for c, v in zip(mid, dens, strict=True)]
    recs += [dict(observable="beta_eff", source="theory", value=r["beta_eff"], model=r["model"])
             for r in rows[:-1]]
    recs.append(dict(observable="beta_eff", source="measured", value=beta_meas,
                     model=rows[-1]["model"]))
    return dict(recs=recs, table=pd.DataFrame(rows), source=w.source, per_head=per_head,
                beta_meas=beta_meas, sigma_s=spec.sigma_s, edges=edges, hist=hist, mid=mid,
                dens=dens, T=T, std=std, d_model=d_model, heads=heads, dh=dh)


def eqB1_checks(data: dict) -> list[Check]:
    """B.1's formula, ArchSpec's beta_eff, Eq. 11's independence of the heads and Sec.
    3.2.2's standard initialisations far below beta_c."""
    heads, T, std, d_model = data["heads"], data["T"], data["std"], data["d_model"]
    formula = std**2 * d_model / math.sqrt(math.log(T))
    per_head = data["per_head"]
    return [
        Check.ratio("gg25 B.1: measured score std / sqrt(log T) equals sigma^2 d / sqrt(log T) "
                    f"({formula:.4f})", data["beta_meas"], formula, 1.05,
                    why=f"one draw of the weights: the realised score variance scatters by "
                        f"~sqrt(2/d_H) / sqrt(d) per head, averaged over {heads} heads; "
                        f"{T}^2 scores per head"),
        Check.ratio("gg25 B.1: sigprop's ArchSpec().beta_eff for BERT-base is "
                    "0.02^2 * 768 / sqrt(log 512)", ArchSpec().beta_eff, BETA_HF, 1.0 + 1e-9,
                    why="closed form; roundoff only"),
        Check.within("gg25 Eq. 11: the score std does not depend on the number of heads "
                     "(spread of the per-head std / its mean)",
                     float(per_head.std() / per_head.mean()), 0.0, 0.1,
                     why=f"per head sqrt(2/d_H) ~ {math.sqrt(2 / data['dh']):.2f} fluctuation "
                         "of |W_Q^h x|^2 averaged over T tokens: a few percent"),
        Check.within("gg25 Sec. 3.2.2: standard initialisations sit far below beta_c (largest "
                     "beta_eff / sqrt 2 of the listed models)",
                     float(data["table"].beta_over_beta_c.max()), 0.0, 0.2,
                     why="a margin that keeps finite-size effects negligible (B.7)"),
    ]


def plot_eqB1(data: dict, ax=None):
    """Left the score histogram against N(0, sigma_s^2), right beta_eff per model with
    beta_c."""
    fig, (ax0, ax1) = axes_row(ax, 2, (9.5, 3.6))
    edges, mid, table = data["edges"], data["mid"], data["table"]
    ax0.bar(mid, data["hist"], width=edges[1] - edges[0], color="C0", alpha=0.6,
            label="measured scores")
    ax0.plot(mid, data["dens"], "k-", label=f"N(0, (σ²d)²), σ_s = {data['sigma_s']:.3f}")
    decorate(ax0, "score s_ab", "density",
             f"gg25 B.1: scores of {data['heads']} heads, d = {data['d_model']}, std "
             f"{data['std']:g}")
    ax1.barh(table.model, table.beta_eff, color="C1")
    ax1.axvline(SQRT2, color="#d1495b", ls="--", label="β_c = √2")
    ax1.set_xscale("log")
    decorate(ax1, "β_eff", None, "effective β of standard initialisations (Eq. 11)")
    return fig


@register("gg25.eqB1", tiny=dict(use_transformers=False, T=256),
          quick=dict(use_transformers=True, T=512),
          runtime={"tiny": 0.1, "quick": 3.5, "default": 3.5})
def eqB1(*, seed: int = 0, device: str = "cpu", use_transformers: bool = True, T: int = 512,
         std: float = 0.02, d_model: int = 768, heads: int = 12) -> Experiment:
    args.integer("T", T, 8, 4096)
    args.integer("d_model", d_model, 8, 8192)
    args.integer("heads", heads, 1, d_model)
    args.need("heads", d_model % heads == 0, f"a divisor of d_model (got {heads!r})")
    args.real("std", std, 1e-4, 1.0)
    data = eqB1_data(seed=seed, use_transformers=use_transformers, T=T, std=std,
                     d_model=d_model, heads=heads)
    return Experiment(frame(data["recs"]), data["table"], eqB1_checks(data), plot_eqB1, data)
