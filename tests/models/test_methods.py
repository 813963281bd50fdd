"""The fix registry (sigprop.models.methods): every method's patch checked against its
definition by an independent computation, the written folder reloaded for every method and
family, the theory map checked against the patched weights, and the registry's front door
(names, parameters, errors)."""

from __future__ import annotations

import copy
import importlib
import math

import numpy as np
import pytest
import torch

from sigprop import models as hf
from sigprop.models import methods as M
from sigprop.models.methods.parts import block_parts, spectral_norm, weight_of
from sigprop.models.presets import PRESETS, shrink
from sigprop.spec import SpecError

SMALL = dict(layers=3, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100)
FAMILIES = ("bert-base-uncased", "gpt2", "llama-3.2-1b")
#: the issue's table, every row (sigprop's own: beta window, alpha auto, centred, length)
TABLE = ("sigma-reparam", "qk-norm", "softcap", "deepnorm", "admin", "rezero", "skipinit",
         "layerscale", "depth-mup", "tfixup", "deepscalelm", "shaped", "mimetic", "beta",
         "alpha", "centred", "length-scaling")
#: the attention fixes of 2024-2025 (issue 38; their own checks: test_methods_attention_2024.py)
TABLE += ("sigmoid-attn", "softpick", "sinks", "gated-attn", "diff-attn")


def _model(family, seed=0, impl="sdpa", initializer_range=None, **over):
    cfg = shrink(PRESETS[family], **{**SMALL, **over})
    if initializer_range is not None:
        cfg["initializer_range"] = initializer_range
    return hf.model_at_init(hf.load_config(cfg), seed=seed, attn_implementation=impl)


def _ids(T=16, seed=1):
    return torch.randint(0, 100, (2, T), generator=torch.Generator().manual_seed(seed))


def _apply(model, names, params=None, T=16):
    spec, _ = hf.spec_and_info(model.config, T)
    ctx = M.context_for(model, spec)
    return M.apply_methods(model, list(names), params or {}, ctx)


def _out(model, ids, **kw):
    with torch.no_grad():
        return model(input_ids=ids, **kw)


# ---- the registry ------------------------------------------------------------------------------
def test_registry_holds_every_method_of_the_table():
    assert set(TABLE) <= set(M.names())
    assert len(M.names()) >= 12
    for name in M.names():
        m = M.get(name)
        assert m.title and m.cite and m.acts and m.theory, name
        spec = hf.spec_from_config(_model("bert-base-uncased").config, 16)
        ctx = M.Context(spec=spec)
        try:
            p = m.resolve(ctx)
        except SpecError:  # alpha auto may refuse a model; the message names the field
            continue
        assert set(p) == {q.name for q in m.params}


def test_runtime_methods_are_the_ones_that_change_the_forward_pass():
    # by hand from docs/fixes.md: the methods whose forward pass a reload must re-install
    want = {"admin", "deepnorm", "deepscalelm", "depth-mup", "layerscale", "qk-norm", "rezero",
            "shaped", "skipinit", "softcap", "tfixup"}
    # the residual-stream fixes of 2024-2026 (their checks: test_methods_residual_2024.py)
    want |= {"value-residual", "ngpt", "hyper-connections"}
    # the norm-placement fixes of 2024-2025 (their checks: test_methods_norms_2024.py)
    want |= {"peri-ln", "ln-scaling", "mix-ln", "dyt"}
    # the attention fixes of 2024-2025 (their checks: test_methods_attention_2024.py)
    want |= {"sigmoid-attn", "softpick", "sinks", "gated-attn", "diff-attn"}
    assert {n for n in M.names() if M.get(n).runtime} == want


