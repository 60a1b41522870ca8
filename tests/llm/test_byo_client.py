"""docs/real-agents.md's agent on the openai SDK with `ctx.http_client()`: a full step through
the CLI against a real loopback server, every chat call cached (the gate's under the arms'
run ids, the rollout's and the evolver's under theirs), its re-run sending nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from vtrm_gate.testing import RedisTarget
from vtrm_gate.testing.chat import ChatServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "real-agents.md"


def example() -> str:
    m = re.search(r"<!-- byo-client-example -->\n```python\n(.*?)```", DOC.read_text(),
                  flags=re.S)
    assert m, "docs/real-agents.md lost its cached-client example"
    return m.group(1)


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, env=env, timeout=180, check=False)


def test_the_docs_sdk_agent_runs_a_step_cached_call_by_call(
        tmp_path: Path, redis_target: RedisTarget, chat_server: ChatServer) -> None:
    pkg = tmp_path / "plugins" / "sdkagent"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(example())
    rows = [{"unit_id": f"c{i:02d}", "task_type": "Counting", "question": f"How many? ({i})",
             "options": ["no", f"maybe {i}", f"certainly the answer {i}", "yes"],
             "answer": "C"} for i in range(40)]  # the longest option is right, never A
    (tmp_path / "units.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "plugins"), "REDIS_URL": redis_target.url,
           "VTRM_CACHE_PREFIX": redis_target.prefix, "VTRM_BASE_URL": chat_server.url,
           "VTRM_MODEL": "tiny", "OPENAI_API_KEY": "sk-docs-example-0123456789"}
    ws = tmp_path / "ws"
    r = run(["init", str(ws), "--llm", "--units", str(tmp_path / "units.jsonl"), "--backend",
             "sdkagent.agent:make_backend"], env)
    assert r.returncode == 0, r.stderr
    step = ["step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json"]
    first = run(step, env)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    [counting] = doc["types"]
    assert (counting["status"], counting["action"]) == ("gated", "ACCEPT")
    runs = doc["llm_cache"]["runs"]
    assert runs["e1_s1_rollout"]["writes"] == 16  # 8 units, think + answer
    assert runs["e1_s1_evolve_counting"]["writes"] == 1
    assert runs["e1_s1_gate_counting_cand"]["writes"] > 0
    assert set(chat_server.steps()) == {"think", "answer", "evolve"}
    assert all(a == "Bearer sk-docs-example-0123456789" for a in chat_server.auth)
    sent = len(chat_server.requests)

    again = run(step, env)
    assert again.returncode == 0, again.stderr
    doc2 = json.loads(again.stdout)
    assert [(t["action"], t["W"], t["L"]) for t in doc2["types"]] == [
        (counting["action"], counting["W"], counting["L"])]
    # a re-run asks for nothing the first run got answered (a call it cancelled past its stop
    # may be answered by the server unread: at most its two calls again)
    first_bodies = {json.dumps(b, sort_keys=True) for b in chat_server.requests[:sent]}
    asked_again = first_bodies & {json.dumps(b, sort_keys=True)
                                  for b in chat_server.requests[sent:]}
    assert len(asked_again) <= 2 * doc["cancelled_in_flight"]
    assert doc2["llm_cache"]["runs"]["e1_s1_rollout"]["hits"] == 16
