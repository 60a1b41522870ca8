"""What a researcher looks at: the Jupyter live view, figures, the parameter explorer,
polars frames, and the design-review deck (`vtrm_gate.views.review`, ``make figures``).

- `_live`: `show_live` / `LiveGateView` (per-type E+/E- panels, progress, decisions)
- `_live_train`: `TrainView`, one line per step, settlement and evaluation; `show_train` /
  `TrainCurveView`, the training curve growing a point per step, settlement, evaluation
- `_style`: the one visual language (palette, fonts, 1280x720) and `figure_problems`
- `_figures`, `_train_figures`: the figures (`GateFigure`: self-displaying, 1280x720)
- `_explore`: `explore()`, sliders over the gate's parameters with exact OC
- `_frames`: polars frames of outcomes, trajectories, counters, events, OC grids
- `_workspace`: `open_workspace` (a workspace read-only: its tables and figures), its
  status, two runs compared, every table exported
"""

from __future__ import annotations

from ._explore import Explorer as Explorer
from ._explore import Point as Point
from ._explore import explore as explore
from ._explore import explorer_figure as explorer_figure
from ._explore import monte_carlo_check as monte_carlo_check
from ._explore import point_oc as point_oc
from ._explore import tradeoffs as tradeoffs
from ._figures import GateFigure as GateFigure
from ._figures import TrajectorySeries as TrajectorySeries
from ._figures import decisions_claim as decisions_claim
from ._figures import draw_overview as draw_overview
from ._figures import draw_trajectories as draw_trajectories
from ._figures import draw_type_panels as draw_type_panels
from ._figures import false_accept_frame as false_accept_frame
from ._figures import new_figure as new_figure
from ._figures import notebook_figures_dir as notebook_figures_dir
from ._figures import plot_call_breakdown as plot_call_breakdown
from ._figures import plot_false_accept as plot_false_accept
from ._figures import plot_makespan as plot_makespan
from ._figures import plot_operating_characteristics as plot_operating_characteristics
from ._figures import plot_prefix_vs_block as plot_prefix_vs_block
from ._figures import plot_token_savings as plot_token_savings
from ._figures import plot_trajectories as plot_trajectories
from ._figures import plot_waste as plot_waste
from ._figures import save as save
from ._figures import trajectory_series as trajectory_series
from ._frames import call_accounting as call_accounting
from ._frames import compare_replays as compare_replays
from ._frames import counters_frame as counters_frame
from ._frames import decision_quality_frame as decision_quality_frame
from ._frames import events_frame as events_frame
from ._frames import gain_frame as gain_frame
from ._frames import harmful_sweep_frame as harmful_sweep_frame
from ._frames import oc_grid as oc_grid
from ._frames import outcomes_frame as outcomes_frame
from ._frames import trajectory_frame as trajectory_frame
from ._live import LiveGateView as LiveGateView
from ._live import LiveSnapshot as LiveSnapshot
from ._live import endpoints_html as endpoints_html
from ._live import render_figure as render_figure
from ._live import render_png as render_png
from ._live import show_live as show_live
from ._live import watch as watch
from ._live_train import TrainCurveView as TrainCurveView
from ._live_train import TrainView as TrainView
from ._live_train import show_train as show_train
from ._style import SLIDE as SLIDE
from ._style import SLIDE_DPI as SLIDE_DPI
from ._style import figure_problems as figure_problems
from ._style import styled as styled
from ._style import type_colour as type_colour
from ._train_figures import crossover_claim as crossover_claim
from ._train_figures import plot_harmful_crossover as plot_harmful_crossover
from ._train_figures import plot_phase_times as plot_phase_times
from ._train_figures import plot_power_frontier as plot_power_frontier
from ._train_figures import plot_train_progress as plot_train_progress
from ._train_figures import plot_training_curve as plot_training_curve
from ._workspace import WorkspaceView as WorkspaceView
from ._workspace import compare_runs as compare_runs
from ._workspace import decision_letters as decision_letters
from ._workspace import export_tables as export_tables
from ._workspace import open_workspace as open_workspace
from ._workspace import run_status as run_status

__all__ = [
    "SLIDE",
    "SLIDE_DPI",
    "Explorer",
    "GateFigure",
    "LiveGateView",
    "LiveSnapshot",
    "Point",
    "TrainCurveView",
    "TrainView",
    "TrajectorySeries",
    "WorkspaceView",
    "call_accounting",
    "compare_replays",
    "compare_runs",
    "counters_frame",
    "crossover_claim",
    "decision_letters",
    "decision_quality_frame",
    "decisions_claim",
    "draw_overview",
    "draw_trajectories",
    "draw_type_panels",
    "endpoints_html",
    "events_frame",
    "explore",
    "explorer_figure",
    "export_tables",
    "false_accept_frame",
    "figure_problems",
    "gain_frame",
    "harmful_sweep_frame",
    "monte_carlo_check",
    "new_figure",
    "notebook_figures_dir",
    "oc_grid",
    "open_workspace",
    "outcomes_frame",
    "plot_call_breakdown",
    "plot_false_accept",
    "plot_harmful_crossover",
    "plot_makespan",
    "plot_operating_characteristics",
    "plot_phase_times",
    "plot_power_frontier",
    "plot_prefix_vs_block",
    "plot_token_savings",
    "plot_train_progress",
    "plot_training_curve",
    "plot_trajectories",
    "plot_waste",
    "point_oc",
    "render_figure",
    "render_png",
    "run_status",
    "save",
    "show_live",
    "show_train",
    "styled",
    "tradeoffs",
    "trajectory_frame",
    "trajectory_series",
    "type_colour",
    "watch",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
