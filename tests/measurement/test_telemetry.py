"""In-step attention telemetry (sigprop.measurement.telemetry): the exact largest logit
against a computation by hand from the projections, the sampled-row statistics and their
stated standard error, no effect on training numerics, steps read and merged."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from sigprop.measurement.probe import Probe
from sigprop.measurement.telemetry import AttentionTelemetry, rows_of
from sigprop.models import loading
from sigprop.spec import SpecError

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, vocab_size=300,
             max_position_embeddings=256, initializer_range=0.3)
GPT2 = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=256,
            initializer_range=0.3, bos_token_id=0, eos_token_id=0)
BERT = dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, vocab_size=300, initializer_range=0.3)


def _model(cfg, impl="sdpa"):
    return loading.model_at_init(loading.load_config(cfg), seed=0, attn_implementation=impl)


def _ids(B=2, T=48, seed=1):
    return torch.randint(3, 300, (B, T), generator=torch.Generator().manual_seed(seed))


def test_max_logit_is_exact_for_a_rope_gqa_decoder():
    """Layer 0 of a Llama with grouped KV heads: the largest causal logit per head, computed
    here from the layer's input through its own projections, HF's RoPE and repeat-KV, equals
    the telemetry's (float32 both; 1e-5 relative)."""
    m = _model(LLAMA)
    att = m.layers[0].self_attn
    got = {}

    def grab(mod, args, kwargs):
        got["x"] = kwargs.get("hidden_states", args[0] if args else None)
        got["pos"] = kwargs["position_embeddings"]

    h = att.register_forward_pre_hook(grab, with_kwargs=True)
    tel = AttentionTelemetry(m, rows=4)
    ids = _ids()
    with torch.no_grad(), torch.enable_grad():
        m(input_ids=ids)
    st = tel.end_step(0)
    h.remove()
    tel.close()
    x, (cos, sin) = got["x"].detach(), got["pos"]
    B, T, _ = x.shape
    q = att.q_proj(x).view(B, T, 4, 16).transpose(1, 2)
    k = att.k_proj(x).view(B, T, 2, 16).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k = k.repeat_interleave(2, dim=1)
    s = (q @ k.transpose(-1, -2)) * 16 ** -0.5
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    want = s.amax((-1, -2)).amax(0)
    assert torch.allclose(st[0]["max_logit"], want.detach(), rtol=1e-5, atol=0), \
        (st[0]["max_logit"], want)
    assert want.max() > 1.0  # large enough to mean something (initializer_range 0.3)


def test_max_logit_skips_padded_keys_of_an_encoder():
    """BERT with a padded second sequence: the padded keys never count (by hand: the largest
    logit over the visible keys of each sequence)."""
    m = _model(BERT, "eager")
    m.eval()
    ids = _ids(2, 32)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    att = m.encoder.layer[0].attention.self
    got = {}
    h = att.register_forward_pre_hook(
        lambda mod, a, kw: got.update(x=kw.get("hidden_states", a[0] if a else None)),
        with_kwargs=True)
    tel = AttentionTelemetry(m, rows=4, grad_only=False)
    with torch.no_grad():
        m(input_ids=ids, attention_mask=mask)
    st = tel.end_step(0)
    h.remove()
    x = got["x"]
    q = att.query(x).view(2, 32, 4, 16).transpose(1, 2)
    k = att.key(x).view(2, 32, 4, 16).transpose(1, 2)
    s = (q @ k.transpose(-1, -2)) / 4.0
    s = s.masked_fill(~mask.bool()[:, None, None, :], -math.inf)
    want = s.amax((-1, -2)).amax(0)
    assert torch.allclose(st[0]["max_logit"], want, rtol=1e-5, atol=0)
    # with the padding counted the answer would differ: the test can fail
    assert not torch.allclose(((q @ k.transpose(-1, -2)) / 4.0).amax((-1, -2)).amax(0), want)


def test_every_row_read_gives_the_probes_full_statistics():
    """rows >= T: every query row is read, so entropy, ipr and wmax equal the probe's
    full-map statistics (float64 there; 1e-4) and the standard error is zero."""
    m = _model(GPT2, "eager")
    m.eval()
    ids = _ids(2, 24)
    with Probe(m) as p, torch.no_grad():
        m(input_ids=ids)
    tel = AttentionTelemetry(m, rows=64, grad_only=False)
    with torch.no_grad():
        m(input_ids=ids)
    st = tel.end_step(0)
    for layer in (0, 1):
        full = p.attention_stats[layer]
        assert torch.allclose(st[layer]["ipr"].double(), full["ipr"].mean(0), atol=1e-4)
        assert torch.allclose(st[layer]["wmax"].double(), full["wmax"].mean(0), atol=1e-4)
        assert torch.allclose(st[layer]["entropy"].double(), full["entropy"].mean(0), atol=1e-4)
        assert float(st[layer]["entropy_se"].abs().max()) == 0.0


