"""Bring your own agent: the README's example factory runs the full harness through the CLI,
and a factory that cannot be used is exit 2 with one line naming it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate import cli
from vtrm_gate.errors import BackendError
from vtrm_gate.llm import AgentBackend, is_factory_spec, load_factory
from vtrm_gate.testing import RedisTarget

README = Path(__file__).resolve().parents[2] / "docs" / "real-agents.md"


def readme_example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- byo-example -->\n```python\n(.*?)```", text, flags=re.S)
    assert m, "docs/real-agents.md lost its bring-your-own-agent example"
    return m.group(1)


def write_units(path: Path) -> Path:
    """'Counting' (40 units): the right answer is always the longest option, never A.
    'Spatial' (12 units): the right answer is always A, the shortest option."""
    lines = []
    for i in range(40):
        opts = ["no", f"maybe {i}", f"certainly the answer {i}", "yes"]
        lines.append({"unit_id": f"c{i:02d}", "task_type": "Counting",
                      "question": f"How many? ({i})", "options": opts, "answer": "C"})
    for i in range(12):
        opts = ["a", f"bb {i}", f"the longest option here {i}"]
        lines.append({"unit_id": f"s{i:02d}", "task_type": "Spatial",
                      "question": f"Where? ({i})", "options": opts, "answer": "A"})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def package(tmp_path: Path, name: str, source: str) -> Path:
    pkg = tmp_path / "plugins" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(source)
    return tmp_path / "plugins"


def run_cli(args: list[str], pythonpath: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "REDIS_URL": redis_url}
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def readme_workspace(tmp_path: Path, redis_target: RedisTarget) -> tuple[Path, Path, str]:
    """The README's example package and an ``init --llm --backend`` workspace that names it:
    (PYTHONPATH for the package, workspace path, Redis URL)."""
    path = package(tmp_path, "mypkg", readme_example())
    units = write_units(tmp_path / "units.jsonl")
    ws = tmp_path / "ws"
    out = run_cli(["init", str(ws), "--llm", "--units", str(units), "--backend",
                   "mypkg.agent:make_backend"], path, redis_target.url)
    assert out.returncode == 0, out.stderr
    return path, ws, redis_target.url


def test_readme_example_runs_a_full_step_and_its_rerun_is_served_from_the_caches(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    path, ws, url = readme_workspace(tmp_path, redis_target)
    agent = json.loads((ws / "workspace.json").read_text())["agent"]
    assert agent == {"backend": "mypkg.agent:make_backend"}

    step = ["step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json"]
    first = run_cli(step, path, url)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    actions = {t["task_type"]: t["action"] for t in doc["types"]}
    # Counting: base (option A) is always wrong, the candidate (longest) always right.
    # Spatial: the seed skill is always right, so no cases: nothing to evolve.
    assert actions == {"Counting": "ACCEPT", "Spatial": None}
    assert {t["task_type"]: t["status"] for t in doc["types"]} == {"Counting": "gated",
                                                                   "Spatial": "no_cases"}
    assert doc["llm_cache"]["backend"] == "mypkg.agent:make_backend"
    runs = doc["llm_cache"]["runs"]
    assert runs["e1_s1_gate_counting_cand"]["misses"] > 0

    again = run_cli(step, path, url)
    assert again.returncode == 0, again.stderr
    doc2 = json.loads(again.stdout)
    assert {t["task_type"]: t["action"] for t in doc2["types"]} == actions
    cand = doc2["llm_cache"]["runs"]["e1_s1_gate_counting_cand"]
    # Every unit the first run consumed is a hit now; only calls that the first run never
    # started (past the stop, timing-dependent) can be new.
    counting = next(t for t in doc["types"] if t["task_type"] == "Counting")
    assert cand["hits"] >= counting["stop_rank"] + 1
    assert cand["misses"] < runs["e1_s1_gate_counting_cand"]["misses"]
    base = next(t for t in doc2["types"] if t["task_type"] == "Counting")
    assert base["cache_hits"] > 0  # the base arm came from the BaselineCache


BAD = {
    "nosuchpkg.agent:make_backend": "cannot import 'nosuchpkg.agent'",
    "badpkg.agent:missing": "has no 'missing'",
    "badpkg.agent:NOT_CALLABLE": "is not callable",
    "badpkg.agent:raises": "failed: RuntimeError: no GPU here",
    "badpkg.agent:wrong_type": "returned dict, expected vtrm_gate.llm.AgentBackend",
    "badpkg.agent:sync_infer": "infer must be an async function",
    "not a spec": "expected 'package.module:function'",
}
BAD_SOURCE = '''
from vtrm_gate import AgentBackend

NOT_CALLABLE = 3

class Evolver:
    async def evolve(self, *a):
        return "x"

def raises(ctx):
    raise RuntimeError("no GPU here")

def wrong_type(ctx):
    return {"infer": None}

def sync_infer(ctx):
    return AgentBackend(infer=lambda task: None, evolver=Evolver(), cases=lambda *a: [])
'''


@pytest.mark.parametrize("spec", list(BAD))
def test_a_bad_factory_is_exit_2_with_one_line_naming_it(
        spec: str, tmp_path: Path, redis_target: RedisTarget,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = package(tmp_path, "badpkg", BAD_SOURCE)
    readme = package(tmp_path / "r", "mypkg", readme_example())
    monkeypatch.syspath_prepend(str(path))
    monkeypatch.syspath_prepend(str(readme))
    monkeypatch.setenv("REDIS_URL", redis_target.url)
    ws = tmp_path / "ws"
    assert cli.main(["init", str(ws), "--llm", "--units", str(write_units(tmp_path / "u.jsonl")),
                     "--backend", "mypkg.agent:make_backend"]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in ws.iterdir())
    code = cli.main(["step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
                     "--backend", spec])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and repr(spec) in err[0] and BAD[spec] in err[0], err
    assert sorted(p.name for p in ws.iterdir()) == before  # nothing written


def test_init_refuses_a_factory_that_does_not_import(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["init", str(tmp_path / "ws"), "--llm", "--units",
                     str(write_units(tmp_path / "u.jsonl")), "--backend", "nope.agent:f"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'nope.agent:f'" in err[0]
    assert not (tmp_path / "ws").exists()


def test_agent_backend_needs_exactly_one_case_source() -> None:
    class E:
        async def evolve(self, *a: Any) -> str:
            return ""

    async def infer(task: Any) -> Any:
        return None

    with pytest.raises(TypeError, match="exactly one of rollout"):
        AgentBackend(infer=infer, evolver=E())
    with pytest.raises(TypeError, match="evolve"):
        AgentBackend(infer=infer, evolver=object(), cases=lambda *a: [])


def test_factory_specs() -> None:
    assert is_factory_spec("mypkg.agent:make_backend")
    assert not is_factory_spec("openai")
    assert not is_factory_spec("http://x:1")
    with pytest.raises(BackendError, match=r"expected 'package\.module:function'"):
        load_factory("mypkg.agent")


def test_train_and_settle_run_your_own_agent_with_one_setting(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    # The workspace's agent.backend names the factory: `train` needs no other flag, and a
    # resume finds everything done.
    path, ws, url = readme_workspace(tmp_path, redis_target)
    train = ["train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "2",
             "--json"]
    first = run_cli(train, path, url)
    assert first.returncode == 0, first.stderr
    events = [json.loads(line) for line in first.stdout.splitlines()]
    assert [(e["event"], e["step"]) for e in events if e["event"] == "step"] == [
        ("step", 1), ("step", 2)]
    assert events[-1]["event"] == "summary" and events[-1]["done_before"] == 0
    state = json.loads((ws / "state.json").read_text())
    assert state["skills"]["Counting"]["version"] == 2  # the README agent's ACCEPT applied
    settle = run_cli(["settle", "--workspace", str(ws), "--epoch", "1", "--json"], path, url)
    assert settle.returncode == 0, settle.stderr
    assert json.loads(settle.stdout)["already_settled"] is True  # train settled epoch 1
    again = run_cli(train, path, url)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["done_before"] >= 3


def test_a_bring_your_own_evolvers_chat_reply_is_never_gated(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    """Issue 26 #3: the same check as the built-in evolver's: a reply that is an answer, not
    a skill, skips the type naming why; no gate call, no cooldown, the step is applied."""
    said = 'return current_skill.rstrip() + "\\n- Prefer the longest option.\\n"'
    source = readme_example()
    assert said in source
    path = package(tmp_path, "chatpkg", source.replace(said, 'return "The correct option is B."'))
    units = write_units(tmp_path / "units.jsonl")
    ws = tmp_path / "ws"
    out = run_cli(["init", str(ws), "--llm", "--units", str(units), "--backend",
                   "chatpkg.agent:make_backend"], path, redis_target.url)
    assert out.returncode == 0, out.stderr
    step = run_cli(["step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json"],
                   path, redis_target.url)
    assert step.returncode == 0, step.stderr
    doc = json.loads(step.stdout)
    counting = next(t for t in doc["types"] if t["task_type"] == "Counting")
    assert counting["status"] == "skipped" and counting["action"] is None
    assert counting["note"].startswith("an answer to a question ('The correct option is B.')")
    assert not [r for r in doc["llm_cache"]["runs"] if "_gate_" in r]  # zero gate calls
    state = json.loads((ws / "state.json").read_text())
    assert state["cooldown_until"].get("Counting", 0) == 0 and state["steps_applied"] == 1
