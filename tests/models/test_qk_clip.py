"""QK-Clip (Kimi K2's MuonClip clip; sigprop.models.methods.qk_clip): each head's logits are
recomputed here from the weights on fixed inputs, by hand (per head its own row block of the
projections, indexed here from the layout, not through sigprop's row helper), before and after
the clip: a clipped head's logits are gamma = tau / S_max times the old ones, every other
head's are bit-identical; grouped K/V puts the whole factor on the query, MLA follows Kimi's
rule (content parts sqrt(gamma) each, rotary query gamma, shared rotary key as is); QK-norm
heads and non-finite maxima are reported and left alone; bad arguments are refused in one
line before any weight moves."""

from __future__ import annotations

import math

import pytest
import torch

from sigprop import models as hf
from sigprop.models import methods as M
from sigprop.models.methods.qk_clip import qk_clip_, recorded_clip
from sigprop.spec import SpecError

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("torch_one_thread")

H, DH, D, TAU = 4, 8, 32, 100.0
#: float32 weights times a float factor: the logits' ratio is gamma to rounding
REL = 1e-5


def _llama(kv: int, seed: int = 0):
    cfg = transformers.LlamaConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=kv,
                                   head_dim=DH, num_hidden_layers=2, intermediate_size=64,
                                   vocab_size=64, attention_bias=True)
    m = hf.model_at_init(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # zero at init: give the biases something to scale
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return m


def _x(n=6, d=D, seed=3):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def _llama_logits(m, layer: int, x) -> torch.Tensor:
    """(H, n, n) per-head logits q.k * scale of layer ``layer`` on inputs ``x`` (no RoPE:
    it rotates q and k, linear in each, so it does not change the ratios)."""
    att = m.layers[layer].self_attn
    kv = m.config.num_key_value_heads
    q = (x @ att.q_proj.weight.T + att.q_proj.bias).view(-1, H, DH)
    k = (x @ att.k_proj.weight.T + att.k_proj.bias).view(-1, kv, DH)
    k = k.repeat_interleave(H // kv, dim=1)  # query head h reads K head h // (H / kv)
    return torch.einsum("qhd,khd->hqk", q, k) * DH ** -0.5


def _state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _changed(m, before) -> set[str]:
    return {k for k, v in m.state_dict().items() if not torch.equal(v, before[k])}


def _check_scaled(new, old, clipped: dict[int, float]):
    for h in range(old.shape[0]):
        if h in clipped:
            torch.testing.assert_close(new[h], clipped[h] * old[h], rtol=REL, atol=0)
        else:
            assert torch.equal(new[h], old[h]), h


# ---- one K head per query head ---------------------------------------------------------------
def test_llama_clipped_head_logits_scale_by_gamma_others_exact():
    m, x = _llama(kv=H), _x()
    old0, old1, before = _llama_logits(m, 0, x), _llama_logits(m, 1, x), _state(m)
    maxima = {1: torch.tensor([TAU / 2, 4 * TAU, TAU, math.nan])}
    rep = qk_clip_(m, maxima, tau=TAU)
    assert [(r["layer"], r["head"], r["how"]) for r in rep] == [
        (1, 1, "q^a k^(1-a)"), (1, 3, "skipped: non-finite")]
    assert rep[0]["gamma"] == 0.25 and rep[0]["max_logit"] == 4 * TAU
    assert rep[0]["block"] == "layers.1"
    assert rep[1]["gamma"] is None and math.isnan(rep[1]["max_logit"])
    _check_scaled(_llama_logits(m, 1, x), old1, {1: 0.25})
    assert torch.equal(_llama_logits(m, 0, x), old0)  # layer 0 untouched
    assert _changed(m, before) == {f"layers.1.self_attn.{p}_proj.{w}" for p in "qk"
                                   for w in ("weight", "bias")}
    att, att0 = m.layers[1].self_attn, before
    for p in "qk":  # alpha = 1/2: sqrt(gamma) on each of the head's rows and bias entries
        w0 = att0[f"layers.1.self_attn.{p}_proj.weight"].view(H, DH, D)
        b0 = att0[f"layers.1.self_attn.{p}_proj.bias"].view(H, DH)
        w = getattr(att, f"{p}_proj").weight.view(H, DH, D)
        b = getattr(att, f"{p}_proj").bias.view(H, DH)
        torch.testing.assert_close(w[1], 0.5 * w0[1], rtol=1e-6, atol=0)
        torch.testing.assert_close(b[1], 0.5 * b0[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("alpha, on", [(0.0, "k"), (1.0, "q")])
def test_alpha_puts_the_whole_factor_on_one_side(alpha, on):
    m, x = _llama(kv=H), _x()
    old, before = _llama_logits(m, 0, x), _state(m)
    rep = qk_clip_(m, {0: [4 * TAU, 0.0, -5.0, TAU]}, tau=TAU, alpha=alpha)
    assert [(r["head"], r["gamma"]) for r in rep] == [(0, 0.25)]
    _check_scaled(_llama_logits(m, 0, x), old, {0: 0.25})
    assert _changed(m, before) == {f"layers.0.self_attn.{on}_proj.weight",
                                   f"layers.0.self_attn.{on}_proj.bias"}
    w0 = before[f"layers.0.self_attn.{on}_proj.weight"].view(H, DH, D)
    w = getattr(m.layers[0].self_attn, f"{on}_proj").weight.view(H, DH, D)
    torch.testing.assert_close(w[0], 0.25 * w0[0], rtol=1e-6, atol=0)


def test_gqa_scales_only_the_query_rows_by_gamma():
    m, x = _llama(kv=2), _x()
    old, before = _llama_logits(m, 0, x), _state(m)
    rep = qk_clip_(m, {0: [TAU, TAU, 4 * TAU, 8 * TAU]}, tau=TAU)
    assert [(r["head"], r["gamma"], r["how"]) for r in rep] == [
        (2, 0.25, "q only (grouped K/V)"), (3, 0.125, "q only (grouped K/V)")]
    # heads 2 and 3 share K head 1: its rows stay, each query takes its own factor
    _check_scaled(_llama_logits(m, 0, x), old, {2: 0.25, 3: 0.125})
    assert _changed(m, before) == {"layers.0.self_attn.q_proj.weight",
                                   "layers.0.self_attn.q_proj.bias"}


def test_gpt2_fused_conv1d_columns():
    m = hf.model_at_init(transformers.GPT2Config(n_layer=2, n_embd=D, n_head=H, vocab_size=64,
                                                 n_positions=32), seed=0)
    att = m.h[0].attn.c_attn
    with torch.no_grad():
        att.bias.normal_()
    x = _x()

    def logits():  # Conv1D: y = x W + b, W (in, out) = [q | k | v] columns
        y = x @ att.weight + att.bias
        q, k = y[:, :D].view(-1, H, DH), y[:, D:2 * D].view(-1, H, DH)
        return torch.einsum("qhd,khd->hqk", q, k) * DH ** -0.5

    old, w0, b0 = logits(), att.weight.detach().clone(), att.bias.detach().clone()
    rep = qk_clip_(m, {0: [4 * TAU, 2.0, 3.0, 4.0]}, tau=TAU)
    assert [(r["head"], r["how"]) for r in rep] == [(0, "q^a k^(1-a)")]
    _check_scaled(logits(), old, {0: 0.25})
    want = torch.ones(3 * D)
    want[0:DH] = want[D:D + DH] = 0.5  # head 0 of q, then of k; v as it is
    torch.testing.assert_close(att.weight.detach(), w0 * want, rtol=1e-6, atol=0)
    torch.testing.assert_close(att.bias.detach(), b0 * want, rtol=1e-6, atol=0)


# ---- MLA -------------------------------------------------------------------------------------
NOPE, ROPE, DV, RQ, RKV = 16, 8, 12, 24, 20


@pytest.mark.parametrize("q_lora", [RQ, None])
def test_mla_follows_kimis_rule(q_lora):
    """Per head: q_C and k_C times sqrt(gamma), q_R times gamma, the shared k_R as it is;
    logits q_C.k_C + q_R.k_R formed here on fixed latents (the inputs of the up-projections,
    after the RMSNorms the clip does not touch) and a fixed rotary key."""
    cfg = transformers.DeepseekV3Config(
        hidden_size=D, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora, kv_lora_rank=RKV,
        qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=DV, head_dim=ROPE,
        vocab_size=64, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
        attention_bias=True)
    torch.manual_seed(0)
    m = transformers.AutoModel.from_config(cfg).eval()
    att = m.layers[0].self_attn
    qmap = att.q_b_proj if q_lora else att.q_proj
    with torch.no_grad():
        for p in (qmap.bias, att.kv_b_proj.bias):
            if p is not None:
                p.normal_()
    zq, zkv, kr = _x(6, RQ if q_lora else D, 4), _x(6, RKV, 5), _x(6, ROPE, 6)

    def logits():
        q = qmap(zq).view(-1, H, NOPE + ROPE)
        kc = att.kv_b_proj(zkv).view(-1, H, NOPE + DV)[..., :NOPE]
        return (torch.einsum("qhd,khd->hqk", q[..., :NOPE], kc)
                + torch.einsum("qhd,kd->hqk", q[..., NOPE:], kr))

    with torch.no_grad():
        old, before = logits(), _state(m)
        rep = qk_clip_(m, {0: [TAU, 4 * TAU, math.inf, 1.0]}, tau=TAU)
        new = logits()
    assert [(r["head"], r["how"]) for r in rep] == [
        (1, "q_C^a k_C^(1-a), q_R by gamma, shared k_R as is (MLA)"), (2, "skipped: non-finite")]
    _check_scaled(new, old, {1: 0.25})
    w0 = before[f"layers.0.self_attn.{'q_b_proj' if q_lora else 'q_proj'}.weight"]
    w = qmap.weight.view(H, NOPE + ROPE, -1)
    w0 = w0.view(H, NOPE + ROPE, -1)
    torch.testing.assert_close(w[1, :NOPE], 0.5 * w0[1, :NOPE], rtol=1e-6, atol=0)
    torch.testing.assert_close(w[1, NOPE:], 0.25 * w0[1, NOPE:], rtol=1e-6, atol=0)
    kb = att.kv_b_proj.weight.view(H, NOPE + DV, RKV)
    kb0 = before["layers.0.self_attn.kv_b_proj.weight"].view(H, NOPE + DV, RKV)
    torch.testing.assert_close(kb[1, :NOPE], 0.5 * kb0[1, :NOPE], rtol=1e-6, atol=0)
    assert torch.equal(kb[1, NOPE:], kb0[1, NOPE:])  # the values stay
    moved = {k.rsplit(".", 1)[0] for k in _changed(m, before)}
    assert moved == {f"layers.0.self_attn.{'q_b_proj' if q_lora else 'q_proj'}",
                     "layers.0.self_attn.kv_b_proj"}  # kv_a (k_R) and the norms as they are


# ---- skipped and refused ---------------------------------------------------------------------
def test_qk_norm_heads_are_reported_and_left_alone():
    qw = hf.model_at_init(transformers.Qwen3Config(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=2, head_dim=DH,
        num_hidden_layers=2, intermediate_size=64, vocab_size=64), seed=0)
    before = _state(qw)
    rep = qk_clip_(qw, {0: [4 * TAU, TAU, 0.0, math.nan], 1: [1.0, 1.0, 1.0, 200.0]}, tau=TAU)
    assert [(r["layer"], r["head"], r["how"], r["gamma"]) for r in rep] == [
        (0, 0, "skipped: QK-norm", None), (0, 3, "skipped: non-finite", None),
        (1, 3, "skipped: QK-norm", None)]
    assert not _changed(qw, before)
    # sigprop's own qk-norm method (a hook on the projections) counts too
    m = _llama(kv=H)
    spec, _ = hf.spec_and_info(m.config, 16)
    M.apply_methods(m, ["qk-norm"], {}, M.context_for(m, spec))
    before = _state(m)
    rep = qk_clip_(m, {1: [4 * TAU, 0, 0, 0]})
    assert [r["how"] for r in rep] == ["skipped: QK-norm"] and not _changed(m, before)


@pytest.mark.parametrize("kw, field", [
    (dict(tau=0.0), "qk_clip.tau"), (dict(tau=-1.0), "qk_clip.tau"),
    (dict(tau=math.inf), "qk_clip.tau"), (dict(tau="x"), "qk_clip.tau"),
    (dict(alpha=-0.1), "qk_clip.alpha"), (dict(alpha=1.5), "qk_clip.alpha"),
    (dict(alpha=math.nan), "qk_clip.alpha"),
    (dict(max_logits={2: [1.0] * H}), "qk_clip.max_logits"),
    (dict(max_logits={True: [1.0] * H}), "qk_clip.max_logits"),
    (dict(max_logits={0: [4 * TAU] * H, 1: [1.0] * (H + 1)}), "qk_clip.max_logits"),
    (dict(max_logits={0: [[4 * TAU] * H]}), "qk_clip.max_logits"),
    (dict(max_logits=[[4 * TAU] * H]), "qk_clip.max_logits"),
])
def test_bad_arguments_name_the_field_and_touch_nothing(kw, field):
    m = _llama(kv=H)
    before = _state(m)
    args = {"max_logits": {0: [4 * TAU] * H}, **kw}
    with pytest.raises(SpecError) as err:
        qk_clip_(m, args.pop("max_logits"), **args)
    assert err.value.field == field and "\n" not in str(err.value)
    assert not _changed(m, before)


# ---- the registered method -------------------------------------------------------------------
def test_registered_method_changes_nothing_at_init_and_clips_after_a_step():
    meth = M.get("qk-clip")
    assert meth.title == "QK-Clip" and meth.theory == "measured only" and not meth.runtime
    assert meth.cite == "Kimi Team 2025 (Kimi K2, MuonClip)"
    params = {p.name: (p.default, p.lo, p.hi) for p in meth.params}
    assert params == {"tau": (100.0, 1e-3, 1e6), "alpha": (0.5, 0.0, 1.0)}
    m = _llama(kv=H)
    before = _state(m)
    spec, _ = hf.spec_and_info(m.config, 16)
    rep = M.apply_methods(m, ["qk-clip"], {"qk-clip": {"tau": 50}}, M.context_for(m, spec))
    assert not _changed(m, before) and "after each optimizer step" in rep.changes[0]
    assert rep.applied == [{"name": "qk-clip", "params": {"tau": 50.0, "alpha": 0.5}}]
    assert recorded_clip(m.config) == {"tau": 50.0, "alpha": 0.5}
    assert m.config.sigprop_fix["applied"] == ["qk-clip"]
    x = _x()
    old = _llama_logits(m, 0, x)
    out = meth.after_step(m, {0: [0, 0, 200.0, 0]}, recorded_clip(m.config))
    assert [(r["head"], r["gamma"]) for r in out] == [(2, 0.25)]
    _check_scaled(_llama_logits(m, 0, x), old, {2: 0.25})
    with pytest.raises(SpecError, match=r"qk-clip.tau: must be a number in"):
        meth.after_step(m, {}, {"tau": 0})
    with pytest.raises(SpecError, match=r"qk-clip.beta: unknown parameter"):
        meth.after_step(m, {}, {"beta": 1})
    with pytest.raises(SpecError, match=r"qk-clip.alpha: must be a number in"):
        M.get("qk-clip").resolve(M.Context(spec=spec), {"alpha": 2})


# ---- end to end: the model's own attention ---------------------------------------------------
def _e2e_model(kind: str):
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=D, n_head=H, vocab_size=64,
                                      n_positions=32, initializer_range=0.2)
    elif kind == "mla":
        cfg = transformers.DeepseekV3Config(
            hidden_size=D, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=H, num_key_value_heads=H, q_lora_rank=RQ, kv_lora_rank=RKV,
            qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=DV, head_dim=ROPE,
            vocab_size=64, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
            initializer_range=0.3)
    else:
        cfg = transformers.LlamaConfig(hidden_size=D, num_attention_heads=H,
                                       num_key_value_heads=H if kind == "llama" else 2,
                                       head_dim=DH, num_hidden_layers=2, intermediate_size=64,
                                       vocab_size=64, initializer_range=0.3)
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(cfg, attn_implementation="eager").eval()


def _centred_log_probs(m, ids) -> torch.Tensor:
    """Layer 0's (H, T, T) log-probabilities minus each row's mean over its visible keys:
    the logits up to a per-row constant (causal rows see keys 0..i)."""
    with torch.no_grad():
        a = m(input_ids=ids, output_attentions=True).attentions[0][0].double()
    T = a.shape[-1]
    vis = torch.ones(T, T, dtype=torch.bool).tril()
    lp = torch.where(vis, a.clamp_min(1e-300).log(), 0.0)
    mean = lp.sum(-1, keepdim=True) / vis.sum(-1, keepdim=True)
    return torch.where(vis, lp - mean, 0.0)


@pytest.mark.parametrize("kind", ["llama", "gqa", "gpt2", "mla"])
def test_the_models_own_logits_scale_by_gamma(kind):
    """Through the model's forward pass (RoPE, the norms, the real layout): layer 0's
    logits, read back from its attention probabilities up to each row's constant, are gamma
    times the old ones for the clipped head, the same for the others."""
    m = _e2e_model(kind)
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(0))
    old = _centred_log_probs(m, ids)
    assert float(old.abs().max()) > 0.5  # logits with some spread: the ratio is seen
    rep = qk_clip_(m, {0: [TAU, 3 * TAU, TAU / 3, 0.0]}, tau=TAU)
    assert [(r["head"], r["gamma"]) for r in rep] == [(1, pytest.approx(1 / 3, rel=1e-15))]
    new = _centred_log_probs(m, ids)
    torch.testing.assert_close(new[1], old[1] / 3, rtol=0, atol=1e-4)
    for h in (0, 2, 3):
        torch.testing.assert_close(new[h], old[h], rtol=0, atol=1e-6)


@pytest.mark.slow  # ~25 s on 2 cores (24 blocks): `make test-slow`
def test_fix_compare_train_steps_clips_after_every_step(monkeypatch):
    """`fix --compare --train-steps`: the qk-clip arm trains with the clip after each
    optimizer step (a tau below the small model's logits: clips happen), the baseline arm
    without any telemetry."""
    from types import SimpleNamespace

    from sigprop import models as hf
    from sigprop.analysis import compare_train as ct
    from sigprop.training import health as H

    seen = []
    orig = H.AttentionHealth.after_step

    def spy(self, step=None):
        out = orig(self, step)
        seen.append((self.qk_clip, sum(e.kind == "qk_clip" for e in self.events)))
        return out

    monkeypatch.setattr(H.AttentionHealth, "after_step", spy)
    cfg = hf.load_config("bert-tiny-collapse")
    spec = hf.spec_from_config(cfg, 32)
    gains, _ = ct.train_gains(cfg, spec, ["qk-clip"], {"qk-clip": {"tau": 0.01}},
                              {"qk-clip": SimpleNamespace(error=None)}, steps=3)
    assert set(gains) == {"baseline", "qk-clip"}
    assert all(g is not None for g in gains.values())
    assert len(seen) == 3 and all(tau == 0.01 for tau, _ in seen)  # the clip arm only
    assert seen[-1][1] > 0
