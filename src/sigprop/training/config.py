"""Training hyper-parameters (:class:`TrainConfig`): one frozen, validated dataclass shared by
the training loop, the task model and the trainability grid."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec import SpecError

TASKS = ("mlm", "clm", "reverse", "heaviside")
BIAS_INITS = ("zero", "unigram")


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters (module docstring). ``eval_every`` / ``measure_every`` /
    ``log_every`` default to steps/10, steps/5 and steps/100 (0 turns measuring off).
    ``threads``: CPU intra-op threads while training (0 = leave torch's setting). Default 1:
    the small models of these checks are latency-bound, and on a shared 2-core machine a step
    with 2 threads was measured 5-9x slower than with 1 (OpenMP barrier stalls).
    ``bias_init``: the LM readout's bias at initialisation, ``zero`` or ``unigram`` (log token
    frequencies of the training stream; module docstring). Tasks without a token vocabulary
    ignore it (``reverse``'s symbols are uniform, so its unigram bias is the zero bias).

    noci22's remedies (App. C.2-C.3, Fig. 15): ``tau_warmup`` > 0 warms the softmax temperature
    up over that many steps: update ``k`` (and the evaluation after it) multiplies the attention
    logits by ``tau_final * min(1, k / tau_warmup)`` (Eq. 45's tau; ``tau_final`` is the spec's
    ``scaling_param`` when ``scaling = "tau"``, else 1; step 0 is evaluated at the first update's
    value). ``train_alpha``: the residual strengths ``alpha_attn`` / ``alpha_mlp`` of every
    block become trained scalars (one per block and slice, started at the spec's values, no
    weight decay). ``value_bias`` False holds the attention's value bias at zero (mindthegap's
    bias-free layer ``A X W_V``; with it, softmax attention can fit a constant offset through
    ``A 1 = 1`` that centred attention cannot, since ``A_perp 1 = 0``).

    Attention health on the training batch (docs/monitor.md): ``telemetry_every`` > 0 reads
    every slice's per-head largest logit and entropy on the forward pass of every
    ``telemetry_every``-th training step (:class:`sigprop.training.health.AttentionHealth`);
    ``qk_clip`` = tau applies QK-Clip after every optimizer step (each slice by its own
    maxima; the telemetry then reads every step), ``qk_clip_alpha`` its split between W_Q
    and W_K."""

    task: str = "mlm"
    steps: int = 1000
    batch_size: int = 64
    lr: float = 2e-3
    warmup_ratio: float = 0.05
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    eval_every: int | None = None
    measure_every: int | None = None
    log_every: int | None = None
    eval_sequences: int = 256
    seeds: int = 1
    seed: int = 0
    device: str = "cpu"
    mask_prob: float = 0.15
    n_symbols: int = 10
    n_points: int = 50
    attention_only: bool = False
    tie: bool = False
    threads: int = 1
    bias_init: str = "zero"
    tau_warmup: int = 0
    train_alpha: bool = False
    value_bias: bool = True
    telemetry_every: int = 0
    qk_clip: float | None = None
    qk_clip_alpha: float = 0.5

    def __post_init__(self) -> None:
        def check(name, ok, rng):
            if not ok:
                raise SpecError(name, f"must be {rng} (got {getattr(self, name)!r})")

        check("task", self.task in TASKS, f"one of {', '.join(TASKS)}")
        check("steps", 1 <= self.steps <= 10_000_000, "an integer in [1, 10000000]")
        check("batch_size", 1 <= self.batch_size <= 65536, "an integer in [1, 65536]")
        check("lr", 0 < self.lr <= 10, "a number in (0, 10]")
        check("warmup_ratio", 0 <= self.warmup_ratio < 1, "a number in [0, 1)")
        check("weight_decay", 0 <= self.weight_decay <= 10, "a number in [0, 10]")
        check("max_grad_norm", 0 <= self.max_grad_norm, "a number >= 0 (0 = no clipping)")
        for name, lo in (("eval_every", 1), ("measure_every", 0), ("log_every", 1)):
            v = getattr(self, name)
            check(name, v is None or lo <= v <= 10_000_000,
                  f"an integer in [{lo}, 10000000]" + (" (0 = off)" if lo == 0 else ""))
        check("eval_sequences", 1 <= self.eval_sequences <= 100_000, "an integer in [1, 100000]")
        check("seeds", 1 <= self.seeds <= 256, "an integer in [1, 256]")
        check("seed", self.seed >= 0, "a non-negative integer")
        check("mask_prob", 0 < self.mask_prob < 1, "a number in (0, 1)")
        check("n_symbols", 2 <= self.n_symbols <= 100_000, "an integer in [2, 100000]")
        check("n_points", 1 <= self.n_points <= 1_000_000, "an integer in [1, 1000000]")
        check("threads", 0 <= self.threads <= 4096, "an integer in [0, 4096] (0 = torch's)")
        check("bias_init", self.bias_init in BIAS_INITS, f"one of {', '.join(BIAS_INITS)}")
        check("tau_warmup", isinstance(self.tau_warmup, int) and not isinstance(
            self.tau_warmup, bool) and 0 <= self.tau_warmup <= 10_000_000,
            "an integer in [0, 10000000] (0 = no warm-up)")
        check("telemetry_every", isinstance(self.telemetry_every, int) and not isinstance(
            self.telemetry_every, bool) and 0 <= self.telemetry_every <= 10_000_000,
            "an integer in [0, 10000000] (0 = off)")
        check("qk_clip", self.qk_clip is None or (
            isinstance(self.qk_clip, int | float) and not isinstance(self.qk_clip, bool)
            and math.isfinite(self.qk_clip) and 1e-3 <= self.qk_clip <= 1e6),
            "a number in [0.001, 1000000] (or none: no clip)")
        check("qk_clip_alpha", isinstance(self.qk_clip_alpha, int | float)
              and 0 <= self.qk_clip_alpha <= 1, "a number in [0, 1]")
        for name in ("train_alpha", "value_bias"):
            check(name, isinstance(getattr(self, name), bool), "true or false")

    def every(self, name: str) -> int:
        v = getattr(self, name)
        frac = {"eval_every": 10, "measure_every": 5, "log_every": 100}[name]
        return max(1, self.steps // frac) if v is None else v
