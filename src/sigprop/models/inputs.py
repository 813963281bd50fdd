"""Inputs of the right kind for any HF model (``sigprop diagnose`` on every model type).

A model's inputs are named by its ``forward`` signature: token ids and masks for text,
``pixel_values`` for images (``(B, C, S, S)`` at the config's image size and channels; video
models ``(B, F, C, S, S)`` with the config's frame count), ``input_values`` (raw audio, long
enough for the feature extractor's strides to give T frames) and ``input_features`` (mel
frames) for audio, boxes for layout models, and so on (:data:`MAKERS`). Sizes are read from
the config and its sub-configs (vision tower, audio encoder), never from a table of families.

:func:`settle` runs the model once on small inputs and learns which inputs its forward really
needs: a ``forward() missing ... argument 'x'`` or ``You have to specify x`` adds ``x`` when
sigprop can make it; when it cannot, the model is refused in one line naming ``x``. It also
records which transformer block lists ran, so a composite model (a vision tower beside a
language model) is measured on a stack that its inputs reach.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..spec import SpecError
from .config import config_attr

__all__ = ["MAKERS", "Settled", "config_value", "forward_error", "forward_params", "make_input",
           "makeable", "settle", "sub_configs"]

_SUBCONFIGS = ("vision_config", "audio_config", "text_config", "encoder_config",
               "speech_config", "backbone_config", "encoder", "vision_tower_config")


def _attr(cfg, name):
    """A config attribute, layer 0's where the config holds it per layer."""
    return config_attr(cfg, name, first_layer=True)


def sub_configs(cfg) -> list:
    """``cfg`` and its sub-config objects (vision tower, audio encoder, text model ...)."""
    subs = (_attr(cfg, n) for n in _SUBCONFIGS)
    return [cfg] + [c for c in subs if c is not None and not isinstance(c, dict | str)]


def config_value(cfg, names, default=None, *, positive: bool = True):
    """The first of ``names`` set (an int / float > 0, or the first entry of a list of them)
    on ``cfg`` or, failing that, on one of its sub-configs (vision tower, audio encoder ...)."""
    def ok(v):
        if isinstance(v, list | tuple) and v:
            v = v[0]
        if isinstance(v, int | float) and not isinstance(v, bool) and (v > 0 or not positive):
            return v
        return None

    for c in sub_configs(cfg):
        for n in names:
            v = ok(_attr(c, n))
            if v is not None:
                return v
    return default


def _special_ids(cfg) -> set[int]:
    """Token ids with a role (image / audio / video placeholders, bos, eos ...) anywhere in the
    config: text inputs avoid them so no placeholder asks for features that were not given."""
    out = set()
    for c in sub_configs(cfg):
        try:
            items = c.to_dict().items()
        except Exception:  # noqa: BLE001
            continue
        for k, v in items:
            if (k.endswith(("_token_id", "_token_index", "_token_ids")) and "pad" not in k):
                vals = v if isinstance(v, list) else [v]
                out |= {x for x in vals if isinstance(x, int) and not isinstance(x, bool)}
    return out


def text_ids(cfg, B: int, T: int, vocab: int, seed: int) -> torch.Tensor:
    """(B, T) ids of built-in text folded into ``vocab``, special ids replaced."""
    from ..measurement.inputs import text_ids as _ids

    ids, _ = _ids(B, T, seed)
    ids = torch.remainder(ids, max(vocab, 2))
    special = [i for i in _special_ids(cfg) if 0 <= i < vocab]
    if special:
        bad = torch.isin(ids, torch.tensor(special))
        free = next(i for i in range(vocab) if i not in special) if len(special) < vocab else 0
        ids = torch.where(bad, torch.full_like(ids, free), ids)
    return ids


def image_size(cfg) -> tuple[int, int]:
    """(height, width) of the config's images (its own, else a sub-config's; 224 x 224)."""
    s = next((x for x in (_attr(c, "image_size") for c in sub_configs(cfg)) if x is not None), None)
    if isinstance(s, dict):  # {"height": h, "width": w} or {"shortest_edge": s}
        vals = [v for v in s.values() if isinstance(v, int)]
        s = vals[:2] if vals else None
    if isinstance(s, int) and s > 0:
        return s, s
    if isinstance(s, list | tuple) and len(s) >= 2 and all(isinstance(x, int) for x in s[:2]):
        return int(s[0]), int(s[1])
    return 224, 224


