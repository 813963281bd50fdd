"""Where each head's attention goes (``Probe(anatomy=True)``): the per-head statistics that tell
a trained head's role (:func:`sigprop.analysis.anatomy.head_roles`) from its maps, without
keeping them.

Per map (one head of one sequence), for self-attention maps (``T == Tk``) unless noted:

* ``sink``: mean over query rows of the probability on key 0 (the first token);
* ``special``: mean over query rows of the probability on the keys flagged by the caller's
  ``special_keys`` (``(B, Tk)`` bool: [CLS] / [SEP] / BOS positions). Key 0 counts here too
  when it is flagged, so then ``sink <= special``; absent when no ``special_keys`` are given;
* ``prev`` (rows ``i >= 1``), ``self``, ``next`` (rows ``i <= T - 2``; bidirectional maps
  only): mean probability on key ``i - 1``, ``i``, ``i + 1``. In a causal map row 0 sees
  only key 0, so its whole mass counts for ``sink`` and ``self``;
* ``content_mass``: mean over rows of the probability on *content keys*, the visible keys
  other than key 0 and the flagged ones; so ``content_mass = 1 - special`` when key 0 is
  flagged and ``1 - sink - special`` when it is not (``1 - sink`` without ``special_keys``);
* ``content_entropy``: each row restricted to its content keys and renormalised, its entropy
  over ``log(#content keys)``, averaged over the rows with at least two content keys (1:
  uniform over the content, 0: all of it on one key);
* ``top_key``: the key concentration, the largest share of the map's content mass that lands
  on one content key: with ``C_b = sum_a A[a, b]`` the column sums over all rows,
  ``max_b C_b / sum_b C_b`` over the content keys ``b`` (the mean over rows of ``A[a, b]``,
  maximised over ``b``, over the mean content mass). 1: every query puts its content mass on
  the same key (the head's output is one vector for all tokens, rank collapse); ``1/m`` when
  the content mass is spread evenly over ``m`` keys as a whole -- a head whose queries each
  pick their own key (copy, induction, previous occurrence) reads ``~1/T``, however sharp
  each row is. Uniform rows: ``1/n_c`` over ``n_c`` content keys (bidirectional); causal,
  key 0 the only excluded one, ``(H_T - 1) / (T - H_T)`` (``H_T`` the harmonic number: key 1,
  seen by every row but row 0, gets the largest column). The causal triangle: a key ``b`` is
  seen by the ``T - b`` rows ``a >= b`` only, and ``C_b`` is *not* divided by that count:
  per-key means would read a previous-token head as concentrated (the last key, seen by one
  or two rows, holds all of their mass), whereas the share of the total counts each key's
  mass once, so a causal head on "its own previous token" reads ``1/(T - 2)`` (rows 0 and 1
  on key 0, the others on a key each). The rows'
  weight is their content mass (rows mostly on a sink count little). NaN where the content
  holds no mass at all (no content key, or its weights underflow);
* ``copy`` and ``induction``, only when the caller gives ``token_ids`` (``(B, T)`` ids of the
  maps' sequences, ``T == Tk``): mean over rows of the probability on the keys ``b != a``
  holding the query's token (``ids[b] == ids[a]``), and on the keys ``b`` whose previous
  token holds it (``ids[b - 1] == ids[a]``; ``b`` neither ``a`` nor ``a + 1``, which are
  positions, not repeats). Any key counts, excluded ones included; a causal map's later keys
  hold no mass;
* ``max_logit``: the largest logit (``q.k * scale`` plus an additive attention mask's bias,
  as it enters the softmax) over the visible entries; in every map, ``T != Tk`` included.

``sink``, ``special``, ``content_*``, ``top_key`` and ``max_logit`` apply to ``T != Tk`` maps
too (cross attention, a KV prefix); ``prev``, ``self``, ``next``, ``copy``, ``induction`` are
then not recorded, and the probe says so in ``info[i]["anatomy"]``. Masked entries are
probability 0 exactly as for the other statistics (a fully masked row: the uniform row HF
eager gives it, with no content keys; its mass counts in ``top_key``'s columns and in
``copy`` / ``induction`` as in ``content_mass``).

Exactness: from logits (the recomputed maps) each statistic is exact to rounding. The content
entropy's numerator is the row's ``sum e d`` (which ``softmax_stats`` forms anyway) less the
excluded keys' terms, summed directly instead in the rows where that subtraction could cancel
(:data:`CANCEL_GUARD`); a row whose content keys carry less than :data:`CONTENT_FLOOR` of the
row maximum's weight (float32 exponentials of content logits ~87 below the top one
underflow) has its content entropy recomputed from its logits relative to the content
maximum. From returned probabilities nothing can be recomputed: rows whose content mass is
below :data:`CONTENT_FLOOR` are left out of ``content_entropy`` there.

Cost: on top of the seven passes of ``softmax_stats`` over a chunk of exponentials, two
(the content's sum, a matrix-vector product, and the column sums of ``top_key``) and O(T)
work for the columns and diagonals, one more each for ``copy`` and ``induction``; the
returned maps' path shares the entropy's ``A log A`` and adds four matrix-vector passes. No
``T x Tk`` tensor outlives its chunk. At short sequences (T ~ 64) the anatomy's few dozen
small operations per chunk, not the passes, are what it costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import observables as obs

__all__ = ["ANATOMY_STATS", "CONTENT_FLOOR", "AnatomyPlan", "from_logits", "from_probs",
           "max_logit", "plan", "repeat_keys"]

#: the per-head statistics, in the order :func:`sigprop.measurement.probe.to_trajectory` lists them
ANATOMY_STATS = ("sink", "special", "prev", "self", "next", "content_mass", "content_entropy",
                 "top_key", "copy", "induction", "max_logit")

#: a row whose content keys hold less than this fraction of the top key's weight has its
#: content entropy taken from its logits again (float32 exponentials below exp(-87) lose
#: precision; at exp(-60) of the top, any content key lost to underflow weighs < e^-27 of
#: the content maximum, under 1e-9 of the entropy)
CONTENT_FLOOR = math.exp(-60.0)


@dataclass(frozen=True)
class AnatomyPlan:
    """What one layer's anatomy statistics need beside the maps, per sequence ``n``:
    ``excluded[n]`` the non-content key columns (key 0 and the flagged ones, sorted) and
    ``content[n]`` the 0/1 indicator of the others (``(N, Tk)``, the statistics' dtype; None
    when the content is not recorded), ``special[n]`` the flagged columns and
    ``special_mask[n]`` their 0/1 indicator (None: ``special`` not recorded); ``positions``:
    ``T == Tk``; ``next``: and not causal; ``note``: what was left out and why (None:
    nothing); ``tokens``: the sequences' token ids ``(N, T)`` (None: ``copy`` and
    ``induction`` not recorded)."""

    excluded: tuple
    content: torch.Tensor | None
    special: tuple | None
    special_mask: torch.Tensor | None
    positions: bool
    next: bool
    note: str | None
    tokens: torch.Tensor | None = None


def plan(special_keys, lead, T: int, Tk: int, causal: bool, device,
         dtype=torch.float32, token_ids=None) -> AnatomyPlan:
    """The :class:`AnatomyPlan` of maps ``(*lead, H, T, Tk)`` in ``dtype``; ``special_keys``:
    None, or bool ``(N, Tk)`` (one row per sequence, ``N = prod(lead)``) or ``(Tk,)`` (every
    sequence). Keys of another shape leave ``special``, ``content_*`` and ``top_key``
    unrecorded (a content that silently ignored the flags would be another statistic) with a
    note. ``token_ids``: None, or integer ``(N, T)`` / ``(T,)`` ids for ``copy`` and
    ``induction`` (self-attention maps only; another shape: not recorded, with a note)."""
    N = math.prod(lead)
    notes = [] if T == Tk else ["T != Tk: prev, self, next not recorded"]
    zero = torch.zeros(1, dtype=torch.long, device=device)
    special, special_mask, excluded, ok = None, None, (zero,) * N, True
    if special_keys is not None:
        sk = torch.as_tensor(special_keys, device=device).bool()
        if sk.ndim == 1:
            sk = sk.expand(N, -1)
        if sk.ndim != 2 or tuple(sk.shape) != (N, Tk):
            notes.append(f"special_keys {tuple(sk.shape)} do not match the maps' {N} "
                         f"sequences x {Tk} keys: special, content_* not recorded")
            ok = False
        else:
            special = tuple(row.nonzero().flatten() for row in sk)
            special_mask = sk.to(dtype)
            excluded = tuple(torch.unique(torch.cat((zero, s))) for s in special)
    content = None
    if ok:
        content = torch.ones(N, Tk, dtype=dtype, device=device)
        for n, cols in enumerate(excluded):
            content[n, cols] = 0.0
    tokens = None
    if token_ids is not None:
        ids = torch.as_tensor(token_ids, device=device)
        if ids.ndim == 1:
            ids = ids.expand(N, -1)
        if T != Tk or ids.ndim != 2 or tuple(ids.shape) != (N, T) or ids.is_floating_point():
            notes.append(f"token_ids {tuple(ids.shape)} {ids.dtype} do not match the maps' "
                         f"{N} sequences x {T} queries x {Tk} keys: copy, induction not "
                         "recorded")
        else:
            tokens = ids
    return AnatomyPlan(excluded, content, special, special_mask, T == Tk,
                       T == Tk and not causal, "; ".join(notes) or None, tokens)


def repeat_keys(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``copy`` and ``induction`` key indicators of token ids ``ids`` (..., T), bool
    (..., T, T): ``[a, b]`` is ``ids[b] == ids[a]`` with ``b != a``, and ``ids[b - 1] ==
    ids[a]`` with ``b >= 1`` and ``b`` neither ``a`` nor ``a + 1``."""
    T = ids.shape[-1]
    same = ids.unsqueeze(-1) == ids.unsqueeze(-2)
    band = torch.ones(T, T, dtype=torch.bool, device=ids.device)
    near = band.triu(0) & band.tril(1)  # b = a, a + 1
    copy = same & ~near.tril(0)
    induction = F.pad(same[..., :-1], (1, 0)) & ~near
    return copy, induction


