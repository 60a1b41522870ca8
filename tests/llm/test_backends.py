"""The real path: an ``llm`` workspace answered by an OpenAI-compatible chat model through the
Redis response cache, the LLM evolver and rollout cases, from Python and from the CLI.

The chat server (`vtrm_gate.testing.chat`) answers "A" unless the skill holds the marker
``strategy: longest``, then the longest option; the units' right answer is their longest
option, so a candidate with the marker (the server's default evolution reply) is helpful.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate import slugify
from vtrm_gate.cache import KeyParts, ResponseCache
from vtrm_gate.errors import EndpointUnreachableError
from vtrm_gate.harness import (
    StepResult,
    StepUnmeasuredError,
    Workspace,
    WorkspaceConfig,
    WorkspaceError,
    run_step,
)
from vtrm_gate.llm import (
    MCQ,
    ROLLOUT_UNITS,
    ErrorCase,
    LLMAgent,
    LLMBackend,
    LLMEvolver,
    RetryPolicy,
    check_endpoint,
    check_llm_agent,
    init_llm,
    llm_backend,
    rollout_cases,
    strip_fences,
)
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import init_simulated
from vtrm_gate.stats import Action
from vtrm_gate.testing import ChatServer, Fault, RedisTarget
from vtrm_gate.testing.chat import HELPFUL_MARKER

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-test-DO-NOT-LEAK-4b1d"
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, max_total_s=10.0)
LONG = "the longest option, by a clear margin"

# type -> (pool size, position of the right answer for unit i)
TYPES: dict[str, tuple[int, Any]] = {
    "Action Reasoning": (30, lambda i: i % 4),        # base right only where the answer is A
    "Counting Problem": (12, lambda i: 1 + i % 3),    # base always wrong
    "OCR Problems": (9, lambda i: 0),                 # base always right: no cases
    "Object Recognition": (10, lambda i: 2),          # the evolver proposes no change
}


def unit_line(task_type: str, i: int, pos: int) -> dict[str, Any]:
    options = [f"opt {k}" for k in range(4)]
    options[pos] = LONG
    return {"unit_id": f"{task_type.split()[0].lower()}-{i:02d}", "task_type": task_type,
            "question": f"{task_type} question {i}: what happens in the clip?",
            "options": options, "answer": "ABCD"[pos], "video_id": f"v{i}"}


def write_units(path: Path) -> Path:
    lines = [json.dumps(unit_line(t, i, pos(i))) for t, (n, pos) in TYPES.items()
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def evolve_reply(task_type: str, skill: str, body: dict[str, Any]) -> str:
    if task_type == "Object Recognition":
        return skill  # no real change
    return f"```markdown\n{skill.rstrip()}\n- {HELPFUL_MARKER}\n```"


def make_ws(tmp_path: Path, server: ChatServer, **kw: Any) -> Workspace:
    server.evolve_reply = evolve_reply
    return init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                              base_url=server.url, model="test-model", seed=1, **kw)


def step_once(ws: Workspace, target: RedisTarget, epoch: int = 1,
              step: int = 1) -> tuple[StepResult, ResponseCache]:
    """One LLM step through a fresh backend (fresh cache counters) on the test's prefix."""
    cache = ResponseCache(target.url, prefix=target.prefix)
    # every gate task dispatched at once and every call finishing (none cancelled past a
    # stop): the calls made, all cached, do not depend on timing. Round-robin starts them all
    # in microseconds, before any answer can freeze a type; the default's first scores (a
    # search per ladder length) take milliseconds, so an early answer could freeze a type
    # before its last units start, and the re-run would start those (a re-run pays for units
    # the first run never started). Fixed caps, not adaptive ones: an adaptive endpoint
    # admits 2 calls at first, so the same race would decide what starts.
    options = RunOptions(concurrency=256, past_stop="wait", cancel_after_freeze=False,
                         dispatch="round_robin", adaptive=False)
    backend = llm_backend(ws, options, cache=cache, api_key=SECRET, env={}, retry=FAST)

    async def go() -> StepResult:
        try:
            cases = await rollout_cases(backend, ws, epoch, step)
            return await run_step(ws, epoch, step, infer=backend.infer,
                                  evolver=backend.evolver, cases=cases,
                                  cache_stats=backend.cache_stats, options=options)
        finally:
            await backend.aclose()

    return asyncio.run(go()), cache


