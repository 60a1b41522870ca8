"""A workspace's units: multiple-choice records (``units.jsonl``) and the media they show.

A unit line may carry ``"media": {"frames": [{"image": "frames/v1_0.jpg", "t": 0.0}, ...],
"video": {"url": "https://...", "start": 0, "end": 30}}``; an image is a local path
(relative to the media root: the units file's directory) or an http(s) URL.

A local frame must stay inside the media root (no absolute path, no ``..``, no symlink out
of it), be at most ``max_frame_bytes`` long and an image of at most ``max_pixels`` pixels
(checked from its header, before anything is decoded): `check_frame`.

A unit's content is identified by *references*, not pixels: a local frame is
``vtrm-file:<path>?max_side=N#sha256=<content hash>``, a remote one its URL (`MediaRefs`). So
the response cache key and the BaselineCache key carry every media reference and change when
a frame's bytes change, while the key stays small. Turning references into pixels for a
model is the agent's job (`vtrm_gate.llm`).
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .._env import read_settings_text, user_path
from .._ids import lone_surrogate, slugify, strict_json
from ..errors import (
    InputError,
    MediaError,
    WorkspaceError,
    is_real,
    is_whole,
    not_utf8,
    plain_fields,
    shown,
)
from ._files import _rel

REF_SCHEME = "vtrm-file:"
DEFAULT_MAX_FRAMES = 8
DEFAULT_MAX_SIDE = 768
DEFAULT_MAX_FRAME_BYTES = 32 << 20
"""A frame file larger than this is refused before it is read (32 MiB)."""
DEFAULT_MAX_PIXELS = 40_000_000
"""A frame whose header claims more pixels is refused before it is decoded (a 4K frame is
8.3 M; Pillow's own decompression-bomb guard starts at 89 M)."""
MAX_TASK_DESCRIPTION = 300
"""A task description (``agent.task_description``, a unit line's ``task_description``) is one
line of at most this many characters."""


def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://", "data:"))


@dataclass(frozen=True)
class Frame:
    """One frame image (local path or URL) and its time in the video (seconds), if known."""

    image: str
    t: float | None = None


@dataclass(frozen=True)
class Video:
    """A video URL, optionally with the clip's start and end (seconds)."""

    url: str
    start: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class Media:
    """What a unit shows the model besides its text."""

    frames: tuple[Frame, ...] = ()
    video: Video | None = None

    def local_paths(self) -> list[str]:
        return [f.image for f in self.frames if not _is_url(f.image)]


def parse_media(obj: Any) -> Media | None:
    """A unit's ``media`` value, validated; ValueError naming the field. None stays None."""
    if obj is None:
        return None
    if not isinstance(obj, Mapping) or not set(obj) <= {"frames", "video"}:
        raise InputError(f"media must be an object with 'frames' and/or 'video', got {shown(obj)}")
    frames = []
    raw = obj.get("frames") or []
    if not isinstance(raw, list):
        raise InputError(f"media.frames must be a list, got {type(raw).__name__}")
    for i, f in enumerate(raw):
        if isinstance(f, str):
            f = {"image": f}
        if not isinstance(f, Mapping) or not isinstance(f.get("image"), str) \
                or not f["image"].strip() or not set(f) <= {"image", "t"}:
            raise InputError(f"media.frames[{i}] must be a path or URL, or {{\"image\", \"t\"}}"
                             f", got {shown(f)}")
        t = f.get("t")
        if t is not None and not (is_real(t) and t >= 0):
            raise InputError(f"media.frames[{i}].t must be a number of seconds >= 0, "
                             f"got {shown(t)}")
        frames.append(Frame(f["image"], None if t is None else float(t)))
    video = None
    v = obj.get("video")
    if v is not None:
        if isinstance(v, str):
            v = {"url": v}
        if not isinstance(v, Mapping) or not isinstance(v.get("url"), str) \
                or not v["url"].startswith(("http://", "https://")) \
                or not set(v) <= {"url", "start", "end"}:
            raise InputError(f"media.video must be an http(s) URL or {{\"url\", \"start\", "
                             f"\"end\"}}, got {shown(v)}")
        for k in ("start", "end"):
            if v.get(k) is not None and not (is_real(v[k]) and v[k] >= 0):
                raise InputError(f"media.video.{k} must be a number of seconds >= 0, "
                                 f"got {shown(v[k])}")
        video = Video(v["url"], v.get("start"), v.get("end"))
    if not frames and video is None:
        return None
    return Media(tuple(frames), video)


def pick_frames(frames: Sequence[Frame], max_frames: int) -> list[Frame]:
    """At most ``max_frames`` frames, evenly spread and in order (first and last kept)."""
    n = len(frames)
    if n <= max_frames:
        return list(frames)
    if max_frames == 1:
        return [frames[0]]
    return [frames[round(i * (n - 1) / (max_frames - 1))] for i in range(max_frames)]


@dataclass(frozen=True)
class MediaOptions:
    """How frames are sent: at most ``max_frames`` per unit, longest side <= ``max_side``
    pixels (0: as stored), ``detail`` for the image parts; paths relative to ``root``. A
    frame file over ``max_frame_bytes`` or an image over ``max_pixels`` is never read or
    decoded."""

    root: str = "."
    max_frames: int = DEFAULT_MAX_FRAMES
    max_side: int = DEFAULT_MAX_SIDE
    detail: str = "auto"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        plain_fields(self)
        for name, low in (("max_frames", 1), ("max_side", 0), ("max_frame_bytes", 1),
                          ("max_pixels", 1)):
            v = getattr(self, name)
            if not is_whole(v) or not low <= v < 2**63:
                raise InputError(f"media.{name} must be an integer >= {low}, got {shown(v)}")
        if self.detail not in ("auto", "low", "high"):
            raise InputError(f"media.detail must be auto, low or high, got {shown(self.detail)}")

    @classmethod
    def from_agent(cls, agent: Mapping[str, Any], root: str | os.PathLike[str]) -> MediaOptions:
        """From an agent config's ``media`` object and ``media_root`` (else ``root``)."""
        m = dict(agent.get("media") or {})
        return cls(str(agent.get("media_root") or root), **m)



# The formats a frame may have (what Pillow identifies from the first bytes; SVG is not one).
IMAGE_FORMATS = frozenset({"PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF", "MPO"})


def frame_path(root: str | os.PathLike[str], image: str) -> Path:
    """The file a local frame names, resolved (symlinks followed); `MediaError` unless it
    is a relative path that stays inside ``root`` (no ``..``, no absolute path, no symlink
    out of it), so no file elsewhere on the machine is ever read or sent."""
    if "\x00" in image:  # no file has such a name; the OS calls would raise a bare ValueError
        raise MediaError(f"frame {image!r}: the path holds a NUL byte")
    rel = Path(image)
    if rel.is_absolute() or ".." in rel.parts:
        raise MediaError(f"frame {image!r}: must be a path inside the units directory "
                         f"(no absolute path, no '..')")
    base = Path(root).resolve()
    full = (base / rel).resolve()
    if not full.is_relative_to(base):
        raise MediaError(f"frame {image!r}: resolves outside the units directory (a "
                         f"symlink out of it)")
    return full


def check_size(image: str, size: int, options: MediaOptions) -> None:
    """`MediaError` when a frame file is over ``max_frame_bytes`` (known before reading)."""
    if size > options.max_frame_bytes:
        raise MediaError(f"frame {image!r}: {size} bytes, over media.max_frame_bytes "
                         f"{options.max_frame_bytes}")


def check_image(image: str, im: Any, options: MediaOptions) -> None:
    """`MediaError` unless an opened (not decoded) Pillow image is a known format within
    ``max_pixels``: its header says so before a pixel is decoded."""
    w, h = im.size
    if im.format not in IMAGE_FORMATS:
        raise MediaError(f"frame {image!r}: not an image of a supported format "
                         f"({im.format})")
    if w * h > options.max_pixels:
        raise MediaError(f"frame {image!r}: {w}x{h} = {w * h} pixels, over media.max_pixels "
                         f"{options.max_pixels}")


def open_image(image: str, source: Any) -> Any:
    """``PIL.Image.open`` of a path or a file object; `MediaError` naming the frame when it
    is not an image (text, SVG, a bad header) or claims a decompression bomb's size."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(source)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MediaError(f"frame {image!r}: {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:  # UnidentifiedImageError is an OSError
        if isinstance(exc, FileNotFoundError):
            raise MediaError(f"frame {image!r}: missing") from None
        raise MediaError(f"frame {image!r}: not an image ({type(exc).__name__})") from None


def check_frame(image: str, options: MediaOptions) -> Path:
    """The frame's file, checked without decoding it: inside the units directory, a
    regular file within ``max_frame_bytes``, an image (header and, where the format keeps
    checksums, its chunks: a truncated PNG fails) within ``max_pixels``."""
    full = frame_path(options.root, image)
    if not full.is_file():
        raise MediaError(f"frame {image!r}: missing (no file {full})")
    check_size(image, full.stat().st_size, options)
    with open_image(image, full) as im:
        check_image(image, im, options)
        try:
            im.verify()
        except Exception as exc:  # Pillow raises what its parsers raise
            raise MediaError(f"frame {image!r}: damaged image ({type(exc).__name__}: "
                             f"{exc})") from None
    return full


class MediaRefs:
    """The references of a unit's media under `MediaOptions`: what the cache keys hold.

    File hashes and frame checks are memoised by (path, size, mtime).
    """

    def __init__(self, options: MediaOptions) -> None:
        self.options = options
        self._hashes: dict[tuple[str, int, int], str] = {}
        self._checked: dict[tuple[str, int, int], str | None] = {}

    def _stat(self, path: str) -> tuple[Path, tuple[str, int, int]]:
        full = frame_path(self.options.root, path)
        try:
            st = full.stat()
        except OSError as exc:
            raise MediaError(f"frame {path!r}: missing ({exc.strerror})") from None
        return full, (str(full), st.st_size, st.st_mtime_ns)

    def file_hash(self, path: str) -> str:
        """The sha256 of a local frame's bytes (read in chunks, never over the size cap)."""
        full, k = self._stat(path)
        h = self._hashes.get(k)
        if h is None:
            check_size(path, k[1], self.options)
            try:
                with open(full, "rb") as f:
                    h = self._hashes[k] = hashlib.file_digest(f, "sha256").hexdigest()
            except OSError as exc:
                raise MediaError(f"frame {path!r}: unreadable ({exc.strerror})") from None
        return h

    def fault(self, media: Media | None) -> str | None:
        """Why a unit's media cannot be sent (its first bad frame, named), or None."""
        if media is None:
            return None
        for f in pick_frames(media.frames, self.options.max_frames):
            if _is_url(f.image):
                continue
            try:
                _, k = self._stat(f.image)
            except MediaError as exc:
                return str(exc)
            if k not in self._checked:
                try:
                    check_frame(f.image, self.options)
                    self._checked[k] = None
                except MediaError as exc:
                    self._checked[k] = str(exc)
            if self._checked[k] is not None:
                return self._checked[k]
        return None

    def ref(self, image: str) -> str:
        """The reference an image part carries: its URL, or path + max_side + content hash."""
        if _is_url(image):
            return image
        return (f"{REF_SCHEME}{quote(image)}?max_side={self.options.max_side}"
                f"#sha256={self.file_hash(image)}")

    def refs(self, media: Media | None) -> list[dict[str, Any]]:
        """Every media reference of a unit (what the BaselineCache key holds)."""
        if media is None:
            return []
        out: list[dict[str, Any]] = [{"frame": self.ref(f.image), "t": f.t}
                                     for f in pick_frames(media.frames,
                                                          self.options.max_frames)]
        if media.video is not None:
            v = media.video
            out.append({"video": v.url, "start": v.start, "end": v.end})
        return out


@dataclass(frozen=True)
class UnitRecord:
    """One multiple-choice unit of an ``llm`` workspace (a line of ``units.jsonl``)."""

    unit_id: str
    task_type: str
    question: str
    options: tuple[str, ...]
    answer: str
    media: Media | None = None
    """Frames and/or a video shown with the question (`Media`)."""
    task_description: str | None = None
    """The task the prompts name, as the line states it (one per file: `units_task_description`)."""


_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def task_description_problem(task: Any) -> str | None:
    """What is wrong with a task description (None: it is one non-empty line of at most
    `MAX_TASK_DESCRIPTION` characters)."""
    if isinstance(task, str) and task.strip() and "\n" not in task \
            and len(task) <= MAX_TASK_DESCRIPTION:
        return None
    return f"must be one non-empty line of at most {MAX_TASK_DESCRIPTION} characters"


def _unit_record(obj: Any) -> UnitRecord:
    """Validate one parsed line; ValueError says what is wrong (extra keys are ignored)."""
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("unit_id", "task_type", "question", "options", "answer")
               if k not in obj]
    if missing:
        raise InputError(f"missing keys {missing}")
    for k in ("unit_id", "task_type", "question"):
        if not isinstance(obj[k], str) or not obj[k].strip():
            raise InputError(f"{k} must be a non-empty string, got {shown(obj[k])}")
    slugify(obj["task_type"])
    opts = obj["options"]
    if not isinstance(opts, list) or not 2 <= len(opts) <= len(_LETTERS) \
            or not all(isinstance(o, str) and o.strip() for o in opts):
        raise InputError(f"options must be a list of 2 to 26 non-empty strings, got {shown(opts)}")
    ans = obj["answer"]
    if isinstance(ans, str):  # a Chinese input method types "Ｂ": read as "B"
        ans = unicodedata.normalize("NFKC", ans)
    valid = _LETTERS[:len(opts)]
    if not isinstance(ans, str) or ans.strip().upper() not in valid or len(ans.strip()) != 1:
        raise InputError(f"answer must be one letter of {valid!r}, got {shown(obj['answer'])}")
    ans = ans.strip().upper()
    said = opts[valid.index(ans)]
    same = [valid[i] for i, o in enumerate(opts)
            if valid[i] != ans and _option_key(o) == _option_key(said)]
    if same:  # a reply by letter is a coin toss, one by text matches both
        raise InputError(f"option {ans}, the answer, has the text of option {same[0]} "
                         f"({shown(said)}): no reply can tell them apart")
    task = obj.get("task_description")
    if task is not None and (why := task_description_problem(task)):
        raise InputError(f"task_description {why}, got {shown(task)}")
    return UnitRecord(obj["unit_id"], obj["task_type"], obj["question"], tuple(opts),
                      ans, parse_media(obj.get("media")), task)


