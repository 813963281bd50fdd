import os
import tempfile

# Before NumPy is imported: OpenBLAS threading misbehaves on small loaded machines (batched
# matmuls of ~1 ms took 200 ms); the theory code is vectorised, not BLAS-bound.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# A fresh table cache per test session (inherited by CLI subprocesses): no stale tables.
os.environ.setdefault("SIGPROP_CACHE_DIR", tempfile.mkdtemp(prefix="sigprop-cache-"))
