import os
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

# No test writes into the repository: what a run adds at its top level (besides the caches
# named here) fails the run, e.g. an embedded Redis a test started in ``./workspace`` by not
# naming its workspace (it outlived the run, and its keys reached the next one).
_ROOT = Path(__file__).resolve().parents[1]
_BEFORE = pytest.StashKey[set[str]]()
_CACHES = {".pytest_cache", ".hypothesis", "__pycache__", ".mypy_cache", ".ruff_cache"}


def _top_level() -> set[str]:
    return set(os.listdir(_ROOT)) - _CACHES


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _top_level()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):  # xdist: the controller checks, once
        return
    added = sorted(_top_level() - session.config.stash.get(_BEFORE, set()))
    if added:
        session.config.get_terminal_writer().line(
            f"\nthe tests wrote into the repository ({_ROOT}): {', '.join(added)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
