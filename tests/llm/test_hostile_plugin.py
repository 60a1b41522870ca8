"""A hostile bring-your-own backend (issue 19 #5 #7 #8 #9): its error texts quoting the API
key or a token never reach the log, the reports, stdout or stderr; ``repr(BackendContext)``
hides the environment; credential-like ``identity`` keys are refused; a result whose
``correct`` is not a bool or whose ``tokens`` is not a non-negative integer fails the gate at
once naming unit, arm and value; a rollout of the wrong shape is refused naming the type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vtrm_gate import cli
from vtrm_gate.testing import RedisTarget

KEY = "sk-planted-4f9e1c2b7a"
TOKEN = "tok-planted-9a8b7c6d"
SECRETS = (KEY, TOKEN)

SOURCE = '''
import asyncio
import math

from vtrm_gate import AgentBackend, UnitResult
from vtrm_gate.errors import CasesUnavailable


class Unprintable(RuntimeError):
    """An SDK error whose message reads a field never set."""

    def __str__(self):
        return self.detail


def make_backend(ctx):
    mode = ctx.env.get("HOSTILE", "")
    if mode == "factory_unprintable":
        raise Unprintable()
    key, tok = ctx.env.get("OPENAI_API_KEY", ""), ctx.env.get("MY_SERVICE_TOKEN", "")
    ws = ctx.workspace
    if mode == "factory_repr":
        raise RuntimeError(f"cannot start with {ctx!r}")

    async def infer(task):
        if mode == "infer_hangs":
            await asyncio.Event().wait()  # never returns
        if mode == "result_big":  # 4 MB each, a key across every 64 KiB boundary
            big = ("A" * 65530 + key) * 64
            return UnitResult(correct=task.arm == "cand", prediction=big, error=big,
                              trace={"log": [big, {"deep": big}]}, tokens=10)
        if mode == "infer_raises":
            raise RuntimeError(f"401 from the API with key {key} and token {tok}")
        if mode == "infer_error":
            return UnitResult(infra=True, error=f"upstream said: Bearer {key}, token {tok}")
        if mode.startswith("result:"):
            field, value = mode[len("result:"):].split("=", 1)
            return UnitResult(**{"correct": True, "tokens": 10, field: eval(value)})
        right = ws.units[task.unit_id].answer
        said = "C" if "longest" in task.skill else "A"
        return UnitResult(correct=said == right, prediction=said, tokens=10)

    class Evolver:
        async def evolve(self, task_type, current_skill, rejected, epoch, step):
            if mode == "evolve_hangs":
                await asyncio.Event().wait()  # never returns
            if mode == "evolve_raises":
                raise RuntimeError(f"the evolver's endpoint refused key {key}")
            if mode == "evolve_leaks":
                return current_skill.rstrip() + f"\\n- Prefer the longest option ({key}, {tok}).\\n"
            return current_skill.rstrip() + "\\n- Prefer the longest option.\\n"

    async def rollout(epoch, step):
        if mode == "rollout_hangs":
            await asyncio.Event().wait()  # never returns
        if mode == "rollout_raises":
            raise ConnectionError(f"rollout failed: token={tok}")
        if mode == "rollout_unprintable":
            raise Unprintable()
        if mode == "rollout_bad":
            return {t: 5 for t in ws.task_types}
        if mode == "rollout_unknown":
            return {"No Such Type": ["c00"]}
        if mode == "rollout_unavailable":
            return {t: CasesUnavailable(f"rollout INFRA with key {key}") for t in ws.task_types}
        return {t: list(ws.pool[t][:8]) for t in ws.task_types}

    identity = {"agent": "hostile-v1"}
    if mode.startswith("identity:"):
        identity = eval(mode[len("identity:"):], {"KEY": key, "object": object})
    return AgentBackend(infer=infer, evolver=Evolver(), rollout=rollout, identity=identity)
'''


def write_units(path: Path) -> Path:
    lines = [{"unit_id": f"c{i:02d}", "task_type": "Counting", "question": f"How many? {i}",
              "options": ["no", f"maybe {i}", f"certainly {i}", "yes"], "answer": "C"}
             for i in range(30)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``hostile`` package (``hostile.agent:make_backend``) importable for this test."""
    pkg = tmp_path / "plugins" / "hostile"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_target: RedisTarget,
              capsys: pytest.CaptureFixture[str]) -> Path:
    install_plugin(tmp_path, monkeypatch)
    monkeypatch.setenv("REDIS_URL", redis_target.url)
    monkeypatch.setenv("VTRM_CACHE_PREFIX", redis_target.prefix)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("MY_SERVICE_TOKEN", TOKEN)
    ws = tmp_path / "ws"
    assert cli.main(["init", str(ws), "--llm", "--units", str(write_units(tmp_path / "u.jsonl")),
                     "--backend", "hostile.agent:make_backend"]) == 0
    capsys.readouterr()
    return ws


