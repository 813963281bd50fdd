"""QK-Clip's certified rule (``AttentionHealth(clip_on="bound")``,
sigprop.models.methods.qk_bound): the per-head bound on |logit| over every input, read from the
weights and the gain of the norm feeding the attention, holds on random and adversarial inputs
(logits formed here by hand from each block's own norm and projections, RoPE by transformers'
own function) and is reached within a stated factor by inputs aligned with the heads' top
singular directions; after the clip every head's logit is at most tau on fresh batches and on
those aligned inputs; a model it cannot bound is refused in one line; nothing moves when every
bound is already below tau."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from sigprop.measurement.telemetry import AttentionTelemetry
from sigprop.models import loading
from sigprop.models.methods.qk_bound import LogitBound, norm_affine
from sigprop.spec import SpecError
from sigprop.training.health import AttentionHealth

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

D, H, KV, DH, V = 64, 4, 2, 16, 100
#: float32 logits against a float64 bound
REL = 1e-5


def _scaled(m, names, seed, scale):
    """W_Q / W_K times ``scale``; their biases and the attention norms' gain and bias drawn
    (so every term of the bound is exercised)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if any(s + ".weight" in n for s in names["proj"]):
                p.mul_(scale)
            elif any(s + ".bias" in n for s in names["proj"]) or \
                    any(s + ".bias" in n for s in names["norm"]):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif any(s + ".weight" in n for s in names["norm"]):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return m


