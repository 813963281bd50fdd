"""The one shape of every reproduced figure or claim: :class:`Experiment`, :class:`Check` and the
registry entry :class:`Item` (docs/reproduce.md).

An item is a function ``fn(*, seed=0, device="cpu", **sizes) -> Experiment`` registered with
:func:`register` under ``"<paper>.<figure>"`` (e.g. ``"gg25.fig1f"``) together with the paper's
claim and the figure or equation it comes from (the paper's words and the template of the
item's set-up notes, data in ``<paper>/items.toml``), whether it trains, and its sizes: ``tiny``
(the default test suite: wiring and check logic, seconds), ``quick`` (the ``--quick`` gallery,
whole gallery <= 15 min on 2 cores), ``default`` (the function's own defaults, CPU scale) and
``full`` (the paper's sizes where a GPU makes them reachable). :func:`run` times the function,
fills in the name, the sizes and the notes (:func:`notes_of`), and :meth:`Experiment.save`
writes the figure (SVG + PNG), the data and the summary table (Parquet) and the checks (JSON).
Nothing here prints.

A :class:`Check` states one claim as pass/fail with its tolerance and the reason for it. Where
sigprop's measurement departs from what a paper states (a rate, a constant, a normalisation),
:meth:`Check.differs` compares the measurement with sigprop's corrected statement: inside that
band the verdict is ``"differs"`` (shown with the paper's value and the explanation), outside
it is ``"fail"`` — a departure is never a free pass.
"""

from __future__ import annotations

import functools
import json
import math
import re
import string
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..trajectory import parquet_safe

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PAPERS", "SIZES", "Check", "Experiment", "Item", "ITEMS", "register", "items",
           "select", "run", "frame", "slope", "mean_se", "one_thread", "paper_text",
           "text_table", "item_text", "notes_of", "NotesFormatter"]

#: The five seed papers, in the order the gallery shows them.
PAPERS = ("gg25", "clpr25", "noci22", "deshpande26", "mindthegap")
#: Sizes an item may define (``default`` is the function's own keyword defaults).
SIZES = ("tiny", "quick", "default", "full")
STATUSES = ("pass", "differs", "fail", "error")

#: The data columns every experiment table starts with (the Trajectory's core columns; the
#: coordinates of a figure — n, beta, step, run ... — follow as extra columns).
CORE = ["observable", "source", "value", "stderr"]


# --------------------------------------------------------------------------------------------
# checks


def _finite(x) -> float:
    x = float(x)
    return x if math.isfinite(x) else float("nan")


@dataclass(frozen=True)
class Check:
    """One claim of a paper as an explicit pass/fail.

    ``claim``: what the paper says, with its number ("gg25 Fig. 1(f): ..."); ``measured``: the
    number sigprop measured; ``expected``: the band or relation it is held to, in words;
    ``status``: ``"pass"``, ``"fail"`` or ``"differs"``; ``why``: why the tolerance is what it
    is (finite T, finite d, seeds); ``paper``: for ``"differs"``, what the paper states and why
    sigprop's statement departs from it.
    """

    claim: str
    measured: float
    expected: str
    status: str
    why: str = ""
    paper: str = ""

    def __post_init__(self):
        if self.status not in ("pass", "fail", "differs"):
            raise ValueError(f"status must be pass, fail or differs (got {self.status!r})")

    @property
    def passed(self) -> bool:
        """True unless the check failed (``"differs"`` held to sigprop's own band)."""
        return self.status != "fail"

    @classmethod
    def within(cls, claim: str, measured, lo: float = -math.inf, hi: float = math.inf, *,
               why: str, unit: str = "") -> Check:
        """Pass when ``lo <= measured <= hi`` (a NaN measurement fails)."""
        m = _finite(measured)
        ok = bool(lo <= m <= hi)
        return cls(claim, m, _band(lo, hi, unit), "pass" if ok else "fail", why)

    @classmethod
    def ratio(cls, claim: str, measured, target: float, factor: float, *, why: str) -> Check:
        """Pass when ``measured`` is within a factor ``factor`` of ``target`` (both > 0)."""
        m = _finite(measured)
        ok = bool(m > 0 and target > 0 and max(m / target, target / m) <= factor)
        return cls(claim, m, f"within x{factor:g} of {target:.4g}", "pass" if ok else "fail",
                   why)

    @classmethod
    def that(cls, claim: str, ok: bool, measured, expected: str, *, why: str) -> Check:
        """Pass when ``ok`` (an ordering, a sign, a phase boundary), ``measured`` the number
        it rests on."""
        return cls(claim, _finite(measured), expected, "pass" if bool(ok) else "fail", why)

    @classmethod
    def differs(cls, claim: str, measured, lo: float, hi: float, *, paper: str, why: str,
                unit: str = "") -> Check:
        """A claim sigprop's measurement departs from: ``"differs"`` when ``measured`` lies in
        sigprop's corrected band ``[lo, hi]``, ``"fail"`` otherwise; ``paper`` states the
        paper's value and the explanation."""
        m = _finite(measured)
        ok = bool(lo <= m <= hi)
        return cls(claim, m, _band(lo, hi, unit), "differs" if ok else "fail", why, paper)

    def to_json(self) -> dict:
        m = self.measured
        return {"claim": self.claim, "measured": None if math.isnan(m) else m,
                "expected": self.expected, "status": self.status, "why": self.why,
                "paper": self.paper}


