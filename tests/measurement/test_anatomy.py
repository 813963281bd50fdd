"""Head anatomy (``Probe(anatomy=True)``, ``sigprop.measurement.anatomy_stats``) and head roles
(``sigprop.analysis.anatomy``).

Hand-made maps: a one-layer attention whose input is the one-hot position ``e_t`` and whose
key projection is the identity, so that head ``h``'s logit matrix is exactly the ``S_h`` its
query weights hold (``q_t = S_h[t] / scale``). The expected statistics are closed forms where
the map is simple (a 90% sink: ``sink = 0.9``, content entropy 1; a uniform head: ``1/T``) and
otherwise a float64 textbook computation over the same ``S_h`` (softmax, then each statistic's
definition, row by row). Tolerances: the probe runs in float32 on a float32 model, so
probabilities and normalised entropies are compared at 2e-6 absolute (float32 rounding of
sums over <= 16 keys), logits at 1e-6 relative; the returned (eager) and recomputed (SDPA)
paths of one model agree within 1e-5 (the brief's bound; seen: ~1e-7).

The trained fixtures (``sigprop.models.tiny_trained``) are trained once per session, which is
minutes on a loaded machine: that test is in the slow suite (tests/test_trained.py measures
the same fixtures through ``diagnose`` in the default suite).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sigprop.analysis.anatomy import ROLES, head_roles, summary
from sigprop.measurement import anatomy_stats as anat
from sigprop.measurement.probe import Probe, to_trajectory

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROB_TOL, LOGIT_RTOL, PATHS_TOL = 2e-6, 1e-6, 1e-5
PROBS = ("sink", "special", "prev", "self", "next", "content_mass", "content_entropy")


# ---- a one-layer attention with hand-set logits -------------------------------------------
class _Attention(nn.Module):
    def __init__(self, S: torch.Tensor, causal: bool, eager: bool):
        super().__init__()
        H, T, _ = S.shape
        self.num_heads, self.head_dim, self.scaling = H, T, 0.5
        self.is_causal, self.eager = causal, eager
        self.q_proj = nn.Linear(T, H * T, bias=False)
        self.k_proj = nn.Linear(T, H * T, bias=False)
        self.v_proj = nn.Linear(T, H * T, bias=False)
        with torch.no_grad():  # q_t = S_h[t] / scale, k_s = e_s: logits q.k scale = S_h
            self.q_proj.weight.copy_((S.transpose(-1, -2) / self.scaling).reshape(H * T, T))
            self.k_proj.weight.copy_(torch.eye(T).repeat(H, 1))
            self.v_proj.weight.copy_(torch.eye(T).repeat(H, 1))

    def forward(self, x, attention_mask=None, kv=None):
        src = x if kv is None else kv
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
                   for t in (self.q_proj(x), self.k_proj(src), self.v_proj(src)))
        T, Tk = q.shape[-2], k.shape[-2]
        vis = torch.ones(T, Tk, dtype=torch.bool).tril() if self.is_causal else None
        if attention_mask is not None:
            vis = attention_mask if vis is None else vis & attention_mask
        if not self.eager:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=vis, scale=self.scaling)
            return out.transpose(1, 2).flatten(-2), None
        sc = q @ k.transpose(-1, -2) * self.scaling
        if vis is not None:
            sc = sc.masked_fill(~vis, torch.finfo(sc.dtype).min)
        a = torch.softmax(sc, -1)
        return (a @ v).transpose(1, 2).flatten(-2), a


class _Block(nn.Module):
    def __init__(self, S, causal, eager):
        super().__init__()
        self.attn = _Attention(S, causal, eager)

    def forward(self, x, attention_mask=None, kv=None):
        return self.attn(x, attention_mask=attention_mask, kv=kv)[0]


class _Stack(nn.Module):
    def __init__(self, S, causal=False, eager=False):
        super().__init__()
        self.layers = nn.ModuleList([_Block(S, causal, eager)])

    def forward(self, x, attention_mask=None, kv=None):
        return self.layers[0](x, attention_mask=attention_mask, kv=kv)


T = 10
SINK_LOGIT = math.log(9 * (T - 1))  # bidirectional rows: 90% on key 0, 10% spread evenly
SHARP = 30.0  # a one-hot head: the rest of the row holds ~T e^-30 ~ 1e-12
#: the content head's key for each query: never key 0, never t - 1, t, t + 1
CONTENT_KEY = (5, 6, 7, 8, 9, 1, 2, 3, 4, 6)


def _logits(kind: str) -> torch.Tensor:
    S = torch.zeros(T, T, dtype=torch.float64)
    if kind == "sink":
        S[:, 0] = SINK_LOGIT
    elif kind == "prev":
        S[torch.arange(1, T), torch.arange(T - 1)] = SHARP
    elif kind == "content":
        S[torch.arange(T), torch.tensor(CONTENT_KEY)] = SHARP
    return S  # "uniform": zeros


def _heads(*kinds):
    return torch.stack([_logits(k) for k in kinds])


def _run(S, causal=False, eager=False, mask=None, special=None, batch=2, **kw):
    n = S.shape[-1]  # T, unless a test builds longer maps
    model = _Stack(S.float(), causal, eager).eval()
    x = torch.eye(n).expand(batch, n, n).clone()
    p = Probe(model, anatomy=True, special_keys=special, dtype=torch.float32, **kw)
    with p, torch.no_grad():
        model(x, attention_mask=mask)
    return p


def _reference(S, visible, special_cols=()):
    """Float64 textbook anatomy of logits ``S`` (H, T, T) with visibility (T, T)."""
    A = torch.softmax(S.masked_fill(~visible, -math.inf), -1)
    excl = sorted({0, *special_cols})
    content = torch.ones(T, dtype=torch.bool)
    content[excl] = False
    out = {"sink": A[..., 0].mean(-1),
           "self": A.diagonal(0, -2, -1).mean(-1), "prev": A.diagonal(-1, -2, -1).mean(-1),
           "next": A.diagonal(1, -2, -1).mean(-1),
           "content_mass": (A * content).sum(-1).mean(-1),
           "max_logit": S.masked_fill(~visible, -math.inf).amax((-1, -2))}
    if special_cols:
        out["special"] = A[..., list(special_cols)].sum(-1).mean(-1)
    col = A[..., content].sum(-2)  # each content key's column over all rows
    out["top_key"] = col.amax(-1) / col.sum(-1)
    ents = torch.zeros(S.shape[0], dtype=torch.float64)
    for h in range(S.shape[0]):
        rows = []
        for t in range(T):
            keys = content & visible[t]
            n = int(keys.sum())
            if n >= 2:
                p = A[h, t][keys] / A[h, t][keys].sum()
                rows.append(float(-(p * p.log()).sum()) / math.log(n))
        ents[h] = sum(rows) / len(rows)
    out["content_entropy"] = ents
    return out


def _check(got: dict, want: dict, skip=()):
    for k, v in want.items():
        if k in skip:
            continue
        g = got[k].double()
        assert g.shape[-1] == v.shape[-1], k
        tol = LOGIT_RTOL * v.abs().clamp_min(1.0) if k == "max_logit" else PROB_TOL
        assert ((g - v).abs() <= tol).all(), (k, g, v)


# ---- the recorded statistics --------------------------------------------------------------
def test_bidirectional_heads_against_closed_forms_and_float64():
    """Sink (90% on key 0), uniform and one-hot content heads, bidirectional, recomputed."""
    S = _heads("sink", "uniform", "content")
    p = _run(S)
    st = p.attention_stats[0]
    assert p.info[0]["source"] == "recomputed" and p.info[0]["anatomy"] is None
    assert "special" not in st  # no special_keys: not recorded
    # closed forms
    sink_h, unif_h = 0, 1
    assert abs(float(st["sink"][0, sink_h]) - 0.9) <= PROB_TOL
    assert abs(float(st["content_mass"][0, sink_h]) - 0.1) <= PROB_TOL
    assert abs(float(st["content_entropy"][0, sink_h]) - 1.0) <= PROB_TOL  # even 10%
    assert abs(float(st["self"][0, sink_h]) - 1 / T) <= PROB_TOL  # (0.9 + 9 * 0.1/9) / T
    assert math.isclose(float(st["max_logit"][0, sink_h]), SINK_LOGIT, rel_tol=LOGIT_RTOL)
    for k in ("sink", "self", "prev", "next"):
        assert abs(float(st[k][0, unif_h]) - 1 / T) <= PROB_TOL, k
    assert abs(float(st["content_mass"][0, unif_h]) - (T - 1) / T) <= PROB_TOL
    assert abs(float(st["content_entropy"][0, unif_h]) - 1.0) <= PROB_TOL
    assert float(st["max_logit"][0, unif_h]) == 0.0
    # every head, both sequences, against float64
    want = _reference(S, torch.ones(T, T, dtype=torch.bool))
    for n in range(2):
        _check({k: v[n] for k, v in st.items()}, want)


def test_causal_previous_token_head():
    """Causal sink / previous-token / uniform heads: ``prev`` ~ 1 on rows >= 1, ``self``
    gets row 0's forced 1 (1/T), ``next`` is not recorded (causal)."""
    S = _heads("sink", "prev", "uniform")
    p = _run(S, causal=True)
    st = p.attention_stats[0]
    assert "next" not in st
    want = _reference(S, torch.ones(T, T, dtype=torch.bool).tril())
    _check({k: v[0] for k, v in st.items()}, want, skip=("next",))
    prev_h = 1
    assert float(st["prev"][0, prev_h]) > 1 - 1e-6
    assert abs(float(st["self"][0, prev_h]) - 1 / T) <= PROB_TOL
    assert abs(float(st["sink"][0, prev_h]) - 2 / T) <= PROB_TOL  # row 0 (forced), row 1
    # uniform causal: row t spreads over t + 1 keys, sink = mean_t 1 / (t + 1)
    harmonic = sum(1 / (t + 1) for t in range(T)) / T
    assert abs(float(st["sink"][0, 2]) - harmonic) <= PROB_TOL
    assert math.isclose(float(st["max_logit"][0, prev_h]), SHARP, rel_tol=LOGIT_RTOL)


