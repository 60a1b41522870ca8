"""In a real ipykernel: figures render with no magic, and the live view ends as plain outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from vtrm_gate.nbstrip import dirty_cells

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
WIDGET = "application/vnd.jupyter.widget-view+json"


def _run(*sources: str) -> list[list[dict]]:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    return [c.outputs for c in nb.cells]


@pytest.mark.slow
def test_figures_render_without_magic_and_the_backend_is_untouched():
    outs = _run(
        "import matplotlib; before = matplotlib.get_backend()",
        "from vtrm_gate import replay_prefix\nfrom vtrm_gate.views import plot_trajectories\n"
        "plot_trajectories({'a': replay_prefix([(False, True)] * 6)})",
        "import vtrm_gate.views, vtrm_gate.views.review\n"
        "print(before == matplotlib.get_backend())")
    assert "image/png" in outs[1][0]["data"]
    assert outs[2][0]["text"].strip() == "True"


@pytest.mark.slow
def test_live_view_is_replaced_by_a_static_figure_and_table_when_the_gate_ends():
    outs = _run(
        "from vtrm_gate.sim import sim_step\nfrom vtrm_gate.views import show_live, watch\n"
        "step = sim_step(2, wall_seconds=1.0)\nhandle, view = show_live(step.plans, step.infer)",
        "r = await watch(handle, view)\nprint(view.static, len(r.outcomes))")
    live = outs[0]
    assert all(WIDGET not in o.get("data", {}) for o in live)
    kinds = [set(o["data"]) for o in live]
    assert "image/png" in kinds[0] and "text/html" in kinds[1]
    table = live[1]["data"]["text/html"]
    assert table.count("<tr>") == 1 + 12  # header + every type, none hidden
    assert outs[1][0]["text"].split() == ["True", "12"]


@pytest.mark.slow
def test_the_explorer_leaves_a_plain_snapshot_of_its_last_state():
    """A reopened notebook showed ~12 "disconnected" widget icons where the explorer was:
    besides its widgets it now displays a plain HTML snapshot that follows every redraw."""
    outs = _run(
        "import base64\nfrom vtrm_gate.views import Explorer\nex = Explorer(debounce=0)\nex",
        "ex.sliders['e_confirm'].value = 10.0",
        "print(base64.b64encode(ex.image.value).decode()[-200:], ex.redraws)")
    explorer = outs[0]
    assert [WIDGET in o["data"] for o in explorer] == [True, False]
    snap = explorer[1]["data"]["text/html"]
    tail, redraws = outs[2][0]["text"].split()
    assert redraws == "2" and tail in snap  # the figure after the slider move
    assert "P(ACCEPT) <b>" in snap and "class='vtrm-snapshot'" in snap
    assert ".vtrm-explorer.jupyter-widgets-disconnected{display:none}" in snap


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebooks_keep_outputs_only_in_checked_cells(path):
    cells = dirty_cells(json.loads(path.read_text()))
    assert not cells, (f"{path.name}: cells {cells} have outputs; strip them with "
                       f"`make strip` (python -m vtrm_gate.nbstrip notebooks/*.ipynb)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_use_no_matplotlib_magic(path):
    assert "%matplotlib" not in path.read_text()


@pytest.mark.slow
def test_running_notebook_01s_launch_cell_again_restarts_the_step():
    """Re-running the launch cell started a second gate beside the first, which went on
    invisibly (its output area cleared) and doubled the step's calls."""
    nb = json.loads((NOTEBOOKS[0]).read_text())
    setup, launch = ("".join(nb["cells"][i]["source"]) for i in (1, 2))
    outs = _run(setup.replace("float(os.environ.get(\"VTRM_STEP_SECONDS\", 2 if CI else 30))",
                              "3.0"),
                launch, "first = handle", launch,
                "r = await handle\n"
                "print(first.done(), first.partial().aborted is not None, len(r.outcomes))")
    assert outs[4][-1]["text"].split() == ["True", "True", "12"]


@pytest.mark.slow
def test_a_slow_tradeoffs_grid_says_how_far_it_has_got():
    """Notebook 05 with N_UNITS = 1000 computed for over two minutes with nothing in the
    cell; a long ladder's grid now shows its progress and then how long it took."""
    outs = _run("from vtrm_gate.views import tradeoffs",
                "g = tradeoffs(n_units=201, e_confirms=(20, 10), lambdas=(0.5,))",
                "g = tradeoffs(n_units=40, e_confirms=(20, 10), lambdas=(0.5,))")
    shown = [o["data"]["text/html"] for o in outs[1] if "text/html" in o.get("data", {})]
    assert re.fullmatch(r"<span style='color:[^']+'>2 settings at 201 units in \d+ s</span>",
                        shown[-1])
    assert outs[2] == []