def _band(lo: float, hi: float, unit: str = "") -> str:
    u = f" {unit}" if unit else ""
    if math.isinf(lo) and math.isinf(hi):
        return "finite"
    if math.isinf(lo):
        return f"<= {hi:.4g}{u}"
    if math.isinf(hi):
        return f">= {lo:.4g}{u}"
    return f"in [{lo:.4g}, {hi:.4g}]{u}"


# --------------------------------------------------------------------------------------------
# the result


@dataclass
class Experiment:
    """What every reproduced item returns.

    ``trajectory``: the figure's data as a tidy table in the Trajectory's shape (``observable,
    source, value, stderr`` plus the figure's coordinates as columns; ``source`` is
    ``theory``, ``measured`` or ``paper``); ``table``: a small summary table (one row per run,
    curve or fitted constant); ``checks``: the claims as :class:`Check` s; ``draw``: the item's
    plot function ``draw(data, ax=None) -> Figure``, drawing the paper's panel from ``data``
    (what the item measured); ``notes``: how the set-up was shrunk from the paper's (sizes,
    seeds, what the simulation does). :func:`run` fills ``name``, ``size``, ``params`` and
    ``seconds``, and ``notes`` where the item left them empty: from the item's template in its
    paper's ``items.toml`` (:func:`notes_of`). An item of the package leaves them to the
    template; one returning notes of its own (a stand-in, an item defined elsewhere) keeps them.

    The Figure is drawn only when asked for (:attr:`figure`, :meth:`plot`, :meth:`save`): an
    experiment holds numbers, not a canvas, so a run of many items keeps no figures alive and
    a caller can draw the panel into axes of its own. An item that has drawn its Figure
    already may pass it as ``draw``; it is then kept as :attr:`figure`.
    """

    trajectory: pd.DataFrame
    table: pd.DataFrame
    checks: list[Check]
    draw: Callable[..., Figure] | None = None
    data: Any = None
    notes: str = ""
    name: str = ""
    size: str = "default"
    params: dict = field(default_factory=dict)
    seconds: float = float("nan")
    error: str = ""
    _figure: Figure | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.draw is not None and not callable(self.draw):  # a Figure drawn already
            self._figure, self.draw = self.draw, None

    def plot(self, ax=None) -> Figure | None:
        """Draw the figure from :attr:`data`: on ``ax`` (the Axes the plot function lays out,
        one or a sequence) or, with ``ax=None``, on a new Figure; return the Figure (None for
        an experiment without a plot function)."""
        if self.draw is None:
            return self._figure if ax is None else None
        return self.draw(self.data) if ax is None else self.draw(self.data, ax=ax)

    @property
    def figure(self) -> Figure | None:
        """The paper's panel, drawn on first access and kept; set it to None to let the
        canvas go (the next access draws it again)."""
        if self._figure is None:
            self._figure = self.plot()
        return self._figure

    @figure.setter
    def figure(self, fig: Figure | None) -> None:
        self._figure = fig

    @property
    def status(self) -> str:
        """``"error"`` if it raised, ``"fail"`` if any check failed, ``"differs"`` if any
        departs from the paper (within sigprop's band), else ``"pass"``."""
        if self.error:
            return "error"
        if not self.checks:
            return "fail"
        s = {c.status for c in self.checks}
        return "fail" if "fail" in s else "differs" if "differs" in s else "pass"

    def summary(self) -> str:
        ok = sum(c.status != "fail" for c in self.checks)
        return f"{self.name}: {self.status} ({ok}/{len(self.checks)} checks, " \
               f"{self.seconds:.1f} s)"

    def to_json(self) -> dict:
        return {"name": self.name, "size": self.size, "status": self.status,
                "seconds": None if math.isnan(self.seconds) else round(self.seconds, 3),
                "params": _jsonable(self.params), "notes": self.notes, "error": self.error,
                "checks": [c.to_json() for c in self.checks]}

    def save(self, out: str | Path, dpi: int = 130) -> dict[str, Path]:
        """Write ``NAME.svg``, ``NAME.png`` (the figure), ``NAME.parquet`` (the data),
        ``NAME.table.parquet`` (the summary) and ``NAME.json`` (checks, sizes, timing) into
        ``out``; return the paths written."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths: dict[str, Path] = {}
        fig = self.figure
        if fig is not None:
            for ext in ("svg", "png"):
                p = out / f"{self.name}.{ext}"
                fig.savefig(p, dpi=dpi)
                paths[ext] = p
        for key, df in (("data", self.trajectory), ("table", self.table)):
            if df is not None:
                p = out / (f"{self.name}.parquet" if key == "data"
                           else f"{self.name}.table.parquet")
                parquet_safe(df).to_parquet(p, index=False)
                paths[key] = p
        p = out / f"{self.name}.json"
        p.write_text(json.dumps(self.to_json(), indent=1))
        paths["json"] = p
        return paths


def _jsonable(x):
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x if isinstance(x, int | float | str | bool | type(None)) else str(x)


def frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A figure's data as a tidy table: the core columns first (``stderr`` NaN when not
    given), then the coordinates in the order first seen."""
    df = pd.DataFrame.from_records(list(records))
    if df.empty:
        return pd.DataFrame(columns=CORE)
    if "stderr" not in df:
        df["stderr"] = np.nan
    missing = set(CORE) - set(df.columns)
    if missing:
        raise ValueError(f"experiment data needs the columns {CORE} (missing {sorted(missing)})")
    bad = set(df["source"]) - {"theory", "measured", "paper", "theory_asymptotic"}
    if bad:
        raise ValueError(f"source must be theory, measured or paper (got {sorted(bad)})")
    return df[CORE + [c for c in df.columns if c not in CORE]]


