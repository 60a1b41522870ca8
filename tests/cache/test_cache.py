"""The LLM response cache against a real Redis: keys, hits, what is never written, TTL,
single flight, outage and recovery, masking."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from tests._peers import lying_peer
from vtrm_gate.cache import (
    DEFAULT_TTL,
    CacheStats,
    KeyParts,
    RedisServer,
    ResponseCache,
    explain_miss,
    mask_url,
    read_dotenv,
    salt_for_run,
    scrub,
    validate_response,
)
from vtrm_gate.cache._response import RECOVERY_OPS
from vtrm_gate.errors import ConfigError
from vtrm_gate.testing import RedisTarget


def ok(text: str = "B") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "created": 1,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}


def parts(run_id: str = "step1_gate_ocr_base", content: str = "Which? A. x B. y",
          **kw: Any) -> KeyParts:
    base: dict[str, Any] = dict(
        model="m1", base_url="http://127.0.0.1:9/v1",
        messages=[{"role": "system", "content": "skill"}, {"role": "user", "content": content}],
        params={"temperature": 0.0, "max_tokens": 64}, salt=salt_for_run(run_id))
    base.update(kw)
    return KeyParts(**base)


class Counting:
    """A chat call that counts how often it really ran."""

    def __init__(self, response: Any = None, delay: float = 0.0,
                 error: Exception | None = None):
        self.response = response if response is not None else ok()
        self.delay, self.error, self.calls = delay, error, 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.response


def cache_for(target: RedisTarget, **kw: Any) -> ResponseCache:
    return ResponseCache(target.url, prefix=target.prefix, **kw)


def raw(target: RedisTarget) -> redis.Redis:
    return target.sync_client()


# ---- key composition ------------------------------------------------------------------


def test_same_messages_different_run_id_give_different_keys() -> None:
    assert parts("s1_gate_ocr_base").key() != parts("s2_gate_ocr_base").key()


def test_same_call_in_same_run_gives_the_same_key() -> None:
    assert parts().key() == parts().key()
    assert parts().key().startswith("llm_cache:") and len(parts().key()) == 10 + 64


def test_dict_order_does_not_change_the_key() -> None:
    a = parts(messages=[{"role": "user", "content": "q", "name": "n"}])
    b = parts(messages=[{"name": "n", "content": "q", "role": "user"}])
    assert a.key() == b.key()


def frame(t: float, field: str = "timestamp") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [
        {"type": "text", "text": "What is on screen?"},
        {"type": "image_url", "image_url": {"url": "file:///clip.mp4#frame"}, field: t}]}]


@pytest.mark.parametrize("field", ["timestamp", "ts", "id", "created", "request_id"])
def test_fields_named_like_clocks_or_ids_inside_messages_reach_the_key(field: str) -> None:
    # The frame at 95.5 s must never get the cached answer for the frame at 12.0 s.
    a, b = parts(messages=frame(12.0, field)), parts(messages=frame(95.5, field))
    assert a.key() != b.key()
    assert explain_miss(a, b).differing == ("messages",)


def test_media_references_reach_the_key() -> None:
    a = parts(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///v/1.jpg", "id": "f1"}}]}])
    b = parts(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///v/1.jpg", "id": "f2"}}]}])
    assert a.key() != b.key()


def test_only_top_level_request_bookkeeping_is_left_out() -> None:
    body = {"model": "m", "messages": frame(12.0), "temperature": 0}
    key = KeyParts.from_request(body, "http://h/v1", "r").key()
    noisy = {**body, "request_id": "req-1", "user": "alice", "metadata": {"ts": 1}}
    assert KeyParts.from_request(noisy, "http://h/v1", "r").key() == key
    nested = {**body, "messages": frame(12.5)}
    assert KeyParts.from_request(nested, "http://h/v1", "r").key() != key


_text = st.text(max_size=20)
_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                  "content": _text})


@given(st.lists(_message, min_size=1, max_size=5), st.data())
def test_key_ignores_key_order_but_not_content(
        messages: list[dict[str, str]], data: st.DataObject) -> None:
    shuffled = [dict(reversed(list(m.items()))) for m in messages]
    assert parts(messages=shuffled).key() == parts(messages=messages).key()
    i = data.draw(st.integers(0, len(messages) - 1))
    changed = [dict(m) for m in messages]
    changed[i]["content"] += "!"
    why = explain_miss(parts(messages=changed), parts(messages=messages))
    assert why.differing == ("messages",) and why.first_differing_message == i
    stamped = [dict(m) for m in messages]
    stamped[i]["id"] = data.draw(_text)
    assert parts(messages=stamped).key() != parts(messages=messages).key()


def test_base_url_is_normalised() -> None:
    assert parts(base_url="HTTP://LocalHost:8000/v1/").key() == \
        parts(base_url="http://localhost:8000/v1").key()


@pytest.mark.parametrize("component, change", [
    ("model", {"model": "m2"}),
    ("base_url", {"base_url": "http://other/v1"}),
    ("params", {"params": {"temperature": 0.7, "max_tokens": 64}}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("schema", {"schema": 2}),
    ("salt", {"salt": "other_run"}),
])
def test_every_component_changes_the_key_and_explain_miss_names_it(
        component: str, change: dict[str, Any]) -> None:
    a, b = parts(), parts(**change)
    assert a.key() != b.key()
    why = explain_miss(b, a)
    assert why.differing == (component,)
    assert component in str(why)


def test_explain_miss_points_at_the_first_differing_message() -> None:
    a = parts(content="q1")
    b = KeyParts(a.model, a.base_url, (*a.messages[:1], {"role": "user", "content": "q2"}),
                 a.params, salt=a.salt)
    why = explain_miss(b, a)
    assert why.differing == ("messages",) and why.first_differing_message == 1
    assert explain_miss(a, a).same


def test_from_request_puts_every_other_field_in_params() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0,
            "top_p": 0.9, "seed": 3, "user": "alice", "stream": False}
    p = KeyParts.from_request(body, "http://h/v1", "run:r")
    assert p.params == {"temperature": 0, "top_p": 0.9, "seed": 3}


@pytest.mark.parametrize("resp, reason", [
    ({"choices": []}, "empty choices"),
    ({"error": {"message": "overloaded"}}, "response carries an error"),
    ({"choices": [{"finish_reason": "content_filter",
                   "message": {"role": "assistant", "content": ""}}]}, "content filtered"),
    ({"choices": [{"message": {"role": "assistant", "content": "  "}}]},
     "empty message content"),
    ("not json", "response is not a JSON object"),
])
def test_invalid_responses_are_recognised(resp: Any, reason: str) -> None:
    assert validate_response(resp) == reason
    assert validate_response(ok()) is None


def test_per_run_counters_are_the_stats_fields() -> None:
    """A run's mutable counters (a declared class, so the type checker sees each increment)
    have exactly `CacheStats`' fields: one counted on its own would never reach a snapshot."""
    from dataclasses import fields

    from vtrm_gate.cache._response import _Counters

    assert [f.name for f in fields(_Counters)] == [f.name for f in fields(CacheStats)]
    assert {f.default for f in fields(_Counters)} == {0}


