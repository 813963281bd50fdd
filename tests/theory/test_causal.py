"""The vectorised causal path (:mod:`sigprop.theory.causal_positions`) against the
per-position path it replaced, kept here as the reference: every position's table called on
its own (the single-table evaluators of :mod:`sigprop.theory.rem_tables` and
:mod:`sigprop.theory.fluct`) and the bin-by-bin pair sums of
:func:`sigprop.theory.fluct.causal_pair_means`; then the position-averaged tables
(:mod:`sigprop.theory.causal`, ``causal.TABULATED``, its docstring's fourth step) against
that per-position path, and against simulation.

Tolerances. The tables are evaluated with the same arithmetic, so they agree to roundoff
(1e-13 relative). The pair sums on virtual bins carry an interpolation error bounded by 6e-11
of each sum (module docstring of :mod:`.causal_positions`; measured ~1e-15); through a stack
of blocks the final cosines and the predict rows are held to 1e-9, far inside the 1e-6 the
speed issue allows (measured: <= 7e-15 on the diagram's own grid). Those tests run the
per-position path (``causal.TABULATED = False``, fixture ``per_position``), which stays the
code path off the tables. The position-averaged tables are splines through that path's
values, so they carry an interpolation error of their own: bounds stated at each test (module
docstring of :mod:`.causal`, fourth step)."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.spec import ArchSpec
from sigprop.theory import attention as ta
from sigprop.theory import blocks, causal, depth, diagram, fluct, rem, rem_tables
from sigprop.theory import causal_positions as positions


def _old_ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st):
    """The per-position LayerNorm average as it was before the vectorised path (reference)."""
    b, rho, v = blocks._ln_fluct_inputs(qa, pa, bp)
    a0, c0 = q_z - b * st.y2, p_z - b * st.yx
    nodes, _ = ta.causal_position_nodes(bp.seq_len)
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
    cos = np.where(np.isfinite(cos), cos, blocks.cos_of(p_z, q_z))
    return np.minimum(cos, 1.0)


@pytest.fixture
def per_position(monkeypatch):
    """The per-position path everywhere (no position-averaged tables)."""
    monkeypatch.setattr(causal, "TABULATED", False)


@pytest.fixture
def reference(monkeypatch, per_position):
    """Switch blocks to the per-position path: attention statistics through the ``full``
    branch (each position's tables in turn) and the old LayerNorm average."""
    new_stats = ta.attention_stats

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


#: the two slowest grids (~16 s and ~10 s) run in the slow suite; the other three by default
SLOW_SPECS = ("post-LN softmax T512", "post-LN softmax T128 1 head")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_SPECS
                                  else n for n in SPECS])
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


# T = 512 (~12 s of table builds) runs in the slow suite; T = 128 covers every region
@pytest.mark.parametrize("T, d, h", [(128, 1024, 1),
                                     pytest.param(512, 64, 12, marks=pytest.mark.slow)])
def test_node_tables_equal_single_tables(T, d, h):
    """Every region of the single tables: v below the grid (analytic), on it, above it
    (extended table / exact Yx), rho at both ends."""
    v = np.concatenate([[0.0, 1e-5, 5e-4], np.geomspace(1e-3, 1e4, 40), [3e4, 1e6]])
    rho = np.linspace(0.0, 1.0, v.size)
    nodes, _ = ta.causal_position_nodes(T)
    y2, yx = positions.node_tables(v, rho, nodes, d)
    for i, t in enumerate(nodes):
        ref2 = rem.y2_table(int(t), d)(v) if t > 1 else 1.0
        refx = rem.yx_table(int(t), d)(v, rho) if t > 1 else 1.0
        np.testing.assert_allclose(y2[i], ref2, rtol=1e-13, atol=0)
        np.testing.assert_allclose(yx[i], refx, rtol=1e-13, atol=0)
    kappa = np.linspace(-0.1, 1.1, nodes.size * v.size).reshape(nodes.size, v.size)
    r = positions.ln_nodes(v, kappa, nodes, d, h)
    for i, t in enumerate(nodes):
        ref = fluct.ln_factor(v, kappa[i], int(t), d, h) if t > 1 else 1.0
        np.testing.assert_allclose(r[i], ref, rtol=1e-13, atol=0)


