"""Why some fixes that the init measurement calls trainable do not learn on bert-tiny-collapse
(docs/fixes.md, "Training the fixes"; issue 21).

Works on the model that ``sigprop fix --compare --train-steps`` trains: bert-tiny-collapse
scaled down as :mod:`sigprop.analysis.compare_train` states (width 64, 4 heads, the preset's
24 post-LN blocks, T = 64, the built-in corpus's vocabulary), seed 0.

``--sensitivity`` (seconds): per fix, at init, on 16 random token sequences, with ``h_i`` the
final hidden state at the middle position ``i``:

* ``spread``: the tokens' spread around their sequence mean, over ``|h_i|^2``
  (0 for rank collapse);
* ``own``: the change of ``h_i`` when only the token at ``i`` is redrawn, over ``|h_i|^2``;
* ``context``: the change of ``h_i`` when every other token is redrawn, over ``|h_i|^2``;
* ``kept`` and ``cka``: how much of each token's own part of the input (the embedding minus
  the sequence's mean embedding) the final hidden state still carries: the mean cosine
  between the two token-centred vectors, and their linear CKA over all tokens (which a
  rotation of the output leaves unchanged; Kornblith et al. 2019).

``--steps K --methods a,b`` trains the named fixes (and ``baseline``) through the
comparison's own loop (``compare_train._train``: AdamW, lr 5e-4, batch 32, clipping at 1) and
prints the evaluation gain (nats below the unigram baseline) every 100 steps.

    .venv/bin/python benchmarks/fixes_probe.py --sensitivity
    .venv/bin/python benchmarks/fixes_probe.py --steps 600 --methods baseline,shaped
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from sigprop import models as hf
from sigprop.analysis import compare_train as ct
from sigprop.data.batches import Batches
from sigprop.data.corpus import load_corpus
from sigprop.measurement import observables
from sigprop.models import methods as M
from sigprop.training.config import TrainConfig

PRESET, T = "bert-tiny-collapse", 64


def _setup():
    config = hf.load_config(PRESET)
    corpus = load_corpus("builtin")
    small = ct._small_config(config, corpus.vocab_size, T)
    spec = hf.spec_from_config(small, T)
    base = hf.model_at_init(small, seed=0, attn_implementation="sdpa")
    return corpus, spec, base, M.context_for(base, spec)


def _fixed(base, name, ctx):
    """``name``: a fix, ``baseline``, or ``NAME+mlp/K``: the fix, then every block's MLP
    output projection (weight and bias) divided by K (the MLP branch K times smaller)."""
    name, _, mlp = name.partition("+mlp/")
    m = copy.deepcopy(base)
    if name != "baseline":
        M.apply_methods(m, [name], M.parse_params(None, [name]), ctx)
    if mlp:
        with torch.no_grad():
            for layer in m.encoder.layer:
                layer.output.dense.weight /= float(mlp)
                layer.output.dense.bias /= float(mlp)
    return m


def sensitivity(names: list[str]) -> None:
    corpus, _spec, base, ctx = _setup()
    g = torch.Generator().manual_seed(0)
    V, i = corpus.vocab_size, T // 2
    x = torch.randint(5, V, (16, T), generator=g)
    other = torch.randint(5, V, (16, T), generator=g)
    other[:, i] = x[:, i]                                   # same token, new context
    own = x.clone()
    own[:, i] = torch.randint(5, V, (16,), generator=g)     # same context, new token
    print(f"{'fix':16s} {'spread':>7s} {'own':>7s} {'context':>7s} {'kept':>7s} {'cka':>7s}")
    for name in names:
        m = _fixed(base, name, ctx).eval()
        with torch.no_grad():
            h0, h = (t for t in m(input_ids=x, output_hidden_states=True).hidden_states[::len(
                m.encoder.layer)])
            h_ctx, h_own = (m(input_ids=z).last_hidden_state for z in (other, own))
        tot = h[:, i].square().sum(-1).mean()
        spread = (h - h.mean(1, keepdim=True)).square().sum(-1).mean() / tot
        d_own = (h[:, i] - h_own[:, i]).square().sum(-1).mean() / tot
        d_ctx = (h[:, i] - h_ctx[:, i]).square().sum(-1).mean() / tot
        kept = observables.kept(h0, h).mean()
        a, b = (t - t.mean(1, keepdim=True) for t in (h0, h))
        a, b = (t.reshape(-1, t.shape[-1]).double() for t in (a, b))
        a, b = a - a.mean(0), b - b.mean(0)
        cka = (a.T @ b).square().sum() / ((a.T @ a).norm() * (b.T @ b).norm())
        print(f"{name:16s} {spread:7.3f} {d_own:7.3f} {d_ctx:7.3f} {kept:7.3f} {cka:7.3f}")


def train(names: list[str], steps: int) -> None:
    corpus, spec, base, ctx = _setup()
    cfg = TrainConfig(task="mlm", steps=steps, batch_size=ct.BATCH, lr=ct.LR,
                      bias_init="unigram", measure_every=0, eval_sequences=128)
    batches = Batches(spec, cfg, corpus=corpus)
    for name in names:
        t0, out = time.time(), []
        ct._train(_fixed(base, name, ctx), batches, spec.d_model, steps, 0, "cpu", every=100,
                  on_gain=lambda _s, g, out=out: out.append(round(g, 4)))
        print(name, out, f"{time.time() - t0:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sensitivity", action="store_true")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--methods", default="baseline,tfixup,admin,deepscalelm,rezero,depth-mup,"
                    "skipinit,deepnorm,layerscale,mimetic,centred,alpha,shaped")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    if args.sensitivity:
        sensitivity(names)
    if args.steps:
        train(names, args.steps)


if __name__ == "__main__":
    main()