# ---- against a real Redis -------------------------------------------------------------


def test_second_identical_call_in_the_same_run_is_a_hit(redis_target: RedisTarget) -> None:
    async def go() -> tuple[str, str, int, CacheStats]:
        cache, call = cache_for(redis_target), Counting()
        first = await cache.get_or_call(parts(), call)
        second = await cache.get_or_call(parts(), call)
        return first.source, second.source, call.calls, cache.stats("step1_gate_ocr_base")

    first, second, calls, stats = asyncio.run(go())
    assert (first, second, calls) == ("miss", "hit", 1)
    assert (stats.hits, stats.misses, stats.writes, stats.hit_rate) == (1, 1, 1, 0.5)


def test_a_new_run_id_never_reuses_another_runs_samples(redis_target: RedisTarget) -> None:
    async def go() -> tuple[str, int]:
        cache, call = cache_for(redis_target), Counting()
        await cache.get_or_call(parts("selection_run"), call)
        res = await cache.get_or_call(parts("step7_gate_ocr_base"), call)
        return res.source, call.calls

    assert asyncio.run(go()) == ("miss", 2)


def test_ttl_and_value_are_written_together(redis_target: RedisTarget) -> None:
    p = parts()

    async def go() -> None:
        await cache_for(redis_target, ttl=3600).get_or_call(p, Counting())

    asyncio.run(go())
    ttl = raw(redis_target).ttl(p.key(redis_target.prefix))
    assert 3590 < ttl <= 3600


def test_default_ttl_is_seven_days(redis_target: RedisTarget) -> None:
    p = parts()
    asyncio.run(cache_for(redis_target).get_or_call(p, Counting()))
    assert DEFAULT_TTL == 604800
    assert raw(redis_target).ttl(p.key(redis_target.prefix)) > 604800 - 10


def test_errors_are_never_cached(redis_target: RedisTarget) -> None:
    p = parts()

    async def go() -> int:
        cache, failing = cache_for(redis_target), Counting(error=TimeoutError("timeout"))
        for _ in range(2):
            with pytest.raises(TimeoutError):
                await cache.get_or_call(p, failing)
        return failing.calls

    assert asyncio.run(go()) == 2
    assert not raw(redis_target).exists(p.key(redis_target.prefix))


@pytest.mark.parametrize("bad", [
    {"choices": []},
    {"choices": [{"finish_reason": "content_filter", "message": {"content": ""}}]},
    {"choices": [{"message": {"role": "assistant", "content": ""}}]},
])
def test_invalid_responses_are_returned_but_never_written(redis_target: RedisTarget,
                                                          bad: dict[str, Any]) -> None:
    p = parts()

    async def go() -> tuple[Any, CacheStats]:
        cache = cache_for(redis_target)
        res = await cache.get_or_call(p, Counting(bad))
        return res.response, cache.stats()

    response, stats = asyncio.run(go())
    assert response == bad and stats.not_cached == 1 and stats.writes == 0
    assert not raw(redis_target).exists(p.key(redis_target.prefix))


def test_a_caller_validator_keeps_unparseable_answers_out(redis_target: RedisTarget) -> None:
    p = parts()

    def letter(resp: Any) -> str | None:
        return validate_response(resp) or (
            None if resp["choices"][0]["message"]["content"] in "ABCD" else "unparseable")

    asyncio.run(cache_for(redis_target).get_or_call(p, Counting(ok("hmm")), validate=letter))
    assert not raw(redis_target).exists(p.key(redis_target.prefix))


@pytest.mark.parametrize("garbage", [b"{not json", b'{"schema": 1, "response": {"cho',
                                     b'{"schema": 999, "response": {}}', b"[]"])
def test_malformed_value_is_a_miss_and_is_overwritten(redis_target: RedisTarget,
                                                      garbage: bytes) -> None:
    p = parts()
    key = p.key(redis_target.prefix)
    raw(redis_target).set(key, garbage)

    async def go() -> tuple[str, str, int, CacheStats]:
        cache, call = cache_for(redis_target), Counting()
        first = await cache.get_or_call(p, call)
        second = await cache.get_or_call(p, call)
        return first.source, second.source, call.calls, cache.stats()

    first, second, calls, stats = asyncio.run(go())
    assert (first, second, calls, stats.malformed) == ("miss", "hit", 1, 1)


@pytest.mark.parametrize("garbage", [b"{not json", b'{"schema": 999, "response": {}}', None])
def test_two_processes_replacing_a_malformed_entry_serve_the_first_writers_answer(
        redis_target: RedisTarget, garbage: bytes | None) -> None:
    """Both found the same malformed entry (None: a key of another Redis type) and called;
    each replaced it with a plain SET, so the last writer won: the first process graded "A"
    while its re-run would replay "B". The value in the way is removed only while it is the
    one read, and the second writer serves the first one's answer, as two new writers do."""
    p = parts()
    key = p.key(redis_target.prefix)
    if garbage is None:
        raw(redis_target).hset(key, "f", "v")
    else:
        raw(redis_target).set(key, garbage)

    async def go() -> tuple[Any, Any, Any, CacheStats, CacheStats]:
        a, b = cache_for(redis_target), cache_for(redis_target)  # two processes' clients
        b_called, a_stored = asyncio.Event(), asyncio.Event()

        async def call_a() -> Any:
            await b_called.wait()  # both have read the malformed entry
            return ok("A")

        async def call_b() -> Any:
            b_called.set()
            await a_stored.wait()
            return ok("B")

        try:
            first = asyncio.create_task(a.get_or_call(p, call_a))
            second = asyncio.create_task(b.get_or_call(p, call_b))
            ra = await first
            a_stored.set()
            rb = await second
            return ra, rb, await a.lookup(p), a.stats(), b.stats()
        finally:
            await a.aclose()
            await b.aclose()

    ra, rb, stored, sa, sb = asyncio.run(go())
    assert (ra.source, rb.source) == ("miss", "miss")
    assert ra.response == rb.response == stored == ok("A")
    assert (sa.malformed, sb.malformed, sa.raced, sb.raced) == (1, 1, 0, 1)


