"""environment.yml and pyproject.toml stay in agreement; the public API is complete."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import vtrm_gate

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"redis": "redis-py"}  # PyPI name -> conda-forge name


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _env_yml() -> tuple[set[str], set[str]]:
    conda, pip = set(), set()
    in_pip = in_deps = False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        s = line.strip()
        if not line.startswith(" "):
            in_deps = s == "dependencies:"
            continue
        if not in_deps:
            continue
        if s.startswith("- pip:"):
            in_pip = True
            continue
        if not s.startswith("- "):
            continue
        item = s[2:].strip()
        if in_pip and line.startswith("      "):
            pip.add(item)
        else:
            in_pip = False
            conda.add(_name(item))
    return conda, pip


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _env_versions() -> dict[str, str]:
    """Every dependency of environment.yml (conda and pip) with its version spec."""
    conda, pip = _env_yml()
    out = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        item = line.strip().removeprefix("- ").strip()
        name = _name(item)
        if name in conda or name in {_name(p) for p in pip}:
            out[name] = item[len(name):].strip()
    return out


def test_environment_yml_agrees_with_pyproject():
    project = _project()
    extras = project["optional-dependencies"]
    reqs = project["dependencies"] + extras["dev"] + extras["lab"]
    conda, pip = _env_yml()
    pip_names = {_name(p) for p in pip if not p.startswith("-e")}
    assert "-e .[dev]" in pip
    versions = _env_versions()
    for req in reqs:
        n = _name(req)
        assert CONDA_NAMES.get(n, n) in conda or n in pip_names, f"{n} missing from env.yml"
        spec = req.strip()[len(n):].strip()
        assert versions[CONDA_NAMES.get(n, n)] == spec, f"{n}: {spec} in pyproject.toml"
    declared = {CONDA_NAMES.get(_name(r), _name(r)) for r in reqs} | {"python", "pip"}
    extra = (conda | pip_names) - declared - {_name(r) for r in reqs}
    assert not extra, f"environment.yml lists packages pyproject.toml does not: {extra}"


def test_the_lab_extra_is_jupyterlab_and_the_dev_set_contains_it():
    extras = _project()["optional-dependencies"]
    assert {_name(r) for r in extras["lab"]} == {"jupyterlab", "ipykernel"}
    assert {_name(r) for r in extras["lab"]} <= {_name(r) for r in extras["dev"]}


def _imports(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_every_package_the_library_imports_is_a_core_dependency():
    """`pip install vtrm_gate` then `explore()` failed: ipywidgets was only in the dev
    extra. Every third-party import of the library (its pytest plugin aside) must come from
    a core dependency."""
    import importlib.metadata as md
    import sys

    dists = md.packages_distributions()
    core = {_name(r) for r in _project()["dependencies"]}
    needed: dict[str, set[str]] = {}
    for path in (ROOT / "vtrm_gate").rglob("*.py"):
        if "testing" in path.relative_to(ROOT / "vtrm_gate").parts:
            continue
        for mod in _imports(path) - set(sys.stdlib_module_names) - {"vtrm_gate"}:
            for dist in dists.get(mod, [mod]):
                needed.setdefault(_name(dist), set()).add(str(path.relative_to(ROOT)))
    missing = {d: sorted(p)[:3] for d, p in needed.items() if d not in core}
    assert not missing, f"imported but not a core dependency: {missing}"
    assert {"ipywidgets", "ipython"} <= core


def test_a_missing_optional_dependency_names_its_extra(monkeypatch, capsys):
    import importlib.util

    from vtrm_gate.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "jupyterlab" else real(name, *a))
    assert main(["lab", "--notebooks", str(ROOT / "notebooks")]) == 2
    assert "pip install 'vtrm_gate[lab]'" in capsys.readouterr().err


def test_public_api_exports():
    for name in ["GateParams", "Action", "gate_decision", "replay_prefix", "replay_blocks",
                 "replay_arrival", "operating_characteristics", "run_gate", "TypePlan",
                 "UnitTask", "UnitResult", "GateResult", "TypeOutcome", "InfraGuardError"]:
        assert hasattr(vtrm_gate, name), name
    assert {m.name for m in vtrm_gate.Action} == {
        "ACCEPT", "REJECT", "FUTILE", "PROVISIONAL", "INERTIA", "CONTINUE"}


def test_ci_runs_make_test_and_nothing_else():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#") and not ln.startswith("set ")
                and not ln.startswith("cd ")]
    assert commands == ["make test"]


def test_importing_the_package_is_light():
    """`vtrm-gate cache ...` must not pay for numpy: the API resolves lazily."""
    import subprocess
    import sys

    code = ("import sys, vtrm_gate; assert 'numpy' not in sys.modules; "
            "vtrm_gate.GateParams; assert 'numpy' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_exported_name_resolves():
    for name in vtrm_gate.__all__:
        assert getattr(vtrm_gate, name) is not None, name


def test_sim_world_fixture(sim_world):
    assert len(sim_world.pool("Counting Problem")) == 9


@pytest.mark.parametrize("old, name, new", [
    ("vtrm_gate.scheduler", "run_gate", "vtrm_gate.gate.run_gate"),
    ("vtrm_gate.scheduler", "slugify", "vtrm_gate._ids.slugify"),
    ("vtrm_gate.scheduler", "InfraGuardError", "vtrm_gate.errors.InfraGuardError"),
    ("vtrm_gate.plugin", "AgentBackend", "vtrm_gate.llm.AgentBackend"),
    ("vtrm_gate.plugin", "open_backend", "vtrm_gate.llm.open_factory_backend"),
    ("vtrm_gate.plugin", "BackendError", "vtrm_gate.errors.BackendError"),
])
def test_moved_modules_keep_a_shim_that_warns(old: str, name: str, new: str) -> None:
    import importlib

    module, _, attr = new.rpartition(".")
    with pytest.warns(DeprecationWarning,
                      match=rf"{old}\.{name} moved to {new}; .* removed in vtrm_gate 0\.3\.0"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(module), attr)


def test_the_scheduler_shim_still_gives_arms_naming_its_replacement() -> None:
    """`_ids.ARMS` lived only to feed the shim: the shim holds the value itself now."""
    import vtrm_gate.scheduler

    with pytest.warns(DeprecationWarning, match=r"scheduler\.ARMS moved to the tuple"):
        assert vtrm_gate.scheduler.ARMS == ("base", "cand")


@pytest.mark.parametrize("sub, name", [("views", "show_live"), ("sim", "sim_step"),
                                       ("stats", "settled_oc"), ("harness", "Workspace"),
                                       ("cache", "ResponseCache")])
def test_subpackages_are_attributes_of_the_package_and_load_lazily(sub: str, name: str) -> None:
    """`import vtrm_gate; vtrm_gate.views.show_live(...)` as the README writes it (was
    "module 'vtrm_gate' has no attribute 'views'"), without paying for them at import."""
    import subprocess
    import sys

    code = (f"import sys, vtrm_gate; assert 'vtrm_gate.{sub}' not in sys.modules; "
            f"assert callable(vtrm_gate.{sub}.{name}); assert '{sub}' in dir(vtrm_gate)")
    subprocess.run([sys.executable, "-c", code], check=True)
