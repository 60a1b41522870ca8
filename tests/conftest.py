import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

pytest_plugins = ["vtrm_gate.testing"]

# The CLI's tables and progress lines follow COLUMNS when it is set; pytest-xdist's workers
# set it (80), as a shell may: each test that wants a width sets its own.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# Property tests reproduce run to run (derandomized, no example database on disk); set
# HYPOTHESIS_PROFILE=explore for fresh random examples when hunting for bugs locally.
settings.register_profile("vtrm", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "vtrm"))

# The longest tests first: under xdist a long test collected last runs alone at the end while
# the other workers sit idle (the browser module, ~4 min on one worker, was collected last).
LONG_FIRST = ("tests/views/test_browser.py", "tests/llm/test_real_model.py",
              "tests/sim/test_fit.py", "tests/test_bench_power.py",
              "tests/llm/test_real_tool_agent.py", "tests/views/test_figures.py",
              "tests/test_readme.py", "tests/llm/test_adaptive.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONG_FIRST.index(path) if path in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order


# No test writes into the repository: a file a run adds there, or an untracked one it
# changes (outside the environment and the caches named here), fails the run. E.g. an
# embedded Redis a test started in ``./workspace`` by not naming its workspace: it outlived
# the run, and its keys reached the next one.
_ROOT = Path(__file__).resolve().parents[1]
_BEFORE = pytest.StashKey[dict[str, tuple[int, int] | None]]()
_SKIP = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache",
         ".ruff_cache", "vtrm_gate.egg-info"}


def _tracked() -> set[str]:
    """The files git tracks: edited while the suite runs, they are the user's (git shows
    them), not a test's."""
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), "ls-files", "-z"], capture_output=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {os.path.normpath(p) for p in out.decode(errors="replace").split("\0") if p}


def _snapshot() -> dict[str, tuple[int, int] | None]:
    """Each untracked file's (mtime, size) and each directory (None) under the root."""
    out: dict[str, tuple[int, int] | None] = {}
    tracked = _tracked()
    for top, dirs, files in os.walk(_ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP]
        rel = os.path.relpath(top, _ROOT)
        out[rel] = None
        for name in files:
            path = os.path.normpath(os.path.join(rel, name))
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(top, name))
                out[path] = None if path in tracked else (st.st_mtime_ns, st.st_size)
    return out


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # xdist: the controller checks, once
        session.config.stash[_BEFORE] = _snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    after = _snapshot()
    written = sorted(p for p, v in after.items() if p not in before or before[p] != v)
    if written:
        shown = ", ".join(written[:10]) + (f" (+{len(written) - 10})" if len(written) > 10
                                           else "")
        session.config.get_terminal_writer().line(
            f"\nthe tests wrote into the repository ({_ROOT}): {shown}", red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