def test_method_words_live_in_methods_toml(monkeypatch):
    base = importlib.import_module("sigprop.models.methods.base")
    assert base.REGISTRY["admin"].cite == "Liu et al., EMNLP 2020"

    class Mine(M.Method):  # a user's method: no entry, its own words stand
        name = "test-mine"
        title, cite, acts = "mine", "me", "nothing"

    monkeypatch.setattr(base, "REGISTRY", dict(base.REGISTRY))
    base.register(Mine)
    assert base.REGISTRY["test-mine"].title == "mine"

    class Clash(M.Method):  # a different word for a method that has an entry is refused
        name = "admin"
        cite = "someone else"

    monkeypatch.setattr(base, "REGISTRY", {})
    with pytest.raises(ValueError, match="differs from methods.toml"):
        base.register(Clash)


@pytest.mark.parametrize("text, params, needle", [
    ("nope", [], "method: unknown method 'nope'"),
    ("softcap,softcap", [], "named twice"),
    ("softcap", ["cap=-1"], "softcap.cap: must be a number in"),
    ("softcap", ["cap=abc"], "softcap.cap: must be a number in"),
    ("softcap", ["nope=1"], "no chosen method takes 'nope'"),
    ("softcap", ["admin.omega=2"], "'admin' is not among the chosen methods"),
    ("qk-norm", ["scope=row"], "qk-norm.scope: must be one of head, proj"),
    ("sigma-reparam", ["targets"], "param: must look like METHOD.NAME=VALUE"),
])
def test_bad_methods_and_parameters_name_the_field(text, params, needle):
    m = _model("bert-base-uncased")
    with pytest.raises(SpecError) as err:
        names = M.parse_methods(text)
        _apply(m, names, M.parse_params(params, names))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


# ---- every method, every family: the written folder reloads to the same outputs ---------------
#: Llama (GQA, RoPE, RMSNorm, gated MLP) in the default suite for the methods that touch Q/K/V
#: heads or the attention function; the rest in the slow suite (BERT and GPT-2 run all)
_LLAMA_DEFAULT = ("sigma-reparam", "qk-norm", "softcap", "shaped", "mimetic", "rezero", "beta")
#: GPT-2's constant residual multipliers take the same folding path as BERT's: slow suite
_GPT2_SLOW = ("admin", "depth-mup", "deepscalelm", "skipinit")
_RELOAD = [pytest.param(f, n, marks=pytest.mark.slow if (f == "llama-3.2-1b" and n not in
                                                         _LLAMA_DEFAULT)
                        or (f == "gpt2" and n in _GPT2_SLOW) else ()) for f in FAMILIES
           for n in TABLE]


@pytest.mark.parametrize("family, name", _RELOAD)
def test_written_folder_reloads_the_patched_model(tmp_path, family, name):
    """save_pretrained + sigprop's loader reproduce the patched model's outputs to 1e-6
    (same attention implementation on both sides), through both loaders (from_pretrained,
    and model_at_init + load_local_weights as diagnose reads a folder)."""
    m = _model(family)
    ids = _ids()
    plain = _out(m, ids).last_hidden_state
    _apply(m, [name])
    want = _out(m, ids).last_hidden_state
    m.save_pretrained(tmp_path, safe_serialization=True)
    back = hf.from_pretrained(tmp_path).eval()
    got = _out(back, ids).last_hidden_state
    scale = max(1.0, float(want.abs().max()))
    assert float((got - want).abs().max()) <= 1e-6 * scale, name
    m2 = hf.model_at_init(hf.load_config(tmp_path), seed=7)
    rep = hf.load_local_weights(m2, tmp_path)
    assert not [k for k in rep.missing if "sigprop_" in k]
    got2 = _out(m2, ids).last_hidden_state
    assert float((got2 - want).abs().max()) <= 1e-6 * scale, name
    if name not in ("alpha", "length-scaling", "softcap"):  # no-ops on this tiny model
        assert float((want - plain).abs().max()) > 1e-4, f"{name} changed nothing"


def test_importing_the_loader_registers_the_attention_function(tmp_path):
    from transformers import AttentionInterface, AutoModel

    assert "sigprop" in AttentionInterface._global_mapping
    m = _model("gpt2")
    _apply(m, ["centred", "softcap"], {"softcap": {"cap": 0.5}})
    ids = _ids()
    want = _out(m, ids).last_hidden_state
    m.save_pretrained(tmp_path)
    plain = AutoModel.from_pretrained(tmp_path, attn_implementation="sigprop").eval()
    assert torch.allclose(_out(plain, ids).last_hidden_state, want, atol=1e-6)


