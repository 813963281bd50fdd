"""sigprop inside other people's training code (docs/monitor.md).

* :class:`SigpropCallback` — the training-time monitor as a ``transformers.Trainer`` callback:
  every K steps the observables and collapse checks of
  :class:`sigprop.measurement.monitor.Monitor`, logged through the Trainer to every logger it
  reports to and, on request, to the results store;
* :func:`store_sink` — a monitor sink writing each measurement to the results store (for
  custom loops and ``sigprop train --store``).

Importing this package does not import transformers; building a callback does.
"""

from .hf import SigpropCallback, store_sink

__all__ = ["SigpropCallback", "store_sink"]
