"""Bodies that cost the gateway far more than their size, and requests held without bound
(issue 40, part 1): each is refused early, with a status and a message naming the limit.

What a review of a running gateway found: 32 KB of gzip became 32 MB parsed; a 33 MB body of
``{"messages":{},"x":[{},{},…]}`` was parsed (1 s) and walked (6 s) before its 400; a valid
30 MB body of a million messages was held with its bytes, items and hash chain alive; nothing
capped held requests without a tenants file. Here each is sent through HTTP to the real app
(the in-memory bus, a stub node) and the answer and what the gateway did are checked.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest

from services.gateway import bodies
from services.gateway import relay as relay_module
from services.gateway import requests as gw_requests
from shared.contracts import SessionRequest
from shared.infra import Settings, SettingsError
from tests.service.test_gateway_service import SETTINGS, Harness, make_harness

CHAT = "/v1/chat/completions"
SESSION = {"X-Session-ID": "s1"}


def chat_body(content: str, **fields: Any) -> bytes:
    return orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    )


def wide_body(items: int) -> bytes:
    """The review's body: valid JSON, almost all of it empty objects."""
    return b'{"messages":{},"x":[' + b",".join([b"{}"] * items) + b"]}"


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS):
        yield harness


async def error_of(resp: Any) -> str:
    answer = orjson.loads(await resp.read())
    message = answer["error"]["message"]
    assert isinstance(message, str)
    return message


@pytest.fixture
def inflated() -> Iterator[list[int]]:
    """Bytes each inflate call of the gateway produced (it inflates with zlib objects)."""
    made: list[int] = []
    real = zlib.decompressobj

    class Counting:
        def __init__(self, wbits: int) -> None:
            self.inner = real(wbits)

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self.inner.decompress(data, max_length)
            made.append(len(out))
            return out

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bodies.zlib, "decompressobj", Counting)
        yield made


class TestCompressedBodies:
    """A gzip or deflate body is inflated by the gateway in bounded steps, never past its
    size cap or its ratio cap; what inflates within both is served as if sent plain."""

    async def test_a_gzip_bomb_is_413_naming_the_ratio_before_it_is_inflated(
        self, h: Harness, inflated: list[int]
    ) -> None:
        """31 MB of one repeated letter (a valid request) gzips to ~30 KB: refused once it
        inflates past 100 times what arrived, which is about 3 MB, not 31 MB."""
        bomb = gzip.compress(chat_body("a" * 31_000_000))
        resp = await h.client.post(CHAT, data=bomb, headers={**SESSION, "Content-Encoding": "gzip"})
        assert resp.status == 413
        assert "TAO_MAX_COMPRESSION_RATIO" in await error_of(resp)
        assert resp.headers.get("Connection", "").lower() == "close"
        limit = SETTINGS.max_compression_ratio * len(bomb) + bodies.INFLATE_STEP
        assert 0 < sum(inflated) <= limit < 31_000_000
        assert h.rec.seen == [] and h.node.bodies == []

    async def test_past_the_size_cap_is_413_naming_it(self) -> None:
        """Within the ratio but past TAO_MAX_BODY_BYTES once inflated: 413 naming that."""
        async for small in make_harness(SETTINGS.replace(max_body_bytes=64 * 1024)):
            body = gzip.compress(chat_body("a" * 200_000))
            resp = await small.client.post(
                CHAT, data=body, headers={**SESSION, "Content-Encoding": "gzip"}
            )
            assert resp.status == 413
            assert "TAO_MAX_BODY_BYTES" in await error_of(resp)

    @pytest.mark.parametrize("coding", ["gzip", "deflate"])
    async def test_a_compressed_body_within_the_caps_is_forwarded_as_sent(
        self, h: Harness, coding: str
    ) -> None:
        await h.place("admit", "s1", 1)
        text = "the tool printed this line\n" * 20_000  # 540 KB, compresses ~100x
        plain = chat_body(text)
        packed = gzip.compress(plain) if coding == "gzip" else zlib.compress(plain)
        resp = await h.client.post(
            CHAT, data=packed, headers={**SESSION, "Content-Encoding": coding}
        )
        assert resp.status == 200, await resp.text()
        assert h.node.bodies[-1]["messages"][0]["content"] == text

    @pytest.mark.parametrize("coding", ["br", "zstd", "gzip, gzip"])
    async def test_a_coding_the_gateway_does_not_inflate_is_415(
        self, h: Harness, coding: str
    ) -> None:
        resp = await h.client.post(
            CHAT, data=b"\x00" * 64, headers={**SESSION, "Content-Encoding": coding}
        )
        assert resp.status == 415
        assert repr(coding) in await error_of(resp)
        assert h.rec.seen == []

    @pytest.mark.parametrize(
        "data", [b"not gzip at all", gzip.compress(b'{"model": "m"}')[:12]], ids=["garbage", "cut"]
    )
    async def test_bytes_that_do_not_inflate_are_400(self, h: Harness, data: bytes) -> None:
        resp = await h.client.post(CHAT, data=data, headers={**SESSION, "Content-Encoding": "gzip"})
        assert resp.status == 400
        assert "not valid gzip" in await error_of(resp)

    async def test_a_gzipped_hook_post_is_inflated_and_forwarded(self, h: Harness) -> None:
        payload = b'{"session_id": "s1", "hook_event_name": "Stop"}'
        resp = await h.client.post(
            "/hooks/claude", data=gzip.compress(payload), headers={"Content-Encoding": "gzip"}
        )
        assert resp.status == 200
        await h.bus.settle()
        assert [d for s, d, _ in h.bus.published if s.startswith("tao.v1.hook")] == [payload]


