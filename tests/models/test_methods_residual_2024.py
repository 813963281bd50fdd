"""The field's residual-stream and training fixes of 2024-2026 in the registry
(sigprop.models.methods: value-residual, hyper-connections, ngpt, z-loss): each patch checked
against its definition by an independent computation on tiny models built from configs, the
written folder reloaded, bad parameters and models refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sigprop import models as hf
from sigprop.models import methods as M
from sigprop.models.methods.parts import block_parts, weight_of
from sigprop.models.presets import PRESETS, shrink
from sigprop.spec import SpecError

SMALL = dict(layers=3, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100)
GPT2, LLAMA, BERT = "gpt2", "llama-3.2-1b", "bert-base-uncased"


def _model(family, seed=0, **over):
    cfg = shrink(PRESETS[family], **{**SMALL, **over})
    return hf.model_at_init(hf.load_config(cfg), seed=seed, attn_implementation="sdpa").eval()


def _ids(T=16, seed=1):
    return torch.randint(0, 100, (2, T), generator=torch.Generator().manual_seed(seed))


def _apply(model, names, params=None, T=16):
    spec, _ = hf.spec_and_info(model.config, T)
    return M.apply_methods(model, list(names), params or {}, M.context_for(model, spec))


def _refused(model, name, params, needle, first=None):
    """Applying ``name`` (after ``first``, when given) is one SpecError line holding
    ``needle``."""
    if first:
        _apply(model, [first])
    with pytest.raises(SpecError) as err:
        _apply(model, [name], {name: params})
    assert needle in str(err.value) and "\n" not in str(err.value)


def _hidden(model, ids=None, **kw):
    with torch.no_grad():
        return model(input_ids=_ids() if ids is None else ids, **kw)


def _reloads(model, tmp_path):
    """The written folder, through both of sigprop's loaders (from_pretrained, and
    model_at_init + load_local_weights as diagnose reads a folder), gives the patched model's
    outputs."""
    ids = _ids()
    want = _hidden(model, ids).last_hidden_state
    tol = 1e-6 * max(1.0, float(want.abs().max()))
    model.save_pretrained(tmp_path, safe_serialization=True)
    back = hf.from_pretrained(tmp_path).eval()
    assert float((_hidden(back, ids).last_hidden_state - want).abs().max()) <= tol
    other = hf.model_at_init(hf.load_config(tmp_path), seed=7)
    rep = hf.load_local_weights(other, tmp_path)
    assert not [k for k in rep.missing if "sigprop_" in k]
    assert float((_hidden(other.eval(), ids).last_hidden_state - want).abs().max()) <= tol
    return back


# ---- value residual ----------------------------------------------------------------------------
def _value_inputs(model):
    """Each block's value projection: its input in the next forward pass (pre-hooks) and its
    output after every hook (a forward hook registered last)."""
    seen = {"x": [], "out": []}
    handles = []
    for p in block_parts(model):
        m, sl, _ = p.v[0]
        handles.append(m.register_forward_pre_hook(
            lambda _m, a: seen["x"].append(a[0].detach().clone())))
        handles.append(m.register_forward_hook(
            lambda _m, _a, o, sl=sl: seen["out"].append(
                (o if sl is None else o[..., sl[0]:sl[1]]).detach().clone())))
    return seen, handles


@pytest.mark.parametrize("family", [GPT2, LLAMA, BERT])
def test_value_residual_mixes_each_blocks_values_with_the_first_blocks(family):
    """Block l > 1's values equal ``lambda_self x_l W_V^l + lambda_first x_1 W_V^1`` (with the
    biases), computed here from each block's own value-projection input and weights; block
    1's values are its own. Non-default weights, so the two are told apart."""
    m = _model(family)
    rep = _apply(m, ["value-residual"], {"value-residual": {"lambda_self": 0.3,
                                                            "lambda_first": 1.7}})
    assert rep.applied[0]["params"] == {"lambda_self": 0.3, "lambda_first": 1.7,
                                        "trainable": "no"}
    assert not rep.effect.measured_only  # the theory's value kernel (docs/theory.md §2.4.6)
    assert rep.after.layers[0].value_mix is None
    assert all(x.value_mix == (0.3, 1.7) for x in rep.after.layers[1:])
    seen, handles = _value_inputs(m)
    _hidden(m)
    for h in handles:
        h.remove()
    raw = []
    for p, x in zip(block_parts(m), seen["x"], strict=True):
        t = p.v[0]
        w = weight_of(t).detach()
        b = t[0].bias
        if b is not None and t[1] is not None:
            b = b[t[1][0]:t[1][1]]
        raw.append(F.linear(x, w, None if b is None else b.detach()))
    torch.testing.assert_close(seen["out"][0], raw[0], rtol=0, atol=1e-6)
    for i in range(1, len(raw)):
        torch.testing.assert_close(seen["out"][i], 0.3 * raw[i] + 1.7 * raw[0], rtol=0,
                                   atol=1e-5)