@pytest.mark.parametrize("causal", [False, True])
def test_returned_and_recomputed_paths_agree(causal):
    """The eager module's returned maps and the SDPA module's recomputed ones: every
    statistic within 1e-5 (max_logit from the captured q, k in both), a padding mask and
    special keys included."""
    S = _heads("sink", "prev", "uniform", "content")
    mask = torch.ones(2, 1, T, T, dtype=torch.bool)
    mask[1, ..., -2:] = False  # sequence 1: its last two keys are padding
    special = torch.zeros(2, T, dtype=torch.bool)
    special[:, 0] = special[0, 4] = special[1, 7] = True
    ids = torch.tensor([[5, 1, 2, 1, 2, 1, 3, 3, 2, 4], [5, 1, 1, 1, 2, 2, 3, 1, 2, 1]])
    a = _run(S, causal=causal, mask=mask, special=special, token_ids=ids)
    b = _run(S, causal=causal, mask=mask, special=special, eager=True, token_ids=ids)
    assert (a.info[0]["source"], b.info[0]["source"]) == ("recomputed", "returned")
    sa, sb = a.attention_stats[0], b.attention_stats[0]
    assert set(sa) == set(sb) and {"special", "max_logit", "content_entropy", "top_key",
                                   "copy", "induction"} <= set(sa)
    for k in sa:
        err = (sa[k].double() - sb[k].double()).abs()
        scale = sa[k].double().abs().clamp_min(1.0) if k == "max_logit" else 1.0
        assert (err <= PATHS_TOL * scale).all(), (k, sa[k], sb[k])
    # and the padded sequence against float64 (its visible keys and flagged columns)
    vis = torch.ones(T, T, dtype=torch.bool)
    vis[:, -2:] = False
    if causal:
        vis &= torch.ones(T, T, dtype=torch.bool).tril()
    want = _reference(S, vis, special_cols=(0, 7))
    _check({k: v[1] for k, v in sa.items()}, want, skip=("next",))
    # key 0 flagged: it counts in special, and content is what the flags leave
    torch.testing.assert_close(sa["content_mass"], 1 - sa["special"], atol=PROB_TOL, rtol=0)
    assert (sa["sink"] <= sa["special"] + PROB_TOL).all()


