"""The ``vtrm-gate`` command line, one module per command group behind `main`:

- `_init`: ``init`` (simulated, or ``--llm`` units + endpoint / your own agent)
- `_step`: ``step``, ``demo``, ``replay`` (a step, or every gate of an outcomes file)
- `_fit`: ``fit`` (the world behind a workspace or an outcomes file)
- `_train`: ``train``, ``settle``
- `_cache`: ``cache renew | stats | stop``
- `_status`: ``status`` (where a run stands, and the next command)
- `_export`: ``export`` (every table to Parquet or CSV)
- `_compare`: ``compare A B`` (two runs side by side)
- `_options`: ``options`` (every resolved run option and where it came from)
- `_lab`: ``lab`` (JupyterLab on loopback over the notebooks, saving widget state)
- `_args`, `_progress`, `_table`: shared flags (one `RunOptions` per command), terminal
  progress, tables that fit the terminal
"""

from __future__ import annotations

from ._main import build_parser as build_parser
from ._main import main as main
from ._step import cache_lines as cache_lines
from ._step import decision_table as decision_table
