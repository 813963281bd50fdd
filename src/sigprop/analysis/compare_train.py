"""``sigprop fix --compare --train-steps K``: each fix trained K steps on the built-in task at
the model's shape scaled down (docs/fixes.md).

Scaled down, stated: the model's own family and depth (the depth is what collapses), width
``d = 64`` with 4 heads (grouped K/V kept grouped: 2 K/V heads), MLP width ``4 d``, the
built-in corpus's vocabulary, ``T = min(T, 64)``, and the init std times ``sqrt(d / 64)`` so
that every ``sigma^2 d`` (the score scale beta, the value and MLP variances) is the full
model's. (At the model's own std, bert-deep-48 at d 64 was not rank-collapsed and every fix
trained alike: 0.31-0.40 nats against the baseline's 0.36 after 200 steps.) The HF model is
built from that config with its own init under the seed, the fix applied exactly as on the
full model, and a linear readout added with the unigram log frequencies as its bias (as
``sigprop train --bias-init unigram``). Task: masked-token prediction for an encoder,
next-token prediction for a causal stack. Training (:func:`sigprop.training.steps.run`): AdamW,
lr 5e-4, batch 32, gradient norm clipped at 1, torch's threads. The learning rate, measured on
bert-tiny-collapse (24 post-LN blocks, 200 steps): at 2e-3 Admin, which keeps the post-LN
blocks and only rescales the branches, stayed at the unigram level, its first block's gradient
falling to ~1e-4 of the last block's within 150 steps; at 5e-4 Admin, Depth-muP and DeepScaleLM
learn 0.19-0.20 nats (at 1e-3: 0.07-0.24) and ReZero, SkipInit and DeepNorm 0.14-0.19 (at 1e-3:
0.26-0.34, at 2e-3: 0.24-0.48); the baseline stays at -0.002 at all three. The gain is the
unigram baseline's loss minus the fixed evaluation set's loss after K steps (nats; positive:
learned something beyond token frequencies).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..training.steps import run

WIDTH, HEADS, MAX_T, BATCH, LR = 64, 4, 64, 32, 5e-4


class _Readout(nn.Module):
    """HF body + linear readout (weights N(0, 1/d^2), bias = log unigram frequencies)."""

    def __init__(self, body: nn.Module, d: int, vocab: int, bias, seed: int):
        super().__init__()
        self.body = body
        g = torch.Generator().manual_seed(seed + 7919)
        self.w = nn.Parameter(torch.randn(d, vocab, generator=g) / d)
        self.b = nn.Parameter(torch.as_tensor(bias, dtype=torch.float32).clone())

    def forward(self, x):
        h = self.body(input_ids=x).last_hidden_state
        return h @ self.w + self.b


def _small_config(config, vocab: int, T: int):
    from ..models.config import load_config
    from ..models.presets import shrink

    kv = getattr(config, "num_key_value_heads", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", HEADS)
    depth = spec_depth(config)
    sizes = dict(layers=depth, hidden=WIDTH, heads=HEADS, intermediate=4 * WIDTH, vocab=vocab)
    if kv is not None and kv < heads:
        sizes["kv_heads"] = 2
    small = shrink(config.to_dict(), **sizes)
    d_full = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or WIDTH
    for key in ("initializer_range", "init_std"):  # keep sigma^2 d, so beta and the branch
        if isinstance(small.get(key), int | float):  # variances are the full model's
            small[key] = float(small[key]) * (d_full / WIDTH) ** 0.5
    for key in ("max_position_embeddings", "n_positions"):
        if key in small:
            small[key] = max(int(small[key]), T + 2)
    small.pop("sigprop_fix", None)
    return load_config(small)


def spec_depth(config) -> int:
    """The config's number of blocks (``shrink`` would otherwise cut it to 2)."""
    from ..models.arch import spec_from_config

    return spec_from_config(config).depth


