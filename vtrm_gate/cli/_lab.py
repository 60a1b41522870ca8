"""``vtrm-gate lab``: JupyterLab on loopback over the notebooks, saving widget state.

With widget state saved in the notebook (JupyterLab's "Save Widget State Automatically",
switched on here through an ``overrides.json`` of this launch's own), a saved notebook
reopened with a fresh kernel still shows the explorer's sliders and its last figure instead
of "Error displaying widget: model not found". The overrides also switch off JupyterLab's
news toast; their directory is removed when JupyterLab exits. JupyterLab is the ``[lab]``
extra; without it the command says so (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import CliError
from ._args import a_path, int_in

WIDGET_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                    "checkForUpdates": False}}
"""JupyterLab settings overrides: save widget state when a notebook is saved; no news toast
(it covered part of every notebook) and no update check."""


def register(sub: Any) -> None:
    """Add ``lab`` to the ``vtrm-gate`` subcommands."""
    p = sub.add_parser("lab", help="JupyterLab on 127.0.0.1 over the notebooks (needs the "
                                   "[lab] extra)")
    p.add_argument("--notebooks", type=a_path, default="notebooks", help="directory to serve "
                                                            "(default: notebooks)")
    p.add_argument("--port", type=int_in(1, 65535), default=None,
                   help="port, 1 to 65535 (default: JupyterLab's)")
    p.set_defaults(func=cmd_lab)


def lab_settings_dir(base: str | Path | None = None) -> Path:
    """A JupyterLab app-settings directory whose ``overrides.json`` is the environment's own
    (if any) plus `WIDGET_SETTINGS`; pass it as ``--LabApp.app_settings_dir``."""
    own = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings: dict[str, Any] = {}
    if own.exists():
        try:
            settings = json.loads(own.read_text())
        except ValueError:
            settings = {}
    for plugin, values in WIDGET_SETTINGS.items():
        settings[plugin] = {**settings.get(plugin, {}), **values}
    out = Path(base) if base is not None else Path(tempfile.mkdtemp(prefix="vtrm-lab-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "overrides.json").write_text(json.dumps(settings, indent=2) + "\n")
    return out


def lab_command(root: Path, settings: Path, port: int | None = None) -> list[str]:
    """The JupyterLab command line (loopback; ``--allow-root`` only when running as root)."""
    cmd = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1",
           f"--ServerApp.root_dir={root}", f"--LabApp.app_settings_dir={settings}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class="
           "jupyterlab.NeverCheckForUpdate"]
    if port is not None:
        cmd.append(f"--port={port}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def cmd_lab(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("jupyterlab") is None:
        raise CliError("vtrm-gate lab needs JupyterLab, which is the [lab] extra: "
                       "pip install 'vtrm_gate[lab]'")
    root = Path(args.notebooks)
    if not root.is_dir():
        raise CliError(f"{root}: no such directory of notebooks")
    with tempfile.TemporaryDirectory(prefix="vtrm-lab-") as tmp:  # removed when lab exits
        return _run_until_exit(lab_command(root.resolve(), lab_settings_dir(tmp), args.port))


def _run_until_exit(cmd: list[str]) -> int:
    """Run JupyterLab as a child and wait for it (it used to replace this process, which
    left its settings directory behind): Ctrl-C reaches it from the terminal (it asks to
    confirm), SIGTERM is passed on; returns its exit code (128 + signal when killed)."""
    import signal
    import subprocess

    proc = subprocess.Popen(cmd)
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.terminate())
    while True:
        try:
            code = proc.wait()
            return code if code >= 0 else 128 - code
        except KeyboardInterrupt:  # the terminal's Ctrl-C went to JupyterLab too
            continue
