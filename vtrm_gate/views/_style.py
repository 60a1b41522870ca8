"""One visual language for every figure (deck, notebooks, live view): palette, fonts, size,
and `figure_problems`, the checks every figure passes (1280×720, a title, labelled axes,
colours from this module, no overlapping text).

Colours are the Okabe–Ito set (distinguishable under the common colour-vision deficiencies)
plus Paul Tol's "muted" set for the per-type colours. Each has one meaning across the deck:
v3 is always blue, the old gate always grey, bounds and thresholds always black. Figures are
opaque white with dark text, so they stay legible on JupyterLab's dark theme.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from matplotlib import font_manager, rc_context
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.rcsetup import cycler

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

F = TypeVar("F", bound=Callable[..., Any])

SLIDE = (12.8, 7.2)
"""Every figure's size in inches: 1280×720 px at `SLIDE_DPI`."""
SLIDE_DPI = 100
DISPLAY_DPI = SLIDE_DPI
"""A notebook shows the same pixels the deck saves."""

V3 = "#0072B2"        # the continuous gate, the prefix replay, "true" accuracy
OLD = "#8C8C8C"       # the old serial / block gate, "measured" accuracy
BOUND = "#000000"     # bounds and thresholds: Ville's bound, the lower bound, e_confirm
BAD = "#D55E00"       # what must not happen: arrival order, waste, rollbacks, REJECT
FREE = "#56B4E9"      # served from a cache, at no cost
SAVED = "#DDDDDD"     # work never started
TEXT = "#222222"
MUTED = "#555555"     # captions, secondary labels
GRID = "#B0B0B0"

EXIT_COLOURS: dict[str, str] = {"ACCEPT": "#009E73", "PROVISIONAL": "#E69F00",
                                "INERTIA": "#BBBBBB", "FUTILE": "#882255", "REJECT": BAD}
"""One colour per exit (SPEC names), the same in the explorer, the deck and the live view."""

TYPE_COLOURS: tuple[str, ...] = ("#332288", "#117733", "#CC6677", "#009988", "#882255",
                                 "#997700", "#AA4499", "#0072B2", "#D55E00", "#555555",
                                 "#EE3377", "#666633")
"""Per-type colours (Tol muted and bright, Okabe–Ito), each at least 3:1 against white (the
type names are written in them); past 12 types the line style changes."""

SERIES: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                           "#000000")
"""Ordered colours for a few series with no fixed meaning (e.g. one line per discordance)."""

PALETTE: frozenset[str] = frozenset(
    {V3, OLD, BOUND, BAD, FREE, SAVED, TEXT, MUTED, GRID, "#FFFFFF", *EXIT_COLOURS.values(),
     *TYPE_COLOURS, *SERIES})
"""Every colour a figure may use (a test checks each artist against it)."""

FONT_PT = {"base": 13.0, "title": 14.0, "label": 13.0, "tick": 12.0, "legend": 12.0,
           "small": 11.0, "suptitle": 15.0}
MIN_FONT_PT = 10.0
"""No text smaller than this (14 px at `SLIDE_DPI`)."""

RC: dict[RcKeyType, Any] = {
    "font.size": FONT_PT["base"], "axes.titlesize": FONT_PT["title"],
    "axes.labelsize": FONT_PT["label"], "legend.fontsize": FONT_PT["legend"],
    "legend.title_fontsize": FONT_PT["legend"], "xtick.labelsize": FONT_PT["tick"],
    "ytick.labelsize": FONT_PT["tick"], "figure.titlesize": FONT_PT["suptitle"],
    "figure.labelsize": FONT_PT["small"], "figure.facecolor": "#FFFFFF",
    "axes.facecolor": "#FFFFFF", "savefig.facecolor": "#FFFFFF", "savefig.transparent": False,
    "text.color": TEXT, "axes.labelcolor": TEXT, "axes.edgecolor": TEXT,
    "xtick.color": TEXT, "ytick.color": TEXT, "grid.color": GRID, "grid.alpha": 0.5,
    "axes.prop_cycle": cycler(color=list(SERIES)),
    "legend.frameon": False, "axes.titlelocation": "left", "figure.dpi": SLIDE_DPI,
}


CJK_FONTS: tuple[str, ...] = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK TC", "Noto Sans CJK KR",
    "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN", "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei", "Microsoft YaHei", "PingFang SC", "Hiragino Sans GB", "SimHei",
    "Arial Unicode MS")
