"""Training checks: does a spec that the theory calls trainable actually train (gg25 Figs 1f, 4)?

One :func:`train` call trains ``config.seeds`` independent initialisations at once (the seed is
the leading dimension of every weight of :class:`sigprop.nn.model.SigpropTransformer`), and
optionally several score scales ``betas`` side by side (slice ``i * seeds + j`` holds beta ``i``,
seed ``j``; the Q/K draws are the same for every beta, rescaled by ``sqrt(beta)`` as the REM
initialisation of THEORY §2.1 prescribes). The loss is the sum of the slices' losses, so every
slice gets its own gradient; AdamW and weight decay act elementwise, so each slice behaves as an
independent run; gradient clipping is applied to each slice's own norm.

Optimiser defaults follow gg25 A.1/A.3 (AdamW, linear schedule with warmup ratio 0.05, weight
decay 0.01 on matrices only (HF's convention: not on biases), gradient norm clipped at 1,
batch 64, MLM masking 0.15). Learning rate 2e-3 instead of Fig. 4's 5e-4: gg25 trains an
epoch of TinyStories, a CPU check trains ~2,000 steps; measured on the built-in stories (1 layer,
d = T = 64, 2,000 steps): at 5e-4 both beta = 0.5 and beta = 8 end at 5.15 nats (neither has
started using the context yet, unigram baseline 5.27); at 1e-3: 4.54 vs 4.95; at 2e-3:
3.48 vs 4.44 (all with a zero readout bias).

Readout bias (``bias_init``): ``"unigram"`` starts the LM head's bias at the log token
frequencies of the training stream (:func:`sigprop.data.collate.unigram_logp`, the same add-one
smoothed distribution as the baseline), so training starts from the context-free baseline
(plus the ~1/(2d) nats that the random ``h W`` term adds) and every nat of gain measures use of
the context. With a zero bias Adam moves each of the V bias entries by ~lr per step, so a short
run spends most of its budget learning token frequencies. Measured: the deep post-LN model of
:data:`DEEP_SMALL` (alpha_attn = 2, beta = 0.3 and 1; batch 64, lr 2e-3, 500 steps) ends 0.62
and 0.69 nats below the unigram baseline with ``unigram``, but 0.01 nats *above* it with
``zero`` (from log V = 7.6 it reaches the baseline by step ~300 and stays there); the 1-layer
``sigprop train`` acceptance pair (d = T = 64, 2,000 steps) ends at 2.21 (beta 0.5) vs 4.20
nats (beta 8) with ``unigram`` against 3.52 vs 4.44 with ``zero``. The CLI commands default to
``unigram``; the library default stays ``zero`` so that existing callers (the registered
experiments) keep their measured behaviour. Tasks:

* ``mlm``: BERT masked LM on a corpus (:mod:`sigprop.data.corpus`); ``clm``: next-token LM
  (needs a causal spec); both with a linear head to the vocabulary;
* ``reverse``: noci22 C.1, symbols in reverse order (per-position cross-entropy);
* ``heaviside``: mindthegap A.3, the model's output fitted to ``1[X0 > 0]`` (MSE).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .spec import ArchSpec, SpecError

TASKS = ("mlm", "clm", "reverse", "heaviside")
BIAS_INITS = ("zero", "unigram")
HEAD_SEED = 7919  #: offset of the readout's seed from the body's


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters (module docstring). ``eval_every`` / ``measure_every`` /
    ``log_every`` default to steps/10, steps/5 and steps/100 (0 turns measuring off).
    ``threads``: CPU intra-op threads while training (0 = leave torch's setting). Default 1:
    the small models of these checks are latency-bound, and on a shared 2-core machine a step
    with 2 threads was measured 5-9x slower than with 1 (OpenMP barrier stalls).
    ``bias_init``: the LM readout's bias at initialisation, ``zero`` or ``unigram`` (log token
    frequencies of the training stream; module docstring). Tasks without a token vocabulary
    ignore it (``reverse``'s symbols are uniform, so its unigram bias is the zero bias)."""

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
        for name in ("eval_every", "measure_every", "log_every"):
            v = getattr(self, name)
            check(name, v is None or 0 <= v <= 10_000_000, "an integer in [0, 10000000]")
        check("eval_sequences", 1 <= self.eval_sequences <= 100_000, "an integer in [1, 100000]")
        check("seeds", 1 <= self.seeds <= 256, "an integer in [1, 256]")
        check("seed", self.seed >= 0, "a non-negative integer")
        check("mask_prob", 0 < self.mask_prob < 1, "a number in (0, 1)")
        check("n_symbols", 2 <= self.n_symbols <= 100_000, "an integer in [2, 100000]")
        check("n_points", 1 <= self.n_points <= 1_000_000, "an integer in [1, 1000000]")
        check("threads", 0 <= self.threads <= 4096, "an integer in [0, 4096] (0 = torch's)")
        check("bias_init", self.bias_init in BIAS_INITS, f"one of {', '.join(BIAS_INITS)}")

    def every(self, name: str) -> int:
        v = getattr(self, name)
        frac = {"eval_every": 10, "measure_every": 5, "log_every": 100}[name]
        return max(1, self.steps // frac) if v is None else v


# --------------------------------------------------------------------------------------------
# model: the sigprop stack plus a task readout
# --------------------------------------------------------------------------------------------
class TaskModel(nn.Module):
    """:class:`SigpropTransformer` (``body``) plus, for token tasks, a linear readout to the
    vocabulary: ``logits = h W + b`` with ``W ~ N(0, 1/d^2)`` (S, d, V), so initial logits
    have std ``1/sqrt(d)`` for ``|h|^2 = d``, or, with ``tie``, ``h E^T / d`` with the token
    embeddings ``E``. A pre-LN body's output is normalised first (GPT-2's final LN).
    ``head_bias`` (V,): the initial ``b`` of every slice (default zeros), e.g. the log unigram
    frequencies (``TrainConfig.bias_init``); with it the expected initial cross-entropy is the
    unigram one plus about ``sigma^2 (1 - sum p^2) / 2 <= 1/(2d)`` nats (second order in the
    logit noise of std ``sigma = 1/sqrt(d)``)."""

    def __init__(self, spec: ArchSpec, config: TrainConfig, vocab: int | None,
                 betas: Sequence[float] | None = None, dtype=torch.float32,
                 head_bias: np.ndarray | None = None):
        super().__init__()
        from .nn.model import SigpropTransformer

        S, nb = config.seeds, (1 if betas is None else len(betas))
        self.spec, self.vocab, self.n_slices = spec, vocab, S * nb
        init_spec = spec if betas is None else replace(spec, beta=1.0, qk_std=None)
        base = SigpropTransformer(init_spec, S, config.seed, dtype=dtype, embeddings=vocab)
        if nb == 1:
            self.body = base
        else:  # repeat the seeds for every beta, then rescale Q/K: std ~ sqrt(beta)
            self.body = SigpropTransformer(spec, S * nb, config.seed, init=None, dtype=dtype,
                                           embeddings=vocab)
            scale = torch.tensor(betas, dtype=torch.float64).clamp_min(0).sqrt()
            scale = scale.repeat_interleave(S).to(dtype)
            with torch.no_grad():
                src = dict(base.named_parameters())
                for name, p in self.body.named_parameters():
                    p.copy_(src[name].repeat(nb, *([1] * (p.dim() - 1))))
                    if name.endswith(("attn.w_q", "attn.w_k")):
                        p.mul_(scale.view(-1, 1, 1))
        self.tie = config.tie and vocab is not None
        if vocab is not None and not self.tie:
            d = spec.d_model  # slice i from seed + i, as the body (independent of S)
            w = torch.stack([torch.randn(d, vocab, dtype=torch.float64, generator=torch.Generator()
                                         .manual_seed(config.seed + i + HEAD_SEED)) / d
                             for i in range(S)])
            self.head_w = nn.Parameter(w.repeat(nb, 1, 1).to(dtype))
        if vocab is not None:
            b0 = torch.zeros(vocab, dtype=dtype) if head_bias is None else \
                torch.as_tensor(np.asarray(head_bias, dtype=np.float64)).to(dtype)
            if b0.shape != (vocab,):
                raise ValueError(f"head_bias must have shape ({vocab},) (got {tuple(b0.shape)})")
            self.head_b = nn.Parameter(b0.expand(S * nb, vocab).clone())
        if config.attention_only:
            for blk in self.body.blocks:
                for p in blk.mlp.parameters():
                    p.requires_grad_(False)
                    p.data.zero_()

    def features(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        """Output features (S, B, T, d), or (S, N, d) at the N positions where ``keep``
        (B, T) is True: the last block then runs its attention for every query (keys and
        values need all tokens) but its residual, LN and MLP only at the kept positions,
        which is exact (they act per position) and ~2x cheaper for MLM's 15%."""
        from .nn.model import normalise

        if keep is None:
            out = self.body(x, return_hidden=False, return_stats=False).output
        else:
            out = self.body._inputs(x)
            for blk in self.body.blocks[:-1]:
                out, _ = blk(out)
            out = _last_block(self.body.blocks[-1], out, keep)
        return normalise(out, self.spec.ln_kind) if self.spec.norm == "pre" else out

    def logits(self, h: Tensor) -> Tensor:
        """(S, N, d) features -> (S, N, V) logits."""
        if self.tie:
            return torch.baddbmm(self.head_b.unsqueeze(1), h,
                                 self.body.tok_emb.transpose(1, 2) / self.spec.d_model)
        return torch.baddbmm(self.head_b.unsqueeze(1), h, self.head_w)


def _last_block(blk, x: Tensor, keep: Tensor) -> Tensor:
    """:class:`sigprop.nn.model.BatchedBlock`'s forward restricted to ``keep`` after the
    attention (same three placements); returns (S, N, d)."""
    sp, ln = blk.spec, blk._ln
    a_att, a_mlp = sp.alpha_attn, sp.alpha_mlp
    if sp.norm == "pre":
        z = (a_att * x + blk.attn(ln(x)).out)[:, keep].unsqueeze(1)
        return (a_mlp * z + blk.mlp(ln(z))).squeeze(1)
    z = (a_att * x + blk.attn(x).out)[:, keep].unsqueeze(1)
    if sp.norm == "post":
        z = ln(z)
        return ln(a_mlp * z + blk.mlp(z)).squeeze(1)
    return (a_mlp * z + blk.mlp(z)).squeeze(1)


def slice_losses(model: TaskModel, task: str, x: Tensor, y: Tensor) -> Tensor:
    """Per-slice mean loss, shape (S,): cross-entropy over labelled positions (labels != -100)
    for token tasks, mean squared error for ``heaviside``."""
    from .data.collate import IGNORE

    if task == "heaviside":
        h = model.features(x)
        return (h - y.unsqueeze(0)).square().mean(dim=(1, 2, 3))
    keep = y != IGNORE
    logits = model.logits(model.features(x, keep))  # (S, N, V)
    S = logits.shape[0]
    target = y[keep].unsqueeze(0).expand(S, -1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                         reduction="none")
    return ce.view(S, -1).mean(dim=1)


def clip_per_slice(params: Sequence[nn.Parameter], max_norm: float) -> Tensor:
    """Scale each slice's gradient (leading dim) to global norm <= ``max_norm``; returns the
    per-slice norms before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = sum(g.double().square().flatten(1).sum(1) for g in grads)
    norm = sq.sqrt()
    if max_norm > 0:
        factor = (max_norm / (norm + 1e-6)).clamp(max=1.0).to(grads[0].dtype)
        for g in grads:
            g.mul_(factor.view(-1, *([1] * (g.dim() - 1))))
    return norm


def make_optimizer(model: nn.Module, config: TrainConfig):
    """AdamW (decay on matrices only) and HF's linear warmup/decay schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 3],
               "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 3], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    try:  # the fused kernel (CPU and CUDA) is several times faster than the per-tensor loop
        opt = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), eps=1e-8,
                                fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), eps=1e-8)
    warm = math.ceil(config.warmup_ratio * config.steps)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (config.steps - step) / max(1, config.steps - warm))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor), params


