"""A real browser on a real JupyterLab: what a person sees in notebooks 01 and 05.

Debian's ``chromium`` (installed with apt-get when missing and running as root; skipped with
a message otherwise) driven by Playwright from PyPI with ``executable_path`` (never
``playwright install``). JupyterLab runs on loopback with a token over a temporary copy of
the notebooks and is always stopped. Screenshots land in the test's tmp directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
STEP_SECONDS = 20  # notebook 01's step, slow enough to watch the figure redraw

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _ensure_chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip("browser test: /usr/bin/chromium is missing and cannot be installed here "
                    "(needs apt-get as root: apt-get update && apt-get install -y chromium)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([apt, "update"], [apt, "install", "-y", "chromium"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"browser test: `{' '.join(cmd)}` failed: {done.stderr[-300:]}")
    return CHROMIUM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """JupyterLab on 127.0.0.1 with a token over a copy of notebooks 01 and 05."""
    root = tmp_path_factory.mktemp("lab")
    for name in ("01_launch_gate_step.ipynb", "05_choose_parameters.ipynb"):
        shutil.copy(ROOT / "notebooks" / name, root / name)
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "VTRM_CI": "0", "VTRM_STEP_SECONDS": str(STEP_SECONDS),
           "VTRM_FIGURES": str(root / "figures"), "JUPYTER_CONFIG_DIR": str(root / ".cfg"),
           "JUPYTER_RUNTIME_DIR": str(root / ".run")}
    env.pop("MPLBACKEND", None)
    log = (root / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.port_retries=0", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate", *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (root / "lab.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        yield f"{base}/lab/tree/{{name}}?token={token}", root
    finally:
        proc.send_signal(signal.SIGINT)  # jupyter_server shuts its kernels down on SIGINT
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
    assert proc.poll() is not None


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    exe = _ensure_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(exe), args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    # JupyterLab may ask which kernel to start: accept the notebook's own (python3)
    with contextlib.suppress(Exception):
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=8000)
    page.get_by_text("| Idle").first.wait_for(timeout=90_000)
    return page


def _run_all(page) -> None:
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def _wait_idle(page, timeout_s: float) -> None:
    page.wait_for_timeout(500)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = page.locator(".jp-InputArea-prompt:has-text('[*]')").count()
        if busy == 0:
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"cells still running after {timeout_s:.0f} s")


def test_notebook_01_live_view_then_static_outputs_after_save_and_reload(lab, browser, tmp_path):
    url, root = lab
    page = _open(browser, url.format(name="01_launch_gate_step.ipynb"))
    _run_all(page)
    live_img = page.locator(".vtrm-live img")
    try:
        live_img.first.wait_for(timeout=120_000)
    except Exception:
        page.screenshot(path=str(tmp_path / "01_no_live_view.png"), full_page=True)
        raise
    assert page.locator(".vtrm-live .widget-progress, .vtrm-live progress, "
                        ".vtrm-live .progress").count() >= 1, "no progress widget rendered"
    frames: set[str] = set()
    deadline = time.monotonic() + STEP_SECONDS * 6 + 60
    while page.locator(".vtrm-live").count() and time.monotonic() < deadline:
        try:
            src = live_img.first.get_attribute("src", timeout=1000)
        except Exception:  # the widget was just replaced by the static output
            break
        if src:
            frames.add(src)
            if len(frames) == 3:
                live_img.first.scroll_into_view_if_needed()
                page.screenshot(path=str(tmp_path / "01_running.png"))
        page.wait_for_timeout(150)
    _wait_idle(page, 240)
    page.screenshot(path=str(tmp_path / "01_finished.png"), full_page=True)
    print(f"live figure frames seen by the browser: {len(frames)}")
    assert len(frames) >= 5, f"the live figure was redrawn only {len(frames)} times"
    assert page.locator(".vtrm-live").count() == 0, "widgets left after the gate ended"
    tables = page.locator("table.vtrm-table")
    assert tables.count() >= 1
    assert tables.first.locator("tbody tr").count() == 12
    page.keyboard.press("Control+s")
    page.wait_for_timeout(2000)
    saved = json.loads((root / "01_launch_gate_step.ipynb").read_text())
    kinds = [k for c in saved["cells"] for o in c.get("outputs", []) for k in o.get("data", {})]
    assert "application/vnd.jupyter.widget-view+json" not in kinds, "a widget was saved"
    assert "image/png" in kinds and "text/html" in kinds
    page.reload()
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_timeout(3000)
    page.screenshot(path=str(tmp_path / "01_reloaded.png"), full_page=True)
    text = page.locator(".jp-Notebook").inner_text()
    assert "Error displaying widget" not in text
    assert page.locator("table.vtrm-table").first.locator("tbody tr").count() == 12
    assert page.locator(".jp-OutputArea-output img").count() >= 2  # live-view PNG + overview
    page.close()


def test_explorer_figure_changes_when_a_slider_moves(lab, browser, tmp_path):
    url, _ = lab
    page = _open(browser, url.format(name="05_choose_parameters.ipynb"))
    _run_all(page)
    img = page.locator(".vtrm-explorer img").first
    img.wait_for(timeout=120_000)
    _wait_idle(page, 120)
    before = img.get_attribute("src")
    page.screenshot(path=str(tmp_path / "05_before.png"), full_page=True)
    handle = page.locator(".vtrm-explorer .noUi-handle").first
    handle.click()
    for _ in range(10):
        handle.press("ArrowLeft")
    deadline = time.monotonic() + 30
    while img.get_attribute("src") == before and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    page.screenshot(path=str(tmp_path / "05_after.png"), full_page=True)
    assert img.get_attribute("src") != before, "the explorer figure did not change"
    page.close()