def _option_key(text: str) -> str:
    """An option's text as a reader compares it: NFKC, case and spacing ignored."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _check_text(obj: Any) -> None:
    """ValueError if a parsed JSON value holds text that is not valid Unicode (a lone
    surrogate such as ``"\\ud800"``): it cannot be encoded into a prompt or a cache key."""
    if (bad := lone_surrogate(json.dumps(obj, ensure_ascii=False))) is not None:
        raise InputError(f"invalid text: a lone surrogate "
                         f"{bad.group().encode('unicode_escape').decode()} (not a Unicode "
                         f"character)")


def _not_json_lines(line: str, read: Mapping[str, UnitRecord]) -> str:
    """A hint when the file's first unit opens a JSON array or an object spread over lines
    (``json.dump(..., indent=2)``): the file is JSON, not JSON lines."""
    opening = line.strip()
    if read or not (opening.startswith("[") or opening == "{"):
        return ""
    return ("; a units file is JSON lines: one unit's object on each line, not a JSON array "
            "or an indented object")


def read_units(path: str | Path, root: Path | None = None) -> dict[str, UnitRecord]:
    """Parse and validate a units file (JSON lines; blank lines and a leading byte order mark
    skipped), in file order.

    Raises WorkspaceError naming the file and the line of the first fault (malformed JSON,
    invalid text such as a lone surrogate, missing key, bad options or answer, duplicate unit id,
    a ``task_description`` unlike an earlier line's: a file names one task).
    """
    path = user_path(path)
    name = _rel(root, path) if root else str(path)
    if not path.exists():
        raise WorkspaceError(f"{name}: missing (expected a units file at {path})")
    try:
        lines = read_settings_text(path).splitlines()
    except OSError as exc:
        raise WorkspaceError(f"{name}: cannot read the units file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{name}: {not_utf8(exc)}") from None
    units: dict[str, UnitRecord] = {}
    task: tuple[int, str] | None = None  # the first line that states a task_description
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = strict_json(line)
            _check_text(obj)
            rec = _unit_record(obj)
        except json.JSONDecodeError as exc:
            raise WorkspaceError(f"{name}: line {i}: malformed JSON at column {exc.colno}: "
                                 f"{exc.msg}{_not_json_lines(line, units)}") from None
        except RecursionError:
            raise WorkspaceError(f"{name}: line {i}: nested too deeply to be a unit") from None
        except ValueError as exc:
            raise WorkspaceError(f"{name}: line {i}: {exc}{_not_json_lines(line, units)}") \
                from None
        if rec.unit_id in units:
            raise WorkspaceError(f"{name}: line {i}: duplicate unit_id {rec.unit_id!r}")
        if rec.task_description is not None:
            task = task or (i, rec.task_description)
            if rec.task_description != task[1]:
                raise WorkspaceError(
                    f"{name}: line {i}: task_description {rec.task_description!r:.80} differs "
                    f"from line {task[0]}'s {task[1]!r:.80} (a units file names one task)")
        units[rec.unit_id] = rec
    if not units:
        raise WorkspaceError(f"{name}: no units (expected one JSON object a line)")
    return units


def units_task_description(units: Mapping[str, UnitRecord]) -> str | None:
    """The task a units file names (the ``task_description`` its lines agree on), or None."""
    return next((u.task_description for u in units.values()
                 if u.task_description is not None), None)


def units_pool(units: Mapping[str, UnitRecord]) -> dict[str, list[str]]:
    """The unit pool of a units file: ``{task type: [unit ids in file order]}``."""
    pool: dict[str, list[str]] = {}
    for u in units.values():
        pool.setdefault(u.task_type, []).append(u.unit_id)
    return pool

