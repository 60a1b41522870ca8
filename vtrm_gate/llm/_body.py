"""A response body read and decoded within one byte cap.

httpx decodes each network chunk with no limit on what it produces, and stacked codings
(``Content-Encoding: gzip, gzip``) multiply: a 2 KB body became 1 GiB in one chunk before
any cap saw it. Here the raw bytes are capped as they arrive, and each coding is undone by
zlib with the same cap on its output.
"""

from __future__ import annotations

import zlib

import httpx

ACCEPT_ENCODING = "gzip, deflate"
"""What the agent and the cached client accept: the codings `read_body` undoes (httpx would
also offer ``br`` and ``zstd`` where their packages are installed)."""

_CODINGS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16,
            "deflate": zlib.MAX_WBITS, "identity": 0}


class BodyTooLarge(Exception):
    """The body passed the cap: ``seen`` bytes (raw, or decoded when ``coding`` is set)."""

    def __init__(self, seen: int, coding: str = "") -> None:
        super().__init__(seen, coding)
        self.seen, self.coding = seen, coding

    def where(self) -> str:
        """``aborted after N bytes`` or ``decoding gzip passed N bytes``, for a message."""
        if self.coding:
            return f"decoding {self.coding} passed {self.seen} bytes"
        return f"aborted after {self.seen} bytes"


class BodyError(ValueError):
    """The body cannot be decoded under its Content-Encoding (named in the message)."""


def codings(headers: httpx.Headers) -> list[str]:
    """The Content-Encoding codings in the order they were applied; `BodyError` for one
    that `read_body` cannot undo."""
    found = [c.strip().lower() for c in headers.get_list("content-encoding", split_commas=True)]
    found = [c for c in found if c]
    unknown = [c for c in found if c not in _CODINGS]
    if unknown:
        raise BodyError(f"Content-Encoding {', '.join(unknown)!s} is not supported (the "
                        f"request accepts {ACCEPT_ENCODING})")
    return found


async def read_body(r: httpx.Response, cap: int) -> bytes:
    """``r``'s body decoded, at most ``cap`` bytes raw and decoded: `BodyTooLarge` as soon
    as either passes it, `BodyError` when a coding is not what it says."""
    applied = codings(r.headers)
    chunks, n = [], 0
    async for chunk in r.aiter_raw():
        n += len(chunk)
        if n > cap:
            raise BodyTooLarge(n)
        chunks.append(chunk)
    data = b"".join(chunks)
    for coding in reversed(applied):
        data = _undo(data, coding, cap)
    return data


def _undo(data: bytes, coding: str, cap: int) -> bytes:
    """One coding undone, at most ``cap`` bytes out (deflate: zlib-wrapped or raw, as
    servers send both)."""
    wbits = _CODINGS[coding]
    if not wbits or not data:
        return data
    for bits in (wbits, -zlib.MAX_WBITS) if coding == "deflate" else (wbits,):
        d = zlib.decompressobj(bits)
        try:
            out = d.decompress(data, cap + 1)
        except zlib.error as exc:
            why = str(exc)
            continue
        if len(out) > cap:
            raise BodyTooLarge(len(out), coding)
        if not d.eof:
            raise BodyError(f"the {coding} body is cut short ({len(data)} bytes)")
        return out
    raise BodyError(f"the body is not valid {coding} ({why})")