# ---- each patch against its definition --------------------------------------------------------
@pytest.mark.parametrize("family", ["bert-base-uncased", "gpt2"])
def test_sigma_reparam_sets_the_spectral_norms(family):
    m = _model(family, initializer_range=0.2)
    before = copy.deepcopy(m)
    _apply(m, ["sigma-reparam"])
    for p in block_parts(m):
        for t in p.q + p.k:  # GPT-2: the Q and K blocks of the fused c_attn, each
            w = weight_of(t).detach().double()
            assert abs(float(torch.linalg.matrix_norm(w, 2)) - 1) < 1e-4
        for t in p.v:
            assert abs(spectral_norm(weight_of(t)) - 1) > 0.1  # targets=qk leaves V alone
    _apply(m, ["sigma-reparam"], {"sigma-reparam": {"targets": "all"}})
    for p in block_parts(m):
        for mod in (p.o, p.mlp_out):
            assert abs(spectral_norm(weight_of((mod, None, 0))) - 1) < 1e-4
    _apply(before, ["sigma-reparam"], {"sigma-reparam": {"init": "sigma"}})
    ref = _model(family, initializer_range=0.2)
    for a, b in zip(before.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)  # gamma = sigma(W_init): unchanged at init


@pytest.mark.parametrize("depth, causal", [(6, False), (48, False), (12, True)])
def test_deepnorm_constants_and_weights(depth, causal):
    """alpha = (2N)^1/4, beta = (8N)^-1/4 (encoder-only N, decoder-only M alike); V, O and
    the MLP weights times beta, and post-LN LN(alpha x + f) moved onto the branches as a
    constant gate 1 / alpha on O and the MLP's output (a buffer: not trained, not in the
    weights)."""
    fam = "gpt2" if causal else "bert-base-uncased"
    m = _model(fam, layers=depth)
    spec, _ = hf.spec_and_info(m.config, 16)
    p = M.get("deepnorm").resolve(M.Context(spec=spec))
    assert p["alpha"] == pytest.approx((2 * depth) ** 0.25, rel=1e-12)
    assert p["beta"] == pytest.approx((8 * depth) ** -0.25, rel=1e-12)
    if depth != 6:
        return
    ref = copy.deepcopy(m)
    _apply(m, ["deepnorm"])
    a, b = p["alpha"], p["beta"]
    for new, old in zip(block_parts(m), block_parts(ref), strict=True):
        assert torch.allclose(weight_of(new.v[0]), b * weight_of(old.v[0]))
        assert torch.allclose(weight_of(new.q[0]), weight_of(old.q[0]))
        for mod, was in ((new.o, old.o), (new.mlp_out, old.mlp_out)):
            assert torch.allclose(mod.weight, b * was.weight)
            gate = mod.sigprop_gate
            assert not isinstance(gate, torch.nn.Parameter)
            assert float(gate) == pytest.approx(1 / a, rel=1e-6)


def test_deepnorm_post_ln_forward_is_ln_of_alpha_x_plus_f():
    """The folded model equals BERT whose blocks compute LN(alpha x + f(x)) with V, O, MLP
    scaled by beta (patched forwards). Tolerance 1e-4: float32 and LN eps."""
    m = _model("bert-base-uncased")
    ref = copy.deepcopy(m)
    rep = _apply(m, ["deepnorm"])
    a, b = rep.applied[0]["params"]["alpha"], rep.applied[0]["params"]["beta"]
    with torch.no_grad():
        for layer in ref.encoder.layer:
            for lin in (layer.attention.self.value, layer.attention.output.dense,
                        layer.intermediate.dense, layer.output.dense):
                lin.weight.mul_(b)
                lin.bias.mul_(b)
            for out in (layer.attention.output, layer.output):
                out.forward = (lambda h, x, o=out: o.LayerNorm(o.dense(h) + a * x))
    ids = _ids()
    assert torch.allclose(_out(m, ids).last_hidden_state, _out(ref, ids).last_hidden_state,
                          atol=1e-4)