def report(ws: Workspace, epoch: int = 1, step: int = 1) -> dict[str, dict[str, Any]]:
    rows = ws.log.query("SELECT task_type, status, action, llm_cache FROM step_report WHERE "
                        "epoch = ? AND step = ?", (epoch, step))
    return {t: {"status": s, "action": a, "llm_cache": json.loads(c) if c else None}
            for t, s, a, c in rows}


# ---- the workspace --------------------------------------------------------------------


def test_init_llm_builds_pool_skills_and_agent_config(tmp_path: Path) -> None:
    src = write_units(tmp_path / "units.jsonl")
    ws = init_llm(tmp_path / "ws", src, base_url="http://localhost:8000/v1/",
                            model="m1", seed=5, cooldown_steps=1)
    assert ws.config.kind == "llm" and ws.config.seed == 5 and ws.config.cooldown_steps == 1
    assert ws.config.agent == {"backend": "openai", "base_url": "http://localhost:8000/v1",
                               "model": "m1", "think": True, "temperature": 0.0}
    assert {t: len(us) for t, us in ws.pool.items()} == {t: n for t, (n, _) in TYPES.items()}
    assert ws.pool["OCR Problems"][:2] == ("ocr-00", "ocr-01")  # file order
    assert (ws.root / "units.jsonl").read_bytes() == src.read_bytes()
    assert ws.units["action-01"].answer == "B" and ws.seed_record == {}
    assert "Counting Problem" in ws.skill_text("Counting Problem")
    again = Workspace.open(ws.root)
    assert again.units == ws.units and again.config == ws.config


def test_init_llm_takes_skills_dir_and_seed_record(tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    skills.mkdir()
    for t in TYPES:
        slug = t.lower().replace(" ", "-")
        (skills / f"{slug}.md").write_text(f"# my {t} skill\n")
    (skills / "default-strategy.md").write_text("# mine\n")
    (tmp_path / "seed.json").write_text(json.dumps({"action-01": False, "ocr-00": True}))
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                            base_url="http://h/v1", model="m", skills_dir=skills,
                            seed_record=tmp_path / "seed.json")
    assert ws.skill_text("OCR Problems") == "# my OCR Problems skill\n"
    assert ws.default_strategy() == "# mine\n"
    assert ws.seed_record == {"Action Reasoning": {"action-01": False},
                              "OCR Problems": {"ocr-00": True}}


def test_a_missing_skill_in_skills_dir_is_named_and_nothing_written(tmp_path: Path) -> None:
    (tmp_path / "skills").mkdir()
    with pytest.raises(WorkspaceError, match=r"action-reasoning\.md: missing"):
        init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                           base_url="http://h/v1", model="m", skills_dir=tmp_path / "skills")
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("line, fault", [
    ("{not json", "malformed JSON"),
    (json.dumps({"unit_id": "x", "task_type": "T", "question": "q", "options": ["a", "b"]}),
     "missing keys ['answer']"),
    (json.dumps({"unit_id": "x", "task_type": "T", "question": "q", "options": ["a", "b"],
                 "answer": "C"}), "answer must be one letter of 'AB'"),
    (json.dumps({"unit_id": "x", "task_type": "T", "question": "q", "options": "ab",
                 "answer": "A"}), "options must be a list"),
    (json.dumps(unit_line("OCR Problems", 0, 0)), "duplicate unit_id 'ocr-00'"),
    # the answer's text twice: no reply can tell the right option from its twin
    (json.dumps({"unit_id": "x", "task_type": "T", "question": "q",
                 "options": ["two", "three", " Two ", "four"], "answer": "C"}),
     "option C, the answer, has the text of option A"),
    (json.dumps(unit_line("OCR Problems", 0, 1))[:-1] + ', "answer": "B"}',
     "duplicate key 'answer'"),  # which answer is the truth? Refused, not the last
])
def test_a_bad_units_line_is_named_and_nothing_written(tmp_path: Path, line: str,
                                                       fault: str) -> None:
    good = json.dumps(unit_line("OCR Problems", 0, 0))
    (tmp_path / "units.jsonl").write_text(f"{good}\n\n{line}\n")
    with pytest.raises(WorkspaceError, match=r"units\.jsonl: line 3: ") as err:
        init_llm(tmp_path / "ws", tmp_path / "units.jsonl", base_url="http://h/v1",
                           model="m")
    assert fault in str(err.value)
    assert not (tmp_path / "ws").exists()