def _build(cls, cfg, seed):
    """The causal LM at init, drawn under ``seed`` (the caller's RNG state restored)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return cls(cfg).train()


def _gpt2(seed=0, scale=4.0):
    cfg = transformers.GPT2Config(n_embd=D, n_layer=2, n_head=H, vocab_size=V, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return _scaled(_build(transformers.GPT2LMHeadModel, cfg, seed),
                   {"proj": ("c_attn",), "norm": ("ln_1",)}, seed, scale)


def _llama(seed=0, scale=4.0):
    cfg = transformers.LlamaConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=KV,
                                   head_dim=DH, num_hidden_layers=2, intermediate_size=64,
                                   vocab_size=V, attention_bias=True,
                                   max_position_embeddings=64)
    return _scaled(_build(transformers.LlamaForCausalLM, cfg, seed),
                   {"proj": ("q_proj", "k_proj"), "norm": ("input_layernorm",)}, seed, scale)


# ---- the logits by hand: every (query, key) pair, (B, H, T, T) ---------------------------
def _gpt2_logits(m, i, x):
    blk = m.transformer.h[i]
    att = blk.attn
    B, T, _ = x.shape
    q, k, _ = att.c_attn(blk.ln_1(x)).split(D, dim=-1)
    q = q.view(B, T, H, DH).transpose(1, 2)
    k = k.view(B, T, H, DH).transpose(1, 2)
    return (q @ k.transpose(-1, -2)) * (DH ** -0.5)


def _llama_logits(m, i, x):
    layer = m.model.layers[i]
    att = layer.self_attn
    B, T, _ = x.shape
    h = layer.input_layernorm(x)
    q = att.q_proj(h).view(B, T, H, DH).transpose(1, 2)
    k = att.k_proj(h).view(B, T, KV, DH).transpose(1, 2)
    cos, sin = m.model.rotary_emb(h, torch.arange(T)[None].expand(B, T))
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k = k.repeat_interleave(H // KV, dim=1)
    return (q @ k.transpose(-1, -2)) * (DH ** -0.5)


def _random_inputs(seed, B=8, T=32):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(B, T, D, generator=g) * s for s in (1.0, 100.0)]
    xs.append(torch.randn(B, T, D, generator=g) + 5.0)  # a large mean
    heavy = torch.randn(B, T, D, generator=g)
    heavy[..., :3] *= 50  # outlier features
    return xs + [heavy]


def _gpt2_aligned(m, i):
    """Per head, the largest |logit| of inputs whose query and key norm outputs are the top
    singular pair of the head's bilinear form restricted to mean-zero vectors (a LayerNorm's
    z), at length sqrt(d)."""
    blk = m.transformer.h[i]
    W = blk.attn.c_attn.weight.detach().double()  # Conv1D: (in, out)
    g = blk.ln_1.weight.detach().double()
    P0 = torch.eye(D, dtype=torch.float64) - 1.0 / D
    out = []
    for h in range(H):
        A = W[:, h * DH:(h + 1) * DH].T * g
        C = W[:, D + h * DH:D + (h + 1) * DH].T * g
        U, _, Vh = torch.linalg.svd(P0 @ A.T @ C @ P0)
        best = 0.0
        for sq in (1, -1):
            for sk in (1, -1):
                x = math.sqrt(D) * torch.stack([sk * Vh[0], sq * U[:, 0]])[None].float()
                best = max(best, float(_gpt2_logits(m, i, x)[0, h].abs().max()))
        out.append(best)
    return torch.tensor(out, dtype=torch.float64)


def _llama_aligned(m, i, T=32):
    """Per head, a query input along W_Q's top right singular vector (times the gain) at
    position P, and a key input at position 0 chosen so the key points along the rotated
    query; the largest |logit| over P."""
    layer = m.model.layers[i]
    att = layer.self_attn
    g = layer.input_layernorm.weight.detach().double()
    wq, bq = att.q_proj.weight.detach().double(), att.q_proj.bias.detach().double()
    wk = att.k_proj.weight.detach().double()
    out = []
    for h in range(H):
        j = h // (H // KV)
        A, a = wq[h * DH:(h + 1) * DH] * g, bq[h * DH:(h + 1) * DH]
        C = wk[j * DH:(j + 1) * DH] * g
        zq = math.sqrt(D) * torch.linalg.svd(A).Vh[0]
        zq = zq if float((A @ zq) @ a) >= 0 else -zq
        q = (A @ zq + a).float()
        best = 0.0
        for P in range(1, T):
            cos, sin = m.model.rotary_emb(q[None, None], torch.tensor([[P]]))
            qp, _ = apply_rotary_pos_emb(q.view(1, 1, 1, DH), q.view(1, 1, 1, DH), cos, sin)
            zk = C.T @ qp.reshape(-1).double()
            x = torch.zeros(1, P + 1, D)
            x[0, 0] = (math.sqrt(D) * zk / zk.norm()).float()
            x[0, P] = zq.float()
            best = max(best, float(_llama_logits(m, i, x)[0, h, P, 0].abs()))
        out.append(best)
    return torch.tensor(out, dtype=torch.float64)


ARCHS = {"gpt2": (_gpt2, _gpt2_logits, _gpt2_aligned, 0.6),
         "llama": (_llama, _llama_logits, _llama_aligned, 0.35)}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_the_bound_holds_on_every_input_and_aligned_inputs_come_near_it(arch):
    """GPT-2 (biases, LayerNorm gain and bias drawn; the bilinear bound) and Llama (RoPE,
    GQA 4 query heads on 2 K heads, Q/K biases, RMSNorm gain drawn; the rotary-safe
    product bound), W_Q / W_K scaled up 4x, two seeds: no head's |logit| on random inputs
    (unit, x100, a large mean, outlier features) or on aligned ones passes its bound; the
    aligned inputs reach at least 0.6 (GPT-2) / 0.35 (Llama) of it (measured: 0.67-0.84 and
    0.43-0.65; Llama's bound assumes the rotated query and the key can align at full length,
    which RoPE at the positions tried allows only in part)."""
    make, logits, aligned, factor = ARCHS[arch]
    for seed in (0, 1):
        m = make(seed)
        lb = LogitBound(m)
        layers = lb.layers()
        assert set(layers) == {0, 1}
        for i, got in layers.items():
            assert got.kind == (("product",) * H if arch == "llama" else got.kind)
            assert (got.bilinear is None) == (arch == "llama")
            bound = got.bound
            with torch.no_grad():
                for x in _random_inputs(seed):
                    worst = logits(m, i, x).abs().amax((0, 2, 3)).double()
                    assert bool((worst <= bound * (1 + REL)).all()), (worst, bound)
                near = aligned(m, i)
            assert bool((near <= bound * (1 + REL)).all()), (near, bound)
            assert bool((near >= factor * bound).all()), (near / bound, factor)


def test_a_norm_is_read_as_its_gain_and_bias():
    """nn.LayerNorm (gain, bias), an HF RMSNorm, a Gemma-style ``1 + weight`` RMSNorm and an
    odd width give back their gain and bias (1e-5); a module that is not scale invariant,
    or scale invariant but not elementwise-affine, is refused with its reason."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)

    class OnePlus(nn.Module):  # Gemma's form
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(0.3 * torch.randn(d, generator=g))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)

    for d in (64, 33):
        ln = nn.LayerNorm(d)
        rms = LlamaRMSNorm(d)
        with torch.no_grad():
            ln.weight.copy_(torch.randn(d, generator=g))
            ln.bias.copy_(torch.randn(d, generator=g))
            rms.weight.copy_(torch.randn(d, generator=g))
        one = OnePlus(d)
        for norm, gain, bias in ((ln, ln.weight, ln.bias), (rms, rms.weight, None),
                                 (one, 1 + one.weight, None)):
            got_g, got_b = norm_affine(norm, d)
            assert torch.allclose(got_g, gain.detach().double(), rtol=1e-5, atol=1e-5)
            want_b = torch.zeros(d, dtype=torch.float64) if bias is None else bias.double()
            assert torch.allclose(got_b, want_b.detach(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="scale invariant"):
        norm_affine(nn.Linear(8, 8), 8)

    class Rotate(nn.Module):  # scale invariant, but mixes features
        def forward(self, x):
            return torch.roll(x / x.norm(dim=-1, keepdim=True), 1, -1)

    with pytest.raises(ValueError, match="LayerNorm or RMSNorm"):
        norm_affine(Rotate(), 8)


def _train_steps(m, health, steps, seed, lr=0.05, check=None):
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids = torch.randint(0, V, (4, 24), generator=g)
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        health.after_step(step)
        if check is not None:
            check(step, g)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_after_the_bound_clip_every_batch_stays_at_tau(arch):
    """With ``clip_on="bound"`` (tau 8, W_Q / W_K scaled so that every bound starts above
    it; GPT-2 read every second step, the clip still runs on every step): after each AdamW
    step (lr 0.05, which moves the bounds well past tau), the recomputed bounds are at tau
    (1e-6), and on fresh random batches (read by a second telemetry), on random inputs and
    on the aligned inputs (by hand) every head's largest logit is <= tau (1e-5 relative);
    the aligned ones come within the stated factor of tau (the clip does not overshoot).
    Events name each clipped head's bound; scalars carry the bounds."""
    make, logits, aligned, factor = ARCHS[arch]
    tau = 8.0
    m = make(0)
    assert min(float(b.min()) for b in LogitBound(m).bounds().values()) > tau
    every = 2 if arch == "gpt2" else 1
    health = AttentionHealth(m, qk_clip=tau, clip_on="bound", warn=False, every=every,
                             per_head=True)
    first = [e for e in health.events if e.kind == "qk_clip"]
    assert len(first) == 2 * H and {e.what for e in first} == {"logit_bound"}
    assert all(e.value > tau and e.step == -1 for e in first)
    assert "logit bound" in first[0].message()
    fresh = AttentionTelemetry(m, grad_only=False)
    seen = {"clips": 0, "worst": 0.0}

    def check(step, g):
        bounds = health.bound.bounds()
        assert all(float(b.max()) <= tau * (1 + 1e-6) for b in bounds.values())
        with torch.no_grad():
            m(input_ids=torch.randint(0, V, (4, 24), generator=g))
            read = fresh.end_step(step)
            for i in (0, 1):
                for x in _random_inputs(step, B=2, T=16):
                    seen["worst"] = max(seen["worst"], float(logits(m, i, x).abs().max()))
                near = aligned(m, i)
                assert bool((near <= tau * (1 + REL)).all()), near
                assert bool((near >= factor * tau).all()), near
        seen["worst"] = max(seen["worst"], *(float(v["max_logit"].max())
                                            for v in read.values()))

    _train_steps(m, health, 4, seed=0, check=check)
    health.close()
    fresh.close()
    assert seen["worst"] <= tau * (1 + REL)
    clips = [e for e in health.events if e.kind == "qk_clip" and e.step >= 0]
    assert {e.step for e in clips} == {0, 1, 2, 3}  # every step, read (every 2) or not
    assert all(e.what == "logit_bound" and e.value > tau for e in clips)
    sc = health.scalars[-1]
    assert sc["attention/logit_bound"] > tau
    assert {"attention/logit_bound/L0", "attention/logit_bound/L1.H3"} <= set(sc)


def test_nothing_moves_when_every_bound_is_below_tau():
    """Bounds already below tau (Llama at init, tau 1e4): construction and steps without an
    optimizer update leave every weight bit-identical, and no head is clipped."""
    m = _llama(0, scale=1.0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    top = max(float(b.max()) for b in LogitBound(m).bounds().values())
    assert top < 1e4
    health = AttentionHealth(m, qk_clip=1e4, clip_on="bound", warn=False)
    for step in range(2):
        m(input_ids=torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(step)))
        sc = health.after_step(step)
        assert sc["attention/logit_bound"] == pytest.approx(top, rel=1e-12)
    health.close()
    assert not [e for e in health.events if e.kind == "qk_clip"]
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def _no_dropout_gpt2():
    return _gpt2(0, scale=1.0)


def _raw_stream():  # the first block's attention reads the embeddings themselves
    m = _no_dropout_gpt2()
    m.transformer.h[0].ln_1 = nn.Identity()
    return m


def _dropout_between():  # a dropout between the norm and the projection
    m = _no_dropout_gpt2()
    m.transformer.h[1].ln_1 = nn.Sequential(m.transformer.h[1].ln_1, nn.Dropout(0.1))
    return m


class ShiftNorm(nn.Module):  # named like a norm, but not scale invariant
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * x


def _not_a_norm():
    m = _no_dropout_gpt2()
    m.transformer.h[1].ln_1 = ShiftNorm(D)
    return m


def _qk_norm():
    return loading.model_at_init(loading.load_config(dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=300,
        max_position_embeddings=256)), seed=0)


