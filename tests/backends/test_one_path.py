"""One wiring path: step, train and settle (the CLI and the Python API) reach the workspace's
agent through `open_backend` with one `RunOptions`, for every kind of workspace.

Each CLI case here failed before the path was one (issue 15): ``train`` on a two-endpoint or
an endpoints-file workspace crashed, ``--dispatch`` was dropped on the ``--backend`` path,
``train`` ignored the config's and the environment's dispatch and the config's Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.llm.test_backends import evolve_reply, write_units
from tests.llm.test_plugin import package, readme_example
from tests.llm.test_plugin import write_units as write_plugin_units
from vtrm_gate import cli
from vtrm_gate._env import read_settings_text
from vtrm_gate.backends import (
    open_backend,
    settle_workspace_sync,
    step_workspace_sync,
    train_workspace_sync,
)
from vtrm_gate.harness import Workspace
from vtrm_gate.llm import _endpoints as endpoints_module
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import ChatServer, RedisTarget

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path, env: dict[str, str] | None = None,
        drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env={**base, **(env or {})})


def manifests(ws: Path) -> dict[tuple[int, int], dict[str, Any]]:
    out = {}
    for p in (ws / "manifests").glob("*.json"):
        m = json.loads(p.read_text())
        out[(m["epoch"], m["step"])] = m
    return out


@pytest.fixture
def two_servers() -> Any:
    servers = [ChatServer(evolve_reply=evolve_reply) for _ in range(2)]
    for s in servers:
        s.start()
    yield servers
    for s in servers:
        s.close()


def cache_env(target: RedisTarget) -> dict[str, str]:
    return {"REDIS_URL": target.url, "VTRM_CACHE_PREFIX": target.prefix}


@pytest.mark.parametrize("how", ["comma-separated", "endpoints-file"])
def test_train_and_settle_run_on_a_workspace_with_several_endpoints(
        tmp_path: Path, two_servers: list[ChatServer], redis_target: RedisTarget,
        how: str) -> None:
    units = write_units(tmp_path / "units.jsonl")
    ws = tmp_path / "ws"
    if how == "comma-separated":
        where = ["--base-url", ",".join(s.url for s in two_servers)]
    else:
        (tmp_path / "endpoints.txt").write_text("".join(f"{s.url} 4\n" for s in two_servers))
        where = ["--endpoints", str(tmp_path / "endpoints.txt")]
    r = run("init", str(ws), "--llm", "--units", str(units), *where, "--model", "m",
            "--seed", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    caps = 64 if how == "comma-separated" else 8
    # `options` shows what a run takes: it said 32, "default" (h13)
    shown = json.loads(run("options", "--workspace", str(ws), "--json", cwd=tmp_path).stdout
                       )["options"]
    assert shown["concurrency"] == {"value": caps, "source": "endpoint caps"}
    shown = json.loads(run("options", "--workspace", str(ws), "--json", "--concurrency", "6",
                           cwd=tmp_path).stdout)["options"]
    assert shown["concurrency"] == {"value": 6, "source": "flag --concurrency"}
    env = cache_env(redis_target)
    r = run("train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "2",
            "--no-eval", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert set(manifests(ws)) == {(1, 1), (1, 2)}
    # wall-clock phases, in a unit that shows them (a few seconds are not "0.00 h")
    m = re.search(r"time per phase \(wall seconds\).*\n(?:.*\n)*?  total\s+([\d.]+)",
                  r.stdout)
    assert m and float(m[1]) > 0, r.stdout
    slots = {m["concurrency"] for m in manifests(ws).values()}
    assert slots == {caps}  # the endpoints' summed caps
    assert all(s.requests for s in two_servers)  # both endpoints served
    r = run("settle", "--workspace", str(ws), "--epoch", "1", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "settled before" in r.stdout


def test_dispatch_flag_reaches_a_bring_your_own_step(tmp_path: Path,
                                                      redis_target: RedisTarget) -> None:
    path = package(tmp_path, "mypkg", readme_example())
    units = write_plugin_units(tmp_path / "units.jsonl")
    ws = tmp_path / "ws"
    env = {**cache_env(redis_target), "PYTHONPATH": str(path)}
    r = run("init", str(ws), "--llm", "--units", str(units), "--backend",
            "mypkg.agent:make_backend", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    r = run("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--backend",
            "mypkg.agent:make_backend", "--dispatch", "need_aware", "--concurrency", "5",
            cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    m = manifests(ws)[(1, 1)]
    assert (m["dispatch"], m["concurrency"]) == ("need_aware", 5)


@pytest.mark.parametrize("where", ["config file", "environment"])
def test_train_honours_dispatch_and_cancel_policy_from_config_and_environment(
        tmp_path: Path, where: str) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), "--seed", "4", cwd=tmp_path).returncode == 0
    args = ["train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "2",
            "--no-eval"]
    env = {}
    if where == "config file":
        (tmp_path / "c.toml").write_text('dispatch = "need_aware"\ncancel_after_freeze = true\n')
        args += ["--config", str(tmp_path / "c.toml")]
    else:
        env = {"VTRM_DISPATCH": "need_aware", "VTRM_CANCEL_AFTER_FREEZE": "on"}
    r = run(*args, cwd=tmp_path, env=env, drop=("VTRM_DISPATCH", "VTRM_CANCEL_AFTER_FREEZE"))
    assert r.returncode == 0, r.stderr
    got = {(m["dispatch"], m["cancel_after_freeze"]) for m in manifests(ws).values()}
    assert got == {("need_aware", True)}


def test_train_uses_the_config_files_redis(tmp_path: Path, chat_server: ChatServer,
                                           redis_target: RedisTarget) -> None:
    import redis

    chat_server.evolve_reply = evolve_reply
    units = write_units(tmp_path / "units.jsonl")
    ws = tmp_path / "ws"
    r = run("init", str(ws), "--llm", "--units", str(units), "--base-url", chat_server.url,
            "--model", "m", "--seed", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    conf = tmp_path / "c.toml"
    conf.write_text(f'redis_url = "{redis_target.url}"\ncache_prefix = "{redis_target.prefix}"\n')
    r = run("train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "1",
            "--no-eval", "--config", str(conf), cwd=tmp_path,
            drop=("REDIS_URL", "VTRM_CACHE_PREFIX", "VTRM_CACHE"))
    assert r.returncode == 0, r.stderr
    client = redis.Redis.from_url(redis_target.url)
    try:
        assert any(True for _ in client.scan_iter(match=f"{redis_target.prefix}:*"))
    finally:
        client.close()
    assert not (ws / "redis").exists()  # no embedded server: the config named one


# ---- one RunOptions, one opener, for every command and the Python API -----------------------


@pytest.fixture
def spied(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Records the options `open_backend` receives and those each harness call gets."""
    import vtrm_gate.backends._commands as commands

    seen: list[tuple[str, Any]] = []
    real_open = commands.open_backend

    def open_backend(ws: Any, options: RunOptions, **kw: Any) -> Any:
        seen.append(("open_backend", options))
        return real_open(ws, options, **kw)

    def spy(name: str) -> Any:
        real = getattr(commands, name)

        async def call(*a: Any, **kw: Any) -> Any:
            seen.append((name, kw["options"]))
            return await real(*a, **kw)

        return call

    monkeypatch.setattr(commands, "open_backend", open_backend)
    for name in ("run_step", "train", "settle_probation"):
        monkeypatch.setattr(commands, name, spy(name))
    return seen


