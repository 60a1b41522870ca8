"""Several endpoints: three real loopback chat servers of different speeds, per-endpoint
caps, least-loaded routing, an endpoint that dies mid-step and comes back, and the
per-endpoint counters in the step report."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.llm.test_backends import evolve_reply, write_units
from vtrm_gate.cache import ResponseCache
from vtrm_gate.errors import EndpointsError
from vtrm_gate.harness import StepResult, Workspace, WorkspaceError, run_step
from vtrm_gate.llm import (
    Endpoint,
    EndpointPool,
    RetryPolicy,
    gate_concurrency,
    init_llm,
    llm_backend,
    parse_endpoints,
    read_endpoints_file,
    rollout_cases,
)
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import ChatServer, RedisTarget
from vtrm_gate.testing.farm import SlowChatServer

PATIENT = RetryPolicy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.05, max_total_s=60.0)


def farm(*delays: float) -> list[SlowChatServer]:
    servers = [SlowChatServer(d, evolve_reply=evolve_reply) for d in delays]
    for s in servers:
        s.start()
    return servers


def run(ws: Workspace, target: RedisTarget, pool: EndpointPool | None,
        concurrency: int, subscribers: Any = ()) -> StepResult:
    cache = ResponseCache(target.url, prefix=target.prefix)
    backend = llm_backend(ws, RunOptions(), cache=cache, api_key="k", env={}, retry=PATIENT,
                          endpoints=pool)

    async def go() -> StepResult:
        try:
            cases = await rollout_cases(backend, ws, 1, 1)
            # every call finishes, so each request a server answered is one the pool
            # counted (a call cancelled past a stop may have been answered, never read)
            return await run_step(ws, 1, 1, infer=backend.infer, evolver=backend.evolver,
                                  cases=cases, cache_stats=backend.cache_stats,
                                  options=RunOptions(concurrency=concurrency,
                                                     past_stop="wait",
                                                     cancel_after_freeze=False),
                                  subscribers=subscribers)
        finally:
            await backend.aclose()

    return asyncio.run(go())


async def probe_back(pool: EndpointPool, server: SlowChatServer) -> bool:
    """After the step: calls through the pool until the dead endpoint is up again (the
    step may end before its outage does). Bounded: 200 calls."""
    import httpx

    async with httpx.AsyncClient() as client:
        for _ in range(200):
            if {s.url: s for s in pool.stats()}[server.url].up:
                return True
            try:
                await pool.post(client, "nothing-here", json={})
            except httpx.TransportError:
                await asyncio.sleep(0.05)
    return False


def test_one_of_three_endpoints_dies_mid_step_no_call_lost_decisions_unchanged(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    with ChatServer(evolve_reply=evolve_reply) as single:
        ref_ws = init_llm(tmp_path / "ref", write_units(tmp_path / "u.jsonl"),
                                    base_url=single.url, model="m", seed=1)
        reference = run(ref_ws, redis_target, None, 12)
        ref_ws.close()
    fast, mid, slow = servers = farm(0.0, 0.01, 0.04)
    try:
        mid.die_after(20, down_s=0.5)  # mid-step: the step makes ~150 calls
        caps = [Endpoint(s.url, 4) for s in servers]
        pool = EndpointPool(caps, fail_after=2, probe_after_s=0.1)
        ws = init_llm(tmp_path / "ws", write_units(tmp_path / "u2.jsonl"),
                                base_url=[s.url for s in servers], model="m", seed=1)
        concurrency = gate_concurrency(None, caps)
        res = run(ws, redis_target, pool, concurrency)
        ws.close()
        came_back = asyncio.run(probe_back(pool, mid))
    finally:
        for s in servers:
            s.close()
    assert concurrency == 12
    assert res.decisions == reference.decisions
    assert res.gate is not None and reference.gate is not None
    assert res.gate.total("infra_units") == 0  # no call lost
    stats = {s.url: s for s in pool.stats()}
    dying = stats[mid.url]
    assert mid.outages == 1 and dying.transport_failures >= 1 and dying.times_down == 1
    assert came_back and mid.served > 20  # probed back once it listens again, and used
    assert all(s.peak_active <= 4 for s in servers)  # each endpoint's cap held
    assert stats[fast.url].calls > stats[slow.url].calls  # least-loaded routing
    answered = sum(s.calls - s.transport_failures for s in stats.values())
    assert answered == sum(s.served for s in servers)  # every request was counted
    assert all(s.latency_p50_s is not None and s.latency_p95_s >= s.latency_p50_s
               for s in stats.values())


def test_cli_step_reports_each_endpoint_and_uses_the_sum_of_caps(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    servers = farm(0.0, 0.005, 0.01)
    try:
        efile = tmp_path / "endpoints.txt"
        efile.write_text("# url  max_concurrency\n" + "".join(
            f"{s.url} {cap}\n" for s, cap in zip(servers, (2, 3, 4), strict=True)))
        ws = tmp_path / "ws"
        env = {**os.environ, "REDIS_URL": redis_target.url,
               "VTRM_CACHE_PREFIX": redis_target.prefix}
        env.pop("VTRM_CONCURRENCY", None)
        vg = [sys.executable, "-m", "vtrm_gate"]
        init = subprocess.run([*vg, "init", str(ws), "--llm", "--units",
                               str(write_units(tmp_path / "u.jsonl")), "--endpoints",
                               str(efile), "--model", "m", "--seed", "1"],
                              capture_output=True, text=True, env=env, timeout=60, check=False)
        assert init.returncode == 0, init.stderr
        # every call finishes, so each server's count is of requests the pool kept open (a
        # call cancelled past a stop frees its slot when its request closes, and the server
        # may still be working on it: 5 on a cap of 4 in about 1 run of 20 before)
        every_call = ["--past-stop", "wait", "--no-cancel-after-freeze"]
        out = subprocess.run([*vg, "step", "--workspace", str(ws), "--epoch", "1", "--step",
                              "1", *every_call], capture_output=True, text=True, env=env,
                             timeout=120, check=False)
        assert out.returncode == 0, out.stderr
        assert "/9, tokens" in out.stdout  # peak in flight N/9: the sum of the caps
        assert out.stdout.count("cap ") == 3 and "endpoints:" in out.stdout
        js = subprocess.run([*vg, "step", "--workspace", str(ws), "--epoch", "1", "--step",
                             "1", "--json", "--concurrency", "5", *every_call],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
        assert js.returncode == 0, js.stderr
        doc = json.loads(js.stdout)
        eps = doc["llm_cache"]["endpoints"]
        assert [e["max_concurrency"] for e in eps] == [2, 3, 4]
        assert doc["peak_in_flight"] <= 5  # set lower than the sum: the lower one wins
    finally:
        for s in servers:
            s.close()
    assert all(s.peak_active <= cap for s, cap in zip(servers, (2, 3, 4), strict=True))


@pytest.mark.parametrize(("value", "match"), [
    ([], "no endpoints"),
    (["ftp://x"], "http"),
    ([{"url": "http://a", "max_concurrency": 0}], "max_concurrency"),
    (["http://a", "http://a/"], "duplicate"),
    ([{"url": "http://a", "cap": 3}], "expected a URL"),
    ("http://a 3 4", "expected 'URL \\[max_concurrency\\]'"),
    ("http://a \u00b2", "expected 'URL \\[max_concurrency\\]'"),  # a digit, no decimal
    ("http://a/v1, http://b/v1", "expected 'URL \\[max_concurrency\\]'"),
    (["http://a:99999/v1"], "port 99999 is not from 1 to 65535"),
    (["http://a:0/v1"], "port 0 is not from 1 to 65535"),
    (["http://"], "has no host"),
    # init took them, then every step failed with an httpx/idna traceback (h9)
    (["http://xn--zz/v1"], "is not a host name httpx can send to"),
    (["http://\udcff/v1"], "is not a host name httpx can send to"),
    (["http://[::1/v1"], "not a URL \\(Invalid IPv6 URL\\)"),
    (["http://a/v1/chat/completions"], "is the chat endpoint itself"),
])
def test_bad_endpoint_lists_are_refused_naming_the_entry(value: Any, match: str) -> None:
    with pytest.raises(EndpointsError, match=match):
        parse_endpoints(value)


@pytest.mark.parametrize("line", ["http://a/v1, 4", "http://a/v1,4", "http://a/v1 , 4",
                                  "http://a/v1\t4", "http://a/v1 4,"])
def test_an_endpoint_line_with_a_comma_before_its_cap_is_read(line: str) -> None:
    """"URL, cap" (a line from a spreadsheet) became the URL "http://a/v1," and every call
    to it a 404, INFRA."""
    assert parse_endpoints(line + "\n") == (Endpoint("http://a/v1", 4),)


def test_endpoints_file_forms(tmp_path: Path) -> None:
    f = tmp_path / "e.json"
    f.write_text(json.dumps(["http://a/v1", {"url": "http://b/v1", "max_concurrency": 8}]))
    assert read_endpoints_file(f) == (Endpoint("http://a/v1", 32), Endpoint("http://b/v1", 8))
    with pytest.raises(EndpointsError, match=r"e\.txt: cannot read"):
        read_endpoints_file(tmp_path / "e.txt")
    f.write_text('[{"url": "http://b/v1",\n  "max_concurrency": 8, "max_concurrency": 64}]')
    with pytest.raises(EndpointsError, match=r"line 2: duplicate key 'max_concurrency'"):
        read_endpoints_file(f)  # 8 or 64 slots? Refused, not the last


def test_init_refuses_a_bad_endpoint_list(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match=r"agent\.base_url: .*duplicate"):
        init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"),
                           base_url=["http://127.0.0.1:1/v1", "http://127.0.0.1:1/v1"],
                           model="m")
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:99999/v1", "port 99999 is not from 1 to 65535"),
    ("http://:8080/v1", "has no host"),
    ("http://[::1/v1", "not a URL \\(Invalid IPv6 URL\\)"),
    ("http://127.0.0.1:1/v1 ", "character 22 of 22 is U\\+0020, a space"),
    ("http://127.0.0.1:1/v1\u00a0", "character 22 of 22 is U\\+00A0, a space"),
    ("http://127.0.0.1:1/v1/chat/completions", "is the chat endpoint itself: give its base"),
    ("http://127.0.0.1:1/v1/chat/completions/", "without /chat/completions"),
])
def test_init_refuses_a_base_url_no_connection_can_use(tmp_path: Path, url: str,
                                                       why: str) -> None:
    """A port past 65535 was taken at init; the step then failed as a bug (OverflowError
    from connect(), in an ExceptionGroup). "[::1" said only "Invalid IPv6 URL". Hostile
    pass (h13): a URL pasted with a trailing space, or the chat endpoint given for its base,
    was taken, and every call of the step was a 404 ("no route /v1%20/chat/completions")."""
    with pytest.raises(WorkspaceError, match=rf"agent\.base_url {{1}}.*{why}"):
        init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"), base_url=url, model="m")
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("model", ["gpt-4o ", " gpt-4o", "gpt-4o\u00a0", "gpt\t4o"])
def test_init_refuses_a_model_name_pasted_with_a_space(tmp_path: Path, model: str) -> None:
    """Hostile pass (h13): "gpt-4o " was taken, and a server that checks the name refuses
    every call of the step ("model not found")."""
    with pytest.raises(WorkspaceError, match=r"agent\.model .* has a space at an end or a "
                                             r"control character"):
        init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"),
                 base_url="http://127.0.0.1:1/v1", model=model)
    assert not (tmp_path / "ws").exists()


def test_init_takes_endpoints_as_any_sequence(tmp_path: Path) -> None:
    """``base_url`` is typed ``str | Sequence``: a tuple is the same list (was an
    AttributeError: the tuple went down the single-URL path, ``.rstrip``)."""
    urls = ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]
    units = write_units(tmp_path / "u.jsonl")
    as_list = init_llm(tmp_path / "a", units, base_url=urls, model="m")
    as_tuple = init_llm(tmp_path / "b", units, base_url=tuple(urls), model="m")
    assert as_tuple.config.agent == as_list.config.agent
    assert as_tuple.config.agent["base_url"] == urls


def test_gate_concurrency_is_the_sum_unless_set_lower() -> None:
    eps = [Endpoint("http://a", 3), Endpoint("http://b", 5)]
    assert gate_concurrency(None, eps) == 8
    assert gate_concurrency(4, eps) == 4
    assert gate_concurrency(100, eps) == 8


def test_all_endpoints_down_waits_for_a_probe_instead_of_failing(tmp_path: Path) -> None:
    """Both endpoints refuse connections; one comes back: the call waits and succeeds."""
    import httpx

    a, b = farm(0.0, 0.0)
    a.stop()
    b.stop()
    pool = EndpointPool([Endpoint(a.url, 1), Endpoint(b.url, 1)], fail_after=1,
                        probe_after_s=0.05)

    async def go() -> int:
        async with httpx.AsyncClient() as client:
            for _ in range(2):
                with pytest.raises(httpx.ConnectError):
                    await pool.post(client, "chat/completions", json={})
            assert [s.up for s in pool.stats()] == [False, False]
            b.restart()
            for _ in range(20):
                try:
                    r = await pool.post(client, "nothing-here", json={})
                    return r.status_code
                except httpx.ConnectError:
                    continue
        return -1

    try:
        assert asyncio.run(go()) == 404  # no such route, but the server answered
    finally:
        b.close()
    assert pool.stats()[1].up and not pool.stats()[0].up


def test_a_down_endpoint_is_probed_even_while_others_have_free_slots() -> None:
    """The probe goes out when due, not only when the healthy endpoints are full."""
    import httpx

    a, b = farm(0.0, 0.0)
    a.stop()
    pool = EndpointPool([Endpoint(a.url, 4), Endpoint(b.url, 4)], fail_after=1,
                        probe_after_s=0.05)

    async def go() -> list[bool]:
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await pool.post(client, "nothing-here", json={})  # tie: A first, refused
            a.restart()
            await asyncio.sleep(0.1)
            for _ in range(3):  # one at a time: B always has free slots
                await pool.post(client, "nothing-here", json={})
        return [s.up for s in pool.stats()]

    try:
        assert asyncio.run(go()) == [True, True]
    finally:
        a.close()
        b.close()


def test_an_answer_sent_before_the_endpoint_died_does_not_revive_it() -> None:
    """A slow call sent to A before A stopped listening is answered (its connection was
    accepted) after two refused calls marked A down: that stale answer says nothing of A
    now, so A stays down until its probe and calls go to B (it revived A, which then went
    down again: ``times_down`` 2 in a three-endpoint step under load)."""
    import httpx

    a, b = farm(0.5, 1.0)
    pool = EndpointPool([Endpoint(a.url, 4), Endpoint(b.url, 1)], fail_after=2,
                        probe_after_s=60)

    async def go() -> list[Any]:
        async with httpx.AsyncClient() as client:
            stale = asyncio.create_task(pool.post(client, "nothing-here", json={}))
            while a.active == 0:  # a tie: A took it, and holds it for 0.5 s
                await asyncio.sleep(0.01)
            busy = asyncio.create_task(pool.post(client, "nothing-here", json={}))
            while b.active == 0:  # B's one slot, held for 1 s
                await asyncio.sleep(0.01)
            a.stop()
            for _ in range(2):  # B is full: A, which refuses
                with pytest.raises(httpx.ConnectError):
                    await pool.post(client, "nothing-here", json={})
            assert [s.up for s in pool.stats()] == [False, True]
            assert (await stale).status_code == 404  # answered after A went down
            up = [s.up for s in pool.stats()]
            await busy
            info: dict[str, Any] = {}
            async with pool.exchange(client, "POST", "nothing-here", json={}, info=info) as ex:
                ex.outcome = "ok"
            return [up, info["url"]]

    try:
        assert asyncio.run(go()) == [[False, True], b.url]
    finally:
        a.close()
        b.close()
    st = pool.stats()[0]
    assert st.times_down == 1 and st.transport_failures == 2


def test_the_live_view_shows_each_endpoints_counters(tmp_path: Path,
                                                     redis_target: RedisTarget) -> None:
    # A step through two endpoints with a live view given the pool: every frame carries the
    # per-endpoint counters, and the HTML (live and final) names each endpoint.
    from vtrm_gate.views import LiveGateView, endpoints_html

    servers = farm(0.0, 0.01)
    try:
        caps = [Endpoint(s.url, 3) for s in servers]
        pool = EndpointPool(caps)
        ws = init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"),
                                base_url=[s.url for s in servers], model="m", seed=1)
        view = LiveGateView(min_interval=0, threaded=False, endpoints=pool)
        run(ws, redis_target, pool, 6, subscribers=[view])
        ws.close()
    finally:
        for s in servers:
            s.close()
    snap = view.snapshot()
    assert [e.url for e in snap.endpoints] == [s.url for s in servers]
    assert sum(e.calls for e in snap.endpoints) == sum(s.served for s in servers) > 0
    page = view._repr_html_()
    assert all(s.url in page for s in servers) and "p95" in page
    assert endpoints_html(LiveGateView().snapshot()) == ""  # no pool, no endpoint table
