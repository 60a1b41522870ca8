"""Is the evolver's reply a skill worth gating? One pure check, run before any gate call.

A gate costs tens to hundreds of calls and a rejection costs the type its cooldown, so a
reply that is plainly not a new skill never reaches it: `candidate_problem` names the
reason (the step records the type ``skipped`` with it, charging no cooldown) or returns
None. The rules, in order:

- empty (whitespace only);
- not Unicode text (a lone surrogate, from an evolver of the researcher's own): it could
  not be written to the candidate's file;
- over `MAX_SKILL_CHARS`: the skill is sent with every call, so past this it would crowd
  out the question in most served models' context;
- identical to the current skill, or to a rejected candidate (whitespace at the ends
  ignored);
- a chat reply, not a skill: an answer to a question (a bare option letter, "The correct
  option is B.", "Answer: C"), a reply that opens with a greeting or a refusal and has no
  Markdown structure (no heading, no list), or one line of text where the current skill
  has `MIN_LINES_KEPT` lines or more (a skill file is a document; every canned reply of a
  mock server is one line);
- far shorter than the current skill: under `MIN_SHARE_KEPT` of its length once the current
  skill is over `SHORT_RULE_FROM` characters. An evolver edits: it keeps what works and
  adds or rewrites rules, so a candidate that drops three quarters of a substantial skill
  is a summary, a fragment or a cut-off reply. Below that size (a heading and a few lines,
  like the default skills) a full rewrite may well be shorter, so the rule stays off.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .._ids import lone_surrogate

MAX_SKILL_CHARS = 32_000
"""The size cap: about 8,000 tokens, past the whole context of many served models."""
MIN_SHARE_KEPT = 0.25
"""A candidate shorter than this share of a substantial current skill is not gated."""
SHORT_RULE_FROM = 400
"""The far-shorter rule applies once the current skill is over this many characters."""
MIN_LINES_KEPT = 3
"""A one-line candidate is a reply, not a skill, when the current skill has this many lines."""

_LETTER = r"\(?\*{0,2}[A-Z]\*{0,2}\)?"
_ANSWER = re.compile(
    rf"(?:(?:the\s+)?(?:correct|right|best|final)?\s*(?:answer|option|choice)\s*"
    rf"(?:is|would\s+be|:)?\s*|i\s+(?:would\s+)?(?:choose|pick|select)\s+(?:option\s+)?)?"
    rf"{_LETTER}(?:[.):]\s*.{{0,80}})?[.!]?", re.IGNORECASE)
_OPENER = re.compile(
    r"(?:hello|hi|hey|greetings|good\s+(?:morning|afternoon|evening)|sure|certainly|"
    r"of\s+course|okay|ok|thanks|thank\s+you|sorry|i'?m\s+sorry|i\s+apologi[sz]e|"
    r"as\s+an\s+ai|i\s+can(?:not|'t)|i\s+am\s+unable)\b", re.IGNORECASE)
_STRUCTURE = re.compile(r"^[ \t]*(?:#{1,6}\s|[-*+]\s|\d+[.)]\s|```|>)", re.MULTILINE)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _chat_reply(cand: str, current: str) -> str | None:
    """Why ``cand`` reads as a chat reply rather than a skill file, or None."""
    lines = _lines(cand)
    first = " ".join(lines[0].split())  # one space per run: the patterns' adjacent \s* made
    if len(lines) == 1 and _ANSWER.fullmatch(first):  # a run of spaces quadratic
        return f"an answer to a question ({_shown(cand)}), not a skill"
    if _OPENER.match(first) and not _STRUCTURE.search(cand):
        return f"a chat reply ({_shown(cand)}), not a skill"
    n = len(_lines(current))
    if len(lines) == 1 and n >= MIN_LINES_KEPT:
        return (f"one line of text ({_shown(cand)}) where the current skill has {n} lines: "
                f"a chat reply, not a skill")
    return None


def candidate_problem(candidate: str, current: str, rejected: Sequence[str] = ()) -> str | None:
    """Why ``candidate`` (the evolver's proposed skill text) must not be gated against
    ``current`` given the type's ``rejected`` buffer, or None when it may be (module doc)."""
    cand, cur = candidate.strip(), current.strip()
    if not cand:
        return "empty candidate"
    if (bad := lone_surrogate(cand)) is not None:  # files, SQLite and every cand request
        return (f"not Unicode text: a lone surrogate "
                f"{bad.group().encode('unicode_escape').decode()} at character {bad.start()}")
    if len(cand) > MAX_SKILL_CHARS:
        return (f"over the size cap: {len(cand):,} characters > {MAX_SKILL_CHARS:,} "
                f"(MAX_SKILL_CHARS)")
    if cand == cur:
        return "no real change"
    if cand in {r.strip() for r in rejected}:
        return "repeats a rejected candidate"
    why = _chat_reply(cand, cur)
    if why is not None:
        return why
    if len(cur) > SHORT_RULE_FROM and len(cand) < MIN_SHARE_KEPT * len(cur):
        return (f"far shorter than the current skill: {len(cand):,} characters, under "
                f"{MIN_SHARE_KEPT:.0%} of its {len(cur):,}")
    return None