def test_sampled_rows_stay_within_their_stated_error():
    """16 of 128 rows, 40 draws (seeds): the sampled entropy of every head lies within 3
    standard errors of the all-rows value in at least 90% of the (draw, head) cases (a
    normal estimate is inside 3 se 99.7% of the time; the margin covers the se's own
    noise at 16 rows), and the errors are not all tiny (the se is not inflated 10x)."""
    cfg = dict(LLAMA, initializer_range=0.15)
    m = _model(cfg)
    m.eval()
    ids = _ids(1, 128, seed=5)
    tel = AttentionTelemetry(m, rows=128, grad_only=False)
    with torch.no_grad():
        m(input_ids=ids)
    full = tel.end_step(0)[1]["entropy"]
    tel.close()
    inside, total, z = 0, 0, []
    for seed in range(40):
        tel = AttentionTelemetry(m, rows=16, seed=seed, grad_only=False)
        with torch.no_grad():
            m(input_ids=ids)
        st = tel.end_step(0)[1]
        tel.close()
        assert bool((st["entropy_se"] > 0).all())
        d = (st["entropy"] - full).abs() / st["entropy_se"]
        inside += int((d <= 3).sum())
        total += d.numel()
        z += d.tolist()
    assert inside >= 0.9 * total, (inside, total)
    assert sorted(z)[len(z) // 2] > 0.2  # median |z| ~0.67 for a right-sized se


def test_training_numerics_are_unchanged_with_telemetry_on():
    """GPT-2 with dropout active, 4 AdamW steps from the same seed: identical losses with and
    without the telemetry (its row sampling never draws from torch's global RNG)."""
    cfg = dict(GPT2, initializer_range=0.02)

    from transformers import AutoModelForCausalLM

    def run(on: bool):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(loading.load_config(cfg), attn_implementation="sdpa")
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        tel = AttentionTelemetry(m, rows=8) if on else None
        losses = []
        for step in range(4):
            ids = _ids(4, 32, seed=step)
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            if tel is not None:
                assert set(tel.end_step(step)) == {0, 1}
        return losses

    assert run(True) == run(False)


def test_every_k_steps_and_merged_micro_batches():
    m = _model(LLAMA)
    tel = AttentionTelemetry(m, rows=4, every=3)
    seen = []
    for step in range(6):
        m(input_ids=_ids(1, 16, seed=step))
        seen.append(bool(tel.end_step(step)))
    assert seen == [True, False, False, True, False, False]
    # two micro-batches in one step: the larger maximum of the two
    singles = []
    for seed in (1, 2):
        t = AttentionTelemetry(m, rows=4, start=0)
        m(input_ids=_ids(1, 16, seed=seed))
        singles.append(t.end_step(0)[0]["max_logit"])
        t.close()
    t = AttentionTelemetry(m, rows=4)
    m(input_ids=_ids(1, 16, seed=1))
    m(input_ids=_ids(1, 16, seed=2))
    both = t.end_step(0)[0]["max_logit"]
    assert torch.equal(both, torch.maximum(*singles))
    rows = rows_of(t.end_step(1), 1)
    assert rows == []  # nothing ran in step 1



def test_calls_of_different_shapes_in_one_step_merge_as_read_alone():
    """The sampled rows' statistics are formed at end_step for every call at once, grouped by
    shape: two micro-batches of different lengths (T 24 and 40) in one step give the merge
    (maximum of max_logit, mean of the rest) of the same calls read in separate runs of the
    same step number (same rows: they depend on seed, step, layer and T only)."""
    m = _model(GPT2)
    ids = (_ids(2, 24, seed=1), _ids(2, 40, seed=2))
    singles = []
    for x in ids:
        t = AttentionTelemetry(m, rows=8, start=0)
        m(input_ids=x)
        singles.append(t.end_step(0))
        t.close()
    t = AttentionTelemetry(m, rows=8)
    for x in ids:
        m(input_ids=x)
    both = t.end_step(0)
    t.close()
    assert set(both) == {0, 1}
    for layer in (0, 1):
        a, b = singles[0][layer], singles[1][layer]
        for key, got in both[layer].items():
            want = torch.maximum(a[key], b[key]) if key == "max_logit" else \
                torch.stack([a[key], b[key]]).nanmean(0)
            assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), (layer, key, got, want)
        assert not torch.equal(a["entropy"], b["entropy"])  # two different readings