@pytest.mark.parametrize("T", [2, 3, 100, 512, 4096])
def test_pair_means_virtual_bins_match_bin_sums(T):
    """Random node values with adjacent log-ratios up to and past :data:`positions.EXP_BOUND`
    (the larger take the exact bin sums), NaN and zero entries (exact path as well)."""
    rng = np.random.default_rng(T)
    nodes, _ = ta.causal_position_nodes(T)
    e = 400
    m = np.sqrt(nodes)[:, None] ** rng.uniform(-1.0, 2.5, e) * np.exp(
        rng.normal(0.0, 0.3, (nodes.size, e)))
    yx = (1.0 / nodes)[:, None] ** rng.uniform(0.0, 2.5, e) * np.exp(
        rng.normal(0.0, 0.3, (nodes.size, e)))
    m[0, :3], yx[-1, 3:5] = np.nan, 0.0
    new, old = positions.pair_means(nodes, m, yx, T), fluct.causal_pair_means(nodes, m, yx, T)
    for a, b in zip(new, old, strict=True):
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=0)


def test_chunks_do_not_change_the_result(monkeypatch):
    """:data:`positions.CHUNK` splits the entries into independent passes: the same values
    (to BLAS summation order, 1e-14 relative) in one pass and in chunks of 7."""
    T, d, h = 512, 64, 12
    rng = np.random.default_rng(5)
    nodes, _ = ta.causal_position_nodes(T)
    e = 50
    v = np.geomspace(1e-4, 3e4, e)
    rho = rng.uniform(0.0, 1.0, e)
    kappa = rng.uniform(0.0, 1.0, (nodes.size, e))
    m = np.sqrt(nodes)[:, None] ** rng.uniform(-1.0, 1.0, e)
    yx = (1.0 / nodes)[:, None] ** rng.uniform(0.0, 1.5, e)

    def run():
        return (*positions.node_tables(v, rho, nodes, d),
                positions.ln_nodes(v, kappa, nodes, d, h), *positions.pair_means(nodes, m, yx, T))

    one = run()
    monkeypatch.setattr(positions, "CHUNK", 7)
    for a, b in zip(run(), one, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=0)


@pytest.mark.parametrize("T", [2, 3, 5, 13, 16, 64, 100, 257, 512, 4096, 65536])
def test_pair_plan_covers_every_bin_once(T):
    """The lone bins of the leading short segments and the groups of the later ones hold
    every position bin once: their count weights sum to T and to the bins' own in-bin pair
    counts; smooth node values give the bin sums to 1e-12."""
    nodes, _ = ta.causal_position_nodes(T)
    pl = positions._plan(T, tuple(nodes.tolist()), positions.VIRTUAL)
    g, n = fluct.position_bins(T)
    assert pl["bwa"].sum() + pl["wa"].sum() == pytest.approx(T, rel=1e-13)
    assert pl["bwe"].sum() + pl["we"].sum() == pytest.approx(0.5 * (n * (n - 1)).sum(),
                                                             rel=1e-13, abs=1e-13)
    assert np.all(np.diff(pl["bseg"]) >= 0) and pl["bseg"].size <= g.size
    m = nodes[:, None] ** np.array([-0.5, -0.3, 0.0, 0.2])
    yx = np.broadcast_to((1.0 / nodes)[:, None], m.shape)
    for a, b in zip(positions.pair_means(nodes, m, yx, T),
                    fluct.causal_pair_means(nodes, m, yx, T), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)