def _pixels(cfg, B, T, g, video: bool):
    h, w = image_size(cfg)
    c = int(config_value(cfg, ("num_channels", "in_channels", "in_chans"), 3))
    if video:
        f = int(config_value(cfg, ("num_frames", "frames"), 8))
        return torch.randn(B, f, c, h, w, generator=g)
    return torch.randn(B, c, h, w, generator=g)


def _samples(cfg, T: int) -> int:
    """Raw audio samples whose convolutional feature extractor gives at least T frames."""
    stride, kernel = _attr(cfg, "conv_stride"), _attr(cfg, "conv_kernel")
    if isinstance(stride, list | tuple) and stride and all(isinstance(x, int) for x in stride):
        kern = kernel if isinstance(kernel, list | tuple) else [k * 2 for k in stride]
        n = T
        for k, s in reversed(list(zip(kern, stride, strict=False))):
            n = (n - 1) * s + k
        return int(n)
    hop = config_value(cfg, ("hop_length", "frame_stride", "downsample_factor"), 320)
    return int(T * hop + 400)


#: feature frames made at most (without ``@w``): a config's source length can be 10^4 frames,
#: whose relative-position attention alone would take tens of GB
MAX_FRAMES = 2048


def _features(cfg, B, T, g, whole: bool = False):
    """``(B, mel, frames)`` features: ``2 max_source_positions`` frames (Whisper's encoder
    takes no other length), at most :data:`MAX_FRAMES` unless ``whole``; ``4 T`` without a
    source length."""
    mel = int(config_value(cfg, ("feature_projection_input_dim", "num_mel_bins",
                                 "feature_size", "input_feat_per_channel", "n_mels",
                                 "num_mel_filters"), 80))
    src = config_value(cfg, ("max_source_positions",))
    frames = int(2 * src) if src else 4 * T
    return torch.randn(B, mel, frames if whole else min(frames, MAX_FRAMES), generator=g)


def _values(cfg, B, T, g):
    """``input_values``: raw audio ``(B, samples)`` for a model with a convolutional feature
    extractor (wav2vec 2.0 and kin), or, for one that names mel bins and no such extractor, a
    spectrogram ``(B, frames, mel)`` of the config's ``max_length`` frames (AST)."""
    mel = config_value(cfg, ("num_mel_bins",))
    if mel is not None and _attr(cfg, "conv_stride") is None:
        n = int(config_value(cfg, ("max_length",), 4 * T))
        return torch.randn(B, min(n, MAX_FRAMES), int(mel), generator=g)
    return torch.randn(B, _samples(cfg, T), generator=g)


