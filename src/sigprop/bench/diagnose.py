"""``diagnose`` against the bare HuggingFace forward it is built on (issue 19, item 1).

sigprop's figure: :func:`sigprop.diagnose` of bert-base-uncased with its defaults (2 seeds x
2 sequences of built-in text at T = 512: each seed builds the model with its own init, runs
one forward pass under the probe and the weight reader, and the theory of the weights is set
beside the measurement). The reference is what a user would write without sigprop: for the
same 2 seeds, ``BertModel`` built from the same config with HuggingFace's own init (the full
vocabulary, the default SDPA attention) and one forward pass with ``output_hidden_states`` on
the same 2 x 512 token ids. Both run in this call, alternately, best of ``repeat`` each, so
that a busy machine slows both. Target: sigprop within 1.5x of the reference.

``quick``: a 2-layer BERT of width 64 (4 heads) at T = 64, 2 seeds x 2 sequences.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .core import Figure, register

__all__ = ["diagnose_vs_bare"]

#: (config dict or preset, seq_len, repeats) per size
SIZES: dict[str, tuple[Any, int, int]] = {
    "quick": ({"model_type": "bert", "vocab_size": 1000, "hidden_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
               "max_position_embeddings": 128, "pad_token_id": 0}, 64, 2),
    "default": ("bert-base-uncased", 512, 3),
}
SEEDS, SEQUENCES = 2, 2


def _bare(config, T: int, seeds: int, sequences: int, device: str, sync) -> None:
    """The reference: the model built from ``config`` with HF's init under each seed, one
    forward pass with hidden states on the same token ids as :func:`sigprop.diagnose`."""
    import torch
    from transformers import AutoModel

    from ..measurement.inputs import text_ids

    ids, _ = text_ids(sequences, T, 0)
    ids = torch.remainder(ids, config.vocab_size).to(device)
    mask = torch.ones_like(ids)
    for s in range(seeds):
        torch.manual_seed(s)
        model = AutoModel.from_config(config).to(device).eval()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        del model
    if sync is not None:
        sync()


@register("diagnose", title="diagnose against the bare HF init + forward", runtime=60)
def diagnose_vs_bare(*, size: str = "default", device: str = "cpu") -> list[Figure]:
    import torch

    import sigprop

    from ..models import load_config

    model, T, repeat = SIZES[size]
    config = load_config(model)
    sync = torch.cuda.synchronize if device == "cuda" else None
    # default: diagnose's own defaults (seeds, sequences, T = 512 for bert-base)
    kw: dict[str, Any] = {"device": device} if size == "default" else dict(
        seq_len=T, seeds=SEEDS, sequences=SEQUENCES, device=device)
    sigprop.diagnose(model, **kw)  # imports and first-call costs out of the timings
    _bare(config, T, 1, SEQUENCES, device, sync)
    t_ref, t_sig = math.inf, math.inf
    for _ in range(repeat):  # alternate, so that both see the same machine
        t0 = time.perf_counter()
        _bare(config, T, SEEDS, SEQUENCES, device, sync)
        t1 = time.perf_counter()
        sigprop.diagnose(model, **kw)
        if sync is not None:
            sync()
        t2 = time.perf_counter()
        t_ref, t_sig = min(t_ref, t1 - t0), min(t_sig, t2 - t1)
    name = model if isinstance(model, str) else "bert-2x64"
    ratio = t_sig / t_ref
    return [Figure(f"diagnose/{name}",
                   f"sigprop diagnose, {SEEDS} seeds x {SEQUENCES} seqs x T {T}",
                   sigprop_s=t_sig, reference=f"BertModel init + forward (hidden states), "
                   f"same {SEEDS} seeds x {SEQUENCES} x {T} ids", reference_s=t_ref,
                   target="<= 1.5", ok=ratio <= 1.5,
                   size={"model": name, "seeds": SEEDS, "sequences": SEQUENCES,
                         "seq_len": T, "repeat": repeat, "device": device,
                         "threads": torch.get_num_threads()})]