def step(ws: Path, mode: str, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, list[str]]:
    monkeypatch.setenv("HOSTILE", mode)
    code = cli.main(["step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
                     "--concurrency", "4", "--json", *flags])
    out = capsys.readouterr()
    errors = out.err.strip().splitlines()  # under --json the error is a JSON line on stdout
    if code:
        errors.append(json.loads(out.out.strip().splitlines()[-1])["error"])
    return code, out.out, errors


def leaks(root: Path, *texts: str) -> list[str]:
    """Where a planted secret occurs: a file of the workspace (any bytes) or a text."""
    found = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
             and any(s.encode() in p.read_bytes() for s in SECRETS)]
    return found + [t[:80] for t in texts if any(s in t for s in SECRETS)]


@pytest.mark.parametrize(("mode", "code", "says"), [
    ("infer_raises", 3, "RuntimeError: 401 from the API with key *** and token ***"),
    ("infer_error", 3, "upstream said: Bearer ***, token ***"),
    ("evolve_raises", 3, "RuntimeError: the evolver's endpoint refused key ***"),
    ("rollout_unavailable", 3, "rollout INFRA with key ***"),
    ("rollout_raises", 3, "ConnectionError: rollout failed: token=***"),
])
def test_no_backend_text_carries_a_secret(workspace: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str], mode: str,
                                         code: int, says: str) -> None:
    got, out, err = step(workspace, mode, monkeypatch, capsys)
    assert got == code and len(err) == 1, err
    assert not leaks(workspace, out, *err)
    import sqlite3

    con = sqlite3.connect(workspace / "harness.sqlite")
    texts = [t for (t,) in con.execute("SELECT error FROM predictions UNION ALL "
                                       "SELECT note FROM step_report") if t]
    con.close()
    assert any(says in t for t in [*texts, *err]), (texts, err)


@pytest.mark.parametrize(("mode", "code", "says"), [
    ("factory_unprintable", 2, "failed: Unprintable: <its str() raised AttributeError>"),
    ("rollout_unprintable", 3, "rollout failed: Unprintable: <its str() raised AttributeError>"),
])
def test_a_backend_error_whose_text_raises_is_named_not_a_crash(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], mode: str, code: int, says: str) -> None:
    """A factory or rollout raising an exception whose ``str()`` itself raises crashed the
    step with a traceback ("a bug in vtrm_gate") instead of naming the backend's error."""
    got, _out, err = step(workspace, mode, monkeypatch, capsys)
    assert got == code and len(err) == 1, (got, err)
    import sqlite3

    con = sqlite3.connect(workspace / "harness.sqlite")
    notes = [t for (t,) in con.execute("SELECT note FROM step_report") if t]
    con.close()
    assert any(says in t for t in [*notes, *err]), (notes, err)


