"""The training loop every trainer in sigprop runs: :func:`run` steps an optimiser on the
losses a caller computes, :func:`step` is one of its steps and :func:`backward` the gradient
part of one.

What varies between the trainers is plugged in: the losses of a step (a function of the step
number that draws its own batch: a corpus stream, a fixed full batch), the optimiser (torch's
AdamW with a schedule; :class:`sigprop.training.optim.SliceAdam` for one learning rate per
slice), what happens to the gradients before the update (per-slice or global clipping,
non-finite entries zeroed) and what happens after it (logging, evaluation, measurement).
The losses may be one scalar or one per slice of a batched model: the backward pass is that
of their sum, so each slice's parameters get exactly their own slice's gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["backward", "run", "step"]


def backward(losses: Tensor, owner) -> Tensor:
    """Zero the gradients of ``owner`` (a module or an optimiser, ``zero_grad(set_to_none=
    True)``) and run the backward pass of ``losses.sum()``; returns ``losses`` detached."""
    owner.zero_grad(set_to_none=True)
    losses.sum().backward()
    return losses.detach()


def step(losses: Tensor, opt: torch.optim.Optimizer, *,
         on_grads: Callable[[], object] | None = None, sched=None) -> Tensor:
    """One optimiser step on ``losses`` (:func:`backward`, then ``on_grads()``, e.g.
    clipping, then ``opt.step()`` and ``sched.step()``); returns ``losses`` detached."""
    out = backward(losses, opt)
    if on_grads is not None:
        on_grads()
    opt.step()
    if sched is not None:
        sched.step()
    return out


def run(losses_at: Callable[[int], Tensor], opt: torch.optim.Optimizer, steps: int, *,
        on_grads: Callable[[], object] | None = None, sched=None,
        after: Callable[[int, Tensor], None] | None = None, finite: bool = False) -> int:
    """Steps ``1..steps``: ``losses_at(step)`` (the current parameters' losses on that step's
    batch), :func:`step` on them, then ``after(step, losses)`` with the detached losses (as
    they were before the update). ``finite``: stop before the backward pass of the first
    step whose losses are not all finite. Returns the number of steps taken."""
    for k in range(1, steps + 1):
        losses = losses_at(k)
        if finite and not bool(torch.isfinite(losses).all()):
            return k - 1
        losses = step(losses, opt, on_grads=on_grads, sched=sched)
        if after is not None:
            after(k, losses)
    return steps
