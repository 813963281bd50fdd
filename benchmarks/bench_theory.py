"""Theory speed benchmarks, each against its slow baseline measured in the same run: a thin
script over :mod:`sigprop.bench.theory` (``sigprop bench theory causal_diagram`` runs the
same figures).

    python benchmarks/bench_theory.py [--quick]

1. Trainability diagram, 256 x 256 grid x 60 layers (vectorised `final_cos` over the grid)
   vs a scalar per-point loop of the same block map (extrapolated from a sample of points).
2. tanh MLP kernel: the vectorised rule vs scipy dblquad per point.
3. Finite-T Y2 (docs/theory.md §2.3): the 1-D quadrature vs Monte Carlo reaching the same
   accuracy (1e-4 absolute; MC cost extrapolated from its measured per-sample variance).
4. The causal diagram vs the bidirectional one, same grid and depth (target: within 2x).
"""

from __future__ import annotations

import argparse

from sigprop.bench import theory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    size = "quick" if ap.parse_args().quick else "default"
    for fig in theory.theory(size=size) + theory.causal_diagram(size=size):
        ok = "" if fig.ok is None else ("  ok" if fig.ok else "  MISSED")
        print(f"{fig.name}: sigprop {fig.sigprop_s:.4f} s, {fig.reference} {fig.reference_s:.4f}"
              f" s, ratio {fig.ratio:.3g} (target {fig.target or '-'}){ok}"
              + (f"; {fig.notes}" if fig.notes else ""))


if __name__ == "__main__":
    main()