@pytest.mark.parametrize("family, trainable", [(GPT2, "no"), (LLAMA, "yes"), (BERT, "no")])
def test_value_residual_reloads(tmp_path, family, trainable):
    m = _model(family)
    plain = _hidden(m).last_hidden_state
    _apply(m, ["value-residual"], {"value-residual": {"lambda_first": 0.8,
                                                      "trainable": trainable}})
    assert float((_hidden(m).last_hidden_state - plain).abs().max()) > 1e-3
    mix = block_parts(m)[1].v[0][0].sigprop_value_mix
    assert isinstance(mix, torch.nn.Parameter) == (trainable == "yes")
    with torch.no_grad():  # a value away from init: the folder must carry it
        mix.copy_(torch.tensor([0.25, 1.5]))
    back = _reloads(m, tmp_path)
    torch.testing.assert_close(block_parts(back)[1].v[0][0].sigprop_value_mix,
                               torch.tensor([0.25, 1.5]))


@pytest.mark.parametrize("over, params, needle", [
    (dict(layers=1), {}, "value-residual: needs two or more blocks"),
    ({}, {"lambda_self": -1}, "value-residual.lambda_self: must be a number in"),
    ({}, {"trainable": "maybe"}, "value-residual.trainable: must be one of no, yes"),
    ({}, {"lam": 1}, "value-residual.lam: unknown parameter"),
])
def test_value_residual_refusals_are_one_line(over, params, needle):
    _refused(_model(GPT2, **over), "value-residual", params, needle)


def test_value_residual_twice_is_refused():
    m = _model(GPT2)
    _apply(m, ["value-residual"])
    with pytest.raises(SpecError, match="value-residual: the model already mixes"):
        _apply(m, ["value-residual"])


# ---- z-loss --------------------------------------------------------------------------------------
def test_value_residual_stack_theory_matches_its_simulation():
    """sigprop's pre-LN stack (d 128, T 32, 6 blocks, beta 1.2; the spec of the norm
    methods' agreement tests) with ResFormer's 0.5 / 0.5: theory (the first block's value
    kernel carried through the stack) and the mean of 2 seeds x 2 sequences within 0.03 per
    layer on cos and entropy. Measured 0.029 on cos, at layer 1, which the method does not
    touch (the plain stack's own finite-d gap there); with 8 seeds x 4 sequences 0.021, as
    the plain stack's 0.023. The theory without the method misses the fixed stack's last
    layer by more than 0.03 (it moves the final cos by 0.07)."""
    from sigprop.analysis.measure import measure
    from sigprop.spec import ArchSpec
    from sigprop.theory import depth

    spec = ArchSpec(depth=6, d_model=128, heads=4, seq_len=32, norm="pre", beta=1.2,
                    sigma_v2=1.0, sigma_w2=2.0)
    m = measure(spec, seeds=2, sequences=2, methods="value-residual")
    assert m.max_abs_error["cos"] < 0.03, m.max_abs_error
    assert m.max_abs_error["entropy"] < 0.03, m.max_abs_error
    tr = m.trajectory
    last = tr[(tr["observable"] == "cos") & (tr["layer"] == 6) & (tr["source"] == "measured")]
    assert abs(float(depth.final_cos(spec)) - float(last["value"].iloc[0])) > 0.03


