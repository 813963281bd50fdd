"""The matmul rate ``sigprop longctx MODEL`` states its stream's rate against
(``info["matmul_gflops"]``, measurement/rates.py)."""

from __future__ import annotations

import torch

from sigprop.analysis import longctx_model as lm
from sigprop.measurement.rates import matmul_rate


def test_matmul_rate_is_positive_and_leaves_torch_threads_as_they_were():
    before = torch.get_num_threads()
    assert matmul_rate(workers=1, n=64, repeats=2) > 0
    assert torch.get_num_threads() == before
    assert lm.matmul_rate is matmul_rate  # still importable where it was defined before
