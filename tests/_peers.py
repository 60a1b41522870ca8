"""A TCP peer on loopback that answers every read with the same bytes: a server that is no
Redis (an HTTP server on the wrong port, a peer that answers Redis's handshake oddly)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def lying_peer(reply: bytes) -> Iterator[int]:
    """Serve ``reply`` to every read on a loopback port (yielded) until the block ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    while conn.recv(4096):
                        conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)
