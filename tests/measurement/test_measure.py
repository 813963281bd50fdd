"""sigprop.measurement: observables (docs/theory.md §1, §5), the hook probe, Q/K/V gradients
(noci22 §3.3).

Kinds: closed forms of the observables on constructed inputs (exact up to float64 rounding);
agreement between attention probabilities returned by HF eager attention and the probe's own
recomputation from the Q/K projections of an SDPA model with the same weights (float32 model,
float64 recomputation: the maps differ by float32 rounding, ~1e-7, so 1e-5 is a safe bound);
the noci22 Eq. 17-18 gradient trend on inputs of controlled token correlation.
All HF models are tiny and built from configs at init (no network).
"""

import math

import pytest
import torch
import transformers  # a declared dependency: fail loudly if missing
from torch import nn

from sigprop.measurement import (
    MLMReadoutLoss,
    Probe,
    entropy,
    entropy_from_logits,
    find_blocks,
    gap,
    grads_to_trajectory,
    ipr,
    ipr_cross,
    mean_cos,
    mean_q,
    qkv_grad_norms,
    stable_rank,
    summarise,
    to_trajectory,
    wmax,
)

D = torch.float64


# -------------------------------------------------------------------------------- observables
def _rho_tokens(rho, T, d, lead=()):
    """T tokens with exact pairwise cosine rho: sqrt(rho) e_0 + sqrt(1 - rho) e_{a+1}."""
    x = torch.zeros(*lead, T, d, dtype=D)
    x[..., :, 0] = math.sqrt(rho)
    x[..., torch.arange(T), torch.arange(1, T + 1)] = math.sqrt(1 - rho)
    return x


@pytest.mark.parametrize("rho", [0.0, 0.3, 0.9, 0.999])
def test_mean_cos_exact_rho(rho):
    x = _rho_tokens(rho, 7, 12, lead=(2, 3))
    # a random rotation and per-token rescaling change neither cosines nor the result
    Q, _ = torch.linalg.qr(torch.randn(12, 12, dtype=D, generator=torch.Generator().manual_seed(0)))
    x = (x @ Q) * torch.linspace(0.5, 3.0, 7, dtype=D)[:, None]
    c = mean_cos(x)
    assert c.shape == (2, 3)
    assert torch.allclose(c, torch.full_like(c, rho), atol=1e-6)


