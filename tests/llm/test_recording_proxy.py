"""The recording proxy the real-model tests judge re-runs with (`vtrm_gate.testing.llama`):
a run's requests are those that arrived before the next mark, however late the server
answers them, and a call is its run id and body."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request

from vtrm_gate.cache import RUN_HEADER
from vtrm_gate.testing.chat import ChatServer, Fault
from vtrm_gate.testing.llama import RecordingProxy

BODY = {"model": "m", "messages": [{"role": "system", "content": "strategy: last"},
                                   {"role": "user", "content": "Q\nA. x\nB. y\n\nAnswer."}]}


def post(proxy: RecordingProxy, run_id: str, timeout: float = 30) -> None:
    req = urllib.request.Request(f"{proxy.url}/chat/completions", json.dumps(BODY).encode(),
                                 {"Content-Type": "application/json", RUN_HEADER: run_id})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()


def test_a_late_answer_stays_with_the_run_that_asked_and_calls_are_run_and_body() -> None:
    with ChatServer() as server:
        server.faults.append(Fault(sleep=1.0))  # the first run's last call: answered late
        proxy = RecordingProxy(server.url)
        try:
            slow = threading.Thread(target=post, args=(proxy, "run%2F1"))
            slow.start()
            while proxy.mark() < 1:
                time.sleep(0.01)
            n1 = proxy.mark()  # the first run is over; its call is still being answered
            post(proxy, "run%2F2")  # the next run's, answered first
            post(proxy, "run%2F2")  # asked again in its run, after an answer
            slow.join()
            assert [e.run_id for e in proxy.between(0, 3)] == ["run/1", "run/2", "run/2"]
            assert [e.run_id for e in proxy.exchanges] == ["run/2", "run/2", "run/1"]
            assert proxy.runs(0, n1) == ["run/1"] and proxy.runs(n1, 3) == ["run/2"] * 2
            assert proxy.repeated(n1, 3) == ["run/2: 2 messages"]
            assert not proxy.repeated(0, n1)
            again, _ = proxy.reasked(n1, 3)  # one body, another run: another call
            assert again == set()
        finally:
            proxy.close()


def test_a_run_read_before_its_last_call_is_answered_still_holds_that_call() -> None:
    """`between` waits for every request that arrived before its end mark: a call the
    client gave up on is the run's, even if the server has not answered it yet (and a
    reader right after a reply reached the client cannot outrun the proxy's record)."""
    with ChatServer() as server:
        server.faults.append(Fault(sleep=1.0))
        proxy = RecordingProxy(server.url)
        try:
            with contextlib.suppress(OSError):  # the client leaves; the server answers on
                post(proxy, "run%2F1", timeout=0.2)
            n1 = proxy.mark()
            run = proxy.between(0, n1)
            assert n1 == 1 and [(e.run_id, e.status, e.delivered) for e in run] == [
                ("run/1", 200, False)]
        finally:
            proxy.close()
