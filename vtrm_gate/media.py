"""Video frames in the prompt: a unit's media (frame images with timestamps, a video URL),
as OpenAI-style content parts.

A unit line may carry ``"media": {"frames": [{"image": "frames/v1_0.jpg", "t": 0.0}, ...],
"video": {"url": "https://...", "start": 0, "end": 30}}``; an image is a local path
(relative to the media root: the units file's directory) or an http(s) URL.

The agent's messages hold *references*, not pixels: a local frame is
``vtrm-file:<path>?max_side=N#sha256=<content hash>``, a remote one its URL. So the response
cache key and the BaselineCache key carry every media reference (path + content hash, or
URL) and change when a frame's bytes change, while the key stays small. `MediaResolver.
resolve` turns the references into ``data:`` URIs (resized with Pillow to ``max_side``) on
the way out, just before the request is sent.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

REF_SCHEME = "vtrm-file:"
DEFAULT_MAX_FRAMES = 8
DEFAULT_MAX_SIDE = 768


def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://", "data:"))


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


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
        raise ValueError(f"media must be an object with 'frames' and/or 'video', got {obj!r}")
    frames = []
    raw = obj.get("frames") or []
    if not isinstance(raw, list):
        raise ValueError(f"media.frames must be a list, got {type(raw).__name__}")
    for i, f in enumerate(raw):
        if isinstance(f, str):
            f = {"image": f}
        if not isinstance(f, Mapping) or not isinstance(f.get("image"), str) \
                or not f["image"].strip() or not set(f) <= {"image", "t"}:
            raise ValueError(f"media.frames[{i}] must be a path or URL, or {{\"image\", \"t\"}}"
                             f", got {f!r}")
        t = f.get("t")
        if t is not None and not _num(t):
            raise ValueError(f"media.frames[{i}].t must be a number of seconds >= 0, got {t!r}")
        frames.append(Frame(f["image"], None if t is None else float(t)))
    video = None
    v = obj.get("video")
    if v is not None:
        if isinstance(v, str):
            v = {"url": v}
        if not isinstance(v, Mapping) or not isinstance(v.get("url"), str) \
                or not v["url"].startswith(("http://", "https://")) \
                or not set(v) <= {"url", "start", "end"}:
            raise ValueError(f"media.video must be an http(s) URL or {{\"url\", \"start\", "
                             f"\"end\"}}, got {v!r}")
        for k in ("start", "end"):
            if v.get(k) is not None and not _num(v[k]):
                raise ValueError(f"media.video.{k} must be a number of seconds >= 0, "
                                 f"got {v[k]!r}")
        video = Video(v["url"], v.get("start"), v.get("end"))
    if not frames and video is None:
        return None
    return Media(tuple(frames), video)


def missing_media(media: Media | None, root: str | os.PathLike[str]) -> list[str]:
    """The local frame paths of ``media`` that are not files under ``root``."""
    if media is None:
        return []
    return [p for p in media.local_paths() if not (Path(root) / p).is_file()]


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
    pixels (0: as stored), ``detail`` for the image parts; paths relative to ``root``."""

    root: str = "."
    max_frames: int = DEFAULT_MAX_FRAMES
    max_side: int = DEFAULT_MAX_SIDE
    detail: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.max_frames, bool) or not isinstance(self.max_frames, int) \
                or self.max_frames < 1:
            raise ValueError(f"media.max_frames must be an integer >= 1, got "
                             f"{self.max_frames!r}")
        if isinstance(self.max_side, bool) or not isinstance(self.max_side, int) \
                or self.max_side < 0:
            raise ValueError(f"media.max_side must be an integer >= 0, got {self.max_side!r}")
        if self.detail not in ("auto", "low", "high"):
            raise ValueError(f"media.detail must be auto, low or high, got {self.detail!r}")

    @classmethod
    def from_agent(cls, agent: Mapping[str, Any], root: str | os.PathLike[str]) -> MediaOptions:
        """From an agent config's ``media`` object and ``media_root`` (else ``root``)."""
        m = dict(agent.get("media") or {})
        return cls(str(agent.get("media_root") or root), **m)


