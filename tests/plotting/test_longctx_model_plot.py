"""The per-layer long-context figure (plot_model_longctx) and its HTML report, on synthetic
trajectories built here: panel layout, one line per drawn layer, the layer subset of deep
models, entropy bands, saving, escaping and the edge cases (one length, one layer, theory
only, missing values)."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sigprop.plotting.longctx_model import layer_subset, plot_model_longctx
from sigprop.report.longctx_html import render_longctx_report, write_longctx_report

EVIL = 'evil<script>alert("x")</script>&"'
SCALINGS = ("none", "sqrt-log-n", "tau(0.8)")
LINE = re.compile(r"^layer \d+$")


def make_traj(layers=4, lengths=(1024, 4096, 16384), scalings=SCALINGS,
              measured=("none", "tau(0.8)"), seed=0) -> pd.DataFrame:
    """Tidy rows of every observable and source; measured rows only for ``measured``
    scalings, NaN stderr at the shortest length."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, sc in enumerate(scalings):
        for layer in range(layers):
            b = 0.3 + 0.2 * layer / max(layers - 1, 1) + 0.05 * k
            for T in lengths:
                ent = float(np.clip(1.0 - b * np.log2(T) / 20, 0.05, 1.0))
                ipr = float(min(1.0, T ** (0.75 * b - 1.0)))
                values = {"entropy": ent, "ipr": ipr, "wmax": ipr ** 0.5, "cos": 0.5,
                          "spread": 0.1}
                for obs, v in values.items():
                    base = dict(layer=layer, observable=obs, seq_len=T, scaling=sc,
                                stderr=np.nan, **{"spec.d_model": 64})
                    rows.append({**base, "source": "theory", "value": v})
                    rows.append({**base, "source": "theory_asymptotic", "value": 0.9 * v})
                    if sc in measured:
                        se = np.nan if T == lengths[0] else 0.03 * v
                        rows.append({**base, "source": "measured", "stderr": se,
                                     "value": v * (1 + rng.normal(0, 0.03))})
    return pd.DataFrame(rows)


def bands(layers: int) -> dict[int, tuple[float, float]]:
    return {layer: (0.55 + 0.01 * layer, 0.8 + 0.01 * layer) for layer in range(layers)}


def panels(fig):
    """The data panels (not the colour bar), and the colour bar's axes."""
    cbar = [ax for ax in fig.axes if ax.get_ylabel() == "layer"]
    return [ax for ax in fig.axes if ax not in cbar], cbar


def layer_lines(ax) -> list[str]:
    return [ln.get_label() for ln in ax.get_lines() if LINE.match(ln.get_label())]


def band_patches(ax) -> list:
    return [p for p in ax.patches if p.get_gid() == "band"]


@pytest.fixture(scope="module")
def fig():
    return plot_model_longctx(make_traj(), band=bands(4), title="tiny model")


def test_grid_is_two_rows_per_scaling_plus_a_colour_bar(fig):
    data, cbar = panels(fig)
    assert len(fig.axes) == 2 * len(SCALINGS) + 1
    assert len(data) == 2 * len(SCALINGS) and len(cbar) == 1
    titles = [ax.get_title() for ax in data if ax.get_title()]
    assert [t.split(" ")[0] for t in titles] == list(SCALINGS)  # order of first appearance
    assert titles[1] == "sqrt-log-n (theory only)"
    assert fig._suptitle.get_text() == "tiny model"


def test_one_theory_line_per_layer_in_every_panel(fig):
    data, _ = panels(fig)
    for ax in data:
        assert layer_lines(ax) == [f"layer {i}" for i in range(4)]
        assert ax.get_xscale() == "log"
    # measured markers only where the scaling has measured rows
    measured = [sum(c.get_label().endswith("measured") for c in ax.containers) for ax in data]
    assert measured == [4, 0, 4, 4, 0, 4]  # row-major: entropy row, then ipr row


def test_bands_shade_the_entropy_row_only(fig):
    data, _ = panels(fig)
    top, bottom = data[: len(SCALINGS)], data[len(SCALINGS):]
    for ax in top:
        assert len(band_patches(ax)) == 4
        lo, hi = ax.get_ylim()
        assert 0.0 <= lo < 0.55 and 0.83 < hi <= 1.02  # data and band inside, capped
    for ax in bottom:
        assert band_patches(ax) == []


def test_length_ticks_are_powers_of_two(fig):
    ax = panels(fig)[0][-1]
    assert list(ax.get_xticks()) == [1024, 4096, 16384]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["$2^{10}$", "$2^{12}$", "$2^{14}$"]


