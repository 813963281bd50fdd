"""Iterating the block map of :mod:`.blocks` through the depth: overflow-free, and without
repeating layers once the state has reached an exact fixed point.

Scale.  In two cases the cosine does not depend on the overall size of the signal, and the
state is carried as ``(q, p) = S (q~, p~)`` with ``q~ = 1`` after every layer and ``log S``
tracked separately, so nothing can overflow and the cosine ``p~/q~`` is exact:

* ``homogeneous``: no normalisation, uniform attention, relu or linear activation and no
  biases. Every part of the block is then positively homogeneous of degree 1 in (q, p), so
  ``block(S q~, S p~) = S block(q~, p~)``.
* ``pre``: pre-LN. Both branches read the normalised stream, so only the residual term scales
  with S; the branch outputs enter divided by S (``block_step(branch_scale=1/S)``).

Everywhere else (no normalisation with a saturating or smooth activation, softmax or centred
attention whose scores grow with the signal, biases) the block map depends on the scale. If the
signal norm then leaves float64 (q > 1e300 or not finite), :func:`propagate` raises a
:class:`~sigprop.spec.SpecError` naming the options that make it grow, and :func:`final_cos`
returns NaN for that entry (the alpha_crit search then reports NaN, "unknown").

Fixed points.  The map is deterministic, so once a layer returns its input bit for bit (and,
for pre-LN, the scale stopped changing) every later layer repeats it: the loops stop there and
fill the remaining layers, which gives results identical to iterating.

Threshold certificates.  :func:`final_cos` with ``threshold=t`` only has to tell on which side
of t the final cosine lies (the alpha_crit search). Where the block map is a map of the cosine
alone, ``rho_{l+1} = f(rho_l)`` (post-LN: every block starts from q = 1; ``homogeneous``: the
scale factors out), and f is nondecreasing, the side is known early: if ``rho_l < t`` and
``f(t) < t`` then ``rho_{l+1} = f(rho_l) <= f(t) < t``, so every later layer stays below t; if
``rho_l >= t`` and ``f(t) >= t`` every later layer stays at or above t. f is checked to be
nondecreasing on a grid of cosines per entry (:data:`MONO_GRID` points on [0, 1], slack
:data:`MONO_SLACK` for roundoff) and to map [0, 1] into itself (f(0) >= 0, f(1) <= 1), so the
orbit stays where f was checked; entries that fail the check, pre-LN (the branch weight 1/S
changes from layer to layer) and the scale-dependent maps are iterated through the depth. The
certificates are looked at every :data:`CERT_EVERY` layers, and only from :data:`CERT_MIN_DEPTH`
layers on (below it the check would cost more than it saves).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..spec import ArchSpec, SpecError
from . import rem
from .attention import AttentionStats
from .blocks import BlockParams, block_out, cos_of, value_kernel

#: largest signal norm q carried unscaled (beyond it the next layer may overflow float64)
Q_MAX = 1e300
#: cosines at which the one-layer map is checked to be nondecreasing (threshold certificates)
MONO_GRID = 33
#: roundoff allowed in that check (a decrease of f by less than this counts as flat)
MONO_SLACK = 1e-12
#: below this depth final_cos(threshold=...) iterates every entry: the check evaluates the map
#: at MONO_GRID + 1 cosines per entry, about as costly as that many layers of a large grid, which
#: is then at most ~7% of the iteration where the certificates stop nothing early
CERT_MIN_DEPTH = 16 * (MONO_GRID - 1)
#: the certificates are looked at every this many layers (a later stop costs a few layers)
CERT_EVERY = 8


def scale_mode(bp: BlockParams) -> str | None:
    """``"homogeneous"``, ``"pre"`` or None (see the module docstring). Dynamic Tanh reads
    the stream's scale (no mode); a value residual adds the first block's values, which do
    not scale with a no-norm stream (no ``homogeneous``)."""
    if bp.dyt is not None:
        return None
    if bp.norm == "pre":
        return "pre"
    if (bp.norm == "none" and bp.attention in ("uniform", "identity")
            and bp.activation in ("relu", "linear") and bp.value_mix is None
            and np.all(np.asarray(bp.var_b) == 0) and bp.gate is None):
        return "homogeneous"  # (a sigmoid output gate is not homogeneous)
    return None


def stack_mode(spec: ArchSpec, bp: BlockParams) -> str | None:
    """:func:`scale_mode` of the whole stack from its first block's ``bp``: None where a
    later block breaks it (a per-block norm placement such as Mix-LN's post-LN blocks below
    pre-LN ones, Dynamic Tanh, a value residual on a no-norm stack), so the state is then
    carried as it is (a pre-LN stream grows about linearly with depth: no overflow)."""
    mode = scale_mode(bp)
    if mode is None or spec.layers is None:
        return mode
    for x in spec.layers:
        if (x.norm or spec.norm) != bp.norm or x.dyt is not None or (
                x.value_mix is not None and mode == "homogeneous"):
            return None
    return mode


def first_values(spec: ArchSpec, q, p, over: dict | None = None):
    """The first block's value kernel (:func:`~.blocks.value_kernel`) for the stack's input
    state ``(q, p)`` (as :func:`_initial` carries it), or None when no block mixes it in
    (value residual learning, docs/theory.md §2.4.6)."""
    if spec.layers is None or all(x.value_mix is None for x in spec.layers):
        return None
    bp = BlockParams.from_spec(spec, 1, **(over or {}))
    return value_kernel(q, p, bp, raw_input=spec.q0 is not None)


def first_share(spec: ArchSpec, p):
    """The stream's share ``u`` of the first block's values V_1 at the embeddings (0, shaped
    like ``p``) where some block mixes them in (value residual learning, §2.4.6), else None:
    without output projections every block adds its rows of V_1 to the stream, and a later
    block's output correlates with them (:func:`.attn_maps.stream_cross`)."""
    if spec.layers is None or all(x.value_mix is None for x in spec.layers):
        return None
    return np.zeros_like(np.asarray(p, dtype=np.float64))


