"""Attention health during training: the forecast's projection, events and warnings, scalars
and sinks, and the reduction across two data-parallel (gloo) processes."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from sigprop.measurement.forecast import Trend
from sigprop.models import loading
from sigprop.spec import SpecError
from sigprop.training.health import AttentionHealth, AttentionWarning

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, intermediate_size=128, vocab_size=300,
             max_position_embeddings=256, initializer_range=0.3)


def _model(cfg=LLAMA):
    return loading.model_at_init(loading.load_config(cfg), seed=0, attn_implementation="sdpa")


def _ids(seed=1, B=2, T=32):
    return torch.randint(3, 300, (B, T), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------- forecast
def test_exponential_growth_is_projected_to_its_crossing():
    """x = 2 * 1.1^step: log-linear, so the fit is exact and the crossing of 100 is at
    log(50) / log(1.1) = 41.04 (by hand)."""
    tr = Trend(100.0, horizon=200)
    for s in range(10):
        tr.add("h", s, 2 * 1.1 ** s)
    p = tr.project("h")
    assert p is not None and p.at == pytest.approx(math.log(50) / math.log(1.1), rel=1e-9)
    assert p.step == 9 and p.value == pytest.approx(2 * 1.1 ** 9)
    near = Trend(100.0, horizon=20)  # 32 steps ahead is beyond a 20-step horizon
    for s in range(10):
        near.add("h", s, 2 * 1.1 ** s)
    assert near.project("h") is None


def test_no_clear_trend_and_falling_quantities():
    flat = Trend(100.0)
    for s, v in enumerate([5, 5.2, 4.9, 5.1, 5.0, 4.95, 5.05]):
        flat.add("h", s, v)
    assert flat.project("h") is None  # slope within noise
    few = Trend(100.0)
    for s in range(4):
        few.add("h", s, 2.0 ** s)
    assert few.project("h") is None  # fewer than min_points
    fall = Trend(0.2, rising=False)
    for s in range(6):
        fall.add("h", s, 0.8 - 0.05 * s)  # reaches 0.2 at step 12 (by hand)
    assert fall.project("h").at == pytest.approx(12.0, rel=1e-9)
    with pytest.raises(ValueError):
        Trend(-1.0)


# ------------------------------------------------------------------------ health in a loop
def test_growing_logits_are_forecast_before_they_cross():
    """Layer 1, head 0's W_Q grows 1.1x per step, so its logits grow ~1.1x per step: the
    forecast of its largest logit names that head before the logit reaches the limit, and
    the crossing comes later (positive lead time); the other heads are not warned about."""
    m = _model()
    q = m.layers[1].self_attn.q_proj.weight
    health = AttentionHealth(m, rows=8, logit_limit=60.0, warn=False)
    ids = _ids()
    for step in range(60):
        with torch.no_grad():
            q[:16] *= 1.1
        m(input_ids=ids)  # the same batch: only the weights change
        health.after_step(step)
    fc = [e for e in health.events if e.kind == "forecast" and e.what == "max_logit"]
    cr = [e for e in health.events if e.kind == "crossed" and e.what == "max_logit"]
    assert [(e.layer, e.head) for e in fc] == [(1, 0)], fc
    assert [(e.layer, e.head) for e in cr] == [(1, 0)], cr
    assert fc[0].step < cr[0].step
    # the head's logits grow exactly 1.1x per step (layer 1's input does not change), so the
    # log-linear fit is exact and the projected step is where it crosses: within one step
    assert cr[0].step - 1 <= fc[0].at <= cr[0].step


def test_non_finite_logits_are_an_event_and_one_warning():
    m = _model()
    with torch.no_grad():
        m.layers[0].self_attn.q_proj.weight[:16] = math.inf
    health = AttentionHealth(m, rows=4)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for step in range(3):
            m(input_ids=_ids())
            health.after_step(step)
    ours = [w for w in got if issubclass(w.category, AttentionWarning)]
    nf = [e for e in health.events if e.kind == "non_finite"]
    # head 0 of layer 0 is infinite; its NaN output reaches every head of layer 1
    want = {(0, 0), (1, 0), (1, 1), (1, 2), (1, 3)}
    assert {(e.layer, e.head) for e in nf} == want and len(nf) == 5  # once each, 3 steps
    assert len([w for w in ours if w.message.event.kind == "non_finite"]) == 5
    assert math.isnan(health.scalars[-1]["attention/max_logit"])


def test_a_layer_the_telemetry_cannot_read_is_an_event_and_one_warning():
    """BigBird (its attention module replaced at run time for short sequences): after the
    first step, one ``unreadable`` event and one warning per layer, naming the reason; none
    again on later steps; the run goes on."""
    cfg = dict(model_type="big_bird", hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=128, vocab_size=300)
    m = loading.model_at_init(loading.load_config(cfg), seed=0, attn_implementation="eager")
    health = AttentionHealth(m, rows=4)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for step in range(3):
            m(input_ids=_ids(T=64))
            assert health.after_step(step) == {}
    ours = [w for w in got if issubclass(w.category, AttentionWarning)]
    ev = [e for e in health.events if e.kind == "unreadable"]
    assert [(e.step, e.layer) for e in ev] == [(0, 0), (0, 1)]
    assert len(ours) == 2 and "not called in the forward" in str(ours[0].message)
    assert str(ours[0].message).startswith("step 0: layer 0: not read by the telemetry: ")


def test_scalars_sinks_and_rows():
    m = _model()
    seen = []
    health = AttentionHealth(m, rows=4, every=2, per_head=True,
                             sinks=[lambda step, frame, sc: seen.append((step, len(frame)))])
    for step in range(4):
        m(input_ids=_ids(step))
        sc = health.after_step(step)
        assert bool(sc) == (step % 2 == 0)
    assert [s for s, _ in seen] == [0, 2]
    keys = set(health.scalars[0])
    assert {"attention/max_logit", "attention/min_entropy", "attention/max_logit/L0",
            "attention/entropy/L1", "attention/beta/L0", "attention/max_logit/L1.H3"} <= keys
    traj = health.trajectory()
    assert set(traj.observable) >= {"max_logit", "entropy", "sink", "sigma_s"}
    assert len(traj) == seen[0][1] + seen[1][1]


@pytest.mark.parametrize("kw, field", [
    (dict(qk_clip=-1.0), "qk_clip"), (dict(logit_limit=0), "logit_limit"),
    (dict(entropy_floor=1.5), "entropy_floor"), (dict(clip_alpha=2.0), "clip_alpha"),
    (dict(window=2), "window"), (dict(beta_c=float("nan")), "beta_c")])
def test_bad_options_are_one_line(kw, field):
    with pytest.raises(SpecError, match=f"^{field}: "):
        AttentionHealth(_model(), **kw)


def test_qk_clip_keeps_every_heads_largest_logit_at_tau():
    """A head whose W_Q grows 1.3x per step: with qk_clip=8 the clip rescales it after each
    step it passes 8, so the next step's largest logit is at most 8 x 1.3 (one step of
    growth past the clip; by hand), and the events name that head."""
    m = _model(dict(LLAMA, initializer_range=0.1))  # every logit below 8 at the start
    q = m.layers[1].self_attn.q_proj.weight
    health = AttentionHealth(m, rows=4, qk_clip=8.0, warn=False)
    ids = _ids()
    worst = []
    for step in range(25):
        with torch.no_grad():
            q[:16] *= 1.3
        m(input_ids=ids)
        sc = health.after_step(step)
        worst.append(sc["attention/max_logit/L1"])
    clips = [e for e in health.events if e.kind == "qk_clip"]
    assert clips and {(e.layer, e.head) for e in clips} == {(1, 0)}
    first = next(i for i, e in enumerate(worst) if e > 8.0)
    assert first > 0
    assert max(worst[first + 1:]) <= 8.0 * 1.3 * (1 + 1e-5), worst


def test_early_growth_far_below_the_limit_is_not_warned_and_a_faded_trend_rearms():
    """A trend far below its limit (more than `reach` = 4x) is not projected, however clear;
    within reach it is. A forecast whose step passes (by a window) without the crossing
    re-arms: the same head is warned again on its next clear trend (by hand)."""
    far, free = Trend(100.0, reach=4.0), Trend(100.0)
    for s in range(10):
        far.add("h", s, 1.0 * 1.2 ** s)  # 5.2 at the last step: 19x below 100
        free.add("h", s, 1.0 * 1.2 ** s)
    assert far.project("h") is None
    assert free.project("h") is not None  # without reach: projected (crossing at ~25)
    near = Trend(100.0, reach=4.0)
    for s in range(10):
        near.add("h", s, 5.0 * 1.2 ** s)  # 25.8 at the last step: within 4x
    assert near.project("h") is not None
    with pytest.raises(ValueError):
        Trend(100.0, reach=0.5)

    m = _model(dict(LLAMA, initializer_range=0.1))
    q = m.layers[1].self_attn.q_proj.weight
    health = AttentionHealth(m, rows=4, logit_limit=16.0, warn=False, window=5, horizon=50)
    ids = _ids()
    # layer 1, head 0's largest logit (measured): 2.2 -> 6.8 (grow), -> 0.96 (fade), -> 9.0
    # (grow again), never reaching the limit 16; within reach (>= 4) in both growths
    scale = [1.25] * 6 + [0.85] * 12 + [1.25] * 10
    for step, f in enumerate(scale):
        with torch.no_grad():
            q[:16] *= f
        m(input_ids=ids)
        health.after_step(step)
    fc = [e for e in health.events if e.kind == "forecast" and e.what == "max_logit"
          and (e.layer, e.head) == (1, 0)]
    assert len(fc) == 2 and fc[1].step > fc[0].at + 5, fc
    assert not [e for e in health.events if e.kind == "crossed" and e.what == "max_logit"]


def test_qk_clip_on_sigprops_own_stack_clips_each_slice_by_its_own_maximum():
    """``qk_clip_own_``: slice s, head h above tau gets its logits times tau / S_max[s, h]
    exactly (scores recomputed after the clip), every other (slice, head) bit-identical;
    non-finite maxima are reported and not applied; a wrong shape is refused."""
    from sigprop.models.methods.qk_clip import qk_clip_own_
    from sigprop.spec import ArchSpec, SpecError
    from sigprop.training.config import TrainConfig
    from sigprop.training.task import TaskModel

    spec = ArchSpec(depth=1, d_model=32, heads=4, seq_len=8, causal=True, qk_std=0.5)
    m = TaskModel(spec, TrainConfig(task="clm", seeds=3), vocab=50)
    att = m.body.blocks[0].attn
    x = torch.randn(3, 2, 8, 32, generator=torch.Generator().manual_seed(0))
    before = att.scores(x).detach()
    maxima = torch.full((3, 4), 5.0)
    maxima[1, 2] = 40.0
    maxima[2, 0] = 20.0
    maxima[0, 3] = float("nan")
    rep = qk_clip_own_(att, maxima, tau=10.0, alpha=0.3)
    after = att.scores(x).detach()
    done = {(r["slice"], r["head"]): r for r in rep}
    assert set(done) == {(1, 2), (2, 0), (0, 3)}
    assert done[(0, 3)]["gamma"] is None
    assert done[(1, 2)]["gamma"] == pytest.approx(0.25)
    ratio = torch.ones(3, 4)
    ratio[1, 2], ratio[2, 0] = 0.25, 0.5
    for s in range(3):
        for h in range(4):
            if ratio[s, h] == 1:
                assert torch.equal(after[s, :, h], before[s, :, h])
            else:
                assert torch.allclose(after[s, :, h], before[s, :, h] * ratio[s, h],
                                      rtol=1e-5, atol=1e-6)
    with pytest.raises(SpecError, match="qk_clip.max_logits"):
        qk_clip_own_(att, torch.ones(4), tau=10.0)


def test_sigprop_train_reads_the_training_batch_and_clips_every_slice():
    """``train(..., telemetry_every / qk_clip)``: the trajectory gains the training batch's
    largest logit and entropy per layer (``split = train``) at the read steps; with QK-Clip
    at a tau well below where the unclipped run goes, the largest logit (mean over the two
    slices) after the first clip stays within one step's growth of tau (2 tau here; the
    unclipped run reaches 3 tau), the clip events name their slice, and the run's losses
    stay finite."""
    import numpy as np

    from sigprop.spec import ArchSpec
    from sigprop.training.config import TrainConfig
    from sigprop.training.loop import train

    spec = ArchSpec(d_model=32, heads=2, depth=2, seq_len=16, causal=True, beta=1.0)
    kw = dict(task="clm", steps=30, batch_size=8, lr=5e-2, seeds=2, bias_init="unigram",
              measure_every=0, eval_sequences=8)
    free = train(spec, TrainConfig(**kw, telemetry_every=5))
    tr = free.trajectory
    ml = tr[(tr.observable == "max_logit") & (tr.split == "train")]
    assert sorted(set(ml.step)) == [5, 10, 15, 20, 25, 30]
    assert set(ml.layer) == {1, 2}
    tau = float(ml.value.max()) / 3
    assert tau > 1.0
    clip = train(spec, TrainConfig(**kw, qk_clip=tau))
    tr = clip.trajectory
    ml = tr[(tr.observable == "max_logit") & (tr.split == "train")]
    assert len(set(ml.step)) == 30  # QK-Clip reads every step
    clips = [e for e in clip.health if e.kind == "qk_clip"]
    assert clips and {e.slice for e in clips} <= {0, 1}
    first = min(e.step for e in clips)
    later = ml[ml.step > first]
    assert float(later.value.max()) <= 2 * tau
    assert np.isfinite(clip.final_train).all()


@pytest.mark.parametrize("clip_on", ["updated", "step"])
def test_qk_clip_on_the_updated_weights_bounds_the_batch_just_seen(clip_on):
    """``clip_on="updated"``: QK-Clip acts on the step's Q/K inputs formed again through the
    weights after the optimizer step, so after the clip those inputs give at most tau
    (checked by forming them again, 1e-5); with Kimi's ``"step"`` maxima (the forward pass
    before the update) an AdamW step at this learning rate leaves them above tau."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=200,
                                   n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                   attn_pdrop=0.0))
    opt = torch.optim.AdamW(m.parameters(), lr=0.05)
    tau = 8.0
    health = AttentionHealth(m, qk_clip=tau, clip_on=clip_on, warn=False)
    from sigprop.measurement.telemetry import AttentionTelemetry

    probe = AttentionTelemetry(m, keep_inputs=True)  # keeps the inputs of each step
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for step in range(12):
        ids = torch.randint(0, 200, (4, 32), generator=g)
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        probe.end_step(step)
        health.after_step(step)
        now = probe.max_logit_now()  # the step's inputs, weights after the clip
        worst = max(worst, max(float(v["max_logit"].max()) for v in now.values()))
    health.close()
    probe.close()
    assert any(e.kind == "qk_clip" for e in health.events)
    if clip_on == "updated":
        assert worst <= tau * (1 + 1e-5)
    else:
        assert worst > 1.2 * tau
    with pytest.raises(SpecError, match="clip_on"):
        AttentionHealth(m, qk_clip=tau, clip_on="later")