@pytest.mark.parametrize("T", [2, 3, 16])
def test_node_tables_hostile_inputs(T, per_position):
    """Short rows (T = 2, 3: only lone bins, or one node above t = 1), v from 0 to past the
    tables' grid and rho within 1e-12 of both ends, through the whole causal LayerNorm
    average: the one-pass tables equal the single tables (1e-13) and the cosine stays
    finite and within 1e-12 of the per-position reference."""
    d, h = 64, 12
    v = np.concatenate([[0.0, 1e-300, 1e-8], np.geomspace(1e-4, 1e3, 12), [2e4, 1e7]])
    rho = np.resize([0.0, 1e-12, 0.5, 1.0 - 1e-12, 1.0], v.size)
    nodes, _ = ta.causal_position_nodes(T)
    y2, yx = positions.node_tables(v, rho, nodes, d)
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
        st = ta.attention_stats(bp.sigma_s0, rho, T, d_head=d, causal=True)
        new = blocks._ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st)
        old = _old_ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st._replace(nodes=None))
        assert np.isfinite(new).all()
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-12)


# -------------------------------------------------------------------------------------------
# The position-averaged tables (module docstring of :mod:`.causal`, fourth step)
# -------------------------------------------------------------------------------------------
def _both(monkeypatch, fn):
    """``fn()`` with the tables and on the per-position path."""
    new = fn()
    monkeypatch.setattr(causal, "TABULATED", False)
    old = fn()
    monkeypatch.setattr(causal, "TABULATED", True)
    return new, old


@pytest.mark.parametrize("name", list(SPECS))
def test_tabulated_final_cos_grid_within_1e6(name, monkeypatch):
    """The stacks of :data:`SPECS` (12-24 layers) over beta 0..2.5, alpha 0..3: the final
    cosines with the tables within 1e-6 of the per-position path (measured: <= 3e-8 here and
    on the 64 x 64 diagrams of module docstring; uniform attention is not tabulated, and
    centred pre-LN uses only the attention averages)."""
    spec = ArchSpec(**SPECS[name])
    beta, alpha = np.linspace(0.0, 2.5, 9)[:, None], np.linspace(0.0, 3.0, 7)[None, :]
    new, old = _both(monkeypatch, lambda: depth.final_cos(spec, beta=beta, alpha_attn=alpha))
    assert np.array_equal(np.isnan(new), np.isnan(old))
    np.testing.assert_allclose(new, old, rtol=0, atol=1e-6)


def test_tabulated_diagram_and_predict_within_bounds(monkeypatch):
    """The diagram's alpha_crit (a 16-ary search to ~3e-5 relative) lands on the same
    candidates (measured: identical on 24 x 24 and on the benchmark's 256 x 256 at depth 60),
    rho_L within 1e-6 (measured 1e-8); a predict trajectory within 1e-6 (measured <= 2e-7 over
    72 specs, module docstring)."""
    spec = ArchSpec(depth=20, causal=True)
    new, old = _both(monkeypatch, lambda: diagram.compute(spec, n_beta=24, n_alpha=24,
                                                           with_rho=True))
    np.testing.assert_allclose(new.alpha_crit, old.alpha_crit, rtol=1e-4, atol=0)
    assert np.array_equal(new.regime, old.regime)
    np.testing.assert_allclose(new.rho_l, old.rho_l, rtol=0, atol=1e-6)
    spec = ArchSpec(depth=20, causal=True, beta=1.2, alpha_attn=0.4, rho0=0.1)
    new, old = _both(monkeypatch, lambda: depth.propagate(spec))
    assert list(new["observable"]) == list(old["observable"])
    np.testing.assert_allclose(new["value"].to_numpy(float), old["value"].to_numpy(float),
                               rtol=0, atol=1e-6)


def _table_inputs(n, rng):
    """Entries over the tables' whole domain: v from 0 (and 1e-300) to VMAX, rho with both
    ends, a0 / b from 0 to inf, a0 + b from 1e-3 to 1e3."""
    v = np.concatenate([[0.0, 1e-300, 1e-8, causal.VMAX],
                        10 ** rng.uniform(-6, np.log10(causal.VMAX), n - 4)])
    rho = rng.uniform(0, 1, n)
    rho[:6] = [0.0, 1.0, 1 - 1e-12, 1e-12, 0.5, 1.0]
    k = 10 ** rng.uniform(-8, 10, n)
    k[:4] = [0.0, 1e-300, 1e300, 1.0]
    s = 10 ** rng.uniform(-3, 3, n)
    a0, b = s * k / (1 + k), s / (1 + k)
    b[5], a0[6] = 0.0, 0.0
    return v, rho, a0, b