def test_a_user_who_may_not_run_scripts_still_replaces_a_malformed_entry(
        tmp_path: Path) -> None:
    """A managed Redis may refuse EVAL: the malformed entry is then deleted outright (the
    replacement as it was before the script), not read as an outage."""
    with RedisServer(tmp_path, persist=False) as server:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser("app", enabled=True, passwords=["+pw"], keys=["*"],
                          commands=["+@all", "-@scripting"])
        cache = ResponseCache(server.url.replace("://", "://app:pw@", 1))  # unix:// too
        admin.set(parts().key(cache.prefix), b"{not json")
        admin.close()

        async def go() -> tuple[str, str, CacheStats]:
            try:
                first = await cache.get_or_call(parts(), Counting(ok("A")))
                again = await cache.get_or_call(parts(), Counting(ok("A2")))
                return first.source, again.source, cache.stats()
            finally:
                await cache.aclose()

        first, again, stats = asyncio.run(go())
    assert (first, again, stats.errors, stats.malformed) == ("miss", "hit", 0, 1)


def test_a_value_stored_under_another_key_is_a_counted_miss(redis_target: RedisTarget
                                                            ) -> None:
    # Issue 19 #3: a value copied (or renamed) onto another call's key was served as that
    # call's answer; the value carries the digest of its key material, compared on read.
    mine, other = parts(content="Which? A. x B. y"), parts(content="Which? A. p B. q")

    async def go() -> tuple[str, str, int, CacheStats]:
        cache, call = cache_for(redis_target), Counting(ok("A"))
        await cache.get_or_call(other, call)
        r = raw(redis_target)
        r.set(mine.key(redis_target.prefix), r.get(other.key(redis_target.prefix)))
        first = await cache.get_or_call(mine, Counting(ok("B")))
        second = await cache.get_or_call(mine, Counting(ok("C")))
        return first.source, second.response["choices"][0]["message"]["content"], \
            call.calls, cache.stats()

    first, answer, calls, stats = asyncio.run(go())
    assert (first, answer, calls) == ("miss", "B", 1)  # asked afresh, then served its own
    assert (stats.mismatched, stats.misses, stats.hits) == (1, 2, 1)


@pytest.mark.parametrize("field,value", [("digest", "0" * 64), ("digest", None)])
def test_a_value_whose_recorded_key_material_differs_is_a_miss(
        redis_target: RedisTarget, field: str, value: str | None) -> None:
    import json as _json

    p = parts()
    key = p.key(redis_target.prefix)

    async def go() -> tuple[str, str, CacheStats]:
        cache = cache_for(redis_target)
        await cache.get_or_call(p, Counting(ok("A")))
        r = raw(redis_target)
        stored = _json.loads(r.get(key))
        stored[field] = value
        r.set(key, _json.dumps(stored))
        res = await cache.get_or_call(p, Counting(ok("B")))
        return res.source, res.response["choices"][0]["message"]["content"], cache.stats()

    source, answer, stats = asyncio.run(go())
    assert (source, answer, stats.mismatched) == ("miss", "B", 1)


def test_an_entry_written_before_values_carried_their_digest_is_checked_by_components(
        redis_target: RedisTarget) -> None:
    import json as _json

    p, other = parts(), parts(content="another question")
    key = p.key(redis_target.prefix)

    async def go() -> tuple[str, str, str]:
        cache = cache_for(redis_target)
        await cache.get_or_call(p, Counting(ok("A")))
        await cache.get_or_call(other, Counting(ok("Z")))
        r = raw(redis_target)
        legacy = _json.loads(r.get(key))
        del legacy["digest"]  # the layout of 0.2.0: component digests and salt only
        r.set(key, _json.dumps(legacy))
        hit = await cache.get_or_call(p, Counting(ok("B")))
        moved = _json.loads(r.get(other.key(redis_target.prefix)))
        del moved["digest"]
        r.set(key, _json.dumps(moved))
        miss = await cache.get_or_call(p, Counting(ok("C")))
        resalted = {**legacy, "salt": "ws:another-workspace/step1_gate_ocr_base"}
        r.set(key, _json.dumps(resalted))
        salt = await cache.get_or_call(p, Counting(ok("D")))
        return hit.source, miss.source, salt.source

    assert asyncio.run(go()) == ("hit", "miss", "miss")


def test_a_key_of_the_wrong_redis_type_is_a_miss_for_that_key_only(
        redis_target: RedisTarget) -> None:
    # Issue 19 #11: a HASH under llm_cache: raised WRONGTYPE and the whole cache was
    # declared unavailable (every later call went uncached).
    p, other = parts(), parts(content="another question")

    async def go() -> tuple[list[str], bool, CacheStats]:
        cache = cache_for(redis_target)
        await cache.get_or_call(other, Counting())
        raw(redis_target).hset(p.key(redis_target.prefix), mapping={"a": "1"})
        sources = [(await cache.get_or_call(p, Counting())).source,
                   (await cache.get_or_call(other, Counting())).source,
                   (await cache.get_or_call(p, Counting())).source]
        assert await cache.lookup(other) is not None
        return sources, cache.available, cache.stats()

    sources, available, stats = asyncio.run(go())
    assert sources == ["miss", "hit", "hit"]  # the miss was written over the stray hash
    assert available and stats.errors == 0 and stats.bypassed == 0 and stats.malformed == 1


def test_concurrent_identical_calls_make_one_request(redis_target: RedisTarget) -> None:
    async def go() -> tuple[list[str], int]:
        cache, call = cache_for(redis_target), Counting(delay=0.05)
        out = await asyncio.gather(*(cache.get_or_call(parts(), call) for _ in range(10)))
        return sorted(r.source for r in out), call.calls

    sources, calls = asyncio.run(go())
    assert calls == 1 and sources == ["coalesced"] * 9 + ["miss"]


def test_a_cancelled_leader_does_not_strand_its_followers(redis_target: RedisTarget) -> None:
    async def go() -> tuple[str, int]:
        cache, call = cache_for(redis_target), Counting(delay=0.1)
        leader = asyncio.ensure_future(cache.get_or_call(parts(), call))
        await asyncio.sleep(0.02)
        follower = asyncio.ensure_future(cache.get_or_call(parts(), call))
        await asyncio.sleep(0.02)
        leader.cancel()
        res = await follower
        return res.source, call.calls

    assert asyncio.run(go()) == ("miss", 2)