@pytest.mark.parametrize("depth", [3, 6, 24])
def test_admin_omega_closed_form(depth):
    n = 2 * depth  # residual branches
    spec, _ = hf.spec_and_info(_model("bert-base-uncased", layers=depth).config, 16)
    w = M.get("admin").resolve(M.Context(spec=spec))["omega"]
    assert w == pytest.approx(math.sqrt((n + 1) / math.log(n + 1) - 1), rel=1e-12)
    if depth == 6:
        assert w == pytest.approx(2.017, abs=1e-3)  # n = 12, the package's worked value


def test_rezero_blocks_are_the_identity_at_init():
    m = _model("bert-base-uncased")
    _apply(m, ["rezero"])
    out = _out(m, _ids(), output_hidden_states=True).hidden_states
    for h in out[1:]:
        assert torch.equal(h, out[0])
    gates = [p for n, p in m.named_parameters() if n.endswith("sigprop_gate")]
    assert len(gates) == 2 * 3 and all(float(g.detach()) == 0.0 and g.requires_grad
                                       for g in gates)
    assert not any(type(x).__name__ == "LayerNorm" for x in m.encoder.modules())


@pytest.mark.parametrize("depth, eps", [(12, 0.1), (18, 0.1), (24, 1e-5), (36, 1e-6)])
def test_layerscale_eps_by_depth(depth, eps):
    spec, _ = hf.spec_and_info(_model("gpt2", layers=depth).config, 16)
    assert M.get("layerscale").resolve(M.Context(spec=spec))["eps"] == eps
    if depth == 12:
        m = _model("gpt2", layers=depth)
        _apply(m, ["layerscale"])
        g = [p for n, p in m.named_parameters() if n.endswith("sigprop_gate")]
        assert len(g) == 2 * depth and all(x.shape == (64,) for x in g)
        assert all(torch.all(x == torch.tensor(0.1)) for x in g)


def test_skipinit_and_depth_mup_multipliers():
    m = _model("gpt2", layers=8)
    ref = copy.deepcopy(m)
    _apply(m, ["depth-mup"])
    g = torch.Generator().manual_seed(0)
    for new, old in zip(block_parts(m), block_parts(ref), strict=True):  # pre-LN: a / sqrt L
        for mod, was in ((new.o, old.o), (new.mlp_out, old.mlp_out)):
            assert torch.equal(mod.weight, was.weight)  # a constant gate, not in the weights
            assert "sigprop_gate" not in dict(mod.named_parameters())
            x = torch.randn(3, mod.weight.shape[0], generator=g)  # GPT-2's Conv1D: (in, out)
            with torch.no_grad():
                assert torch.allclose(mod(x), was(x) / math.sqrt(8), atol=1e-7)
    spec, _ = hf.spec_and_info(m.config, 16)
    assert M.get("skipinit").resolve(M.Context(spec=spec))["alpha"] == pytest.approx(0.25)


@pytest.mark.parametrize("family, want", [("bert-base-uncased", 0.67 * 6 ** -0.25),
                                          ("gpt2", (9 * 6) ** -0.25)])
def test_tfixup_removes_norms_and_scales_by_depth(family, want):
    m = _model(family, layers=6)
    ref = copy.deepcopy(m)
    rep = _apply(m, ["tfixup"])
    assert rep.applied[0]["params"]["factor"] == pytest.approx(want, rel=1e-12)
    for new, old in zip(block_parts(m), block_parts(ref), strict=True):
        assert not [n for n, x in new.block.named_modules() if "Norm" in type(x).__name__]
        assert torch.allclose(new.mlp_out.weight, want * old.mlp_out.weight)
    assert rep.after.norm == "none"


def test_deepscalelm_residual_is_unit_norm():
    m = _model("gpt2", layers=8)
    spec, _ = hf.spec_and_info(m.config, 16)
    rep = _apply(m, ["deepscalelm"])
    e = rep.effect
    assert np.allclose(e.lam_attn ** 2 + e.gate_attn ** 2, 1.0)
    assert np.allclose(e.gate_attn ** 2, 2.0 / 8)