def test_deep_models_draw_an_even_subset_with_first_and_last():
    assert layer_subset(range(40), 16)[0] == 0 and layer_subset(range(40), 16)[-1] == 39
    assert len(layer_subset(range(40), 16)) == 16
    assert layer_subset(range(5), 16) == [0, 1, 2, 3, 4]
    assert layer_subset(range(40), 1) == [0, 39]
    with pytest.raises(ValueError):
        layer_subset(range(4), 0)
    f = plot_model_longctx(make_traj(layers=40, lengths=(1024, 2048), scalings=("none",)),
                           band=bands(40), max_lines=16)
    data, _ = panels(f)
    for ax in data:
        names = layer_lines(ax)
        assert len(names) == 16 and names[0] == "layer 0" and names[-1] == "layer 39"
    assert len(band_patches(data[0])) == 16
    assert "16 of 40 layers" in f._suptitle.get_text()


def test_edge_cases_one_length_one_layer_theory_only_and_no_band():
    traj = make_traj(layers=1, lengths=(3000,), scalings=("qwen",), measured=())
    f = plot_model_longctx(traj)
    data, cbar = panels(f)
    assert len(data) == 2 and len(cbar) == 1
    for ax in data:
        assert layer_lines(ax) == ["layer 0"] and band_patches(ax) == []
    assert [t.get_text() for t in data[1].get_xticklabels()] == ["3000"]
    # measured rows with NaN stderr everywhere still draw
    traj = make_traj(layers=2, lengths=(512,), scalings=("none",), measured=("none",))
    f = plot_model_longctx(traj, band={0: (0.2, 0.4)})
    assert len(band_patches(panels(f)[0][0])) == 1
    with pytest.raises(ValueError):
        plot_model_longctx(traj[traj["observable"] == "cos"])


def test_saves_png_and_svg_and_leaves_pyplot_alone(tmp_path):
    import matplotlib.pyplot as plt

    traj = make_traj(layers=2, lengths=(256, 1024), scalings=("none", "log-n"))
    plot_model_longctx(traj, tmp_path / "f.png", band=bands(2))
    plot_model_longctx(traj, str(tmp_path / "f.svg"))
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "f.svg").read_text()[:2000]
    assert plt.get_fignums() == []


@dataclass
class FakeResult:
    """Stand-in for the per-layer long-context result (the report reads it duck-typed)."""

    model: str
    trajectory: pd.DataFrame
    band: dict
    layers: list[dict]
    recommendation: dict
    info: dict[str, Any] = field(default_factory=dict)


FIX = "sigprop fix 'my model' --scaling \"tau\" --param 0.8 > out.json"


def fake_result(layers=3, measured=("none",), holds=True, **overrides) -> FakeResult:
    rows = [dict(layer=i, sigma_s=1.2 + 0.1 * i, beta=0.5, rho=0.3, gamma_c=2.0,
                 theory_fit="gg25" if i else "n/a", spread_exponent=None if i == 1 else 0.7,
                 worst_gap=None if i == 2 else float("nan") if i == 1 else 0.012,
                 in_band=i != 1) for i in range(layers)]
    rec = dict(scaling="tau(0.8)", scaling_param=0.8, size=1.5, holds_measured=holds,
               fix_command=FIX, reason="keeps every layer <inside> its band")
    info = dict(lengths=[4096, 16384], train_len=4096, queries=64, seconds=12.345,
                notes=["the theory assumes <independent> keys"])
    res = FakeResult(model=EVIL, trajectory=make_traj(layers, (4096, 16384),
                                                      ("none", "tau(0.8)"), measured),
                     band=bands(layers), layers=rows, recommendation=rec, info=info)
    for k, v in overrides.items():
        setattr(res, k, v)
    return res


def test_report_escapes_and_holds_every_section(tmp_path):
    page = render_longctx_report(fake_result(), command="sigprop longctx <m>")
    assert "<script" not in page.lower()
    assert html.escape(EVIL, quote=True) in page
    assert f"<code>{html.escape(FIX, quote=True)}</code>" in page
    assert "<code>sigprop longctx &lt;m&gt;</code>" in page  # the command line
    assert "keeps every layer &lt;inside&gt; its band" in page
    assert "<li>the theory assumes &lt;independent&gt; keys</li>" in page
    assert "4096, 16384" in page and "12.3 s" in page
    assert page.count("<tr>") == 1 + 3  # header and one row per layer
    srcs = re.findall(r'src="([^"]*)"', page)
    assert len(srcs) == 1 and srcs[0].startswith("data:image/svg+xml;base64,")
    svg = base64.b64decode(srcs[0].split(",", 1)[1]).decode("utf-8")
    assert "<svg" in svg[:2000]
    assert "—" in page  # missing spread exponent and ipr gap
    assert not re.search(r"https?://(?!www\.w3\.org/)", page)  # no external assets
    write_longctx_report(tmp_path / "r.html", fake_result())
    assert (tmp_path / "r.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_report_without_measurements_or_a_verdict():
    res = fake_result(layers=2, measured=(), holds=None,
                      info={"lengths": [4096, 16384], "train_len": 4096, "queries": 64,
                            "seconds": None})
    page = render_longctx_report(res)
    assert "not checked against measurements" in page
    assert "no measured rows" in page
    assert page.count("<tr>") == 1 + 2
    assert "data:image/svg+xml;base64," in page
    assert "time —" in page