def test_evaluation_forwards_are_not_read_by_default():
    m = _model(LLAMA)
    tel = AttentionTelemetry(m, rows=4)
    with torch.no_grad():
        m(input_ids=_ids(1, 16))
    assert tel.end_step(0) == {}


def test_a_model_without_attention_and_bad_options_are_one_line():
    with pytest.raises(SpecError, match=r"^model: Sequential: no block list found"):
        AttentionTelemetry(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
    with pytest.raises(SpecError, match=r"^model: ModuleList: no attention layer"):
        AttentionTelemetry(blocks, layers=list(blocks))
    m = _model(LLAMA)
    for kw, field in ((dict(rows=0), "rows"), (dict(every=0), "every"),
                      (dict(seed="x"), "seed")):
        with pytest.raises(SpecError, match=f"^{field}: "):
            AttentionTelemetry(m, **kw)


def test_non_finite_logits_are_reported_not_raised():
    m = _model(LLAMA)
    with torch.no_grad():
        m.layers[1].self_attn.q_proj.weight[:16] = math.inf  # head 0 of layer 1
    tel = AttentionTelemetry(m, rows=4)
    m(input_ids=_ids(1, 16))
    st = tel.end_step(0)
    assert not math.isfinite(float(st[1]["max_logit"][0]))
    assert math.isfinite(float(st[0]["max_logit"][0]))


def test_every_stack_is_read_in_a_multimodal_model():
    """Gemma 3 (vision tower + language model): on token ids alone the language model's
    layers run and are read, indexed after the tower's in module order."""
    from sigprop.models import zoo

    cfg, _ = zoo.small_config("gemma3")
    m = loading.model_at_init(loading.load_config(cfg), seed=0)
    tel = AttentionTelemetry(m, rows=4)
    names = [n for n, _ in tel.blocks]
    lang = [i for i, n in enumerate(names) if n.startswith("language_model.")]
    assert lang and any(n.startswith("vision_tower.") for n in names)
    m(input_ids=_ids(1, 16))
    assert set(tel.end_step(0)) == set(lang)


def test_sigprops_own_stack_is_read():
    """sigprop's own seed-sliced stack (no projection modules): the largest logit equals the
    one of its own scores (BatchedAttention.scores, causal mask) over every slice and
    sequence."""
    from sigprop.spec import ArchSpec
    from sigprop.training.config import TrainConfig
    from sigprop.training.task import TaskModel

    spec = ArchSpec(depth=2, d_model=32, heads=2, seq_len=16, causal=True, qk_std=0.3)
    m = TaskModel(spec, TrainConfig(task="clm", seeds=2), vocab=100)
    tel = AttentionTelemetry(m, rows=4)
    assert tel.attention_layers == [0, 1]
    att = m.body.blocks[1].attn
    got = {}
    h = att.register_forward_pre_hook(lambda mod, a: got.update(x=a[0].detach()))
    x = torch.randint(0, 100, (3, 16), generator=torch.Generator().manual_seed(0))
    m.features(x).sum().backward()
    h.remove()
    st = tel.end_step(0)
    sc = att.scores(got["x"])  # (S, B, H, T, T)
    sc = sc.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), -math.inf)
    want = sc.amax((-1, -2)).amax((0, 1))
    assert torch.allclose(st[1]["max_logit"], want.detach(), rtol=1e-5, atol=0)
    assert want.max() > 0.5


