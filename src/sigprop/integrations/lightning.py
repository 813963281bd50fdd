"""Attention health inside a PyTorch Lightning ``Trainer`` (docs/monitor.md, "PyTorch
Lightning").

    from sigprop.integrations.lightning import SigpropLightningCallback

    cb = SigpropLightningCallback(qk_clip=100.0, store="runs/monitor")
    trainer = lightning.pytorch.Trainer(callbacks=[cb], logger=TensorBoardLogger("tb"))
    trainer.fit(module, datamodule)
    cb.health.events                        # what happened, step by step

At ``on_train_start`` (after the strategy has set the model up, after the sanity check) the
callback builds :class:`sigprop.training.health.AttentionHealth` on the LightningModule, or,
when no attention layer is found there, on its ``.model`` (the usual name of a wrapped
HuggingFace model; ``module="name.of.submodule"`` names another one). Its in-step telemetry
then reads the q and k of every training forward.

When: in ``on_train_batch_end``. With automatic optimisation Lightning runs the optimizer step
(its closure: zero_grad, training_step, backward) *before* that hook, and increments
``trainer.global_step`` when the step is done; ``on_before_zero_grad`` is no use here, it runs
inside the closure before the forward. So in ``on_train_batch_end`` the weights are the
updated ones and QK-Clip acts on them. Batches that did not step (gradient accumulation) are
passed over: their forwards are merged into the step that follows. Manual optimisation works
the same (``global_step`` counts the manual optimizer steps).

Step numbers: the optimizer step index from 0, ``trainer.global_step - 1`` in that hook --
the step at which Lightning logs the ``self.log`` values of the same batch, so the attention
scalars and the loss line up in every logger. A resumed run starts at its ``global_step``.

Where the scalars go: on the global rank zero, to every logger of the trainer
(``trainer.loggers``: TensorBoard, W&B, MLflow, CSV ...) through ``log_metrics`` at that step,
on every measured step (``every``), independent of ``log_every_n_steps``. All of them are in
``cb.health.scalars`` too. ``store=`` writes each step's rows to the results store
(:func:`sigprop.integrations.hf.store_sink`, config ``kind="telemetry"``).

Data parallel (DDP): every rank runs the callback; the statistics are reduced across ranks
(the maximum of the largest logit, the mean of the rest), so QK-Clip rescales every replica
identically, and only rank zero logs, stores, keeps events and warns.

Lightning is imported only when a callback is built (the class becomes a subclass of
``lightning.pytorch.Callback`` then, or of ``pytorch_lightning.Callback`` where only that
package is installed), so ``import sigprop`` stays light.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

__all__ = ["SigpropLightningCallback"]

_MISSING = ("SigpropLightningCallback needs PyTorch Lightning: pip install sigprop[lightning] "
            "(or pip install lightning)")


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError(_MISSING) from None
    return Callback


@cache
def _with_lightning_base(cls: type) -> type:
    """``cls`` with Lightning's ``Callback`` as a second base (built once per class): its
    no-op hooks cover every event, and the Trainer's ``isinstance`` checks hold."""
    base = _callback_base()
    if issubclass(cls, base):
        return cls
    return type(cls.__name__, (cls, base),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "__doc__": cls.__doc__, "_plain": cls})


def _restore(cls: type, state: dict):
    """An unpickled callback: ``cls`` built again, its attributes as they were."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


class SigpropLightningCallback:
    """A Lightning ``Callback`` running :class:`~sigprop.training.health.AttentionHealth` on
    the model in training (module docstring).

    ``rows``, ``every``, ``qk_clip``, ``per_head`` and ``health_kwargs`` (``seed``,
    ``clip_alpha``, ``logit_limit``, ``beta_c``, ``entropy_floor``, ``horizon``, ``window``,
    ``warn``, ``sinks``, ``reduce``): as :class:`AttentionHealth`. ``store``: a results store
    folder (or ``Store``) for every measured step's rows; ``run``: the record name there
    (default: the logger's ``name/version_N``, else ``lightning``). ``module``: the dotted
    attribute name of the submodule to read (default: the LightningModule, else its
    ``.model``). ``log``: send the scalars to the trainer's loggers.

    After training: ``health`` (``events``, ``trajectory()``, ``scalars``); its hooks are
    removed when training ends.
    """

    def __new__(cls, *args, **kwargs):
        return object.__new__(_with_lightning_base(cls))

    def __reduce__(self):
        # the built class is not importable by its name: pickle (strategy="ddp_spawn" sends
        # the trainer and its callbacks to its processes) and deepcopy rebuild it from the
        # plain one
        return _restore, (getattr(type(self), "_plain", type(self)), dict(self.__dict__))

    def __init__(self, rows: int = 16, every: int = 1, qk_clip: float | None = None,
                 per_head: bool = False, store=None, run: str | None = None, *,
                 module: str | None = None, log: bool = True, **health_kwargs: Any):
        from ..training.health import AttentionHealth

        if "start" in health_kwargs:
            raise TypeError("SigpropLightningCallback sets start= itself (the trainer's "
                            "global_step)")
        options = dict(rows=rows, every=every, qk_clip=qk_clip, per_head=per_head,
                       **health_kwargs)
        # unknown names fail here, not when fit starts; values are checked by AttentionHealth
        inspect.signature(AttentionHealth).bind(None, **options)
        self.options = options
        self.store, self.run, self.module, self.log = store, run, module, log
        self.health = None
        self._last = None  # global_step at the last batch end that stepped
        self._open = False  # the health's hooks are on

    # ---- Lightning hooks ----------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        self._close()
        options = dict(self.options)
        sinks = list(options.pop("sinks", ()))
        if self.store is not None and trainer.is_global_zero:
            from .hf import store_sink

            sinks.append(store_sink(self.store, self.run or _run_name(trainer),
                                    kind="telemetry"))
        self.health = _health_on(pl_module, self.module, sinks=sinks,
                                 start=int(trainer.global_step), **options)
        self._last = int(trainer.global_step)
        self._open = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        health = self.health
        if health is None or trainer.global_step == self._last:
            return  # no optimizer step on this batch (gradient accumulation)
        self._last = int(trainer.global_step)
        step = self._last - 1
        scalars = health.after_step(step)
        if scalars and self.log and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(dict(scalars), step=step)

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close()

    def teardown(self, trainer, pl_module, stage) -> None:
        self._close()

    def _close(self) -> None:
        if self._open:
            self.health.close()
            self._open = False


def _health_on(pl_module, module: str | None, **options):
    """AttentionHealth on ``pl_module`` (or its attribute ``module``); when no attention is
    found on the LightningModule itself, on its ``.model``."""
    from torch import nn

    from ..spec import SpecError
    from ..training.health import AttentionHealth

    if module is not None:
        target = pl_module
        for part in module.split("."):
            target = getattr(target, part)
        return AttentionHealth(target, **options)
    try:
        return AttentionHealth(pl_module, **options)
    except SpecError as err:
        inner = getattr(pl_module, "model", None)
        if err.field != "model" or not isinstance(inner, nn.Module) or inner is pl_module:
            raise
        try:
            return AttentionHealth(inner, **options)
        except SpecError as err2:
            if err2.field != "model":
                raise
            raise err from None


def _run_name(trainer) -> str:
    logger = getattr(trainer, "logger", None)
    name = getattr(logger, "name", None)
    if not name:
        return "lightning"
    version = getattr(logger, "version", None)
    if version is None:
        return str(name)
    return f"{name}/{version}" if isinstance(version, str) else f"{name}/version_{version}"
