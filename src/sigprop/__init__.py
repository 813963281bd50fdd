"""sigprop: predict, measure and prevent rank collapse and entropy collapse in transformers.

See ARCHITECTURE.md: one :class:`~sigprop.spec.ArchSpec` drives both the theory map
(:mod:`sigprop.theory`) and the torch model; everything returns a tidy Trajectory table.
"""

__version__ = "0.1.0"
