"""Records, not long tuples, cross module boundaries (issue 35 item 3).

A tuple of four or more values is read by position: a caller in another module that unpacks
``a, b, c, d = f()`` breaks silently when ``f`` gains, loses or reorders a value. Such results
are keyword-only frozen dataclasses (or a NamedTuple where tuple unpacking is public API)
instead. The scan reads the source with an AST walk and fails on

* a public function or method (no part of its qualified name starts with ``_``, not nested in
  another function) that returns a tuple literal of four or more elements, or whose return
  annotation holds ``tuple[...]`` with four or more items;
* an assignment that unpacks four or more names from a call to a function imported from
  another module of the package (``from .x import f`` then ``f()``, ``x.f()`` with ``x``
  an imported module of the package, or ``C.f()`` with ``C`` a class imported from one).

Known offenders sit in :data:`ALLOWED` with why; an entry that no longer offends fails the
test until it is removed, so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sigprop"
MIN_ITEMS = 4

#: offenders, ``path::qualname`` (a return) or ``path::qualname <- callee`` (an unpacking
#: of ``callee``'s result), each with why it is still a tuple
ALLOWED: dict[str, str] = {
    "theory/attention.py::finite_stats": "(y2, yx, entropy, wmax) of rows of n keys, the "
                                         "four row statistics that attention_stats' causal "
                                         "accumulation and longctx_model.theory both loop "
                                         "over in this order (a loop over one record's "
                                         "fields would be the same loop)",
}


def _module_parts(p: Path) -> list[str]:
    parts = list(p.relative_to(SRC).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_package_module(node: ast.ImportFrom) -> bool:
    return bool(node.level) or (node.module or "").split(".")[0] == "sigprop"


def _imported(tree: ast.Module, module: list[str], is_pkg: bool) -> tuple[set[str], set[str]]:
    """Names bound by imports from the package in the module ``module`` (dotted parts):
    ``(functions or classes, modules)``. ``from x import y`` binds a module when ``x.y`` is
    a module of the package, else a function or class defined in ``x``."""
    base = ["sigprop", *module] if is_pkg else ["sigprop", *module[:-1]]
    funcs, mods = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.asname or a.name for a in node.names if a.name.startswith("sigprop")}
        elif isinstance(node, ast.ImportFrom) and _is_package_module(node):
            src = (".".join(base[: len(base) - node.level + 1]
                            + ([node.module] if node.module else []))
                   if node.level else node.module)
            for a in node.names:
                (mods if f"{src}.{a.name}" in _MODULES else funcs).add(a.asname or a.name)
    return funcs, mods


_MODULES = {".".join(["sigprop", *_module_parts(p)]) for p in SRC.rglob("*.py")}


def _tuple_items(annotation: ast.expr | None) -> int:
    """The most items of a ``tuple[...]`` anywhere in a return annotation (0 if none);
    ``tuple[x, ...]`` counts as 0 (any length, one type)."""
    if annotation is None:
        return 0
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    most = 0
    for node in ast.walk(annotation):
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple)
                and _name(node.value) in {"tuple", "Tuple", "typing.Tuple"}
                and not any(isinstance(e, ast.Constant) and e.value is Ellipsis
                            for e in node.slice.elts)):
            most = max(most, len(node.slice.elts))
    return most


def _name(node: ast.expr) -> str:
    """The dotted name of a ``Name`` or ``Attribute`` chain, '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _own_nodes(func: ast.AST):
    """The nodes of a function's body, not descending into nested functions, lambdas or
    classes (their returns are their own)."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                          | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _long_returns(tree: ast.Module, rel: str) -> set[str]:
    out = set()

    def visit(node, prefix: str, public: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", public and not child.name.startswith("_"))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if not public or child.name.startswith("_"):
                    continue
                long_literal = any(isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
                                   and len(n.value.elts) >= MIN_ITEMS
                                   for n in _own_nodes(child))
                if long_literal or _tuple_items(child.returns) >= MIN_ITEMS:
                    out.add(f"{rel}::{prefix}{child.name}")

    visit(tree, "", True)
    return out


def _long_unpacks(tree: ast.Module, rel: str, module: list[str] | None = None,
                  is_pkg: bool = False) -> set[str]:
    funcs, mods = _imported(tree, module or [Path(rel).stem], is_pkg)
    out = set()

    def check(body_owner, qualname: str):
        for node in _own_nodes(body_owner):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            callee = _name(node.value.func)
            head = callee.split(".")[0]
            foreign = head in funcs or ("." in callee and head in mods)
            if foreign and any(isinstance(t, ast.Tuple | ast.List) and len(t.elts) >= MIN_ITEMS
                               for t in node.targets):
                out.add(f"{rel}::{qualname} <- {callee}")

    def visit(node, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    check(child, name)
                visit(child, name + ".")

    check(tree, "<module>")
    visit(tree, "")
    return out


def _offenders() -> set[str]:
    out = set()
    for p in sorted(SRC.rglob("*.py")):
        tree = ast.parse(p.read_text(), str(p))
        rel = p.relative_to(SRC).as_posix()
        out |= _long_returns(tree, rel) | _long_unpacks(tree, rel, _module_parts(p),
                                                        p.name == "__init__.py")
    return out


def test_no_long_tuple_crosses_a_module():
    found = _offenders()
    new = sorted(found - set(ALLOWED))
    assert not new, ("a tuple of 4+ values crosses a module boundary; return a keyword-only "
                     "frozen dataclass instead:\n" + "\n".join(new))
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"allowed but no longer a long tuple (remove from ALLOWED): {stale}"


def test_allow_list_says_why():
    for key, why in ALLOWED.items():
        assert isinstance(why, str) and len(why) > 10, key


def test_the_scan_finds_each_kind():
    """The scan itself: a literal, an annotation and a foreign unpacking are found; a short
    tuple, a private function, a nested helper and a local unpacking are not."""
    src = (
        "from .other import far\n"
        "from . import mod\n"
        "def lit(): return 1, 2, 3, 4\n"
        "def ann() -> tuple[int, int, int, int] | None: ...\n"
        "def short(): return 1, 2, 3\n"
        "def var() -> tuple[int, ...]: ...\n"
        "def _private(): return 1, 2, 3, 4\n"
        "def outer():\n"
        "    def inner(): return 1, 2, 3, 4\n"
        "    a, b, c, d = far()\n"
        "    e, f, g, h = mod.near()\n"
        "    i, j, k, m = lit()\n"
        "    return inner\n"
        "class C:\n"
        "    def meth(self) -> 'tuple[int, int, int, int]': ...\n"
    )
    tree = ast.parse(src)
    assert _long_returns(tree, "m.py") == {"m.py::lit", "m.py::ann", "m.py::C.meth"}
    assert _long_unpacks(tree, "m.py") == {"m.py::outer <- far", "m.py::outer <- mod.near"}