def test_content_entropy_of_rows_far_below_the_top_key():
    """A sink whose content logits sit 70 and 110 below key 0 (float32 exponentials ~e-31
    and 0): the content is still uniform, content entropy 1 from the logits."""
    for gap, causal in ((70.0, False), (110.0, False), (110.0, True)):
        S = torch.zeros(1, T, T, dtype=torch.float64)
        S[..., 0] = gap
        st = _run(S, causal=causal).attention_stats[0]
        assert abs(float(st["content_entropy"][0, 0]) - 1.0) <= PROB_TOL, gap
        assert float(st["sink"][0, 0]) == 1.0
        assert 0.0 <= float(st["content_mass"][0, 0]) <= (T - 1) * math.exp(-gap) * 1.01
        assert not causal or "next" not in st


@pytest.mark.parametrize("causal", [False, True])
def test_content_far_below_flagged_keys(causal):
    """Key 0 on top, a flagged key 1.2 below it (e^-1.2 of its weight), the content ~20 below
    (content mass ~1e-8): the content entropy's numerator cannot be taken as the row's total
    less the flagged keys' terms (float32 cancellation), the probe sums those rows directly;
    against float64, and the returned maps' path agrees."""
    S = torch.zeros(1, T, T, dtype=torch.float64)
    S[..., 0], S[..., 3], S[..., 5] = 20.0, 18.8, 2.0
    special = torch.zeros(2, T, dtype=torch.bool)
    special[:, 0] = special[:, 3] = True
    a = _run(S, causal=causal, special=special)
    b = _run(S, causal=causal, special=special, eager=True)
    vis = torch.ones(T, T, dtype=torch.bool)
    want = _reference(S, vis.tril() if causal else vis, special_cols=(0, 3))
    assert 0.1 < float(want["content_entropy"][0]) < 0.9  # neither uniform nor one key
    for p in (a, b):
        _check({k: v[0] for k, v in p.attention_stats[0].items()}, want, skip=("next",))