@pytest.mark.parametrize("scope", ["head", "proj"])
def test_qk_norm_gives_unit_rms_queries(scope):
    m = _model("llama-3.2-1b")
    _apply(m, ["qk-norm"], {"qk-norm": {"scope": scope}})
    p = block_parts(m)[0]
    seen = {}
    p.site.q.register_forward_hook(lambda _m, _a, out: seen.setdefault("q", out))
    _out(m, _ids())
    q = seen["q"]
    width = p.head_dim if scope == "head" else q.shape[-1]
    rms = q.reshape(*q.shape[:-1], -1, width).square().mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
    assert [n for n, _ in m.named_parameters() if n.endswith("sigprop_q_norm")]


def test_qk_norm_refuses_a_model_that_has_it():
    cfg = shrink(PRESETS["qwen2-0.5b"], **SMALL)
    cfg.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16)
    m = hf.model_at_init(hf.load_config(cfg), seed=0)
    with pytest.raises(SpecError, match="already normalises q and k"):
        _apply(m, ["qk-norm"])


def test_softcap_bounds_the_scores():
    """With Q/K x 30, rows of attention differ by at most exp(2 cap) between keys."""
    m = _model("bert-base-uncased", initializer_range=0.6)
    cap = 1.5
    _apply(m, ["softcap"], {"softcap": {"cap": cap}})
    att = _out(m, _ids(), output_attentions=True).attentions
    for a in att:
        assert float((a.max(-1).values / a.min(-1).values).max()) <= math.exp(2 * cap) * 1.0001


@pytest.mark.parametrize("causal", [False, True])
def test_shaped_attention_is_the_identity_at_init(causal):
    """W_Q = 0 makes the softmax uniform over the visible keys, and with gamma = beta the
    shaped matrix is alpha I: each token's attention output is alpha times its own value."""
    m = _model("gpt2" if causal else "bert-base-uncased")
    _apply(m, ["shaped"], {"shaped": {"alpha": 0.7}})
    p = block_parts(m)[0]
    seen = {}
    p.o.register_forward_pre_hook(lambda _m, args: seen.setdefault("ctx", args[0]))
    p.v[0][0].register_forward_hook(lambda _m, _a, out: seen.setdefault("v", out))
    _out(m, _ids())
    v, ctx = seen["v"], seen["ctx"]
    if p.v[0][1] is not None:  # GPT-2's fused c_attn: its V block
        lo, hi = p.v[0][1]
        v = v[..., lo:hi]
    assert torch.allclose(ctx, 0.7 * v, atol=1e-4)


def test_mimetic_structure():
    """W_V W_O close to 0.4 Z - 0.4 I at full width: its diagonal averages -0.4 (the noise
    part has mean 0, std 0.4/sqrt(d) per entry: 0.05 at d = 64; tolerance 4 standard errors
    of the diagonal mean, 4 x 0.05 / 8), and each head's W_Q W_K^T keeps a positive diagonal
    (the rank-d_head cut of 0.7 Z + 0.7 I)."""
    m = _model("bert-base-uncased", kv_heads=4)
    _apply(m, ["mimetic"])
    p = block_parts(m)[1]
    wv, wo = weight_of(p.v[0]).detach().double(), weight_of((p.o, None, 0)).detach().double()
    vo = wv.t() @ wo.t()  # x -> x W_V^T -> (.) W_O^T
    d = vo.shape[0]
    assert abs(float(vo.diagonal().mean()) + 0.4) < 4 * 0.4 / math.sqrt(d) / math.sqrt(d)
    off = vo - torch.diag(vo.diagonal())
    assert float(off.std()) == pytest.approx(0.4 / math.sqrt(d), rel=0.1)
    wq, wk = weight_of(p.q[0]).detach().double(), weight_of(p.k[0]).detach().double()
    dh = p.head_dim
    qk = wq[:dh].t() @ wk[:dh]
    assert float(qk.diagonal().mean()) > 0.1


