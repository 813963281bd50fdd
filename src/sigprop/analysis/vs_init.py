"""Trained weights beside the same architecture freshly initialised: which weights these are,
and what training changed.

:func:`beside_init` builds the config's own init (:func:`sigprop.models.model_at_init` under
the diagnosis seed) next to the model under test and checks every matrix of the measured
blocks against it (:func:`sigprop.measurement.weights_init.check_against_init`: ``init``,
``trained`` or ``mixed``); with ``vs_init`` (``diagnose(..., vs_init=True)``, ``sigprop
diagnose MODEL --vs-init``) the same probe also measures the fresh model on the same token
ids, and :func:`compare` lays the two measurements side by side per layer (cosine,
head-averaged entropy, ipr, the RMS score std and beta over heads) and per head (score std,
beta, entropy), with the change (trained minus init) for each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: per-layer observables compared (measured rows of the trajectory)
LAYER_OBS = ("cos", "entropy", "ipr")
#: per-head observables compared
HEAD_OBS = ("sigma_s", "entropy")


@dataclass(frozen=True, kw_only=True)
class VsInit:
    """The trained and the freshly initialised model on the same inputs: ``layers`` (one row
    per layer: ``<obs>_trained``, ``<obs>_init``, ``<obs>_change`` for cos, entropy, ipr and
    the RMS over heads of sigma_s and beta) and ``heads`` (one row per layer and head: the
    same for sigma_s, beta and entropy); ``seed``: the init's seed."""

    layers: object
    heads: object
    seed: int

    def to_dict(self) -> dict:
        from ..trajectory import to_rows

        return {"seed": self.seed, "layers": to_rows(self.layers),
                "heads": to_rows(self.heads)}


def _per_layer(meas, heads, seq_len: int):
    m = meas[meas.source == "measured"]
    wide = m.pivot_table(index="layer", columns="observable", values="value", aggfunc="first")
    wide = wide.reindex(columns=[c for c in LAYER_OBS if c in wide.columns])
    sig = heads[(heads.observable == "sigma_s") & (heads.source == "measured")]
    if len(sig):
        rms = sig.groupby("layer")["value"].apply(lambda v: float(np.sqrt(np.mean(v ** 2))))
        wide["sigma_s"] = rms
        wide["beta"] = rms / math.sqrt(math.log(seq_len))
    return wide


def _per_head(heads, seq_len: int):
    h = heads[heads.source == "measured"]
    h = h[h.observable.isin(HEAD_OBS)]
    wide = h.pivot_table(index=["layer", "head"], columns="observable", values="value",
                         aggfunc="first")
    if "sigma_s" in wide.columns:
        wide["beta"] = wide["sigma_s"] / math.sqrt(math.log(seq_len))
    return wide


def _side_by_side(trained, init, index):
    import pandas as pd

    cols = {}
    for c in trained.columns:
        if c not in init.columns:
            continue
        a, b = trained[c], init[c].reindex(trained.index)
        cols[f"{c}_trained"], cols[f"{c}_init"], cols[f"{c}_change"] = a, b, a - b
    out = pd.DataFrame(cols, index=trained.index).reset_index()
    out[index] = out[index].astype(int)  # a head index read from float rows is an integer
    return out.sort_values(index).reset_index(drop=True)


def compare(meas, heads, meas_init, heads_init, seq_len: int, seed: int) -> VsInit:
    """The trained measurement (``meas``, ``heads``: rows of the diagnosis) beside the fresh
    init's on the same inputs."""
    layers = _side_by_side(_per_layer(meas, heads, seq_len),
                           _per_layer(meas_init, heads_init, seq_len), ["layer"])
    per_head = _side_by_side(_per_head(heads, seq_len), _per_head(heads_init, seq_len),
                             ["layer", "head"])
    return VsInit(layers=layers, heads=per_head, seed=seed)


@dataclass(frozen=True, kw_only=True)
class BesideInit:
    """The weights check (``check``: an
    :class:`~sigprop.measurement.weights_init.InitCheck`, None where it could not run) and,
    with ``vs_init``, the fresh model's draw (``draw``: what ``draw_fn`` returned, else None)
    with its block list; ``notes`` on what was skipped."""

    check: Any = None
    draw: Any = None
    notes: tuple[str, ...] = ()
    #: some matrix departs from the init law in shape (its spectrum or values), not only in
    #: scale; False for an init whose matrices were only rescaled (the weights-first theory
    #: of such i.i.d. weights holds, docs/theory.md §2.8), None when not checked
    structured: bool | None = None


def _fresh_path(stack_path: str, model, fresh) -> str:
    """The measured block list's name in the fresh base model (a model with a head names it
    under its ``base_model_prefix``)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    if prefix and stack_path.startswith(prefix + ".") and not hasattr(fresh, prefix):
        return stack_path[len(prefix) + 1:]
    return stack_path


def beside_init(model, config, *, seed: int, vocab: int, mapped: bool, stack_path: str,
                vs_init: bool, draw_fn: Callable[[Any, str], Any] | None = None
                ) -> BesideInit:
    """Build the fresh init of ``config`` beside ``model`` (on its device, if memory allows
    one more copy), check the measured blocks' matrices against it and, with ``vs_init``,
    measure it with ``draw_fn(fresh, block_list)``."""
    import torch

    from ..measurement.memory import available
    from ..measurement.weights_init import check_against_init
    from ..models.loading import model_at_init

    need = sum(p.numel() * p.element_size() for p in model.parameters())
    if need * 1.5 > available():
        return BesideInit(notes=("weights: not compared with a fresh init (one more copy of "
                                 f"the model, {need / 2**30:.1f} GiB, would not fit)",))
    device = next(model.parameters()).device
    fresh = model_at_init(config, seed=seed, attn_implementation="sdpa" if mapped else "eager",
                          vocab_size=vocab).to(device)
    notes = []
    try:
        check = check_against_init(model, fresh,
                                   names=lambda n: n.startswith(stack_path + "."))
    except Exception as err:  # noqa: BLE001 - a layout the check cannot pair: say so
        check = None
        notes.append(f"weights: not compared with a fresh init ({type(err).__name__}: "
                     f"{str(err).splitlines()[0][:120] if str(err) else ''})")
    structured = None if check is None else _structured(model, fresh, check)
    draw = None
    if vs_init and draw_fn is not None:
        with torch.no_grad():
            draw = draw_fn(fresh, _fresh_path(stack_path, model, fresh))
    del fresh
    return BesideInit(check=check, draw=draw, notes=tuple(notes), structured=structured)


#: matrices whose spectral test is re-run when only the scale test fired on them
RECHECK = 4


def _structured(model, fresh, check) -> bool:
    """True when a trained matrix departs in shape: its spectral or value test fired, or, for
    matrices only the scale test flagged (the spectral test is skipped on big ones already
    found trained), the spectral test on up to :data:`RECHECK` of them fires."""
    from ..measurement.weights_init import check_against_init

    fired = [c for c in check.matrices if c.trained]
    if any(set(c.why.split("+")) - {"std"} for c in fired):
        return True
    unseen = [c.name for c in fired if c.edge_ratio is None][:RECHECK]
    if not unseen:
        return False
    again = check_against_init(model, fresh, names=lambda n: n in unseen, vectors=False,
                               spectrum=True)
    return any("spectrum" in c.why.split("+") for c in again.matrices if c.trained)