def test_z_loss_term_is_coeff_times_mean_squared_log_normaliser():
    from sigprop.models.methods.z_loss import z_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64) * 4 + 2
    mask = torch.rand(3, 5, generator=g) > 0.4
    lz = [math.log(sum(math.exp(v) for v in row)) for row in logits.reshape(-1, 11).tolist()]
    keep = mask.reshape(-1).tolist()
    want_all = 1e-4 * sum(v * v for v in lz) / len(lz)
    want_mask = 1e-4 * sum(v * v for v, k in zip(lz, keep, strict=True) if k) / sum(keep)
    assert float(z_loss(logits, 1e-4)) == pytest.approx(want_all, rel=1e-12)
    assert float(z_loss(logits, 1e-4, mask)) == pytest.approx(want_mask, rel=1e-12)
    meth = M.get("z-loss")
    assert float(meth.loss(logits, {"coeff": 0.5}, mask)) == pytest.approx(
        want_mask / 1e-4 * 0.5, rel=1e-12)
    assert float(meth.loss(logits, None)) == pytest.approx(want_all, rel=1e-12)  # 1e-4
    assert float(z_loss(logits, 1.0, torch.zeros(3, 5, dtype=torch.bool))) == 0.0
    with pytest.raises(SpecError, match=r"z-loss.coeff: must be a number in"):
        meth.loss(logits, {"coeff": -1})
    with pytest.raises(SpecError, match=r"z-loss.scale: unknown parameter"):
        meth.loss(logits, {"scale": 1})


