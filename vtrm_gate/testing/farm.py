"""Chat servers of different speeds that can die and come back on the same port (tests of
`vtrm_gate.llm.EndpointPool`): a `ChatServer` plus a per-request delay, a peak-concurrency gauge,
and `die_after` / `stop` / `restart`; and `SingleSlotChatServer`, which like llama.cpp's server
answers one request at a time while the others wait in its queue."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from .chat import ChatServer


class SlowChatServer(ChatServer):
    """A `ChatServer` that answers after ``delay_s`` and records its peak concurrency."""

    def __init__(self, delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay_s = delay_s
        self.active = self.peak_active = 0
        self.served = 0
        self.outages = 0
        self._die: tuple[int, float] | None = None
        self._gauge = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def die_after(self, n_requests: int, down_s: float) -> None:
        """After the ``n_requests``-th request, stop listening for ``down_s`` seconds."""
        self._die = (n_requests, down_s)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        with self._gauge:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
            self.served += 1
            die = self._die is not None and self.served == self._die[0]
        try:
            if die:
                threading.Thread(target=self._outage, args=(self._die[1],),  # type: ignore[index]  # die: set
                                 daemon=True).start()
            if self.delay_s:
                time.sleep(self.delay_s)
            super().handle(h)
        finally:
            with self._gauge:
                self.active -= 1

    def _outage(self, down_s: float) -> None:
        self.stop()
        time.sleep(down_s)
        self.restart()

    def stop(self) -> None:
        """Stop listening (connections are refused) until `restart`."""
        self.outages += 1
        self.httpd.shutdown()
        self.httpd.server_close()

    def restart(self) -> None:
        """Listen again on the same port."""
        server_cls, handler = type(self.httpd), self.httpd.RequestHandlerClass
        port = self.port
        for _ in range(100):
            try:
                self.httpd = server_cls(("127.0.0.1", port), handler)
                break
            except OSError:
                time.sleep(0.02)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)
        self.thread.start()


class SlottedChatServer(SlowChatServer):
    """Serves ``slots`` requests at a time, each taking ``service_s`` (plus ``per_word_s``
    per word of the reply), the rest queued in arrival order: a model server with that many
    slots. ``peak_waiting`` is the longest its queue grew, ``queued_on_arrival`` the queue
    each request found (in arrival order: its mean is steadier than the peak under load),
    ``peak_wait_s`` the longest a request waited in it, and ``peak_service_s`` the longest
    one took once served (both measured: on a loaded machine they exceed ``service_s``)."""

    def __init__(self, service_s: float = 0.05, per_word_s: float = 0.0, slots: int = 1,
                 **kwargs: Any) -> None:
        super().__init__(0.0, **kwargs)
        self.service_s, self.per_word_s, self.slots = service_s, per_word_s, slots
        self._slot = threading.Semaphore(slots)
        self.inside = 0
        self.queued_on_arrival: list[int] = []
        self.peak_wait_s = self.peak_service_s = 0.0

    @property
    def peak_waiting(self) -> int:
        """The longest the queue grew: it grows only when a request arrives."""
        return max(self.queued_on_arrival, default=0)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        with self._gauge:
            self.queued_on_arrival.append(max(0, self.inside - self.slots + 1))
            self.inside += 1  # being served or waiting for a slot
        arrived = time.monotonic()
        try:
            with self._slot:
                served = time.monotonic()
                time.sleep(self.service_s)
                super().handle(h)
                with self._gauge:
                    self.peak_wait_s = max(self.peak_wait_s, served - arrived)
                    self.peak_service_s = max(self.peak_service_s, time.monotonic() - served)
        finally:
            with self._gauge:
                self.inside -= 1

    def completion(self, body: dict[str, Any], text: str,
                   finish: str = "stop") -> dict[str, Any]:
        if self.per_word_s:
            time.sleep(self.per_word_s * len(text.split()))
        return super().completion(body, text, finish)


class SingleSlotChatServer(SlottedChatServer):
    """One request at a time, the others queued: llama.cpp's server (see `SlottedChatServer`)."""

    def __init__(self, service_s: float = 0.05, per_word_s: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(service_s, per_word_s, slots=1, **kwargs)