@pytest.mark.parametrize("T,d,h", [(2, 64, 12), (3, 64, 12), (16, 64, 12), (512, 64, 12),
                                   (128, 1024, 1)])
def test_tables_against_per_position_values(T, d, h):
    """Each table against the per-position values it interpolates, 4000 entries over its
    whole domain (:func:`_table_inputs`). Bounds (relative): the attention's Y2 and Yx
    averages 1e-5 (measured <= 1.2e-6), the LayerNorm pair means P0 and P1 3e-4 (measured
    <= 1.0e-4, at v ~ 1e3-1e4; below v = 100 <= 4.4e-5). The largest P1 errors sit at rho <
    0.05, where P1 < 0.005 P0, so the cosine ``c0 P0 + b P1`` moves far less."""
    rng = np.random.default_rng(T)
    v, rho, a0, b = _table_inputs(4000, rng)
    y2, yx, ok = causal.tabulated_attention(v, rho, T, d)
    exact = causal.att_exact(v, rho, T, d)
    e2, ex = exact.y2_mean, exact.yx_mean
    assert ok.all()
    np.testing.assert_allclose(y2, e2, rtol=1e-5, atol=0)
    np.testing.assert_allclose(yx, ex, rtol=1e-5, atol=0)
    p0, p1, ok = causal.tabulated_ln(v, rho, a0, b, yx, T, d, h)
    q0, q1 = causal._ln_exact(v, rho, a0, b, T, d, h)
    assert ok.all() and np.isfinite(p0).all() and np.isfinite(p1).all()
    np.testing.assert_allclose(p0, q0, rtol=3e-4, atol=0)
    np.testing.assert_allclose(p1, q1, rtol=3e-4, atol=0)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a NaN entry: no cast warning either
def test_entries_off_the_tables_take_the_per_position_path(monkeypatch):
    """v above :data:`causal.VMAX`, NaN, a negative a0: the LayerNorm average and the
    attention averages equal the per-position path's (1e-13; they run it on those entries),
    mixed in one call with entries on the tables."""
    T, d, h = 512, 64, 12
    v = np.array([2e4, np.nan, 3.0, 0.5, 1e5, 2.0])
    rho = np.array([0.3, 0.5, 0.2, 0.9, 0.0, 0.4])
    bp = blocks.BlockParams.from_spec(ArchSpec(causal=True, seq_len=T, d_model=d * h,
                                               heads=h), sigma_s0=np.sqrt(v / (1 - rho)))
    qa, pa = np.ones_like(v), rho.copy()
    q_z = np.array([1.3, 1.2, 1.1, 1.4, 1.2, -0.2])  # the last: a0 < 0
    p_z = 0.5 * q_z

    def run():
        st = ta.attention_stats(bp.sigma_s0, rho, T, d_head=d, causal=True)
        return st.y2, st.yx, blocks._ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st)

    new, old = _both(monkeypatch, run)
    off = np.array([True, True, False, False, True, False])
    for a, b in zip(new, old, strict=True):
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a[off], b[off], rtol=1e-13, atol=0)
        np.testing.assert_allclose(a[~off], b[~off], rtol=0, atol=1e-6)
    assert np.isfinite(new[2][[0, 2, 3, 4, 5]]).all()