def test_a_skill_file_named_by_its_type_is_pointed_to_its_slug_name(tmp_path: Path) -> None:
    """A researcher names a type's skill file as the type ("OCR Problems.md"): init said
    only that "ocr-problems.md" is missing, not why the file beside it was not taken."""
    units = write_units(tmp_path / "units.jsonl")
    skills = tmp_path / "skills"
    skills.mkdir()
    for t in TYPES:
        (skills / f"{slugify(t)}.md").write_text(f"Skill for {t}.\n")
    (skills / "ocr-problems.md").rename(skills / "OCR Problems.md")
    with pytest.raises(WorkspaceError) as err:
        init_llm(tmp_path / "ws", units, base_url="http://h/v1", model="m", skills_dir=skills)
    assert str(err.value) == (f"{skills / 'ocr-problems.md'}: missing skill file ({skills} "
                              f"holds 'OCR Problems.md': a type's skill file is named by its "
                              f"slug, ocr-problems.md)")
    assert not (tmp_path / "ws").exists()


def test_a_units_file_that_opens_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Windows editors (Notepad before 2019, Excel's "UTF-8 CSV") save UTF-8 with a byte
    order mark: init refused such a file ("Unexpected UTF-8 BOM"), and a workspace whose
    units file gained one could not be opened."""
    src = write_units(tmp_path / "units.jsonl")
    plain = init_llm(tmp_path / "plain", src, base_url="http://h/v1", model="m")
    src.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    ws = init_llm(tmp_path / "ws", src, base_url="http://h/v1", model="m")
    assert ws.units == plain.units and ws.pool == plain.pool
    ws.close()
    plain.close()
    assert (tmp_path / "ws" / "units.jsonl").read_bytes() == \
        (tmp_path / "plain" / "units.jsonl").read_bytes()  # the copy drops the mark
    copy = tmp_path / "ws" / "units.jsonl"
    copy.write_bytes(b"\xef\xbb\xbf" + copy.read_bytes())  # saved again in such an editor
    reopened = Workspace.open(tmp_path / "ws")
    assert reopened.units == plain.units
    reopened.close()


@pytest.mark.parametrize("text", [
    "[{\"unit_id\": \"x\"}]\n", "[\n  {\"unit_id\": \"x\"}\n]\n",
    "{\n  \"unit_id\": \"x\"\n}\n"])
def test_a_units_file_in_json_not_json_lines_is_named_as_such(tmp_path: Path,
                                                             text: str) -> None:
    """A JSON array, or objects spread over lines (``json.dump(..., indent=2)``), said only
    "expected a JSON object, got list" or "malformed JSON at column 2"."""
    (tmp_path / "units.jsonl").write_text(text)
    with pytest.raises(WorkspaceError, match=r"units\.jsonl: line 1: ") as err:
        init_llm(tmp_path / "ws", tmp_path / "units.jsonl", base_url="http://h/v1",
                 model="m")
    assert "JSON lines: one unit's object on each line" in str(err.value), err.value


def test_open_validates_the_workspace_units_file(tmp_path: Path) -> None:
    src = write_units(tmp_path / "units.jsonl")
    root = init_llm(tmp_path / "ws", src, base_url="http://h/v1", model="m").root
    lines = (root / "units.jsonl").read_text().splitlines()
    (root / "units.jsonl").write_text("\n".join([*lines[:4], "[1, 2]", *lines[5:]]))
    with pytest.raises(WorkspaceError, match=r"^units.jsonl: line 5: expected a JSON object"):
        Workspace.open(root)
    (root / "units.jsonl").write_text("\n".join(lines[1:]))
    with pytest.raises(WorkspaceError, match=r"pool\.json: unit 'action-00'.* is not in "
                                             r"units\.jsonl"):
        Workspace.open(root)


def test_llm_agent_config_never_holds_a_key_and_keys_the_baseline_cache() -> None:
    agent = {"backend": "openai", "base_url": "https://api.example/v1", "model": "m1"}
    with pytest.raises(ValueError, match="credentials"):
        WorkspaceConfig(kind="llm", agent={**agent, "api_key": "sk-x"})
    with pytest.raises(ValueError, match="credentials"):
        check_llm_agent({**agent, "api_key": "sk-x"})
    with pytest.raises(ValueError, match=r"agent\.model"):
        check_llm_agent({**agent, "model": ""})
    with pytest.raises(ValueError, match=r"agent\.backend"):
        check_llm_agent({**agent, "backend": "sim"})
    one = WorkspaceConfig(kind="llm", agent=agent).agent_hash
    assert WorkspaceConfig(kind="llm", agent={**agent, "model": "m2"}).agent_hash != one


def test_default_cache_is_the_embedded_redis_inside_the_workspace(tmp_path: Path) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                            base_url="http://h/v1", model="m")
    backend = llm_backend(ws, RunOptions(), env={})
    assert isinstance(backend, LLMBackend)
    assert backend.cache.url is None and backend.cache.workspace == ws.root  # not started yet
    assert backend.cache_stats == backend.cache.stats and backend.infer is backend.agent
    with pytest.raises(WorkspaceError, match="not an llm workspace"):
        llm_backend(init_simulated(tmp_path / "sim"))


# ---- evolver pieces -------------------------------------------------------------------


@pytest.mark.parametrize("reply, text", [
    ("```markdown\n# Skill\n- a\n```", "# Skill\n- a"),
    ("```\n# Skill\n```", "# Skill"),
    ("Here it is:\n```md\n# Skill\n```\nGood luck.", "# Skill"),
    ("# Skill\n- plain", "# Skill\n- plain"),
    ("```python  \n# Skill\n  \n  ```", "# Skill"),  # a language tag, trailing spaces
    ("```\n# A\n```\n```\n# B\n```", "```\n# A\n```\n```\n# B\n```"),  # two blocks
    (TWO_MD := "```markdown\n# A\n```\ntext\n```md\n# B\n```", TWO_MD),
    ("Before\n```MD\n# Skill\n- x   \n```", "# Skill\n- x"),  # case-blind tag
    ("```markdown\n# Skill with ``` inside\n```", "# Skill with"),
    ("```markdown\n# Unclosed", "```markdown\n# Unclosed"),
    ("```markdown # not a tag line\n# S\n```", "```markdown # not a tag line\n# S\n```"),
    ("<think>weigh it</think>\n```md\n# S\n```", "# S"),
    ("```\n```", ""),
])
def test_strip_fences(reply: str, text: str) -> None:
    assert strip_fences(reply) == text


def test_evolver_prompt_holds_skill_cases_and_rejected_buffer() -> None:
    async def none(*_: Any) -> list[ErrorCase]:
        return []

    ev = LLMEvolver(LLMAgent({}, base_url="http://127.0.0.1:9/v1", model="m"), none)
    case = ErrorCase("u1", MCQ("What moves?", ("a cat", "a dog"), "B"), "A")
    user = ev.messages("OCR", "# current", [case], ["# old one", "# old two"])[1]["content"]
    assert "<current_skill>\n# current\n</current_skill>" in user
    assert "What moves?" in user and "B. a dog" in user
    assert "Agent answered: A. Correct answer: B." in user
    assert "# old one" in user and "# old two" in user and "rejected" in user
    assert LLMEvolver.run_id("OCR Problems", 2, 3) == "e2_s3_evolve_ocr-problems"


def test_rollout_batch_is_seeded_by_step_and_cases_need_a_rollout(
        tmp_path: Path, chat_server: ChatServer) -> None:
    ws = make_ws(tmp_path, chat_server)
    b = llm_backend(ws, RunOptions(), cache=ResponseCache(enabled=False), env={})
    t = "Action Reasoning"
    first = b.rollout.batch(t, 1, 1)
    assert len(first) == ROLLOUT_UNITS and first == b.rollout.batch(t, 1, 1)
    assert first != b.rollout.batch(t, 1, 2) and set(first) <= set(ws.pool[t])
    assert len(b.rollout.batch("OCR Problems", 1, 1)) == 8
    with pytest.raises(RuntimeError, match="rollout_cases"):
        b.cases(t, 1, 1, ws.skill_text(t))


# ---- a full step, from Python ---------------------------------------------------------


def test_llm_step_end_to_end(tmp_path: Path, chat_server: ChatServer,
                             redis_target: RedisTarget) -> None:
    ws = make_ws(tmp_path, chat_server)
    res, cache = step_once(ws, redis_target)
    st = res.types
    assert {t: s.status for t, s in st.items()} == {
        "Action Reasoning": "gated", "Counting Problem": "gated", "OCR Problems": "no_cases",
        "Object Recognition": "skipped"}
    # the evolver was called once per type with cases, and saw them
    evolved = {r["messages"][1]["content"].splitlines()[0]: r["messages"][1]["content"]
               for r in chat_server.of_step("evolve")}
    assert sorted(evolved) == ["Question type: Action Reasoning",
                               "Question type: Counting Problem",
                               "Question type: Object Recognition"]
    counting = evolved["Question type: Counting Problem"]
    assert counting.count("<error_case") == len(st["Counting Problem"].cases) == 8
    assert "Agent answered: A." in counting
    assert all(r == f"Bearer {SECRET}" for r in chat_server.auth)
    # cases come from the rollout and never reach the ladder
    for t in ("Action Reasoning", "Counting Problem"):
        assert st[t].cases and not set(st[t].cases) & set(st[t].ladder)
    assert res.decisions == {"Action Reasoning": Action.ACCEPT,
                             "Counting Problem": Action.PROVISIONAL}
    assert res.versions["Action Reasoning"] == 2
    assert HELPFUL_MARKER in ws.skill_text("Action Reasoning")
    rep = report(ws)
    for t in ("Action Reasoning", "Counting Problem"):
        arms = rep[t]["llm_cache"]
        assert set(arms) == {"base", "cand"}
        assert arms["cand"]["misses"] > 0 and arms["cand"]["hits"] == 0
        assert arms["base"]["calls"] == arms["base"]["misses"] > 0  # fresh base arm
    assert cache.stats("e1_s1_rollout_ocr-problems").misses == 2 * 8  # think + answer
    assert cache.stats("e1_s1_evolve_counting-problem").misses == 1


def test_rerunning_an_llm_step_makes_zero_requests(tmp_path: Path, chat_server: ChatServer,
                                                   redis_target: RedisTarget) -> None:
    ws = make_ws(tmp_path, chat_server)
    first, _ = step_once(ws, redis_target)
    n = len(chat_server.requests)
    again, cache = step_once(ws, redis_target)
    assert len(chat_server.requests) == n  # rollout, evolution, gate: all replayed
    assert again.rerun_of_applied and again.reused_candidates
    assert again.decisions == first.decisions and again.versions == first.versions
    assert {t: s.ladder for t, s in again.types.items()} == \
        {t: s.ladder for t, s in first.types.items()}
    assert again.gate is not None and again.gate.tokens == 0
    for t, row in report(ws).items():
        if row["llm_cache"]:
            cand, base = row["llm_cache"]["cand"], row["llm_cache"]["base"]
            assert cand["hit_rate"] == 1.0 and cand["misses"] == 0, t
            assert base["calls"] == 0, t  # served by the BaselineCache
    assert all(cache.stats(r).misses == 0 for r in cache.runs())


def test_a_failing_evolver_keeps_the_skill_and_the_step_records_evolve_error(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    ws = make_ws(tmp_path, chat_server)
    chat_server.inject(*[Fault(status=503, step="evolve")] * 20)
    state = (ws.root / "state.json").read_bytes()
    # nothing reached the gate and the evolver failed: not applied as if clean
    with pytest.raises(StepUnmeasuredError, match="nothing could be measured"):
        step_once(ws, redis_target)
    rows = ws.log.query("SELECT task_type, status, note FROM step_report")
    assert {t: s for t, s, _ in rows} == {
        "Action Reasoning": "evolve_error", "Counting Problem": "evolve_error",
        "OCR Problems": "no_cases", "Object Recognition": "evolve_error"}
    assert "evolver call for 'Action Reasoning' failed" in dict(
        (t, n) for t, _, n in rows)["Action Reasoning"]
    assert (ws.root / "state.json").read_bytes() == state
    assert not ws.manifest_path(1, 1).exists()
    chat_server.faults.clear()
    res, cache = step_once(ws, redis_target)  # the evolver is back: the step runs as new
    assert res.types["Action Reasoning"].status == "gated"
    assert cache.stats("e1_s1_evolve_action-reasoning").writes == 1


def test_an_unreachable_endpoint_is_detected_before_anything() -> None:
    with pytest.raises(EndpointUnreachableError, match="unreachable"):
        check_endpoint("http://127.0.0.1:9/v1", timeout=2.0)


# ---- the CLI, as a real subprocess ----------------------------------------------------


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
        drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120, env={**base, **(env or {})})


def files_of(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def cli_init(ws: Path, units: Path, server: ChatServer,
             cwd: Path) -> subprocess.CompletedProcess[str]:
    """``vtrm-gate init --llm`` of ``units`` against ``server`` (seed 1); it must succeed."""
    r = cli("init", str(ws), "--llm", "--units", str(units), "--base-url", server.url,
            "--model", "test-model", "--seed", "1", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return r


def cli_env(target: RedisTarget, key: str = SECRET, **extra: str) -> dict[str, str]:
    """The environment of a CLI step on the test's Redis prefix, with API key ``key``."""
    return {"REDIS_URL": target.url, "VTRM_CACHE_PREFIX": target.prefix,
            "OPENAI_API_KEY": key, **extra}


def rerunnable_step(ws: Path) -> tuple[str, ...]:
    """``step e1 s1`` with every task started before any answer (see `step_once`): a
    re-run asks nothing again."""
    return ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
            "--concurrency", "256", "--dispatch", "round_robin", "--past-stop", "wait",
            "--no-cancel-after-freeze", "--no-adaptive")


