"""Reading what a chat server sent back: the option a reply chose (`parse_choice`), a reply's
text (content or tool-call arguments), an error body's message, a context overflow.

Real models phrase a choice in many ways ("The correct option is B.", "**Answer:** D",
``{"answer": "B"}``, "B\\n\\nExplanation: ...", "答案是B"); `parse_choice` reads those and
refuses what is ambiguous ("A and B", two option lines) or not a choice at all (the article
"a" inside a sentence). tests/llm/test_parse.py holds the table, real SmolLM2 replies included.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from .._ids import as_unicode
from ..cache import message_text, tool_calls
from ..errors import ContextOverflowError, PromptFilteredError, is_whole

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# A letter as a choice: bracketed, bold, quoted, in code or angle brackets, or bare; group 1
# is the letter. _OPEN and _CLOSE are what may wrap it.
# _OPEN starts only where a run of wrappers starts (the lookbehind): a search then tries
# each run once, not once per character of it.
_OPEN, _CLOSE = r"(?<![\*\(\[`\"“<])[\*\(\[`\"“<]*", r"[\*\)\]`\"”>]*"
_L = _OPEN + r"\b([A-Za-z])\b(?![-'’])"
# Statements that name the answer (strong), then mentions of an option (weaker).
_STATEMENTS = (
    re.compile(r"(?i)\b(?:final\s+|correct\s+|right\s+|best\s+|my\s+)?answer\**\s*"
               r"(?:is|would\s+be|must\s+be|should\s+be|will\s+be|[:：=\-–—])\s*\**\s*:?\s*"
               r"(?:option\s+|choice\s+|letter\s+)?" + _L),
    re.compile(r"(?i)\b(?:correct|right|best)\s+(?:option|choice|letter)\s*"
               r"(?:is|would\s+be|must\s+be|[:：=])\s*\**\s*" + _L),
    re.compile(r"(?i)\bI\s*(?:would|'d|will|'ll)?\s*(?:choose|pick|select|go\s+with)\s+"
               r"(?:option\s+|choice\s+)?" + _L),
    re.compile(r"(?i)\bI\s+think\s+(?:it\s+is|it's|the\s+answer\s+is)\s+" + _L),
    re.compile(r"(?i)\b(?:option|choice)\s+" + _L + r"\s*\**\s*(?:is\s+(?:correct|right|"
               r"the\s+(?:answer|correct\s+one|best)))"),
    re.compile(r"(?i)(?:^|[\s>])" + _L + _CLOSE + r"\s+is\s+(?:the\s+)?(?:correct|right|"
               r"best)\b"),
)
# Chinese: the letter sits right against a character ("答案是B"), so the word boundaries
# are ASCII ones (re.ASCII: a CJK character is no word character there).
_CJK_STATEMENTS = tuple(re.compile(p, re.ASCII) for p in (
    r"(?i)(?:正确|正確|最终|最終|最佳)?答案\**\s*(?:应该|應該|应|應)?(?:是|为|為|[:=])?\s*\**\s*"
    r"(?:选项|選項)?\s*" + _L,
    r"(?i)(?:选|選)(?:择|擇)?\s*(?:选项|選項)?\s*" + _L,
    r"(?i)" + _L + r"\s*(?:选项|選項)?\s*(?:是|为|為)?\s*(?:正确|正確|对的|對的)",
))
_MENTIONS = (re.compile(r"(?i)\b(?:option|choice)\s*:?\s*" + _L),
             re.compile(r"(?i)(?:选项|選項)\s*:?\s*" + _L, re.ASCII),
             re.compile(r"(?i)" + _L + r"\s*(?:选项|選項)", re.ASCII))
# A boxed answer, as reasoning models write one: \boxed{B}, \boxed{(B)}, \boxed{\text{B}}.
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?[\(\[]?\s*([A-Za-z])\s*"
                    r"[\)\]]?\s*\}?\s*\}")
# A reasoning model's thinking, inline in the content (no reasoning parser on the server).
_THINK_OPEN = re.compile(r"<(?:think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>", re.IGNORECASE)
# What a reply's text is read as: full-width forms as ASCII (NFKC: "Ｂ" B, "（" "(", "："
# ":"), Chinese full stops and enumeration commas as ASCII ones, and no invisible
# characters (a byte order mark, a zero-width space, NUL).
_CJK_PUNCTUATION = str.maketrans({"。": ".", "、": ","})
# Runs of one character, compacted before any pattern runs: adjacent optional spaces in a
# pattern ("answer\s*\**\s*:?\s*") try every split of a run, so 800 spaces after "answer
# is" took 11 s. A space run reads as one space, blank lines as one, and a punctuation
# character repeated past three as three (what a run means is kept: "B" after 40 "*" is B).
_SPACES = re.compile(r"[^\S\n]+")
_NEWLINES = re.compile(r" ?\n[\n ]*")
_REPEATS = re.compile(r"([^\w\s])\1{3,}")
_INVISIBLE = re.compile("[\u200b-\u200f\u2060-\u2064\ufeff\x00-\x08\x0e-\x1f\x7f]")
# A second letter joined to the first ("A and B", "B, C"); a lower-case "a" followed by a
# word is the article of the option's text ("B, a dog"), not a second letter.
_JOINED = re.compile(r"\s*" + _CLOSE + r"\s*(?:,|/|&|(?i:\band\b|\bor\b)|和|或|与|與|及)\s*"
                     r"(?:(?i:option)\s+|选项|選項)?" + _OPEN
                     + r"\b(?:[A-Z]\b|[a-z]\b(?!\s+[a-z]))", re.ASCII)
_LABEL = re.compile(r"^[\s>#\-]*" + _OPEN + r"([A-Za-z])" + _CLOSE + r"(?:[.):：,]|\s*$|\s*\n)")
_ANSWER_KEYS = ("answer", "letter", "choice", "option", "selected", "final_answer")


def answer_argument(args: Mapping[str, Any]) -> str:
    """What an ``answer`` tool call gave: its ``letter``, else the one argument under an
    answer's name in any case (``answer``, ``Option``...), else its only argument; "" when
    it gave none of these. A server without constrained decoding lets the model name the
    argument as it likes."""
    if "letter" in args:
        named = [args["letter"]]
    else:
        named = [v for k, v in args.items() if str(k).lower() in _ANSWER_KEYS] or \
            (list(args.values()) if len(args) == 1 else [])
    if len(named) != 1:
        return ""
    value = named[0]
    return value if isinstance(value, str) else str(value) if is_whole(value) else ""


def _as_letter(m: re.Match[str], text: str, valid: str) -> str | None:
    """The letter a match captured if it reads as a choice: an upper-case letter, or a
    lower-case one set off as a label ("(b)", "b.", "b" at the end), never the article
    "a" of a running sentence. "" when it is joined to another ("A and B")."""
    letter, end = m.group(1), m.end(1)
    rest = text[end:]
    if letter.islower():
        opened = m.group(0).lstrip().startswith(("(", "[", "*"))
        if not (opened or re.match(r"[\)\]\*.:：]*\s*(?:$|\n|[.)\]:：*,;])", rest)):
            return None
    if _JOINED.match(rest):
        return ""
    up = letter.upper()
    return up if up in valid else ""


def _from_json(text: str, valid: str) -> str | None:
    t = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", t, flags=re.S)
    if fenced:
        t = fenced.group(1)
    if not t.startswith("{"):
        return None
    try:
        doc = json.loads(t)
    except (ValueError, RecursionError):  # nested past the interpreter's limit: no answer
        return None
    if not isinstance(doc, Mapping):
        return None
    values = [doc[k] for k in doc if str(k).lower() in _ANSWER_KEYS]
    if not values:
        values = [v for v in doc.values() if isinstance(v, str) and len(v.strip("() .")) == 1]
    letters = {parse_choice(v, len(valid)) if isinstance(v, str) else None for v in values}
    letters.discard(None)
    return letters.pop() if len(letters) == 1 else ""


def _statements(text: str, patterns: tuple[re.Pattern[str], ...], valid: str) -> str | None:
    """The one letter ``patterns`` name (None: none named; "": several, or an invalid one)."""
    found: set[str] = set()
    for pattern in patterns:
        for m in pattern.finditer(text):
            letter = _as_letter(m, text, valid)
            if letter is not None:
                found.add(letter)
    if not found:
        return None
    return found.pop() if len(found) == 1 else ""


def without_thinking(text: str) -> str:
    """What a reply says after its thinking: the text past the last ``</think>`` (the
    opening tag may be the chat template's), or, when thinking opened and never closed (cut
    at ``max_tokens``), only what came before it."""
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        return text[closes[-1].end():]
    opened = _THINK_OPEN.search(text)
    return text if opened is None else text[:opened.start()]


def _compact(text: str) -> str:
    """``text`` with its runs of one character shortened (`_SPACES`, `_NEWLINES`,
    `_REPEATS`): every pattern then reads it in linear time."""
    text = _NEWLINES.sub(lambda m: "\n\n" if m.group().count("\n") > 1 else "\n",
                         _SPACES.sub(" ", text))
    return _REPEATS.sub(r"\1\1\1", text)


def _boxed(text: str, valid: str) -> str | None:
    """The one letter the reply boxed (None: none boxed; "": several, or an invalid one)."""
    found = {m.group(1).upper() for m in _BOXED.finditer(text)}
    if not found:
        return None
    letter = found.pop() if len(found) == 1 else ""
    return letter if letter in valid else ""


def parse_choice(text: str | None, n_options: int, *,
                 options: Sequence[str] = ()) -> str | None:
    """The option letter a reply chose, or None when it chose none or was ambiguous.

    Full-width forms read as ASCII ("Ｂ", "（B）"), invisible characters are dropped and
    thinking (``<think>...</think>``) is set aside. Then, in order: a JSON object
    (``{"answer": "B"}``, tool-call arguments); a boxed letter (``\\boxed{B}``); a statement
    of the answer ("The answer is (B).", "**Answer:** D", "I would choose C.", "The correct
    option is B.", "答案是B", "我选择C"); a mention of one option ("Option B", "选项B"); a
    reply that starts with a label ("B", "(c)", "B. a dog", "B\\n\\nExplanation ..."); given
    the ``options``, a reply that is one option's whole text ("a dog", not "B"). Two
    different letters at one level, a joined pair ("A and B", "A和B") or a letter past the
    options is None.
    """
    if not text:
        return None
    text = _compact(without_thinking(_INVISIBLE.sub("", unicodedata.normalize(
        "NFKC", text).translate(_CJK_PUNCTUATION))))
    if not text.strip():
        return None
    valid = LETTERS[:n_options]
    for found in (_from_json(text, valid), _boxed(text, valid),
                  _statements(text, _STATEMENTS + _CJK_STATEMENTS, valid),
                  _statements(text, _MENTIONS, valid)):
        if found is not None:
            return found or None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    labels = {m.group(1).upper() for ln in lines if (m := _LABEL.match(ln))}
    m = _LABEL.match(text.strip())
    if m is not None and len(labels) <= 1:  # several: "A. Tokyo\nB. Nairobi", the options
        letter = _as_letter(m, text.strip(), valid)
        if letter is not None:
            return letter or None
    return _option_named(text, options, valid)


def _option_named(text: str, options: Sequence[str], valid: str) -> str | None:
    """The letter of the one option whose text the whole reply is (case, spacing, quotes,
    bold and a closing full stop aside), or None."""
    said = _plain(text)
    named = [LETTERS[i] for i, o in enumerate(options) if _plain(o) == said]
    return named[0] if len(named) == 1 and named[0] in valid else None


def _plain(text: str) -> str:
    """``text`` as compared with an option's: NFKC, case-folded, spacing collapsed, without
    surrounding quotes or bold and a closing full stop."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).strip(
        " *`\"'“”‘’").rstrip(".!。 ")