@pytest.mark.parametrize("clip_on", ["step", "updated"])
def test_qk_clip_on_multi_head_latent_attention(clip_on):
    """DeepSeek-V3's MLA, read at the attention interface: QK-Clip at tau 2 after a step
    without an optimizer update rescales every head above tau (q_C^a k_C^(1-a), q_R by
    gamma), so the same batch read again has layer 0's largest logit at tau (1e-5; deeper
    layers' inputs move with layer 0's clip)."""
    from sigprop.measurement.telemetry import AttentionTelemetry

    cfg = dict(model_type="deepseek_v3", hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
               moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
               topk_group=1, first_k_dense_replace=2, q_lora_rank=32, kv_lora_rank=16,
               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=300,
               max_position_embeddings=256, initializer_range=0.3)
    m = _model(cfg)
    health = AttentionHealth(m, rows=4, qk_clip=2.0, clip_on=clip_on, warn=False)
    ids = _ids(T=40)
    m(input_ids=ids)
    health.after_step(0)
    assert any(e.kind == "qk_clip" for e in health.events)
    health.telemetry.close()
    t = AttentionTelemetry(m, rows=4)
    m(input_ids=ids)
    after = t.end_step(0)
    assert sorted(after) == [0, 1]
    assert abs(float(after[0]["max_logit"].max()) - 2.0) < 2e-5, after[0]["max_logit"]