def overflow_error(spec: ArchSpec, layer: int) -> SpecError:
    """The one-line error for a signal norm that leaves float64 at ``layer``."""
    field = ("alpha_attn" if spec.alpha_attn > 1 else "alpha_mlp" if spec.alpha_mlp > 1
             else "sigma_w2")
    return SpecError(field, f"the signal norm q overflows float64 at layer {layer} (norm none "
                     f"with {spec.attention} attention and {spec.activation}: the map depends on "
                     "the scale, which cannot be factored out); lower --alpha-attn, --alpha-mlp, "
                     "--sigma-w2 or --depth, or use --norm pre/post")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaledStep:
    """One block's output on the scaled state (:func:`step`): ``q`` and ``p`` divided by
    the scale S where the map is scale-free, ``logs`` = log S, the block's attention
    ``stats``, and ``u``, the stream's share of the first block's values in true units (a
    value residual without output projections, §2.4.6; None when not carried)."""

    q: np.ndarray
    p: np.ndarray
    logs: np.ndarray
    stats: AttentionStats
    u: np.ndarray | None = None


def step(q, p, logs, bp: BlockParams, mode: str | None, *, asymptotic: bool, full: bool,
         raw_input: bool = False, u=None) -> ScaledStep:
    """One block on the scaled state ``(q~, p~, log S)``; ``u``: the stream's share of the
    first block's values (:func:`first_share`), or None."""
    scale = 1.0
    if mode == "pre":
        scale = np.exp(-logs)  # underflows to 0 for huge S: the branches are then negligible
    out = block_out(q, p, bp, asymptotic=asymptotic, full=full, branch_scale=scale,
                    raw_input=raw_input, value_u=u)
    q2, p2 = out.q, out.p
    if mode is not None:
        f = np.where((q2 > 0) & np.isfinite(q2), q2, 1.0)
        q2, p2, logs = q2 / f, p2 / f, logs + np.log(f)
    return ScaledStep(q=q2, p=p2, logs=logs, stats=out.stats, u=out.u)


def _bad(q, mode):
    return ~np.isfinite(q) if mode is not None else ~(np.isfinite(q) & (q <= Q_MAX))


def _certificates(bp: BlockParams, mode, sig, alp, threshold: float, asymptotic: bool):
    """Per entry: ``(monotone, f(t) < t)`` for the one-layer cosine map f at ``t = threshold``
    (module docstring, threshold certificates); all False where the map is not 1-D."""
    n = sig.size
    if not (bp.norm == "post" or mode == "homogeneous"):
        return np.zeros(n, bool), np.zeros(n, bool)
    x = np.append(np.linspace(0.0, 1.0, MONO_GRID), threshold)
    grid = dataclasses.replace(bp, sigma_s0=sig[:, None], alpha_attn=alp[:, None])
    p = np.broadcast_to(x, (n, x.size))
    out = step(np.ones_like(p), p, np.zeros_like(p), grid, mode, asymptotic=asymptotic,
               full=False)
    f = cos_of(out.p, out.q)
    fg = f[:, :-1]
    ok = np.isfinite(f).all(axis=1) & (fg[:, 0] >= -MONO_SLACK) & (fg[:, -1] <= 1 + MONO_SLACK)
    mono = ok & (np.diff(fg, axis=1) >= -MONO_SLACK).all(axis=1)
    return mono, mono & (f[:, -1] < threshold)


