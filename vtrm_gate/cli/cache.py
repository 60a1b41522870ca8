"""``python -m vtrm_gate.cli.cache cache renew ...``: the cache commands without the rest."""

from __future__ import annotations

import sys

from ._cache import main

if __name__ == "__main__":
    sys.exit(main())