def mean_se(a, axis: int = -1):
    """Mean and standard error of the mean along ``axis`` (float64; NaN error for one draw)."""
    a = np.asarray(a, dtype=np.float64)
    k = a.shape[axis]
    mean = a.mean(axis=axis)
    se = a.std(axis=axis, ddof=1) / math.sqrt(k) if k > 1 else np.full(np.shape(mean), np.nan)
    return mean, se


def one_thread(fn: Callable) -> Callable:
    """Run ``fn`` with torch at one intra-op thread (restored after): next to NumPy's BLAS on
    the small shared CPU boxes torch's pool made the items' small batched matmuls several
    times slower (cf. :mod:`sigprop.measurement.threads`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ..measurement.threads import cpu_settings

        with cpu_settings(threads=1):
            return fn(*args, **kwargs)
    return wrapper


def slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (a power law's exponent)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


# --------------------------------------------------------------------------------------------
# registry


@dataclass(frozen=True)
class Item:
    """A registered figure or claim: ``name`` ``"<paper>.<figure>"``, ``paper``, ``ref`` (the
    paper's label: "Fig. 1(f)", "Eq. 47", "Prop. 3"), ``title`` (one line), ``claim`` (the
    paper's claim in our words, with its number), ``trains``, ``sizes`` (keyword overrides per
    size), ``runtime`` (expected seconds on 2 CPU cores per size), ``differs`` (where sigprop's
    measurement departs from the paper, stated in the gallery), ``notes`` (the template of the
    set-up notes :func:`run` fills in, ``""`` for none: :func:`notes_of`)."""

    name: str
    paper: str
    ref: str
    title: str
    claim: str
    fn: Callable[..., Experiment]
    trains: bool = False
    sizes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    runtime: Mapping[str, float] = field(default_factory=dict)
    differs: str = ""
    notes: str = ""

    def kwargs(self, size: str) -> dict:
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)} (got {size!r})")
        if size == "full" and "full" not in self.sizes:
            return {}
        return dict(self.sizes.get(size, {}))


ITEMS: dict[str, Item] = {}

#: The text of an item, read from ``<paper>/items.toml``: required, then optional (``notes`` is
#: the template of the set-up notes, :func:`notes_of`).
TEXT = ("ref", "title", "claim")
TEXT_OPTIONAL = ("differs", "notes")


@functools.cache
def paper_text(paper: str) -> dict[str, dict[str, str]]:
    """The text of every item of ``paper``, by item name: its ``items.toml`` read
    once (with :mod:`importlib.resources`, so from a wheel as from the source tree)."""
    try:
        toml = (resources.files(__package__) / paper / "items.toml").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"sigprop/reproduce/{paper}/items.toml is missing: it holds the "
                         f"paper's words of every {paper} item") from None
    return text_table(paper, toml)


def text_table(paper: str, toml: str) -> dict[str, dict[str, str]]:
    """``toml``, a paper's ``items.toml`` (one table per item, named by what follows
    ``"<paper>."``), by item name, ``differs`` and ``notes`` ``""`` where absent. A table
    without ``ref``, ``title`` or ``claim``, with a key other than those, ``differs`` and
    ``notes``, or with a value that is not a string is a ``ValueError``."""
    where = f"sigprop/reproduce/{paper}/items.toml"
    out = {}
    for fig, entry in tomllib.loads(toml).items():
        keys = set(entry) if isinstance(entry, dict) else set()
        missing, extra = set(TEXT) - keys, keys - set(TEXT) - set(TEXT_OPTIONAL)
        if missing or extra or not all(isinstance(v, str) for v in entry.values()):
            raise ValueError(f"{where} [{fig}]: needs {', '.join(TEXT)} and may have "
                             f"{', '.join(TEXT_OPTIONAL)}, all strings (missing "
                             f"{sorted(missing)}, unknown {sorted(extra)})")
        out[f"{paper}.{fig}"] = {**dict.fromkeys(TEXT_OPTIONAL, ""), **entry}
    return out


def item_text(name: str, **given: str | None) -> dict[str, str]:
    """The ``ref``, ``title``, ``claim``, ``differs`` and ``notes`` of the item ``name`` from
    its paper's ``items.toml``. Text ``given`` as keywords must agree with the entry (the file
    is its one home); it stands in for an entry only where the file has none (stand-in
    items)."""
    paper = name.split(".", 1)[0]
    given = {k: v for k, v in given.items() if v is not None}
    entry = paper_text(paper).get(name)
    where = f"sigprop/reproduce/{paper}/items.toml"
    if entry is None:
        missing = set(TEXT) - set(given)
        if missing:
            raise ValueError(f"item {name!r} has no table [{name.split('.', 1)[1]}] in {where} "
                             f"(its {', '.join(TEXT)} and, if it departs from the paper, "
                             "differs)")
        return {**dict.fromkeys(TEXT_OPTIONAL, ""), **given}
    for k, v in given.items():
        if entry[k] != v:
            raise ValueError(f"item {name!r}: the {k} given to register differs from {where}, "
                             "its one home; drop the keyword")
    return entry


def register(name: str, *, trains: bool = False, tiny: Mapping | None = None,
             quick: Mapping | None = None, full: Mapping | None = None,
             runtime: Mapping[str, float] | None = None, ref: str | None = None,
             title: str | None = None, claim: str | None = None,
             differs: str | None = None) -> Callable:
    """Decorator registering ``fn(*, seed=0, device="cpu", **sizes) -> Experiment`` as the item
    ``name`` (``"<paper>.<figure>"``, paper one of :data:`PAPERS`). The code says what code
    must (sizes, runtime, whether it trains); the paper's words (``ref``, ``title``,
    ``claim``, ``differs``) and the template of the set-up notes (``notes``) are data, read by
    :func:`item_text` from the paper's ``items.toml`` (words given here must agree with it)."""
    paper = name.split(".", 1)[0]
    if paper not in PAPERS or "." not in name:
        raise ValueError(f"item name must be '<paper>.<figure>' with paper in {PAPERS} "
                         f"(got {name!r})")
    text = item_text(name, ref=ref, title=title, claim=claim, differs=differs)

    def deco(fn: Callable) -> Callable:
        if name in ITEMS and ITEMS[name].fn is not fn:
            raise ValueError(f"item {name!r} is registered twice")
        sizes = {k: dict(v) for k, v in (("tiny", tiny), ("quick", quick), ("full", full))
                 if v is not None}
        ITEMS[name] = Item(name, paper, text["ref"], text["title"], text["claim"], fn, trains,
                           sizes, dict(runtime or {}), text["differs"], text["notes"])
        return fn
    return deco