def is_causal(allowed: torch.Tensor | None, T: int, Tk: int) -> bool:
    """Whether a visibility mask hides every key after its query (``T == Tk``)."""
    return allowed is not None and T == Tk and not bool(allowed.triu(1).any())


def max_logit(sc: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Largest logit of each map ``sc`` (..., T, Tk) over its visible entries (NaN if none)."""
    if allowed is not None:
        sc = sc.masked_fill(~allowed, -math.inf)
    top = sc.amax((-1, -2))
    return top.masked_fill(top == -math.inf, math.nan)


def _positions(diag, plan_: AnatomyPlan) -> dict:
    """``self``, ``prev`` (and ``next``) from ``diag(offset)``: the mean over rows of the
    probability at that offset from the diagonal."""
    if not plan_.positions:
        return {}
    out = {"self": diag(0), "prev": diag(-1)}
    if plan_.next:
        out["next"] = diag(1)
    return out


def from_logits(mx, d, e, rz, ed, *, keys, allowed, plan_: AnatomyPlan, n: int) -> dict:
    """The anatomy of one chunk of sequence ``n``'s maps from ``softmax_stats``' intermediates:
    the row maxima ``mx`` (..., T, 1), ``d = z - mx`` and ``e = exp(d)`` (..., T, Tk),
    ``rz = 1 / sum(e)`` and ``ed = sum(e d)`` per row (..., T); ``keys``: visible keys per row
    (None: all); ``allowed``: visibility (..., T, Tk) or None. The row means of probabilities
    come out of one small product ``(rows x columns) @ rz``: at short sequences the number of
    operations, not the passes over the map, is what the anatomy costs."""
    T = e.shape[-2]
    names, cols, counts = ["sink"], [e[..., 0]], [T]
    if plan_.special is not None:
        names.append("special")
        cols.append(e.index_select(-1, plan_.special[n]).sum(-1))
        counts.append(T)
    if plan_.positions:  # prev: rows 1.., next: rows ..T-2, padded to T rows with zeros
        names += ["self", "prev"] + (["next"] if plan_.next else [])
        cols += [e.diagonal(0, -2, -1), F.pad(e.diagonal(-1, -2, -1), (1, 0))]
        counts += [T, T - 1]
        if plan_.next:
            cols.append(F.pad(e.diagonal(1, -2, -1), (0, 1)))
            counts.append(T - 1)
    if plan_.tokens is not None:  # per row, sum(e) over the copies / induction targets
        for name, m in zip(("copy", "induction"), repeat_keys(plan_.tokens[n]), strict=True):
            names.append(name)
            cols.append(torch.linalg.vecdot(e, m.to(e.dtype)))
            counts.append(T)
    out = {}
    if plan_.content is not None:
        zc = e @ plan_.content[n]  # the content's share of sum(e), summed directly
        out["content_entropy"] = _content_entropy(d, e, zc, ed, keys, allowed, plan_, n)
        out["top_key"] = _top_key((rz.unsqueeze(-2) @ e).squeeze(-2), plan_.content[n])
        names.append("content_mass")
        cols.append(zc)
        counts.append(T)
    means = (torch.stack(cols, -2) @ rz.unsqueeze(-1)).squeeze(-1)
    means = means / means.new_tensor(counts)  # a 1-row map has no prev: 0 / 0, NaN
    out.update(zip(names, means.unbind(-1), strict=True))
    top = mx.amax((-1, -2))  # a fully masked row's maximum is the fill value
    out["max_logit"] = top if keys is None else top.masked_fill(
        top <= torch.finfo(top.dtype).min / 2, math.nan)
    return out


def _top_key(col: torch.Tensor, content: torch.Tensor) -> torch.Tensor:
    """``top_key`` from the column sums ``col`` (..., Tk) of the maps and the content's 0/1
    indicator (Tk or broadcastable): NaN where the content holds no mass."""
    cc = col * content
    total = cc.sum(-1)
    top = cc.amax(-1)
    return torch.where(total > 0, top / total.where(total > 0, 1.0), math.nan)


#: the content's entropy numerator ``sum_content e d`` is ``ed`` less the excluded keys'
#: terms; rows where those terms exceed this multiple of the content's ``sum(e)`` (float32
#: cancellation of more than ~1e-6 in the entropy) are summed directly instead
CANCEL_GUARD = 4.0


def _content_entropy(d, e, zc, ed, keys, allowed, plan_: AnatomyPlan, n: int):
    """``content_entropy`` of a chunk (see :func:`from_logits`): per row ``log zc - (sum over
    content of e d) / zc``, with ``zc`` the content's ``sum(e)``."""
    Tk = e.shape[-1]
    cols = plan_.excluded[n]
    ex = torch.linalg.vecdot(e.index_select(-1, cols), d.index_select(-1, cols))
    num = ed - ex
    risky = ex.abs() > CANCEL_GUARD * zc
    if bool(risky.any()):  # those rows' content terms directly (a gather of the rows)
        idx = risky.nonzero(as_tuple=True)
        num[idx] = torch.linalg.vecdot(e[idx] * plan_.content[n], d[idx])
    h = zc.log().sub_(num.div_(zc))
    if keys is None and allowed is None:  # every row sees every key: one count
        n_c = float(Tk - len(cols))
        if n_c < 1.5:
            return torch.full_like(zc[..., 0], math.nan)
        if float(zc.amin()) < CONTENT_FLOOR:
            _low_rows(h, d, zc < CONTENT_FLOOR, cols, None)
        return h.clamp_(0.0, math.log(n_c)).mean(-1) / math.log(n_c)
    n_c = (torch.full_like(zc, float(Tk)) if keys is None else keys.to(zc.dtype)) - (
        len(cols) if allowed is None else allowed.index_select(-1, cols).sum(-1).to(zc.dtype))
    if float(zc.amin()) < CONTENT_FLOOR:
        low = (zc < CONTENT_FLOOR) & (n_c > 1.5)
        if bool(low.any()):
            _low_rows(h, d, low, cols, allowed)
    h = torch.minimum(h.clamp_min_(0.0), n_c.clamp_min(1.0).log())
    return obs.normalised_row_mean(h, n_c)


def _low_rows(h, d, low, cols, allowed):
    """Content entropies (into ``h``) of the rows ``low`` from their logits ``d``, relative to
    their own content maximum: their content is too far below the top key for ``e``."""
    idx = low.nonzero(as_tuple=True)
    z = d[idx]
    z[:, cols] = -math.inf
    if allowed is not None:
        z = z.masked_fill(~allowed[idx], -math.inf)
    logp = torch.log_softmax(z, -1)
    h[idx] = obs.row_entropy_from_log_probs(logp, torch.isfinite(logp))


def _per_sequence(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x[n] @ w[n]`` for each sequence: ``x`` (N, ..., Tk), ``w`` (N, Tk) -> (N, ...); one
    matrix-vector product each (a batched ``bmm`` against a single column measured ~6x
    slower on CPU)."""
    return torch.stack([x[n] @ w[n] for n in range(x.shape[0])])


def from_probs(A: torch.Tensor, allowed: torch.Tensor | None, plan_: AnatomyPlan,
               alog: torch.Tensor) -> dict:
    """The anatomy (all but ``max_logit``) of probability maps ``A`` (*lead, H, T, Tk) a
    module returned, with ``alog = xlogy(A, A)`` (the entropy's terms, formed once for both);
    ``allowed``: visibility broadcastable to ``A``, or None. Column sums are matrix-vector
    products with each sequence's 0/1 indicator of the columns."""
    lead, (H, T, Tk) = A.shape[:-3], A.shape[-3:]
    N = math.prod(lead)

    def rows(x, w):  # per row, the sum of x over the columns w flags: (*lead, H, T)
        return _per_sequence(x.reshape(N, H, T, Tk), w).reshape(*lead, H, T)

    out = {"sink": A[..., 0].mean(-1)}
    if plan_.special is not None:
        out["special"] = rows(A, plan_.special_mask).mean(-1)
    out.update(_positions(lambda k: A.diagonal(k, -2, -1).mean(-1), plan_))
    if plan_.tokens is not None:  # (N, T, T) indicators, each sequence's heads at once
        A4 = A.reshape(N, H, T, Tk)
        for name, m in zip(("copy", "induction"), repeat_keys(plan_.tokens), strict=True):
            out[name] = torch.linalg.vecdot(A4, m.unsqueeze(1).to(A.dtype)).mean(-1) \
                .reshape(*lead, H)
    if plan_.content is None:
        return out
    c = plan_.content
    out["top_key"] = _top_key(A.sum(-2), c.reshape(*lead, 1, Tk))
    mass, alogp = rows(A, c), rows(alog, c)
    if allowed is None:
        n_c = c.sum(-1).reshape(*lead, 1, 1)
    else:  # visible content keys per row: (*lead, 1 or H, T)
        shape = torch.broadcast_shapes(allowed.shape, (*lead, 1, T, Tk))
        vis = torch.broadcast_to(allowed, shape).reshape(N, -1, T, Tk)
        n_c = _per_sequence(vis.to(A.dtype), c).reshape(*lead, -1, T)
    n_c = n_c.expand(mass.shape)
    ok = mass >= CONTENT_FLOOR
    safe = torch.where(ok, mass, torch.ones_like(mass))
    h = torch.minimum((safe.log() - alogp / safe).clamp_min(0.0), n_c.clamp_min(1.0).log())
    out["content_mass"] = mass.mean(-1)
    out["content_entropy"] = obs.normalised_row_mean(h, torch.where(ok, n_c, 0.0))
    return out
