"""The reproduced items' shared argument checks (sigprop.reproduce.args): the value back in
the item's type, or one SpecError line naming the argument and its range."""

import numpy as np
import pytest

from sigprop.reproduce import args
from sigprop.spec import SpecError


def test_values_come_back_typed():
    assert args.integer("n", np.int64(4), 1) == 4 and type(args.integer("n", 4, 1)) is int
    assert args.real("rho", "0.5", 0, 1) == 0.5
    assert args.grid("Ts", [8, 16], 8, 64, ints=True).dtype.kind == "i"
    assert args.integers("n", 5, 1, 9) == [5]
    assert args.reals("b", [0.5, 1], 0, 2).tolist() == [0.5, 1.0]
    assert args.device("cuda:1") == "cuda:1"


@pytest.mark.parametrize("call, field", [
    (lambda: args.integer("depth", True, 1), "depth"),
    (lambda: args.integer("depth", 0, 1), "depth"),
    (lambda: args.real("rho", float("nan"), 0, 1), "rho"),
    (lambda: args.real("tau", 0.0, 0, 1, lo_open=True), "tau"),
    (lambda: args.grid("Ts", [16, 8], 8, 64), "Ts"),
    (lambda: args.grid("Ts", [8.5, 16], 8, 64, ints=True), "Ts"),
    (lambda: args.grid("Ts", "abc", 8, 64), "Ts"),
    (lambda: args.integers("ns", [4, 4], 1, 9, increasing=True), "ns"),
    (lambda: args.integers("ns", [1.5], 1, 9), "ns"),
    (lambda: args.reals("betas", [np.inf], 0, 9), "betas"),
    (lambda: args.device("tpu"), "device"),
])
def test_bad_values_one_line_naming_the_field(call, field):
    with pytest.raises(SpecError) as e:
        call()
    msg = str(e.value)
    assert e.value.field == field and msg.startswith(f"{field}: must be ") and "\n" not in msg