def test_cli_step_train_and_settle_reach_open_backend_with_one_options(
        tmp_path: Path, spied: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    assert cli.main(["init", str(ws), "--seed", "3"]) == 0
    monkeypatch.setenv("VTRM_CONCURRENCY", "7")
    flags = ["--workspace", str(ws), "--dispatch", "need_aware"]
    assert cli.main(["step", *flags, "--epoch", "1", "--step", "1"]) == 0
    assert cli.main(["train", *flags, "--epochs", "1", "--steps-per-epoch", "2",
                     "--no-eval"]) == 0
    assert cli.main(["settle", *flags, "--epoch", "1"]) == 0
    capsys.readouterr()
    calls = [n for n, _ in spied]
    assert calls == ["open_backend", "run_step", "open_backend", "train", "open_backend",
                     "settle_probation"]
    for opened, used in zip(spied[::2], spied[1::2], strict=True):
        given = opened[1]
        assert (given.dispatch, given.concurrency) == ("need_aware", 7)
        assert given.sources["dispatch"] == "flag --dispatch"
        assert given.sources["concurrency"] == "env VTRM_CONCURRENCY"
        assert used[1] == given.with_workspace("e_continue")  # settled once, then passed whole


def test_python_api_step_train_and_settle_reach_open_backend_with_one_options(
        tmp_path: Path, spied: list[tuple[str, Any]]) -> None:
    from vtrm_gate.sim import SimConfig, init_simulated

    init_simulated(tmp_path / "ws", SimConfig(seed=3)).close()
    options = RunOptions(concurrency=5, dispatch="need_aware")
    step_workspace_sync(tmp_path / "ws", 1, 1, options)
    train_workspace_sync(tmp_path / "ws", 1, 2, options, evaluate=False)
    settle_workspace_sync(tmp_path / "ws", 1, options)
    assert [n for n, _ in spied] == ["open_backend", "run_step", "open_backend", "train",
                                     "open_backend", "settle_probation"]
    assert all(o is options for n, o in spied if n == "open_backend")
    assert all(o == options.with_workspace("e_continue") for n, o in spied
               if n != "open_backend")


def test_a_probation_rule_that_differs_from_the_workspaces_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), "--probation-rule", "e_harm", cwd=tmp_path).returncode == 0
    conf = tmp_path / "c.toml"
    conf.write_text('probation_rule = "w_net"\n')
    before = sorted(p.name for p in ws.iterdir())
    r = run("train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "1",
            "--config", str(conf), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "probation_rule is fixed" in r.stderr
    assert "'e_harm'" in r.stderr and "'w_net'" in r.stderr
    assert sorted(p.name for p in ws.iterdir()) == before


def test_options_command_names_every_value_and_where_it_came_from(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert run("init", str(ws), cwd=tmp_path).returncode == 0
    conf = tmp_path / "c.toml"
    conf.write_text("[gate]\ne_confirm = 40.0\n")
    r = run("options", "--workspace", str(ws), "--config", str(conf), "--dispatch",
            "need_aware", "--json", cwd=tmp_path, env={"VTRM_CONCURRENCY": "9"})
    assert r.returncode == 0, r.stderr
    opts = json.loads(r.stdout)["options"]
    assert opts["dispatch"] == {"value": "need_aware", "source": "flag --dispatch"}
    assert opts["concurrency"] == {"value": 9, "source": "env VTRM_CONCURRENCY"}
    assert opts["gate.e_confirm"] == {"value": 40.0, "source": f"file {conf}"}
    assert opts["gate.lambda_dir"] == {"value": 0.5, "source": "default"}
    assert opts["probation_rule"] == {"value": "e_continue", "source": "workspace.json"}


def test_options_refuses_a_broken_llm_workspace_as_its_step_does(tmp_path: Path) -> None:
    """`options` now reads the endpoints a run takes; a workspace whose agent cannot run is
    refused with the step's own words (h14: "endpoints must be a URL or a list, got
    NoneType", naming neither workspace.json nor the key)."""
    units = write_units(tmp_path / "units.jsonl")
    (tmp_path / "endpoints.txt").write_text("http://127.0.0.1:1/v1 4\nhttp://127.0.0.1:2/v1 2\n")
    ws = tmp_path / "ws"
    r = run("init", str(ws), "--llm", "--units", str(units), "--endpoints",
            str(tmp_path / "endpoints.txt"), "--model", "m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    shown = json.loads(run("options", "--workspace", str(ws), "--json", cwd=tmp_path).stdout)
    assert shown["options"]["concurrency"] == {"value": 6, "source": "endpoint caps"}
    config = json.loads((ws / "workspace.json").read_text())
    config["agent"].pop("endpoints_file")
    config["agent"]["base_url"] = None
    (ws / "workspace.json").write_text(json.dumps(config))
    outs = [run(cmd, "--workspace", str(ws), *extra, cwd=tmp_path)
            for cmd, extra in (("options", []), ("step", ["--epoch", "1", "--step", "1"]))]
    assert [o.returncode for o in outs] == [2, 2]
    assert outs[0].stderr.split(": ", 1)[1] == outs[1].stderr.split(": ", 1)[1]
    assert "workspace.json: agent.base_url must be an http(s):// URL, got None" in outs[0].stderr


def test_a_step_reads_its_endpoints_file_once(tmp_path: Path, two_servers: list[ChatServer],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoints file was read three times as a step's agent opened (the slot pool, the
    probes, the agent's pool): an edit in between ran the step on a slot pool summed from
    caps that were not its endpoints'. Read once, every part sees one version."""
    units = write_units(tmp_path / "units.jsonl")
    (tmp_path / "endpoints.txt").write_text("".join(f"{s.url} 4\n" for s in two_servers))
    r = run("init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--endpoints",
            str(tmp_path / "endpoints.txt"), "--model", "m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    reads: list[str] = []

    def edited_after_the_first_read(path: Any) -> str:
        reads.append(str(path))
        text = read_settings_text(path)
        return text if len(reads) == 1 else text.replace(" 4\n", " 1\n")

    monkeypatch.setattr(endpoints_module, "read_settings_text", edited_after_the_first_read)

    async def opened() -> tuple[int, list[int]]:
        with Workspace.open(tmp_path / "ws") as ws:
            async with open_backend(ws, RunOptions()) as backend:
                assert backend.report is not None
                return backend.options.slots, [e["max_concurrency"]
                                               for e in backend.report()["endpoints"]]

    slots, caps = asyncio.run(opened())
    assert len(reads) == 1, reads
    assert (slots, caps) == (8, [4, 4])