class TestBodyShape:
    """A body past TAO_MAX_BODY_ITEMS items is refused from its bytes, before any parsing,
    whatever it is sent as; the limit itself is served."""

    @pytest.fixture
    def parsed(self) -> Iterator[list[int]]:
        """Sizes of the bodies the gateway parsed."""
        sizes: list[int] = []
        real = orjson.loads

        def loads(data: Any) -> Any:
            sizes.append(len(data))
            return real(data)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gw_requests.orjson, "loads", loads)
            yield sizes

    async def test_the_reviews_33_mb_wide_body_is_400_naming_the_limit_unparsed(
        self, h: Harness, parsed: list[int]
    ) -> None:
        body = wide_body(11_000_000)
        assert len(body) > 33_000_000
        resp = await h.client.post(CHAT, data=body, headers=SESSION)
        assert resp.status == 400
        message = await error_of(resp)
        assert "more than 524288 items" in message and "TAO_MAX_BODY_ITEMS" in message
        assert [n for n in parsed if n > 1_000_000] == []
        assert h.rec.seen == []

    async def test_gzipped_the_wide_body_is_refused_without_inflating_it(
        self, h: Harness, inflated: list[int], parsed: list[int]
    ) -> None:
        packed = gzip.compress(wide_body(11_000_000))
        resp = await h.client.post(
            CHAT, data=packed, headers={**SESSION, "Content-Encoding": "gzip"}
        )
        assert resp.status == 413
        assert sum(inflated) < 5_000_000 and [n for n in parsed if n > 1_000_000] == []

    async def test_a_valid_body_of_a_million_messages_is_400(self, h: Harness) -> None:
        """Valid, 30 MB, three million items: no model takes it; it is refused, not held."""
        messages = [{"role": "user", "content": "m"}] * 1_000_000
        body = orjson.dumps({"model": "m", "messages": messages})
        assert 30_000_000 < len(body) < SETTINGS.max_body_bytes
        resp = await h.client.post(CHAT, data=body, headers=SESSION)
        assert resp.status == 400
        assert "TAO_MAX_BODY_ITEMS" in await error_of(resp)
        assert h.relay.holds.held() == 0 and h.rec.seen == []

    async def test_the_limit_is_served_and_one_item_more_is_not(self) -> None:
        async for small in make_harness(SETTINGS.replace(max_body_items=10)):
            await small.place("admit", "s1", 1)
            # model, messages, 1 message, its 2 members: 5 items; tools: 1 + 4 elements
            at_limit = chat_body("hi", tools=[1, 2, 3, 4])
            resp = await small.client.post(CHAT, data=at_limit, headers=SESSION)
            assert resp.status == 200, await resp.text()
            over = chat_body("hi", tools=[1, 2, 3, 4, 5])
            resp = await small.client.post(CHAT, data=over, headers=SESSION)
            assert resp.status == 400
            assert "more than 10 items" in await error_of(resp)

    async def test_a_large_body_is_decoded_off_the_event_loop(self, h: Harness) -> None:
        """Bodies of OFF_LOOP_BYTES or more are decoded in a worker thread, small ones
        inline (the event loop answers /healthz meanwhile)."""
        threads: list[bool] = []
        real = bodies._decode

        def spy(*args: Any) -> Any:
            threads.append(threading.current_thread() is threading.main_thread())
            return real(*args)

        await h.place("admit", "s1", 1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bodies, "_decode", spy)
            big = chat_body("x" * bodies.OFF_LOOP_BYTES)
            assert (await h.client.post(CHAT, data=big, headers=SESSION)).status == 200
            assert (await h.client.post(CHAT, data=chat_body("x"), headers=SESSION)).status == 200
        assert threads == [False, True]

    async def test_a_large_bodys_hash_chain_is_made_off_the_event_loop(self, h: Harness) -> None:
        """A request that names no session is matched by its conversation's hash chain:
        for a large body the chain is made in a worker thread too."""
        threads: list[bool] = []
        real = relay_module.conversation

        def spy(*args: Any) -> Any:
            threads.append(threading.current_thread() is threading.main_thread())
            return real(*args)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(relay_module, "conversation", spy)
            big = asyncio.create_task(
                h.client.post(CHAT, data=chat_body("x" * bodies.OFF_LOOP_BYTES))
            )
            await h.rec.next(SessionRequest)
            small = asyncio.create_task(h.client.post(CHAT, data=chat_body("y")))
            await h.rec.next(SessionRequest, 2)
        assert threads == [False, True]
        big.cancel()
        small.cancel()