def _mla():
    return loading.model_at_init(loading.load_config(dict(
        model_type="deepseek_v3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, vocab_size=300, max_position_embeddings=256)),
        seed=0)


def _no_config():  # sigprop cannot make its inputs: no config naming a vocabulary
    m = _no_dropout_gpt2().transformer
    del m.config
    return m


@pytest.mark.parametrize("make, words", [
    (_raw_stream, "transformer.h.0: the q projection's input is not a norm's output"),
    (_dropout_between, "transformer.h.1: the q projection's input is not a norm's output"),
    (_not_a_norm, "transformer.h.1: the norm feeding its attention (transformer.h.1.ln_1) "
                  "cannot be read: it is not scale invariant"),
    (_qk_norm, "QK-norm"),
    (_mla, "multi-head latent attention"),
    (_no_config, "no config naming a vocabulary"),
])
def test_a_model_it_cannot_bound_is_refused_in_one_line(make, words):
    """Refused at construction, one line naming ``clip_on`` and what is missing (a raw
    stream, dropout between the norm and the projection, a "norm" that is not scale
    invariant, QK-norm, MLA, no forward on token ids); no hook is left on the model and no
    weight moved."""
    m = make()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(SpecError) as err:
        AttentionHealth(m, qk_clip=5.0, clip_on="bound", warn=False)
    msg = str(err.value)
    assert err.value.field == "clip_on" and "\n" not in msg and words in msg, msg
    assert msg.startswith("clip_on: 'bound' cannot bound this model's logits:")
    assert not any(x._forward_hooks or x._forward_pre_hooks for x in m.modules())
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_the_instability_experiment_takes_the_bound_rule():
    """``InstabilityConfig(clip_on="bound")``: the qk-clip arm's every step is at most tau,
    and the per-step bounds (before each clip) are recorded."""
    from sigprop.training.instability import InstabilityConfig, run_instability

    cfg = InstabilityConfig(arch="gpt2", steps=8, lr=0.05, warmup=0, d_model=32, layers=1,
                            heads=2, seq_len=16, batch=4, documents=300, vocab=500, tau=2.0,
                            spike_after=2, window=5, rows=4, clip_on="bound")
    res = run_instability(1, fixes=("qk-clip",), config=cfg)
    steps = res.steps
    assert float(steps["max_logit"].max()) <= cfg.tau * (1 + REL)
    assert float(steps["logit_bound"].max()) > cfg.tau  # the updates pass tau; the clip acts
    run = res.runs.iloc[0]
    assert run["qk_clips"] > 0 and run["max_logit_bound"] > cfg.tau
    with pytest.raises(SpecError, match="clip_on"):
        run_instability(1, fixes=("qk-clip",), config=replace(cfg, clip_on="later"))