def test_the_factory_error_line_hides_the_environment(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = step(workspace, "factory_repr", monkeypatch, capsys)
    assert code == 2 and len(err) == 1, err
    assert "BackendContext(" in err[0] and "env=" not in err[0] and "PATH" not in err[0]
    assert not leaks(workspace, out, *err)


@pytest.mark.parametrize("identity", ["{'access_token': 'abc'}", "{'openai_key': 'abc'}",
                                      "{'apiKey': 'abc'}", "{'nested': {'password': 'abc'}}"])
def test_credential_like_identity_keys_are_refused_naming_the_key(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], identity: str) -> None:
    before = sorted(p.name for p in workspace.rglob("*"))
    code, _out, err = step(workspace, f"identity:{identity}", monkeypatch, capsys)
    name = "nested.password" if "nested" in identity else identity.split("'")[1]
    assert code == 2 and len(err) == 1 and repr(name) in err[0] and "identity" in err[0], err
    assert sorted(p.name for p in workspace.rglob("*")) == before  # no manifest written


def test_an_identity_that_is_not_json_is_refused_in_one_line(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = step(workspace, "identity:{'o': object()}", monkeypatch, capsys)
    assert code == 2 and len(err) == 1 and "identity" in err[0] and "'o'" in err[0], err


def test_a_secret_inside_an_identity_value_is_scrubbed_from_the_manifest(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = step(workspace, "identity:{'agent': 'v1 with ' + KEY}", monkeypatch,
                          capsys)
    assert code == 0, err
    manifest = json.loads((workspace / "manifests/e1_s1.json").read_text())
    assert manifest["inputs"]["agent"]["agent"] == "v1 with ***"
    assert not leaks(workspace, out, *err)


@pytest.mark.parametrize(("field", "value"), [
    ("correct", "None"), ("correct", "'no'"), ("correct", "float('nan')"), ("correct", "1"),
    ("infra", "'yes'"), ("tokens", "float('nan')"), ("tokens", "float('inf')"),
    ("tokens", "10**30"), ("tokens", "'12'"), ("tokens", "-1"), ("tokens", "12.5"),
    ("latency_s", "float('nan')"), ("error", "42"),
])
def test_an_invalid_result_fails_the_gate_at_once_naming_unit_arm_and_value(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], field: str, value: str) -> None:
    code, _out, err = step(workspace, f"result:{field}={value}", monkeypatch, capsys)
    assert code == 2 and len(err) == 1, err
    shown = repr(eval(value))
    assert f"UnitResult.{field}" in err[0] and shown in err[0], err
    assert "unit 'c" in err[0] and ("base arm" in err[0] or "cand arm" in err[0]), err
    import sqlite3

    con = sqlite3.connect(workspace / "harness.sqlite")
    status = {s for (s,) in con.execute("SELECT status FROM step_report")}
    con.close()
    assert status == {"aborted"}


@pytest.mark.parametrize(("mode", "says"), [
    ("rollout_bad", "rollout: type 'Counting': expected a list of unit ids, got 5"),
    ("rollout_unknown", "rollout: unknown type 'No Such Type'"),
])
def test_a_rollout_of_the_wrong_shape_is_refused_naming_the_type(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], mode: str, says: str) -> None:
    code, _out, err = step(workspace, mode, monkeypatch, capsys)
    assert code == 2 and len(err) == 1 and says in err[0], err


