"""``vtrm-gate lab`` as a user starts it: a real JupyterLab on loopback whose settings switch
off the news toast, and whose settings directory is gone once it exits."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vtrm_gate.cli._lab import lab_settings_dir

ROOT = Path(__file__).resolve().parents[2]
NEWS = "@jupyterlab/apputils-extension:notification"


def test_the_settings_switch_off_the_news_toast_and_keep_widget_state(tmp_path):
    settings = json.loads((lab_settings_dir(tmp_path) / "overrides.json").read_text())
    assert settings[NEWS] == {"fetchNews": "false", "checkForUpdates": False}
    assert settings["@jupyter-widgets/jupyterlab-manager:plugin"] == {"saveState": True}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None,
                    reason="JupyterLab is the [lab] extra")
def test_lab_serves_without_news_and_removes_its_settings_directory(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "nb").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = {**os.environ, "TMPDIR": str(tmp), "JUPYTER_TOKEN": token, "BROWSER": "true",
           "JUPYTER_CONFIG_DIR": str(tmp_path / ".cfg"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / ".run")}
    proc = subprocess.Popen([sys.executable, "-m", "vtrm_gate", "lab", "--notebooks",
                             str(tmp_path / "nb"), "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/lab/api/settings/{NEWS}?token={token}"
        while True:  # until it serves its settings, or exits (a hang: pytest's timeout)
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    schema = json.loads(r.read())["schema"]["properties"]
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.5)
        # the overrides are the defaults it serves (JupyterLab's own: fetchNews "none", which
        # asks with a toast over the notebook)
        assert schema["fetchNews"]["default"] == "false"
        assert schema["checkForUpdates"]["default"] is False
        assert [p.name[:9] for p in tmp.iterdir() if p.name.startswith("vtrm-lab-")] == [
            "vtrm-lab-"]  # its settings while it runs
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not list(tmp.glob("vtrm-lab-*"))  # was left behind by every launch


@pytest.mark.parametrize("port", ["99999", "-1", "0", "65536"])
def test_a_port_no_server_can_listen_on_exits_2_naming_the_flag(tmp_path, port):
    """Hostile pass (h13): ``--port 99999`` started JupyterLab, which printed
    http://127.0.0.1:99999/lab as its address (a URL no browser can open); ``--port -1``
    ended in a socket.gaierror traceback from JupyterLab."""
    (tmp_path / "nb").mkdir()
    r = subprocess.run([sys.executable, "-m", "vtrm_gate", "lab", "--notebooks",
                        str(tmp_path / "nb"), "--port", port], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "BROWSER": "true"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--port" in r.stderr and "from 1 to 65535" in r.stderr and port in r.stderr