def test_special_keys_are_read_at_each_call():
    """A uniform head (special = flagged keys / T) over three calls: flags {0, 3}, the same
    tensor changed in place to {0, 3, 5}, then a new tensor {0}: 0.2, 0.3, 0.1."""
    model = _Stack(_heads("uniform").float()).eval()
    x = torch.eye(T).expand(2, T, T)
    flags = torch.zeros(2, T, dtype=torch.bool)
    flags[:, [0, 3]] = True
    p = Probe(model, anatomy=True, special_keys=flags, dtype=torch.float32)
    with p, torch.no_grad():
        model(x)
        flags[:, 5] = True
        model(x)
        p.special_keys = torch.zeros(2, T, dtype=torch.bool)
        p.special_keys[:, 0] = True
        model(x)
    got = p.attention_stats[0]["special"][:, 0].tolist()
    assert got == pytest.approx([0.2, 0.2, 0.3, 0.3, 0.1, 0.1], abs=PROB_TOL)


def test_cross_attention_records_what_applies():
    """T != Tk (keys from another sequence): sink, content_*, max_logit; no prev / self /
    next, and the probe says so."""
    S = _heads("sink", "uniform")
    model = _Stack(S.float()).eval()
    p = Probe(model, anatomy=True, dtype=torch.float32)
    with p, torch.no_grad():
        model(torch.eye(T)[:4].expand(2, 4, T), kv=torch.eye(T).expand(2, T, T))
    st = p.attention_stats[0]
    assert {"sink", "content_mass", "content_entropy", "max_logit"} <= set(st)
    assert not {"prev", "self", "next"} & set(st)
    assert "T != Tk" in p.info[0]["anatomy"]
    assert abs(float(st["sink"][0, 0]) - 0.9) <= PROB_TOL


def test_special_keys_of_another_shape_are_noted_not_guessed():
    plan = anat.plan(torch.zeros(3, 7, dtype=torch.bool), (2,), 7, 7, False, "cpu")
    assert plan.special is None and plan.content is None and "special_keys (3, 7)" in plan.note
    plan = anat.plan(torch.tensor([True, False, True]), (2,), 3, 3, True, "cpu")
    assert not plan.next and plan.note is None
    assert [c.tolist() for c in plan.excluded] == [[0, 2], [0, 2]]
    assert plan.content.tolist() == [[0.0, 1.0, 0.0]] * 2
    with pytest.raises(ValueError, match="anatomy=True"):
        Probe(_Stack(_heads("sink")), special_keys=torch.ones(1, T, dtype=torch.bool))


# ---- key concentration, copy and induction: one key for all queries or one each ----------
TL = 32  # the repeat maps: a first segment of 15 tokens, its copy, one more token
#: token ids of the repeat maps: BOS 0, tokens 1..15, the same 15 again, token 16
IDS = torch.tensor([0, *range(1, 16), *range(1, 16), 16])


def _targets(kind: str) -> list[int]:
    """Each query's key. ``permutation``: row a on key a - 2 (rows 1, 2 on key 1, row 0 on
    key 0), never the previous token or itself from row 3 on; ``induction``: the same, but
    the rows 16..30 of the copied segment on the key after their token's earlier copy (a - 14);
    ``copy``: those rows on the earlier copy itself (a - 15); ``shared``: every row on key 1."""
    tgt = [0, 1, 1] + [a - 2 for a in range(3, TL)]
    if kind == "induction":
        tgt[16:31] = [a - 14 for a in range(16, 31)]
    elif kind == "copy":
        tgt[16:31] = [a - 15 for a in range(16, 31)]
    elif kind == "shared":
        tgt = [1] * TL
    return tgt