def train_gains(config, spec, names: list[str], given: dict[str, dict[str, Any]], rows,
                *, steps: int, seed: int = 0, device: str = "cpu"
                ) -> tuple[dict[str, float | None], str]:
    """``({"baseline": gain, method: gain, ...}, note)``; methods whose row carries an error
    (or that refuse the small model) get None."""
    from .. import models as hf
    from ..data.batches import Batches
    from ..data.corpus import load_corpus
    from ..measurement.threads import cpu_settings
    from ..models import methods as M
    from ..models.methods.ngpt import recorded_ngpt
    from ..models.methods.qk_clip import recorded_clip
    from ..models.methods.z_loss import recorded_z_loss
    from ..spec import SpecError
    from ..training.config import TrainConfig

    T = min(spec.seq_len, MAX_T)
    task = "clm" if spec.causal else "mlm"
    corpus = load_corpus("builtin")
    cfg = TrainConfig(task=task, steps=steps, batch_size=BATCH, lr=LR, bias_init="unigram",
                      measure_every=0, eval_sequences=128)
    small = _small_config(config, corpus.vocab_size, T)
    small_spec = hf.spec_from_config(small, T)
    if small_spec.depth != spec.depth:
        raise SpecError("train_steps", f"the scaled-down model has {small_spec.depth} blocks "
                                       f"for the model's {spec.depth}")
    batches = Batches(small_spec, cfg, corpus=corpus)
    base = hf.model_at_init(small, seed=seed, attn_implementation="sdpa")
    ctx = M.context_for(base, small_spec)
    out: dict[str, float | None] = {}
    with cpu_settings(flush_denormal=device == "cpu"):  # every thread: the steps are matmuls
        for name in ["baseline", *names]:
            if name != "baseline" and rows[name].error is not None:
                out[name] = None
                continue
            m = copy.deepcopy(base)
            if name != "baseline":
                try:
                    M.apply_methods(m, [name], given, ctx)
                except SpecError:  # a fix that refuses the small model (its row says why)
                    out[name] = None
                    continue
            out[name] = _train(m, batches, small_spec.d_model, steps, seed, device,
                               clip=recorded_clip(getattr(m, "config", None)),
                               zloss=recorded_z_loss(getattr(m, "config", None)),
                               renorm=recorded_ngpt(getattr(m, "config", None)))
    note = (f"train gain: {steps} steps of {task} on the built-in corpus at the model's "
            f"depth, d {WIDTH}, {HEADS} heads, T {T} (batch {BATCH}, lr {LR:g}); nats below "
            f"the unigram baseline {batches.baseline:.3f}")
    return out, note


def _train(body: nn.Module, batches, d: int, steps: int, seed: int, device: str,
           every: int = 0, on_gain: Callable[[int, float], None] | None = None,
           clip: dict | None = None, zloss: dict | None = None,
           renorm: dict | None = None) -> float | None:
    """The gain after ``steps`` steps; None when the loss stops being finite. ``every`` > 0:
    also ``on_gain(step, gain)`` every ``every`` steps (benchmarks/fixes_probe.py).
    ``clip``: the parameters of a recorded QK-Clip (``tau``, ``alpha``), applied after every
    optimizer step from the step's own largest logits
    (:class:`sigprop.training.health.AttentionHealth`). ``zloss``: the parameters of a
    recorded z-loss (``coeff``): ``coeff * log^2 Z`` of the readout's logits added to the
    training loss over the labelled positions (:func:`sigprop.models.methods.z_loss.z_loss`);
    the evaluation loss stays the cross-entropy alone. ``renorm``: the parameters of a
    recorded nGPT: its matrices back on the unit sphere after every optimizer step
    (:meth:`sigprop.models.methods.ngpt.NGPT.after_step`)."""
    from ..models.methods import get
    from ..training.health import AttentionHealth

    z_term = get("z-loss")
    torch.manual_seed(seed)
    health = None if not clip else AttentionHealth(
        body, rows=4, qk_clip=float(clip.get("tau", 100.0)),
        clip_alpha=float(clip.get("alpha", 0.5)), warn=False, start=1)
    model = _Readout(body.train(), d, batches.vocab, batches.unigram_logp, seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(seed)

    def loss_at(_step: int) -> torch.Tensor:
        x, y = batches.train_batch(gen, device)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        if zloss is not None:
            loss = loss + z_term.loss(logits, zloss, mask=y != -100)
        return loss

    def after(step: int, _loss: torch.Tensor) -> None:
        if renorm is not None:
            get("ngpt").after_step(body, renorm)
        if health is not None:
            health.after_step(step)
        if every and on_gain is not None and step % every == 0 and step < steps:
            on_gain(step, _gain(model, batches, device))
            model.train()

    try:
        done = run(loss_at, opt, steps, after=after, finite=True,
                   on_grads=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    finally:
        if health is not None:
            health.close()
    if done < steps:
        return None
    gain = _gain(model, batches, device)
    if every and on_gain is not None and steps % every == 0:
        on_gain(steps, gain)
    return gain


def _gain(model: nn.Module, batches, device: str) -> float:
    """The unigram baseline's loss minus the model's on the fixed evaluation set (nats),
    pooled over the labelled positions; leaves the model in eval mode."""
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for x, y in batches.eval_batches(device):
            lab = y != -100
            lp = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100,
                                 reduction="sum")
            tot, n = tot + float(lp), n + int(lab.sum())
    return float(batches.baseline - tot / max(n, 1))
