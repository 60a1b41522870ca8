"""Environment helpers with no heavy imports: ``.env`` files, Redis URLs, secret masking,
whether a process still runs, and the defaults of the settings (slots, reply budgets,
timeouts) that signatures, options and the CLI's help import.

Shared by `vtrm_gate.options` and `vtrm_gate.cache` (and so by the fast-starting CLI).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from .errors import USER_TEXT, ConfigError, not_utf8, shown

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
DEFAULT_TTL = 604800  # 7 days
MAX_TTL = 2**31 - 1
"""The longest TTL taken (68 years): Redis, its Lua numbers and every client agree on it."""

# ---- defaults: one home for each default a signature, an option or a help text takes ----
# (the slot count, the reply budgets, the LLM call's timeouts and retries, Redis clients'
# socket timeout); every other module imports them, none writes the number again.

DEFAULT_CONCURRENCY = 32
"""Slots of the gate's pool (a rollout's, a simulated step's; one endpoint's cap)."""

DEFAULT_MAX_TOKENS: Mapping[str, int] = MappingProxyType(
    {"think": 512, "answer": 64, "evolve": 2048})
"""Each call kind's reply budget (0: none sent, the server's default)."""

DEFAULT_TIMEOUT_S = 60.0
"""An LLM call's attempt timeout in seconds."""

DEFAULT_DEADLINE_S = 180.0
"""An LLM call's deadline in seconds, every attempt and wait included."""

DEFAULT_MAX_RETRIES = 5
"""Retries of an LLM call after its first attempt."""

REDIS_SOCKET_TIMEOUT_S = 0.5
"""A Redis client's socket timeout: a dead cache costs a call half a second, once."""

DEFAULT_BOOT = 200
"""Bootstrap resamples of a world's fit over gates."""

MAX_BOOT = 100_000
"""The most resamples a bootstrap takes: a 2.5% quantile's Monte Carlo error is then ~0.0005
in level, and the refits take 6-40 minutes here (4-25 ms each at 60-600 gates)."""

MAX_WORKERS = 256
"""The most local processes a sweep or a fit's bootstrap starts (``--jobs``): more than a
machine's cores only waits, and 10**9 started processes until the pool's limit."""

MAX_TIME_SCALE = 10.0
"""The slowest simulated clock taken, in real seconds per simulated second (1: real time, a
step in about 1.3 h): ``--time-scale 1e300`` slept until killed."""

EXPORT_FORMATS = ("parquet", "csv", "csv-excel")
"""An export's file formats. ``csv-excel``: the CSV files, each opening with a UTF-8 byte
order mark, without which Excel on Windows reads non-ASCII text (a Chinese type name) in the
system code page."""


# ---- secrets --------------------------------------------------------------------------


def _url_secrets(url: str) -> list[str]:
    """The password in ``url`` (userinfo or ``?password=``), raw and percent-encoded."""
    out: list[str] = []
    try:
        p = urlsplit(url)
        if p.password:
            out.append(p.password)
        elif p.username and "@" in p.netloc and ":" not in p.netloc.rsplit("@", 1)[0]:
            out.append(p.username)  # redis://secret@host: a bare userinfo may be a password
        out += [v for k, v in parse_qsl(p.query) if k.lower() == "password" and v]
    except ValueError:
        pass
    secrets = {s for s in out if s}
    secrets |= {unquote(s) for s in secrets} | {quote(s, safe="") for s in secrets}
    return sorted(secrets, key=len, reverse=True)


def mask_url(url: str | None) -> str:
    """``url`` with any password replaced by ``***`` (safe to print, log or put in a repr)."""
    if url is None:
        return "<embedded>"
    try:
        p = urlsplit(url)
        netloc = p.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
            netloc = f"{user}:***@{host}"
        query = p.query
        if query:
            pairs = [(k, "***" if k.lower() == "password" else v)
                     for k, v in parse_qsl(query, keep_blank_values=True)]
            query = urlencode(pairs, safe="*")
        out = f"{p.scheme}://{netloc}{p.path}" if p.scheme else f"{netloc}{p.path}"
        return out + (f"?{query}" if query else "") + (f"#{p.fragment}" if p.fragment else "")
    except ValueError:
        return "<unparseable URL>"