def _repeat_maps(*kinds):
    S = torch.zeros(len(kinds), TL, TL, dtype=torch.float64)
    for h, kind in enumerate(kinds):
        S[h, torch.arange(TL), torch.tensor(_targets(kind))] = SHARP
    return S


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_key_concentration_copy_and_induction_by_hand(causal, eager):
    """One-hot heads on 32 tokens (leakage ~31 e^-30 ~ 3e-12): ``shared`` puts every query on
    key 1, ``top_key`` = 1 (causal: row 0 sees key 0 only and holds no content); the others
    give each content row one key, so ``top_key`` is the most rows on one key over the 31 rows
    with content (row 0's target is key 0): ``permutation`` rows 1, 2, 3 on key 1 -> 3 / 31;
    ``induction`` the same (keys 2..13 hold two rows each); ``copy`` rows 1, 2, 3 and 16 on
    key 1 -> 4 / 31. ``induction``: the 15 rows 16..30 on the key after their token's earlier
    copy, 15 / 32, nothing else (the first segment's tokens are new); ``copy``: those rows on
    the copy, 15 / 32. Causal or not the targets are earlier keys, so the values agree."""
    S = _repeat_maps("shared", "permutation", "induction", "copy")
    p = _run(S, causal=causal, eager=eager, token_ids=IDS)
    assert p.info[0]["source"] == ("returned" if eager else "recomputed")
    st = {k: v[0] for k, v in p.attention_stats[0].items()}  # sequence 0 (both the same)
    want = {"top_key": [1.0, 3 / 31, 3 / 31, 4 / 31],
            "induction": [0.0, 0.0, 15 / TL, 0.0],
            "copy": [1 / TL, 0.0, 0.0, 15 / TL]}  # shared: row 16 (token 1) on key 1
    for k, v in want.items():
        got = st[k].double()
        assert (got - torch.tensor(v, dtype=torch.float64)).abs().max() <= PROB_TOL, (k, got)
    # every statistic against the float64 textbook one (top_key included)
    vis = torch.ones(TL, TL, dtype=torch.bool)
    _check_long(st, S, vis.tril() if causal else vis)
    # the roles: shared is collapsed, the rest selective, the induction head named
    rows = head_roles(_rows(p))
    assert rows["role"].tolist() == ["collapsed", "selective", "selective", "selective"]
    where = "an earlier" if causal else "another"
    assert rows["why"][2].endswith(f"47% of the mass on the key after {where} copy of the "
                                   "query's token: an induction head"), rows["why"][2]
    assert rows["why"][3].endswith(f"47% of the mass on {where} copy of the query's token: a "
                                   "copy head"), rows["why"][3]
    assert "100% of it on one key shared by the queries" in rows["why"][0]


def _check_long(st, S, visible):
    """Sink, positions, content mass and top_key of maps over TL keys against float64."""
    A = torch.softmax(S.masked_fill(~visible, -math.inf), -1)
    col = A[..., 1:].sum(-2)
    want = {"sink": A[..., 0].mean(-1), "self": A.diagonal(0, -2, -1).mean(-1),
            "prev": A.diagonal(-1, -2, -1).mean(-1),
            "content_mass": A[..., 1:].sum(-1).mean(-1),
            "top_key": col.amax(-1) / col.sum(-1)}
    _check(st, want)


@pytest.mark.parametrize("causal", [False, True])
def test_key_concentration_of_a_uniform_head(causal):
    """Uniform rows: each content key's column is T / Tk of the content's T (Tk - 1) / Tk
    (bidirectional): 1 / (T - 1), 1 / (T - 2) with key 4 flagged too; causal, row t spread
    over t + 1 keys: key 1's column sum_{t >= 1} 1 / (t + 1) = H_T - 1 over the content's
    sum_t t / (t + 1) = T - H_T (flagging key 4 removes its column H_T - H_4 and the
    same amount from the total)."""
    H_T = sum(1 / (t + 1) for t in range(T))
    flags = torch.zeros(T, dtype=torch.bool)
    flags[[0, 4]] = True
    for special, want in ((None, 1 / (T - 1)), (flags, 1 / (T - 2))):
        if causal:
            total = T - H_T - (0.0 if special is None else H_T - sum(1 / (t + 1)
                                                                   for t in range(4)))
            want = (H_T - 1) / total
        for eager in (False, True):
            st = _run(_heads("uniform"), causal=causal, eager=eager,
                      special=special).attention_stats[0]
            assert abs(float(st["top_key"][0, 0]) - want) <= PROB_TOL, (special, eager)