def test_two_processes_racing_on_one_key_both_serve_the_first_stored_answer(
        redis_target: RedisTarget) -> None:
    """Two clients (two processes) both missed one key and each used its own sample; the last
    SET won, so a re-run served one process an answer it never graded (h16). The first
    writer wins (SET NX) and the later one serves that stored answer, counted ``raced``."""
    a, b = cache_for(redis_target), cache_for(redis_target)
    both_missed = asyncio.Event()
    missed = [0]

    def sample(text: str, first: bool) -> Any:
        async def call() -> Any:
            missed[0] += 1
            if missed[0] == 2:
                both_missed.set()
            await both_missed.wait()
            if not first:  # answers after the other has stored its own
                await asyncio.sleep(0.2)
            return ok(text)
        return call

    async def go() -> Any:
        try:
            ra, rb = await asyncio.gather(a.get_or_call(parts(), sample("A", True)),
                                          b.get_or_call(parts(), sample("B", False)))
            return ra, rb, await cache_for(redis_target).lookup(parts())
        finally:
            await a.aclose()
            await b.aclose()

    ra, rb, later = asyncio.run(go())
    assert (ra.source, rb.source) == ("miss", "miss")
    assert ra.response == rb.response == later == ok("A")
    assert (a.stats().writes, b.stats().writes, b.stats().raced) == (1, 0, 1)


def test_a_failed_single_flight_fails_every_waiter_and_caches_nothing(
        redis_target: RedisTarget) -> None:
    async def go() -> list[Any]:
        cache = cache_for(redis_target)
        call = Counting(delay=0.05, error=ConnectionResetError("503"))
        return await asyncio.gather(*(cache.get_or_call(parts(), call) for _ in range(3)),
                                    return_exceptions=True)

    out = asyncio.run(go())
    assert all(isinstance(e, ConnectionResetError) for e in out)
    assert not raw(redis_target).exists(parts().key(redis_target.prefix))


def test_cache_off_bypasses_redis(redis_target: RedisTarget) -> None:
    cache = ResponseCache.from_env({"REDIS_URL": redis_target.url, "VTRM_CACHE": "off"},
                                   prefix=redis_target.prefix)
    call = Counting()

    async def go() -> list[str]:
        return [(await cache.get_or_call(parts(), call)).source for _ in range(2)]

    assert asyncio.run(go()) == ["bypass", "bypass"] and call.calls == 2
    assert cache.stats().bypassed == 2
    assert not raw(redis_target).exists(parts().key(redis_target.prefix))


def test_counters_are_kept_per_run(redis_target: RedisTarget) -> None:
    async def go() -> ResponseCache:
        cache, call = cache_for(redis_target), Counting()
        for run in ("a_base", "a_base", "b_cand"):
            await cache.get_or_call(parts(run), call)
        return cache

    cache = asyncio.run(go())
    assert cache.stats("a_base").hits == 1 and cache.stats("b_cand").misses == 1
    assert cache.stats().calls == 3 and set(cache.runs()) == {"a_base", "b_cand"}


def test_explain_against_a_stored_entry(redis_target: RedisTarget) -> None:
    stored = parts("run_a", content="question one")

    async def go() -> str:
        cache = cache_for(redis_target)
        await cache.get_or_call(stored, Counting())
        why = await cache.explain(parts("run_b", content="question one"),
                                  stored.key(redis_target.prefix))
        return str(why)

    assert "salt" in asyncio.run(go())


@pytest.mark.parametrize("entry", [
    '{"components": ["a"], "messages": []}', '{"components": {}, "messages": 5}',
    '{"components": ' * 2000 + "1" + "}" * 2000], ids=["list", "int", "nested"])
def test_explain_against_a_malformed_entry_says_so(redis_target: RedisTarget,
                                                   entry: str) -> None:
    """Hostile pass (h22): `explain` of an entry whose components were a list, whose
    messages were a number or whose JSON nested 2,000 deep raised instead of naming it."""
    key = f"{redis_target.prefix}:foreign"
    with contextlib.closing(raw(redis_target)) as r:
        r.set(key, entry)

    async def go() -> str:
        cache = cache_for(redis_target)
        try:
            return str(await cache.explain(parts(), key))
        finally:
            await cache.aclose()

    assert "malformed entry" in asyncio.run(go())


def test_many_calls_in_flight_share_a_few_redis_connections(fresh_redis_server, monkeypatch):
    """512 concurrent misses (issue 17): every call served and written once over at most
    OPS_IN_FLIGHT connections that do not read redis-py's package metadata each (it opened
    one connection per command in flight, up to the pool's 256, each ~1 ms to set up)."""
    import redis.utils

    from vtrm_gate.cache import _response

    metadata_reads = []
    real = redis.utils.get_lib_version
    monkeypatch.setattr(redis.utils, "get_lib_version",
                        lambda: metadata_reads.append(1) or real())

    async def main():
        cache = ResponseCache(fresh_redis_server.url, prefix="burst")
        call = Counting(delay=0.05)
        got = await asyncio.gather(*(cache.get_or_call(parts(content=f"Q{i}"), call)
                                     for i in range(512)))
        observer = redis.Redis.from_url(fresh_redis_server.url)
        clients = observer.info("clients")["connected_clients"] - 1
        observer.close()
        await cache.aclose()
        return got, call.calls, clients, cache.stats()

    got, calls, clients, stats = asyncio.run(main())
    assert calls == 512 and all(r.source == "miss" for r in got)
    assert (stats.misses, stats.writes, stats.errors) == (512, 512, 0)
    assert 1 <= clients <= _response.OPS_IN_FLIGHT
    assert len(metadata_reads) <= 1  # the client object, once; not per connection


# ---- outage and recovery --------------------------------------------------------------


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "vtrm_gate.cache" and text in r.getMessage()]


def test_redis_down_at_start_calls_go_uncached_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = ResponseCache(f"unix://{tmp_path}/nothing.sock", retry_interval=0.0)
    call = Counting()

    async def go() -> list[str]:
        return [(await cache.get_or_call(parts(f"r{i}"), call)).source for i in range(5)]

    with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
        assert asyncio.run(go()) == ["bypass"] * 5
    assert call.calls == 5 and cache.stats().errors >= 5
    assert len(warnings_of(caplog, "unavailable")) == 1


