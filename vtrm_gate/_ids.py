"""Identities: run ids and their prefixes, content hashes, canonical JSON (one home each).

Every run id is built here, so the log's literal prefixes, the cache salts and the replays
agree by construction::

    e{epoch}_s{step}                          step_run_id: a gate step
    e{epoch}_probation / e{epoch}_eval        the epoch-end settlement / evaluation
    {srid}_gate_{slug}_{arm}                  arm_run_id: one arm of one type's gate
    {srid}_rollout_{slug} / _evolve_{slug}    a step's rollout / evolution calls
    {srid}_rollout                            a bring-your-own rollout's calls

No imports beyond the standard library: every layer may use it.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable
from typing import Any, Literal

from .errors import ConfigError, InputError, is_whole, shown

Arm = Literal["base", "cand"]


MAX_SLUG = 120
"""The most UTF-8 bytes a type's slug may take: it names files (``skills/<slug>.md``,
history and candidate directories) under the file system's 255-byte limit, and run ids."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 controls, the line and paragraph separators (a line break to `str.splitlines`)
and the bidirectional embeddings, overrides and isolates (U+202E turns every later column
of a table row around on a terminal)."""


def slugify(task_type: str) -> str:
    """'Action Reasoning' -> 'action-reasoning': the skill file stem and run-id component.
    A name with no ASCII letter or digit keeps its own ('时间推理' -> '时间推理', 'Подсчёт
    объектов' -> 'подсчёт-объектов'); a name with any keeps the ASCII slug it always had, so
    no workspace's files or run ids move. InputError for a name no file can carry: no
    letters or digits, a control character (a newline would make a second type that tables
    print across lines), too long."""
    if (bad := _CONTROL.search(task_type)) is not None:
        raise InputError(f"task type {shown(task_type)} holds a control character "
                         f"({bad.group()!r}): a type's name is one line of text")
    slug = re.sub(r"[^a-z0-9]+", "-", task_type.lower()).strip("-")
    if not slug:  # letters of other scripts: \w is Unicode's letters and digits (and _);
        # case-folded, as a case-insensitive file system compares names (final ς is σ)
        name = unicodedata.normalize("NFC", unicodedata.normalize("NFC", task_type).casefold())
        slug = re.sub(r"[\W_]+", "-", name).strip("-")
    if not slug:
        raise InputError(f"task type {shown(task_type)} has no letters or digits to name "
                         f"it by")
    if (size := len(slug.encode())) > MAX_SLUG:
        raise InputError(f"task type {shown(task_type)} names its files by {size} "
                         f"bytes, at most {MAX_SLUG}: shorten its name")
    return slug


def type_slugs(names: Iterable[str]) -> dict[str, str]:
    """slug -> name of each type. InputError for a name no file can carry (`slugify`) or for
    two names with one slug: they would share run ids, cache salts and a skill file."""
    slugs: dict[str, str] = {}
    seen: dict[str, str] = {}  # names by how they look: two that look alike are one
    for name in names:
        slug = slugify(name)
        if slug in slugs:
            raise InputError(slug_clash(slugs[slug], name))
        if (first := seen.setdefault(_look(name), name)) != name:
            raise InputError(slug_clash(first, name))
        slugs[slug] = name
    return slugs


def _look(name: str) -> str:
    """How a name reads on screen: NFKC (full-width letters, composed accents), without
    invisible format characters (a zero-width space)."""
    return "".join(c for c in unicodedata.normalize("NFKC", name)
                   if unicodedata.category(c) != "Cf")


def slug_clash(a: str, b: str) -> str:
    """Why two type names that share a slug cannot both be types: they would share run ids,
    cache salts and a skill file. The words say which rule made them one."""
    slug = slugify(a)
    if unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b):
        return (f"types {a!a} and {b!a} are one name in two Unicode spellings "
                f"(composed and decomposed letters, {slug!r}); write it one way")
    if _look(a) == _look(b):
        return (f"types {a!a} and {b!a} look alike (invisible or full-width characters); "
                f"write the name one way")
    if re.search(r"[^\x00-\x7f]", a + b) and re.search(r"[a-z0-9]", slug):
        return (f"types {a!r} and {b!r} are both named {slug!r} on disk: a name with any "
                f"ASCII letter or digit is named by those alone; rename one")
    return (f"types {a!r} and {b!r} differ only in case or punctuation (both {slug!r}); "
            f"rename one")


def check_run_id(run_id: object, where: str) -> str:
    """``run_id`` if it can name a run: a non-empty string that encodes as UTF-8 (it salts
    cache keys and is sent in a header); `InputError` (a ValueError) naming ``where``."""
    if isinstance(run_id, str) and run_id and is_unicode(run_id):
        return run_id
    raise InputError(f"{where}: run_id must be a non-empty string of valid Unicode, got "
                     f"{shown(run_id)}")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> re.Match[str] | None:
    """The first lone surrogate in ``text`` (the one kind of str UTF-8 cannot encode), or
    None: where a message names it."""
    return _LONE_SURROGATE.search(text)


def is_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogate): it reaches files, SQLite, keys."""
    return lone_surrogate(text) is None


def as_unicode(text: str) -> str:
    """``text`` with each lone surrogate (half of a UTF-16 pair, no Unicode character: a
    JSON escape such as ``"\\ud83d"`` gives one) replaced by U+FFFD, as a broken UTF-8
    byte would be: what reaches files, SQLite and cache keys must encode."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def sha256_text(text: str) -> str:
    """sha256 hex digest of ``text`` (UTF-8; a lone surrogate, which has no UTF-8 form,
    hashes as its surrogatepass bytes, so any str has a digest of its own)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def content_hash(text: str) -> str:
    """sha256 of a skill file's content (the BaselineCache key component)."""
    return sha256_text(text)


CANONICAL: dict[str, Any] = {"sort_keys": True, "separators": (",", ":"), "allow_nan": False}
"""`json.dumps` settings of canonical JSON: sorted keys, no spaces, no NaN."""


def canonical_json(value: Any) -> str:
    """Deterministic JSON (`CANONICAL`, UTF-8 kept): equal values give equal bytes, for
    hashing and cache keys."""
    return json.dumps(value, ensure_ascii=False, **CANONICAL)


def readable_json(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, **dumps)`` with non-ASCII text kept as written (for files and
    stored values); one holding a lone surrogate, which UTF-8 cannot carry, is written with
    its text escaped instead, so it reads back as it was."""
    text = json.dumps(value, ensure_ascii=False, **dumps)
    return text if is_unicode(text) else json.dumps(value, **dumps)


class _KeyTwice(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _KeyTwice(k)
        out[k] = v
    return out


def strict_json(text: str, **kwargs: Any) -> Any:
    """``json.loads`` that refuses a key twice in one object, as TOML does (Python keeps the
    last copy silently: ``{"n_max": 40, "n_max": 10}`` read as 10). The refusal is a
    ``JSONDecodeError`` "duplicate key 'k'" placed at the key's second appearance."""
    try:
        return json.loads(text, object_pairs_hook=_once, **kwargs)
    except _KeyTwice as exc:
        key = re.escape(json.dumps(exc.key, ensure_ascii=False)) + r"\s*:"  # as written
        seen = [m.start() for m in re.finditer(key, text)]
        raise json.JSONDecodeError(f"duplicate key {exc.key!r}", text,
                                   seen[1] if len(seen) > 1 else 0) from None


def json_hash(value: Any) -> str:
    """sha256 of `canonical_json` of ``value``."""
    return sha256_text(canonical_json(value))


# ---- run ids ----------------------------------------------------------------------------


def check_ids(epoch: int, step: int) -> None:
    """Refuse an epoch or step that is not an integer >= 1 (text from a widget, ``1.0``,
    ``True``), naming it, before it names a file or a run."""
    for name, v in (("epoch", epoch), ("step", step)):
        if not is_whole(v) or v < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {shown(v)}")


def step_run_id(epoch: int, step: int) -> str:
    """The step's run-id stem: arm run ids are ``{step_run_id}_gate_{slug}_{arm}``."""
    return f"e{epoch}_s{step}"


def probation_run_id(epoch: int) -> str:
    """The run-id stem of epoch ``epoch``'s probation settlement."""
    return f"e{epoch}_probation"


def eval_run_id(epoch: int) -> str:
    """The run-id stem of epoch ``epoch``'s held-out evaluation."""
    return f"e{epoch}_eval"


def gate_prefix(stem: str) -> str:
    """The literal prefix every arm run id of a step (or settlement) starts with."""
    return f"{stem}_gate_"


def arm_run_id(stem: str, task_type: str, arm: Arm) -> str:
    """One run id per arm: ``{stem}_gate_{slug}_{arm}`` (no block ids)."""
    return f"{gate_prefix(stem)}{slugify(task_type)}_{arm}"


def rollout_run_id(task_type: str, epoch: int, step: int) -> str:
    """The rollout's run id (and cache salt) for one type of one step."""
    return f"{step_run_id(epoch, step)}_rollout_{slugify(task_type)}"


def step_rollout_run_id(epoch: int, step: int) -> str:
    """The run id (and cache salt) of a bring-your-own rollout's calls, all types at once."""
    return f"{step_run_id(epoch, step)}_rollout"


def evolve_run_id(task_type: str, epoch: int, step: int) -> str:
    """The evolver's run id (and cache salt) for one type of one step."""
    return f"{step_run_id(epoch, step)}_evolve_{slugify(task_type)}"


PROBATION_STEP = 0
"""step_report rows of the epoch-end probation settlement use step 0 of the epoch."""
EVAL_STEP = -1
"""Evaluation predictions are logged at step -1 of their epoch (run ids ``eE_eval_gate_*``)."""