#: The packages holding registered items, one per paper (imported by :func:`items`).
MODULES = ("gg25", "noci22", "clpr25", "deshpande26", "mindthegap")


def items() -> dict[str, Item]:
    """Every registered item, importing the paper packages on first use."""
    import importlib

    for mod in MODULES:
        importlib.import_module(f"sigprop.reproduce.{mod}")
    order = {p: i for i, p in enumerate(PAPERS)}
    return dict(sorted(ITEMS.items(), key=lambda kv: (order[kv[1].paper], kv[0])))


def select(names: Sequence[str] = (), papers: Sequence[str] = (),
           everything: bool = False) -> list[Item]:
    """Items by name (exact, or a prefix ending in ``.``/``*``), by paper, or all; one-line
    ``ValueError`` naming the known ones otherwise."""
    reg = items()
    if everything:
        return list(reg.values())
    out: list[Item] = []
    for p in papers:
        if p not in PAPERS:
            raise ValueError(f"paper must be one of {', '.join(PAPERS)} (got {p!r})")
        out += [it for it in reg.values() if it.paper == p]
    for n in names:
        if n in reg:
            out.append(reg[n])
            continue
        pre = n.rstrip("*")
        hits = [it for k, it in reg.items() if pre and k.startswith(pre) and n.endswith(("*", "."))]
        if not hits:
            raise ValueError(f"unknown item {n!r}; see `sigprop reproduce --list` "
                             f"({len(reg)} items: {', '.join(list(reg)[:6])}, ...)")
        out += hits
    seen: dict[str, Item] = {}
    for it in out:
        seen.setdefault(it.name, it)
    return list(seen.values())


