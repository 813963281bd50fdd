"""What each attention head of a trained model does, from its per-head anatomy statistics
(``Probe(anatomy=True)``, :mod:`sigprop.measurement.anatomy_stats`):

    with Probe(model, anatomy=True, special_keys=ids == cls_id) as p:
        model(input_ids=ids)
    rows = to_trajectory(p, per_head=True)
    roles = head_roles(rows[rows["head"].notna()])
    summary(roles)   # {layer: {role: heads}}

Roles, first match wins (the order of :data:`ROLES`):

1. ``sink``: at least :data:`SINK_MASS` of the mass on the first token or the special ones
   (``1 - content_mass``; ``sink`` alone where the content mass was not recorded);
2. ``positional``: at least :data:`POSITIONAL_MASS` on the previous token, the diagonal and
   the next token together;
3. ``selective``: content entropy below :data:`COLLAPSED_ENTROPY` but a key concentration
   ``top_key`` below :data:`CONCENTRATED_KEY`: each query's content mass on about one key,
   a different key for different queries (copy, induction, previous-occurrence heads) --
   sharp by design;
4. ``collapsed``: content entropy below :data:`COLLAPSED_ENTROPY` (the entropy over all keys
   where the content one is missing) and the content mass concentrated on a few keys the
   queries share (``top_key`` at least :data:`CONCENTRATED_KEY`, or not recorded): queries
   pile their content mass on the same key with no sink or positional reason, so the head
   outputs one vector for every token -- the pathology;
5. ``diffuse``: entropy above :data:`DIFFUSE_ENTROPY` and (where ``wmax`` is recorded) a
   mean largest weight below :data:`DOMINANT_KEY`: mass spread with no key standing out;
6. ``content``: the rest, attending by content, neither diffuse nor collapsed.

A sink or a positional head is sharp for a reason (its target is fixed), and a selective one
because its target moves with the query, so those come before ``collapsed``, whose low
entropy is only a pathology when no such reason explains it. Where ``copy`` or
``induction`` were recorded (the probe given ``token_ids``) and hold at least
:data:`REPEAT_MASS`, a selective or content head's ``why`` names them ("61% of the mass on
the key after an earlier copy of the query's token: an induction head").
Thresholds read the per-head values averaged over sequences (one row per layer, head and
observable); a head missing a statistic is judged without the rule that needs it.
"""

from __future__ import annotations

import math

import pandas as pd

__all__ = ["COLLAPSED_ENTROPY", "COLUMNS", "CONCENTRATED_KEY", "DIFFUSE_ENTROPY",
           "DOMINANT_KEY", "POSITIONAL_MASS", "REPEAT_MASS", "ROLES", "SINK_MASS",
           "head_roles", "summary"]

ROLES = ("sink", "positional", "selective", "collapsed", "diffuse", "content")
#: the statistics of :func:`head_roles`' table, after ``layer, head, role``
COLUMNS = ("sink", "special", "prev", "self", "next", "entropy", "content_entropy",
           "content_mass", "top_key", "copy", "induction", "sigma_s", "max_logit")

#: most of the mass (over half) on the first / special tokens: what is left for content is
#: then a minority, whatever its shape
SINK_MASS = 0.5
#: most of the mass on the token before, itself or the one after: a fixed offset, not content
POSITIONAL_MASS = 0.5
#: normalised content entropy below this is about one key per query: at 64 content keys,
#: e^(0.15 ln 64) = 1.9 keys' worth of spread
COLLAPSED_ENTROPY = 0.15
#: a sharp head is collapsed when one key takes at least this share of all its queries'
#: content mass (k keys shared evenly: 1/k, so up to ~4 shared targets); queries that each pick
#: their own key give ~1/#queries (1/63 at T = 64), apart from 0.25 from T ~ 8 on
CONCENTRATED_KEY = 0.25
#: copy / induction mass named in a head's ``why`` from here: a query's token recurs at a few
#: of 64 keys in text, where a head indifferent to repeats puts a few percent of its mass
REPEAT_MASS = 0.3
#: normalised entropy above this is spread over most keys: at 64 keys, e^(0.8 ln 64) = 28
DIFFUSE_ENTROPY = 0.8
#: a diffuse head's mean largest weight stays below this: no key takes a third of a row
DOMINANT_KEY = 0.3


