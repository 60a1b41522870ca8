"""The evolver's reply is checked before any gate call (issue 26 #3): a candidate that is no
skill to gate (empty, unchanged, a rejected one, a chat reply, far too short, over the cap) is
``skipped`` with the reason, costs no gate call and charges no cooldown; the simulated
evolver's candidates all pass, so seeded simulated runs are unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from test_harness_toy import ToyEvolver, ToyInfer, cases_first, make_workspace

from vtrm_gate.harness import MAX_SKILL_CHARS, candidate_problem, run_step_sync
from vtrm_gate.harness._candidate import MIN_SHARE_KEPT, SHORT_RULE_FROM
from vtrm_gate.llm import default_llm_skill
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import SimConfig, SimEvolver, SimWorld

SKILL = default_llm_skill("Counting Problem")  # 6 lines, under SHORT_RULE_FROM characters
LONG = SKILL + "".join(f"- Rule {i}: count each object class on its own, then sum.\n"
                       for i in range(12))


@pytest.mark.parametrize(("reply", "reason"), [
    ("", "empty candidate"),
    ("  \n\t\n", "empty candidate"),
    ("x" * (MAX_SKILL_CHARS + 1), "over the size cap"),
    (SKILL + "\n\n", "no real change"),
    ("# rejected once\n- ramble\n", "repeats a rejected candidate"),
    ("The correct option is B.", "an answer to a question"),  # LiteLLM's mock_response
    ("B", "an answer to a question"),
    ("(C)", "an answer to a question"),
    ("Answer: D", "an answer to a question"),
    ("I would choose option A.", "an answer to a question"),
    ("Hello! LLMock handled this request for gpt-4o-mini.", "a chat reply"),  # llmock
    ("Sure! Glad to help.\n\nLet me know if you need more.", "a chat reply"),
    ("Simulated success from gpt-4o-mini.", "one line of text"),
])
def test_a_reply_that_is_no_skill_is_named(reply: str, reason: str) -> None:
    why = candidate_problem(reply, SKILL, ["# rejected once\n- ramble"])
    assert why is not None and why.startswith(reason), why


def test_far_shorter_applies_only_to_a_substantial_skill() -> None:
    assert len(SKILL) <= SHORT_RULE_FROM < len(LONG)
    short = "# Counting\n\nCount.\n- Twice.\n"
    assert len(short) < MIN_SHARE_KEPT * len(LONG)
    why = candidate_problem(short, LONG)
    assert why is not None and why.startswith("far shorter than the current skill"), why
    assert f"of its {len(LONG.strip()):,}" in why
    assert candidate_problem(short, SKILL) is None  # a short skill may be rewritten shorter
    kept = LONG[: int(len(LONG) * 0.3)] + "\n- new rule\n"  # 30%: an edit, gated
    assert candidate_problem(kept, LONG) is None


def test_real_edits_pass() -> None:
    assert candidate_problem(SKILL + "- Count twice before answering.\n", SKILL) is None
    # a rewrite with a chat preamble but a skill's structure is still a skill
    assert candidate_problem("Sure, here it is:\n\n# Counting\n- Count twice.\n", SKILL) is None
    # one line is fine where the current skill is one line too
    assert candidate_problem("Count every object twice.", "Count every object.") is None


def test_every_simulated_candidate_passes_so_seeded_runs_are_unchanged() -> None:
    """5 seeds x 12 types x 6 chained steps: each SimEvolver proposal is gated exactly as
    before (only an unchanged text, the simulator's no-change draw, is refused)."""
    seen = 0
    for seed in range(5):
        world = SimWorld(SimConfig(seed=seed))
        ev = SimEvolver(world)
        for t in world.task_types:
            current, rejected = world.initial_skill(t), []
            for s in range(1, 7):
                cand = ev.propose(t, current, rejected, 1, s)
                why = candidate_problem(cand, current, rejected)
                assert why == ("no real change" if cand == current else None), (seed, t, s)
                seen += cand != current
                if s % 2:
                    rejected.append(cand)
                else:
                    current = cand
    assert seen > 300


class ChattyEvolver(ToyEvolver):
    """The toy evolver, but ``replies[type]`` comes back for those types (a chat model)."""

    def __init__(self, delta: dict[str, int], replies: dict[str, str]) -> None:
        super().__init__(delta)
        self.replies = replies

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str:
        out = await super().evolve(task_type, current_skill, rejected, epoch, step)
        return self.replies.get(task_type, out)


def test_a_chat_reply_is_skipped_with_its_reason_no_gate_call_and_no_cooldown(
        tmp_path: Path) -> None:
    sizes = {"Action Reasoning": 40, "Counting Problem": 40, "OCR Problems": 40}
    ws = make_workspace(tmp_path / "ws", sizes, cooldown_steps=2)
    infer = ToyInfer()
    evolver = ChattyEvolver({t: 3 for t in sizes},
                            {"Counting Problem": "The correct option is B.",
                             "OCR Problems": "Hello! LLMock handled this request for m."})
    res = run_step_sync(ws, 1, 1, infer=infer, evolver=evolver, cases=cases_first(sizes),
                        options=RunOptions(concurrency=8))
    st = res.types
    assert st["Action Reasoning"].status == "gated"
    for t, said in (("Counting Problem", "an answer to a question"),
                    ("OCR Problems", "a chat reply")):
        assert st[t].status == "skipped" and st[t].note.startswith(said), st[t].note
        assert st[t].cand_hash is None and st[t].ladder == ()
        assert not [c for c in infer.calls if c.task_type == t]  # zero gate calls
    assert {c.task_type for c in infer.calls} == {"Action Reasoning"}
    assert ws.state.cooldown_until.get("Counting Problem", 0) == 0
    assert ws.state.cooldown_until.get("OCR Problems", 0) == 0
    rows = dict(ws.log.query("SELECT task_type, note FROM step_report WHERE status = "
                             "'skipped'"))
    assert rows["Counting Problem"].startswith("an answer to a question ('The correct")


def test_a_candidate_that_is_no_unicode_text_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """Hostile pass: any evolver (a researcher's own in Python, not only the built-in one,
    whose replies read a lone surrogate as U+FFFD) may return a lone surrogate; the step
    died in Phase B writing the candidate (UnicodeEncodeError) after every type evolved."""
    assert candidate_problem(SKILL + "- count twice \ud800\n", SKILL) == (
        f"not Unicode text: a lone surrogate \\ud800 at character {len(SKILL) + 14}")
    sizes = {"Action Reasoning": 40, "Counting Problem": 40}
    ws = make_workspace(tmp_path / "ws", sizes)
    evolver = ChattyEvolver({t: 3 for t in sizes}, {"Counting Problem": SKILL + "- x \udfff\n"})
    res = run_step_sync(ws, 1, 1, infer=ToyInfer(), evolver=evolver,
                        cases=cases_first(sizes), options=RunOptions(concurrency=8))
    st = res.types
    assert st["Action Reasoning"].status == "gated"
    assert st["Counting Problem"].status == "skipped"
    assert st["Counting Problem"].note.startswith("not Unicode text: a lone surrogate \\udfff")


def test_a_line_of_spaces_is_judged_in_linear_time() -> None:
    """Hostile pass: the answer pattern's adjacent optional spaces made one line of
    "answer" + spaces quadratic (8,000 spaces: 1.8 s; at the 32,000-character cap about
    30 s, on the event loop, in Phase A), and the structure pattern's ``^\\s*`` a greeting
    over blank lines (16,000 of them: 13.7 s). Judged past the cap here (300,000
    characters), in a subprocess so a regression fails by its timeout."""
    import subprocess
    import sys

    code = ("from vtrm_gate.harness._candidate import _chat_reply\n"
            "cur = '# S\\n- a\\n- b\\n- c\\n'\n"
            "assert _chat_reply('answer' + ' ' * 300_000 + '!!', cur).startswith('one line')\n"
            "assert _chat_reply('The answer is' + ' ' * 300_000 + 'B.', cur).startswith("
            "'an answer')\n"
            "assert _chat_reply('hello' + ' ' * 300_000 + 'there', cur).startswith('a chat')\n"
            "assert _chat_reply('hello\\n' + ' \\n' * 150_000 + 'y', cur).startswith('a chat')\n"
            "assert _chat_reply('hello\\n' + ' \\n' * 150_000 + '- y', cur) is None\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


class LoneSurrogateEvolver(ToyEvolver):
    """An evolver of the researcher's own whose failure quotes a model's broken text."""

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str:
        if task_type == "Counting Problem":
            raise ValueError("the model said \ud800 nonsense")
        return await super().evolve(task_type, current_skill, rejected, epoch, step)


def test_an_evolver_failure_quoting_a_lone_surrogate_is_noted_not_a_crash(
        tmp_path: Path) -> None:
    """Hostile pass: the failure's message became the type's note, and writing the step's
    manifest (JSON) stopped the step with UnicodeEncodeError."""
    sizes = {"Action Reasoning": 40, "Counting Problem": 40}
    ws = make_workspace(tmp_path / "ws", sizes)
    res = run_step_sync(ws, 1, 1, infer=ToyInfer(), evolver=LoneSurrogateEvolver(
        {t: 3 for t in sizes}), cases=cases_first(sizes), options=RunOptions(concurrency=8))
    assert res.types["Action Reasoning"].status == "gated"
    assert res.types["Counting Problem"].status == "evolve_error"
    assert res.types["Counting Problem"].note == "ValueError: the model said \ufffd nonsense"
    assert "\\ud800" not in (ws.root / "manifests" / "e1_s1.json").read_text()