class TestHeldRequests:
    """Held requests are bounded gateway-wide (TAO_MAX_HELD, TAO_MAX_HELD_BYTES) with or
    without tenants, and a held request keeps its decoded body, not its bytes too."""

    async def test_past_max_held_a_request_is_503_with_retry_after_and_not_registered(
        self,
    ) -> None:
        async for g in make_harness(SETTINGS.replace(max_held=2)):
            held = [asyncio.create_task(g.chat(f"s{i}")) for i in (1, 2)]
            await g.rec.next(SessionRequest, 2)
            resp = await g.chat("s3")
            assert resp.status == 503 and resp.headers["Retry-After"] == "3"
            assert "TAO_MAX_HELD=2" in await error_of(resp)
            assert [m.session_id for m in g.rec.of(SessionRequest)] == ["s1", "s2"]
            await g.place("admit", "s1", 1)
            assert (await held[0]).status == 200
            admitted = await g.chat("s1")  # an admitted session is never held: not counted
            assert admitted.status == 200
            again = asyncio.create_task(g.chat("s3"))  # s1's place is free again
            await g.rec.next(SessionRequest, 4)
            assert g.relay.holds.held() == 2
            await g.place("admit", "s2", 1)
            await g.place("admit", "s3", 1)
            assert [(await t).status for t in (held[1], again)] == [200, 200]
            assert (g.relay.hold_budget.held, g.relay.hold_budget.bytes) == (0, 0)

    async def test_past_max_held_bytes_a_request_is_503(self) -> None:
        async for g in make_harness(SETTINGS.replace(max_held_bytes=300_000)):
            first = asyncio.create_task(
                g.chat("s1", messages=[{"role": "user", "content": "x" * 200_000}])
            )
            await g.rec.next(SessionRequest)
            resp = await g.chat("s2", messages=[{"role": "user", "content": "y" * 200_000}])
            assert resp.status == 503
            assert "TAO_MAX_HELD_BYTES=300000" in await error_of(resp)
            first.cancel()

    async def test_a_held_request_keeps_its_tree_not_its_bytes(self, h: Harness) -> None:
        """While held, the gateway's memory grows by about one copy of an 8 MB body (its
        decoded text), not two (before: the raw bytes stayed on the request as well)."""
        body = chat_body("z" * 8_000_000)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            task = asyncio.create_task(h.client.post(CHAT, data=body, headers=SESSION))
            await h.rec.next(SessionRequest)
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert h.relay.holds.held() == 1
        assert 8_000_000 <= kept < 12_000_000
        await h.place("admit", "s1", 1)
        assert (await task).status == 200


