"""Optimisers of sliced models: Adam with one learning rate per slice, per-slice gradient
clipping, and :func:`train`'s AdamW with its schedule.

A batched model keeps independent runs side by side as slices of every parameter along one
slice dimension (seeds, score scales, learning rates). The runs stay independent as long as
the loss is the sum of the slices' losses (each slice gets its own gradient) and every
optimiser operation is elementwise. torch's Adam is elementwise but takes one learning rate
per parameter group, so runs at different learning rates would need one parameter per run;
:class:`SliceAdam` takes a tensor of rates, one per slice, and is otherwise torch's Adam
(AdamW with ``weight_decay``) for every slice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from .config import TrainConfig

__all__ = ["MuonAdamW", "SliceAdam", "clip_per_slice", "make_optimizer"]


class SliceAdam(torch.optim.Optimizer):
    """Adam whose learning rate ``lr`` is a float or a tensor of one rate per slice along
    dimension ``dim`` of every parameter (so every parameter of a group must have as many
    slices there as ``lr`` has entries).

    Each slice follows torch's ``Adam`` (``weight_decay`` 0) or ``AdamW`` (``weight_decay`` >
    0: decoupled, ``p <- p (1 - lr wd)`` before the update) at its own rate:
    ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2`` and
    ``p <- p - lr (m / c1) / (sqrt(v / c2) + eps)`` with ``c_i = 1 - b_i^t`` at step ``t``;
    the same formula, eps placement and bias correction as torch's (which rounds it in
    another order: equal to float tolerance, not bitwise)."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float | Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, dim: int = 0):
        rates = torch.as_tensor(lr, dtype=torch.float64)
        if rates.dim() > 1 or not bool((rates >= 0).all()):
            raise ValueError(f"lr: a float or a 1-D tensor of rates >= 0 (got {lr!r})")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0 and eps >= 0.0
                and weight_decay >= 0.0):
            raise ValueError(f"betas in [0, 1), eps >= 0, weight_decay >= 0 (got {betas}, "
                             f"{eps}, {weight_decay})")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      dim=dim))

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient; ``closure`` as torch's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p),
                                 exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                lr = _per_slice(group["lr"], p, group["dim"])
                if group["weight_decay"]:
                    p.mul_(1 - lr * group["weight_decay"])
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                c1, c2 = 1.0 - b1 ** t, 1.0 - b2 ** t
                p.sub_(lr * ((m / c1) / ((v / c2).sqrt() + group["eps"])))
        return loss


def _per_slice(lr: float | Tensor, p: Tensor, dim: int) -> float | Tensor:
    """``lr`` as a factor of ``p``: a float as is, a tensor of rates in ``p``'s dtype and
    device, shaped to broadcast along ``p``'s slice dimension ``dim``."""
    if not isinstance(lr, Tensor):
        return lr
    if lr.dim() == 0:
        return lr.to(dtype=p.dtype, device=p.device)
    if lr.numel() != p.shape[dim]:
        raise ValueError(f"{lr.numel()} learning rates for a parameter of {p.shape[dim]} "
                         f"slices along dim {dim} (shape {tuple(p.shape)})")
    shape = [1] * p.dim()
    shape[dim] = lr.numel()
    return lr.to(dtype=p.dtype, device=p.device).view(shape)


def clip_per_slice(params: Sequence[nn.Parameter], max_norm: float) -> Tensor:
    """Scale each slice's gradient (leading dim) to global norm <= ``max_norm``; returns the
    per-slice norms before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = sum(g.double().square().flatten(1).sum(1) for g in grads)
    norm = sq.sqrt()
    if max_norm > 0:
        factor = (max_norm / (norm + 1e-6)).clamp(max=1.0).to(grads[0].dtype)
        for g in grads:
            g.mul_(factor.view(-1, *([1] * (g.dim() - 1))))
    return norm


def make_optimizer(model: nn.Module, config: TrainConfig):
    """AdamW (decay on matrices only) and HF's linear warmup/decay schedule; returns
    ``(optimiser, scheduler, trained parameters)``. Every slice trains at the same rate, so
    torch's fused AdamW serves (elementwise, hence per slice)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 3],
               "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 3], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    try:  # the fused kernel (CPU and CUDA) is several times faster than the per-tensor loop
        opt = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), eps=1e-8,
                                fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), eps=1e-8)
    warm = math.ceil(config.warmup_ratio * config.steps)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (config.steps - step) / max(1, config.steps - warm))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor), params


class MuonAdamW:
    """Muon on a model's hidden weight matrices and AdamW on everything else, as one
    optimiser (Kimi K2's and Moonlight's split; Muon is torch's ``torch.optim.Muon``).

    Muon takes every trainable 2-D parameter except those of the embeddings (every
    ``nn.Embedding``, and the output head of ``get_output_embeddings()``, tied or not): the
    attention and MLP projections, whichever way round a layer stores them (GPT-2's
    ``Conv1D`` keeps ``(in, out)``; Muon's orthogonalised update does not depend on it). Its
    learning rate is scaled to AdamW's update RMS (``adjust_lr_fn="match_rms_adamw"``:
    ``0.2 sqrt(max(rows, cols))``), so one ``lr`` serves both halves. AdamW takes the
    embeddings, the head, norms, biases and any other parameter with ``betas``.

    ``param_groups`` lists both halves' groups (a schedule sets ``g["lr"]`` on each);
    :meth:`step`, :meth:`zero_grad`, :meth:`state_dict` and :meth:`load_state_dict` run
    both. It is not a ``torch.optim.Optimizer`` (torch's LR schedulers take one optimiser:
    give them ``.muon`` and ``.adamw`` each, or set the rates through ``param_groups``)."""

    def __init__(self, model: nn.Module, lr: float, *, betas: tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.0, momentum: float = 0.95):
        emb = {id(p) for m in model.modules() if isinstance(m, nn.Embedding)
               for p in m.parameters()}
        get_out = getattr(model, "get_output_embeddings", None)
        head = get_out() if callable(get_out) else None
        if isinstance(head, nn.Module):
            emb |= {id(p) for p in head.parameters()}
        params = [p for p in model.parameters() if p.requires_grad]
        hidden = [p for p in params if p.dim() == 2 and id(p) not in emb]
        rest = [p for p in params if p.dim() != 2 or id(p) in emb]
        if not hidden:
            raise ValueError(f"{type(model).__name__}: no 2-D hidden weight for Muon")
        self.muon = torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay,
                                     momentum=momentum, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(rest, lr=lr, betas=betas, weight_decay=weight_decay) \
            if rest else None
        self.param_groups = self.muon.param_groups + (self.adamw.param_groups if self.adamw
                                                      else [])

    def step(self) -> None:
        self.muon.step()
        if self.adamw is not None:
            self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        if self.adamw is not None:
            self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """Both halves' states (``{"muon": ..., "adamw": ...}``)."""
        return {"muon": self.muon.state_dict(),
                "adamw": None if self.adamw is None else self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` gave (for the same model's parameters)."""
        self.muon.load_state_dict(state["muon"])
        if self.adamw is not None and state.get("adamw") is not None:
            self.adamw.load_state_dict(state["adamw"])