def scrub(text: str, url: str | None) -> str:
    """``text`` with the password of ``url`` replaced by ``***`` (for exception messages)."""
    if url:
        for s in _url_secrets(url):
            text = text.replace(s, "***")
    return text


# A credential header (or query parameter) and its value, e.g. ``Authorization: Bearer x``,
# ``"api-key": "x"``, ``?api-key=x``; and any ``Bearer``/``Basic`` token on its own.
_CREDENTIAL_FIELD = re.compile(
    r"""(?i)\b((?:proxy-)?authorization|x-api-key|api[-_]?key)(["']?\s*[:=]\s*["']?)"""
    r"""(?:(bearer|basic|token)\s+)?[^\s"'&,;}]+""")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")


SHORT_SECRET = 8
"""The one length rule for secrets: a secret the caller names (the API key) shorter than this
(``x``, ``local``: keys of local servers) is scrubbed only as a whole token, since as a
substring it would mangle ordinary words ("ma***imum"); an environment value that merely has
a credential-like name (`secret_values`) is not scrubbed at all below it."""


_URLSAFE = str.maketrans("+/", "-_")


def _base64_forms(raw: bytes) -> set[str]:
    """``raw``'s base64 text wherever it starts in an encoded stream (offset 0, 1 or 2 of a
    3-byte group): whole, and the part of whole groups it alone decides (the edge groups
    mix in unknown neighbours); standard and URL-safe alphabets."""
    whole = base64.b64encode(raw).decode()
    out = {whole, whole.rstrip("=")}
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw).decode()
        out.add(enc[4 if k else 0:(k + len(raw)) // 3 * 4])
    return {f for x in out if len(x) >= SHORT_SECRET for f in (x, x.translate(_URLSAFE))}


@functools.lru_cache(maxsize=64)
def secret_forms(secret: str) -> frozenset[str]:
    """The texts that give ``secret`` away: itself, percent-encoded (only where needed, or
    every byte, in either case), hex of its UTF-8 bytes (either case), reversed and
    base64-encoded (`_base64_forms`); a secret shorter than `SHORT_SECRET` only itself and
    percent-encoded. JSON ``\\u`` escapes: `_escaped_pattern`."""
    forms = {secret, quote(secret, safe="")}
    if len(secret) >= SHORT_SECRET:
        raw = secret.encode()
        every = "".join(f"%{b:02X}" for b in raw)
        forms |= {every, every.lower(), raw.hex(), raw.hex().upper(), secret[::-1],
                  *_base64_forms(raw)}
    return frozenset(forms)


_SHORT_ESCAPES = {"/": "/", '"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n",
                  "\r": "r", "\t": "t"}


def _u_escape(unit: int) -> str:
    """A regex for ``\\uXXXX`` of one UTF-16 code unit, its hex digits in either case, its
    backslash doubled any number of times (JSON inside JSON)."""
    # one backslash, then any more: a "+" repeat would make the scan three times slower
    return "\\\\\\\\*u" + "".join(f"[{d}{d.upper()}]" if d.isalpha() else d
                               for d in f"{unit:04x}")


@functools.lru_cache(maxsize=64)
def _escaped_pattern(secret: str) -> re.Pattern[str]:
    """``secret`` as a JSON string spells it with any of its characters ``\\u``-escaped
    (hex digits in either case; a surrogate pair past U+FFFF) or short-escaped (``\\/``), at
    any depth of JSON inside JSON."""
    parts = []
    for c in secret:
        units = [ord(c)] if ord(c) < 0x10000 else [
            0xD800 + ((ord(c) - 0x10000) >> 10), 0xDC00 + ((ord(c) - 0x10000) & 0x3FF)]
        alts = [re.escape(c), "".join(_u_escape(u) for u in units)]
        if c in _SHORT_ESCAPES:
            alts.append("\\\\\\\\*" + re.escape(_SHORT_ESCAPES[c]))
        parts.append(f"(?:{'|'.join(alts)})")
    return re.compile("".join(parts))


@functools.lru_cache(maxsize=64)
def _escape_marks(secret: str) -> tuple[str, ...]:
    """The escapes a JSON spelling of ``secret`` may hold: a text with none of them cannot
    hold one (a fast check before `_escaped_pattern`)."""
    return ("\\u", *sorted({"\\" + _SHORT_ESCAPES[c] for c in secret if c in _SHORT_ESCAPES}))


def scrub_credentials(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every ``secrets`` value (raw, percent-encoded, hex, base64-encoded or
    reversed: `secret_forms`; JSON-escaped: `_escaped_pattern`), every credential header's
    value (Authorization, api-key, x-api-key) and every Bearer/Basic token replaced by
    ``***``: apply to any text from outside before it is logged, stored or raised. A secret
    shorter than `SHORT_SECRET` characters is replaced where it stands alone as a token."""
    named = {s for s in secrets if s}
    literals = {x for s in named for x in secret_forms(s)}
    for lit in sorted(literals, key=len, reverse=True):
        if len(lit) >= SHORT_SECRET:
            text = text.replace(lit, "***")
        else:
            text = re.sub(rf"(?<![\w.~+/=-]){re.escape(lit)}(?![\w~+/=-]|\.\w)", "***", text)
    if "\\" in text:  # a JSON-escaped spelling needs an escape: most replies skip this
        for s in sorted(named, key=len, reverse=True):
            if len(s) >= SHORT_SECRET and any(m in text for m in _escape_marks(s)):
                text = _escaped_pattern(s).sub("***", text)
    text = _CREDENTIAL_FIELD.sub(
        lambda m: f"{m[1]}{m[2]}{m[3] + ' ' if m[3] else ''}***", text)
    return _BEARER.sub(lambda m: f"{m[1]} ***", text)


SECRET_MARGIN = 8192
"""Characters a cut text loses before its cut: a secret the cut would split (one up to this
long: keys, tokens, a PEM key) goes whole instead of leaving its first half."""


def capped(text: str, cap: int, scrub: Callable[[str], str], what: str = "") -> str:
    """``text`` scrubbed, at most ``cap`` characters: over it, its head (less `SECRET_MARGIN`)
    and a note naming the length and the cap, so an unbounded text is never scrubbed, stored
    or printed whole."""
    if len(text) <= cap:
        return scrub(text)
    note = f" ... [truncated{what}: {len(text)} characters, over the cap of {cap}]"
    return scrub(text[:max(0, cap - SECRET_MARGIN - len(note))]) + note


def scrub_json(value: Any, scrub: Callable[[str], str]) -> Any:
    """``value`` (JSON-like: a parsed reply, a trace) with every string scrubbed, keys too."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {scrub(k) if isinstance(k, str) else k: scrub_json(v, scrub)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(scrub_json(v, scrub) for v in value)
    return value


# Names that hold a credential: a segment (split at _, -, . and camelCase) such as KEY,
# TOKEN, SECRET, PASSWORD, AUTH... ("max_tokens" and "monkey" are not such names).
_CREDENTIAL_SEGMENTS = frozenset({
    "key", "apikey", "token", "secret", "password", "passwd", "pwd", "auth",
    "authorization", "bearer", "credential", "credentials", "cookie"})
_NOT_A_CREDENTIAL = frozenset({"pwd", "oldpwd"})  # the shell's working directories
_PATH_SUFFIXES = ("_sock", "_path", "_file", "_dir", "_home")


def credential_name(name: object) -> bool:
    """True when a key or variable name looks like it holds a credential (``api_key``,
    ``access_token``, ``openaiKey``, ``DB_PASSWORD``; not ``max_tokens``, ``PWD``)."""
    text = str(name)
    if text.lower() in _NOT_A_CREDENTIAL:
        return False
    split = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()
    return any(seg in _CREDENTIAL_SEGMENTS for seg in re.split(r"[^a-z0-9]+", split) if seg)


def credential_keys(obj: object, path: str = "") -> list[str]:
    """The keys (dotted paths) of a JSON-like value whose names look like credentials."""
    out: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            where = f"{path}.{k}" if path else str(k)
            if credential_name(k):
                out.append(where)
            out += credential_keys(v, where)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out += credential_keys(v, f"{path}[{i}]")
    return out


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of ``env`` that are secrets, longest first: every variable whose name
    looks like a credential (`credential_name`; not a socket, path or directory) and the
    password of every URL in it, each at least `SHORT_SECRET` characters."""
    found: set[str] = set()
    for k, v in env.items():
        if not isinstance(v, str) or not v:
            continue
        if credential_name(k) and not k.lower().endswith(_PATH_SUFFIXES):
            found.add(v)
        if "://" in v:
            found.update(_url_secrets(v))
    return sorted((s for s in found if len(s) >= SHORT_SECRET), key=len, reverse=True)


def check_redis_url(url: str) -> str:
    """Validate a Redis URL's scheme and shape; raise ValueError (password masked) if bad."""
    try:
        p = urlsplit(url)
        _ = p.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: {scrub(str(exc), url)}") \
            from None
    if p.scheme not in REDIS_SCHEMES:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: scheme must be one of "
                         f"redis://, rediss://, unix://, redis+cluster://, rediss+cluster://")
    if p.scheme == "unix" and not p.path:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: unix:// needs a socket path")
    if p.scheme != "unix" and not p.hostname:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: no host")
    for name, value in parse_qsl(p.query, keep_blank_values=True):
        if name in REDIS_OWNED_OPTIONS:
            raise ConfigError(
                f"invalid Redis URL {mask_url(url)!r}: option {name}={value} is vtrm_gate's "
                f"to set (the cache waits {REDIS_SOCKET_TIMEOUT_S:g} s a command, so a stalled "
                f"Redis never hangs a step): remove it from the URL")
        if name == "protocol" and value not in ("2", "3"):
            raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: option protocol={value} "
                              f"must be 2 or 3")
    return url


def prefix_problem(prefix: object) -> str | None:
    """Why ``prefix`` cannot name the cache's keys, or None: SCAN MATCH reads ``* ? [ ] \\``
    as a pattern (``team\\cache`` matched none of its own keys; ``*`` matched every key)."""
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "*?[]\\ "):
        return (f"must be a non-empty string without glob characters (* ? [ ] \\) or "
                f"spaces, got {shown(prefix)}")
    return None


