"""What the methods that replace the softmax (sigmoid attention, softpick, sinks,
differential attention; :attr:`~.base.Method.replaces_softmax`) share when they patch an HF
model: the attention site of every block, and the rule that one of them at a time owns the
map (two replacements of one softmax do not compose)."""

from __future__ import annotations

from ...spec import SpecError
from .base import recorded
from .parts import need

#: the model attribute naming the method that replaced its softmax in this session
OWNER = "_sigprop_softmax_by"


def claim_softmax(model, parts, name: str) -> None:
    """Check that every block has an attention site and that no other recorded (or just
    applied) method replaces ``model``'s softmax, then mark ``model`` as ``name``'s (a
    SpecError naming ``name`` otherwise)."""
    for p in parts:
        need(p, "site", name)
    if model is None:
        return
    others = [m.name for m, _ in recorded(getattr(model, "config", None))
              if m.replaces_softmax]
    prior = getattr(model, OWNER, None)
    if prior is not None:
        others.append(prior)
    if others:
        raise SpecError(name, f"{others[0]} already replaces this model's softmax; apply one "
                              "method that does")
    object.__setattr__(model, OWNER, name)
