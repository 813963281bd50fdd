"""Small trained checkpoints, made offline in seconds: what a user's trained model folder looks
like (``config.json``, ``model.safetensors`` and a tokenizer), for the tests, the docs and the
demo of sigprop on trained weights.

:func:`train_tiny` trains a BERT-style masked-language encoder (``kind="encoder"``) or a
Llama-style causal decoder with rotary positions and grouped-query attention
(``kind="decoder"``) on the built-in stories (:mod:`sigprop.data.stories`) with the WordPiece
tokenizer trained on them (:mod:`sigprop.data.tokenizer`), then writes the folder with
``save_pretrained`` (safetensors) and the tokenizer beside it. A few hundred AdamW steps are
enough for what a trained model shows and an initialisation does not: weights far from their
init law, heads on the first token or on the previous one, sharp heads.

Reproducible (``seed``), one CPU thread's worth of work (~10-20 s at the defaults on the
2-core reference machine); :func:`cached` keeps one folder per setting under sigprop's cache
directory so a test session trains each kind once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..spec import SpecError

KINDS = ("encoder", "decoder")

#: the defaults: small enough for seconds on a CPU, large enough for heads with roles
DEFAULTS = dict(d_model=64, layers=2, heads=4, seq_len=64, steps=300, lr=3e-3, batch=16,
                documents=2000, vocab=2000)


def _config(kind: str, vocab: int, d_model: int, layers: int, heads: int, seq_len: int):
    from transformers import BertConfig, LlamaConfig

    if kind == "encoder":
        return BertConfig(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers,
                          num_attention_heads=heads, intermediate_size=4 * d_model,
                          max_position_embeddings=max(128, 2 * seq_len),
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                          pad_token_id=0, architectures=["BertForMaskedLM"])
    return LlamaConfig(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                       intermediate_size=4 * d_model, max_position_embeddings=2 * seq_len,
                       rope_theta=10000.0, bos_token_id=2, eos_token_id=3, pad_token_id=0,
                       tie_word_embeddings=True, architectures=["LlamaForCausalLM"])


def _tokenizer(tok, kind: str):
    """The trained ``tokenizers.Tokenizer`` as a ``transformers`` fast tokenizer: [CLS] text
    [SEP] for the encoder, [CLS] (its BOS) then the text for the decoder."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    single = "[CLS] $A [SEP]" if kind == "encoder" else "[CLS] $A"
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=single + " $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    extra = {} if kind == "encoder" else {"bos_token": "[CLS]", "eos_token": "[SEP]"}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=2 * DEFAULTS["seq_len"],
        **extra)


def train_tiny(kind: str, folder, *, seed: int = 0, **settings) -> Path:
    """Train a small ``kind`` model (``"encoder"`` or ``"decoder"``) and write it to
    ``folder`` (created; its previous content replaced): ``config.json``,
    ``model.safetensors``, the tokenizer files and ``sigprop_training.json`` (the settings
    and the loss before and after). ``settings`` override :data:`DEFAULTS`."""
    import numpy as np
    import torch

    from ..data.corpus import load_corpus
    from ..measurement.threads import cpu_settings
    from .loading import save_quietly

    if kind not in KINDS:
        raise SpecError("kind", f"must be one of {', '.join(KINDS)} (got {kind!r})")
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise SpecError("settings", f"unknown: {', '.join(sorted(unknown))} (known: "
                                    f"{', '.join(DEFAULTS)})")
    s = {**DEFAULTS, **settings}
    corpus = load_corpus("builtin", n_documents=s["documents"], vocab_size=s["vocab"], seed=seed)
    stream = torch.from_numpy(corpus.train.astype(np.int64))
    T, B = s["seq_len"], s["batch"]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    from transformers import BertForMaskedLM, LlamaForCausalLM

    cfg = _config(kind, corpus.vocab_size, s["d_model"], s["layers"], s["heads"], T)
    model = (BertForMaskedLM if kind == "encoder" else LlamaForCausalLM)(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=0.01)
    cls, mask_id = corpus.cls_id, corpus.mask_id
    losses = []
    # one thread: two OpenMP threads of small matmuls on a shared 2-core machine ran ~10x
    # slower than one whenever another process held a core
    with torch.random.fork_rng(), cpu_settings(threads=1):
        torch.manual_seed(seed)
        for _ in range(s["steps"]):
            starts = torch.randint(0, len(stream) - T, (B,), generator=gen)
            ids = torch.stack([stream[a:a + T] for a in starts.tolist()])
            ids[:, 0] = cls
            if kind == "encoder":  # BERT's masking: 15 % of the positions after [CLS]
                pick = torch.rand(ids.shape, generator=gen) < 0.15
                pick[:, 0] = False
                labels = torch.where(pick, ids, torch.full_like(ids, -100))
                ids = torch.where(pick, torch.full_like(ids, mask_id), ids)
                loss = model(input_ids=ids, labels=labels).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
    model.eval()
    out = Path(folder).expanduser()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_quietly(model, out)
    _tokenizer(corpus.tokenizer, kind).save_pretrained(out)
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    (out / "sigprop_training.json").write_text(json.dumps(
        {"kind": kind, "seed": seed, **s, "loss_first10": first, "loss_last10": last},
        indent=1))
    return out


def cached(kind: str, *, seed: int = 0, **settings) -> Path:
    """:func:`train_tiny`'s folder for these settings under sigprop's cache directory
    (``$SIGPROP_CACHE_DIR`` or ``~/.cache/sigprop``, ``trained/``), trained on first use;
    concurrent callers (test workers) wait for the one that trains (a file lock)."""
    from ..data.tokenizer import cache_dir

    key = json.dumps({"kind": kind, "seed": seed, **DEFAULTS, **settings, "v": 1},
                     sort_keys=True)
    name = f"{kind}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    from filelock import FileLock

    final = cache_dir() / "trained" / name
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):  # concurrent workers: one trains, the others wait
        if not (final / "sigprop_training.json").exists():
            tmp = final.with_name(f"{name}.{os.getpid()}.tmp")
            train_tiny(kind, tmp, seed=seed, **settings)
            os.replace(tmp, final)
    return final