REDIS_OWNED_OPTIONS = frozenset({
    "socket_timeout", "socket_connect_timeout", "timeout", "max_connections",
    "health_check_interval", "retry_on_timeout", "retry_on_error"})
"""URL query options the cache sets itself: redis-py lets the URL's value win, and
``socket_timeout=inf`` made a stalled Redis hang the step for good."""


# ---- environment ----------------------------------------------------------------------


_OUR_VARIABLE = re.compile(r"\b(?:VTRM|REDIS)_[A-Z_]+")


def user_path(path: str | os.PathLike[str]) -> Path:
    """A path a researcher gave, ``~`` expanded as a shell (and pandas, polars) would: a
    notebook's ``init_simulated("~/ws")`` made a directory named "~" in the working one."""
    return Path(path).expanduser()


MAX_SETTINGS_BYTES = 64 * 2**20
"""The largest settings file read whole (config, world, endpoints, units, ``.env``): far
beyond any real one, so an endless device read as one fails at once, not out of memory."""


def read_settings_text(path: str | os.PathLike[str]) -> str:
    """A settings file's text (UTF-8, a leading byte order mark dropped). `OSError` naming
    the trouble when it is no regular file (a FIFO, whose open blocks for ever; /dev/zero,
    endless), is larger than `MAX_SETTINGS_BYTES`, or cannot be read; `UnicodeDecodeError`
    when it is not UTF-8."""
    import errno
    import stat

    st = os.stat(path)  # follows a symlink: a link to /dev/zero is the device
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)"
                if stat.S_ISFIFO(st.st_mode) else "a device or socket")
        raise OSError(errno.EINVAL, f"not a regular file: {kind}", os.fspath(path))
    with open(path, "rb") as f:
        data = f.read(MAX_SETTINGS_BYTES + 1)
    if len(data) > MAX_SETTINGS_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_SETTINGS_BYTES // 2**20} MiB: not a "
                                   f"settings file", os.fspath(path))
    return data.decode(USER_TEXT)


