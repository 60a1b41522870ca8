"""Under nbval (``make test``), every notebook cell also fails when it shows a figure as text.

nbval runs every cell of every notebook; this hook then looks at what each cell displayed:
a matplotlib figure must arrive as an image (``image/png``, 1280×720 like the rest of the
deck), never only as its text repr (``<Figure size 1280x720 with 12 Axes>``).
"""

from __future__ import annotations

import base64
import io
import re

import pytest

FIGURE_TEXT = re.compile(r"^<(?:Gate)?Figure\b|^<matplotlib\.figure\.")
SIZE = (1280, 720)


def figure_output_problems(outputs: list) -> list[str]:
    """What is wrong with a cell's figure outputs (text-only figures, off-size images)."""
    from PIL import Image

    problems = []
    for out in outputs:
        data = out.get("data", {}) if hasattr(out, "get") else {}
        text = data.get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        png = data.get("image/png")
        if png is None and FIGURE_TEXT.match(text.strip()):
            problems.append(f"a figure shown as text, not an image: {text.strip()[:80]}")
        if png is not None:
            size = Image.open(io.BytesIO(base64.b64decode(png))).size
            if size != SIZE:
                problems.append(f"a {size[0]}x{size[1]} image; the deck's figures are "
                                f"{SIZE[0]}x{SIZE[1]}")
    return problems


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    outputs = getattr(item, "test_outputs", None)  # nbval's cell item, after it ran
    if call.when != "call" or report.failed or not outputs:
        return
    problems = figure_output_problems(outputs)
    if problems:
        report.outcome = "failed"
        report.longrepr = f"{item.name}: " + "; ".join(problems)
