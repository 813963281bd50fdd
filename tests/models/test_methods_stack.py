"""The fix registry on sigprop's own stack (docs/fixes.md, "on sigprop's stack"): every
method either patches the stack's spec or is refused in one line; the stack's patch has the
HF patch's effect; sigma-reparam's definition holds on every seed slice; theory and
simulation of each fixed stack agree."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sigprop.models import methods as M
from sigprop.models.methods.stack import NOT_ON_STACK, fix_spec
from sigprop.spec import ArchSpec, SpecError

SPEC = ArchSpec(depth=6, d_model=128, heads=4, seq_len=32, init_std=0.02)
ON_STACK = [n for n in M.names() if n not in NOT_ON_STACK]
#: methods that act on a pre-LN stack only (refused on SPEC's post-LN): run on its pre-LN twin
PRE_LN_ONLY = ("peri-ln", "ln-scaling", "mix-ln")


def _spec_for(name: str) -> ArchSpec:
    return SPEC.replace(norm="pre") if name in PRE_LN_ONLY else SPEC


def test_every_method_patches_the_stack_or_is_refused_in_one_line():
    assert set(NOT_ON_STACK) == {"softcap", "mimetic", "softpick", "hyper-connections",
                                 "ngpt"}
    for name in M.names():
        if name in NOT_ON_STACK:
            with pytest.raises(SpecError) as err:
                fix_spec(SPEC, name)
            assert name in str(err.value) and "\n" not in str(err.value)
            continue
        fx = fix_spec(_spec_for(name), name)
        assert fx.spec.layers is not None and len(fx.spec.layers) == SPEC.depth
        assert fx.applied[0]["method"] == name and fx.changes


# methods whose effect is a function of depth and T alone: the stack's patch and the HF patch
# (on a BERT of the same depth) must change the per-layer variances by the same factors
CONSTANT = ["deepnorm", "admin", "skipinit", "layerscale", "depth-mup", "tfixup",
            "deepscalelm", "rezero", "shaped"]


@pytest.mark.parametrize("name", CONSTANT)
def test_stack_patch_has_the_hf_patch_effect(name):
    from sigprop.models import model_at_init, shrink
    from sigprop.models.arch import spec_from_config

    cfg = shrink("bert-base-uncased", layers=SPEC.depth, hidden=64, heads=4, intermediate=256)
    model = model_at_init(cfg, seed=0)
    hspec = spec_from_config(cfg, seq_len=SPEC.seq_len)
    ctx = M.context_for(model, hspec)
    rep = M.apply_methods(model, [name], None, ctx)
    fx = fix_spec(SPEC, name)
    for key in ("qk", "v", "o", "mlp_in", "mlp_out", "gate_attn", "gate_mlp", "lam_attn",
                "lam_mlp"):
        np.testing.assert_allclose(getattr(fx.effect, key), getattr(rep.effect, key),
                                   rtol=1e-12, err_msg=key)
    assert (fx.effect.norm, fx.effect.attention, fx.effect.zero_q) == \
        (rep.effect.norm, rep.effect.attention, rep.effect.zero_q)


def test_sigma_reparam_sets_every_slice_to_spectral_norm_one():
    """W <- W / sigma(W) on W_Q and W_K of every block and seed slice (to 1e-4: float32
    weights), and the theory's score std is the one of the draw it read (slice 0)."""
    from sigprop.models.methods.parts import spectral_norm

    fx = fix_spec(SPEC, "sigma-reparam", seed=3)
    model = fx.model(n_seeds=3, seed=3)
    for i, blk in enumerate(model.blocks):
        for w in (blk.attn.w_q, blk.attn.w_k):
            for s in range(3):
                assert abs(spectral_norm(w[s]) - 1.0) < 1e-4
        # slice 0: score std sigma_q sigma_k d = the spec's (the draw was only rescaled)
        d = SPEC.d_model
        got = float(blk.attn.w_q[0].detach().double().std()
                    * blk.attn.w_k[0].detach().double().std()) * d
        assert got == pytest.approx(fx.spec.layers[i].sigma_s[0], rel=2e-2)
    fx_all = fix_spec(SPEC, "sigma-reparam", {"sigma-reparam": {"targets": "all"}})
    assert set(fx_all.renorm) == {"q", "k", "v", "o", "mlp_in", "mlp_out"}
    assert fix_spec(SPEC, "sigma-reparam", {"sigma-reparam": {"init": "sigma"}}).spec \
        .layers[0].sigma_s == pytest.approx(fix_spec(SPEC, "beta", {"beta": {
            "beta": SPEC.beta_eff}}).spec.layers[0].sigma_s, rel=1e-12)


FAST = ("sigma-reparam", "deepnorm", "rezero", "shaped")  # the rest in the slow suite


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in ON_STACK])
def test_fixed_stack_theory_matches_its_simulation(name):
    """Each fixed stack through the engine (2 seeds x 2 sequences, d 128, T 32, 6 blocks)
    against the theory of its fixed spec: cos within 0.03 and entropy within 0.03 per layer
    (finite d_head = 32 and 4 draws: the agreement tests see ~0.01-0.02 at this size; at d
    256, T 64, 12 blocks every method measured within 0.007 on cos)."""
    from sigprop.analysis.measure import measure

    m = measure(_spec_for(name), seeds=2, sequences=2, methods=name)
    assert m.info["methods"]["methods"][0]["method"] == name
    assert m.max_abs_error["cos"] < 0.03, m.max_abs_error
    assert m.max_abs_error["entropy"] < 0.03, m.max_abs_error


def test_cli_predict_and_measure_take_methods():
    """In process (``cli.run``; the shell path of these options is common.stack_methods,
    shared with every spec command): JSON with the fixed spec, and one-line exit-2 errors."""
    from ..clirun import sigprop

    base = ["--depth", "4", "--d-model", "64", "--heads", "4", "--seq-len", "16"]
    r = sigprop("predict", *base, "--method", "deepnorm", "--format", "json")
    assert r.exit_code == 0, r.output
    lay = json.loads(r.stdout)["spec"]["layers"]
    small = ArchSpec(depth=4, d_model=64, heads=4, seq_len=16)
    assert len(lay) == 4 and lay[0]["var_v"] == pytest.approx(
        small.var_v * (8 * 4) ** -0.5, rel=1e-9)   # deepnorm beta^2 = (8 L)^-1/2
    r = sigprop("measure", *base, "--seeds", "1", "--sequences", "1", "--method",
                            "depth-mup", "--param", "a=2", "--format", "json", "--no-timing")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["methods"]["methods"][0]["params"] == {"a": 2.0}
    r = sigprop("measure", *base, "--seeds", "1", "--sequences", "1", "--method",
                            "deepnorm")
    assert r.exit_code == 0 and "fix deepnorm: W_V, W_O, MLP x beta" in r.stdout, r.output
    for args, needle in ((["--method", "softcap"], "--method: softcap"),
                         (["--param", "a=1"], "--param: needs --method"),
                         (["--method", "nope"], "--method")):
        r = sigprop("predict", *base, *args)
        err = r.stderr
        assert r.exit_code == 2 and needle in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1


def test_torch_is_deterministic_under_the_seed():
    a = fix_spec(SPEC, "sigma-reparam", seed=1).model(n_seeds=1, seed=1)
    b = fix_spec(SPEC, "sigma-reparam", seed=1).model(n_seeds=1, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
