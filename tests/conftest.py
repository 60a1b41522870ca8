import os

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