def test_cli_init_llm_then_step_then_rerun(tmp_path: Path, chat_server: ChatServer,
                                           redis_target: RedisTarget) -> None:
    chat_server.evolve_reply = evolve_reply
    ws = tmp_path / "ws"
    r = cli_init(ws, write_units(tmp_path / "units.jsonl"), chat_server, tmp_path)
    assert "created llm workspace" in r.stdout
    env = cli_env(redis_target)
    step = rerunnable_step(ws)
    r = cli(*step, "--json", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    actions = {t["task_type"]: t["action"] for t in out["types"]}
    assert actions["Action Reasoning"] == "ACCEPT" and actions["OCR Problems"] is None
    runs = out["llm_cache"]["runs"]
    assert "e1_s1_rollout_action-reasoning" in runs and "e1_s1_gate_action-reasoning_cand" \
        in runs
    assert chat_server.auth and set(chat_server.auth) == {f"Bearer {SECRET}"}
    n = len(chat_server.requests)
    r2 = cli(*step, cwd=tmp_path, env=env)
    assert r2.returncode == 0, r2.stderr
    assert len(chat_server.requests) == n  # the re-run is served from Redis + BaselineCache
    assert "hit rate 100.0%" in r2.stdout and "LLM response cache" in r2.stdout
    for text in (r.stdout, r.stderr, r2.stdout, r2.stderr):
        assert SECRET not in text
    assert not any(SECRET.encode() in b for b in files_of(ws).values())


def test_cli_bad_units_file_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    units = tmp_path / "units.jsonl"
    units.write_text(json.dumps(unit_line("OCR Problems", 0, 0)) + "\n{\"unit_id\": 1}\n")
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--base-url",
            "http://h/v1", "--model", "m", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{units}: line 2: missing keys" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "ws").exists()
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(tmp_path / "nope.jsonl"),
            "--base-url", "http://h/v1", "--model", "m", cwd=tmp_path)
    assert r.returncode == 2 and "nope.jsonl: missing" in r.stderr
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(units), cwd=tmp_path)
    assert r.returncode == 2 and "--base-url, --model" in r.stderr


