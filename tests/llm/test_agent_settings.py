"""An llm workspace's call settings as run options: ``timeout``, ``deadline``, ``max_retries``
and ``adaptive`` are execution fields (recorded in the manifest, a change never blocks a
re-run); each step's ``max_tokens`` changes answers, so it joins the agent config with
`AGENT_VERSION` and keys the BaselineCache and the manifest's inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.llm.test_backends import SECRET, cli, make_ws, step_once, write_units
from vtrm_gate._ids import canonical_json
from vtrm_gate.harness import BaselineCache
from vtrm_gate.llm import AGENT_VERSION, AgentSettings, llm_backend
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import ChatServer, RedisTarget


def manifest(ws: Path, epoch: int = 1, step: int = 1) -> dict:
    return json.loads((ws / "manifests" / f"e{epoch}_s{step}.json").read_text())


def test_call_settings_reach_the_calls_and_the_manifest(tmp_path: Path,
                                                        chat_server: ChatServer,
                                                        redis_target: RedisTarget) -> None:
    make_ws(tmp_path, chat_server).close()
    env = {"REDIS_URL": redis_target.url, "VTRM_CACHE_PREFIX": redis_target.prefix,
           "OPENAI_API_KEY": SECRET, "VTRM_MAX_RETRIES": "2"}
    step = ("step", "--workspace", "ws", "--epoch", "1", "--step", "1")
    r = cli(*step, "--timeout", "30", "--deadline", "90", "--no-adaptive",
            "--max-tokens-think", "100", "--max-tokens-answer", "16", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path / "ws")
    assert (m["timeout"], m["deadline"], m["max_retries"], m["adaptive"]) == \
        (30.0, 90.0, 2, False)
    agent = m["inputs"]["agent"]
    assert agent["agent_version"] == AGENT_VERSION
    assert agent["max_tokens"] == {"think": 100, "answer": 16, "evolve": 2048}
    budgets = {chat_server.step_of(b): b.get("max_tokens") for b in chat_server.requests}
    assert budgets == {"think": 100, "answer": 16, "evolve": 2048}
    n = len(chat_server.requests)
    # an execution field changed: the re-run goes ahead, served from the caches (it may ask
    # for units past the first run's frontier, never for a call the first run made)
    r = cli(*step, "--timeout", "45", "--max-tokens-think", "100", "--max-tokens-answer", "16",
            cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    first = {canonical_json(b) for b in chat_server.requests[:n]}
    assert not first & {canonical_json(b) for b in chat_server.requests[n:]}
    n = len(chat_server.requests)
    # a budget changed: the answers would differ, the re-run is refused naming it
    r = cli(*step, "--max-tokens-think", "100", "--max-tokens-answer", "32", cwd=tmp_path,
            env=env)
    assert r.returncode == 2 and "agent.max_tokens.answer: 16 -> 32" in r.stderr
    assert len(chat_server.requests) == n


@pytest.mark.parametrize("args, env, named", [
    (["--timeout", "0"], {}, "--timeout"),
    (["--max-retries", "-1"], {}, "--max-retries"),
    (["--max-tokens-answer", "many"], {}, "--max-tokens-answer"),
    ([], {"VTRM_MAX_RETRIES": "lots"}, "VTRM_MAX_RETRIES"),
    ([], {"VTRM_TIMEOUT": "-5"}, "VTRM_TIMEOUT"),
    (["--config", "c.toml"], {}, "max_tokens_think"),
])
def test_bad_call_settings_are_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                                   env: dict[str, str], named: str) -> None:
    (tmp_path / "c.toml").write_text('max_tokens_think = "long"\n')
    units = write_units(tmp_path / "units.jsonl")
    assert cli("init", "ws", "--llm", "--units", str(units), "--base-url",
               "http://127.0.0.1:9/v1", "--model", "m", cwd=tmp_path).returncode == 0
    r = cli("step", "--workspace", "ws", "--epoch", "1", "--step", "1", *args, cwd=tmp_path,
            env=env)
    last = r.stderr.strip().splitlines()[-1]  # argparse prints its usage first
    assert r.returncode == 2 and named in last and "Traceback" not in r.stderr


def test_a_new_agent_version_never_reuses_the_baseline_cache(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_ws(tmp_path, chat_server)
    step_once(ws, redis_target)
    stored = BaselineCache.for_workspace(ws)
    assert len(stored) > 0  # the base arm's fresh results, keyed by this agent version
    llm_backend(ws, RunOptions(), env={})  # the same agent: the same key
    assert len(BaselineCache.for_workspace(ws)) == len(stored)
    monkeypatch.setattr("vtrm_gate.llm._backend.AGENT_VERSION", AGENT_VERSION + 1)
    llm_backend(ws, RunOptions(), env={})  # prompts, grading or parsing changed: another key
    assert ws.config.agent["agent_version"] == AGENT_VERSION + 1
    assert len(BaselineCache.for_workspace(ws)) == 0


def test_the_budgets_key_the_baseline_cache(tmp_path: Path, chat_server: ChatServer,
                                            redis_target: RedisTarget) -> None:
    from vtrm_gate.options import RunOptions

    ws = make_ws(tmp_path, chat_server)
    step_once(ws, redis_target)
    n = len(BaselineCache.for_workspace(ws))
    assert n > 0
    llm_backend(ws, RunOptions(max_tokens_answer=8), env={})
    assert len(BaselineCache.for_workspace(ws)) == 0
    llm_backend(ws, RunOptions(), env={})
    assert len(BaselineCache.for_workspace(ws)) == n


@pytest.mark.parametrize("field, value, bad", [
    ("think", "false", "LLMAgent.think must be True or False, got 'false'"),  # ran as True
    ("adaptive", "no", "LLMAgent.adaptive must be True or False, got 'no'"),  # ran as True
    ("timeout", "60", "LLMAgent.timeout must be a finite number of seconds > 0, got '60'"),
    ("timeout", float("nan"), "LLMAgent.timeout must be a finite number of seconds > 0, got "
                              "nan"),
    ("temperature", "0.2", "LLMAgent.temperature must be a finite number >= 0, got '0.2'"),
    ("max_concurrency", 0, "LLMAgent.max_concurrency must be an integer >= 1 or None, got 0")])
def test_agent_settings_given_as_text_are_refused_naming_the_field(field: str, value: object,
                                                                   bad: str) -> None:
    """``AgentSettings(think="false")`` (a config value read as text) made two calls a unit,
    ``adaptive="no"`` turned adaptive concurrency on, ``timeout="60"`` was a TypeError."""
    with pytest.raises(ValueError) as err:
        AgentSettings(base_url="http://127.0.0.1:9/v1", model="m", **{field: value})
    assert str(err.value) == bad
