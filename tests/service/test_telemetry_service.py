"""Telemetry on FakeBus + FakeStore: node scrapes, the health rule, residency from usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from services.telemetry.handlers import NodeScrapers
from services.telemetry.residency import UsageResidency
from services.telemetry.scrape import HttpFetch
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.node import NodeStatus
from shared.contracts.session import SessionResponse, Usage
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.settings import NodeSpec

PAGE = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    'vllm:num_requests_running{model_name="m"} 2\n'
    'vllm:num_requests_waiting{model_name="m"} 1\n'
)
MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'


class StubFetch:
    """An injected fetch: answers from ``pages`` or raises while ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.pages = {"http://n1/metrics": PAGE.encode(), "http://n1/v1/models": MODELS}

    async def __call__(self, url: str) -> bytes:
        if self.down:
            raise ConnectionError("connection refused")
        return self.pages[url]


def scrapers(
    store: FakeStore, bus: FakeBus, fetch: object, clock: Callable[[], float] = lambda: 100.0
) -> NodeScrapers:
    return NodeScrapers(
        nodes=[NodeSpec("n1", "http://n1")],
        fetch=fetch,  # type: ignore[arg-type]
        store=store,
        bus=bus,
        log=get_logger("test"),
        target_utilisation=0.9,
        clock=clock,
    )


