"""Long context for a real model: every attention layer with its own weights, norm and rotary
embedding, streamed at context lengths far beyond what the model can run (docs/theory.md §3.3).
The public entry point is :func:`sigprop.longctx_model`; :func:`.engine.run` composes the five
steps, one module each:

1. **Reference pass** (:mod:`.capture`, the model from :mod:`.model`). One forward pass at the
   reference length (``seq_len``, default ``min(512, max positions)``) over built-in text
   records, for every attention layer, what the attention computes with: its queries, keys
   and values as the module forms them (after the projections and any query/key norm,
   *before* RoPE), the (cos, sin) it receives, and the token cosine of its input. Big models
   are stored in bfloat16 and run block by block in float32 (the note says so).
2. **Input geometry at long T** (:mod:`.stream`). Per layer, keys and values at every position
   are drawn from a Gaussian with the mean and covariance measured in the reference pass (keys
   and values independently), queries of the sampled rows likewise: the layer sees tokens with
   its own norm, mean direction and covariance, hence its own cosine structure, at any length.
   What this leaves out: the dependence of hidden states on position (e.g. the first token's
   special state) and on the context length itself (checked against real forward passes in the
   tests: ``tests/test_longctx_model.py``).
3. **Streaming** (:mod:`.stream`, positions from :mod:`.rotary`).
   :func:`sigprop.measurement.stream_model.stream_layer` over the longest length, with the
   model's rotary module evaluated at the true positions (its own ``rope_scaling``: llama3,
   yarn, linear, ...; length-dependent kinds such as ``dynamic`` get one pass per length), rows
   of every length in the same pass (a length-T context is the first T positions of the
   longest one), every scaling on the same scores.
4. **Theory** per layer from the same moments (:mod:`.theory`): per head the REM energy
   variance over keys ``v_h = scale^2 E_a[q_a^T C_k q_a]`` plus, with RoPE, the variance of the
   rotating mean-key term over the row's window; finite-T tables of docs/theory.md §2.3 and the
   T -> infinity limit; the output cosine from the value moments through W_O.
5. **Recommendation** (:mod:`.scaling`): the smallest change of the logits (length scaling and
   parameter, or a constant Q/K rescale) whose predicted entropy stays within ``band`` of the
   training-length entropy in every layer up to the longest length; streamed in the same pass
   so the JSON carries its re-measured effect.

This package exports the names of its modules that scripts and tests use
(``from sigprop.analysis import longctx_model as lm; lm.run(...)``).
"""

from ...measurement.rates import matmul_rate  # defined here before measurement/rates.py
from .capture import (
    MODEL_TOL,
    Capture,
    LayerFit,
    fit_layers,
    module_window,
    output_projection,
    reference_pass,
)
from .engine import (
    DEFAULT_BAND,
    GAP_NOTE,
    MAX_QUERIES,
    ModelLongContext,
    default_lengths,
    run,
)
from .model import BF16_ABOVE, build_model, train_length
from .rotary import match_rope, rope_table, rotary_modules
from .scaling import COMPARE_ALL, KINDS, Recommendation, Scaling, parse_scaling, recommend
from .stream import Rows, sample_rows, stream_fit
from .theory import THEORY_QUERIES, LayerMoments, layer_theory, moments

#: the names before "sweep" came to mean parameter grids only (``sigprop.sweep``)
ModelSweep = ModelLongContext
sweep_model = run

__all__ = [
    "BF16_ABOVE", "COMPARE_ALL", "DEFAULT_BAND", "GAP_NOTE", "KINDS", "MAX_QUERIES", "MODEL_TOL",
    "THEORY_QUERIES", "Capture", "LayerFit", "LayerMoments", "ModelLongContext", "ModelSweep",
    "Recommendation", "Rows", "Scaling", "build_model", "default_lengths", "fit_layers",
    "layer_theory", "match_rope", "matmul_rate", "module_window", "moments", "output_projection",
    "parse_scaling", "recommend", "reference_pass", "rope_table", "rotary_modules", "run",
    "sample_rows", "stream_fit", "sweep_model", "train_length",
]
