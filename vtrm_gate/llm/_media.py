"""Video frames in the prompt: a unit's media as OpenAI-style content parts, and the
references in them resolved to ``data:`` URIs just before a request is sent.

The messages hold *references* (`vtrm_gate.harness.MediaRefs`), so cache keys stay small and
change with a frame's bytes; `MediaResolver.resolve` reads, checks and resizes the frames
(Pillow, to ``max_side``) on the way out.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from ..errors import MediaChangedError, MediaError
from ..harness import (
    DEFAULT_MAX_PIXELS,
    REF_SCHEME,
    Media,
    MediaOptions,
    MediaRefs,
    check_image,
    check_size,
    frame_path,
    open_image,
    pick_frames,
)

WEB_FORMATS = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif",
               "WEBP": "image/webp"}
"""What chat endpoints accept in a data URI; any other format (BMP, TIFF) is sent as PNG."""


class MediaResolver(MediaRefs):
    """Builds a unit's content parts with references and resolves them to ``data:`` URIs.

    File hashes are memoised by (path, size, mtime); encoded images by reference (LRU).
    """

    def __init__(self, options: MediaOptions, cache_size: int = 256) -> None:
        super().__init__(options)
        self._encoded: OrderedDict[str, str] = OrderedDict()
        self._cache_size = cache_size

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
        data = _read_frame(path, self.options)
        want = ref.rsplit("#sha256=", 1)[-1]
        if hashlib.sha256(data).hexdigest() != want:
            raise MediaChangedError(f"frame {path!r}: changed since its reference was made")
        uri = data_uri(data, self.options.max_side, max_pixels=self.options.max_pixels,
                       name=path)
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



def _read_frame(path: str, options: MediaOptions) -> bytes:
    """A local frame's bytes: inside the units directory and within the size cap (checked
    before reading); `MediaError` naming it otherwise (deleted mid-gate, say)."""
    full = frame_path(options.root, path)
    try:
        with open(full, "rb") as f:
            check_size(path, os.fstat(f.fileno()).st_size, options)
            return f.read(options.max_frame_bytes + 1)
    except OSError as exc:
        raise MediaError(f"frame {path!r}: missing or unreadable ({exc.strerror})") from None


def data_uri(data: bytes, max_side: int, *, max_pixels: int = DEFAULT_MAX_PIXELS,
             name: str = "frame") -> str:
    """``data:image/...;base64,...`` of an image, downscaled so its longest side is at most
    ``max_side`` (0: unchanged). The MIME type is the image's format, read from its bytes
    (never its file name); a format chat endpoints do not take (BMP, TIFF) is re-encoded as
    PNG. `MediaError` for bytes that are no image, an image over ``max_pixels`` (checked
    from its header, before decoding) or one that cannot be decoded (truncated)."""
    options = MediaOptions(max_pixels=max_pixels)
    with open_image(name, io.BytesIO(data)) as im:
        check_image(name, im, options)
        fmt = im.format
        resize = bool(max_side) and max(im.size) > max_side
        try:
            if resize or fmt not in WEB_FORMATS:
                data, fmt = _reencode(im, fmt, max_side if resize else 0)
            else:  # sent as stored: its chunks checked (a truncated PNG fails), not decoded
                im.verify()
        except Exception as exc:  # Pillow raises what its parsers raise
            raise MediaError(f"frame {name!r}: damaged image ({type(exc).__name__}: "
                             f"{exc})") from None
    return f"data:{WEB_FORMATS[fmt]};base64,{base64.b64encode(data).decode()}"


def _reencode(im: Any, fmt: str, max_side: int) -> tuple[bytes, str]:
    """The image decoded, downscaled to ``max_side`` (0: kept) and saved as JPEG (a JPEG)
    or PNG (anything else)."""
    im = im.copy()  # decodes: a truncated file fails here
    if max_side:
        im.thumbnail((max_side, max_side))
    fmt = "JPEG" if fmt == "JPEG" else "PNG"
    if fmt == "JPEG" and im.mode not in ("RGB", "L"):
        im = im.convert("RGB")
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue(), fmt
