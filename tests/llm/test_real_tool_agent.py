"""The multi-step reference agent on a real model (``real_model``): `ToolAgent` as a
bring-your-own backend (``--backend vtrm_gate.llm:tool_backend``) against SmolLM2-135M-Instruct
behind llama.cpp's server, every turn through the cached client. A recording proxy sees every
request: the trajectories use the tools, end on letters, and a re-run of the step asks for
nothing the first run got an answer to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate.testing.llama import MODEL_ALIAS, Exchanged, LlamaServer, RecordingProxy

pytestmark = [pytest.mark.real_model, pytest.mark.slow, pytest.mark.timeout(1500)]

CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Egypt", "Cairo"),
            ("Spain", "Madrid"), ("Kenya", "Nairobi")]


def units() -> list[dict[str, Any]]:
    """One type a 135M model half knows; the question's context comes in two parts."""
    cities = [c for _, c in CAPITALS]
    out = []
    for i, (country, city) in enumerate(CAPITALS):
        opts = [city, *[c for c in cities if c != city][i % 4:i % 4 + 3]]
        opts = opts[i % 4:] + opts[:i % 4]
        out.append({"unit_id": f"capital-{i}", "task_type": "Capital Cities",
                    "question": f"{country} is a country.\n\nWhat is the capital of {country}?",
                    "options": opts, "answer": "ABCD"[opts.index(city)]})
    return out


def cli(*args: str, cwd: Path, proxy: RecordingProxy) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "VTRM_"))}
    env.update(OPENAI_API_KEY="x", VTRM_BASE_URL=proxy.url, VTRM_MODEL=MODEL_ALIAS,
               VTRM_MAX_TURNS="3", VTRM_TIMEOUT="300")
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=1400)


def walked(exchanges: list[Exchanged]) -> list[list[Exchanged]]:
    """The agent's trajectories among ``exchanges``, as the proxy saw them: its turns (the
    requests offering tools; the evolver's offer none) grouped by run and first two
    messages, in order."""
    out: dict[tuple[str, str], list[Exchanged]] = {}
    for e in exchanges:
        if "tools" in e.body:
            out.setdefault((e.run_id, json.dumps(e.body["messages"][:2])), []).append(e)
    return [sorted(t, key=lambda e: len(e.body["messages"])) for t in out.values()]


def tools_called(e: Exchanged) -> list[str]:
    """The tools a turn's reply called."""
    msg = (e.reply or {}).get("choices", [{}])[0].get("message") or {}
    return [c.get("function", {}).get("name") for c in msg.get("tool_calls") or []]


def test_the_tool_agent_on_llama_cpp_walks_trajectories_and_its_rerun_is_cached(
        tmp_path: Path, llama_server: LlamaServer) -> None:
    proxy = RecordingProxy(llama_server.url)
    try:
        src = tmp_path / "units.jsonl"
        src.write_text("".join(json.dumps(u) + "\n" for u in units()))
        r = cli("init", "ws", "--llm", "--units", str(src), "--backend",
                "vtrm_gate.llm:tool_backend", cwd=tmp_path, proxy=proxy)
        assert r.returncode == 0, r.stderr
        step = ("step", "--workspace", "ws", "--epoch", "1", "--step", "1", "--json",
                "--concurrency", "4")  # a one-slot server: no deep queue behind it
        first = cli(*step, cwd=tmp_path, proxy=proxy)
        assert first.returncode == 0, first.stderr[-2000:]
        out = json.loads(first.stdout)
        n1 = proxy.mark()
        run1 = proxy.between(0, n1)
        assert n1 > 0 and all(e.status == 200 for e in run1)
        # the first turn looked (llama.cpp constrains a forced tool's arguments to its schema)
        firsts = [e.body for e in run1 if len(e.body["messages"]) == 2 and "tools" in e.body]
        assert firsts and all(b["tool_choice"]["function"]["name"] == "look" for b in firsts)
        assert any(m["role"] == "tool" for e in run1 for m in e.body["messages"])

        # the rollout walks every unit once; a gate runs only where the evolver's reply was a
        # skill (what a 135M model replies differs with the build of llama.cpp): a trajectory
        # per started (unit, arm), but one the gate's stop cancelled may be cut short or
        # never reach the server
        traces = walked(run1)
        rollout = [t for t in traces if t[0].run_id.endswith("_rollout")]
        gated = [t for t in traces if "_gate_" in t[0].run_id]
        assert len(rollout) + len(gated) == len(traces)
        assert len(rollout) == len(units())
        # a type with no gate (no cases, an evolver reply that was not a skill) started none
        started = sum(t["started"] or 0 for t in out["types"])
        assert started - (out["cancelled_in_flight"] or 0) <= len(gated) <= started
        assert all(2 <= len(t) <= 3 for t in rollout)  # look, (look), answer (max_turns 3)
        assert all(1 <= len(t) <= 3 for t in gated)
        assert sum(tools_called(t[-1]) == ["answer"] for t in rollout) >= len(rollout) / 2

        again = cli(*step, cwd=tmp_path, proxy=proxy)
        assert again.returncode == 0, again.stderr[-2000:]
        n2 = proxy.mark()
        asked_again, why = proxy.reasked(n1, n2)
        assert all(proxy.runs(0, n1))  # the cached client named each request's run
        # a call the first run cancelled in flight may be asked again (none if no gate ran)
        assert len(asked_again) <= (out["cancelled_in_flight"] or 0), (out["types"], why)
        decided = {t["task_type"]: (t["status"], t["action"], t["W"], t["L"], t["stop_rank"])
                   for t in out["types"]}
        assert {t["task_type"]: (t["status"], t["action"], t["W"], t["L"], t["stop_rank"])
                for t in json.loads(again.stdout)["types"]} == decided
        print(f"\nToolAgent on SmolLM2-135M: {n1} requests, {len(traces)} trajectories "
              f"({len(gated)} in the gate), "
              f"{sum(map(len, traces)) / len(traces):.1f} turns each, "
              f"{sum(tools_called(t[-1]) == ['answer'] for t in traces)} ending on answer; "
              f"re-run: {n2 - n1} requests")
    finally:
        proxy.close()