# ---- the theory map ----------------------------------------------------------------------------
_MAPPED = ("sigma-reparam", "deepnorm", "admin", "depth-mup", "tfixup", "deepscalelm",
           "skipinit", "layerscale", "beta", "qk-norm", "rezero")
#: GPT-2 (pre-LN: the running stream scale) in the default suite for the residual methods
_GPT2_DEFAULT = ("deepnorm", "deepscalelm", "qk-norm")
_MAP = [pytest.param(f, n, marks=() if f == "bert-base-uncased" or n in _GPT2_DEFAULT
                     else pytest.mark.slow)
        for f in ("bert-base-uncased", "gpt2") for n in _MAPPED]


@pytest.mark.parametrize("family, name", _MAP)
def test_theory_map_matches_the_patched_weights(family, name):
    """The method's effect applied to the spec read from the weights before equals the spec
    diagnose reads from the patched model (its weights, and the gates and q/k norms it finds
    on the modules, :func:`sigprop.models.methods.runtime_effect`): score stds and variances
    within 1e-4 relative (the reader folds the norm in front of a projection, epsilon
    included, into its variance, and T-Fixup removes the norm; float32 weights)."""
    from sigprop.analysis.diagnose import diagnose

    m = _model(family, layers=4)
    d0 = diagnose(m, seq_len=16, sequences=1)
    before = d0.spec
    spec_ctx = M.context_for(m, before, embed_q=d0.embed_q)
    rep = M.apply_methods(m, [name], {}, spec_ctx)
    after = diagnose(m, seq_len=16, sequences=1).spec
    assert after.norm == rep.after.norm
    assert (after.q0 is None) == (rep.after.q0 is None)
    if after.q0 is not None:  # norms removed from a pre-LN stack: absolute units from q0
        assert rep.after.q0 == pytest.approx(after.q0, rel=1e-6)
    for i, (want, got) in enumerate(zip(rep.after.layers, after.layers, strict=True)):
        assert np.allclose(want.sigma_s, got.sigma_s, rtol=1e-4), (name, i)
        assert want.var_v == pytest.approx(got.var_v, rel=1e-4)
        assert want.var_o == pytest.approx(got.var_o, rel=1e-4), (name, i)
        assert want.var_w_in == pytest.approx(got.var_w_in, rel=1e-4)
        assert want.var_w_out == pytest.approx(got.var_w_out, rel=1e-4), (name, i)
    if name == "tfixup":
        assert rep.after.norm == "none"


@pytest.mark.parametrize("name", ["tfixup", "rezero"])
def test_norms_removed_from_a_pre_ln_stack_start_from_the_measured_embedding_norm(name):
    """A pre-LN spec holds its branch variances in units of the embeddings' q0 (scale-free
    under the norms). Without the norms the branches read the raw stream, here q0 ~ 4e-4
    (Llama's embeddings, std 0.02): the theory must start there, where the branches are
    small and near-linear, not at q = 1. Measured against the prediction at d 128, T 64,
    6 blocks, 2 sequences: the final cos moves by < 1e-3 from the input's, so 0.005 is
    several times the finite-d spread; the prediction from q = 1 missed by 0.05 (T-Fixup)."""
    from sigprop.analysis.diagnose import diagnose
    from sigprop.theory import depth

    m = _model("llama-3.2-1b", layers=6, hidden=128, heads=4, intermediate=512)
    d0 = diagnose(m, seq_len=64, sequences=2, recommendations=False)
    assert d0.spec.norm == "pre" and 1e-4 < d0.embed_q < 1e-3
    rep = M.apply_methods(m, [name], {}, M.context_for(m, d0.spec, d0.rho0, d0.embed_q))
    assert rep.after.norm == "none" and rep.after.q0 == pytest.approx(d0.embed_q)
    t = diagnose(m, seq_len=64, sequences=2, recommendations=False).trajectory
    meas = t[(t.source == "measured") & (t.observable == "cos") & (t.layer == 6)].value.mean()
    pred = float(depth.final_cos(rep.after, rho0=d0.rho0))
    assert abs(pred - float(meas)) < 0.005, (pred, meas)


