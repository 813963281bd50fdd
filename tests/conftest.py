import os
import tempfile

import pytest

# Before NumPy is imported: OpenBLAS threading misbehaves on small loaded machines (batched
# matmuls of ~1 ms took 200 ms); the theory code is vectorised, not BLAS-bound.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# Under pytest-xdist (`make test`: one worker per core) each worker gets its share of the cores
# for torch's intra-op threads, before torch is imported: workers that each start one thread per
# core oversubscribe the machine and stall in OpenMP barriers.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = (os.cpu_count() or 1) // max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(_share, 1)))
# A fresh table cache per test session (inherited by CLI subprocesses): no stale tables.
os.environ.setdefault("SIGPROP_CACHE_DIR", tempfile.mkdtemp(prefix="sigprop-cache-"))


@pytest.fixture(scope="module")
def torch_one_thread():
    """torch at one intra-op thread for a module of tiny-model tests (restored after): on a
    shared 2-core machine OpenMP barriers stall tiny ops (measured: a 16-wide AdamW step took
    100 ms with 2 threads under load; the HF callback's 4-step run 4.5 s with 2 threads, 0.5 s
    with 1). Use with ``pytestmark = pytest.mark.usefixtures("torch_one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def encoder():
    """The small trained BERT MLM of :mod:`sigprop.models.tiny_trained` (its folder; trained
    once per cache, then read)."""
    from sigprop.models.tiny_trained import cached

    return cached("encoder")


@pytest.fixture(scope="session")
def decoder():
    """The small trained Llama causal LM (RoPE, grouped K/V) of
    :mod:`sigprop.models.tiny_trained` (its folder)."""
    from sigprop.models.tiny_trained import cached

    return cached("decoder")
