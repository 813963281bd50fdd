"""sigprop: predict, measure and prevent rank collapse and entropy collapse in transformers
at initialisation.

One :class:`ArchSpec` drives both the mean-field theory and a torch model; every result is a
typed dataclass whose ``.to_frame()`` is the tidy Trajectory (one row per layer, observable
and source), whose ``.plot()`` returns a matplotlib Figure and which a notebook shows as HTML.

>>> import sigprop
>>> p = sigprop.predict(depth=48, beta=0.5)          # theory only, milliseconds
>>> c = sigprop.measure(depth=4, d_model=64, heads=4, seq_len=64, seeds=2)  # theory + torch
>>> d = sigprop.diagnose("gpt2", seq_len=128)        # a HuggingFace model, or an nn.Module
>>> f = sigprop.fix("bert-deep-48", "out/", methods="alpha")  # alpha at its auto default
>>> lc = sigprop.longctx(lengths=[512, 4096, 65536])
>>> lm = sigprop.longctx_model("gpt2", [1024, 8192])   # every attention layer of a model
>>> r = sigprop.sweep("predict", "beta=0.1:3:16,depth=12,48", store="runs/")  # resumable
>>> rows = sigprop.Store("runs/").read(query="beta > 1")
>>> m = sigprop.monitor(model, batch, every=50)  # in a training loop: m(step)
>>> h = sigprop.AttentionHealth(model, qk_clip=100)  # every step: h.after_step(step)

The package layout and where a new piece goes: ``docs/architecture.md``.
"""

from importlib.metadata import PackageNotFoundError as _NotFound
from importlib.metadata import version as _version

from .analysis.diagnose import diagnose
from .analysis.diagnosis import Diagnosis
from .analysis.fix import FixResult, fix
from .analysis.longctx import LongContext, longctx, longctx_model
from .analysis.longctx_model import ModelLongContext
from .analysis.measure import Comparison, measure
from .analysis.predict import Prediction, predict
from .integrations import SigpropCallback
from .measurement.monitor import CollapseWarning, Monitor, monitor
from .runs.executors import SweepReport, sweep
from .runs.store import Store
from .spec import ArchSpec, LayerSpec, SpecError
from .training.health import AttentionHealth, AttentionWarning

try:
    __version__ = _version("sigprop")
except _NotFound:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ArchSpec", "AttentionHealth", "AttentionWarning", "CollapseWarning", "Comparison",
    "Diagnosis", "FixResult", "LayerSpec",
    "LongContext", "ModelLongContext", "Monitor", "Prediction", "SigpropCallback", "SpecError",
    "Store", "SweepReport", "__version__", "diagnose", "fix", "longctx", "longctx_model",
    "measure", "monitor", "predict", "sweep",
]
