"""A chat server that accepts OpenAI-style content parts and checks the frames it receives:
each ``image_url`` must be an http(s) URL or a ``data:`` URI that decodes to an image; what
arrived is kept per request in ``received`` (for the tests of `vtrm_gate.llm.MediaResolver`)."""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from typing import Any

from ..errors import described
from .chat import ChatServer


@dataclass(frozen=True)
class Received:
    """One image part as the server got it: ``data`` (with decoded size and sha256 of the
    bytes) or ``url``; ``error`` when a data URI did not decode to an image."""

    kind: str
    url: str | None = None
    size: tuple[int, int] | None = None
    sha256: str | None = None
    error: str | None = None


def flatten(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with list contents joined into their text parts (for the answer rule)."""
    msgs = []
    for m in body.get("messages", []):
        c = m.get("content")
        if isinstance(c, list):
            c = "\n".join(p.get("text", "") for p in c if p.get("type") == "text")
        msgs.append({**m, "content": c})
    return {**body, "messages": msgs}


def decode_part(part: dict[str, Any]) -> Received:
    url = str(part.get("image_url", {}).get("url", ""))
    if url.startswith(("http://", "https://")):
        return Received("url", url=url)
    if not url.startswith("data:image/") or ";base64," not in url:
        return Received("bad", url=url[:60], error="neither a URL nor a data:image URI")
    from PIL import Image

    data = base64.b64decode(url.split(",", 1)[1])
    try:
        with Image.open(io.BytesIO(data)) as im:
            size = im.size
    except Exception as exc:
        return Received("bad", error=described(exc))
    return Received("data", size=size, sha256=hashlib.sha256(data).hexdigest())


class MediaChatServer(ChatServer):
    """`ChatServer` for multimodal requests: ``received[i]`` lists the image parts (and
    ``videos[i]`` the video URLs) of ``requests[i]``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.received: list[list[Received]] = []
        self.videos: list[list[str]] = []

    @staticmethod
    def step_of(body: dict[str, Any]) -> str:
        return ChatServer.step_of(flatten(body))

    def answer(self, body: dict[str, Any], step: str) -> dict[str, Any]:
        parts = [p for m in body.get("messages", []) if isinstance(m.get("content"), list)
                 for p in m["content"]]
        with self.lock:
            self.received.append([decode_part(p) for p in parts
                                  if p.get("type") == "image_url"])
            self.videos.append([p["video_url"]["url"] for p in parts
                                if p.get("type") == "video_url"])
        return super().answer(flatten(body), step)

    def completion(self, body: dict[str, Any], text: str,
                   finish: str = "stop") -> dict[str, Any]:
        return super().completion(flatten(body), text, finish)