@pytest.mark.parametrize("causal", [False, True])
def test_two_tokens_and_a_masked_row_give_no_nan(causal):
    """T = 2: one content key, ``top_key`` = 1 exactly; tokens (7, 7): row 1's key 0 is a
    copy, key 1 is itself (neither copy nor induction). A fully masked query row (the uniform
    row of HF eager) and padding keys: every statistic finite, both paths equal."""
    S = torch.tensor([[[0.0, 1.0], [2.0, 0.5]]], dtype=torch.float64)
    for eager in (False, True):
        st = _run(S, causal=causal, eager=eager, token_ids=torch.tensor([7, 7])) \
            .attention_stats[0]
        for k in ("top_key", "copy", "induction", "content_mass", "sink"):
            assert torch.isfinite(st[k]).all(), (k, st[k])
        assert (st["top_key"] == 1.0).all()
        assert (st["induction"] == 0.0).all()
        # copy: row 1 on key 0; bidirectional row 0 on key 1 too
        p10 = 1 / (1 + math.exp(0.5 - 2.0))  # row 1: logits 2 (key 0), 0.5 (key 1)
        p01 = 0.0 if causal else 1 / (1 + math.exp(-1.0))  # row 0: 0 and 1
        assert abs(float(st["copy"][0, 0]) - (p10 + p01) / 2) <= PROB_TOL
    mask = torch.ones(2, 1, T, T, dtype=torch.bool)
    mask[:, :, 5] = False  # query row 5 sees nothing
    mask[1, ..., -2:] = False  # sequence 1: two padding keys
    ids = torch.tensor([3, 1, 2, 1, 2, 1, 3, 3, 2, 4])
    S = _heads("sink", "prev", "uniform", "content")
    got = [_run(S, causal=causal, eager=e, mask=mask, token_ids=ids).attention_stats[0]
           for e in (False, True)]
    for k in ("top_key", "copy", "induction", "content_mass", "sink", "self", "prev"):
        for st in got:
            assert torch.isfinite(st[k]).all(), (k, st[k])
        assert (got[0][k] - got[1][k]).abs().max() <= PATHS_TOL, k


def test_token_ids_of_another_shape_are_noted():
    plan = anat.plan(None, (2,), 5, 5, False, "cpu", token_ids=torch.zeros(3, 5, dtype=torch.long))
    assert plan.tokens is None and "token_ids (3, 5)" in plan.note
    plan = anat.plan(None, (2,), 4, 6, False, "cpu", token_ids=torch.zeros(2, 4, dtype=torch.long))
    assert plan.tokens is None and "copy, induction not recorded" in plan.note
    plan = anat.plan(None, (2,), 4, 4, True, "cpu", token_ids=torch.arange(4))
    assert plan.tokens.shape == (2, 4) and plan.note is None
    copy, ind = anat.repeat_keys(torch.tensor([1, 2, 1, 2]))
    assert copy.int().tolist() == [[0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]]
    # induction [a, b]: token b - 1 is token a, b not a or a + 1
    assert ind.int().tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    with pytest.raises(ValueError, match="anatomy=True"):
        Probe(_Stack(_heads("sink")), token_ids=torch.zeros(1, T, dtype=torch.long))
    p = _run(_heads("uniform"))
    assert not {"copy", "induction"} & set(p.attention_stats[0])


