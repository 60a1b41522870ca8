"""Response-cache keys: content-addressed over model, base URL, messages (media references
included), sampling params, tools, schema and salt; why two keys differ (`explain_miss`); what
may be stored (`validate_response`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from .._ids import canonical_json
from .._ids import sha256_text as _sha256

SCHEMA_VERSION = 1
DEFAULT_PREFIX = "llm_cache"

# Top-level request fields that are bookkeeping (ids, end-user tags, delivery options) and do
# not change the response's content. Nothing is ever stripped by name inside the messages: a
# nested "timestamp" or "id" may be what tells two video frames apart.
VOLATILE_REQUEST_FIELDS = frozenset({"request_id", "user", "metadata", "store", "stream",
                                     "stream_options"})
_NOT_IN_KEY = frozenset({"model", "messages", "tools", "response_format"}) \
    | VOLATILE_REQUEST_FIELDS


Response = dict[str, Any]
Validator = Callable[[Any], "str | None"]


def _normalise_base_url(url: str) -> str:
    """Lower-case scheme and host, no credentials, no trailing slash."""
    p = urlsplit(url.strip())
    host = (p.hostname or "").lower() + (f":{p.port}" if p.port else "")
    return urlunsplit((p.scheme.lower(), host, p.path.rstrip("/"), p.query, ""))


def salt_for_run(run_id: str, namespace: str = "") -> str:
    """The cache salt of a run: the cache's namespace (see `cache_namespace`), then the run
    id. Arm run ids name the step, so a new step's base arm never reuses the samples of an
    earlier run; a re-run step reuses its own; another workspace never reuses them."""
    return f"{namespace}/{run_id}" if namespace else run_id


RUN_HEADER = "X-Vtrm-Run"
"""The request header naming the run whose salt keys a chat call's cache entry (%-encoded).
Two runs may send one body (the rollout and a gate arm ask the same unit with the same skill):
the body and this header name the entry, so a server log or a proxy can tell the calls
apart. Never part of the key."""


RUN_HEADER_MAX = 256
"""`RUN_HEADER`'s longest value: a longer run id (a type named by a paragraph) is cut and
ends in ``~`` and 16 hex digits of its sha256, so no server refuses the request's head."""


def run_header(run_id: str) -> dict[str, str]:
    """`RUN_HEADER` for a call of ``run_id`` (none for a call outside any run)."""
    if not run_id:
        return {}
    value = quote(run_id, safe="")
    if len(value) > RUN_HEADER_MAX:  # cut between characters, never inside one's escapes
        parts, room = [], RUN_HEADER_MAX - 17
        for ch in run_id:
            room -= len(q := quote(ch, safe=""))
            if room < 0:
                break
            parts.append(q)
        value = f"{''.join(parts)}~{_sha256(run_id)[:16]}"
    return {RUN_HEADER: value}


def header_run_id(value: str | None) -> str:
    """The run a `RUN_HEADER` value names (`run_header` read back; "" for none)."""
    return unquote(value or "")


def cache_namespace(workspace_id: str, share: str | None = None) -> str:
    """The salt namespace of a workspace: its own id, or ``share`` when the user opted in to
    sharing cached samples with every workspace configured with the same name."""
    return f"share:{share}" if share else f"ws:{workspace_id}"


KEY_COMPONENTS = ("schema", "model", "base_url", "messages", "params", "tools",
                  "response_format", "salt")


@dataclass(frozen=True)
class KeyParts:
    """Everything that identifies one chat call's response; its digest is the cache key."""

    model: str
    base_url: str
    messages: tuple[Any, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    tools: Any = None
    response_format: Any = None
    salt: str = ""
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "base_url", _normalise_base_url(self.base_url))
        object.__setattr__(self, "params", dict(self.params))

    @classmethod
    def from_request(cls, body: Mapping[str, Any], base_url: str, salt: str) -> KeyParts:
        """Key parts of a chat-completions request body: every field but the top-level
        bookkeeping (`VOLATILE_REQUEST_FIELDS`) is a parameter."""
        params = {k: v for k, v in body.items() if k not in _NOT_IN_KEY}
        return cls(model=str(body["model"]), base_url=base_url,
                   messages=tuple(body["messages"]), params=params,
                   tools=body.get("tools"), response_format=body.get("response_format"),
                   salt=salt)

    def components(self) -> dict[str, Any]:
        return {"schema": self.schema, "model": self.model, "base_url": self.base_url,
                "messages": list(self.messages), "params": self.params, "tools": self.tools,
                "response_format": self.response_format, "salt": self.salt}

    @cached_property
    def digest(self) -> str:
        return _sha256(canonical_json(self.components()))

    def key(self, prefix: str = DEFAULT_PREFIX) -> str:
        return f"{prefix}:{self.digest}"

    def component_digests(self) -> dict[str, str]:
        """One short digest per key component: what `explain_miss` compares."""
        return {k: _sha256(canonical_json(v))[:16] for k, v in self.components().items()}

    def message_digests(self) -> list[str]:
        return [_sha256(canonical_json(m))[:16] for m in self.messages]