def _table(heads: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, head), a column per observable (values averaged already)."""
    need = {"layer", "head", "observable", "value"}
    if missing := need - set(heads.columns):
        raise ValueError(f"head_roles needs the columns {sorted(need)} (missing "
                         f"{sorted(missing)}): to_trajectory(probe, per_head=True)")
    rows = heads[heads["head"].notna()]
    dup = rows.duplicated(["layer", "head", "observable"])
    if dup.any():
        raise ValueError("more than one row per (layer, head, observable): pass one "
                         "model's rows (filter by source first)")
    wide = rows.pivot(index=["layer", "head"], columns="observable", values="value")
    for c in (*COLUMNS, "wmax"):
        if c not in wide:
            wide[c] = math.nan
    wide = wide.reset_index()
    wide.columns.name = None
    wide["layer"], wide["head"] = wide["layer"].astype(int), wide["head"].astype(int)
    return wide.sort_values(["layer", "head"], ignore_index=True)


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _sink(r) -> tuple[str, str] | None:
    anchor = 1.0 - r["content_mass"] if _ok(r["content_mass"]) else r["sink"]
    if not _ok(anchor) or anchor < SINK_MASS:
        return None
    first = r["sink"] if _ok(r["sink"]) else math.nan
    if not _ok(r["special"]) or first >= 0.9 * anchor:
        return "sink", f"{first:.0%} of the mass on the first token"
    return "sink", f"{anchor:.0%} of the mass on the first/special tokens ({first:.0%} on " \
                   "the first)"


def _positional(r) -> tuple[str, str] | None:
    parts = {k: r[k] for k in ("prev", "self", "next") if _ok(r[k])}
    total = sum(parts.values())
    if not parts or total < POSITIONAL_MASS:
        return None
    where = {"prev": "the previous token", "self": "itself (the diagonal)",
             "next": "the next token"}
    top = max(parts, key=parts.get)
    if parts[top] >= 0.8 * total:
        return "positional", f"{parts[top]:.0%} of the mass on {where[top]}"
    split = ", ".join(f"{k} {v:.0%}" for k, v in parts.items() if v >= 0.05)
    return "positional", f"{total:.0%} of the mass on the neighbouring tokens ({split})"


def _repeats(r) -> str:
    """``"; 61% of the mass on ...: an induction head"`` where copy / induction are large."""
    ind, cp = r.get("induction"), r.get("copy")
    where = "another" if _ok(r.get("next")) else "an earlier"  # next: bidirectional
    if _ok(ind) and ind >= REPEAT_MASS and not (_ok(cp) and cp > ind):
        return f"; {ind:.0%} of the mass on the key after {where} copy of the query's " \
               "token: an induction head"
    if _ok(cp) and cp >= REPEAT_MASS:
        return f"; {cp:.0%} of the mass on {where} copy of the query's token: a copy head"
    return ""


def _sharp_or_spread(r) -> tuple[str, str]:
    ce, ent, conc = r["content_entropy"], r["entropy"], r["top_key"]
    low, label = (ce, "content entropy") if _ok(ce) else (ent, "entropy")
    if _ok(low) and low < COLLAPSED_ENTROPY:
        if _ok(conc) and conc < CONCENTRATED_KEY:
            return "selective", f"{label} {low:.2f} but at most {conc:.0%} of the content " \
                                f"mass on any one key: each query on its own key{_repeats(r)}"
        shared = f", {conc:.0%} of it on one key shared by the queries" if _ok(conc) else ""
        return "collapsed", f"{label} {low:.2f}: each query's content mass on about one " \
                            f"key{shared}"
    if _ok(ent) and ent > DIFFUSE_ENTROPY and not (_ok(r["wmax"]) and r["wmax"] >= DOMINANT_KEY):
        top = f", largest weight {r['wmax']:.2f}" if _ok(r["wmax"]) else ""
        return "diffuse", f"entropy {ent:.2f}{top}: mass spread over most keys"
    detail = f"entropy {ent:.2f}" if _ok(ent) else "entropy not recorded"
    if _ok(ce):
        detail += f", content entropy {ce:.2f}"
    return "content", f"{detail}: attends by content{_repeats(r)}"


def head_roles(heads: pd.DataFrame) -> pd.DataFrame:
    """The role of every head: ``heads`` are per-head rows (``to_trajectory(probe,
    per_head=True)``; rows without a head are ignored) with the columns ``layer, head,
    observable, value``. Returns one row per (layer, head): ``layer, head, role``, the
    statistics of :data:`COLUMNS` (NaN where not recorded) and ``why``, a short phrase
    ("62% of the mass on the first token"). Rules and their order: the module docstring."""
    wide = _table(heads)
    roles, whys = [], []
    for _, r in wide.iterrows():
        role, why = _sink(r) or _positional(r) or _sharp_or_spread(r)
        roles.append(role)
        whys.append(why)
    out = wide[["layer", "head"]].copy()
    out["role"] = roles
    for c in COLUMNS:
        out[c] = wide[c].astype(float)
    out["why"] = whys
    return out


def summary(roles: pd.DataFrame) -> dict:
    """Heads per role per layer, ``{layer: {role: count}}`` (every role of :data:`ROLES`
    listed, zeros included), from :func:`head_roles`' table."""
    out = {}
    for layer, grp in roles.groupby("layer", sort=True):
        counts = grp["role"].value_counts()
        out[int(layer)] = {role: int(counts.get(role, 0)) for role in ROLES}
    return out