# --------------------------------------------------------------------------------------------
# training loop
# --------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """``trajectory``: tidy rows (``loss`` with ``step`` and ``split`` train/eval; measured
    observables with ``step``; a ``beta`` column when several betas were trained). Per-slice
    arrays: ``final_train`` / ``final_eval`` (S,), the last logged train loss and the last eval
    loss (pooled over the eval set's labelled positions, as ``baseline`` is). ``baseline``:
    the loss of a context-free predictor (unigram cross-entropy for LM tasks, log(n_symbols)
    for reverse, the target variance 0.25 for heaviside)."""

    trajectory: object
    final_train: np.ndarray
    final_eval: np.ndarray
    baseline: float
    seconds: float
    spec: ArchSpec
    config: TrainConfig
    betas: list[float] | None = None
    info: dict = field(default_factory=dict)
    model: TaskModel | None = field(default=None, repr=False)


def _mean_err(v: np.ndarray) -> tuple[float, float]:
    v = np.asarray(v, dtype=np.float64)
    err = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan
    return float(v.mean()), err


def train(spec: ArchSpec, config: TrainConfig = TrainConfig(), *, data: str = "builtin",
          corpus=None, betas: Sequence[float] | None = None,
          on_step: Callable[[int, int], None] | None = None,
          keep_model: bool = False) -> TrainResult:
    """Train ``config.seeds`` initialisations of ``spec`` (times ``len(betas)``) on
    ``config.task`` and return the loss curves and the observables measured during training.
    ``data``: ``builtin`` | ``tinystories`` | a path (token tasks); ``corpus``: an already
    loaded :class:`sigprop.data.corpus.Corpus`. ``on_step(step, total)`` after every step.

    On CPU, denormal floats are flushed to zero while training (and the flag reset after):
    condensed attention (large beta) fills the softmax backward with denormals, which made
    the beta = 8 acceptance run 1.5x slower on this machine for a change below 1e-38."""
    from .measure._threads import cpu_settings

    cpu = config.device == "cpu"
    with cpu_settings(threads=config.threads if cpu else None, flush_denormal=cpu):
        return _train(spec, config, data, corpus, betas, on_step, keep_model)


def _train(spec, config, data, corpus, betas, on_step, keep_model) -> TrainResult:
    from . import trajectory
    from .data.batches import Batches

    t0 = time.perf_counter()
    if config.task == "clm" and not spec.causal:
        raise SpecError("task", "clm needs a causal model (add --causal)")
    if config.task in ("mlm", "reverse") and spec.causal:
        raise SpecError("task", f"{config.task} needs a bidirectional model (drop --causal)")
    device = torch.device(config.device)
    batches = Batches(spec, config, data=data, corpus=corpus)
    bias = batches.unigram_logp if config.bias_init == "unigram" else None
    model = TaskModel(spec, config, batches.vocab, betas, head_bias=bias).to(device)
    opt, sched, params = make_optimizer(model, config)
    S = model.n_slices
    train_gen = torch.Generator().manual_seed(config.seed)
    log_every, eval_every = config.every("log_every"), config.every("eval_every")
    measure_every = config.every("measure_every")
    rows: list[dict] = []
    group = np.arange(S) // config.seeds  # beta index of every slice
    keys = [{}] if betas is None else [{"beta": float(b)} for b in betas]

    def emit(step, observable, layer, per_slice, **extra):
        per_slice = np.asarray(per_slice, dtype=np.float64)
        for gi, key in enumerate(keys):
            m, e = _mean_err(per_slice[group == gi])
            rows.append(dict(layer=layer, observable=observable, source="measured", value=m,
                             stderr=e, step=step, **key, **extra))

    def evaluate(step):
        # pooled over the eval set (each batch's mean weighted by its labelled positions, or
        # elements for heaviside), the same pooling as the baseline: an unweighted mean of
        # batch means differs from it (measured: 0.024 nats for a unigram predictor on 8
        # batches of 8 sequences of 16 tokens, whose label counts vary)
        from .data.collate import IGNORE

        model.eval()
        with torch.no_grad():
            tot, n = torch.zeros(S, dtype=torch.float64), 0
            for x, y in batches.eval_batches(device):
                w = y.numel() if config.task == "heaviside" else int((y != IGNORE).sum())
                if w == 0:
                    continue
                tot += slice_losses(model, config.task, x, y).double().cpu() * w
                n += w
            ev = (tot / max(n, 1)).numpy()
        emit(step, "loss", spec.depth, ev, split="eval")
        model.train()
        return ev

    def measure(step):
        if measure_every and (step % measure_every == 0 or step == config.steps):
            model.eval()
            _measure_rows(model, batches.probe(device), emit, step)
            model.train()

    final_eval = evaluate(0)
    measure(0)
    acc, n_acc, last_train = torch.zeros(S, dtype=torch.float64), 0, None
    for step in range(1, config.steps + 1):
        x, y = batches.train_batch(train_gen, device)
        losses = slice_losses(model, config.task, x, y)
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        clip_per_slice(params, config.max_grad_norm)
        opt.step()
        sched.step()
        acc += losses.detach().double().cpu()
        n_acc += 1
        if step % log_every == 0 or step == config.steps:
            last_train = (acc / n_acc).numpy()
            if not np.all(np.isfinite(last_train)):
                last_train = np.where(np.isfinite(last_train), last_train, np.nan)
            emit(step, "loss", spec.depth, last_train, split="train")
            acc.zero_()
            n_acc = 0
        if step % eval_every == 0 or step == config.steps:
            final_eval = evaluate(step)
        measure(step)
        if on_step is not None:
            on_step(step, config.steps)
    traj = trajectory.make(rows, spec)
    info = {"task": config.task, "data": batches.source, "vocab_size": batches.vocab,
            "slices": S, "device": str(device)}
    return TrainResult(traj, last_train, final_eval, batches.baseline,
                       time.perf_counter() - t0, spec, config,
                       None if betas is None else [float(b) for b in betas], info,
                       model if keep_model else None)


@torch.no_grad()
def _measure_rows(model: TaskModel, x: Tensor, emit, step: int) -> None:
    """cos (layers 0..L) and attention ipr / entropy / wmax (layers 1..L) on the probe batch,
    per slice (THEORY §1), each averaged over sequences (and heads)."""
    from .measure import observables as obs

    out = model.body(x, return_hidden=True, return_stats=True)
    for layer, h in enumerate(out.hidden):
        emit(step, "cos", layer, obs.mean_cos(h.double()).mean(dim=1).cpu().numpy())
        if layer > 0:
            st = out.stats[layer - 1]
            for name in ("entropy", "ipr", "wmax"):
                emit(step, name, layer, st[name].double().mean(dim=(1, 2)).cpu().numpy())


def save_checkpoint(result: TrainResult, directory: str) -> list[str]:
    """Write ``model.safetensors`` (every weight, seed-sliced) and ``spec.json`` (spec, config,
    betas, final losses) to ``directory``; returns the paths written."""
    import json
    import os

    from safetensors.torch import save_file

    if result.model is None:
        raise ValueError("train(..., keep_model=True) is needed to save a checkpoint")
    os.makedirs(directory, exist_ok=True)
    weights = os.path.join(directory, "model.safetensors")
    state = {k: v.detach().cpu().contiguous() for k, v in result.model.state_dict().items()}
    save_file(state, weights)
    meta = os.path.join(directory, "spec.json")
    with open(meta, "w") as fh:
        json.dump({"spec": result.spec.to_dict(), "config": asdict(result.config),
                   "betas": result.betas, "final_eval": result.final_eval.tolist()}, fh,
                  indent=1)
    return [weights, meta]


# --------------------------------------------------------------------------------------------
# trainability grid (gg25 Fig. 1(c) regimes checked by training, Fig. 1(f))
# --------------------------------------------------------------------------------------------
#: the deep small model used when ``trainability`` gets no architecture: post-LN, gg25's
#: variances (sigma_v^2 = sigma_w^2 = 0.2, sigma_b^2 = 4e-4, no W_O), 24 layers, d = T = 32
#: (d = T = 64 measured 4.7x slower per step, out of reach of a few CPU minutes)
DEEP_SMALL = dict(depth=24, d_model=32, heads=2, seq_len=32, norm="post", sigma_v2=0.2,
                  sigma_w2=0.2, sigma_b2=4e-4)
DEFAULT_BETAS = (0.3, 1.0, 8.0)
DEFAULT_ALPHAS = (0.2, 0.5, 2.0)
DEFAULT_MARGIN = 0.5
#: ``trainability``'s training: gg25's batch 64 and lr 2e-3 (as ``train``), 500 steps per grid
#: point, the readout bias at the unigram log frequencies, no observables measured. Measured on
#: DEEP_SMALL, default grid, seed 0: alpha 2 with beta 0.3 / 1 ends 0.62 / 0.69 nats below the
#: baseline, every other point within 0.08 nats of it (the five rank-collapse points within
#: 0.003); ~0.6 s per step for the 3 betas of one alpha on 1 thread, 13-14 min for the grid.
#: Spread of the alpha-2 gains (beta 0.3 / 1 / 8) over 5 runs (seeds 0 and 1, and seed 0 with
#: three freshly trained tokenizers: HF's WordPiece trainer breaks ties in hash order, so a new
#: cache directory gives a different vocabulary): 0.62-0.77 / 0.52-0.76 / 0.01-0.13.
#: What did not work (alpha 2, beta 0.3): batch 16 (the old default; ~77 masked tokens per
#: step) with a zero bias stays above the baseline after 600 steps at lr 5e-3, and with the
#: unigram bias gains nothing at lr 2e-3, 1e-2 or 3e-2 in 300 steps; at batch 64, 300 steps, lr
#: 1e-3 / 2e-3 / 3e-3 / 4e-3 gain 0.29 / 0.40 / 0.29 / 0.06 nats (at 4e-3 the loss climbs back
#: to the baseline after step 120; a 20% warmup did not help at 2e-3 or 4e-3); with a zero bias
#: (batch 64, 500 steps) beta 0.3 and 1 end 0.01 nats above the baseline; 450 steps gain 0.63 /
#: 0.58, a thinner margin than 500 steps, and 600 steps would take ~17 min.
TRAINABILITY_CONFIG = TrainConfig(steps=500, batch_size=64, lr=2e-3, bias_init="unigram",
                                  measure_every=0)


def criterion_text(margin: float) -> str:
    return (f"learned = final eval loss (mean over seeds) at least {margin:g} nats below the "
            "context-free baseline (the unigram cross-entropy of the masked tokens); "
            "stuck otherwise")


def trainability(spec: ArchSpec, betas: Sequence[float] = DEFAULT_BETAS,
                 alphas: Sequence[float] = DEFAULT_ALPHAS,
                 config: TrainConfig = TRAINABILITY_CONFIG,
                 *, data: str = "builtin", corpus=None, margin: float = DEFAULT_MARGIN,
                 on_step: Callable[[int, int], None] | None = None):
    """Train every (beta, alpha_attn) point briefly and classify it (:func:`criterion_text`)
    beside the theory's regime (:func:`sigprop.theory.blocks.verdict`, THEORY §2.7).

    Betas of one alpha train together (one batched model, slices = betas x seeds). Returns
    ``(table, trajectory)``: one table row per point with ``beta, alpha, theory, outcome,
    final_eval, final_eval_stderr, baseline, gain, agree``; the trajectory carries ``beta``
    and ``alpha`` columns. ``on_step(done, total)`` counts steps over the whole grid."""
    import pandas as pd

    from .theory import blocks

    if not betas or not alphas:
        raise SpecError("betas", "give at least one beta and one alpha")
    for name, vals, hi in (("betas", betas, 1e4), ("alphas", alphas, 1e6)):
        if any(not (math.isfinite(v) and 0 <= v <= hi) for v in vals):
            raise SpecError(name, f"every value must be a number in [0, {hi:g}] (got "
                                  f"{list(vals)})")
    if corpus is None and config.task in ("mlm", "clm"):
        from .data.corpus import load_corpus

        corpus = load_corpus(data)
    rows, trajs = [], []
    for ai, a in enumerate(alphas):
        sp = replace(spec, alpha_attn=float(a), beta=float(betas[0]), qk_std=None)
        done = ai * config.steps

        def step_cb(s, _total, done=done):
            if on_step is not None:
                on_step(done + s, len(alphas) * config.steps)

        res = train(sp, config, data=data, corpus=corpus, betas=list(betas), on_step=step_cb)
        t = res.trajectory.copy()
        t["alpha"] = float(a)
        trajs.append(t)
        for bi, b in enumerate(betas):
            final = res.final_eval[bi * config.seeds:(bi + 1) * config.seeds]
            m, e = _mean_err(final)
            theory = blocks.verdict(replace(sp, beta=float(b)))
            learned = m <= res.baseline - margin
            agree = learned == (theory == "trainable")
            rows.append(dict(beta=float(b), alpha=float(a), theory=theory,
                             outcome="learned" if learned else "stuck", final_eval=m,
                             final_eval_stderr=e, baseline=res.baseline,
                             gain=res.baseline - m, agree=agree))
    return pd.DataFrame(rows), pd.concat(trajs, ignore_index=True)