class TestNodeScrapes:
    async def test_scrape_writes_record_and_publishes_status(self) -> None:
        """A good scrape writes capacity, usage, counts and models, and publishes NodeStatus."""
        store, bus = FakeStore(), FakeBus()
        await scrapers(store, bus, StubFetch()).scrape_all()
        rec = await store.get_node("n1")
        assert rec is not None
        assert (rec.capacity_tokens, rec.used_tokens, rec.running, rec.waiting) == (
            16_000,
            8_000,
            2,
            1,
        )
        assert (rec.healthy, rec.models, rec.target_utilisation, rec.url) == (
            True,
            frozenset({"m"}),
            0.9,
            "http://n1",
        )
        sent = [
            decode(d, NodeStatus) for s, d, _ in bus.published if s == subjects.node_status("n1")
        ]
        assert len(sent) == 1 and sent[0].capacity_tokens == 16_000 and sent[0].healthy

    @pytest.mark.parametrize(
        ("spec", "page"),
        [
            (NodeSpec("n1", "http://n1", metrics_url="http://n1:9/prom"), "http://n1:9/prom"),
            (NodeSpec("n1", "http://n1/"), "http://n1/metrics"),
        ],
    )
    async def test_metrics_page_is_the_specs(self, spec: NodeSpec, page: str) -> None:
        """The page scraped is ``NodeSpec.metrics``: the configured URL, else ``<url>/metrics``."""
        store, bus, fetch = FakeStore(), FakeBus(), StubFetch()
        fetch.pages[page] = fetch.pages.pop("http://n1/metrics")
        sc = scrapers(store, bus, fetch)
        sc.nodes = [spec]
        await sc.scrape_all()
        rec = await store.get_node("n1")
        assert rec is not None and rec.healthy and rec.capacity_tokens == 16_000
        assert spec.metrics == page

    @pytest.mark.parametrize(
        ("period", "expected"),
        [
            # one scrape per second: the third failure is 3 s after the last good scrape
            (1.0, [(True, 1), (True, 2), (False, 3), (False, 4)]),
            # one per 0.5 s: the third failure comes 1.5 s in, too soon; the sixth is 3 s in
            (0.5, [(True, 1), (True, 2), (True, 3), (True, 4), (True, 5), (False, 6)]),
        ],
    )
    async def test_failures_mark_unhealthy(
        self, period: float, expected: list[tuple[bool, int]]
    ) -> None:
        """The node stays healthy through two failed scrapes, and through more while they
        span less than DOWN_AFTER_S since its last good scrape; then it is unhealthy, and a
        good scrape makes it healthy again."""
        now = [100.0]
        store, bus, fetch = FakeStore(), FakeBus(), StubFetch()
        sc = scrapers(store, bus, fetch, clock=lambda: now[0])
        await sc.scrape_all()
        fetch.down = True
        seen = []
        for _ in expected:
            now[0] += period
            await sc.scrape_all()
            rec = await store.get_node("n1")
            assert rec is not None
            seen.append((rec.healthy, rec.failures))
        assert seen == expected
        last = decode(bus.published[-1][1], NodeStatus)
        assert last.healthy is False  # what the gateway and planner hear
        rec = await store.get_node("n1")
        assert rec is not None and rec.capacity_tokens == 16_000  # last seen, for status
        fetch.down = False
        now[0] += period
        await sc.scrape_all()
        rec = await store.get_node("n1")
        assert rec is not None and (rec.healthy, rec.failures) == (True, 0)

    @pytest.mark.parametrize(
        ("pages", "expected"),
        [
            # (start time, prefix queries, hits) per good scrape; None: a failed scrape
            ([(50.0, 100, 40), None, None, (90.0, 300, 100)], [("n1", 100.0, "start time")]),
            ([(50.0, 100, 40), (51.0, 101, 41)], [("n1", 100.0, "start time")]),
            ([(None, 100, 40), None, (None, 0, 0)], [("n1", 100.0, "counters went back")]),
            ([(None, 100, 40), (None, 100, 10)], [("n1", 100.0, "counters went back")]),
            ([(50.0, 100, 40), None, (50.0, 120, 50)], []),  # the same engine came back
            ([(None, 100, 40), (None, 200, 90)], []),
            ([(None, None, None), (None, None, None)], []),  # nothing to compare
            ([None, (None, 0, 0)], []),  # first good scrape
        ],
    )
    async def test_engine_restart_is_reported(
        self, pages: list[tuple[float | None, int | None, int | None] | None], expected: list
    ) -> None:
        """A good scrape whose engine start time changed, or whose prefix-cache counters went
        back, reports the restart to the hook with the last good scrape's time, before the
        node is written healthy; the same engine back after failed scrapes is no restart."""
        store, bus, fetch = FakeStore(), FakeBus(), StubFetch()
        calls: list[tuple[str, float | None, str, bool | None]] = []
        sc = scrapers(store, bus, fetch)

        async def hook(node: str, since: float | None, reason: str) -> None:
            rec = await store.get_node(node)
            calls.append((node, since, reason, None if rec is None else rec.healthy))

        sc.on_restart = hook
        for page in pages:
            fetch.down = page is None
            if page is not None:
                start, queries, hits = page
                extra = "" if start is None else f"process_start_time_seconds {start}\n"
                if queries is not None:
                    extra += f"vllm:prefix_cache_queries_total {queries}\n"
                    extra += f"vllm:prefix_cache_hits_total {hits}\n"
                fetch.pages["http://n1/metrics"] = (PAGE + extra).encode()
            await sc.scrape_all()
        got = [(node, since, reason.split()[0], healthy) for node, since, reason, healthy in calls]
        first_word = {"start time": "process", "counters went back": "prefix-cache"}
        assert got == [(node, since, first_word[why], True) for node, since, why in expected]
        assert sc.restarts.get("n1", 0) == len(expected)

    async def test_never_scraped_node_is_unhealthy(self) -> None:
        """A node whose first scrape fails is written unhealthy."""
        store, bus, fetch = FakeStore(), FakeBus(), StubFetch()
        fetch.down = True
        await scrapers(store, bus, fetch).scrape_all()
        rec = await store.get_node("n1")
        assert rec is not None and not rec.healthy

    async def test_models_fall_back_to_metric_labels(self) -> None:
        """Without /v1/models the model_name labels of the metrics name the served model."""
        store, bus, fetch = FakeStore(), FakeBus(), StubFetch()
        del fetch.pages["http://n1/v1/models"]
        await scrapers(store, bus, fetch).scrape_all()
        rec = await store.get_node("n1")
        assert rec is not None and rec.models == frozenset({"m"})