def test_outage_mid_run_then_recovery(fresh_redis_server: RedisServer,
                                      caplog: pytest.LogCaptureFixture) -> None:
    server = fresh_redis_server
    cache = ResponseCache(server.url, retry_interval=0.05)
    call = Counting()

    async def go() -> dict[str, list[str]]:
        seen: dict[str, list[str]] = {}
        seen["before"] = [(await cache.get_or_call(parts(f"u{i}"), call)).source
                          for i in range(3)]
        server.kill()  # dies mid-run, without saving
        seen["down"] = [(await cache.get_or_call(parts(f"u{i}"), call)).source
                        for i in range(6)]
        assert not cache.available
        server.start()
        await asyncio.sleep(0.06)
        seen["back"] = [(await cache.get_or_call(parts("v"), call)).source for _ in range(2)]
        return seen

    with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
        seen = asyncio.run(go())
    assert seen["before"] == ["miss"] * 3
    assert seen["down"] == ["bypass"] * 6  # every call still answered
    assert seen["back"] == ["miss", "hit"]  # caching resumed by itself
    assert call.calls == 3 + 6 + 1
    assert cache.stats().errors >= 1
    assert len(warnings_of(caplog, "unavailable")) == 1
    assert len(warnings_of(caplog, "resumed")) == 1


