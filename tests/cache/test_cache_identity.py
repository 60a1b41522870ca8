"""What a cached outcome is keyed by: the workspace (its id in the response-cache salt, with
sharing as an explicit opt-in) and the unit's content (in the BaselineCache key), so a new
workspace draws fresh samples and a relabelled unit is a miss; and nothing stored or logged
holds the API key, even when a server echoes it."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate._ids import content_hash
from vtrm_gate.cache import ResponseCache
from vtrm_gate.errors import ConfigError
from vtrm_gate.gate import UnitResult, UnitTask
from vtrm_gate.harness import BaselineCache, Workspace, run_step
from vtrm_gate.llm import RetryPolicy, init_llm, llm_backend
from vtrm_gate.options import RunOptions, resolve_options
from vtrm_gate.testing import ChatServer, Fault, RedisTarget

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, max_total_s=10.0)
LONG = "the longest option, by a clear margin"


def unit(i: int, answer: str = "B", question: str | None = None,
         task_type: str = "OCR Problems") -> dict[str, Any]:
    options = ["a cat", LONG, "a bird"]
    return {"unit_id": f"u{i:02d}", "task_type": task_type,
            "question": question or f"Question {i}: what happens in the clip?",
            "options": options, "answer": answer}


def write_units(path: Path, units: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(u) + "\n" for u in units))
    return path


SECRET = "sk-live-4f9a0c1e7b2d3a5f6e8c"


async def step_ocr(ws: Workspace, backend: Any, concurrency: int = 8, force: bool = False
                   ) -> None:
    """Step e1 s1 through ``backend`` with OCR Problems' one case (u09); the backend closed
    after, whatever happened."""
    try:
        await run_step(ws, 1, 1, infer=backend.infer, evolver=backend.evolver,
                       cases={"OCR Problems": ["u09"]},
                       options=RunOptions(concurrency=concurrency), force=force)
    finally:
        await backend.aclose()


def make_ws(root: Path, server: ChatServer, n: int = 10) -> Workspace:
    src = write_units(root.parent / f"{root.name}-units.jsonl", [unit(i) for i in range(n)])
    return init_llm(root, src, base_url=server.url, model="test-model", seed=1)


# ---- the workspace id in the response-cache salt --------------------------------------


def answer_all(ws: Workspace, target: RedisTarget, share: str | None = None,
               run_id: str = "e1_s1_gate_ocr-problems_base") -> list[UnitResult]:
    """Every unit of ``ws`` answered once through a fresh backend on the test's Redis prefix;
    also one evolver proposal (temperature 0.7: it must draw fresh samples per workspace)."""
    cache = ResponseCache(target.url, prefix=target.prefix)
    backend = llm_backend(ws, RunOptions(cache_share=share), cache=cache, api_key="k", env={},
                          retry=FAST)
    skill = ws.skill_text("OCR Problems")

    async def go() -> list[UnitResult]:
        try:
            out = [await backend.infer(UnitTask("OCR Problems", u, "base", r, run_id, skill))
                   for r, u in enumerate(ws.pool["OCR Problems"])]
            await backend.evolver.evolve("OCR Problems", skill, [], 1, 1)
            return out
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_two_workspaces_on_one_redis_never_share_samples_by_default(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    a, b = make_ws(tmp_path / "a", chat_server), make_ws(tmp_path / "b", chat_server)
    assert a.workspace_id != b.workspace_id and len(a.workspace_id) >= 16
    answer_all(a, redis_target)
    n = len(chat_server.requests)
    assert n == 10 * 2 + 8 * 2 + 1  # think + answer per unit; rollout; one evolver call
    results = answer_all(b, redis_target)
    assert len(chat_server.requests) == 2 * n  # no cross hits: b drew its own samples
    assert not any(r.cached for r in results)
    answer_all(a, redis_target)  # a's own re-run still replays from Redis
    assert len(chat_server.requests) == 2 * n


def test_sharing_across_workspaces_is_an_explicit_opt_in(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    a, b = make_ws(tmp_path / "a", chat_server), make_ws(tmp_path / "b", chat_server)
    answer_all(a, redis_target, share="team")
    n = len(chat_server.requests)
    assert all(r.cached for r in answer_all(b, redis_target, share="team"))
    assert len(chat_server.requests) == n  # same share name: every call a hit
    answer_all(b, redis_target, share="other")
    assert len(chat_server.requests) == 2 * n  # another name is another cache
    answer_all(b, redis_target)
    assert len(chat_server.requests) == 3 * n  # and b's own namespace is a third


def test_cache_share_is_read_from_the_config_file_and_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "vtrm.toml"
    toml.write_text('[cache]\nshare = "team"\n')
    assert resolve_options(config=toml, env={}, dotenv=None).cache_share == "team"
    assert resolve_options(env={"VTRM_CACHE_SHARE": "lab"}, dotenv=None).cache_share == "lab"
    assert resolve_options(env={}, dotenv=None).cache_share is None
    toml.write_text('[cache]\nshared = "team"\n')
    with pytest.raises(ConfigError, match=r"cache\.shared.*valid keys: share"):
        resolve_options(config=toml, env={}, dotenv=None)
    toml.write_text('[cache]\nshare = ""\n')
    with pytest.raises(ConfigError, match=r"cache\.share must be a non-empty"):
        resolve_options(config=toml, env={}, dotenv=None)


def test_a_workspace_without_an_id_gets_a_stable_one_and_nothing_is_written(
        tmp_path: Path, chat_server: ChatServer) -> None:
    ids = []
    for name in ("old1", "old2"):
        ws = make_ws(tmp_path / name, chat_server)
        ws.close()
        cfg = json.loads((ws.root / "workspace.json").read_text())
        del cfg["workspace_id"]  # as written before workspace ids existed
        (ws.root / "workspace.json").write_text(json.dumps(cfg))
        before = (ws.root / "workspace.json").read_bytes()
        first, again = Workspace.open(ws.root), Workspace.open(ws.root)
        assert first.workspace_id == again.workspace_id != ""
        assert (ws.root / "workspace.json").read_bytes() == before
        ids.append(first.workspace_id)
        first.close()
        again.close()
    assert ids[0] != ids[1]


# ---- unit content in the BaselineCache key --------------------------------------------


def test_baseline_cache_misses_when_a_units_content_changes(
        tmp_path: Path, chat_server: ChatServer) -> None:
    ws = make_ws(tmp_path / "ws", chat_server)
    skill = ws.skill_text("OCR Problems")
    task = UnitTask("OCR Problems", "u03", "base", 0, "e1_s1_gate_ocr-problems_base", skill,
                    content_hash(skill))
    asyncio.run(BaselineCache.for_workspace(ws).put(
        task, UnitResult(correct=True, prediction="B")))
    ws.close()

    def lookup(**change: Any) -> UnitResult | None:
        units = [unit(i, **(change if i == 3 else {})) for i in range(10)]
        write_units(tmp_path / "ws" / "units.jsonl", units)
        with Workspace.open(tmp_path / "ws") as w:
            return asyncio.run(BaselineCache.for_workspace(w).get(task))

    assert lookup() is not None  # unchanged: a hit
    assert lookup(answer="C") is None  # relabelled
    assert lookup(question="Another question?") is None
    assert lookup() is not None


def test_a_relabelled_unit_is_measured_again_on_a_rerun(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    # The agent answers "A" (plain skill). Every label is B first, so every base answer is
    # wrong; then u00..u04 are relabelled A, and the re-run must grade them right.
    ws = make_ws(tmp_path / "ws", chat_server)

    def step() -> None:
        cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
        with Workspace.open(tmp_path / "ws") as w:
            backend = llm_backend(w, RunOptions(), cache=cache, api_key="k", env={}, retry=FAST)
            asyncio.run(step_ocr(w, backend, concurrency=64, force=True))

    ws.close()
    step()
    write_units(tmp_path / "ws" / "units.jsonl",
                [unit(i, answer="A" if i < 5 else "B") for i in range(10)])
    step()
    with Workspace.open(tmp_path / "ws") as w:
        rows = w.log.query("SELECT unit_id, correct, prediction FROM predictions WHERE "
                           "run_id LIKE '%_base'")
        answers = {u: r.answer for u, r in w.units.items()}
    assert rows and all(bool(c) == (p == answers[u]) for u, c, p in rows), rows
    assert {u for u, c, _ in rows if c} >= {"u00", "u01"}


# ---- nothing stored holds the API key -------------------------------------------------


def test_an_echoed_api_key_never_reaches_the_log_rows_or_the_workspace(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget,
        caplog: pytest.LogCaptureFixture) -> None:
    secret = SECRET
    ws = make_ws(tmp_path / "ws", chat_server)
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    errors: list[str] = []
    backend = llm_backend(ws, RunOptions(), cache=cache, api_key=secret, env={}, retry=FAST,
                          on_event=lambda ev: ev.error and errors.append(ev.error))
    # every agent call refused (the evolver still proposes): the gate's calls are all INFRA
    chat_server.inject(*[Fault(status=401, echo_auth=True, step="think")] * 200)

    with caplog.at_level(logging.DEBUG), pytest.raises(Exception, match="INFRA"):
        asyncio.run(step_ocr(ws, backend))
    rows = ws.log.query("SELECT error FROM predictions WHERE error IS NOT NULL")
    ws.close()
    assert rows and all("HTTP 401" in e and "invalid credentials" in e for (e,) in rows)
    assert errors and chat_server.auth[-1] == f"Bearer {secret}"
    for text in [*(e for (e,) in rows), *errors, caplog.text]:
        assert secret not in text and "Bearer sk-" not in text
    for p in (tmp_path / "ws").rglob("*"):
        assert not p.is_file() or secret.encode() not in p.read_bytes(), p


def _gives_away(blob: bytes, secret: str) -> bool:
    """``blob`` holds ``secret`` raw, JSON-escaped (at any depth of JSON inside JSON, any mix
    of ``\\u`` escapes) or as hex of its bytes (either case)."""
    import re

    text = blob.decode("utf-8", "replace")
    for _ in range(4):
        text = text.replace("\\\\", "\\")
    text = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), text)
    return secret in text or secret.encode().hex() in text.lower()


def test_an_escaped_or_hex_echo_of_the_key_in_200_replies_is_stored_nowhere(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """Issue 27: the key echoed in normal replies \\u-escaped (whole, or mixed with plain
    characters, hex digits in either case) or as hex (either case) reaches neither the Redis
    values, the SQLite rows nor any workspace file (the raw form was already masked)."""
    secret = SECRET

    def forms(key: str) -> str:
        every = "".join(f"\\u{ord(c):04x}" for c in key)
        mixed = "".join(f"\\u{ord(c):04X}" if i % 2 else c for i, c in enumerate(key))
        return f" (signed {every}, {mixed}, {key.encode().hex()}, {key.encode().hex().upper()})"

    chat_server.echo = lambda auth: forms(auth.split()[-1])
    ws = make_ws(tmp_path / "ws", chat_server)
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    backend = llm_backend(ws, RunOptions(concurrency=8), cache=cache, api_key=secret, env={},
                          retry=FAST)

    asyncio.run(step_ocr(ws, backend))
    rows = [r for table in ("traces", "baseline_cache", "predictions")
            for r in ws.log.query(f"SELECT * FROM {table}")]
    ws.close()
    assert chat_server.auth[-1] == f"Bearer {secret}"
    assert any("signed ***, ***, ***, ***" in str(r) for r in rows)  # echoed, then masked
    assert not [r for r in rows if _gives_away(repr(r).encode(), secret)]
    r = redis_target.sync_client()
    try:
        values = [r.get(k) for k in r.scan_iter(match=redis_target.pattern)
                  if r.type(k) == b"string"]
    finally:
        r.close()
    assert values and not [v for v in values if _gives_away(v, secret)]
    files = [p for p in (tmp_path / "ws").rglob("*") if p.is_file()]
    assert not [p for p in files if _gives_away(p.read_bytes(), secret)]


def test_the_run_header_is_bounded_and_still_tells_runs_apart() -> None:
    """X-Vtrm-Run carries the run id %-encoded; a huge one (a type named by a paragraph) is
    cut to RUN_HEADER_MAX with a digest, between characters (never inside one's escapes)."""
    from urllib.parse import unquote

    from vtrm_gate.cache import RUN_HEADER, run_header
    from vtrm_gate.cache._keys import RUN_HEADER_MAX

    assert run_header("") == {}
    assert run_header("e1_s1_gate_ocr_base") == {RUN_HEADER: "e1_s1_gate_ocr_base"}
    assert unquote(run_header("a/b c\nd:é")[RUN_HEADER]) == "a/b c\nd:é"
    assert "\n" not in run_header("a\r\nX-Injected: 1")[RUN_HEADER]
    for filler in ("x", "é", "xé", "xxé"):  # escapes land on every offset of the cut
        a, b = (run_header(f"e1_s1_gate_{filler * 400}_{arm}")[RUN_HEADER]
                for arm in ("base", "cand"))
        assert a != b and len(a) <= RUN_HEADER_MAX and len(b) <= RUN_HEADER_MAX
        head = unquote(a.rsplit("~", 1)[0], errors="strict")
        assert f"e1_s1_gate_{filler * 400}".startswith(head) and len(head) > 40
        a.encode("ascii")  # a header value