"""Fonts that draw Chinese, Japanese and Korean type names, in the order tried after the
deck's sans-serif (DejaVu Sans, which has none): the common ones on Linux, macOS and
Windows."""


def font_families() -> list[str]:
    """The deck's sans-serif, then each installed `CJK_FONTS` font as a per-glyph fallback
    (matplotlib draws a glyph from the first family that has it). Only installed ones: a
    missing family is a logged warning at every draw."""
    installed = {f.name for f in font_manager.fontManager.ttflist}
    return ["sans-serif", *(f for f in CJK_FONTS if f in installed)]


def styled(fn: F) -> F:
    """Build the figure under the deck's fonts and colours (fonts are fixed when text is
    created, so the whole builder runs inside the style)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        with rc_context({**RC, "font.family": font_families()}):
            return fn(*args, **kw)
    return wrapper  # type: ignore[return-value]  # fn's signature (functools.wraps)


def literal(text: str) -> str:
    """``text`` as matplotlib must draw a name it did not write (a type's): each ``$``
    escaped, so "Price $5 or $10" is not read as mathtext (and "Cost $\\alpha^$" cannot
    fail the draw). The deck's own labels keep mathtext (the log axes' ticks use it)."""
    return text.replace("$", r"\$")


def type_colour(i: int) -> str:
    """The colour of the ``i``-th type (sorted by name); it repeats every 12 types."""
    return TYPE_COLOURS[i % len(TYPE_COLOURS)]


def type_style(i: int) -> str:
    """The line style of the ``i``-th type: solid for the first 12, then dashed, dotted."""
    return ("-", "--", ":")[i // len(TYPE_COLOURS) % 3]


def ink_on(colour: str) -> str:
    """White or dark text, whichever reads better on ``colour`` (relative luminance)."""
    r, g, b, _ = to_rgba(colour)
    lum = 0.2126 * r ** 2.2 + 0.7152 * g ** 2.2 + 0.0722 * b ** 2.2
    return TEXT if lum > 0.3 else "#FFFFFF"


# ---- the checks every figure passes ----------------------------------------------------


def _canonical(colour: Any) -> tuple[float, float, float] | None:
    """RGB of a colour, or None when fully transparent (not drawn)."""
    r, g, b, a = to_rgba(colour)
    return None if a == 0 else (round(r, 3), round(g, 3), round(b, 3))


_ALLOWED = {_canonical(c) for c in PALETTE}


def _visible(artist: Any) -> Iterator[Any]:
    """``artist`` and its descendants, skipping invisible subtrees (hidden panels)."""
    if not artist.get_visible():
        return
    yield artist
    for child in artist.get_children():
        yield from _visible(child)


def _artist_colours(fig: Figure) -> Iterator[tuple[str, Any]]:
    """(what, colour) of every visible line, patch, collection and text of ``fig``."""
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.text import Text

    for a in _visible(fig):
        name = f"{type(a).__name__} {a.get_gid() or a.get_label() or ''}".strip()
        if isinstance(a, Line2D):
            if a.get_linestyle() not in ("None", "") and len(a.get_xdata()):  # type: ignore[arg-type]  # stubs: ArrayLike; it is an array
                yield name, a.get_color()
            if a.get_marker() not in ("None", "", None, " "):
                yield name, a.get_markerfacecolor()
                yield name, a.get_markeredgecolor()
        elif isinstance(a, Patch) and a is not fig.patch:
            yield name, a.get_facecolor()
            if a.get_linewidth():
                yield name, a.get_edgecolor()
        elif isinstance(a, Collection):
            yield from ((name, c) for c in a.get_facecolor())
            if len(a.get_linewidths()) and max(a.get_linewidths()) > 0:  # type: ignore[attr-defined]  # an alias matplotlib adds at import
                yield from ((name, c) for c in a.get_edgecolor())
        elif isinstance(a, Text) and a.get_text().strip():
            yield f"text {a.get_text()[:30]!r}", a.get_color()


def _texts(fig: Figure) -> list[Any]:
    """Every text that is drawn: tick labels of the ticks in view only."""
    from matplotlib.axis import Axis, Tick
    from matplotlib.text import Text

    out: list[Any] = []

    def walk(artist: Any) -> None:
        if not artist.get_visible() or isinstance(artist, Tick):
            return
        if isinstance(artist, Axis):
            for tick in artist._update_ticks():  # type: ignore[attr-defined]  # private: the ticks actually drawn
                out.extend(t for t in (tick.label1, tick.label2)
                           if t.get_visible() and t.get_text().strip())
        elif isinstance(artist, Text) and artist.get_text().strip():
            out.append(artist)
        for child in artist.get_children():
            walk(child)

    walk(fig)
    return out


def _box(t: Any, renderer: Any) -> Any:
    """The box of a text's glyphs (an annotation's without its arrow)."""
    from matplotlib.text import Text

    return Text.get_window_extent(t, renderer)


def _overlaps(fig: Figure, renderer: Any) -> list[str]:
    """Pairs of visible texts whose boxes overlap by more than 2 px either way."""
    boxes = [(t, _box(t, renderer)) for t in _texts(fig)]
    out = []
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1:]:
            dx = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            dy = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if dx > 2 and dy > 2:
                out.append(f"text {a.get_text()[:40]!r} overlaps {b.get_text()[:40]!r}")
    return out


def _outside(fig: Figure, renderer: Any) -> list[str]:
    w, h = fig.bbox.width, fig.bbox.height
    out = []
    for t in _texts(fig):
        b = _box(t, renderer)
        if b.x0 < -2 or b.y0 < -2 or b.x1 > w + 2 or b.y1 > h + 2:
            out.append(f"text {t.get_text()[:40]!r} runs off the figure")
    return out


def _titles(fig: Figure) -> list[str]:
    sup = fig.get_suptitle()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    titled = sup.strip() or any(ax.get_title(loc=w).strip() for ax in axes
                                for w in ("left", "center"))
    return [] if titled else ["no title (suptitle or axes title)"]


def _labels(fig: Figure) -> list[str]:
    """Every visible data axes has an x and a y label, its own or the figure's."""
    sup = fig._supxlabel  # type: ignore[attr-defined]  # a caption (gid "caption") is not an axis label
    sx = sup.get_text() if sup is not None and sup.get_gid() != "caption" else ""
    sy = fig.get_supylabel()
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        shared_x = [a for a in ax.get_shared_x_axes().get_siblings(ax) if a.get_visible()]
        shared_y = [a for a in ax.get_shared_y_axes().get_siblings(ax) if a.get_visible()]
        has_x = any(a.get_xlabel().strip() for a in shared_x) or sx.strip()
        has_y = any(a.get_ylabel().strip() for a in shared_y) or sy.strip()
        name = ax.get_title(loc="left") or ax.get_title() or "an axes"
        if not has_x:
            out.append(f"{name[:30]!r}: no x-axis label")
        if not has_y:
            out.append(f"{name[:30]!r}: no y-axis label")
    return out