def _initial(spec: ArchSpec, mode: str | None, p) -> tuple:
    """``(q, log S)`` of the embeddings (``spec.q_init``): carried as a log-scale where the
    map is scale-free (``mode``), else as q itself."""
    q0 = spec.q_init
    if mode is not None:
        return np.ones_like(p), np.full_like(p, math.log(q0))
    return np.full_like(p, q0), np.zeros_like(p)


def _layer_params(spec: ArchSpec, layer: int, over: dict) -> BlockParams:
    """Block ``layer``'s parameters (weights-derived ``spec.layers``) with the grid options
    of ``over`` other than the score std and the residual strength."""
    keep = {k: v for k, v in over.items() if k not in ("sigma_s0", "alpha_attn")}
    return BlockParams.from_spec(spec, layer, **keep)


def _ratio(spec: ArchSpec, layer: int) -> float:
    """Block ``layer``'s RMS score std relative to the spec's (its RMS over all layers), so a
    grid value of the spec's beta scales every block alike."""
    ref = spec.sigma_s
    return float(np.sqrt(np.mean(spec.layer_sigma(layer) ** 2)) / ref) if ref > 0 else 1.0


def final_cos(spec: ArchSpec, *, beta=None, alpha_attn=None, rho0=None, depth: int | None = None,
              asymptotic: bool = False, fluctuations: bool = True,
              threshold: float | None = None) -> np.ndarray:
    """rho_L after ``depth`` blocks, vectorised over arrays of ``beta`` (effective, including the
    length scaling), ``alpha_attn`` and ``rho0``. Entries that reach a fixed point leave the
    iteration; entries whose signal norm overflows are NaN.

    ``threshold``: only the side of it matters (``rho_L < threshold``, the alpha_crit search).
    Entries whose side is certain before the last layer (module docstring) leave the iteration
    then and hold the cosine of that layer, which is on the same side as rho_L."""
    over = {"ln_fluct": bool(fluctuations)}
    if beta is not None:
        over["sigma_s0"] = np.asarray(beta, dtype=np.float64) * math.sqrt(math.log(spec.seq_len))
    elif spec.layers is not None:  # the spec's own RMS, which each layer's ratio scales
        over["sigma_s0"] = np.float64(spec.sigma_s)  # (not layer 1's: a measured mixer's 0)
    if alpha_attn is not None:
        over["alpha_attn"] = np.asarray(alpha_attn, dtype=np.float64)
    bp = BlockParams.from_spec(spec, **over)
    r0 = spec.rho_init if rho0 is None else np.asarray(rho0, dtype=np.float64)
    shape = np.broadcast(np.asarray(bp.sigma_s0), np.asarray(bp.alpha_attn), np.asarray(r0)).shape
    sig = np.broadcast_to(np.asarray(bp.sigma_s0, dtype=np.float64), shape).ravel()
    alp = np.broadcast_to(np.asarray(bp.alpha_attn, dtype=np.float64), shape).ravel()
    p = np.broadcast_to(np.asarray(r0, dtype=np.float64), shape).ravel().copy()
    mode, bpa, bpa_n = stack_mode(spec, bp), None, -1
    q, logs = _initial(spec, mode, p)
    p = p * q
    vk = first_values(spec, q, p, {"ln_fluct": over["ln_fluct"]})
    u = first_share(spec, p)
    out, act = np.full(p.shape, np.nan), np.arange(p.size)
    n_layers = spec.depth if depth is None else depth
    per_layer = spec.layers is not None  # weights-derived blocks differ: no 1-D map to certify
    cert = threshold is not None and n_layers >= CERT_MIN_DEPTH and not per_layer
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        if cert:
            mono, f_below = _certificates(bp, mode, sig, alp, float(threshold), asymptotic)
            cert = bool(mono.any())
        for layer in range(n_layers):
            if cert and act.size and layer % CERT_EVERY == 0:
                if not mono[act].any():
                    cert = False
                c = cos_of(p[act], q[act])
                below = c < threshold
                inside = (c >= 0) & (c <= 1)
                done = mono[act] & inside & np.where(below, f_below[act], ~f_below[act])
                out[act[done]] = c[done]
                act = act[~done]
            if not act.size:
                break
            if per_layer:  # this block's own parameters, the grid's sigma scaled by its ratio
                bl = _layer_params(spec, layer + 1, over)
                bpa = dataclasses.replace(bl, sigma_s0=sig[act] * _ratio(spec, layer + 1),
                                          alpha_attn=alp[act])
                if bl.value_mix is not None:  # the first block's values, per entry
                    bpa = dataclasses.replace(bpa, value_first=(
                        np.broadcast_to(vk[0], p.shape)[act],
                        np.broadcast_to(vk[1], p.shape)[act]))
            elif bpa is None or bpa_n != act.size:  # the active set only ever shrinks
                bpa = dataclasses.replace(bp, sigma_s0=sig[act], alpha_attn=alp[act])
                bpa_n = act.size
            out_a = step(q[act], p[act], logs[act], bpa, mode, asymptotic=asymptotic,
                         full=False, raw_input=layer == 0 and spec.q0 is not None,
                         u=None if u is None else u[act])
            if u is not None:
                u[act] = out_a.u
            q2, p2, lg2 = out_a.q, out_a.p, out_a.logs
            bad = _bad(q2, mode) | ~np.isfinite(p2)
            fixed = (q2 == q[act]) & (p2 == p[act]) & ((lg2 == logs[act]) | (mode != "pre"))
            fixed &= not per_layer or layer + 1 >= len(spec.layers)  # later blocks may differ
            q[act], p[act], logs[act] = q2, p2, lg2
            out[act[fixed & ~bad]] = cos_of(p2[fixed & ~bad], q2[fixed & ~bad])
            act = act[~(bad | fixed)]
        out[act] = cos_of(p[act], q[act])
    return out.reshape(shape)