def test_own_stack_reads_each_slice_on_its_own():
    """Stacked initialisations are independent runs: ``slice:max_logit`` is each slice's own
    largest logit (against its scores), and with every row read (rows = T, so no sampling)
    ``slice:entropy`` is each slice's mean normalised row entropy over its first two
    sequences, computed here from the softmax of its scores; the per-head values are the
    maximum / mean over slices. Slice 1's Q/K are scaled x3 so the slices differ."""
    from sigprop.spec import ArchSpec
    from sigprop.training.config import TrainConfig
    from sigprop.training.task import TaskModel

    spec = ArchSpec(depth=1, d_model=32, heads=2, seq_len=12, causal=True, qk_std=0.3)
    m = TaskModel(spec, TrainConfig(task="clm", seeds=2), vocab=100)
    att = m.body.blocks[0].attn
    with torch.no_grad():
        att.w_q[1].mul_(3.0)
    tel = AttentionTelemetry(m, rows=12)
    got = {}
    h = att.register_forward_pre_hook(lambda mod, a: got.update(x=a[0].detach()))
    x = torch.randint(0, 100, (3, 12), generator=torch.Generator().manual_seed(1))
    m.features(x).sum().backward()
    h.remove()
    st = tel.end_step(0)[0]
    sc = att.scores(got["x"]).detach()  # (S, B, H, T, T)
    sc = sc.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), -math.inf)
    want_max = sc.amax((-1, -2)).amax(1)  # (S, H)
    assert st["slice:max_logit"].shape == (2, 2)
    assert torch.allclose(st["slice:max_logit"], want_max, rtol=1e-5, atol=0)
    assert torch.allclose(st["max_logit"], want_max.amax(0), rtol=1e-5, atol=0)
    p = sc[:, :2].softmax(-1)  # the first two sequences of each slice
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (S, 2, H, T)
    n = torch.arange(1, 13, dtype=ent.dtype)
    ent = (ent[..., 1:] / n[1:].log())  # rows with >= 2 keys
    want_ent = ent.mean((1, 3))  # (S, H)
    assert torch.allclose(st["slice:entropy"], want_ent, atol=1e-5)
    assert float((want_ent[0] - want_ent[1]).abs().min()) > 0.05  # the slices do differ
    assert torch.allclose(st["entropy"], ent.mean((0, 1, 3)), atol=1e-5)


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama-rope-gqa", "gpt2-fused"])
def test_max_logit_now_forms_the_step_inputs_through_the_current_weights(cfg):
    """``keep_inputs``: after the step, the last layer's Q/K weights change (every layer's
    input is then the same as in the step); ``max_logit_now`` equals the largest logit a
    fresh telemetry reads from the same batch with the changed weights (1e-5), and differs
    from the step's own reading."""
    m = _model(cfg)
    ids = _ids(2, 32)
    tel = AttentionTelemetry(m, rows=4, keep_inputs=True)
    m(input_ids=ids).last_hidden_state.sum().backward()
    step = tel.end_step(0)
    last = m.layers[-1].self_attn if cfg is LLAMA else m.h[-1].attn
    with torch.no_grad():
        if cfg is LLAMA:
            last.q_proj.weight.mul_(2.5)
        else:
            last.c_attn.weight[:, :64].mul_(2.5)  # W_Q's columns of the fused map
    now = tel.max_logit_now()
    tel.close()
    fresh = AttentionTelemetry(m, rows=4)
    m(input_ids=ids).last_hidden_state.sum().backward()
    want = fresh.end_step(0)
    fresh.close()
    for i in (0, 1):
        assert torch.allclose(now[i]["max_logit"], want[i]["max_logit"], rtol=1e-5, atol=1e-6)
    assert torch.allclose(now[0]["max_logit"], step[0]["max_logit"], rtol=1e-5)
    assert not torch.allclose(now[1]["max_logit"], step[1]["max_logit"], rtol=1e-2)
    with pytest.raises(SpecError, match="keep_inputs"):
        fresh.max_logit_now()


