"""`python -m vtrm_gate`: the vtrm-gate command."""

from .cli import main

raise SystemExit(main())