def _defaults(fn: Callable) -> dict:
    """The size keywords' own defaults (what an item ran with when a size leaves them)."""
    import inspect

    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty and k not in ("seed", "device")}


def run(item: Item | str, size: str = "default", *, seed: int = 0, device: str = "cpu",
        catch: bool = False, **overrides) -> Experiment:
    """Run one item at ``size`` (keyword ``overrides`` on top), timed, and fill in its notes
    from its template when it returned none (:func:`notes_of`). ``catch=True`` turns an
    exception, of the item or of its template, into an ``"error"`` Experiment carrying its
    one-line message (the gallery goes on with the next item)."""
    it = items()[item] if isinstance(item, str) else item
    kw = {**it.kwargs(size), **overrides}
    t0 = time.perf_counter()
    try:
        exp = it.fn(seed=seed, device=device, **kw)
    except Exception as err:  # noqa: BLE001 - reported per item in the gallery
        if not catch:
            raise
        exp = Experiment(frame([]), pd.DataFrame(), [],
                         error=f"{type(err).__name__}: {err}".splitlines()[0])
    if not isinstance(exp, Experiment):
        raise TypeError(f"item {it.name} returned {type(exp).__name__}, not Experiment")
    exp.name, exp.size = it.name, size
    exp.params = {"seed": seed, "device": device, **_defaults(it.fn), **kw}
    exp.seconds = time.perf_counter() - t0
    if it.notes and not exp.notes and not exp.error:
        try:
            exp.notes = notes_of(it, exp)
        except ValueError as err:
            if not catch:
                raise
            exp.error = str(err)
    return exp