class MediaResolver:
    """Builds a unit's content parts with references and resolves them to ``data:`` URIs.

    File hashes are memoised by (path, size, mtime); encoded images by reference (LRU).
    """

    def __init__(self, options: MediaOptions, cache_size: int = 256) -> None:
        self.options = options
        self._hashes: dict[tuple[str, int, int], str] = {}
        self._encoded: OrderedDict[str, str] = OrderedDict()
        self._cache_size = cache_size

    def file_hash(self, path: str) -> str:
        full = Path(self.options.root) / path
        st = full.stat()
        k = (str(full), st.st_size, st.st_mtime_ns)
        h = self._hashes.get(k)
        if h is None:
            h = self._hashes[k] = hashlib.sha256(full.read_bytes()).hexdigest()
        return h

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

    def user_content(self, text: str, media: Media | None) -> str | list[dict[str, Any]]:
        """The user message's content: ``text`` alone, or text then the video and frames as
        OpenAI-style parts (``video_url``, ``image_url``), each frame after its timestamp."""
        if media is None:
            return text
        parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if media.video is not None:
            v = media.video
            span = "" if v.start is None and v.end is None else (
                f" from {v.start or 0:g} s to {'the end' if v.end is None else f'{v.end:g} s'}")
            parts.append({"type": "text", "text": f"Video{span}:"})
            parts.append({"type": "video_url", "video_url": {"url": v.url}})
        for f in pick_frames(media.frames, self.options.max_frames):
            if f.t is not None:
                parts.append({"type": "text", "text": f"Frame at {f.t:g} s:"})
            parts.append({"type": "image_url",
                          "image_url": {"url": self.ref(f.image), "detail": self.options.detail}})
        return parts

    def _encode(self, ref: str) -> str:
        hit = self._encoded.get(ref)
        if hit is not None:
            self._encoded.move_to_end(ref)
            return hit
        path = unquote(ref[len(REF_SCHEME):].split("?", 1)[0].split("#", 1)[0])
        data = (Path(self.options.root) / path).read_bytes()
        want = ref.rsplit("#sha256=", 1)[-1]
        if hashlib.sha256(data).hexdigest() != want:
            raise MediaChangedError(f"frame {path} changed since its reference was made")
        uri = data_uri(data, self.options.max_side)
        self._encoded[ref] = uri
        if len(self._encoded) > self._cache_size:
            self._encoded.popitem(last=False)
        return uri

    def resolve(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """``body`` with every ``vtrm-file:`` image reference replaced by a ``data:`` URI
        (the same object when there is none)."""
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not any(isinstance(m.get("content"), list)
                                                 for m in msgs if isinstance(m, Mapping)):
            return body
        out = []
        for m in msgs:
            c = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(c, list):
                c = [{**p, "image_url": {**p["image_url"],
                                         "url": self._encode(p["image_url"]["url"])}}
                     if p.get("type") == "image_url"
                     and str(p["image_url"].get("url", "")).startswith(REF_SCHEME) else p
                     for p in c]
                m = {**m, "content": c}
            out.append(m)
        return {**body, "messages": out}


class MediaChangedError(RuntimeError):
    """A frame file's bytes differ from the hash its reference (and cache key) holds."""


def data_uri(data: bytes, max_side: int) -> str:
    """``data:image/...;base64,...`` of an image, downscaled so its longest side is at most
    ``max_side`` (0: unchanged). Needs Pillow only to read the format or to resize."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        fmt = (im.format or "PNG").upper()
        if max_side and max(im.size) > max_side:
            im = im.copy()
            im.thumbnail((max_side, max_side))
            fmt = "JPEG" if fmt == "JPEG" else "PNG"
            if fmt == "JPEG" and im.mode not in ("RGB", "L"):
                im = im.convert("RGB")
            buf = io.BytesIO()
            im.save(buf, format=fmt)
            data = buf.getvalue()
    mime = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif",
            "WEBP": "image/webp"}.get(fmt, "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