def figure_problems(fig: Figure, *, size: tuple[int, int] = (1280, 720)) -> list[str]:
    """What keeps ``fig`` out of the deck: its size at `SLIDE_DPI`, a missing title or axis
    label, a colour outside `PALETTE`, text below `MIN_FONT_PT`, text that overlaps other
    text or runs off the figure. Empty when the figure is fine."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out = []
    px = tuple(round(v * SLIDE_DPI) for v in fig.get_size_inches())
    if px != size:
        out.append(f"size {px[0]}x{px[1]} px at {SLIDE_DPI} dpi, expected {size[0]}x{size[1]}")
    fig.set_dpi(SLIDE_DPI)
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    out += _titles(fig) + _labels(fig)
    bad = sorted({f"{what}: colour {c}" for what, c in _artist_colours(fig)
                  if _canonical(c) not in _ALLOWED and _canonical(c) is not None})
    out += bad
    out += [f"text {t.get_text()[:40]!r} is {t.get_fontsize():.1f} pt < {MIN_FONT_PT:g}"
            for t in _texts(fig) if t.get_fontsize() < MIN_FONT_PT - 0.01]
    out += _overlaps(fig, renderer) + _outside(fig, renderer)
    return out


def jupyter_frontend() -> bool:
    """Whether this runs in a Jupyter kernel, whose front end draws displays and widgets (a
    subclass too: Colab's, VS Code's). A script or a terminal IPython has none."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and any(c.__name__ == "ZMQInteractiveShell"
                                     for c in type(shell).__mro__)


def no_frontend(name: str) -> bool:
    """True, with one warning naming ``name``, when there is no Jupyter front end: a live
    view then keeps its state without drawing (IPython would print raw bundles instead)."""
    if jupyter_frontend():
        return False
    warnings.warn(f"{name}: no Jupyter front end here (a script or a terminal): the view "
                  f"keeps its state without drawing; its figure() shows it", stacklevel=3)
    return True
