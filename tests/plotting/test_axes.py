"""Every plot takes ``ax=None`` (sigprop.plotting.figures): given Axes it draws into them and
returns their figure, makes no figure of its own and writes nothing without a path; given a
Figure or SubFigure it lays its panels there; the wrong number of Axes is one clear error;
the old names and homes of moved or renamed plots still work."""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest

from sigprop.plotting import figures, fixes, heads, longctx, longctx_model, scan, training
from sigprop.spec import ArchSpec

from .test_longctx_model_plot import make_traj


def _depth_rows() -> pd.DataFrame:
    rows = [dict(layer=la, observable=o, source=s, value=0.5 + 0.1 * la, stderr=0.01)
            for la in range(1, 4) for o in ("cos", "ipr", "entropy")
            for s in ("theory", "measured")]
    return pd.DataFrame(rows)


def _ranking():
    def row(method, cos, verdict):
        return types.SimpleNamespace(method=method, measured={"cos_final": cos,
                                                              "entropy_min": 0.6},
                                     predicted={"cos_final": cos}, verdict=verdict, error=None)

    return types.SimpleNamespace(
        baseline={"measured": {"cos_final": 0.97, "entropy_min": 0.3},
                  "predicted": {"cos_final": 0.99}, "verdict": "rank_collapse"},
        rows=[row("a", 0.5, "trainable"), row("b", 0.8, "entropy_collapse")],
        spec=ArchSpec(depth=2), model="m", seq_len=64)


def _training_rows() -> pd.DataFrame:
    rows = []
    for step in (0, 10):
        rows += [dict(step=step, observable="loss", split=sp, layer=np.nan, value=3.0 - step / 10)
                 for sp in ("train", "eval")]
        rows += [dict(step=step, observable=o, split=None, layer=la, value=0.5)
                 for o in ("cos", "entropy") for la in (1, 2)]
    return pd.DataFrame(rows)


def _table() -> pd.DataFrame:
    return pd.DataFrame([dict(beta=b, alpha=a, theory="trainable", outcome="learned", gain=0.5,
                              agree=True) for b in (0.3, 1.0) for a in (0.2, 2.0)])


def _scan_rows() -> pd.DataFrame:
    return pd.DataFrame([dict(config_hash=f"{b}{d}", config='{"beta": 1, "depth": 2}', beta=b,
                              depth=d, observable="cos", source="theory", layer=2, value=b * d)
                         for b in (0.5, 1.0) for d in (2, 4)])


def _diagram():
    from sigprop.theory import diagram

    return diagram.compute(ArchSpec(depth=4), n_beta=6, n_alpha=6)


def _heads() -> pd.DataFrame:
    return pd.DataFrame([dict(layer=la, head=h, observable="entropy", value=0.5)
                         for la in (1, 2) for h in range(3)])


def _roles() -> pd.DataFrame:
    roles = ["sink", "positional", "collapsed", "content", "diffuse", "selective"]
    return pd.DataFrame([dict(layer=la, head=h, role=roles[3 * (la - 1) + h],
                              max_logit=10.0 * h) for la in (1, 2) for h in range(3)])


#: name -> (draw(ax), number of panels)
PLOTS = {
    "plot_diagram": (lambda ax: figures.plot_diagram(_diagram(), ax=ax), 1),
    "plot_depth": (lambda ax: figures.plot_depth(_depth_rows(), ax=ax), 3),
    "plot_ranking": (lambda ax: fixes.plot_ranking(_ranking(), ax=ax), 2),
    "plot_longctx": (lambda ax: longctx.plot_longctx(make_traj(), ax=ax), 4),
    "plot_model_longctx": (lambda ax: longctx_model.plot_model_longctx(make_traj(), ax=ax), 6),
    "plot_scan": (lambda ax: scan.plot_scan(_scan_rows(), x="beta", y="cos", hue="depth",
                                            ax=ax)[0], 1),
    "plot_training": (lambda ax: training.plot_training(_training_rows(), ax=ax), 3),
    "plot_trainability": (lambda ax: training.plot_trainability(None, _table(), ax=ax), 1),
    "plot_head_heatmap": (lambda ax: heads.plot_head_heatmap(_heads(), ax=ax), 1),
    "plot_head_roles": (lambda ax: heads.plot_head_roles(_roles(), ax=ax), 1),
}


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_draws_into_given_axes_and_returns_their_figure(name, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    draw, n = PLOTS[name]
    host = Figure(figsize=(12, 6))
    axes = host.subplots(1, n + 1, squeeze=False)[0]
    made = []
    monkeypatch.setattr(figures, "new_figure", lambda *a, **k: made.append(a))
    fig = draw(axes[:n] if n > 1 else axes[0])
    assert fig is host and not made
    assert all(ax.has_data() or ax.images for ax in axes[:n])
    assert not axes[n].has_data() and host._suptitle is None  # the owner's parts untouched
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_lays_its_panels_into_a_subfigure(name):
    from matplotlib.figure import Figure

    draw, n = PLOTS[name]
    root = Figure(figsize=(14, 8), layout="constrained")
    left, right = root.subfigures(1, 2)
    assert draw(right) is root
    assert not left.axes and len([a for a in right.axes if a.get_visible()]) >= n


@pytest.mark.parametrize("name", ["plot_depth", "plot_ranking", "plot_longctx",
                                  "plot_model_longctx", "plot_training"])
def test_wrong_number_of_axes_is_one_error(name):
    from matplotlib.figure import Figure

    draw, n = PLOTS[name]
    with pytest.raises(ValueError, match=f"draws {n} panel"):
        draw(Figure().subplots(1, n + 1))


def test_a_path_still_writes_the_figure_drawn_into(tmp_path):
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    fig = heads.plot_head_heatmap(_heads(), tmp_path / "h.svg", ax=ax)
    assert fig is ax.figure and (tmp_path / "h.svg").read_text().lstrip().startswith("<?xml")


def test_old_names_still_work():
    assert fixes.plot_compare is fixes.plot_ranking
    assert longctx.plot_sweep is longctx.plot_longctx
    assert longctx_model.plot_model_sweep is longctx_model.plot_model_longctx


def test_result_plot_takes_ax():
    from matplotlib.figure import Figure

    from sigprop.analysis.result import Result

    res = types.SimpleNamespace(trajectory=_depth_rows(), spec=None)
    axes = Figure().subplots(1, 3)
    assert Result.plot(res, ax=axes) is axes[0].figure


def test_every_head_role_has_a_colour():
    """A role the anatomy gives must be drawable (a missing colour raised in the role map)."""
    from sigprop.analysis.anatomy import ROLES

    assert set(ROLES) <= set(heads.ROLE_COLOURS)
