"""The items' text as data: every item's ref, title, claim, differs and the template of its
set-up notes in its paper's ``reproduce/<paper>/items.toml``, read by ``register`` and filled in
by ``run`` (sigprop.reproduce.core)."""

import pandas as pd
import pytest

from sigprop.reproduce import core
from sigprop.reproduce.core import Check, Experiment, Item, frame


def test_every_toml_entry_is_a_registered_item_and_back():
    reg = core.items()
    text = {n: e for p in core.PAPERS for n, e in core.paper_text(p).items()}
    assert sorted(text) == sorted(reg)
    for name, it in reg.items():
        e = text[name]
        assert (it.ref, it.title, it.claim, it.differs) == (e["ref"], e["title"], e["claim"],
                                                            e["differs"])
        assert it.ref and it.title and it.claim, name


def test_tables_are_named_without_the_paper_and_read_once():
    assert core.paper_text("gg25")["gg25.fig1f"]["ref"] == "Fig. 1(f)"
    assert core.paper_text("gg25") is core.paper_text("gg25")   # cached per paper


def test_a_table_needs_its_keys_and_no_others():
    ok = core.text_table("gg25", '[x]\nref = "Fig. 1"\ntitle = "t"\nclaim = "c"\n')
    assert ok == {"gg25.x": {"ref": "Fig. 1", "title": "t", "claim": "c", "differs": "",
                             "notes": ""}}
    with pytest.raises(ValueError, match=r"gg25/items.toml \[x\].*missing \['claim'\]"):
        core.text_table("gg25", '[x]\nref = "Fig. 1"\ntitle = "t"\n')
    with pytest.raises(ValueError, match=r"unknown \['claims'\]"):
        core.text_table("gg25", '[x]\nref = "r"\ntitle = "t"\nclaim = "c"\nclaims = "c"\n')
    with pytest.raises(ValueError, match="all strings"):
        core.text_table("gg25", '[x]\nref = "r"\ntitle = "t"\nclaim = 3\n')


def test_register_reads_the_text_and_refuses_what_it_lacks():
    e = core.item_text("gg25.fig1f")
    assert e == core.paper_text("gg25")["gg25.fig1f"]
    assert core.item_text("gg25.fig1f", ref=e["ref"], claim=None) == e   # agreeing keywords
    with pytest.raises(ValueError, match="the claim given to register differs"):
        core.item_text("gg25.fig1f", claim="something else")
    with pytest.raises(ValueError, match=r"no table \[nope\] in sigprop/reproduce/gg25"):
        core.register("gg25.nope")
    # a stand-in item with no table names its text itself
    assert core.item_text("gg25.nope", ref="r", title="t", claim="c")["differs"] == ""


# --------------------------------------------------------------------------------------------
# the set-up notes: a template in items.toml, filled in by run


def test_every_item_of_the_package_has_a_notes_template():
    reg = core.items()
    for p in core.PAPERS:
        for name, e in core.paper_text(p).items():
            assert e["notes"].strip(), f"{name} has no notes in {p}/items.toml"
            assert reg[name].notes == e["notes"], name
    assert core.paper_text("gg25")["gg25.eqB18"]["notes"].startswith(
        "i.i.d. Gaussian REM rows (rho = 0), {rows} rows per (x, T); ")


def _stand_in(notes=""):
    """A stand-in item function returning ``data`` and ``notes`` of its own."""
    def fn(*, seed=0, device="cpu", Ts=(64, 128, 256), lrs=(0.01, 0.03), data=None):
        return Experiment(frame([dict(observable="y", source="measured", value=1.0)]),
                          pd.DataFrame(), [Check.within("c", 1.0, 0, 2, why="w")],
                          data=data, notes=notes)
    return fn


def _item(template, fn):
    return Item("gg25.stand_in", "gg25", "Fig. 0", "t", "c", fn, notes=template)


def test_run_fills_the_notes_from_parameters_and_data():
    it = _item("seed {seed} on {device}: T = {Ts[0]}-{Ts[-1]} (all {Ts}), lr {lrs:g}, "
               "gamma_c = {gc:.2f}, {{braces}}", _stand_in())
    exp = core.run(it, "default", seed=3, data={"gc": 1.23456})
    assert exp.notes == ("seed 3 on cpu: T = 64-256 (all (64, 128, 256)), lr 0.01, 0.03, "
                         "gamma_c = 1.23, {braces}")
    # a size keyword is formatted as the item was called with it
    assert core.run(it, "default", Ts=(8, 16), data={"gc": 2.0}).notes.startswith(
        "seed 0 on cpu: T = 8-16 (all (8, 16)), ")


def test_a_data_key_agreeing_with_a_parameter_is_taken_from_data():
    it = _item("T = {Ts}", _stand_in())
    assert core.run(it, data={"Ts": [64, 128, 256]}).notes == "T = [64, 128, 256]"
    with pytest.raises(ValueError, match=r"gg25.stand_in: 'Ts' is a parameter \(\(64, 128, "
                                         r"256\)\) and a data key \(list\) with another value"):
        core.run(it, data={"Ts": [64, 128]})


def test_a_template_naming_a_missing_key_raises_naming_item_and_key():
    it = _item("T = {Ts[-1]}, {rows} rows", _stand_in())
    with pytest.raises(ValueError, match=r"^item gg25.stand_in: the notes of \[stand_in\] in "
                                         r"sigprop/reproduce/gg25/items.toml name 'rows', "
                                         "neither a parameter"):
        core.run(it)
    with pytest.raises(ValueError, match=r"gg25.stand_in: .* do not format .*IndexError"):
        core.run(_item("{Ts[5]}", _stand_in()))
    # in the gallery (catch=True) the item is an error carrying that message, with no notes
    exp = core.run(it, catch=True)
    assert exp.status == "error" and "name 'rows'" in exp.error and exp.notes == ""


def test_an_item_returning_notes_keeps_them():
    it = _item("T = {Ts[-1]}, {rows} rows", _stand_in(notes="my own set-up"))
    assert core.run(it).notes == "my own set-up"      # the template, which cannot format, unused
    assert core.run(_item("", _stand_in())).notes == ""   # neither: none


def test_the_notes_formatter_adds_negative_indices_and_list_specs_only():
    f = core.NotesFormatter()
    assert f.format("{a[-2]} {a[0]} {d[k]} {a:d} {a} {x:.1%} {x!r}", a=[4, 5, 6], d={"k": "v"},
                    x=0.25) == "5 4 v 4, 5, 6 [4, 5, 6] 25.0% 0.25"
    with pytest.raises(KeyError):
        f.format("{missing}", a=1)