@dataclass(frozen=True)
class MissExplanation:
    """Why a call's key differs from a reference call's key: the components that differ."""

    key: str
    reference_key: str | None
    differing: tuple[str, ...]
    first_differing_message: int | None = None
    note: str = ""

    @property
    def same(self) -> bool:
        return not self.differing

    def __str__(self) -> str:
        if self.note:
            return self.note
        if self.same:
            return f"{self.key}: every key component matches the reference"
        msg = f"{self.key}: differs from the reference in {', '.join(self.differing)}"
        if self.first_differing_message is not None:
            msg += f" (messages differ from index {self.first_differing_message})"
        return msg


def _first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _explain(key: str, ref_key: str | None, mine: Mapping[str, str], theirs: Mapping[str, str],
             my_msgs: Sequence[str], their_msgs: Sequence[str]) -> MissExplanation:
    differing = tuple(c for c in KEY_COMPONENTS if mine.get(c) != theirs.get(c))
    first = _first_difference(my_msgs, their_msgs) if "messages" in differing else None
    return MissExplanation(key, ref_key, differing, first)


def explain_miss(parts: KeyParts, reference: KeyParts,
                 prefix: str = DEFAULT_PREFIX) -> MissExplanation:
    """Which key components of ``parts`` differ from ``reference`` (and the first message)."""
    return _explain(parts.key(prefix), reference.key(prefix), parts.component_digests(),
                    reference.component_digests(), parts.message_digests(),
                    reference.message_digests())


def validate_response(resp: Any) -> str | None:
    """Why a chat-completions response must not be cached, or None if it is fine."""
    if not isinstance(resp, Mapping):
        return "response is not a JSON object"
    if resp.get("error"):
        return "response carries an error"
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices:
        return "empty choices"
    first = choices[0]
    if not isinstance(first, Mapping):
        return "malformed choice"
    if first.get("finish_reason") == "content_filter":
        return "content filtered"
    msg = first.get("message")
    if not isinstance(msg, Mapping):
        return "choice has no message"
    calls = tool_calls(msg)
    if calls is None:
        return "malformed tool calls"
    if not message_text(msg).strip() and not calls:
        return "empty message content"
    return None


def message_text(msg: Mapping[str, Any]) -> str:
    """A chat message's text: its ``content`` string, or its text parts joined (a server
    that answers in content parts, as Mistral's do); "" for anything else."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(p["text"] for p in content if isinstance(p, Mapping)
                   and p.get("type", "text") == "text" and isinstance(p.get("text"), str))


def tool_calls(msg: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """A chat message's tool calls ([] for none), or None when they are malformed: not a
    list of objects, or a call whose ``function`` is not an object (a broken server)."""
    calls = msg.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list) or not all(
            isinstance(c, Mapping) and isinstance(c.get("function", {}), Mapping)
            for c in calls):
        return None
    return calls


# Validation failures that mean the endpoint misbehaved (INFRA), not that the model answered.
PROTOCOL_FAILURES = frozenset({"response is not a JSON object", "response carries an error",
                               "empty choices", "malformed choice", "choice has no message",
                               "malformed tool calls"})


def protocol_failure(resp: Any) -> str | None:
    """Why ``resp`` is not a chat completion at all (INFRA, never cached), or None: the
    model answered, maybe unusably (filtered, empty, unparseable), and that answer is cached
    like any other so a re-run replays the same outcome."""
    why = validate_response(resp)
    return why if why in PROTOCOL_FAILURES else None