def read_dotenv(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse a ``.env`` file: ``KEY=VALUE`` lines, ``export`` prefixes, quotes, comments. A
    line naming one of our variables (``VTRM_*``, ``REDIS_*``) that is no such assignment
    (``VTRM_CONCURRENCY: 8``, ``set VTRM_CONCURRENCY=8``) is refused: it would be skipped."""
    out: dict[str, str] = {}
    try:
        text = read_settings_text(path)
    except FileNotFoundError:
        return out
    except OSError as exc:  # a FIFO hung every command; unreadable: its settings lost
        raise ConfigError(f"{path}: cannot read ({exc.strerror}); fix or remove it") from None
    except UnicodeDecodeError as exc:  # a ValueError: the CLI exits 2 with this one line
        raise ConfigError(f"{path}: {not_utf8(exc)}") from None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if "=" not in line or not key or any(c.isspace() for c in key):
            if _OUR_VARIABLE.search(line):  # another tool's odd line is left to it
                raise ConfigError(f"{path}: line {number}: {raw.strip()!r} is no KEY=VALUE "
                                  f"line, so the setting it names would not be made")
            continue
        out[key] = _dotenv_value(value)
    return out


def _dotenv_value(value: str) -> str:
    """A ``.env`` value as bash and python-dotenv read it: inside its quotes when quoted
    (``"v" # note`` is v, not '"v"'), else up to a `` #`` comment."""
    quote = value[:1]
    if quote in ("'", '"'):
        end = value.find(quote, 1)
        rest = value[end + 1:].strip() if end > 0 else "unclosed"
        if not rest or rest.startswith("#"):
            return value[1:end]
    if " #" in value or "\t#" in value:
        return value.replace("\t#", " #").split(" #", 1)[0].rstrip()
    return value


def environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` as given, or ``.env`` in the cwd overlaid by the process environment."""
    if env is not None:
        return dict(env)
    return {**read_dotenv(Path.cwd() / ".env"), **os.environ}


API_KEY_VARIABLES = ("OPENAI_API_KEY", "VTRM_API_KEY")


_PASTED = {"\u201c": "a curly quote", "\u201d": "a curly quote", "\u2018": "a curly quote",
           "\u2019": "a curly quote", "\u00a0": "a non-breaking space",
           "\u200b": "a zero-width space", "\ufeff": "a byte order mark", " ": "a space",
           "\t": "a tab", "\n": "a line break", "\r": "a line break"}


def check_api_key(key: str, where: str) -> str:
    """``key`` if it can be sent as a bearer token: printable ASCII, no space (an HTTP
    header carries nothing else). ConfigError naming ``where`` and the first character that
    cannot go, by position and code point: never the key itself."""
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"":  # Bearer "sk-...": a 401
        raise ConfigError(f"{where}: characters 1 and {len(key)} of {len(key)} are quotes "
                          f"around the key: set it without them")
    for i, c in enumerate(key, 1):
        if not "!" <= c <= "~":
            what = f"U+{ord(c):04X}" + (f" ({_PASTED[c]})" if c in _PASTED else "")
            raise ConfigError(
                f"{where}: character {i} of {len(key)} is {what}, which no HTTP header can "
                f"carry: an API key is ASCII letters, digits and punctuation (was it pasted "
                f"with quotes or a space around it?)")
    return key


def api_key(env: Mapping[str, str] | None = None) -> str:
    """The chat API key: ``OPENAI_API_KEY``, else ``VTRM_API_KEY`` (from ``env``, default the
    process environment over ``.env``); "" when neither is set. Never written anywhere.
    ConfigError naming the variable for a key no header can carry (`check_api_key`)."""
    e = environment(env)
    name = next((v for v in API_KEY_VARIABLES if e.get(v)), None)
    return "" if name is None else check_api_key(e[name], name)


def cache_enabled(value: str | None) -> bool:
    """``VTRM_CACHE``: off/0/false/no/disabled turn the cache off; anything else leaves it on."""
    return (value or "on").strip().lower() not in {"off", "0", "false", "no", "disabled"}


def parse_ttl(value: str | int | None, default: int = DEFAULT_TTL) -> int:
    """A TTL in seconds (> 0), e.g. from ``REDIS_CACHE_TTL``; ValueError naming it if bad."""
    if value is None or value == "":
        return default
    try:
        ttl = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"REDIS_CACHE_TTL must be a whole number of seconds > 0, "
                         f"got {shown(value)}") from None
    if not 0 < ttl <= MAX_TTL:
        raise ConfigError(f"REDIS_CACHE_TTL must be from 1 to {MAX_TTL} seconds, got {ttl}")
    return ttl


# ---- processes ------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` runs: not gone, not an exited child (reaped here), not a
    zombie nobody has reaped yet (its pid file or build directory is then stale)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