class NotesFormatter(string.Formatter):
    """:meth:`str.format` for the notes templates, with two additions. A negative index counts
    from the end: ``{Ts[-1]}`` is the last of ``Ts`` (``str.format`` would look up the key
    ``"-1"``). A format spec on a list, tuple or array formats each element and joins them
    with ", ": ``{lrs:g}`` is ``0.01, 0.03`` (``format`` refuses a spec on a list). The rest
    (attributes, ``{{``, conversions, specs) is ``str.format``'s."""

    def get_field(self, field_name: str, args, kwargs):
        m = re.fullmatch(r"([^.\[]+)((?:\.\w+|\[[^\]]+\])*)", field_name)
        if m is None:
            return super().get_field(field_name, args, kwargs)
        obj = self.get_value(m[1], args, kwargs)
        for attr, index in re.findall(r"\.(\w+)|\[([^\]]+)\]", m[2]):
            obj = getattr(obj, attr) if attr else \
                obj[int(index) if re.fullmatch(r"-?\d+", index) else index]
        return obj, m[1]

    def format_field(self, value, format_spec: str):
        if format_spec and isinstance(value, list | tuple | np.ndarray):
            return ", ".join(format(v, format_spec) for v in value)
        return super().format_field(value, format_spec)


def _same(a, b) -> bool:
    """Whether two values agree, sequences and arrays element by element (a parameter given
    as a tuple and kept by the item as a list or an array is the same value)."""
    try:
        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    except (TypeError, ValueError):
        return False


def notes_of(item: Item, exp: Experiment) -> str:
    """``item.notes``, the template of an item's set-up notes in its paper's ``items.toml``,
    formatted (:class:`NotesFormatter`) with what the item ran with: ``exp.params`` (seed,
    device and every size keyword, defaults included) and, when ``exp.data`` is a dict, its
    keys (values the item computed: a derived constant, the checked form of a parameter). A
    key in both must hold the same value (it is then taken from ``data``, in the type the item
    computed with); two different values, or a field that names neither, is a ``ValueError``
    naming the item and the key, never a partial note."""
    where = f"[{item.name.split('.', 1)[1]}] in sigprop/reproduce/{item.paper}/items.toml"
    values = dict(exp.params)
    if isinstance(exp.data, Mapping):
        for k, v in exp.data.items():
            if k in values and not _same(values[k], v):
                raise ValueError(f"item {item.name}: {k!r} is a parameter ({values[k]!r}) and "
                                 f"a data key ({type(v).__name__}) with another value; the "
                                 f"notes of {where} cannot tell which (rename the data key)")
            values[k] = v
    try:
        return NotesFormatter().vformat(item.notes, (), values)
    except KeyError as err:
        raise ValueError(f"item {item.name}: the notes of {where} name {err.args[0]!r}, "
                         "neither a parameter of the item nor a key of its data") from None
    except (AttributeError, IndexError, TypeError, ValueError) as err:
        raise ValueError(f"item {item.name}: the notes of {where} do not format with its "
                         f"parameters and data ({type(err).__name__}: {err})") from None
