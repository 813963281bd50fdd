"""Theory commands: ``predict``, ``diagram``, ``translate``."""

from __future__ import annotations

import sys

import typer

from ..spec import ArchSpec
from .common import (
    AsymptoticOpt,
    Fmt,
    FormatOpt,
    SeedOpt,
    StackMethodOpt,
    StackParamOpt,
    WideOpt,
    check_figure_path,
    emit_json,
    fail,
    spec_command,
    stack_methods,
    write_figure,
)


@spec_command
def predict(spec: ArchSpec, asymptotic: bool = AsymptoticOpt, fmt: Fmt = FormatOpt,
            seed: int = SeedOpt, wide: bool = WideOpt,
            method: str | None = StackMethodOpt, param: list[str] | None = StackParamOpt
            ) -> None:
    """Theory trajectory (cos, q, ipr, entropy, wmax per layer), verdict and alpha_crit."""
    from .. import trajectory
    from ..analysis.predict import predict as run
    names, params = stack_methods(method, param)
    p = run(spec, asymptotic=asymptotic, methods=names, method_params=params, seed=seed)
    spec = p.spec
    traj, verdict, a_crit, derived = p.trajectory, p.verdict, p.alpha_crit, p.derived
    if fmt == Fmt.json:
        emit_json({"spec": spec.to_dict(), "derived": derived, "rows": trajectory.to_rows(traj),
                    "verdict": verdict, "alpha_crit": a_crit})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from ..report import console

        console.print_prediction(spec, traj, derived, verdict, a_crit, wide=wide)


@spec_command
def diagram_cmd(spec: ArchSpec,
                out: str | None = typer.Option(None, "--out",
                                               help="write the diagram (.png, .svg, .pdf)"),
                grid: int = typer.Option(256, "--grid", help="grid points per axis"),
                beta_max: float | None = typer.Option(None, "--beta-max", help="beta axis end"),
                alpha_max: float | None = typer.Option(None, "--alpha-max",
                                                       help="alpha_attn axis end"),
                asymptotic: bool = AsymptoticOpt, fmt: Fmt = FormatOpt,
                seed: int = SeedOpt, wide: bool = WideOpt) -> None:
    """(beta, alpha_attn) trainability diagram for the spec's depth (docs/theory.md §2.7)."""
    from ..theory import diagram

    if not 2 <= grid <= 4096:
        fail(f"--grid: must be an integer in [2, 4096] (got {grid})")
    for name, val in (("--beta-max", beta_max), ("--alpha-max", alpha_max)):
        if val is not None and not 0 < val <= 1e3:
            fail(f"{name}: must be a number in (0, 1000] (got {val})")
    check_figure_path("--out", out)
    d = diagram.compute(spec, n_beta=grid, n_alpha=grid, beta_max=beta_max,
                        alpha_max=alpha_max, asymptotic=asymptotic)
    if out:
        from ..plotting.figures import plot_diagram

        write_figure("--out", out, plot_diagram, d, spec=spec)
    if fmt == Fmt.json:
        emit_json({"spec": spec.to_dict(), "derived": spec.derived(), **d.to_json(),
                    "out": out})
    elif fmt == Fmt.csv:
        import pandas as pd

        pd.DataFrame({"beta": d.betas, "alpha_crit": d.alpha_crit}).to_csv(sys.stdout,
                                                                           index=False)
    else:
        from ..report import console

        console.print_diagram(spec, d, out, wide=wide)


TRANSLATE_KEYS = ("sigma_s", "beta", "beta_c", "beta_over_beta_c", "gamma", "gamma_c",
                  "deshpande_ratio", "sigma_A", "tau", "tau_star")


def translations(spec: ArchSpec) -> dict:
    """docs/theory.md §6 for the spec's first attention layer at rho0 (default 0): the docs/cli.md
    keys,
    with noci22's equalising temperature tau* (Eq. 47) for LayerNorm-ed inputs
    (sigma_x^2 = 1), d = d_model (the ratio of the two gradients does not depend on the head
    width for weights of variance 1/d_model), n = seq_len."""
    from ..theory.uniform import tau_star

    d = spec.derived()
    d["tau_star"] = float(tau_star(1.0, spec.d_model, spec.seq_len, d["rho0"]))
    return d


@spec_command
def translate(spec: ArchSpec, fmt: Fmt = FormatOpt, seed: int = SeedOpt,
              wide: bool = WideOpt) -> None:
    """The score scale in all five papers' terms (docs/theory.md §6)."""
    d = translations(spec)
    if fmt == Fmt.json:
        emit_json({k: d[k] for k in TRANSLATE_KEYS} | {"spec": spec.to_dict(),
                                                         "extra": {k: v for k, v in d.items()
                                                                   if k not in TRANSLATE_KEYS}})
    elif fmt == Fmt.csv:
        sys.stdout.write("name,value\n" + "".join(f"{k},{v}\n" for k, v in d.items()))
    else:
        from ..report import console

        console.print_translation(spec, d, wide=wide)