# ---- anatomy off: the probe as before -----------------------------------------------------
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_anatomy_off_leaves_the_statistics_as_they_were(impl):
    """``anatomy=False`` records exactly the keys of before (sigma_s included) and its values
    are bit for bit those of ``anatomy=True``, which only adds keys."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    m = BertModel(cfg, add_pooling_layer=False).eval()
    ids = torch.randint(4, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    probes = []
    for on in (False, True):
        p = Probe(m, anatomy=on, dtype=torch.float32)
        with p, torch.no_grad():
            m(input_ids=ids)
        probes.append(p)
    off, on = probes
    for so, sn in zip(off.attention_stats, on.attention_stats, strict=True):
        assert set(so) == {"ipr", "ipr_cross", "wmax", "entropy", "sigma_s"}
        assert set(sn) - set(so) == set(anat.ANATOMY_STATS) - {"special", "copy", "induction"}
        for k in so:
            assert torch.equal(so[k], sn[k]), k
    assert all("anatomy" not in i for i in off.info)


# ---- grouped-query attention with RoPE ----------------------------------------------------
def test_gqa_llama_paths_agree():
    """Llama with 4 query heads on 2 KV heads and RoPE: eager (returned) and SDPA
    (recomputed) give the same anatomy within 1e-5, causal (no ``next``)."""
    from transformers import LlamaConfig, LlamaModel

    stats = {}
    for impl in ("eager", "sdpa"):
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
        cfg._attn_implementation = impl
        torch.manual_seed(0)
        m = LlamaModel(cfg).eval()
        with torch.no_grad():  # sharper maps than the init's
            for layer in m.layers:
                layer.self_attn.q_proj.weight.mul_(8.0)
        ids = torch.randint(4, 64, (2, 24), generator=torch.Generator().manual_seed(1))
        p = Probe(m, anatomy=True, special_keys=ids == ids[0, 0], dtype=torch.float32)
        with p, torch.no_grad():
            m(input_ids=ids)
        assert {i["source"] for i in p.info} == {"returned" if impl == "eager" else
                                                   "recomputed"}
        assert all(i["rope"] in (None, "applied") for i in p.info)
        stats[impl] = p.attention_stats
    for se, ss in zip(stats["eager"], stats["sdpa"], strict=True):
        assert set(se) == set(ss) and "next" not in se and se["sink"].shape == (2, 4)
        for k in anat.ANATOMY_STATS:
            if k in se:
                scale = se[k].abs().clamp_min(1.0) if k == "max_logit" else 1.0
                assert ((se[k] - ss[k]).abs() <= PATHS_TOL * scale).all(), k


# ---- roles --------------------------------------------------------------------------------
def _rows(probe):
    """Per-head rows as ``to_trajectory(per_head=True)`` gives them (its head-rows' mean over
    sequences), built here so the roles' tests run while ``sigprop.trajectory`` does not list
    the anatomy observables (see test_to_trajectory_lists_the_anatomy_rows)."""
    import pandas as pd

    rows = []
    for layer, st in enumerate(probe.attention_stats, start=1):
        for name, v in st.items():
            for h in range(v.shape[-1]):
                rows.append(dict(layer=layer, head=h, observable=name,
                                 value=float(v[..., h].double().nanmean())))
    return pd.DataFrame(rows)


def test_head_roles_of_hand_made_heads():
    S = _heads("sink", "prev", "uniform", "content")
    bidir = head_roles(_rows(_run(S)))
    causal = head_roles(_rows(_run(S, causal=True)))
    assert list(bidir.columns) == ["layer", "head", "role", "sink", "special", "prev", "self",
                                   "next", "entropy", "content_entropy", "content_mass",
                                   "top_key", "copy", "induction", "sigma_s", "max_logit",
                                   "why"]
    # the content head: one key per query, CONTENT_KEY's 9 distinct keys (key 6 twice): at
    # most 2 / 10 of the content mass on one key, sharp by design
    assert bidir["role"].tolist() == ["sink", "positional", "diffuse", "selective"]
    assert abs(bidir["top_key"][3] - 2 / T) <= PROB_TOL
    # causal rows of <= 10 keys: the uniform head's self + prev is H_10 / 10 + (H_10 - 1) / 9
    # = 0.51, positional by the rules (as a short causal map is); so is the content head's
    assert causal["role"].tolist()[:3] == ["sink", "positional", "positional"]
    assert bidir["why"][0] == "90% of the mass on the first token"
    assert bidir["why"][1] == "100% of the mass on the previous token"
    assert bidir["special"].isna().all()
    assert summary(bidir) == {1: {"sink": 1, "positional": 1, "selective": 1, "collapsed": 0,
                                  "diffuse": 1, "content": 0}}


def test_head_roles_rules_on_chosen_values():
    """Precedence and thresholds on hand-written rows (one head each)."""
    import pandas as pd

    heads = [  # (expected role, statistics)
        ("sink", dict(sink=0.3, special=0.6, content_mass=0.4, entropy=0.2)),
        ("positional", dict(sink=0.1, prev=0.3, self=0.3, next=0.0, entropy=0.3)),
        ("collapsed", dict(sink=0.1, prev=0.1, self=0.1, content_entropy=0.05, entropy=0.3)),
        ("diffuse", dict(sink=0.05, content_entropy=0.95, entropy=0.9, wmax=0.1)),
        ("content", dict(sink=0.05, content_entropy=0.9, entropy=0.9, wmax=0.5)),
        ("content", dict(sink=0.2, content_entropy=0.5, entropy=0.5)),
    ]
    rows = [dict(layer=3, head=h, observable=k, value=v)
            for h, (_, st) in enumerate(heads) for k, v in st.items()]
    got = head_roles(pd.DataFrame(rows))
    assert got["role"].tolist() == [r for r, _ in heads]
    assert got["why"][0] == "60% of the mass on the first/special tokens (30% on the first)"
    assert "prev 30%, self 30%" in got["why"][1]
    assert summary(got)[3]["content"] == 2


def test_to_trajectory_lists_the_anatomy_rows():
    p = _run(_heads("sink", "prev", "uniform", "content"), causal=True)
    traj = to_trajectory(p, per_head=True)
    heads = traj[traj["head"].notna()]
    assert head_roles(heads)["role"].tolist()[:2] == ["sink", "positional"]
    layer = traj[traj["head"].isna() & (traj["observable"] == "sink")]
    assert len(layer) == 1  # the head-averaged layer row
    assert math.isclose(float(layer["value"].iloc[0]),
                        float(p.attention_stats[0]["sink"].mean()), rel_tol=1e-6)


# ---- the trained fixtures -----------------------------------------------------------------
def _trained(kind: str):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    from sigprop.data.stories import generate_stories
    from sigprop.models.tiny_trained import cached

    folder = cached(kind)
    auto = AutoModelForMaskedLM if kind == "encoder" else AutoModelForCausalLM
    tok = AutoTokenizer.from_pretrained(folder)
    text = " ".join(generate_stories(20, 0))
    ids = tok(text, return_tensors="pt", truncation=True, max_length=64)["input_ids"]
    special = (ids == tok.cls_token_id) | (ids == tok.sep_token_id)
    out = {}
    for impl in ("eager", "sdpa"):
        model = auto.from_pretrained(folder, attn_implementation=impl).eval()
        p = Probe(model, anatomy=True, special_keys=special, dtype=torch.float32)
        with p, torch.no_grad():
            model(input_ids=ids)
        out[impl] = p
    return out


@pytest.fixture(scope="module", params=["encoder", "decoder"])
def trained(request):
    """Each fixture is trained once per test session (a fresh cache directory): 20-60 s on
    a quiet machine, 6-17 minutes on the loaded 2-core one, hence the slow suite."""
    return request.param, _trained(request.param)


@pytest.mark.slow  # trains both fixtures; in `make test-slow`
def test_trained_fixtures_roles(trained):
    """Every head of the trained encoder / decoder gets a role; probabilities and entropies
    lie in [0, 1]; key 0 ([CLS]) is flagged, so content = 1 - special; both paths agree."""
    kind, probes = trained
    ref = probes["sdpa"]
    assert ref.info[0]["source"] == "recomputed" and probes["eager"].info[0]["source"] == \
        "returned"
    for se, ss in zip(probes["eager"].attention_stats, ref.attention_stats, strict=True):
        for k in anat.ANATOMY_STATS:
            if k in ss:
                scale = ss[k].abs().clamp_min(1.0) if k == "max_logit" else 1.0
                assert ((se[k] - ss[k]).abs() <= PATHS_TOL * scale).all(), (kind, k)
    roles = head_roles(_rows(ref))
    assert len(roles) == 2 * 4 and set(roles["role"]) <= set(ROLES)
    for c in (*PROBS, "entropy"):
        v = roles[c].dropna()
        assert ((v >= -1e-6) & (v <= 1 + 1e-6)).all(), c
    np.testing.assert_allclose(roles["content_mass"], 1 - roles["special"], atol=1e-5, rtol=0)
    if kind == "decoder":  # causal; a head on the previous token, 4x a uniform head's
        # 0.059 ((H_64 - 1) / 63); its largest prev was 0.29-0.32 over six texts (not > 0.3)
        assert roles["next"].isna().all()
        assert (roles["prev"] > 0.25).any(), roles[["layer", "head", "prev"]]
    print(f"\n{kind}:\n{roles.drop(columns=['sigma_s']).round(3).to_string()}")