def test_z_loss_changes_nothing_at_init_and_is_recorded(tmp_path):
    from sigprop.models.methods.z_loss import recorded_z_loss

    meth = M.get("z-loss")
    assert meth.theory == "measured only" and not meth.runtime and meth.training_only
    m = _model(GPT2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rep = _apply(m, ["z-loss"])
    assert rep.applied == [{"name": "z-loss", "params": {"coeff": 1e-4}}]
    assert "--train-steps only" in rep.changes[0]
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert recorded_z_loss(m.config) == {"coeff": 1e-4}
    m.save_pretrained(tmp_path)
    assert recorded_z_loss(hf.load_config(tmp_path)) == {"coeff": 1e-4}
    with pytest.raises(SpecError, match=r"z-loss.coeff: must be a number in"):
        _apply(_model(GPT2), ["z-loss"], {"z-loss": {"coeff": 2}})


def test_fix_compare_train_steps_trains_the_training_time_arms(monkeypatch):
    """``fix --compare --train-steps`` (one run, both arms): the z-loss arm's training loss is
    the cross-entropy plus coeff * log^2 Z of its logits at every step (each term checked
    against the logits it was given) and a large coeff trains it differently from the
    baseline; the ngpt arm's matrices are renormalised at apply and after every step, and end
    on the sphere; the baseline arm gets neither."""
    from types import SimpleNamespace

    from sigprop.analysis import compare_train as ct
    from sigprop.models.methods import ngpt
    from sigprop.models.methods import z_loss as zl

    seen, renorm = [], []
    orig_z, orig_n = zl.z_loss, ngpt.renormalise_

    def spy_z(logits, coeff, mask=None):
        out = orig_z(logits, coeff, mask)
        lse = torch.logsumexp(logits.detach().double(), -1)[mask]
        seen.append((coeff, float(out.detach()), float(coeff * lse.square().mean())))
        return out

    def spy_n(model, parts=None):
        renorm.append(model)
        return orig_n(model, parts)

    monkeypatch.setattr(zl, "z_loss", spy_z)
    monkeypatch.setattr(ngpt, "renormalise_", spy_n)
    cfg = hf.load_config(shrink(PRESETS[GPT2], layers=2, hidden=64, heads=4, vocab=100))
    spec = hf.spec_from_config(cfg, 16)
    arms = ["z-loss", "ngpt"]
    gains, _ = ct.train_gains(cfg, spec, arms, {"z-loss": {"coeff": 0.05}},
                              {a: SimpleNamespace(error=None) for a in arms}, steps=2)
    assert set(gains) == {"baseline", *arms} and all(g is not None for g in gains.values())
    assert len(seen) == 2 and all(c == 0.05 for c, *_ in seen)  # the z-loss arm only
    for _c, got, want in seen:
        assert got == pytest.approx(want, rel=1e-5)
    assert gains["z-loss"] != gains["baseline"]
    assert len(renorm) == 1 + 2  # the ngpt arm only: at apply, then after each step
    assert all(float((n - 1).abs().max()) < 1e-5 for n in _sphere_norms(renorm[-1], GPT2))


# ---- nGPT ----------------------------------------------------------------------------------------
def _raw_branches(model):
    """Hooks registered before the method's: each block's input and its attention and MLP
    modules' own outputs (the method's hooks run after these)."""
    from sigprop.models.methods.streams import decoder_layout

    spec, _ = hf.spec_and_info(model.config, 16)
    lays = decoder_layout(block_parts(model), M.context_for(model, spec), "test")
    seen = [{} for _ in lays]
    for i, lay in enumerate(lays):
        lay.block.register_forward_pre_hook(
            lambda _m, a, k, i=i: seen[i].__setitem__("h", (a[0] if a else k["hidden_states"])
                                                      .detach().clone()), with_kwargs=True)
        lay.block.register_forward_hook(
            lambda _m, _a, o, i=i: seen[i].__setitem__(
                "out", (o[0] if isinstance(o, tuple) else o).detach().clone()))
        for key, mod in (("fa", lay.attn), ("fm", lay.mlp)):
            mod.register_forward_hook(
                lambda _m, _a, o, i=i, key=key: seen[i].__setitem__(
                    key, (o[0] if isinstance(o, tuple) else o).detach().clone()))
    return lays, seen


@pytest.mark.parametrize("family", [GPT2, LLAMA])
def test_ngpt_blocks_take_the_papers_step_on_the_sphere(family):
    """Every block's output has unit norm and equals, computed here from its input and its
    branches' own outputs, ``h <- Norm(h + a_A (Norm f_A - h)); h <- Norm(h + a_M (Norm f_M -
    h))`` with ``h`` the normalised input and ``a = stored alpha * alpha_init sqrt(d)`` (the
    stored alphas drawn away from init, per channel)."""
    m = _model(family)
    lays, seen = _raw_branches(m)
    rep = _apply(m, ["ngpt"], {"ngpt": {"alpha_init": 0.2}})
    assert rep.after is None and rep.effect.measured_only[0].startswith("ngpt:")
    d = SMALL["hidden"]
    g = torch.Generator().manual_seed(3)
    alphas = []
    for lay in lays:
        pair = []
        for mod in (lay.attn, lay.mlp):
            p = mod.sigprop_ngpt_alpha
            assert torch.allclose(p, torch.full((d,), d ** -0.5))  # the paper's alpha_scale
            with torch.no_grad():
                p.copy_(torch.rand(d, generator=g) * d ** -0.5)
            pair.append(p.detach() * 0.2 * d ** 0.5)
        alphas.append(pair)
    out = _hidden(m, output_hidden_states=True)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    for s, (a_att, a_mlp) in zip(seen, alphas, strict=True):
        h = unit(s["h"])
        h = unit(h + a_att * (unit(s["fa"]) - h))
        h = unit(h + a_mlp * (unit(s["fm"]) - h))
        torch.testing.assert_close(s["out"], h, rtol=0, atol=2e-6)
        assert float((s["out"].norm(dim=-1) - 1).abs().max()) < 1e-5
    for hs in out.hidden_states[1:]:  # every block's output, the last without a final norm
        assert float((hs.norm(dim=-1) - 1).abs().max()) < 1e-5


def test_ngpt_scores_are_sqrt_dk_times_the_cosine():
    """GPT-2 (eager): block 1's attention is the causal softmax of ``sqrt(d_k) cos(q_h, k_h)``
    with q and k from the c_attn input and weights (unit scales at init)."""
    m = _model(GPT2, layers=2)
    m.config._attn_implementation = "eager"
    x_in = {}
    c_attn = block_parts(m)[0].q[0][0]
    c_attn.register_forward_pre_hook(lambda _m, a: x_in.__setitem__("x", a[0].detach()))
    _apply(m, ["ngpt"])
    probs = _hidden(m, output_attentions=True).attentions[0]
    x, d, H = x_in["x"], SMALL["hidden"], SMALL["heads"]
    dh = d // H
    qkv = x @ c_attn.weight.detach() + c_attn.bias.detach()
    q, k = (qkv[..., i * d:(i + 1) * d].unflatten(-1, (H, dh)).transpose(1, 2) for i in (0, 1))
    rms = lambda z: z / (z.square().mean(-1, keepdim=True) + 1e-6).sqrt()  # noqa: E731
    cos = rms(q) @ rms(k).transpose(-1, -2) / dh  # the hook's RMS norm, epsilon 1e-6
    T = x.shape[1]
    s = (dh ** 0.5 * cos).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(probs, torch.softmax(s, -1), rtol=0, atol=2e-6)
    unit = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
    assert float((cos - unit).abs().max()) < 1e-3  # the cosine, to that epsilon


def _sphere_norms(model, family):
    """Per matrix, the norms along the embedding dimension, read from the stored weights."""
    out = [model.get_input_embeddings().weight.norm(dim=1)]
    for p in block_parts(model):
        blk = p.block
        if family == GPT2:  # Conv1D stores (in, out)
            out += [blk.attn.c_attn.weight.norm(dim=0), blk.mlp.c_fc.weight.norm(dim=0),
                    blk.attn.c_proj.weight.norm(dim=1), blk.mlp.c_proj.weight.norm(dim=1)]
        else:  # nn.Linear stores (out, in)
            a, f = blk.self_attn, blk.mlp
            out += [a.q_proj.weight.norm(dim=1), a.k_proj.weight.norm(dim=1),
                    a.v_proj.weight.norm(dim=1), f.gate_proj.weight.norm(dim=1),
                    f.up_proj.weight.norm(dim=1), a.o_proj.weight.norm(dim=0),
                    f.down_proj.weight.norm(dim=0)]
    return [n.detach() for n in out]


@pytest.mark.parametrize("family", [GPT2, LLAMA])
def test_ngpt_weights_back_on_the_sphere_after_each_step(family):
    from sigprop.models.methods.ngpt import recorded_ngpt

    m = _model(family)
    assert any(float((n - 1).abs().max()) > 0.1 for n in _sphere_norms(m, family))
    _apply(m, ["ngpt"])
    assert all(float((n - 1).abs().max()) < 1e-5 for n in _sphere_norms(m, family))
    assert recorded_ngpt(m.config) == {"alpha_init": 0.05}
    with torch.no_grad():  # an optimizer step's worth of change
        for w in m.parameters():
            w.add_(torch.randn_like(w) * 0.05)
    assert all(float((n - 1).abs().max()) > 1e-3 for n in _sphere_norms(m, family))
    M.get("ngpt").after_step(m, recorded_ngpt(m.config))
    assert all(float((n - 1).abs().max()) < 1e-5 for n in _sphere_norms(m, family))
    with pytest.raises(SpecError, match="ngpt.beta: unknown parameter"):
        M.get("ngpt").after_step(m, {"beta": 1})


@pytest.mark.parametrize("family", [GPT2, LLAMA])
def test_ngpt_reloads(tmp_path, family):
    m = _model(family)
    _apply(m, ["ngpt"])
    with torch.no_grad():
        for n, w in m.named_parameters():
            if "sigprop_" in n:
                w.mul_(1.3)
    back = _reloads(m, tmp_path)
    assert not any(type(x).__name__.endswith("Norm") for x in back.modules())


@pytest.mark.parametrize("family, first, params, needle", [
    (BERT, None, {}, "ngpt: acts on pre-LN decoder blocks (GPT-2, Llama family); this model "
                     "is post-LN"),
    (GPT2, "qk-norm", {}, "ngpt: h.0: the model already normalises q and k"),
    (GPT2, "ngpt", {}, "ngpt: the blocks' updates are already replaced"),
    (GPT2, None, {"alpha_init": 0}, "ngpt.alpha_init: must be a number in"),
])
def test_ngpt_refusals_are_one_line(family, first, params, needle):
    _refused(_model(family), "ngpt", params, needle, first)


# ---- hyper-connections ---------------------------------------------------------------------------
_HC = [(GPT2, "hc", 4), (LLAMA, "mhc", 4), (GPT2, "mhc", 3)]


@pytest.mark.parametrize("family, kind, n", _HC)
def test_hyper_connections_at_init_are_the_plain_residual_connection(family, kind, n):
    """The paper's init (and ours for mHC) makes the n streams equal copies of the plain
    residual stream: every block's output and the model's equal the unpatched model's."""
    m = _model(family)
    want = _hidden(m, output_hidden_states=True).hidden_states
    rep = _apply(m, ["hyper-connections"], {"hyper-connections": {"kind": kind, "n": n}})
    assert rep.applied[0]["params"] == {"n": n, "kind": kind}
    got = _hidden(m, output_hidden_states=True).hidden_states
    for a, b in zip(got, want, strict=True):
        assert float((a - b).abs().max()) <= 1e-5 * max(1.0, float(b.abs().max()))


def _sinkhorn_by_hand(logits: torch.Tensor) -> torch.Tensor:
    x = logits.double().exp()
    for _ in range(500):
        x = x / x.sum(1, keepdim=True)
        x = x / x.sum(0, keepdim=True)
    return x


def _matrices_by_hand(mod, kind):
    pre, post, res = (getattr(mod, k).detach().double() for k in
                      ("sigprop_hc_pre", "sigprop_hc_post", "sigprop_hc_res"))
    if kind == "mhc":
        return torch.sigmoid(pre), 2 * torch.sigmoid(post), _sinkhorn_by_hand(res)
    return pre, post, res


def test_mhc_residual_mix_is_doubly_stochastic():
    """mHC's res: non-negative, rows and columns summing to 1 (at init: 0.9 on the diagonal;
    pre sums to 1 on stream k mod n, post 1), and so after its logits move; Sinkhorn's result
    matches a long plain-space iteration."""
    from sigprop.models.methods.hyper_connections import mixing
    from sigprop.models.methods.streams import decoder_layout

    m = _model(LLAMA)
    _apply(m, ["hyper-connections"], {"hyper-connections": {"kind": "mhc", "n": 4}})
    spec, _ = hf.spec_and_info(m.config, 16)
    mods = [x for lay in decoder_layout(block_parts(m), M.context_for(m, spec), "t")
            for x in (lay.attn, lay.mlp)]
    for k, mod in enumerate(mods):
        pre, post, res = (t.detach().double() for t in mixing(mod))
        torch.testing.assert_close(res.diagonal(), torch.full((4,), 0.9, dtype=torch.double))
        assert float(pre.sum()) == pytest.approx(1.0, abs=1e-6)
        assert float(pre[k % 4]) == pytest.approx(0.9, abs=1e-6)
        torch.testing.assert_close(post, torch.ones(4, dtype=torch.double))
    g = torch.Generator().manual_seed(0)
    for mod in mods:
        with torch.no_grad():
            mod.sigprop_hc_res.copy_(torch.randn(4, 4, generator=g))
        res = mixing(mod)[2].detach().double()
        assert float(res.min()) >= 0
        torch.testing.assert_close(res.sum(0), torch.ones(4, dtype=torch.double), atol=1e-5,
                                   rtol=0)
        torch.testing.assert_close(res.sum(1), torch.ones(4, dtype=torch.double), atol=1e-4,
                                   rtol=0)
        torch.testing.assert_close(res, _sinkhorn_by_hand(mod.sigprop_hc_res.detach()),
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("family, kind", [(GPT2, "hc"), (LLAMA, "mhc")])
def test_hyper_connections_streams_follow_the_definition(family, kind):
    """With every matrix moved away from init, the n streams computed here from the branches'
    own outputs: ``H_0`` copies of the first block's input; per sub-layer its input is
    ``sum_i pre_i H_i`` (read where it enters the norm) and ``H'_j = post_j y + sum_i res_ij
    H_i``; each block's output is the streams' mean."""
    n = 3
    m = _model(family)
    lays, seen = _raw_branches(m)
    _apply(m, ["hyper-connections"], {"hyper-connections": {"kind": kind, "n": n}})
    g = torch.Generator().manual_seed(1)
    ins = [{} for _ in lays]
    for i, lay in enumerate(lays):
        for key, (parent, attr), mod in (("ia", lay.attn_norm, lay.attn),
                                         ("im", lay.mlp_norm, lay.mlp)):
            getattr(parent, attr).register_forward_pre_hook(  # after the method's: its input
                lambda _m, a, i=i, key=key: ins[i].__setitem__(key, a[0].detach().clone()))
            with torch.no_grad():
                for k in ("sigprop_hc_pre", "sigprop_hc_post", "sigprop_hc_res"):
                    p = getattr(mod, k)
                    p.add_(torch.randn(p.shape, generator=g) * 0.3)
    _hidden(m)
    H = seen[0]["h"].double().unsqueeze(-2).expand(*seen[0]["h"].shape[:-1], n, -1)
    for lay, s, x in zip(lays, seen, ins, strict=True):
        for key, ykey, mod in (("ia", "fa", lay.attn), ("im", "fm", lay.mlp)):
            pre, post, res = _matrices_by_hand(mod, kind)
            torch.testing.assert_close(x[key].double(), torch.einsum("i,...id->...d", pre, H),
                                       atol=2e-5, rtol=1e-5)
            H = post[:, None] * s[ykey].double().unsqueeze(-2) + \
                torch.einsum("ij,...id->...jd", res, H)
        torch.testing.assert_close(s["out"].double(), H.mean(-2), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("family, kind", [(GPT2, "mhc"), (LLAMA, "hc")])
def test_hyper_connections_reload(tmp_path, family, kind):
    m = _model(family)
    _apply(m, ["hyper-connections"], {"hyper-connections": {"kind": kind}})
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "sigprop_hc" in name:
                p.add_(torch.randn_like(p) * 0.2)
    _reloads(m, tmp_path)


@pytest.mark.parametrize("family, first, params, needle", [
    (BERT, None, {}, "hyper-connections: acts on pre-LN decoder blocks (GPT-2, Llama family); "
                     "this model is post-LN"),
    (GPT2, "ngpt", {}, "hyper-connections: the blocks' updates are already replaced"),
    (GPT2, None, {"n": 2.5}, "hyper-connections.n: must be a whole number"),
    (GPT2, None, {"n": 0}, "hyper-connections.n: must be a number in [1, 16]"),
    (GPT2, None, {"kind": "dhc"}, "hyper-connections.kind: must be one of hc, mhc"),
    (GPT2, None, {"kind": "mhc", "n": 1}, "hyper-connections.n: mhc mixes two or more"),
])
def test_hyper_connections_refusals_are_one_line(family, first, params, needle):
    _refused(_model(family), "hyper-connections", params, needle, first)


def test_value_residual_in_the_gram_theory_of_a_causal_stack_matches_its_simulation():
    """Value residuals in the position-resolved (Gram-matrix) theory, which ``sigprop fix
    --compare`` uses for causal decoders with an output projection (HF models): sigprop's
    causal pre-LN stack with W_O (sigma_o^2 1; d 128, 4 heads, T 32, 6 blocks, beta 1.2),
    ResFormer's 0.5 / 0.5, input cosine matrix at rho0 0.3 (correlated tokens). Theory (the
    first block's value covariance mixed into each later block's, no cross term) against the
    mean of 2 seeds x 4 sequences per layer on cos: measured 0.016, bound 0.03; the theory
    without the mix misses the last layer by more than 0.03 (0.70 vs 0.64). Without W_O
    the stream itself carries the first block's values and the comparison refuses the Gram
    map (docs/theory.md §2.4.6)."""
    from sigprop.analysis.model_theory import gram_applies
    from sigprop.measurement.engine import measure
    from sigprop.models.methods.stack import fix_spec
    from sigprop.spec import ArchSpec
    from sigprop.theory import gram

    spec = ArchSpec(depth=6, d_model=128, heads=4, seq_len=32, norm="pre", beta=1.2,
                    sigma_v2=1.0, sigma_w2=2.0, sigma_o2=1.0, causal=True)
    fx = fix_spec(spec, "value-residual")
    fixed = fx.spec
    assert gram_applies(fixed, "text") is None
    C0 = 0.7 * np.eye(32) + 0.3
    th = gram.propagate_gram(fixed, C0)
    tr = measure(fixed, seeds=2, sequences=4, build=fx.build, rho0=0.3,
                 stable_rank=False).trajectory
    got = tr[(tr.observable == "cos") & (tr.source == "measured")].sort_values("layer")
    got = got["value"].to_numpy()
    assert np.max(np.abs(th - got)) < 0.03
    assert abs(gram.propagate_gram(spec, C0)[-1] - got[-1]) > 0.03
    no_wo = fix_spec(spec.replace(sigma_o2=None), "value-residual").spec
    assert gram_applies(no_wo, "text") == "layout"


def test_value_residual_without_output_projection_carries_the_stream_cross_term():
    """sigprop's own pre-LN stack has no output projection, so every block adds its rows of
    the first block's values V_1 straight into the stream and a later block's output
    ``lambda_first A_l V_1`` correlates with the stream it is added to (docs/theory.md
    §2.4.6). d 256, 4 heads, T 32, 4 blocks, beta 1.2, ResFormer's 0.5 / 0.5 at rho0 0.3:
    theory against the mean of 2 seeds x 4 sequences per layer on cos within 0.03 (measured
    0.009: theory .519 .609 .665 .704, torch .522 .610 .659 .696; seeds 100-101: 0.016). At
    d 128 the two seeds' draw alone moves it by ~0.02 (0.029 from seeds 0-1, 0.004 from
    100-101), hence d 256. The map without the cross term (:func:`block_step`, which does not
    carry the stream's share of V_1: .519 .579 .614 .639) misses by 0.057, at the last
    layer."""
    import dataclasses

    from sigprop.analysis.measure import measure
    from sigprop.models.methods.stack import fix_spec
    from sigprop.spec import ArchSpec
    from sigprop.theory import depth
    from sigprop.theory.blocks import BlockParams, block_step, value_kernel

    spec = ArchSpec(depth=4, d_model=256, heads=4, seq_len=32, norm="pre", beta=1.2,
                    sigma_v2=1.0, sigma_w2=2.0)
    P = {"value-residual": {"lambda_self": 0.5, "lambda_first": 0.5}}
    fixed = fix_spec(spec, "value-residual", P).spec
    th = depth.propagate(fixed, rho0=0.3)
    th = th[th.observable == "cos"].sort_values("layer")["value"].to_numpy()[1:]
    m = measure(spec, seeds=2, sequences=4, methods="value-residual", method_params=P,
                rho0=0.3).trajectory
    got = m[(m.observable == "cos") & (m.source == "measured")].sort_values("layer")
    got = got["value"].to_numpy()[-4:]
    assert np.max(np.abs(th - got)) < 0.03, (th, got)
    q, p, old = np.float64(1.0), np.float64(0.3), []
    vk = value_kernel(q, p, BlockParams.from_spec(fixed, 1))
    for layer in range(1, 5):
        bp = BlockParams.from_spec(fixed, layer)
        if bp.value_mix is not None:
            bp = dataclasses.replace(bp, value_first=vk)
        q, p, _ = block_step(q, p, bp)
        old.append(p / q)
    assert np.max(np.abs(np.array(old) - got)) > 0.03