def _rows(layer, q, p, logs, st, source, inv_t):
    """Trajectory rows of one layer, each observable within its range (see :func:`propagate`);
    a measured mixer (``st`` None, docs/theory.md §2.8.1) has no attention rows."""
    cos = float(np.clip(cos_of(p, q), -1.0, 1.0))
    vals = (("cos", cos), ("q", float(q * np.exp(logs))))
    if st is not None:
        vals += (("ipr", max(float(st.y2), inv_t)), ("ipr_cross", float(st.yx)),
                 ("entropy", float(np.clip(st.entropy, 0.0, 1.0))),
                 ("wmax", max(float(st.wmax), inv_t)))
    return [dict(layer=layer, observable=k, source=source, value=v) for k, v in vals]


def propagate(spec: ArchSpec, rho0: float | None = None, *,
              asymptotic: bool = False, fluctuations: bool = True):
    """Theory Trajectory through the whole stack: rows ``cos`` and ``q`` for layers 0..L
    (0 = the embeddings, q = 1, cos = rho0), and ``ipr``, ``ipr_cross``, ``entropy``, ``wmax``
    of each block's attention for layers 1..L (not for a measured mixer's layer,
    docs/theory.md §2.8.1: its cos and q come from the measured residual map). Source
    ``theory`` (finite T) or ``theory_asymptotic`` (T -> inf). ``fluctuations=False``:
    post-LN cosines as the plain ratio of averages (gg25's map) instead of the LayerNorm
    average of :mod:`.fluct`.

    Ranges: cos is clipped to [-1, 1] (roundoff only). The T -> inf theory gives ipr = wmax = 0
    below beta_c, the limit of quantities that are at least 1/T for any row of T keys; at the
    spec's finite T the rows report ``max(limit, 1/T)`` (the map itself uses the limit).
    ``q`` is the true signal norm, carried as a log-scale where the map allows it (module
    docstring): it is +inf (null in JSON) only where the true q exceeds float64, the cosine
    staying exact. Elsewhere an overflowing q raises :class:`~sigprop.spec.SpecError`.
    Returns a Trajectory (pandas DataFrame)."""
    from .. import trajectory  # pandas: imported only where a table is built
    r0 = spec.rho_init if rho0 is None else float(rho0)
    if not 0.0 <= r0 <= 1.0:
        raise SpecError("rho0", f"must be a finite number in [0, 1] (got {rho0!r})")
    source = "theory_asymptotic" if asymptotic else "theory"
    bp = BlockParams.from_spec(spec, ln_fluct=bool(fluctuations))
    mode, inv_t = stack_mode(spec, bp), 1.0 / spec.seq_len
    q, logs = _initial(spec, mode, np.float64(r0))
    p = np.float64(r0) * q
    vk = first_values(spec, q, p)
    u = first_share(spec, p)
    rows = [dict(layer=0, observable="cos", source=source, value=r0),
            dict(layer=0, observable="q", source=source, value=spec.q_init)]
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        for layer in range(1, spec.depth + 1):
            if spec.layers is not None:
                bp = BlockParams.from_spec(spec, layer, ln_fluct=bool(fluctuations))
                if bp.value_mix is not None:
                    bp = dataclasses.replace(bp, value_first=vk)
            blk = step(q, p, logs, bp, mode, asymptotic=asymptotic, full=True,
                       raw_input=layer == 1 and spec.q0 is not None, u=u)
            q2, p2, lg2, st, u = blk.q, blk.p, blk.logs, blk.stats, blk.u
            if _bad(q2, mode) or not np.isfinite(p2):
                raise overflow_error(spec, layer)
            dl = lg2 - logs
            fixed = q2 == q and p2 == p and (mode != "pre" or dl == 0)
            fixed = fixed and (spec.layers is None or layer >= len(spec.layers))
            q, p, logs = q2, p2, lg2
            rows += _rows(layer, q, p, logs, st, source, inv_t)
            if fixed:  # every later layer repeats this one; only log S keeps growing by dl
                later = np.arange(layer + 1, spec.depth + 1)
                qs = (q * np.exp(logs + (later - layer) * dl)).tolist()
                same = [(r["observable"], r["value"]) for r in rows
                        if r["layer"] == layer]
                for lay, qv in zip(later.tolist(), qs, strict=True):
                    rows += [dict(layer=lay, observable=k, source=source,
                                  value=qv if k == "q" else v) for k, v in same]
                break
    return trajectory.make(rows, spec)


