"""The paper's words as data: every item's ref, title, claim and differs in its paper's
``reproduce/<paper>/items.toml``, read by ``register`` (sigprop.reproduce.core)."""

import pytest

from sigprop.reproduce import core


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
    assert ok == {"gg25.x": {"ref": "Fig. 1", "title": "t", "claim": "c", "differs": ""}}
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