# ---- replies and error bodies ------------------------------------------------------------


def _message(resp: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first choice's message ({} when the reply has none)."""
    try:
        msg = resp["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    return msg if isinstance(msg, Mapping) else {}


def content_text(resp: Mapping[str, Any]) -> str:
    """The first choice's content: a string, or its text parts joined ("" for none)."""
    return message_text(_message(resp))


def reply_text(resp: Mapping[str, Any]) -> str:
    """The first choice's text: its content, else its tool calls' arguments (a model that
    answers through a function call puts the letter there)."""
    msg = _message(resp)
    content = message_text(msg)
    if content.strip():
        return content
    args = [c.get("function", {}).get("arguments") for c in tool_calls(msg) or ()]
    return "\n".join(a if isinstance(a, str) else json.dumps(a) for a in args
                     if a and isinstance(a, str | Mapping))


def call_name(call: Mapping[str, Any]) -> Any:
    """The name of the tool a call asked for (None when it names none)."""
    return call.get("function", {}).get("name")


def call_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call's arguments: the JSON object its ``arguments`` string holds, or the object
    itself (text-generation-inference's OpenAI layer sends one); {} for anything else."""
    args = call.get("function", {}).get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return {}
    return dict(args) if isinstance(args, Mapping) else {}


def finish_reason(resp: Mapping[str, Any]) -> str | None:
    """The first choice's ``finish_reason`` (``stop``, ``length``, ...), or None."""
    try:
        reason = resp["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None


ERROR_TEXT_CHARS = 300
"""An error body is quoted up to this many characters (whitespace collapsed)."""


def error_detail(data: bytes) -> str:
    """What an error body says: its JSON ``error.message`` (or ``detail`` / ``message``),
    else its text; one line, at most `ERROR_TEXT_CHARS` characters."""
    text = data.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, Mapping):
        err = doc.get("error")
        found = (err.get("message") if isinstance(err, Mapping) else err) \
            or doc.get("detail") or doc.get("message")
        if found:
            text = found if isinstance(found, str) else json.dumps(found)
    text = " ".join(as_unicode(text).split())  # its JSON may escape a lone surrogate
    return text if len(text) <= ERROR_TEXT_CHARS else text[:ERROR_TEXT_CHARS - 3] + "..."


# How servers say a conversation does not fit the model's context (tests/llm/test_parse.py
# holds each one's words): OpenAI, vLLM and llama-cpp-python; llama-server; SGLang;
# text-generation-inference; Gemini; LM Studio; Anthropic's models through a gateway.
_OVERFLOW = re.compile("(?i)" + "|".join((
    r"context[_ ]length[_ ]exceeded", r"maximum context length", r"context window",
    r"exceeds? (?:the )?(?:available |model'?s? )?(?:maximum )?context", r"exceed_context_size",
    r"(?:longer|larger) than the (?:model'?s? )?(?:maximum )?context",
    r"tokens \+ `?max_new_tokens`? must be <=", r"exceeds? the maximum number of tokens",
    r"context length of only", r"too many tokens", r"prompt is too long",
    r"input is too long")))


# How a content filter says it refused the prompt: Azure OpenAI's content management
# policy, OpenAI's usage policy (reasoning models).
_FILTERED = re.compile(r"(?i)filtered due to the prompt|content management policy|flagged as "
                       r"potentially violating")


def is_prompt_filtered(status: int, detail: str) -> bool:
    """True when a 400 says the server's content filter refused the prompt."""
    return status == 400 and bool(_FILTERED.search(detail))


def non_json_reply(status: int, content_type: str, data: bytes) -> str | None:
    """Why a reply whose Content-Type is not JSON is no chat completion (a captive portal's
    page, a stream nobody asked for), quoting its start; None for a JSON (or untyped) one."""
    ctype = content_type.split(";")[0].strip().lower()
    if not ctype or "json" in ctype:
        return None
    why = ("the server streamed its reply (Server-Sent Events) though the request did not "
           "ask to stream: a gateway that forces streaming; turn that off there"
           if ctype == "text/event-stream" else "check base_url")
    text = " ".join(data[:200].decode("utf-8", errors="replace").split())
    return f"HTTP {status} with Content-Type {ctype}, not a chat completion ({why}): {text}"


def is_context_overflow(status: int, detail: str) -> bool:
    """True when a refusal says the conversation does not fit the model's context."""
    return status in (400, 413, 422) and bool(_OVERFLOW.search(detail))


def has_content_parts(body: Mapping[str, Any]) -> bool:
    """True when some message's content is a list of parts (frames, a video)."""
    msgs = body.get("messages")
    return isinstance(msgs, list) and any(
        isinstance(m, Mapping) and isinstance(m.get("content"), list) for m in msgs)


CONTENT_PARTS_HINT = (
    "this request's messages carry content parts (video frames); a text-only server refuses "
    "them (llama.cpp's chat-template formatter answers 500): use a vision model's server, "
    "or units without media")


MAX_REPLY_TOKENS = 10**9
"""The most tokens one reply may say it used: no context window holds a billion, so more
is a lie or an int64 "unknown" sentinel (2**63-1). Bounded this far below
`MAX_RESULT_TOKENS`, a unit's calls summed stay a count the gate takes."""


def usage_tokens(doc: Mapping[str, Any], key: str = "total_tokens") -> int:
    """A reply's ``usage[key]`` (``total_tokens``: else prompt + completion), or 0 when the
    server did not say or said nonsense (negative, fractional, over `MAX_REPLY_TOKENS`, not
    a number): a lying count costs the bookkeeping, never the answer or the gate."""
    usage = doc.get("usage")
    if not isinstance(usage, Mapping):
        return 0
    n = usage.get(key)
    if n is None and key == "total_tokens":
        p, c = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        n = p + c if is_whole(p) and is_whole(c) and p >= 0 and c >= 0 else None
    return n if is_whole(n) and 0 <= n <= MAX_REPLY_TOKENS else 0


def refused_reply(model: str, refusal: ContextOverflowError | PromptFilteredError
                  ) -> dict[str, Any]:
    """The reply recorded when the server refused the conversation itself (too long for its
    context, or its content filter tripped): an empty answer (``finish_reason``
    ``context_length`` or ``content_filter``) the arm's own conversation caused, so it is
    cached and graded wrong like any unusable answer, never INFRA."""
    finish = "context_length" if isinstance(refusal, ContextOverflowError) else "content_filter"
    return {"object": "chat.completion", "model": model, "usage": {},
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": ""}}],
            "vtrm_refused": str(refusal)}


def refusal(status: int, detail: str) -> ContextOverflowError | PromptFilteredError | None:
    """The server's error reply as a refusal of the conversation itself (the arm's answer,
    not INFRA), or None for any other error."""
    if is_context_overflow(status, detail):
        return ContextOverflowError(detail)
    if is_prompt_filtered(status, detail):
        return PromptFilteredError(detail)
    return None


def refusal_text(resp: Mapping[str, Any]) -> str | None:
    """Why a reply `refused_reply` recorded is no answer, in words (None: it is not one)."""
    words = resp.get("vtrm_refused")
    if finish_reason(resp) == "context_length":
        return f"context overflow, the conversation does not fit ({words})"
    if words is None:
        return None
    return f"the server's content filter refused the prompt ({words})"