def verdict(spec: ArchSpec, traj=None, *, rho0: float | None = None,
            asymptotic: bool = False, rho_l: float | None = None) -> str:
    """docs/theory.md §2.7 regime of the spec's own point: ``entropy_collapse`` if
    beta > beta_c(rho0); else ``rank_collapse`` if rho_L >= rho_max; else ``trainable``.
    rho_L is ``rho_l`` when given, else read from ``traj``, else propagated."""
    r0 = spec.rho_init if rho0 is None else float(rho0)
    if spec.layers is not None and spec.attention not in ("uniform", "identity"):
        if traj is None:
            traj = propagate(spec, rho0=r0, asymptotic=asymptotic)
        if condensed_layers(spec, traj):
            return "entropy_collapse"
    elif spec.attention not in ("uniform", "identity") and spec.beta_eff > float(rem.beta_c(r0)):
        return "entropy_collapse"
    if rho_l is None and traj is None:
        rho_l = float(final_cos(spec, rho0=r0, asymptotic=asymptotic))
    elif rho_l is None:
        cos = traj[traj["observable"] == "cos"]
        rho_l = float(cos.loc[cos["layer"].idxmax(), "value"])
    if not math.isfinite(rho_l):
        raise overflow_error(spec, spec.depth)
    return "rank_collapse" if rho_l >= spec.rho_max else "trainable"


def layer_table(spec: ArchSpec, traj) -> list[dict]:
    """Per block of a spec with weights-derived ``layers`` (docs/theory.md §2.8): its RMS
    ``beta`` over heads, the input cosine ``rho_in`` the theory gives it (``traj``'s cos at
    the layer below), ``beta_c(rho_in)`` and their ratio, and the per-head ``beta`` list.
    A spec without layers gives one entry per block with the spec's beta. A measured mixer
    (docs/theory.md §2.8.1) has no heads: beta 0 and ``mixer`` ``"measured"``."""
    cos = traj[traj["observable"] == "cos"].set_index("layer")["value"]
    logt = math.sqrt(math.log(spec.seq_len))
    out = []
    for layer in range(1, spec.depth + 1):
        heads = spec.layer_sigma(layer) / logt
        beta = float(np.sqrt(np.mean(heads**2)))
        r = float(np.clip(cos.get(layer - 1, spec.rho_init), 0.0, 1.0))
        bc = float(rem.beta_c(r))
        row = {"layer": layer, "beta": beta, "rho_in": r, "beta_c": bc,
               "beta_over_beta_c": beta / bc, "heads": [float(b) for b in heads],
               "heads_over": [int(h) for h in np.flatnonzero(heads > bc)]}
        if spec.layers is not None and spec.layer_at(layer).measured:
            row.update(beta=0.0, beta_over_beta_c=0.0, heads=[], heads_over=[],
                       mixer="measured")
        out.append(row)
    return out


def condensed_layers(spec: ArchSpec, traj) -> list[int]:
    """Blocks whose RMS beta exceeds beta_c of their input cosine (:func:`layer_table`): the
    per-layer form of docs/theory.md §2.7's entropy-collapse condition."""
    return [r["layer"] for r in layer_table(spec, traj) if r["beta"] > r["beta_c"]]