@pytest.mark.parametrize("T", [2, 3, 16])
def test_tables_hostile_inputs(T, monkeypatch):
    """The inputs of :func:`test_node_tables_hostile_inputs` (v from 0 past the tables, rho
    within 1e-12 of both ends, residual weights 1e-6..1e4) through the tabulated LayerNorm
    average: finite, and within 1e-6 of the per-position path (measured <= 1e-8)."""
    d, h = 64, 12
    v = np.concatenate([[0.0, 1e-300, 1e-8], np.geomspace(1e-4, 1e3, 12), [2e4, 1e7]])
    rho = np.resize([0.0, 1e-12, 0.5, 1.0 - 1e-12, 1.0], v.size)
    bp = blocks.BlockParams.from_spec(ArchSpec(causal=True, seq_len=T, d_model=d * h,
                                               heads=h), sigma_s0=np.sqrt(v))
    qa, pa = np.ones_like(v), rho.copy()
    for alpha2 in (1e-6, 1.0, 1e4):
        q_z, p_z = alpha2 + 0.3 * (1 + rho), alpha2 * rho + 0.3 * (2 * rho)

        def run(q_z=q_z, p_z=p_z):
            st = ta.attention_stats(bp.sigma_s0, rho, T, d_head=d, causal=True)
            return blocks._ln_fluct_cos_causal(q_z, p_z, qa, pa, bp, st)

        new, old = _both(monkeypatch, run)
        assert np.isfinite(new).all()
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_tabulated_layernorm_average_matches_simulation(monkeypatch):
    """The tabulated theory against the torch stack: one causal post-LN layer without residual
    (the setting of tests/measurement/test_agreement_variants.py section 5, d = 512, linear
    MLP), 6 seeds x 2 sequences. Measured cos / theory with the tables / ratio of averages:
      T 256, 1 head, beta 1.5, rho_in 0.3:   0.6571 / 0.6583 / 0.6201   (stderr 0.0055)
      T 256, 4 heads, beta 2, rho_in 0.3:   0.5424 / 0.5417 / 0.5292   (stderr 0.0048)
      T 512, 8 heads, beta 2, rho_in 0.6:   0.8764 / 0.8724 / 0.8686   (stderr 0.0033)
    Tolerance 0.012: about two standard errors of the simulation (seeds) plus the finite-d,
    finite-T gap of the theory itself (0.0035 with 4x the seeds in that file's test); the
    tables move these cosines by < 1e-7 (asserted below at 1e-6), so the tolerance is the
    theory's, not the tables'. That the LayerNorm average is what is tested: the ratio of
    averages misses the first point by 0.037 (asserted > 0.02). ~30 s (three measurements):
    slow; the same section of test_agreement_variants.py runs the tabulated theory too."""
    from sigprop.measurement.engine import measure

    def at(df):
        return df[(df.observable == "cos") & (df.layer == 1)]["value"].item()

    for beta, rho, heads, T in ((1.5, 0.3, 1, 256), (2.0, 0.3, 4, 256), (2.0, 0.6, 8, 512)):
        spec = ArchSpec(depth=1, beta=beta, d_model=512, heads=heads, seq_len=T, rho0=rho,
                        causal=True, alpha_attn=0.0, alpha_mlp=0.0, activation="linear",
                        sigma_v2=1.0, sigma_w2=1.0)
        m = measure(spec, seeds=6, sequences=2, input="rho", rho0=rho, stable_rank=False)
        r0 = max(m.rho0, 0.0)
        meas = at(m.trajectory)
        tab, exact = _both(monkeypatch, lambda spec=spec, r0=r0: at(depth.propagate(spec,
                                                                                  rho0=r0)))
        assert abs(tab - exact) < 1e-6
        assert abs(tab - meas) < 0.012, (beta, rho, heads, T, meas, tab)
        if heads == 1:
            assert meas - at(depth.propagate(spec, rho0=r0, fluctuations=False)) > 0.02


@pytest.mark.parametrize("n", [4, 5, 21, 250, 438])  # 438: the REM tables to 1e16
def test_notaknot_spline_equals_scipy(n):
    """The tables' NumPy spline fit (:func:`rem_tables.notaknot`, so that loading them needs no
    scipy.interpolate) against scipy's not-a-knot CubicSpline: the same coefficients to
    roundoff (measured <= 3e-14 of the largest at 250 nodes)."""
    from scipy import interpolate

    rng = np.random.default_rng(n)
    x = np.linspace(-1.3, 2.0, n)
    y = rng.normal(size=(3, n, 5))
    ref = interpolate.CubicSpline(x, y, axis=1).c
    np.testing.assert_allclose(rem_tables.notaknot(x, y, 1), ref, rtol=0,
                               atol=1e-12 * np.abs(ref).max())