@pytest.fixture
async def vllm_stub() -> AsyncIterator[str]:
    """A real HTTP server answering /metrics and /v1/models like a vLLM node."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=MODELS)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


class TestHttpFetch:
    async def test_scrape_over_http(self, vllm_stub: str) -> None:
        """The aiohttp fetch scrapes a real HTTP endpoint end to end."""
        store, bus = FakeStore(), FakeBus()
        fetch = HttpFetch(timeout_s=2.0)
        try:
            sc = scrapers(store, bus, fetch)
            sc.nodes = [NodeSpec("n1", vllm_stub)]
            await sc.scrape_all()
        finally:
            await fetch.aclose()
        rec = await store.get_node("n1")
        assert rec is not None and rec.healthy and rec.capacity_tokens == 16_000


class TestUsageResidency:
    async def test_response_writes_residency_on_serving_node(self) -> None:
        """A response on n2 makes prompt+completion tokens resident on n2 at finished_at."""
        store, bus = FakeStore(), FakeBus()
        await UsageResidency(store, get_logger("test")).start(bus, "telemetry")
        ok = SessionResponse(
            session_id="s1",
            request_id="r1",
            node_id="n2",
            gateway_id="gw",
            finished_at=50.0,
            usage=Usage(prompt_tokens=700, completion_tokens=50, total_tokens=750),
        )
        failed = SessionResponse(
            session_id="s2",
            request_id="r1",
            node_id="n2",
            gateway_id="gw",
            finished_at=50.0,
            usage=Usage(prompt_tokens=10),
            error="boom",
        )
        await bus.publish_msg(ok)
        await bus.publish_msg(failed)
        await bus.settle()
        assert await store.residency(["s1", "s2"]) == {"s1": {"n2": (750, 50.0)}, "s2": {}}
        await bus.drain()

    async def test_bad_node_id_is_dead_lettered(self) -> None:
        """A response naming an unusable node id is dead-lettered, not retried."""
        store, bus = FakeStore(), FakeBus()
        await UsageResidency(store, get_logger("test")).start(bus, "telemetry")
        bad = SessionResponse(
            session_id="s1", request_id="r", node_id="bad node", gateway_id="gw", finished_at=1
        )
        await bus.publish_msg(bad)
        await bus.settle()
        assert [s for s, _, _ in bus.published if s == subjects.dead_letter("telemetry")]
        await bus.drain()


class TestSimNode:
    async def test_scrapes_the_sim_node(self) -> None:
        """Telemetry reads the sim node's /metrics and /v1/models as it would a vLLM node."""
        from services.simnode.app import SimNodeConfig, create_app

        runner = web.AppRunner(create_app(SimNodeConfig("sim1", kv_tokens=32_768)))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        store, bus = FakeStore(), FakeBus()
        fetch = HttpFetch(timeout_s=2.0)
        try:
            sc = scrapers(store, bus, fetch)
            sc.nodes = [NodeSpec("sim1", f"http://127.0.0.1:{port}")]
            await sc.scrape_all()
        finally:
            await fetch.aclose()
            await runner.cleanup()
        rec = await store.get_node("sim1")
        assert rec is not None and rec.healthy
        assert rec.capacity_tokens == 32_768
        assert rec.models == frozenset({"tao-sim"})
        assert (rec.running, rec.waiting, rec.prefix_cache_queries) == (0, 0, 0)


class TestPrefixHitRate:
    def test_window_rate_uses_counter_deltas_and_survives_resets(self) -> None:
        sc = scrapers(FakeStore(), FakeBus(), None)
        assert sc.window_hit_rate("n1", 1000, 400) is None  # first scrape: no window yet
        assert sc.window_hit_rate("n1", 2000, 1150) == 0.75  # 750 hits of 1000 new queries
        assert sc.window_hit_rate("n1", 2000, 1150) is None  # no queries in between
        assert sc.window_hit_rate("n1", 10, 5) is None  # counters went back: engine restarted
        assert sc.window_hit_rate("n1", 20, 5) == 0.0
        assert sc.window_hit_rate("n1", None, None) is None

    def test_status_shows_lifetime_rate(self) -> None:
        from shared.infra.store_stats import prefix_hit_rate

        assert prefix_hit_rate(400, 100) == 0.25
        assert prefix_hit_rate(0, 0) is None and prefix_hit_rate(None, 3) is None