class TestPacing:
    """TAO_BODY_CLIENT_RATE: a client past its byte budget is read more slowly, not refused
    (services/gateway/pacing.py; the budget's arithmetic: tests/unit/gateway/test_pacing.py)."""

    async def test_a_body_past_the_budget_is_served_whole_and_the_wait_is_counted(self) -> None:
        """1 MB/s after 100 KB: a 2 MB body waits at most 1.9 s in all (less by the time its
        reading took), which the arrival deadline does not count (0.2 s, then 100 MB/s:
        counted, the body would be 408)."""
        paced = SETTINGS.replace(
            body_client_rate=1e6, body_client_burst=100_000, body_timeout_s=0.2,
            body_min_rate=1e8,
        )  # fmt: skip
        async for small in make_harness(paced):
            await small.place("admit", "s1", 1)
            text = "x" * 2_000_000
            resp = await small.client.post(CHAT, data=chat_body(text), headers=SESSION)
            assert resp.status == 200, await resp.text()
            assert small.node.bodies[-1]["messages"][0]["content"] == text
            pacer = small.relay.bodies.pacer
            assert pacer is not None and 0.5 < pacer.paced_s <= 1.9 + 1e-3
            page = await (await small.client.get("/metrics")).text()
            line = next(x for x in page.splitlines() if x.startswith("tao_gateway_body_paced"))
            assert float(line.split()[-1]) == pytest.approx(pacer.paced_s)

    async def test_the_wait_is_not_held_against_the_senders_arrival_deadline(self) -> None:
        """3 MB sent at once, paced to about 2.9 s; the rest 3.2 s in: the arrival deadline
        (1 s, then 100 MB/s) counts from the end of the pacing, so the body is served (were
        the waits counted, the read of the rest would be 408)."""
        paced = SETTINGS.replace(
            body_client_rate=1e6, body_client_burst=100_000, body_timeout_s=1.0,
            body_min_rate=1e8,
        )  # fmt: skip
        body = chat_body("x" * 3_100_000)

        async def late_tail() -> AsyncIterator[bytes]:
            yield body[:3_000_000]
            await asyncio.sleep(3.2)  # a sender pausing, after the gateway's pacing has ended
            yield body[3_000_000:]

        async for small in make_harness(paced):
            await small.place("admit", "s1", 1)
            resp = await small.client.post(CHAT, data=late_tail(), headers=SESSION)
            assert resp.status == 200, await resp.text()

    async def test_a_refused_bombs_inflating_is_charged_before_its_answer(
        self, inflated: list[int]
    ) -> None:
        """Each gzip bomb is 413 after about 3 MB of inflating; that work is charged, so at
        10 MB/s after 1 MB the second bomb's answer waits (a client sending bombs one after
        another is slowed to the rate, though it never sends a body that is served)."""
        paced = SETTINGS.replace(body_client_rate=1e7, body_client_burst=1_000_000)
        bomb = gzip.compress(chat_body("a" * 31_000_000))
        async for small in make_harness(paced):
            for _ in range(2):
                resp = await small.client.post(
                    CHAT, data=bomb, headers={**SESSION, "Content-Encoding": "gzip"}
                )
                assert resp.status == 413
            pacer = small.relay.bodies.pacer
            assert pacer is not None
            excess_s = (sum(inflated) - 1_000_000) / 1e7
            assert 0.1 < pacer.paced_s <= excess_s + 1e-3

    async def test_a_body_within_the_default_budget_waits_nothing(self, h: Harness) -> None:
        """By default 64 MB/s after one largest body (32 MiB): an agent's request is never
        slowed."""
        await h.place("admit", "s1", 1)
        resp = await h.client.post(CHAT, data=chat_body("x" * 1_000_000), headers=SESSION)
        assert resp.status == 200
        pacer = h.relay.bodies.pacer
        assert pacer is not None and pacer.rate == 64e6 and pacer.paced_s == 0.0

    async def test_0_turns_pacing_off(self) -> None:
        async for off in make_harness(SETTINGS.replace(body_client_rate=0)):
            await off.place("admit", "s1", 1)
            resp = await off.client.post(CHAT, data=chat_body("x"), headers=SESSION)
            assert resp.status == 200 and off.relay.bodies.pacer is None


class TestSettings:
    """The new limits are read once from the environment and a bad value names its variable."""

    @pytest.mark.parametrize(
        "variable",
        [
            "TAO_MAX_BODY_ITEMS",
            "TAO_MAX_COMPRESSION_RATIO",
            "TAO_BODY_TIMEOUT_S",
            "TAO_BODY_MIN_RATE",
            "TAO_HEADER_TIMEOUT_S",
            "TAO_KEEPALIVE_S",
            "TAO_MAX_CONNECTIONS",
            "TAO_MAX_HELD",
            "TAO_MAX_HELD_BYTES",
        ],
    )
    def test_a_bad_value_names_the_variable(self, variable: str) -> None:
        with pytest.raises(SettingsError, match=variable):
            Settings.from_env({variable: "0.5x"})
        with pytest.raises(SettingsError, match=variable):
            Settings.from_env({variable: "0"})