def _per_side(cfg) -> int:
    """Patches per side of the config's images (image size over patch size)."""
    return max(image_size(cfg)[0] // int(config_value(cfg, ("patch_size",), 14)), 1)


def _states(cfg, B, T, g, widths=("hidden_size", "d_model", "n_embd", "dim", "embed_dim")):
    """``(B, T, d)`` i.i.d. N(0, 1) with ``d`` the first of the config's ``widths``: token
    embeddings a forward takes in place of ids (``inputs_embeds``, a Q-Former's
    ``query_embeds`` ...), or what a cross-attention stack run on its own attends to (a
    Q-Former's image features, ``encoder_hidden_states``); None without a width."""
    d = config_value(cfg, widths)
    return None if d is None else torch.randn(B, T, int(d), generator=g)


def _corners(a):
    """Boxes ``(x0, y0, x1, y1)`` from two random points per box, ``a`` of shape (..., 2, 2):
    each coordinate sorted so that the first corner is the smaller."""
    a = a.sort(dim=-2).values
    return torch.stack([a[..., 0, 0], a[..., 0, 1], a[..., 1, 0], a[..., 1, 1]], -1)


def _boxes(B, T, g):
    return _corners(torch.randint(0, 1000, (B, T, 2, 2), generator=g))


def _region_features(cfg, B, T, g):
    """Detected-region features of a vision-and-language encoder (LXMERT: ``(B, regions,
    visual_feat_dim)``), i.i.d. N(0, 1); as many regions as text tokens."""
    dim = config_value(cfg, ("visual_feat_dim", "visual_embedding_dim"))
    return None if dim is None else torch.randn(B, T, int(dim), generator=g)


def _region_boxes(cfg, B, T, g):
    """The regions' boxes, normalised corner coordinates ``(x0, y0, x1, y1)`` in [0, 1]."""
    dim = int(config_value(cfg, ("visual_pos_dim",), 4))
    if dim != 4:
        return torch.rand(B, T, dim, generator=g)
    return _corners(torch.rand(B, T, 2, 2, generator=g))


def _is_video(cfg, model) -> bool:
    return (config_value(cfg, ("num_frames", "tubelet_size")) is not None
            or "video" in type(model).__name__.lower())


_GRID = ("grid_thw", "image_grid_thw")


def _grid(cfg, B: int) -> tuple[int, int]:
    """(grid side g, patch features) of a flattened-patch vision tower (Qwen2-VL and the towers
    that share its input: ``(B g^2, C t p^2)`` patches and ``grid_thw`` rows ``[1, g, g]``)."""
    p = int(config_value(cfg, ("patch_size",), 14))
    t = int(config_value(cfg, ("temporal_patch_size", "patch_temporal"), 1))
    c = int(config_value(cfg, ("in_channels", "num_channels", "in_chans"), 3))
    merge = int(config_value(cfg, ("spatial_merge_size", "merge_size"), 2))
    return 4 * merge, c * t * p * p


def _takes(model, *names: str) -> bool:
    """Whether ``model.forward`` names one of ``names`` as a parameter."""
    params, _ = forward_params(model)
    return any(n in params for n in names)


def _side(cfg) -> int:
    """Patches per side of a patch-sequence vision tower (SigLIP 2's NaFlex input)."""
    n = config_value(cfg, ("num_patches", "max_num_patches"), 64)
    return max(int(math.isqrt(int(n))), 2)


def _patches_or(cfg, model, B, T, g, video=False):
    if _takes(model, *_GRID):
        side, feat = _grid(cfg, B)
        return torch.randn(B * side * side, feat, generator=g)
    if _takes(model, "spatial_shapes"):  # (B, patches, C p^2) with their grid shape
        p = int(config_value(cfg, ("patch_size",), 16))
        c = int(config_value(cfg, ("num_channels", "in_channels"), 3))
        return torch.randn(B, _side(cfg) ** 2, c * p * p, generator=g)
    return _pixels(cfg, B, T, g, video)


def _grid_rows(cfg, B):
    side, _ = _grid(cfg, B)
    return torch.tensor([[1, side, side]] * B, dtype=torch.long)


def _series(cfg, B, T, g):
    n = int(config_value(cfg, ("context_length", "context_len"), T))
    ch = int(config_value(cfg, ("num_input_channels",), 1))
    return torch.randn(B, n, ch, generator=g) if ch > 1 or _attr(
        cfg, "num_input_channels") else torch.randn(B, n, generator=g)


#: input name -> maker(cfg, model, B, T, vocab, seed, g); a maker returning None cannot make it
MAKERS: dict[str, Callable] = {
    "input_ids": lambda c, m, B, T, V, s, g: text_ids(c, B, T, V, s),
    "decoder_input_ids": lambda c, m, B, T, V, s, g: text_ids(c, B, T, V, s + 7919),
    "attention_mask": lambda c, m, B, T, V, s, g: torch.ones(B, T, dtype=torch.long),
    "token_type_ids": lambda c, m, B, T, V, s, g: torch.zeros(B, T, dtype=torch.long),
    "pixel_values": lambda c, m, B, T, V, s, g: _patches_or(c, m, B, T, g, _is_video(c, m)),
    "hidden_states": lambda c, m, B, T, V, s, g: (_patches_or(c, m, B, T, g)
                                                  if _takes(m, *_GRID) else None),
    "grid_thw": lambda c, m, B, T, V, s, g: _grid_rows(c, B),
    "image_grid_thw": lambda c, m, B, T, V, s, g: _grid_rows(c, B),
    "qformer_input_ids": lambda c, m, B, T, V, s, g: text_ids(c, B, T, V, s + 17),
    "past_values": lambda c, m, B, T, V, s, g: _series(c, B, T, g),
    "spatial_shapes": lambda c, m, B, T, V, s, g: torch.tensor([[_side(c)] * 2] * B),
    "pixel_attention_mask": lambda c, m, B, T, V, s, g: torch.ones(B, _side(c) ** 2,
                                                                   dtype=torch.long),
    "merge_sizes": lambda c, m, B, T, V, s, g: torch.tensor(
        [int(config_value(c, ("spatial_merge_size", "merge_size"), 2))] * B),
    "past_values_padding": lambda c, m, B, T, V, s, g: torch.zeros_like(_series(c, B, T, g)),
    "freq": lambda c, m, B, T, V, s, g: torch.zeros(B, 1, dtype=torch.long),
    "input_features_mask": lambda c, m, B, T, V, s, g: torch.ones(
        B, _features(c, B, T, g).shape[-1], dtype=torch.long),
    "pixel_values_videos": lambda c, m, B, T, V, s, g: _pixels(c, B, T, g, True),
    "pixel_mask": lambda c, m, B, T, V, s, g: torch.ones(B, *image_size(c), dtype=torch.long),
    "input_values": lambda c, m, B, T, V, s, g: _values(c, B, T, g),
    "input_features": lambda c, m, B, T, V, s, g: _features(c, B, T, g),
    "bbox": lambda c, m, B, T, V, s, g: _boxes(B, T, g),
    "lang_ids": lambda c, m, B, T, V, s, g: torch.zeros(B, dtype=torch.long),  # language 0
    "encoder_hidden_states": lambda c, m, B, T, V, s, g: _states(
        c, B, T, g, ("encoder_hidden_size", "cross_attention_hidden_size", "hidden_size",
                     "d_model")),
    "target_sizes": lambda c, m, B, T, V, s, g: torch.tensor(  # patches per side (MiniCPM-V)
        [[_per_side(c)] * 2] * B),
    "visual_feats": lambda c, m, B, T, V, s, g: _region_features(c, B, T, g),
    "visual_pos": lambda c, m, B, T, V, s, g: _region_boxes(c, B, T, g),
}

#: inputs of another modality, offered together when a forward fails without naming one
_MODAL = ("pixel_values", "input_ids", "input_values", "input_features", "bbox")

#: optional inputs that give a modality its shape (NaFlex patch grids, Qwen-VL grids)
_COMPANIONS = {"pixel_values": ("spatial_shapes", "pixel_attention_mask", *_GRID)}

#: another layout of an input, tried when the forward fails on the first one
_ALT = {"input_features": "input_features@t", "input_values": "input_values@c",
        "pixel_values": "pixel_values@2"}

#: audio features at the config's whole source length, tried after the other layout (_ALT)
_WHOLE = {"input_features": "input_features@w", "input_features_mask": "input_features_mask@w"}

#: what each input is, for notes
_KIND = {"pixel_values": "image", "pixel_values_videos": "video", "input_values": "audio",
         "input_features": "audio", "bbox": "layout"}


def _maker(name: str) -> Callable | None:
    """The maker of input ``name``: :data:`MAKERS`, or embeddings for a ``*_embeds`` input."""
    if name in MAKERS:
        return MAKERS[name]
    if name.endswith("_embeds"):
        return lambda c, m, B, T, V, s, g: _states(c, B, T, g)
    return None


def makeable(name: str) -> bool:
    """Whether sigprop can make input ``name`` (a config may still lack what sizes it)."""
    return _maker(name.split("@")[0]) is not None


def make_input(name: str, cfg, model, B: int, T: int, vocab: int, seed: int):
    """One input tensor, or None when sigprop cannot make ``name`` from the config.
    ``name@t``: the same input with its last two axes swapped (``input_features`` as frames x
    mel bins, as Parakeet or Speech2Text take them, where Whisper takes mel bins x frames);
    ``name@c``: with a channel axis (``input_values`` as (B, 1, samples): audio codecs);
    ``name@w``: sized for the config's whole source length (``2 max_source_positions`` feature
    frames: Whisper); ``pixel_values@2``: two images per sequence, ``(B, 2, C, H, W)``
    (keypoint matchers: LightGlue, EfficientLoFTR; image sets: IDEFICS); letters combine
    (``@tw``)."""
    name, _, variant = name.partition("@")
    maker = _maker(name)
    if maker is None:
        return None
    g = torch.Generator().manual_seed(int(seed) + len(name))
    if "w" in variant and name in ("input_features", "input_features_mask"):
        x = _features(cfg, B, T, g, whole=True)  # the config's whole source length
        x = x if name == "input_features" else torch.ones(B, x.shape[-1], dtype=torch.long)
    else:
        x = maker(cfg, model, B, T, vocab, seed, g)
    if x is None:
        return x
    if "2" in variant and name == "pixel_values" and x.ndim == 4:  # an image pair / set
        x = torch.stack([x, maker(cfg, model, B, T, vocab, seed, g)], 1)
    if "t" in variant:
        x = x.transpose(-1, -2).contiguous()
    return x.unsqueeze(1) if "c" in variant else x


def forward_params(model) -> tuple[list[str], set[str]]:
    """(parameter names, required ones) of ``model.forward``, ``*args`` / ``**kwargs`` left
    out (they name nothing)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError, AttributeError):
        return [], set()
    names, req = [], set()
    for n, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        names.append(n)
        if p.default is p.empty:
            req.add(n)
    return names, req


_MISSING = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: (.*)")
_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")
#: an error naming alternatives ("either input_ids or inputs_embeds", "exactly one of ...")
_ONE_OF = re.compile(r"\beither\b|\bone of\b|\bor\b", re.I)


def _asked_for(err: BaseException, params: list[str], have: set[str]) -> list[str]:
    """The input names an error from the model's forward asks for (missing arguments, or a
    parameter of the forward named in the message that was not given)."""
    msg = str(err)
    m = _MISSING.search(msg)
    if m:
        return _QUOTED.findall(m.group(1))
    named = [p for p in params if p not in have and re.search(rf"\b{re.escape(p)}\b", msg)]
    named = [p for p in named if makeable(p) or p.startswith(("pixel", "input", "bbox"))]
    if len(named) > 1 and _ONE_OF.search(msg):  # "either ids or embeds": the first we make
        named = sorted(named, key=lambda p: (p.endswith("_embeds"), msg.find(p)))[:1]
    return named


@dataclass
class Settled:
    """What :func:`settle` learnt: the input names to feed, the block lists that ran (by
    qualified name, in module order) and a note on the inputs."""

    names: list[str]
    ran: list[str] = field(default_factory=list)
    note: str | None = None


def _memory_error(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "alloc" in str(err).lower() and isinstance(
        err, RuntimeError)


def settle(model: nn.Module, cfg, main: list[str], candidates: list[str],
           call: Callable[[dict], None], B: int = 1, T: int = 8, vocab: int = 2, seed: int = 0,
           device: str = "cpu") -> Settled:
    """Run ``call(inputs)`` once on small inputs (``B`` sequences of ``T`` tokens) starting
    from ``main`` (the inputs of the model's kind), adding what the forward asks for; record
    which of the ``candidates`` (qualified names of block lists) ran. Refuses in one line
    (``SpecError``) when the forward needs an input sigprop cannot make, or fails on the
    inputs made."""
    params, required = forward_params(model)
    names = [n for n in main if not params or n in params]
    names += [n for n in params if n in required and makeable(n) and n not in names]
    unknown = [n for n in params if n in required and not makeable(n)]
    cls = type(model).__name__
    if unknown:
        raise SpecError("model", f"{cls}.forward needs {', '.join(unknown)}, which sigprop "
                                 "cannot make from the config (diagnose takes text, image, "
                                 "video, audio and layout inputs)")
    mods = dict(model.named_modules())
    ran: dict[str, int] = dict.fromkeys(candidates, 0)
    handles = []
    for c in candidates:
        lst = mods.get(c)
        first = lst[0] if isinstance(lst, nn.ModuleList | nn.Sequential) and len(lst) else None
        if first is not None:
            handles.append(first.register_forward_pre_hook(
                lambda m, a, c=c: ran.__setitem__(c, ran[c] + 1)))
    base, first_err = list(names), None
    def modal(ns):  # every modality the forward takes, with the inputs that shape them
        add = [n for n in _MODAL if n in params and n not in ns]
        add += [c for n in add for c in _COMPANIONS.get(n, ()) if c in params]
        return ns + add

    def every(ns):  # and every optional input sigprop can make (Q-Former ids, region feats)
        have = {n.split("@")[0] for n in ns}
        whole = "input_features@w" in ns  # a mask as long as the whole-length features
        return ns + [n + "@w" if whole and n in _WHOLE else n for n in params
                     if n in MAKERS and n not in have]

    fallbacks = [lambda ns: [_ALT.get(n, n) for n in ns],  # another layout (frames x mel)
                 lambda ns: [_WHOLE.get(n, n) for n in ns],  # the whole source length
                 modal,  # a dual encoder (CLIP, SigLIP 2) wants text and images
                 lambda ns: modal([_ALT.get(n, n) for n in ns]),
                 lambda ns: every(modal(ns)), lambda ns: every(modal([_ALT.get(n, n)
                                                                      for n in ns])),
                 lambda ns: every(modal([_WHOLE.get(n, n) for n in ns]))]
    try:
        for _ in range(12):
            inputs = {n.split("@")[0]: make_input(n, cfg, model, B, T, vocab, seed)
                      for n in names}
            inputs = {k: v.to(device) for k, v in inputs.items() if v is not None}
            try:
                with torch.no_grad():
                    call(inputs)
                break
            except Exception as err:  # noqa: BLE001 - the model's own forward on our inputs
                if _memory_error(err):
                    raise SpecError("memory", f"{cls}: out of memory in a forward pass of "
                                              f"{B} x {T} tokens") from None
                bare = {n.split("@")[0] for n in names}
                asked = [a for a in _asked_for(err, params, bare) if a not in bare]
                if asked:
                    cant = [a for a in asked if not makeable(a)]
                    if cant:
                        raise SpecError("model", f"{cls}.forward needs {', '.join(cant)}, "
                                                 "which sigprop cannot make from the "
                                                 "config") from None
                    names, base = names + asked, base + asked
                    continue
                first_err = first_err or err
                while fallbacks:
                    nxt = fallbacks.pop(0)(base)
                    if nxt != names and nxt != base:
                        names = nxt
                        break
                else:
                    kinds = sorted({_KIND.get(n.split("@")[0], "text") for n in base})
                    msg = str(first_err).splitlines()[0][:160] if str(first_err) else ""
                    raise SpecError("model", f"{cls} does not run on the "
                                             f"{'/'.join(kinds or ['no'])} inputs sigprop "
                                             f"makes from its config ({type(first_err).__name__}"
                                             f": {msg})") from None
        else:
            raise SpecError("model", f"{cls}: no set of inputs sigprop can make runs it "
                                     f"(tried {', '.join(names)})")
    finally:
        for h in handles:
            h.remove()
    extra = [n.split("@")[0] for n in names if n not in main]
    note = (f"inputs: {', '.join(names)} ({', '.join(extra)} added: the model's forward "
            "needs them)") if extra else None
    return Settled(names, [c for c in candidates if ran[c]], note)


def forward_error(model, inputs: dict, err: BaseException) -> SpecError:
    """One line for a model whose forward fails on the full-size inputs (out of memory, or
    the model's own error naming the input sizes)."""
    cls = type(model).__name__
    if _memory_error(err):
        return SpecError("memory", f"{cls}: out of memory in the forward pass; use a smaller "
                                   "--seq-len or --sequences")
    sizes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in inputs.items() if torch.is_tensor(v))
    msg = str(err).splitlines()[0][:160] if str(err) else ""
    return SpecError("model", f"{cls} does not run on the inputs sigprop made ({sizes}): "
                              f"{type(err).__name__}: {msg}; a smaller --seq-len may fit its "
                              "config")


def tokens_of(x: torch.Tensor) -> int:
    """Sequence length of a (B, T, ...) tensor."""
    return int(x.shape[1]) if x.dim() >= 2 else int(math.prod(x.shape))