def test_cli_step_refuses_a_corrupt_units_file_or_a_dead_endpoint(tmp_path: Path) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                            base_url="http://127.0.0.1:9/v1", model="m").root
    before = files_of(ws)
    step = ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    r = cli(*step, cwd=tmp_path, env={"OPENAI_API_KEY": SECRET}, drop=("REDIS_URL",))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "http://127.0.0.1:9/v1 is unreachable" in r.stderr and SECRET not in r.stderr
    assert files_of(ws) == before and not (ws / "redis").exists()
    (ws / "units.jsonl").write_text((ws / "units.jsonl").read_text() + "oops\n")
    before = files_of(ws)
    r = cli(*step, cwd=tmp_path, drop=("REDIS_URL",))
    assert r.returncode == 2 and "units.jsonl: line 62: malformed JSON" in r.stderr
    assert files_of(ws) == before


def test_concurrent_first_calls_start_the_embedded_redis_once(tmp_path: Path) -> None:
    parts = [KeyParts("m", "http://h/v1", ({"role": "user", "content": str(k)},))
             for k in range(64)]
    for attempt in range(3):  # the race this guards against does not show every time
        cache = ResponseCache(workspace=tmp_path / str(attempt))

        async def go(cache: ResponseCache = cache) -> None:
            try:
                await asyncio.gather(*(cache.lookup(p) for p in parts))
            finally:
                await cache.aclose()

        try:
            asyncio.run(go())
            assert cache.stats().errors == 0 and cache.url is not None
        finally:
            cache._server.close()  # started by this test: stop it now, not at exit


def test_llm_backend_takes_the_run_options_and_without_them_warns(tmp_path: Path) -> None:
    """Options are resolved once, by the caller; resolving them again inside `llm_backend`
    is deprecated (it still reads ``env``, as before)."""
    import warnings

    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                  base_url="http://h/v1", model="m")
    with pytest.warns(DeprecationWarning, match=r"without options .* vtrm_gate 0\.3\.0"):
        old = llm_backend(ws, env={"VTRM_TIMEOUT": "7"})
    assert old.agent.timeout == 7.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = llm_backend(ws, RunOptions(timeout=7.0), env={})
    assert new.agent.timeout == 7.0 and new.rollout.concurrency == 32
