"""The in-step telemetry's sampled rows turned into statistics
(:class:`~.telemetry.AttentionTelemetry`): every layer's rows of one shape at once, once a
step, so that their dozen small operations do not run once per layer."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

__all__ = ["SampledRows", "sampled_stats", "statistics_of"]


@dataclass
class SampledRows:
    """One attention call's reading before its statistics: the sampled rows' logits ``sc``
    (``(G * ns * H, R, Tk)``, masked -inf), their row indices ``idx`` (``(R,)``), the exact
    per-map maxima ``best`` (``(G * per * H,)``) and ``shape`` = (T, Tk, G, ns, per, H)."""

    sc: torch.Tensor
    idx: torch.Tensor
    best: torch.Tensor
    shape: tuple


def statistics_of(now: dict[int, list]) -> dict[int, list[dict[str, torch.Tensor]]]:
    """``{layer: [call's statistics, ...]}`` of the step's readings: the calls of one shape
    (and dtype, device) stacked and read by one :func:`sampled_stats`."""
    out: dict[int, list] = defaultdict(list)
    groups: dict[tuple, list[tuple[int, int, SampledRows]]] = defaultdict(list)
    for i, parts in now.items():
        for j, r in enumerate(parts):
            groups[(r.shape, r.sc.shape, r.sc.dtype, str(r.sc.device))].append((i, j, r))
            out[i].append(None)
    for (shape, *_), calls in groups.items():
        T, Tk, G, ns, per, H = shape
        st = sampled_stats(torch.stack([r.sc for _, _, r in calls]),
                            torch.stack([r.idx for _, _, r in calls]),
                            torch.stack([r.best for _, _, r in calls]), T=T, Tk=Tk, groups=G,
                            sampled=ns, per=per, heads=H)
        # on the CPU in float32 once, split into the calls' rows by one unbind per statistic
        parts = {k: v.float().cpu().unbind(0) for k, v in st.items()}
        for n, (i, j, _) in enumerate(calls):
            out[i][j] = {k: v[n] for k, v in parts.items()}
    return {i: v for i, v in out.items() if v}


def sampled_stats(sc: torch.Tensor, idx: torch.Tensor, best: torch.Tensor, *, T: int, Tk: int,
                   groups: int, sampled: int, per: int, heads: int) -> dict[str, torch.Tensor]:
    """Statistics of ``L`` calls (layers) at once from their sampled rows' logits ``sc``
    (``(L, groups * sampled * heads, R, Tk)``, masked -inf; rows ``idx`` ``(L, R)`` of T) and
    the exact per-map maxima ``best`` (``(L, groups * per * heads)``): per call and head
    ``(L, H)``, or with several groups also per group (``slice:<stat>``, ``(L, groups, H)``;
    :meth:`~.telemetry.AttentionTelemetry._layer_stats`)."""
    L, G, ns, H, R = sc.shape[0], groups, sampled, heads, idx.shape[-1]
    # a dozen passes over the (L, maps, R, Tk) logits, no more: this runs every step
    vis = torch.isfinite(sc)
    hidden = ~vis
    keys = vis.sum(-1)  # (L, N * H, R)
    z = sc.masked_fill(hidden, 0.0)
    s2 = torch.linalg.vector_norm(z, dim=(-1, -2)).square()  # (L, N * H)
    cnt = keys.sum(-1)
    if T == Tk:  # sigma_s leaves each row's own key out, as the probe's
        at = idx[:, None, :, None].expand(L, sc.shape[1], R, 1)
        s2 = s2 - z.gather(-1, at).square().sum((-1, -2))
        cnt = cnt - vis.gather(-1, at).sum((-1, -2))
    sigma = (s2.clamp_min(0.0) / cnt.clamp_min(1)).sqrt()
    # the rows' softmax: masked entries set to 0 before the exponential and to 0 after
    # (an exponential of a very negative number takes a slow path: ~8x on this CPU)
    mx = sc.amax(-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    d = (sc - mx).masked_fill_(hidden, 0.0)
    e = d.exp().masked_fill_(hidden, 0.0)
    rz = e.sum(-1).reciprocal()  # 1 / Z; the largest weight (e = 1 at the maximum)
    ipr = torch.linalg.vector_norm(e, dim=-1).square() * rz.square()
    h = (rz.log().neg() - torch.linalg.vecdot(e, d) * rz).clamp_min(0.0)  # entropy, nats
    h = h / torch.log(keys.clamp_min(2).to(e.dtype))
    h = h.masked_fill(keys < 2, math.nan).reshape(L, G, ns, H, R)
    fpc = math.sqrt((T - R) / (T - 1)) if T > 1 else 0.0

    def entropy_of(hh):  # (..., H, n rows) -> the mean and its standard error
        n = (~hh.isnan()).sum(-1)
        mean = torch.nanmean(hh, -1)
        var = torch.nanmean((hh - mean[..., None]).square(), -1) * n / \
            (n - 1).clamp_min(1)
        return mean, (var / n.clamp_min(1)).sqrt() * fpc

    def per_head(x):  # (L, G * ns * H) -> the mean over a group's sequences, (L, G, H)
        return x.reshape(L, G, ns, H).mean(2)

    mean, se = entropy_of(h.transpose(2, 3).reshape(L, G, H, ns * R))
    by = {"max_logit": best.reshape(L, G, per, H).amax(2), "entropy": mean,
          "entropy_se": se, "ipr": per_head(ipr.mean(-1)), "wmax": per_head(rz.mean(-1)),
          "sink": per_head((e[..., 0] * rz).mean(-1)),
          "sigma_s": per_head(sigma.square()).sqrt(),
          "keys": per_head(keys.to(sc.dtype).mean(-1))}
    if G == 1:
        return {k: v[:, 0] for k, v in by.items()}
    mean, se = entropy_of(h.permute(0, 3, 1, 2, 4).reshape(L, H, G * ns * R))
    out = {"max_logit": by["max_logit"].amax(1), "entropy": mean, "entropy_se": se}
    out.update({k: by[k].mean(1) for k in ("ipr", "wmax", "sink", "keys")})
    out["sigma_s"] = by["sigma_s"].square().mean(1).sqrt()
    out.update({f"slice:{k}": v for k, v in by.items()})
    return out