def test_a_projection_returning_a_tuple_is_read():
    """I-BERT's quantised linear layers return (output, scaling factor): the first element is
    the projection's output. Its largest logit equals one computed here from the layer's own
    query / key outputs (1e-5 relative)."""
    cfg = dict(model_type="ibert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, vocab_size=300)
    m = _model(cfg, "eager")
    att = m.encoder.layer[0].attention.self
    got = {}
    hs = [att.query.register_forward_hook(lambda mod, a, out: got.__setitem__("q", out[0])),
          att.key.register_forward_hook(lambda mod, a, out: got.__setitem__("k", out[0]))]
    tel = AttentionTelemetry(m, rows=4)
    m(input_ids=_ids(2, 24))
    st = tel.end_step(0)
    for h in hs:
        h.remove()
    tel.close()
    assert sorted(st) == [0, 1] and tel.unreadable == {}
    q = got["q"].detach().view(2, 24, 4, 16).transpose(1, 2)
    k = got["k"].detach().view(2, 24, 4, 16).transpose(1, 2)
    want = ((q @ k.transpose(-1, -2)) * 16 ** -0.5).amax((-1, -2)).amax(0)
    assert torch.allclose(st[0]["max_logit"], want, rtol=1e-5, atol=0)


def test_an_attention_replaced_at_run_time_is_said_unreadable():
    """BigBird swaps its block-sparse attention for a new full-attention module when the
    sequence is short: the module the telemetry hooked never runs. Every layer is then named
    unreadable with the reason, not silently left out."""
    cfg = dict(model_type="big_bird", hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=128, vocab_size=300)
    m = _model(cfg, "eager")
    tel = AttentionTelemetry(m, rows=4)
    m(input_ids=_ids(1, 64))
    assert tel.end_step(0) == {}
    assert sorted(tel.unreadable) == [0, 1]
    assert "not called in the forward" in tel.unreadable[0]


DEEPSEEK = dict(model_type="deepseek_v3", hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                n_group=1, topk_group=1, first_k_dense_replace=2, q_lora_rank=32,
                kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                vocab_size=300, max_position_embeddings=256, initializer_range=0.3)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_max_logit_of_multi_head_latent_attention_is_exact(impl):
    """DeepSeek-V3's MLA (query rank 32, key/value latent 16, heads of 16 + 8 RoPE dims): q and
    k are read at the attention interface. By hand from layer 0's input through its own maps
    (query down / norm / up, the latent's norm and up-projection per head, the shared RoPE key,
    HF's interleaved rotary function, the module's scaling): the largest causal logit per head
    equals the telemetry's (1e-5 relative). The model's output is bit-identical with the
    telemetry on, and closing it gives the module its own config back."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        apply_rotary_pos_emb_interleave,
    )

    m = _model(DEEPSEEK, impl)
    att = m.layers[0].self_attn
    cfg0 = att.config
    got = {}

    def grab(mod, args, kwargs):
        got["x"] = kwargs.get("hidden_states", args[0] if args else None)
        got["pos"] = kwargs["position_embeddings"]

    h = att.register_forward_pre_hook(grab, with_kwargs=True)
    ids = _ids(2, 40)
    with torch.no_grad():
        plain = m(input_ids=ids).last_hidden_state
    tel = AttentionTelemetry(m, rows=4)
    assert tel.attention_layers == [0, 1]
    out = m(input_ids=ids).last_hidden_state
    st = tel.end_step(0)
    tel.close()
    h.remove()
    assert att.config is cfg0 and torch.equal(out.detach(), plain)
    x, (cos, sin) = got["x"].detach(), got["pos"]
    B, T, _ = x.shape
    with torch.no_grad():
        q = att.q_b_proj(att.q_a_layernorm(att.q_a_proj(x))).view(B, T, 4, 24).transpose(1, 2)
        kv = att.kv_a_proj_with_mqa(x)
        latent, k_rot = kv[..., :16], kv[..., 16:].view(B, 1, T, 8)
        k_nope = att.kv_b_proj(att.kv_a_layernorm(latent)).view(B, T, 4, 32)[..., :16]
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q[..., 16:], k_rot, cos, sin)
        qq = torch.cat([q[..., :16], q_rot], -1)
        kk = torch.cat([k_nope.transpose(1, 2), k_rot.expand(B, 4, T, 8)], -1)
        s = (qq @ kk.transpose(-1, -2)) * att.scaling
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    want = s.amax((-1, -2)).amax(0)
    assert torch.allclose(st[0]["max_logit"], want, rtol=1e-5, atol=0), (st[0], want)
    assert want.max() > 1.0
    assert tel.info[0]["rope"] == "applied"


def test_a_two_dimensional_key_mask_is_per_sequence():
    """Modules that receive the tokenizer's raw (B, Tk) attention mask (YOSO, MRA): with the
    call's batch size known and B != T, the mask's 0 / 1 values are each sequence's visible
    keys; a (T, Tk) mask keeps its meaning (rows, keys); an additive (B, Tk) mask adds."""
    m = _model(LLAMA)
    tel = AttentionTelemetry(m, rows=4)
    s = tel.sites[0]
    keys = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2])
    allowed, bias = tel._mask(s, keys, 3, 6, "cpu", batch=2)
    tri = torch.ones(3, 6, dtype=torch.bool).tril(3)
    assert bias is None and allowed.shape == (2, 1, 3, 6)
    assert torch.equal(allowed[0, 0], tri)
    assert torch.equal(allowed[1, 0], tri & torch.tensor([True] * 4 + [False] * 2))
    rows = torch.zeros(3, 6)
    rows[:, 5] = -math.inf
    allowed, bias = tel._mask(s, rows, 3, 6, "cpu", batch=3)  # B == T: rows and keys
    assert allowed.shape == (3, 6) and not allowed[:, 5].any()
    additive = torch.tensor([[0.0, -2.0, 0.0, 0.0, 0.0, 0.0]] * 2)
    allowed, bias = tel._mask(s, additive, 3, 6, "cpu", batch=2)
    assert bias.shape == (2, 1, 1, 6) and float(bias[0, 0, 0, 1]) == -2.0
    tel.close()
