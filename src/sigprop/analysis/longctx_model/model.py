"""The model of a long-context run, built at init (a preset, a local folder whose
safetensors replace the init, a config or config dict) or taken as it is (an
``nn.Module``), and the length it was built for. A model too big for float32 memory is stored
in bfloat16 and run block by block in float32 (:class:`Float32Blocks`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...measurement.handles import HookHandles

#: float32 bytes above which the blocks are stored in bfloat16 during the reference pass
BF16_ABOVE = 1.5 * 2**30


def train_length(config) -> int:
    """The length a model was built for: RoPE's ``original_max_position_embeddings`` where
    a ``rope_scaling`` records one, else the maximum positions, else 512."""
    for key in ("rope_scaling", "rope_parameters"):
        rs = getattr(config, key, None)
        if isinstance(rs, dict):
            v = rs.get("original_max_position_embeddings")
            if isinstance(v, int) and v > 1:
                return v
    for key in ("max_position_embeddings", "n_positions", "max_source_positions", "n_ctx"):
        v = getattr(config, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return v
    return 512


def _param_bytes(config, vocab: int) -> float:
    """float32 bytes of the base model built from ``config`` (counted on the meta device)."""
    import copy

    from transformers import AutoModel

    cfg = copy.deepcopy(config)
    cfg.vocab_size = vocab
    try:
        with torch.device("meta"):
            m = AutoModel.from_config(cfg, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - counted again when the real build fails
        return 0.0
    return 4.0 * sum(p.numel() for p in m.parameters())


class Float32Blocks(HookHandles):
    """Blocks stored in bfloat16 run in float32: each block's parameters are upcast before its
    forward and the bfloat16 copies put back after it; floating inputs are cast to float32."""

    def __init__(self, blocks):
        self.blocks, self._handles, self.saved = blocks, [], {}

    def __enter__(self):
        def cast(x):
            return x.float() if torch.is_tensor(x) and x.is_floating_point() else (
                tuple(cast(t) for t in x) if isinstance(x, tuple) else x)

        for _, b in self.blocks:
            def pre(m, args, kwargs):
                self.saved[id(m)] = [(p, p.data) for p in m.parameters()]
                for p, _ in self.saved[id(m)]:
                    p.data = p.data.float()
                return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

            def post(m, args, out):
                for p, data in self.saved.pop(id(m), []):
                    p.data = data

            self._handles.append(b.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(b.register_forward_hook(post))
        return self


@dataclass(frozen=True, kw_only=True)
class BuiltModel:
    """The model a long-context run measures: the ``module``, its ``config``, the ``name`` the
    report shows, ``notes`` on how it was built, whether its blocks are stored in bfloat16
    (``bf16``) and whether its weights are trained (a folder's files or the module given)."""

    module: Any
    config: Any
    name: str
    notes: list[str]
    bf16: bool
    trained: bool = False


def position_limit(module) -> tuple[str, int] | None:
    """``(name, positions)`` of the model's learned absolute position table (an
    ``nn.Embedding`` named for positions: BERT's ``position_embeddings``, GPT-2's ``wpe``,
    OPT's ``embed_positions``), less the rows an offset or padding index takes; None for a
    model without one (rotary, ALiBi, relative positions)."""
    from torch import nn

    for name, m in module.named_modules():
        leaf = name.rsplit(".", 1)[-1].lower()
        if isinstance(m, nn.Embedding) and ("position" in leaf or leaf in ("wpe", "pos_emb")):
            pad = m.padding_idx
            offset = int(getattr(m, "offset", 0) or 0) + (pad + 1 if pad is not None else 0)
            return name, int(m.num_embeddings) - offset
    return None


def build_model(model, seed: int = 0, device: str = "cpu") -> BuiltModel:
    """A preset / path / config at init (a folder's safetensors replace the init), or an
    ``nn.Module`` as it is."""
    from torch import nn

    from ... import models as hf
    from .. import forward as fw

    notes: list[str] = []
    if isinstance(model, nn.Module):
        return BuiltModel(module=model, config=fw.module_config(model),
                          name=type(model).__name__, notes=notes, bf16=False, trained=True)
    config = hf.load_config(model)
    name = str(model) if isinstance(model, str) else getattr(config, "model_type", "config")
    vocab = fw.vocab_at_init(config, int(getattr(config, "vocab_size", 0) or 1))
    big = _param_bytes(config, vocab) > BF16_ABOVE
    dtype = torch.bfloat16 if big else torch.float32
    m = hf.model_at_init(config, seed=seed, attn_implementation="eager", vocab_size=vocab,
                         dtype=dtype)
    folder = fw.model_folder(model)
    trained = folder is not None and hf.load_local_weights(m, folder).trained
    if trained:
        notes.append(f"weights: {folder} (trained)")
    if big:
        from ...measurement.probe_sites import find_blocks

        inside = {id(p) for _, b in find_blocks(m) for p in b.parameters()}
        for p in m.parameters():
            if id(p) not in inside:
                p.data = p.data.float()
        for mod in m.modules():
            for k, buf in list(mod._buffers.items()):
                if buf is not None and buf.is_floating_point():
                    mod._buffers[k] = buf.float()
        notes.append("blocks stored in bfloat16 (rounded once after init) to fit memory; "
                     "each block runs in float32")
    return BuiltModel(module=m.to(device), config=config, name=name, notes=notes, bf16=big,
                      trained=trained)

