"""The vectorised causal path (:mod:`sigprop.theory.causal`) against the per-position path it
replaced, kept here as the reference: every position's table called on its own (the
single-table evaluators of :mod:`sigprop.theory.rem_tables` and :mod:`sigprop.theory.fluct`)
and the bin-by-bin pair sums of :func:`sigprop.theory.fluct.causal_pair_means`.

Tolerances. The tables are evaluated with the same arithmetic, so they agree to roundoff
(1e-13 relative). The pair sums on virtual bins carry an interpolation error bounded by 6e-11
of each sum (module docstring of :mod:`.causal`; measured ~1e-15); through a stack of blocks
the final cosines and the predict rows are held to 1e-9, far inside the 1e-6 the speed issue
allows (measured: <= 7e-15 on the diagram's own grid)."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.spec import ArchSpec
from sigprop.theory import blocks, causal, depth, diagram, fluct, rem


def _old_ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st):
    """The per-position LayerNorm average as it was before the vectorised path (reference)."""
    b, rho, v = blocks._ln_fluct_inputs(qa, pa, bp)
    a0, c0 = q_z - b * st.y2, p_z - b * st.yx
    nodes, _ = blocks._causal_nodes(bp.seq_len)
    m, yx = [], []
    for t in nodes:
        fixed = t == 1 or bp.attention == "uniform"
        if fixed:
            y2_t = yx_t = np.full(np.shape(v), 1.0 / t)
        else:
            y2_t = rem.y2_table(int(t), bp.d_head)(v)
            yx_t = rem.yx_table(int(t), bp.d_head)(v, rho)
        n_t = a0 + b * y2_t
        ok = n_t > 0
        safe = np.where(ok, n_t, 1.0)
        r = 1.0 if fixed else fluct.ln_factor(v, np.clip(a0 / safe, 0.0, 1.0), int(t),
                                                bp.d_head, bp.heads)
        m.append(np.where(ok, np.sqrt(r / safe), np.nan))
        yx.append(yx_t)
    p0, p1 = fluct.causal_pair_means(nodes, np.stack(np.broadcast_arrays(*m)),
                                     np.stack(np.broadcast_arrays(*yx)), bp.seq_len)
    cos = c0 * p0 + b * p1
    cos = np.where(np.isfinite(cos), cos, blocks._cos(p_z, q_z))
    return np.minimum(cos, 1.0)


@pytest.fixture
def reference(monkeypatch):
    """Switch blocks to the per-position path: attention statistics through the ``full``
    branch (each position's tables in turn) and the old LayerNorm average."""
    new_stats = blocks.attention_stats

    def old_stats(*args, full=False, **kw):
        st = new_stats(*args, full=True, **kw)
        return st._replace(nodes=None) if full else st._replace(entropy=None, wmax=None,
                                                                nodes=None)

    def use():
        monkeypatch.setattr(blocks, "attention_stats", old_stats)
        monkeypatch.setattr(blocks, "_ln_fluct_cos_causal", _old_ln_fluct_cos_causal)

    return use


SPECS = {
    "post-LN softmax T512": dict(depth=24, causal=True),
    "post-LN softmax T128 1 head": dict(depth=16, causal=True, seq_len=128, d_model=1024,
                                        heads=1),
    "post-LN uniform T2048": dict(depth=12, causal=True, seq_len=2048, attention="uniform"),
    "pre-LN softmax T512": dict(depth=24, causal=True, norm="pre"),
    "pre-LN centred T512": dict(depth=12, causal=True, norm="pre", attention="centred"),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_final_cos_grid_unchanged(name, reference):
    spec = ArchSpec(**SPECS[name])
    beta, alpha = np.linspace(0.0, 2.5, 9)[:, None], np.linspace(0.0, 3.0, 7)[None, :]
    new = depth.final_cos(spec, beta=beta, alpha_attn=alpha)
    reference()
    old = depth.final_cos(spec, beta=beta, alpha_attn=alpha)
    assert np.array_equal(np.isnan(new), np.isnan(old))
    np.testing.assert_allclose(new, old, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["post-LN softmax T512", "pre-LN softmax T512",
                                  "post-LN uniform T2048"])
def test_predict_rows_unchanged(name, reference):
    spec = ArchSpec(**SPECS[name])
    new = depth.propagate(spec)
    reference()
    old = depth.propagate(spec)
    assert list(new["observable"]) == list(old["observable"])
    np.testing.assert_allclose(new["value"].to_numpy(float), old["value"].to_numpy(float),
                               rtol=1e-9, atol=1e-9)


def test_diagram_alpha_crit_unchanged(reference):
    spec = ArchSpec(depth=20, causal=True)
    new = diagram.compute(spec, n_beta=24, n_alpha=24)
    reference()
    old = diagram.compute(spec, n_beta=24, n_alpha=24)
    np.testing.assert_allclose(new.alpha_crit, old.alpha_crit, rtol=1e-9, atol=0)
    assert np.array_equal(new.regime, old.regime)
    assert new.point["rho_L"] == pytest.approx(old.point["rho_L"], abs=1e-9)


def test_node_tables_equal_single_tables():
    """Every region of the single tables: v below the grid (analytic), on it, above it
    (extended table / exact Yx), rho at both ends."""
    v = np.concatenate([[0.0, 1e-5, 5e-4], np.geomspace(1e-3, 1e4, 40), [3e4, 1e6]])
    rho = np.linspace(0.0, 1.0, v.size)
    for T, d, h in ((128, 1024, 1), (512, 64, 12)):  # tables the other tests build too
        nodes, _ = blocks._causal_nodes(T)
        y2, yx = causal.node_tables(v, rho, nodes, d)
        for i, t in enumerate(nodes):
            ref2 = rem.y2_table(int(t), d)(v) if t > 1 else 1.0
            refx = rem.yx_table(int(t), d)(v, rho) if t > 1 else 1.0
            np.testing.assert_allclose(y2[i], ref2, rtol=1e-13, atol=0)
            np.testing.assert_allclose(yx[i], refx, rtol=1e-13, atol=0)
        kappa = np.linspace(-0.1, 1.1, nodes.size * v.size).reshape(nodes.size, v.size)
        r = causal.ln_nodes(v, kappa, nodes, d, h)
        for i, t in enumerate(nodes):
            ref = fluct.ln_factor(v, kappa[i], int(t), d, h) if t > 1 else 1.0
            np.testing.assert_allclose(r[i], ref, rtol=1e-13, atol=0)


@pytest.mark.parametrize("T", [2, 3, 100, 512, 4096])
def test_pair_means_virtual_bins_match_bin_sums(T):
    """Random node values with adjacent log-ratios up to and past :data:`causal.EXP_BOUND`
    (the larger take the exact bin sums), NaN and zero entries (exact path as well)."""
    rng = np.random.default_rng(T)
    nodes, _ = blocks._causal_nodes(T)
    e = 400
    m = np.sqrt(nodes)[:, None] ** rng.uniform(-1.0, 2.5, e) * np.exp(
        rng.normal(0.0, 0.3, (nodes.size, e)))
    yx = (1.0 / nodes)[:, None] ** rng.uniform(0.0, 2.5, e) * np.exp(
        rng.normal(0.0, 0.3, (nodes.size, e)))
    m[0, :3], yx[-1, 3:5] = np.nan, 0.0
    new, old = causal.pair_means(nodes, m, yx, T), fluct.causal_pair_means(nodes, m, yx, T)
    for a, b in zip(new, old, strict=True):
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=0)


def test_chunks_do_not_change_the_result(monkeypatch):
    """:data:`causal.CHUNK` splits the entries into independent passes: the same values
    (to BLAS summation order, 1e-14 relative) in one pass and in chunks of 7."""
    T, d, h = 512, 64, 12
    rng = np.random.default_rng(5)
    nodes, _ = blocks._causal_nodes(T)
    e = 50
    v = np.geomspace(1e-4, 3e4, e)
    rho = rng.uniform(0.0, 1.0, e)
    kappa = rng.uniform(0.0, 1.0, (nodes.size, e))
    m = np.sqrt(nodes)[:, None] ** rng.uniform(-1.0, 1.0, e)
    yx = (1.0 / nodes)[:, None] ** rng.uniform(0.0, 1.5, e)

    def run():
        return (*causal.node_tables(v, rho, nodes, d), causal.ln_nodes(v, kappa, nodes, d, h),
                *causal.pair_means(nodes, m, yx, T))

    one = run()
    monkeypatch.setattr(causal, "CHUNK", 7)
    for a, b in zip(run(), one, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=0)


@pytest.mark.parametrize("T", [2, 3, 5, 13, 16, 64, 100, 257, 512, 4096, 65536])
def test_pair_plan_covers_every_bin_once(T):
    """The lone bins of the leading short segments and the groups of the later ones hold
    every position bin once: their count weights sum to T and to the bins' own in-bin pair
    counts; smooth node values give the bin sums to 1e-12."""
    nodes, _ = blocks._causal_nodes(T)
    pl = causal._plan(T, tuple(nodes.tolist()), causal.VIRTUAL)
    g, n = fluct._position_bins(T)
    assert pl["bwa"].sum() + pl["wa"].sum() == pytest.approx(T, rel=1e-13)
    assert pl["bwe"].sum() + pl["we"].sum() == pytest.approx(0.5 * (n * (n - 1)).sum(),
                                                             rel=1e-13, abs=1e-13)
    assert np.all(np.diff(pl["bseg"]) >= 0) and pl["bseg"].size <= g.size
    m = nodes[:, None] ** np.array([-0.5, -0.3, 0.0, 0.2])
    yx = np.broadcast_to((1.0 / nodes)[:, None], m.shape)
    for a, b in zip(causal.pair_means(nodes, m, yx, T),
                    fluct.causal_pair_means(nodes, m, yx, T), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)


@pytest.mark.parametrize("T", [2, 3, 16])
def test_node_tables_hostile_inputs(T):
    """Short rows (T = 2, 3: only lone bins, or one node above t = 1), v from 0 to past the
    tables' grid and rho within 1e-12 of both ends, through the whole causal LayerNorm
    average: the one-pass tables equal the single tables (1e-13) and the cosine stays
    finite and within 1e-12 of the per-position reference."""
    d, h = 64, 12
    v = np.concatenate([[0.0, 1e-300, 1e-8], np.geomspace(1e-4, 1e3, 12), [2e4, 1e7]])
    rho = np.resize([0.0, 1e-12, 0.5, 1.0 - 1e-12, 1.0], v.size)
    nodes, _ = blocks._causal_nodes(T)
    y2, yx = causal.node_tables(v, rho, nodes, d)
    for i, t in enumerate(nodes):
        if t > 1:
            np.testing.assert_allclose(y2[i], rem.y2_table(int(t), d)(v), rtol=1e-13, atol=0)
            np.testing.assert_allclose(yx[i], rem.yx_table(int(t), d)(v, rho), rtol=1e-13,
                                       atol=0)
    bp = blocks.BlockParams.from_spec(ArchSpec(causal=True, seq_len=T, d_model=d * h,
                                               heads=h), sigma_s0=np.sqrt(v))
    qa, pa = np.ones_like(v), rho.copy()
    for alpha2 in (1e-6, 1.0, 1e4):
        q_z, p_z = alpha2 + 0.3 * (1 + rho), alpha2 * rho + 0.3 * (2 * rho)
        st = blocks.attention_stats(bp.sigma_s0, rho, T, d_head=d, causal=True)
        new = blocks._ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st)
        old = _old_ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st._replace(nodes=None))
        assert np.isfinite(new).all()
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-12)
