"""The secret scan (issue 19, done-when): after LLM and bring-your-own runs that fail in
every way that quotes a credential (a gateway echoing the Authorization header, a backend
raising with the key, a Redis that is down), no planted secret of >= 8 characters is in any
file of the workspace, in any key or value in Redis, or in what the commands print (--json
included)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from vtrm_gate import cli
from vtrm_gate.cache import RedisServer
from vtrm_gate.testing import ChatServer, Fault

API_KEY = "sk-planted-scan-5e6f7a8b9c"
REDIS_PW = "redis-pw-planted-3141"
TOKEN = "tok-planted-scan-2718"
SECRETS = (API_KEY, REDIS_PW, TOKEN)

BYO = '''
from vtrm_gate import AgentBackend, UnitResult
from vtrm_gate.cache import cached_infer


def make_backend(ctx):
    ws, key, tok = ctx.workspace, ctx.env["OPENAI_API_KEY"], ctx.env["MY_SERVICE_TOKEN"]

    async def agent(task):
        if task.unit_id.endswith("3"):
            raise ConnectionError(f"gateway refused Authorization: Bearer {key} ({tok})")
        if task.unit_id.endswith("5"):
            return UnitResult(infra=True, error=f"quota for key={key} exceeded",
                              trace={"request": {"api_key": key}})
        said = "C" if "longest" in task.skill else "A"
        return UnitResult(correct=said == ws.units[task.unit_id].answer, prediction=said,
                          tokens=7, trace={"note": f"signed with {tok}"})

    def prompt(task):
        return [{"role": "system", "content": task.skill},
                {"role": "user", "content": ws.units[task.unit_id].question}]

    infer = cached_infer(ctx.cache, agent, model="byo-scan", prompt=prompt,
                         grade=lambda task, a: a == ws.units[task.unit_id].answer)

    class Evolver:
        async def evolve(self, task_type, current_skill, rejected, epoch, step):
            if step == 2:
                raise RuntimeError(f"evolver endpoint rejected {key}")
            return current_skill.rstrip() + "\\n- Prefer the longest option.\\n"

    async def rollout(epoch, step):
        return {t: list(ws.pool[t][:6]) for t in ws.task_types}

    return AgentBackend(infer=infer, evolver=Evolver(), rollout=rollout,
                        identity={"agent": "byo-scan", "endpoint": f"https://x/?v={tok}"},
                        cache_stats=ctx.cache.stats)
'''


def write_units(path: Path, n: int = 24) -> Path:
    lines = []
    for i in range(n):
        options = [f"opt {k}" for k in range(4)]
        options[2] = "the longest option, by a clear margin"
        lines.append({"unit_id": f"u{i:02d}", "task_type": "Counting", "question": f"q {i}?",
                      "options": options, "answer": "C"})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def secured_redis(tmp_path: Path) -> Any:
    server = RedisServer(tmp_path / "redis", password=REDIS_PW, persist=False).start()
    try:
        yield server
    finally:
        server.stop()


class Outputs:
    """Everything the commands printed, and their exit codes."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.codes: list[int] = []

    def run(self, *argv: str) -> int:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
        self.text += [out.getvalue(), err.getvalue()]
        self.codes.append(code)
        return code


def scan(root: Path, server: RedisServer, outputs: Outputs) -> list[str]:
    """Where a planted secret occurs: workspace files (any bytes, the SQLite WAL included),
    Redis keys and values (every type), printed text."""
    found = [f"file {p.relative_to(root)}" for p in root.rglob("*") if p.is_file()
             and any(s.encode() in p.read_bytes() for s in SECRETS)]
    r = redis.Redis(unix_socket_path=server.socket_path, password=REDIS_PW)
    try:
        keys = list(r.scan_iter(count=1000))
        assert keys, "the runs wrote nothing to Redis"
        read = {"string": r.get, "hash": r.hgetall, "list": lambda k: r.lrange(k, 0, -1),
                "set": r.smembers, "zset": lambda k: r.zrange(k, 0, -1)}
        for k in keys:
            value = read.get(r.type(k).decode(), lambda k: b"")(k)
            blob = k + repr(value).encode()
            if any(s.encode() in blob for s in SECRETS):
                found.append(f"redis {k!r}")
    finally:
        r.close()
    found += [f"output {t[:60]!r}" for t in outputs.text if any(s in t for s in SECRETS)]
    return found


