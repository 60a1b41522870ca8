"""A rollout whose calls are INFRA (a wrong API key) is not "no cases": the type is
``rollout_error``, and a step that measured nothing exits non-zero and is not applied."""

from __future__ import annotations

import json
from pathlib import Path

from test_backends import SECRET, cli, cli_env, cli_init, evolve_reply, write_units

from vtrm_gate.harness import HarnessLog
from vtrm_gate.testing import ChatServer, Fault, RedisTarget


def test_a_rollout_refused_by_the_endpoint_is_rollout_error_and_nothing_is_applied(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    chat_server.evolve_reply = evolve_reply
    ws = tmp_path / "ws"
    cli_init(ws, write_units(tmp_path / "units.jsonl"), chat_server, tmp_path)
    env = cli_env(redis_target, "sk-wrong")
    step = ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    chat_server.inject(*[Fault(status=401)] * 1000)  # every call: invalid API key
    state = (ws / "state.json").read_bytes()
    r = cli(*step, cwd=tmp_path, env=env)
    assert r.returncode == 3, (r.returncode, r.stderr)
    err = [line for line in r.stderr.splitlines() if line.startswith("vtrm-gate: error")]
    assert len(err) == 1 and "nothing could be measured, so it was not applied" in err[0]
    assert "Traceback" not in r.stderr
    with HarnessLog(ws / "harness.sqlite") as log:
        rows = log.query("SELECT task_type, status, note, applied FROM step_report")
    assert {t: s for t, s, _, _ in rows} == dict.fromkeys(
        ("Action Reasoning", "Counting Problem", "OCR Problems", "Object Recognition"),
        "rollout_error")
    assert all("rollout INFRA: 8 of 8 units failed" in n for _, _, n, _ in rows)
    assert all(a is None for _, _, _, a in rows)
    assert (ws / "state.json").read_bytes() == state
    assert not list((ws / "manifests").iterdir())
    assert not chat_server.of_step("evolve")  # no case was invented for the evolver
    # the right key: the same step runs as new and is applied
    chat_server.faults.clear()
    r = cli(*step, "--json", cwd=tmp_path, env={**env, "OPENAI_API_KEY": SECRET})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {t["task_type"]: t["status"] for t in out["types"]}["Action Reasoning"] == "gated"
    assert json.loads((ws / "state.json").read_text())["steps_applied"] == 1
