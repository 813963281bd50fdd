"""Attention sinks and output gates: the theory (docs/theory.md §2.4.3-2.4.4) against
sigprop's own torch stack built from the same spec (float64, d = 256, 4 heads of 64, T = 64).

Tolerance 0.03 absolute on the branch's variance and cosine and on the stack's per-layer
cosine, means over 2 seeds x 32 sequences: the seed-to-seed scatter of the branch variance at
rho = 0.5 is ~0.02 (each sequence and head draws one common score part rho Q_u.K_u that all
its rows share), and the plain softmax theory itself sits ~0.01 from these measurements
(finite width: the score variance of a head given its weights fluctuates, which the chi2
average over query norms does not cover). beta = 2.5 at rho = 0.5 is above condensation
(beta_c = 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sigprop.measurement.observables import mean_cos
from sigprop.nn.model import SigpropTransformer, normalise
from sigprop.spec import ArchSpec, LayerSpec
from sigprop.theory import blocks, depth

T, D, H = 64, 256, 4
TOL = 0.03


def _spec(beta, depth_=1, causal=False, norm="pre", **kw):
    sig = beta * np.sqrt(np.log(T))
    lay = LayerSpec(sigma_s=(sig,) * H, var_v=1.0, var_o=1.0, var_w_in=2.0, var_w_out=1.0,
                    **kw)
    return ArchSpec(depth=depth_, d_model=D, heads=H, seq_len=T, norm=norm, causal=causal,
                    layers=(lay,) * depth_)


def _tokens(B, rho, seed):
    """Unit tokens at cosine rho: sqrt(rho) u + sqrt(1 - rho) z_a, RMS-normalised."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(1, B, 1, D, generator=g, dtype=torch.float64)
    z = torch.randn(1, B, T, D, generator=g, dtype=torch.float64)
    return normalise(np.sqrt(rho) * u + np.sqrt(1 - rho) * z, "rms")


def _measure_branch(spec, rho, seeds=(0, 1), B=32):
    q, c = [], []
    for sd in seeds:
        m = SigpropTransformer(spec, n_seeds=1, seed=sd, dtype=torch.float64)
        with torch.no_grad():
            o = m.blocks[0].attn(_tokens(B, rho, 100 + sd)).out
        q.append(float(o.square().mean()))
        c.append(float(mean_cos(o).mean()))
    return np.mean(q), np.mean(c)


def _theory_branch(spec, rho, use_layer=True):
    bp = blocks.BlockParams.from_spec(spec, 1)
    if not use_layer:
        bp = blocks.BlockParams(**{**bp.__dict__, "sink": None, "gate": None})
    st = blocks._head_stats(bp, 1.0, rho, asymptotic=False, full=False)[0]
    qa, pa = blocks.attention_map(1.0, rho, st, variant="softmax", var_v=bp.var_v,
                                  var_b=bp.var_b, var_o=bp.var_o,
                                  gate=blocks.gate_factors(bp, 1.0, rho))
    return float(qa), float(pa / qa)


def _measure_stack(spec, seeds=(0, 1), B=16):
    out = []
    for sd in seeds:
        m = SigpropTransformer(spec, n_seeds=1, seed=sd, dtype=torch.float64)
        with torch.no_grad():
            res = m(_tokens(B, 0.0, 100 + sd), return_stats=False)
        out.append([float(mean_cos(h).mean()) for h in res.hidden])
    return np.mean(out, axis=0)


def _theory_stack(spec):
    tr = depth.propagate(spec)
    return tr[tr.observable == "cos"].sort_values("layer").value.to_numpy()


@pytest.mark.parametrize("beta", [1.0, 2.5])
@pytest.mark.parametrize("sink", [-2.0, 0.0, 2.0, 5.0])
def test_sink_branch_matches_torch(beta, sink):
    spec = _spec(beta, sink_logit=(sink,) * H)
    for rho in (0.0, 0.5):
        mq, mc = _measure_branch(spec, rho)
        tq, tc = _theory_branch(spec, rho)
        assert abs(mq - tq) < TOL and abs(mc - tc) < TOL, (rho, mq, tq, mc, tc)


