pytest_plugins = ["vtrm_gate.testing"]
