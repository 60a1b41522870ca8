"""The README is a front page: short, its links resolve, its quick tour runs and prints what
it says, and its headline numbers are the deck's (figures/README.md), which are what the code
computes today."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
QUOTED = ("step_old_h", "step_v3_h", "step_speedup", "step_lower_bound", "training_old_h",
          "training_v3_h", "training_speedup", "p_accept_0.8", "p_provisional_0.8",
          "false_accept_h0")
"""Headline numbers the README quotes."""


def _deck_headlines() -> dict[str, str]:
    text = (ROOT / "figures" / "README.md").read_text()
    return dict(re.findall(r"^- `([\w.]+)`: (.+)$", text.split("Headline numbers", 1)[1],
                           flags=re.M))


def test_the_front_page_is_short_and_every_link_resolves():
    assert len(README) < 20_000
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert {"docs/api.md", "docs/statistics.md", "docs/performance.md"} <= set(links)
    for link in links:
        assert (ROOT / link).exists(), link


def test_the_quick_tour_runs_and_prints_what_its_comment_says():
    src = re.search(r"## Quick tour.*?```python\n(.*?)```", README, re.S).group(1)
    expected = re.search(r"print\(.*\)\s+# (.+?):", src).group(1)
    code = compile(src, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        coro = eval(code, {"__name__": "readme"})  # top-level await, as in a notebook cell
        if coro is not None:
            asyncio.run(coro)
    assert out.getvalue().strip() == expected


def test_the_readme_quotes_the_deck_headlines():
    deck = _deck_headlines()
    for key in QUOTED:
        assert deck[key] in README, f"README does not say {key} = {deck[key]}"


@pytest.mark.slow
def test_the_deck_headlines_are_what_the_code_computes_today():
    from vtrm_gate.views.review import ReviewParams, headlines

    assert _deck_headlines() == headlines(ReviewParams())