@pytest.mark.parametrize("beta", [1.0, 2.5])
@pytest.mark.parametrize("gate_std, bias2", [(0.5, 0.0), (1.0, 0.0), (3.0, 0.0), (1.0, 1.0)])
def test_gate_branch_matches_torch(beta, gate_std, bias2):
    spec = _spec(beta, gate_var=gate_std**2, gate_bias2=bias2)
    for rho in (0.0, 0.5):
        mq, mc = _measure_branch(spec, rho)
        tq, tc = _theory_branch(spec, rho)
        assert abs(mq - tq) < TOL and abs(mc - tc) < TOL, (rho, mq, tq, mc, tc)


def test_the_check_can_fail():
    """Leaving the sink or the gate out of the theory misses the measured branch by far more
    than the tolerance: the comparison above has power."""
    for kw in (dict(sink_logit=(5.0,) * H), dict(gate_var=1.0)):
        spec = _spec(1.0, **kw)
        mq, _ = _measure_branch(spec, 0.5)
        tq, _ = _theory_branch(spec, 0.5, use_layer=False)
        assert abs(mq - tq) > 0.2, (kw, mq, tq)


@pytest.mark.parametrize("beta", [1.0, 2.5])
def test_stack_cos_matches_torch(beta):
    """Three pre-LN blocks with mixed per-head sinks and a gate, from orthogonal tokens."""
    spec = _spec(beta, depth_=3, sink_logit=(-2.0, 0.0, 2.0, 5.0), gate_var=1.0)
    err = np.abs(_measure_stack(spec) - _theory_stack(spec))
    assert err.max() < TOL, err


def test_sink_weights_and_stats_in_torch():
    """The torch rows: weights = softmax x sigmoid(logsumexp - sink); the row statistics are
    those of the renormalised rows (the ordinary softmax)."""
    spec = _spec(1.0, sink_logit=(5.0, 0.0, -2.0, 2.0))
    plain = _spec(1.0)
    x = _tokens(2, 0.2, 7)
    m = SigpropTransformer(spec, n_seeds=1, seed=3, dtype=torch.float64)
    m0 = SigpropTransformer(plain, n_seeds=1, seed=3, dtype=torch.float64)
    with torch.no_grad():
        att = m.blocks[0].attn(x, return_stats=True, return_probs=True)
        att0 = m0.blocks[0].attn(x, return_stats=True, return_probs=True)
        z = m.blocks[0].attn.scores(x)
    sk = torch.tensor([5.0, 0.0, -2.0, 2.0], dtype=torch.float64).view(1, 1, H, 1, 1)
    full = torch.softmax(torch.cat([z, sk.expand(*z.shape[:-1], 1)], dim=-1), dim=-1)
    torch.testing.assert_close(att.probs, full[..., :-1])
    for key in att.stats:
        torch.testing.assert_close(att.stats[key], att0.stats[key])


@pytest.mark.slow
@pytest.mark.parametrize("beta", [1.0, 2.5])
def test_causal_and_post_ln_stacks_match_torch(beta):
    """Causal rows (per-position sink masses, §2.4.3) and post-LN (ratio of averages with
    sinks and gates)."""
    for causal, norm in ((True, "pre"), (False, "post"), (True, "post")):
        for kw in (dict(sink_logit=(5.0,) * H), dict(gate_var=9.0),
                   dict(sink_logit=(-2.0, 0.0, 2.0, 5.0), gate_var=1.0)):
            spec = _spec(beta, depth_=3, causal=causal, norm=norm, **kw)
            err = np.abs(_measure_stack(spec) - _theory_stack(spec))
            assert err.max() < TOL, (causal, norm, kw, err)