def test_programming_errors_still_fail_with_their_type(workspace: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    # a TypeError raised by infer is a bug: it propagates (scrubbed), it is never INFRA; the
    # CLI shows its traceback and asks for a report, exit 1 (issue 27 row 7)
    monkeypatch.setenv("HOSTILE", "result:nonexistent_field=1")
    capsys.readouterr()
    assert cli.main(["step", "--workspace", str(workspace), "--epoch", "1", "--step",
                     "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "TypeError" in err and "nonexistent_field" in err
    assert "raised by infer" in err and "please report it" in err.splitlines()[-1]


def test_init_with_a_backend_names_the_backend_not_a_missing_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 19 #15: `init --llm --backend pkg:f` printed "model None"
    install_plugin(tmp_path, monkeypatch)
    units = str(write_units(tmp_path / "u.jsonl"))
    assert cli.main(["init", str(tmp_path / "a"), "--llm", "--units", units,
                     "--backend", "hostile.agent:make_backend"]) == 0
    text = capsys.readouterr().out
    assert "None" not in text and "backend hostile.agent:make_backend" in text, text
    assert cli.main(["init", str(tmp_path / "b"), "--llm", "--units", units,
                     "--backend", "hostile.agent:make_backend", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "hostile.agent:make_backend" and "model" not in doc


@pytest.mark.timeout(60)
def test_an_infer_that_never_returns_is_infra_at_the_deadline(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 27 #4: --deadline (each call's) applies to a bring-your-own infer: a stuck call
    # becomes INFRA, so the guard aborts the step (exit 3) instead of hanging it
    code, _out, err = step(workspace, "infer_hangs", monkeypatch, capsys, "--deadline", "0.3")
    assert code == 3 and len(err) == 1 and "INFRA" in err[0], err
    import sqlite3

    con = sqlite3.connect(workspace / "harness.sqlite")
    errors = {e for (e,) in con.execute("SELECT error FROM predictions")}
    con.close()
    assert errors == {"TimeoutError: infer did not return within the call's deadline of "
                      "0.3 s (--deadline)"}, errors


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "says"), [
    ("evolve_hangs", "evolve_error: EvolveError: the evolver did not return within the call's "
                     "deadline of 0.5 s (--deadline)"),
    ("rollout_hangs", "rollout_error: rollout failed: TimeoutError: the rollout did not return "
                      "within its bound (one call's deadline a pool unit) of 3 s (--deadline)"),
])
def test_an_evolver_or_rollout_that_never_returns_ends_the_step_at_the_deadline(
        workspace: Path, tmp_path: Path, mode: str, says: str) -> None:
    """Issue 27: ``--deadline`` bounds a bring-your-own evolver (each ``evolve`` call) and
    rollout (one call's deadline a pool unit: 30 units x 0.1 s here); they hung the step.
    Run as a subprocess: the step exits 3 naming what hung, nothing is applied, and the same
    step then runs clean."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HOSTILE": mode, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "plugins"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    deadline = "0.5" if mode == "evolve_hangs" else "0.1"
    args = [sys.executable, "-m", "vtrm_gate", "step", "--workspace", str(workspace),
            "--epoch", "1", "--step", "1", "--concurrency", "4"]
    state = (workspace / "state.json").read_bytes()
    r = subprocess.run([*args, "--deadline", deadline], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.returncode == 3, r.stderr
    assert "nothing could be measured" in r.stderr and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and (workspace / "state.json").read_bytes() == state
    r = subprocess.run(args, capture_output=True, text=True, env={**env, "HOSTILE": ""},
                       timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.timeout(120)
def test_huge_results_are_truncated_named_and_stored_without_a_secret(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 27 #5: 20 MB predictions, errors and traces stalled the gate; now each is capped
    # (truncated, the row says so) and no secret survives, not even one cut in half
    code, out, err = step(workspace, "result_big", monkeypatch, capsys)
    assert code == 0, err
    import sqlite3

    con = sqlite3.connect(workspace / "harness.sqlite")
    rows = con.execute("SELECT p.prediction, p.error, t.trace FROM predictions p JOIN traces t "
                       "ON t.run_id = p.run_id AND t.unit_id = p.unit_id").fetchall()
    con.close()
    assert rows
    n = len(("A" * 65530 + KEY) * 64)
    for prediction, error, trace in rows:
        for text in (prediction, error):
            assert len(text) <= 65536 and text.endswith(
                f"[truncated: {n} characters, over the cap of 65536]"), text[-80:]
        assert len(trace) <= (1 << 20) and "over the cap of 1048576" in trace, trace[-200:]
    assert not leaks(workspace, out, *err)
    assert not [p for p in workspace.rglob("*") if p.is_file() and KEY[:8].encode() in
                p.read_bytes()]  # no half-cut key either


def test_an_evolver_skill_quoting_a_secret_is_applied_scrubbed(
        workspace: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 27 #3: the evolver's text reached skills/, history/ and candidates/ verbatim
    code, out, err = step(workspace, "evolve_leaks", monkeypatch, capsys)
    assert code == 0, err
    skill = (workspace / "skills" / "counting.md").read_text()
    assert "- Prefer the longest option (***, ***)." in skill  # applied: the gate accepted it
    assert not leaks(workspace, out, *err)