def test_no_secret_after_llm_runs_with_credential_echoing_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secured_redis: RedisServer) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("MY_SERVICE_TOKEN", TOKEN)
    monkeypatch.setenv("REDIS_URL", secured_redis.url)
    ws = tmp_path / "ws"
    out = Outputs()
    with ChatServer() as chat:
        assert out.run("init", str(ws), "--llm", "--units", str(write_units(tmp_path / "u")),
                       "--base-url", chat.url, "--model", "m", "--json") == 0
        # a gateway that echoes the credentials, retryable and not
        chat.inject(*[Fault(status=401, echo_auth=True, step="answer")] * 30,
                    *[Fault(status=503, echo_auth=True, step="think")] * 30)
        step = ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json")
        # the INFRA guard trips, quoting the errors (one retry a call: the 503s' back-off
        # made this step 44 s of the suite)
        assert out.run(*step, "--max-retries", "1") == 3
        chat.faults.clear()
        assert out.run(*step) == 0
        assert out.run("train", "--workspace", str(ws), "--epochs", "1",
                       "--steps-per-epoch", "2", "--json") == 0
        assert out.run("cache", "stats", "--workspace", str(ws), "--json") == 0
        monkeypatch.setenv("REDIS_URL", f"redis://:{REDIS_PW}@127.0.0.1:1/0")  # Redis down
        code = out.run("step", "--workspace", str(ws), "--epoch", "2", "--step", "1", "--json")
        assert code == 0, out.text[-1]
    assert any("***" in t for t in out.text)  # a credential was quoted, and scrubbed
    assert not scan(ws, secured_redis, out)


def test_no_secret_after_byo_runs_whose_backend_quotes_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secured_redis: RedisServer) -> None:
    pkg = tmp_path / "plugins" / "scanpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(BYO)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("MY_SERVICE_TOKEN", TOKEN)
    monkeypatch.setenv("REDIS_URL", secured_redis.url)
    ws = tmp_path / "ws"
    out = Outputs()
    assert out.run("init", str(ws), "--llm", "--units", str(write_units(tmp_path / "u")),
                   "--backend", "scanpkg.agent:make_backend", "--json") == 0
    codes = [out.run("train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch",
                     "2", "--concurrency", "4", "--json") for _ in range(2)]
    assert 3 in codes  # units failing with the key in their error: the guard tripped
    manifest = json.loads((ws / "manifests/e1_s1.json").read_text())
    assert manifest["inputs"]["agent"]["endpoint"] == "https://x/?v=***"
    assert not scan(ws, secured_redis, out)


def _forms(secret: str) -> list[str]:
    """A secret as the scan looks for it: raw, base64 (standalone), %-encoded, reversed."""
    import base64

    return [secret, base64.b64encode(secret.encode()).decode().rstrip("="),
            "".join(f"%{b:02X}" for b in secret.encode()), secret[::-1]]


def test_no_secret_after_an_llm_run_whose_server_echoes_the_key_in_normal_replies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secured_redis: RedisServer) -> None:
    """Issue 27 #2 #14: a 200 reply that repeats the key (raw, base64, %-encoded, reversed)
    and an environment token, in the answers and in the evolver's skill, leaves none of them
    in state.json, the skill files, harness.sqlite, Redis or the output."""
    import base64

    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("MY_SERVICE_TOKEN", TOKEN)
    monkeypatch.setenv("REDIS_URL", secured_redis.url)
    leak = (f"signed with Bearer {API_KEY} ({base64.b64encode(API_KEY.encode()).decode()}, "
            f"{''.join(f'%{b:02X}' for b in API_KEY.encode())}, {API_KEY[::-1]}) for {TOKEN}")
    ws = tmp_path / "ws"
    out = Outputs()
    with ChatServer() as chat:
        chat.echo = lambda auth: f" ({leak})"
        chat.evolve_reply = lambda t, skill, body: (
            f"```markdown\n{skill.rstrip()}\n- Prefer the longest option ({leak}).\n```")
        assert out.run("init", str(ws), "--llm", "--units", str(write_units(tmp_path / "u")),
                       "--base-url", chat.url, "--model", "m", "--json") == 0
        assert out.run("train", "--workspace", str(ws), "--epochs", "1",
                       "--steps-per-epoch", "2", "--json") == 0, out.text[-2:]
    assert any("***" in p.read_text() for p in (ws / "candidates").rglob("*.md"))
    found = scan(ws, secured_redis, out)
    forms = [f for s in (API_KEY, TOKEN) for f in _forms(s)]
    found += [f"file {p.relative_to(ws)}" for p in ws.rglob("*") if p.is_file()
              and any(f.encode() in p.read_bytes() for f in forms)]
    assert not found
