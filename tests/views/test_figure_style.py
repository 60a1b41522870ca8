"""One visual language: every figure the library returns is a self-displaying 1280×720
`GateFigure` with a title, labelled axes, colours from `views._style` and no overlapping
text (`figure_problems`), and the palette stays distinguishable under colour-vision
deficiencies."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from matplotlib.colors import to_rgb

from vtrm_gate import GateParams, replay_prefix
from vtrm_gate.views import (
    GateFigure,
    LiveGateView,
    Point,
    explorer_figure,
    monte_carlo_check,
    plot_call_breakdown,
    plot_trajectories,
    review,
)
from vtrm_gate.views._style import BAD, BOUND, EXIT_COLOURS, FREE, OLD, V3, figure_problems

RP = review.ReviewParams(n_rep=400, epochs=1, steps_per_epoch=2)


def _live(fraction: float, layout: str = "panels") -> GateFigure:
    events = review.simulated_step(RP.sim_seed)["events"]
    view = LiveGateView()
    for ev in events[: int(len(events) * fraction)]:
        view.update(ev)
    return view.figure(layout)


FIGURES = {
    **{name: (lambda fn=fn: fn(RP)) for name, (fn, _) in review.FIGURES.items()},
    "trajectories_overview": lambda: plot_trajectories(
        review.simulated_step(RP.sim_seed)["gate"].outcomes),
    "trajectories_panels": lambda: plot_trajectories(
        review.simulated_step(RP.sim_seed)["gate"].outcomes, layout="panels"),
    "live_view_running": lambda: _live(0.4),
    "live_view_finished": lambda: _live(1.0),
    "live_view_overview": lambda: _live(1.0, "overview"),
    "explorer": lambda: explorer_figure(Point()),
    "explorer_monte_carlo": lambda: explorer_figure(
        Point(), monte_carlo_check(Point(), 500), n_rep=500),
    "call_breakdown": lambda: plot_call_breakdown(
        {"uninterrupted": {"fresh calls": 790}, "crashed + re-run": {"crashed": 400,
                                                                    "re-run": 390}},
        title="Crash, then re-run: 790 fresh calls vs 790 uninterrupted"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FIGURES))
def test_every_figure_passes_the_deck_checks(name):
    fig = FIGURES[name]()
    assert isinstance(fig, GateFigure), f"{name} is a plain {type(fig).__name__}"
    assert figure_problems(fig) == []
    png = fig._repr_png_()
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGBA")
    assert img.size == (1280, 720)
    # opaque white corners: legible on JupyterLab's dark theme too
    assert {img.getpixel(p) for p in ((0, 0), (1279, 719))} == {(255, 255, 255, 255)}


def test_the_checks_catch_what_they_promise():
    from vtrm_gate.views import new_figure

    fig = new_figure((8.0, 6.0))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color="tab:pink")
    ax.text(0.5, 0.5, "one label")
    ax.text(0.5, 0.5, "another label")
    problems = "\n".join(figure_problems(fig))
    assert "size 800x600" in problems and "no title" in problems
    assert "no x-axis label" in problems and "colour tab:pink" in problems
    assert "'one label' overlaps 'another label'" in problems


def test_a_figure_in_a_notebook_is_an_image_and_says_what_it_is():
    fig = plot_trajectories({"a": replay_prefix([(False, True)] * 8)}, GateParams())
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    assert repr(fig).startswith("<GateFigure 1280x720: 1 of 1 type decided")  # not "All 1 types"


# Machado, Oliveira & Fernandes (2009), severity 1, on linear RGB.
CVD = {"protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                      [-0.003882, -0.048116, 1.051998]],
       "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                        [-0.011820, 0.042940, 0.968881]],
       "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                      [0.004733, 0.691367, 0.303900]]}


def _lab(colour: str, m: np.ndarray) -> np.ndarray:
    c = np.array(to_rgb(colour))
    lin = np.clip(m @ np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4), 0, 1)
    x, y, z = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                        [0.0193, 0.1192, 0.9505]]) @ lin
    f = lambda t: np.cbrt(t) if t > 0.008856 else 7.787 * t + 16 / 116  # noqa: E731
    return np.array([116 * f(y) - 16, 500 * (f(x / 0.95047) - f(y)),
                     200 * (f(y) - f(z / 1.08883))])


@pytest.mark.parametrize("kind", ["normal", *CVD])
@pytest.mark.parametrize("group", ["semantic", "exits"])
def test_the_palette_stays_distinguishable_under_colour_blindness(kind, group):
    colours = [V3, OLD, BAD, FREE, BOUND] if group == "semantic" else list(EXIT_COLOURS.values())
    m = np.eye(3) if kind == "normal" else np.array(CVD[kind])
    worst = min(float(np.linalg.norm(_lab(a, m) - _lab(b, m)))
                for a, b in itertools.combinations(colours, 2))
    assert worst >= 15.0  # CIELAB ΔE; the old exit colours were 8.5 apart under deuteranopia


def _contrast_on_white(colour: str) -> float:
    lin = [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in to_rgb(colour)]
    return 1.05 / (0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] + 0.05)


def test_colours_that_write_text_read_on_white():
    """Type names are written in their type's colour (overview labels, table swatches): at
    least 3:1 against the figure's white, WCAG's bar for large text. The pale tab20 colours
    of the old demo figure were 1.8:1."""
    from vtrm_gate.views._style import MUTED, TEXT, TYPE_COLOURS

    for colour in (*TYPE_COLOURS, V3, BAD, MUTED, TEXT, BOUND):
        assert _contrast_on_white(colour) >= 3.0, colour


_CJK_FIGURE = r'''
import sys, warnings
import matplotlib
matplotlib.use("Agg")
from fontTools.fontBuilder import FontBuilder
from fontTools.pens.ttGlyphPen import TTGlyphPen
from matplotlib import font_manager

from vtrm_gate import GateParams, replay_prefix
from vtrm_gate.views import plot_trajectories

NAMES = ["时间推理", "空间感知与推理", "OCR Problems"]
if sys.argv[1] == "installed":  # a real TrueType font with the names' glyphs (squares)
    chars = sorted(set("".join(NAMES[:2])))
    glyphs = [".notdef", *(f"uni{ord(c):04X}" for c in chars)]
    pen = TTGlyphPen(None)
    for xy in ((100, 0), (100, 800), (900, 800), (900, 0)):
        (pen.moveTo if xy == (100, 0) else pen.lineTo)(xy)
    pen.closePath()
    fb = FontBuilder(1000, isTTF=True)
    fb.setupGlyphOrder(glyphs)
    fb.setupCharacterMap({ord(c): f"uni{ord(c):04X}" for c in chars})
    fb.setupGlyf({g: pen.glyph() for g in glyphs})
    fb.setupHorizontalMetrics({g: (1000, 100) for g in glyphs})
    fb.setupHorizontalHeader(ascent=880, descent=-120)
    fb.setupNameTable({"familyName": "Noto Sans CJK SC", "styleName": "Regular"})
    fb.setupOS2(sTypoAscender=880, usWinAscent=880, usWinDescent=120)
    fb.setupPost()
    fb.save(sys.argv[2])
    font_manager.fontManager.addfont(sys.argv[2])
win = [(False, True)] * 8
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for layout in ("overview", "panels"):
        plot_trajectories({n: replay_prefix(win, GateParams()) for n in NAMES},
                          layout=layout).savefig(sys.argv[2] + ".png")
print(sum("missing from font" in str(w.message) for w in caught))
'''


@pytest.mark.parametrize("font, missing", [("installed", 0), ("none", 1)])
def test_type_names_in_chinese_are_drawn_with_an_installed_cjk_font(tmp_path, font, missing):
    """Hostile pass (h13): DejaVu Sans has no CJK glyph, and the figures named no fallback,
    so "时间推理" was drawn as empty boxes (one "Glyph missing" warning a character) even
    where a CJK font was installed. Now an installed `CJK_FONTS` font draws them; with none
    installed, matplotlib still says which glyphs it could not draw."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _CJK_FIGURE, font, str(tmp_path / "f.ttf")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (int(r.stdout.split()[-1]) > 0) == bool(missing), r.stdout