def test_mean_cos_float32_against_float64_and_the_gram_matrix():
    """In float32 on correlated rows of very different norms (d = T = 256, the engine's
    hidden states), ``mean_cos`` (inverse norms times x, no unit rows formed) is within 1e-6
    of the float64 mean of the off-diagonal cosine matrix: a float32 sum of T unit vectors
    is exact to ~T 6e-8 relative, and the result is that over T (T - 1)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 256, 256, generator=g) + 0.6 * torch.randn(2, 3, 1, 256, generator=g)
    x = x * torch.logspace(-2, 2, 256)[:, None]
    u = x.double() / x.double().norm(dim=-1, keepdim=True)
    G = u @ u.transpose(-1, -2)
    ref = (G.sum((-1, -2)) - G.diagonal(dim1=-2, dim2=-1).sum(-1)) / (256 * 255)
    assert 0.2 < ref.min() and ref.max() < 0.4  # the correlation the test means to have
    assert (mean_cos(x).double() - ref).abs().max() < 1e-6


def test_mean_q_and_zero_rows():
    x = 2.0 * torch.ones(3, 5, 4, dtype=D)
    assert torch.allclose(mean_q(x), torch.full((3,), 4.0, dtype=D))
    assert torch.isnan(mean_cos(x[:, :1])).all()  # one token: undefined, not an error
    x = torch.zeros(4, 3, dtype=D)
    x[0, 0] = x[1, 0] = 1.0  # two parallel tokens, two zero rows: only one pair has cos 1
    assert mean_cos(x).item() == pytest.approx(2 / 12)


@pytest.mark.parametrize("T", [2, 5, 64])
def test_attention_stats_uniform_and_identity(T):
    U = torch.full((3, T, T), 1.0 / T, dtype=D)
    eye = torch.eye(T, dtype=D).expand(3, T, T)
    for f, u_val, i_val in ((ipr, 1 / T, 1.0), (ipr_cross, 1 / T, 0.0), (entropy, 1.0, 0.0),
                            (wmax, 1 / T, 1.0)):
        assert torch.allclose(f(U), torch.full((3,), u_val, dtype=D), atol=1e-12), f.__name__
        assert torch.allclose(f(eye), torch.full((3,), i_val, dtype=D), atol=1e-12), f.__name__
    g, s2 = gap(U)
    assert torch.allclose(g, torch.ones(3, dtype=D))
    assert torch.allclose(s2, torch.zeros(3, dtype=D), atol=1e-12)


def test_ipr_cross_matches_brute_force():
    A = torch.softmax(torch.randn(2, 6, 6, dtype=D, generator=torch.Generator().manual_seed(1)), -1)
    pairs = [(a, b) for a in range(6) for b in range(6) if a != b]
    brute = torch.stack([sum((A[n, a] * A[n, b]).sum() for a, b in pairs) / 30 for n in range(2)])
    assert torch.allclose(ipr_cross(A), brute, atol=1e-14)


def test_entropy_causal_and_from_logits():
    T = 9
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    uniform_causal = causal.to(D) / causal.sum(-1, keepdim=True)
    assert entropy(uniform_causal, causal=True).item() == pytest.approx(1.0, abs=1e-12)
    s = torch.randn(4, T, T, dtype=D, generator=torch.Generator().manual_seed(2))
    A = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
    assert torch.allclose(entropy(A, causal=True), entropy_from_logits(s, causal), atol=1e-12)
    assert torch.allclose(entropy(A, n_keys=causal.sum(-1)), entropy(A, causal=True))
    # huge logits: one-hot rows, entropy exactly 0 and no NaN, in float32 too
    for dt in (torch.float32, D):
        h = entropy_from_logits(s.to(dt) * 1e4, causal)
        assert torch.isfinite(h).all() and h.abs().max().item() < 1e-6
        h_full = entropy_from_logits(s.to(dt) * 1e4)
        assert torch.isfinite(h_full).all() and h_full.abs().max().item() < 1e-6
        A_big = torch.softmax(s.to(dt) * 1e4, -1)
        assert torch.isfinite(entropy(A_big)).all()


def test_stable_rank_and_gap():
    Q, _ = torch.linalg.qr(torch.randn(16, 16, dtype=D, generator=torch.Generator().manual_seed(3)))
    X = Q[:10]  # 10 orthonormal tokens in d = 16
    assert stable_rank(X).item() == pytest.approx(10.0, abs=1e-9)
    rank1 = torch.outer(torch.arange(1.0, 11.0, dtype=D), torch.randn(16, dtype=D))
    assert stable_rank(rank1).item() == pytest.approx(1.0, abs=1e-9)
    # A = (1 - e) 11^T / T + e I: singular values 1 and e (T - 1 times), so the gap is 1 - e
    # and s2(sqrt(T) A) = e sqrt(T) exactly (mindthegap Thm 2's two quantities)
    T, e = 50, 0.3
    A = (1 - e) * torch.full((T, T), 1 / T, dtype=D) + e * torch.eye(T, dtype=D)
    g, s2 = gap(torch.stack([A, A.T]))
    assert torch.allclose(g, torch.full((2,), 1 - e, dtype=D), atol=1e-12)
    assert torch.allclose(s2, torch.full((2,), e * math.sqrt(T), dtype=D), atol=1e-10)


def test_summarise():
    v = torch.tensor([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]], dtype=D)
    m, se = summarise(v)
    assert m.item() == pytest.approx(4.0)
    assert se.item() == pytest.approx(torch.std(v).item() / math.sqrt(6))
    m, se = summarise(v, dims=1)
    assert torch.allclose(m, torch.tensor([2.0, 6.0], dtype=D))
    assert torch.allclose(se, torch.full((2,), 1 / math.sqrt(3), dtype=D))
    m, se = summarise([3.5])
    assert m.item() == 3.5 and math.isnan(se.item())


# -------------------------------------------------------------------------------- probe on HF
BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128, vocab_size=1000)
GPT2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000)
LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000)
NEOX = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=1000)  # partial rotary (rotary_pct 0.25), per-head fused QKV


def _pair(name, qk_gain):
    """(eager, sdpa) HF models with identical weights; Q/K weights times qk_gain so that the
    attention is far from uniform (HF init std 0.02 gives entropy ~ 0.9999, a weak test)."""
    cls, cfg_cls, kw = {"bert": ("BertModel", "BertConfig", BERT),
                        "gpt2": ("GPT2Model", "GPT2Config", GPT2),
                        "llama": ("LlamaModel", "LlamaConfig", LLAMA),
                        "neox": ("GPTNeoXModel", "GPTNeoXConfig", NEOX)}[name]
    torch.manual_seed(0)
    models = [getattr(transformers, cls)(getattr(transformers, cfg_cls)(
        **kw, attn_implementation=impl)).eval() for impl in ("eager", "sdpa")]
    with torch.no_grad():
        for mod_name, p in models[0].named_parameters():
            if mod_name.endswith(("query.weight", "key.weight", "q_proj.weight", "k_proj.weight",
                                  "query_key_value.weight")):
                p.mul_(qk_gain)
            if mod_name.endswith("c_attn.weight"):
                p[:, : 2 * 64].mul_(qk_gain)
    models[1].load_state_dict(models[0].state_dict())
    return models


def _probe(model, inputs, **kw):
    with torch.no_grad(), Probe(model, keep_probs=True, **kw) as p:
        model(**inputs)
    return p


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "neox"])
def test_eager_and_recomputed_probabilities_agree(name):
    eager, sdpa = _pair(name, qk_gain=12.0)
    ids = torch.randint(0, 1000, (3, 24), generator=torch.Generator().manual_seed(5))
    inputs = dict(input_ids=ids)
    if name == "bert":  # padded keys: the mask reaches both paths and sets #keys per row
        inputs["attention_mask"] = torch.ones_like(ids).index_fill_(1, torch.arange(20, 24), 0)
    pe, ps = _probe(eager, inputs), _probe(sdpa, inputs, spectral=True)
    assert all(i["source"] == "returned" for i in pe.info)
    assert all(i["source"] == "recomputed" and not i["approximate"] for i in ps.info)
    rope = "applied" if name in ("llama", "neox") else "none"
    assert all(i["rope"] == rope for i in ps.info)
    for layer in range(2):
        assert (pe.probs[layer] - ps.probs[layer]).abs().max().item() < 1e-5
        for key, val in pe.attention_stats[layer].items():
            assert val.shape == (3, 4)
            assert (val - ps.attention_stats[layer][key]).abs().max().item() < 1e-5, key
        # the gain made the test meaningful: attention is far from uniform
        assert ps.attention_stats[layer]["entropy"].mean().item() < 0.9
    if name != "bert":  # causal: nothing above the diagonal
        assert ps.probs[0].triu(1).abs().max().item() == 0.0
    for layer in range(3):
        for key, val in pe.hidden_stats[layer].items():
            assert torch.allclose(val, ps.hidden_stats[layer][key], rtol=1e-4, atol=1e-6), key
        assert (pe.hidden[layer] - ps.hidden[layer]).abs().max().item() < 1e-4
    if name == "llama":  # without RoPE the recomputation is a (flagged) approximation
        pn = _probe(sdpa, inputs, rope=False)
        assert all(i["rope"] == "missing" and i["approximate"] for i in pn.info)
        assert (pn.probs[0] - pe.probs[0]).abs().max().item() > 1e-2


def test_probe_hooks_removed_and_no_maps_kept():
    model = transformers.BertModel(transformers.BertConfig(**BERT)).eval()

    def n_hooks():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    before = n_hooks()
    ids = torch.randint(0, 1000, (2, 10))
    with torch.no_grad(), Probe(model) as p:
        assert n_hooks() > before
        model(input_ids=ids)
        model(input_ids=ids)  # two calls concatenate along the batch
    assert n_hooks() == before
    assert p.probs is None and p.attention_stats[0]["ipr"].shape == (4, 4)
    assert len(p.hidden) == 3 and p.hidden[0].shape == (4, 10, 64)
    with torch.no_grad():
        model(input_ids=ids)  # nothing is recorded any more
    assert p.hidden[0].shape[0] == 4


def test_find_blocks_and_layer_selection():
    bert = transformers.BertModel(transformers.BertConfig(**BERT))
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(**GPT2))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    assert [n for n, _ in find_blocks(bert)] == ["encoder.layer.0", "encoder.layer.1"]
    assert [n for n, _ in find_blocks(gpt2)] == ["h.0", "h.1"]
    assert [n for n, _ in find_blocks(llama)] == ["model.layers.0", "model.layers.1"]
    p = Probe(bert, layers=r"encoder\.layer\.\d+")
    assert [n for n, _ in p.blocks] == ["encoder.layer.0", "encoder.layer.1"]
    assert p.sites[0].name == "encoder.layer.0.attention.self"
    assert Probe(llama).sites[1].n_kv_heads == 2
    with pytest.raises(ValueError):
        find_blocks(nn.Sequential(nn.Linear(2, 2)))


def test_to_trajectory_seeds_and_sequences():
    ids = torch.randint(0, 1000, (3, 16))
    probes = []
    for seed in range(2):
        torch.manual_seed(seed)
        m = transformers.BertModel(transformers.BertConfig(**BERT)).eval()
        probes.append(_probe(m, dict(input_ids=ids)))
    traj = to_trajectory(probes, per_head=True)
    main = traj[traj["head"].isna()]
    assert set(main["layer"]) == {0, 1, 2}
    assert set(main["observable"]) == {"cos", "q", "stable_rank", "ipr", "ipr_cross", "entropy",
                                       "wmax", "sigma_s"}  # sigma_s: the measured score std
    row = main[(main["layer"] == 1) & (main["observable"] == "ipr")].iloc[0]
    per_seed = torch.stack([p.attention_stats[0]["ipr"].mean() for p in probes])
    assert row["value"] == pytest.approx(per_seed.mean().item())
    assert row["stderr"] == pytest.approx(per_seed.std().item() / math.sqrt(2))
    one = to_trajectory(probes[0])  # one initialisation: the error is over its 3 sequences
    row = one[(one["layer"] == 1) & (one["observable"] == "ipr")].iloc[0]
    per_seq = probes[0].attention_stats[0]["ipr"].mean(-1)
    assert row["stderr"] == pytest.approx(per_seq.std().item() / math.sqrt(3))
    assert len(traj[traj["head"] == 3]) == 2 * 5  # 2 attention layers x 4 statistics + sigma_s
    single = to_trajectory(_probe(m, dict(input_ids=ids[:1])))
    assert single["stderr"].isna().all()


# -------------------------------------------------------------------------------- gradients
def _rho_inputs(rho, B, T, d, seed):
    """Gaussian tokens with expected pairwise correlation rho (one shared vector per sequence)."""
    g = torch.Generator().manual_seed(seed)
    return math.sqrt(rho) * torch.randn(B, 1, d, generator=g) + \
        math.sqrt(1 - rho) * torch.randn(B, T, d, generator=g)


def test_qkv_grads_vanish_under_rank_collapse():
    """noci22 Thm 3.2 / Eqs. 17-18 (docs/theory.md §4): with the model fixed and the token
    correlation
    of the attention input raised towards 1, ||dL/dW_Q||^2 and ||dL/dW_K||^2 fall like
    (1 - rho)^2 while ||dL/dW_V||^2 grows like 1 + rho (n - 1). rho is *measured* at the
    attention input by the probe (layer 0 after the embedding LayerNorm). The same weights and
    readout are used throughout, so the Q/K scale cannot explain the trend (comparing small
    vs large Q/K weights would: dL/dW_Q is proportional to W_K). Tolerance: the laws hold in
    expectation at HF init (near-uniform attention); one batch of 8 x 32 tokens lands within
    a factor 1.5 of them (measured ratios are within ~15%)."""
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**BERT, attn_implementation="sdpa"))
    model.eval()
    T, res, rhos = 32, {}, {}
    for rho in (0.0, 0.5, 0.9, 0.99):
        x = _rho_inputs(rho, 8, T, 64, seed=1)
        res[rho] = qkv_grad_norms(model, dict(inputs_embeds=x), MLMReadoutLoss(seed=3))
        with torch.no_grad(), Probe(model, attention=None) as p:
            model(inputs_embeds=x)
        rhos[rho] = p.hidden_stats[0]["cos"].mean().item()
    for r in res.values():
        for key in "qkv":
            assert all(math.isfinite(g) and g > 0 for g in r[key])
    base = res[0.0]
    for rho in (0.5, 0.9, 0.99):
        c0, c = rhos[0.0], rhos[rho]
        for key in "qk":
            ratio = res[rho][key][0] / base[key][0]
            law = (1 - c) ** 2 / (1 - c0) ** 2
            assert law / 1.5 < ratio < law * 1.5, (rho, key, ratio, law)
        ratio_v = res[rho]["v"][0] / base["v"][0]
        law_v = (1 + c * (T - 1)) / (1 + c0 * (T - 1))
        assert law_v / 1.5 < ratio_v < law_v * 1.5, (rho, ratio_v, law_v)
    assert res[0.99]["q"][0] < 1e-3 * base["q"][0]
    traj = grads_to_trajectory([res[0.0], res[0.5]])
    assert set(traj["observable"]) == {"grad_qk", "grad_v"} and len(traj) == 2 * 3


def test_qkv_grads_fused_gpt2_and_named_modules():
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(**GPT2))
    x = dict(inputs_embeds=torch.randn(2, 12, 64))
    r = qkv_grad_norms(gpt2, x)
    assert all(g > 0 and math.isfinite(g) for key in "qkv" for g in r[key])
    assert gpt2.training  # mode restored
    # the split of the fused c_attn gradient adds up to the whole
    loss = MLMReadoutLoss()(gpt2.eval()(**x))
    (g,) = torch.autograd.grad(loss, [gpt2.h[0].attn.c_attn.weight])
    total = g.double().pow(2).sum().item()
    assert r["q"][0] + r["k"][0] + r["v"][0] == pytest.approx(total, rel=1e-5)
    neox = transformers.GPTNeoXModel(transformers.GPTNeoXConfig(**NEOX))
    r = qkv_grad_norms(neox, x)  # per-head interleaved (H, 3, d_H) split
    loss = MLMReadoutLoss()(neox.eval()(**x))
    (g,) = torch.autograd.grad(loss, [neox.layers[0].attention.query_key_value.weight])
    assert r["q"][0] + r["k"][0] + r["v"][0] == pytest.approx(g.double().pow(2).sum().item(),
                                                              rel=1e-5)
    assert min(r["q"][0], r["k"][0], r["v"][0]) > 0
    bert = transformers.BertModel(transformers.BertConfig(**BERT))
    names = [f"encoder.layer.{i}.attention.self.query" for i in range(2)]
    rn = qkv_grad_norms(bert, dict(inputs_embeds=torch.randn(2, 12, 64)), q=names)
    assert len(rn["q"]) == 2 and all(g > 0 for g in rn["q"])
    assert all(math.isnan(g) for g in rn["v"])


def test_release_lets_the_model_go_and_keeps_the_statistics():
    """diagnose keeps one probe per draw: a released probe holds no module (so S draws of a
    1B-parameter model do not stay in memory together) and still makes its trajectory."""
    import gc
    import weakref

    m = transformers.BertModel(transformers.BertConfig(**BERT)).eval()
    p = _probe(m, dict(input_ids=torch.randint(0, 1000, (2, 12))))
    before = to_trajectory(p)
    ref = weakref.ref(m)
    p.release()
    del m
    gc.collect()
    assert ref() is None and p.model is None
    after = to_trajectory(p)
    assert before["value"].tolist() == after["value"].tolist()
    assert all(s is not None for s in p.sites) and p.blocks[0][1] is None