# ---- sigprop's own methods: the fix API of the old keywords -----------------------------------
@pytest.mark.parametrize("kw, names, params", [
    (dict(beta=0.5), ["beta"], {"beta": {"beta": 0.5}}),
    (dict(alpha_attn="auto"), ["alpha"], {}),
    (dict(alpha_attn=2), ["alpha"], {"alpha": {"alpha": 2.0}}),
    (dict(centred=True), ["centred"], {}),
    (dict(scaling="log-n"), ["length-scaling"],
     {"length-scaling": {"kind": "log-n", "param": None}}),
    (dict(scaling="tau", scaling_param=0.8), ["length-scaling"],
     {"length-scaling": {"kind": "tau", "param": 0.8}}),
    (dict(scaling="none"), [], {}),
])
def test_old_keywords_name_their_methods(kw, names, params):
    assert M.from_keywords(**kw) == (names, params)


@pytest.mark.parametrize("kw, field", [(dict(beta=-1), "beta"), (dict(alpha_attn=0), "alpha_attn"),
                                       (dict(scaling="cubic"), "scaling")])
def test_old_keywords_are_checked_under_their_names(kw, field):
    with pytest.raises(SpecError) as err:
        M.from_keywords(**kw)
    assert err.value.field == field


@pytest.mark.parametrize("family", ["bert-base-uncased", "gpt2"])
def test_own_methods_act_together_as_one_apply_fix(family):
    """beta, alpha auto, centred and a length scaling through the registry (in any order)
    give the weights and the config record of one ``apply_fix`` call with the old keywords:
    alpha's auto default sees the new beta and the scaling, no method's record overwrites
    another's."""
    kw = dict(beta=0.8, alpha_attn="auto", centred=True, scaling="log-n")
    ref = _model(family, layers=6, initializer_range=0.05)
    got = copy.deepcopy(ref)
    spec, _ = hf.spec_and_info(ref.config, 16)
    old = hf.apply_fix(ref, seq_len=16, rho0=spec.rho_init, **kw)
    names, params = M.from_keywords(**kw)
    rep = M.apply_methods(got, names[::-1], params, M.context_for(got, spec))
    assert [a["name"] for a in rep.applied] == names[::-1]
    for (n, a), b in zip(ref.state_dict().items(), got.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    rec = dict(got.config.sigprop_fix)
    assert rec.pop("applied") == names[::-1] and rec.pop("methods") == []
    assert rec == old.record
    assert rep.changes == old.changes
    assert rep.after.attention == "centred" and rep.after.scaling == "log-n"


def test_method_params_are_one_dict_form():
    assert M.method_params(None, ["softcap"]) == {}
    assert M.method_params({"softcap": {"cap": 30}}, ["softcap"]) == {"softcap": {"cap": 30}}
    with pytest.raises(SpecError, match="'admin' is not among the chosen methods"):
        M.method_params({"admin": {"omega": 2}}, ["softcap"])
    with pytest.raises(SpecError, match="must be a dict"):
        M.method_params({"softcap": 30}, ["softcap"])
    with pytest.warns(FutureWarning, match="pass a dict"):
        got = M.method_params(["softcap.cap=30"], ["softcap"], caller="fix")
    assert got == {"softcap": {"cap": "30"}}


def test_fix_old_keywords_warn_and_name_the_method(tmp_path):
    """The warning comes before any work (here: the request is refused at once)."""
    import sigprop

    with pytest.warns(FutureWarning, match="fix\\(beta=0.5\\) is deprecated.*'beta'"), \
            pytest.raises(SpecError, match="named twice"):
        sigprop.fix("bert-base-uncased", tmp_path / "o", beta=0.5, methods="beta")
    with pytest.raises(SpecError, match="needs --method"):
        sigprop.fix("bert-base-uncased", tmp_path / "o", params={"beta": {"beta": 1}})