def test_a_flapping_server_warns_once_per_outage_and_once_when_it_ends(
        fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    server = fresh_redis_server
    cache = ResponseCache(server.url, retry_interval=0.02)
    call = Counting()

    async def calls(tag: str, n: int) -> list[str]:
        return [(await cache.get_or_call(parts(f"{tag}{i}"), call)).source for i in range(n)]

    async def go() -> list[str]:
        seen = await calls("a", 2)
        server.kill()
        seen += await calls("b", 3)  # the outage begins: one warning
        for flip in range(3):  # back for one call, gone again: still the same outage
            server.start()
            await asyncio.sleep(0.03)
            seen += await calls(f"c{flip}", 1)
            server.kill()
            await asyncio.sleep(0.03)
            seen += await calls(f"d{flip}", 2)
        server.start()
        await asyncio.sleep(0.03)
        seen += await calls("e", 4)  # steadily back: the outage ends, one warning
        return seen

    with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
        seen = asyncio.run(go())
    assert len(warnings_of(caplog, "unavailable")) == 1
    assert len(warnings_of(caplog, "resumed")) == 1
    assert call.calls == len(seen) == 2 + 3 + 3 * 3 + 4  # every call answered, once
    st_ = cache.stats()
    assert st_.requests == st_.misses + st_.bypassed == call.calls  # every request counted
    assert st_.bypassed >= 3 + 3 * 2


def test_the_step_summary_counts_bypassed_calls_as_requests() -> None:
    from vtrm_gate.cli import cache_lines as _cache_lines

    st_ = CacheStats(hits=2, misses=8, bypassed=56, errors=3)
    assert st_.requests == 64 and st_.as_dict()["requests"] == 64
    info = {"url": "unix:///x.sock", "prefix": "llm_cache", "enabled": True,
            "runs": {"e1_s1_gate_ocr_base": st_.as_dict()}}
    assert "64 requests" in _cache_lines(info) and "56 uncached" in _cache_lines(info)
    assert "not stored" not in _cache_lines(info)


def test_the_step_summary_says_when_redis_refused_to_store_answers() -> None:
    """A re-run of a step whose answers Redis refused (full) pays for them again: the
    summary said "0 errors" and nothing else."""
    from vtrm_gate.cli import cache_lines as _cache_lines

    info = {"url": "unix:///x.sock", "prefix": "llm_cache", "enabled": True,
            "runs": {"e1_s1_gate_ocr_base": CacheStats(misses=8, writes=3,
                                                       refused=5).as_dict()}}
    assert "5 not stored (Redis refused the writes)" in _cache_lines(info)
    info["runs"]["e1_s1_gate_ocr_base"] = CacheStats(misses=8, writes=6, too_large=2).as_dict()
    assert "2 not stored (larger than Redis takes)" in _cache_lines(info)


def test_a_stopped_and_restarted_server_keeps_serving_hits(
        fresh_redis_server: RedisServer) -> None:
    cache = ResponseCache(fresh_redis_server.url, retry_interval=0.0)
    call = Counting()

    async def go() -> str:
        await cache.get_or_call(parts(), call)
        fresh_redis_server.restart()  # saved on stop, pooled connections now stale
        return (await cache.get_or_call(parts(), call)).source

    assert asyncio.run(go()) == "hit" and call.calls == 1


# ---- configuration and secrets --------------------------------------------------------


@pytest.mark.parametrize("url, shown", [
    ("redis://user:hunter2@db.example:6379/0", "redis://user:***@db.example:6379/0"),
    ("rediss://:hunter2@db.example:6380", "rediss://:***@db.example:6380"),
    ("unix://:hunter2@/var/run/redis.sock", "unix://:***@/var/run/redis.sock"),
    ("redis://db.example:6379?password=hunter2", "redis://db.example:6379?password=***"),
    ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
])
def test_password_is_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert "hunter2" not in repr(ResponseCache(url))
    assert "hunter2" not in scrub(f"failed connecting to {url}", url)


def test_bad_url_error_does_not_show_the_password() -> None:
    with pytest.raises(ValueError) as info:
        ResponseCache("http://user:hunter2@host")
    assert "hunter2" not in str(info.value) and "scheme" in str(info.value)


def test_wrong_password_warning_does_not_show_it(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer(tmp_path, persist=False, password="right-one") as server:
        url = f"unix://:wrong-hunter2@{server.socket_path}"
        cache = ResponseCache(url)
        with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
            res = asyncio.run(cache.get_or_call(parts(), Counting()))
        good = ResponseCache(server.url)
        assert asyncio.run(good.get_or_call(parts(), Counting())).source == "miss"
    assert res.source == "bypass"
    assert warnings_of(caplog, "unavailable")
    assert "hunter2" not in caplog.text and "right-one" not in caplog.text


def test_from_env_reads_the_environment_and_dotenv(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ResponseCache.from_env({"REDIS_URL": "redis://h:1/0", "REDIS_CACHE_TTL": "60"})
    assert (cache.url, cache.ttl, cache.enabled) == ("redis://h:1/0", 60, True)
    (tmp_path / ".env").write_text(
        "# comment\nexport REDIS_URL='redis://:s3cret@h:2/0'\nREDIS_CACHE_TTL=120 # two min\n"
        "VTRM_CACHE=off\n")
    assert read_dotenv(tmp_path / ".env")["REDIS_CACHE_TTL"] == "120"
    monkeypatch.chdir(tmp_path)
    for k in ("REDIS_URL", "REDIS_CACHE_TTL", "VTRM_CACHE"):
        monkeypatch.delenv(k, raising=False)
    cache = ResponseCache.from_env()
    assert (cache.url, cache.ttl, cache.enabled) == ("redis://:s3cret@h:2/0", 120, False)
    assert "s3cret" not in repr(cache)


@pytest.mark.parametrize("ttl", ["0", "-5", "week"])
def test_bad_ttl_is_refused_naming_the_variable(ttl: str) -> None:
    with pytest.raises(ValueError, match="REDIS_CACHE_TTL"):
        ResponseCache.from_env({"REDIS_CACHE_TTL": ttl})


def test_no_redis_url_starts_the_embedded_server_in_the_workspace(tmp_path: Path) -> None:
    cache = ResponseCache.from_env({}, workspace=tmp_path)
    assert cache.url is None

    async def go() -> list[str]:
        call = Counting()
        return [(await cache.get_or_call(parts(), call)).source for _ in range(2)]

    try:
        assert asyncio.run(go()) == ["miss", "hit"]
        assert cache.url is not None and str(tmp_path) in cache.url
    finally:
        cache._server.close()
    assert (tmp_path / "redis" / "dump.rdb").exists()


def test_cached_infer_replays_a_run_and_never_caches_infra(redis_target: RedisTarget) -> None:
    """Any infer behind the cache: the same run replays from Redis (no call, no tokens, the
    same answers), a new run id calls again, INFRA results are never written."""
    from vtrm_gate.cache import cached_infer
    from vtrm_gate.gate import TypePlan
    from vtrm_gate.sim import SimConfig, SimWorld

    world = SimWorld(SimConfig(seed=2, pool_sizes={"OCR Problems": 30}, infra_rate=0.1,
                               time_scale=0.0))
    plan = TypePlan("OCR Problems", world.pool("OCR Problems")[:30], "skill v1", "skill v2",
                    step_run_id="e1_s1")
    tasks = [plan.task(i, arm) for i in range(30) for arm in ("base", "cand")]

    async def main() -> tuple[list, list, list, object, object]:
        cache = cache_for(redis_target)
        first = cached_infer(cache, world.infer, model="sim-agent", prompt=world.prompt,
                             grade=world.grade)
        a = [await first(t) for t in tasks]
        again = cached_infer(cache, world.infer, model="sim-agent", prompt=world.prompt,
                             grade=world.grade)
        b = [await again(t) for t in tasks]
        other = TypePlan("OCR Problems", plan.units, "skill v1", "skill v2",
                         step_run_id="e1_s2")
        fresh = cached_infer(cache, world.infer, model="sim-agent", prompt=world.prompt,
                             grade=world.grade)
        c = [await fresh(other.task(i, "base")) for i in range(5)]
        await cache.aclose()
        return a, b, c, (first.calls, again.calls, fresh.calls), again.tokens

    a, b, c, calls, tokens_again = asyncio.run(main())
    infra = [i for i, r in enumerate(a) if r.infra]
    assert infra, "seeded world should produce some INFRA calls"
    assert calls[0] == len(tasks) and calls[1] == len(infra) and calls[2] == 5
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if i in infra:
            assert y.infra and not y.cached  # re-called, never served from the cache
        else:
            assert y.cached and (y.correct, y.prediction) == (x.correct, x.prediction)
    assert tokens_again == sum(a[i].tokens for i in infra) == 0
    assert not any(r.cached for r in c)


def _nested(depth: int) -> Any:
    x: Any = []
    for _ in range(depth):
        x = [x]
    return x


@pytest.mark.parametrize("extra", [float("nan"), float("-inf"), _nested(5000), {1, 2}],
                         ids=["nan", "-inf", "deep", "set"])
def test_an_unencodable_response_is_returned_not_cached_and_never_raises(
        redis_target: RedisTarget, extra: Any) -> None:
    cache = cache_for(redis_target)
    resp = {**ok(), "extra": extra}
    call = Counting(resp)

    async def go() -> Any:
        try:
            return await cache.get_or_call(parts(), call)
        finally:
            await cache.aclose()

    got = asyncio.run(go())
    assert got.response is resp and got.source == "miss"
    st_ = cache.stats()
    assert (st_.writes, st_.not_cached) == (0, 1)


def test_cached_infer_replays_no_valid_answer_as_a_wrong_answer(
        redis_target: RedisTarget) -> None:
    from vtrm_gate.cache import cached_infer
    from vtrm_gate.gate import UnitResult, UnitTask

    calls: list[str] = []

    async def mute(task: UnitTask) -> UnitResult:  # answers, but nothing usable
        calls.append(task.unit_id)
        return UnitResult(correct=False, prediction=None, tokens=3)

    def prompt(task: UnitTask) -> list[dict[str, str]]:
        return [{"role": "user", "content": task.unit_id}]

    tasks = [UnitTask("OCR", f"u{i}", "base", i, "e1_s1_gate_ocr_base") for i in range(4)]

    async def main() -> tuple[list[UnitResult], list[UnitResult]]:
        cache = cache_for(redis_target)
        try:
            runs = []
            for _ in range(2):
                infer = cached_infer(cache, mute, model="m", prompt=prompt,
                                     grade=lambda t, a: a == "B")
                runs.append([await infer(t) for t in tasks])
            return runs[0], runs[1]
        finally:
            await cache.aclose()

    first, again = asyncio.run(main())
    assert len(calls) == 4  # the re-run made no call
    assert all(not r.correct and not r.infra and r.prediction is None for r in first + again)
    assert all(r.cached for r in again)


def test_a_redis_that_accepts_and_never_answers_is_an_outage_not_a_hang(
        caplog: pytest.LogCaptureFixture) -> None:
    """A server that takes the connection and never replies (a stopped process, a black-hole
    proxy): each call waits at most its socket timeout, then goes uncached; one warning; the
    calls after it do not touch the server until the retry interval has passed."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])  # read nothing, answer nothing

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    port = listener.getsockname()[1]
    cache = ResponseCache(f"redis://127.0.0.1:{port}/0", retry_interval=3600.0)
    call = Counting()

    async def go() -> tuple[list[str], list[str], int]:
        first = await asyncio.gather(*(cache.get_or_call(parts(f"r{i}"), call)
                                       for i in range(40)))
        errors = cache.stats().errors
        later = [(await cache.get_or_call(parts(f"s{i}"), call)).source for i in range(5)]
        assert cache.stats().errors == errors  # in the outage: no Redis command at all
        return [r.source for r in first], later, errors

    try:
        with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
            first, later, errors = asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        stop.set()
        acceptor.join()  # closing the listener under a running accept() raises in the thread
        listener.close()
        for c in held:
            c.close()
    assert first == ["bypass"] * 40 and later == ["bypass"] * 5 and call.calls == 45
    assert errors >= 1 and held  # it did connect, and the reads timed out
    assert len(warnings_of(caplog, "unavailable")) == 1


@pytest.mark.parametrize(("field", "value"), [
    ("socket_timeout", float("nan")), ("socket_timeout", float("inf")),
    ("socket_timeout", True), ("socket_timeout", "5"), ("socket_timeout", None),
    ("socket_timeout", 0), ("retry_interval", float("nan")), ("retry_interval", float("inf")),
    ("retry_interval", True), ("retry_interval", "1"), ("retry_interval", -0.5)])
def test_redis_timings_must_be_finite_seconds(field: str, value: object) -> None:
    """A NaN or infinite socket timeout reached redis-py (a command that never times out
    blocks the gate: Redis must never be a single point of failure); a string failed with
    "'<=' not supported"; each is now refused naming the setting and the value."""
    with pytest.raises(ConfigError, match=rf"ResponseCache\.{field} must be a finite number "
                                          rf"of seconds .*got {re.escape(repr(value))}"):
        ResponseCache("redis://127.0.0.1:1", **{field: value})


def test_a_response_holding_a_lone_surrogate_is_stored_and_replayed_exactly(
        redis_target: RedisTarget) -> None:
    """A response string with a lone surrogate (any ``get_or_call`` caller may return one)
    has no UTF-8 form: it was served but never stored, so a re-run asked again. It is stored
    with the surrogate escaped and read back as it was."""
    resp = ok("B \ud83d")
    call = Counting(resp)

    async def go() -> tuple[Any, Any]:
        try:
            return (await cache.get_or_call(parts(), call),
                    await cache.get_or_call(parts(), call))
        finally:
            await cache.aclose()

    cache = cache_for(redis_target)
    first, again = asyncio.run(go())
    assert (first.source, again.source, call.calls) == ("miss", "hit", 1)
    assert again.response == resp


def test_a_request_holding_a_lone_surrogate_has_a_key_of_its_own() -> None:
    """A request the cached client relays for any agent may carry a lone surrogate: its key
    raised UnicodeEncodeError. It has one now, apart from the same text with U+FFFD."""
    lone, replaced = parts(content="Which? \ud83d"), parts(content="Which? \ufffd")
    assert lone.key("p") != replaced.key("p") and lone.key("p") == parts(
        content="Which? \ud83d").key("p")


def _refuse_writes(admin: redis.Redis, refusal: str, root: Path) -> None:
    """Make the server refuse SET and serve GET: full, a replica, or a failed snapshot."""
    if refusal == "full":
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
    elif refusal == "read-only":
        admin.replicaof("127.0.0.1", 9)  # a replica of nothing: read-only
    else:
        fail_snapshot(admin, root)


def fail_snapshot(admin: redis.Redis, root: Path) -> None:
    """Make the server's background save fail (its dir gone, as on a full disk): it then
    refuses writes with MISCONF and serves reads."""
    gone = root / "gone"
    gone.mkdir()
    admin.config_set("dir", str(gone))
    admin.config_set("save", "3600 1")
    admin.config_set("stop-writes-on-bgsave-error", "yes")
    gone.rmdir()
    admin.bgsave()
    for _ in range(100):
        if admin.info("persistence")["rdb_last_bgsave_status"] == "err":
            return
        time.sleep(0.05)


def _take_writes(admin: redis.Redis, refusal: str) -> None:
    if refusal == "full":
        admin.config_set("maxmemory", 0)
    elif refusal == "read-only":
        admin.replicaof("NO", "ONE")
    else:
        admin.config_set("stop-writes-on-bgsave-error", "no")


@pytest.mark.parametrize("refusal", ["full", "read-only", "misconf"])
def test_a_redis_that_refuses_writes_still_serves_its_hits(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, refusal: str) -> None:
    """A Redis at ``maxmemory`` under ``noeviction`` (or a read-only replica) refuses SET
    and serves GET. The first refused write marked the whole cache unavailable: every call,
    the stored answers included, bypassed Redis until the retry interval (a crashed step's
    re-run paid for every call again). Now only the writes stop, counted as ``refused``,
    with one warning that says what to change; hits go on, and writes resume when Redis
    takes them again."""
    with RedisServer(tmp_path, persist=False) as server:
        admin = redis.Redis.from_url(server.url)
        cache = ResponseCache(server.url, retry_interval=3600.0)
        call = Counting()

        async def calls(names: range) -> list[str]:
            return [(await cache.get_or_call(parts(content=f"q{i}"), call)).source
                    for i in names]

        async def go() -> tuple[list[str], list[str], list[str], list[str]]:
            try:
                stored = await calls(range(10))
                _refuse_writes(admin, refusal, tmp_path)
                refused = await calls(range(10, 20))
                hits = await calls(range(10))
                _take_writes(admin, refusal)
                return stored, refused, hits, await calls(range(20, 20 + RECOVERY_OPS))
            finally:
                await cache.aclose()
                admin.close()

        with caplog.at_level(logging.INFO, "vtrm_gate.cache"):
            stored, refused, hits, later = asyncio.run(go())
    assert stored == refused == ["miss"] * 10 and later == ["miss"] * RECOVERY_OPS
    assert hits == ["hit"] * 10  # the stored answers were still served
    st_ = cache.stats()
    assert (st_.writes, st_.refused, st_.bypassed, st_.errors) == (10 + RECOVERY_OPS, 10, 0, 0)
    assert call.calls == 20 + RECOVERY_OPS
    [warned] = warnings_of(caplog, "refuses writes")
    assert {"full": "maxmemory", "read-only": "read-only",
            "misconf": "cannot save its snapshot"}[refusal] in warned
    assert "unavailable" not in " ".join(warnings_of(caplog, ""))
    assert len(warnings_of(caplog, "accepts writes again")) == 1


@pytest.mark.parametrize("reply", [b"*1\r\n$2\r\nhi\r\n", b":1\r\n"], ids=["array", "integer"])
def test_a_peer_that_answers_the_handshake_unlike_redis_fails_open(reply: bytes) -> None:
    """Hostile pass (h22): redis-py opens each connection with HELLO; a peer answering it
    with an array or an integer made redis-py fail inside its own code (AttributeError),
    which escaped the cache: the step ended "a bug in vtrm_gate" instead of running uncached."""
    call = Counting()

    async def go(port: int) -> str:
        cache = ResponseCache(f"redis://127.0.0.1:{port}/0", retry_interval=3600.0)
        try:
            return (await cache.get_or_call(parts(), call)).source
        finally:
            await cache.aclose()

    with lying_peer(reply) as port:
        assert asyncio.run(go(port)) == "bypass" and call.calls == 1


T = TypeVar("T")


async def started_in_a_stall(server: RedisServer, calls: Awaitable[T]) -> asyncio.Future[T]:
    """``calls`` started while ``server`` is stopped (SIGSTOP, a failover's pause) and left
    running once it is back, 0.6 s later: long enough for their lookups to time out."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        running = asyncio.ensure_future(calls)
        await asyncio.sleep(0.6)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    return running


def test_answers_that_arrive_after_a_redis_stall_are_stored(tmp_path: Path) -> None:
    """Hostile pass (h22): Redis stalled (SIGSTOP, a failover's CLIENT PAUSE) while 16 calls
    looked up their keys; it was back long before their answers arrived, yet none was
    stored, so a crashed step's re-run paid for every one again (the evolver's samples at
    temperature 0.7 included: the re-run gated another candidate)."""
    with RedisServer(tmp_path, persist=False) as server:
        cache = ResponseCache(server.url, socket_timeout=0.2, retry_interval=0.3)
        call = Counting(delay=1.5)

        async def go() -> tuple[list[str], list[str]]:
            try:
                first = await started_in_a_stall(server, asyncio.gather(*(
                    cache.get_or_call(parts(content=f"q{i}"), call) for i in range(16))))
                before = [r.source for r in await first]
                again = [(await cache.get_or_call(parts(content=f"q{i}"), call)).source
                         for i in range(16)]
                return before, again
            finally:
                await cache.aclose()

        before, again = asyncio.run(go())
    assert before == ["bypass"] * 16
    assert again == ["hit"] * 16 and call.calls == 16



def test_a_call_that_bypassed_a_stalled_redis_keeps_another_processes_stored_answer(
        tmp_path: Path) -> None:
    """First writer wins on the bypass path too (h18): A's lookup timed out in a stall, B
    (another process) then missed, answered "B" and stored it; A's later answer "A"
    overwrote it, so a re-run served B an answer it never graded."""
    with RedisServer(tmp_path, persist=False) as server:
        a = ResponseCache(server.url, socket_timeout=0.2, retry_interval=0.3)
        b = ResponseCache(server.url)

        async def go() -> tuple[Any, Any, Any]:
            try:
                first = await started_in_a_stall(
                    server, a.get_or_call(parts(), Counting(ok("A"), 1.5)))
                rb = await b.get_or_call(parts(), Counting(ok("B")))
                ra = await first
                return ra, rb, await b.lookup(parts())
            finally:
                await a.aclose()
                await b.aclose()

        ra, rb, later = asyncio.run(go())
    assert (ra.source, rb.source) == ("bypass", "miss")
    assert ra.response == rb.response == later == ok("B")
    assert (a.stats().raced, a.stats().writes, b.stats().writes) == (1, 0, 1)


def test_a_call_that_bypassed_a_stalled_redis_replaces_a_malformed_entry(
        tmp_path: Path) -> None:
    """Over an entry that is not one (an older schema's, garbage), the bypass path's NX write
    failed and the answer was never stored: the next call paid again and served another
    sample (h19). It replaces such an entry, as a miss does."""
    with RedisServer(tmp_path, persist=False) as server:
        a = ResponseCache(server.url, socket_timeout=0.2, retry_interval=0.3)
        admin = redis.Redis.from_url(server.url)
        admin.set(parts().key(a.prefix), b"garbage")
        admin.close()
        call = Counting(ok("A"), 1.5)

        async def go() -> tuple[Any, Any]:
            try:
                ra = await (await started_in_a_stall(server, a.get_or_call(parts(), call)))
                await asyncio.sleep(0.4)  # past the retry interval: Redis is used again
                return ra, await a.get_or_call(parts(), Counting(ok("A2")))
            finally:
                await a.aclose()

        ra, again = asyncio.run(go())
    assert (ra.source, again.source) == ("bypass", "hit")
    assert ra.response == again.response == ok("A") and call.calls == 1


@pytest.mark.parametrize("user", ["default", "no CONFIG"])
def test_a_reply_over_the_servers_bulk_limit_is_served_uncached_not_an_outage(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, user: str) -> None:
    """Redis closes the connection on a value over its ``proto-max-bulk-len`` (512 MB by
    default, 1 MB at its lowest). One such reply (a 2 MB answer under a 1 MB limit) read as
    an outage: every later call bypassed the cache until the retry interval, the stored
    answers included. It is served, counted ``too_large`` with one warning, and the cache goes
    on; so too for a user who may not run CONFIG (a managed Redis: asking the limit first
    could not work there), and when the limit is lowered mid-run."""
    with RedisServer(tmp_path, persist=False) as server:
        admin = redis.Redis.from_url(server.url)
        admin.config_set("proto-max-bulk-len", str(2 << 20))
        url = server.url
        if user == "no CONFIG":
            admin.acl_setuser("app", enabled=True, passwords=["+pw"], keys=["*"],
                              commands=["+@all", "-config"])
            # the server's URL is unix://: a replace of "redis://" left it the default user
            url = url.replace("://", "://app:pw@", 1)
        cache = ResponseCache(url, retry_interval=3600.0)
        small, big = Counting(), Counting(ok("x" * (3 << 20 >> 1)))  # 1.5 MB

        async def go() -> list[str]:
            try:
                out = [(await cache.get_or_call(parts(content=f"q{i}"), small)).source
                       for i in range(3)]
                out.append((await cache.get_or_call(parts(content="big"), big)).source)
                admin.config_set("proto-max-bulk-len", str(1 << 20))  # lowered mid-run
                for _ in range(2):
                    out.append((await cache.get_or_call(parts(content="big2"), big)).source)
                out += [(await cache.get_or_call(parts(content=f"q{i}"), small)).source
                        for i in range(5)]
                return out
            finally:
                await cache.aclose()
                admin.close()

        with caplog.at_level(logging.INFO, "vtrm_gate.cache"):
            sources = asyncio.run(go())
    assert sources == ["miss"] * 4 + ["miss"] * 2 + ["hit"] * 3 + ["miss"] * 2
    assert (big.calls, small.calls) == (3, 5)
    st_ = cache.stats()
    assert (st_.errors, st_.bypassed, st_.too_large, st_.writes) == (0, 0, 2, 6)
    assert "unavailable" not in " ".join(warnings_of(caplog, ""))
    [warned] = warnings_of(caplog, "proto-max-bulk-len")
    assert "would not store" in warned and "not cached" in warned
