"""``sigprop bench``: every speed figure sigprop claims, each beside its reference measured in
the same run (:mod:`.core`; docs/bench.md)."""
