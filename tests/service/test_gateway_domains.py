"""One gateway for two scheduling domains (``TAO_GATEWAY_DOMAINS``; services.gateway.domains).

Two domains ``pa`` and ``pb``, each with its own in-memory bus (its namespace), store and sim
node, behind one app from ``create_domains_app``. Checked: a new session goes to the domain
least loaded after it by the valuations' load reports (and the weights routed since), one
whose nodes do not serve its model is never chosen, a session stays where it went, a session
another gateway routed is found in its domain's store, an operator's ``X-TAO-Domain`` pin wins,
hook posts follow their session, and the models, health and metrics pages cover both domains.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.gateway.app import ROUTER, create_domains_app
from services.gateway.domains import DOMAIN_HEADER, DomainRouter
from services.gateway.metrics import labelled_union
from services.simnode.app import SimNodeConfig
from services.simnode.app import create_app as create_simnode
from shared.contracts import Placement, SessionRequest, decode_session_event, subjects
from shared.contracts.domain import DomainLoadReport
from shared.core.session import Session, on_request
from shared.infra import FakeBus, Settings
from shared.infra.fake_store import FakeStore
from shared.infra.settings import NodeSpec
from tests.service.gateway_util import Recorder

GW = "gwd"
DOMAINS = ("pa", "pb")
SETTINGS = Settings(gateway_id=GW, hold_timeout_s=10.0, gateway_domains=DOMAINS)


class Domain:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.bus = FakeBus(name)
        self.store = FakeStore(name)
        self.rec = Recorder()
        node = NodeSpec(f"{name}-n1", url)
        self.settings = SETTINGS.replace(domain=name, namespace=name, nodes=(node,))

    async def load(self, capacity: int, demand: int, models: list[str] | None, ts: float) -> None:
        report = DomainLoadReport(
            domain=self.name, ts=ts, tick=1, capacity=capacity, demand=demand, models=models
        )
        await self.bus.publish_msg(report)
        await self.bus.settle()

    async def admit(self, session: str) -> None:
        await self.bus.publish_msg(
            Placement(
                kind="admit",
                session_id=session,
                version=1,
                tick=1,
                gateway_id=GW,
                node_id=f"{self.name}-n1",
            )
        )
        await self.bus.settle()


class Env:
    def __init__(self, client: TestClient[Any, Any], domains: dict[str, Domain]) -> None:
        self.client = client
        self.d = domains
        self.router: DomainRouter = client.app[ROUTER]

    async def turn(self, session: str, model: str = "tao-sim", **headers: str) -> str:
        """One chat turn of ``session``; the domain it was registered in, which admits it."""
        registered = {n: len(d.rec.of(SessionRequest)) for n, d in self.d.items()}
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        call = asyncio.ensure_future(
            self.client.post(
                "/v1/chat/completions", json=body, headers={"X-Session-ID": session, **headers}
            )
        )
        async with asyncio.timeout(10):
            while True:
                grown = [
                    n for n, d in self.d.items() if len(d.rec.of(SessionRequest)) > registered[n]
                ]
                if grown:
                    break
                await asyncio.sleep(0.01)
        (domain,) = grown
        await self.d[domain].admit(session)
        resp = await call
        assert resp.status == 200, await resp.text()
        await resp.read()
        return domain


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    sims = [TestServer(create_simnode(SimNodeConfig(node_id=n, time_scale=100.0))) for n in DOMAINS]
    for sim in sims:
        await sim.start_server()
    domains = {
        n: Domain(n, str(sim.make_url("")).rstrip("/"))
        for n, sim in zip(DOMAINS, sims, strict=True)
    }
    for d in domains.values():
        await d.bus.subscribe(subjects.session_events(), "rec", decode_session_event, d.rec.handler)
    links = {n: (d.settings, d.bus, d.store) for n, d in domains.items()}
    client = TestClient(TestServer(create_domains_app(SETTINGS, links)))
    await client.start_server()
    try:
        yield Env(client, domains)
    finally:
        await client.close()
        for sim in sims:
            await sim.close()
        for d in domains.values():
            await d.bus.drain()


class TestRouting:
    async def test_a_new_session_goes_to_the_least_loaded_domain_and_stays(self, env: Env) -> None:
        await env.d["pa"].load(100_000, 90_000, None, ts=1.0)
        await env.d["pb"].load(100_000, 10_000, None, ts=1.0)
        assert await env.turn("s1") == "pb"
        await env.d["pb"].load(100_000, 99_000, None, ts=2.0)  # pb is now the busier one
        assert await env.turn("s1") == "pb"  # remembered
        assert await env.turn("s2") == "pa"
        assert env.router.routed == {("pb", "least_loaded"): 1, ("pa", "least_loaded"): 1}

    async def test_weights_routed_since_the_last_report_count(self, env: Env) -> None:
        """A burst between two reports is spread: each routed session adds its weight."""
        await env.d["pa"].load(10_000, 0, None, ts=1.0)
        await env.d["pb"].load(10_000, 500, None, ts=1.0)
        got = [await env.router.route(f"b{i}", "m", 1000, None, now=1.5) for i in range(4)]
        assert [r.domain for r in got] == ["pa", "pb", "pa", "pb"]
        await env.d["pa"].load(10_000, 0, None, ts=2.0)  # a newer report counts them itself
        assert env.router._load("pa").demand == 0 and env.router._load("pb").demand == 500 + 3024

    async def test_a_domain_that_does_not_serve_the_model_is_not_chosen(self, env: Env) -> None:
        await env.d["pa"].load(100_000, 90_000, ["tao-sim"], ts=1.0)
        await env.d["pb"].load(100_000, 0, ["other"], ts=1.0)
        assert await env.turn("s1") == "pa"
        assert (await env.router.route("s9", "other", 10, None, now=2.0)).domain == "pb"
        assert (await env.router.route("s8", "nobody", 10, None, now=2.0)).reason == "fallback"

    async def test_a_session_routed_by_another_gateway_is_found_in_its_store(
        self, env: Env
    ) -> None:
        await env.d["pa"].load(100_000, 0, None, ts=1.0)
        await env.d["pb"].load(100_000, 90_000, None, ts=1.0)
        s, _ = on_request(Session("elsewhere"), "r", 1.0, model="tao-sim")
        await env.d["pb"].store.update_session("elsewhere", lambda _o: s)
        assert await env.turn("elsewhere") == "pb"
        assert env.router.routed == {("pb", "stored"): 1}

    async def test_an_operator_pin_wins(self, env: Env) -> None:
        await env.d["pa"].load(100_000, 0, None, ts=1.0)
        await env.d["pb"].load(100_000, 90_000, None, ts=1.0)
        assert await env.turn("s1", **{DOMAIN_HEADER: "pb"}) == "pb"
        assert await env.turn("s2", **{DOMAIN_HEADER: "nowhere"}) == "pa"  # not a served one

    async def test_a_hook_post_follows_its_session(self, env: Env) -> None:
        await env.d["pa"].load(100_000, 90_000, None, ts=1.0)
        await env.d["pb"].load(100_000, 0, None, ts=1.0)
        assert await env.turn("s1") == "pb"
        payload = {"session_id": "s1", "hook_event_name": "PreToolUse", "tool_name": "Bash"}
        resp = await env.client.post("/hooks/claude-code", json=payload)
        assert resp.status == 200
        for _ in range(100):
            if any(s == subjects.hook_events("claude") for s, _, _ in env.d["pb"].bus.published):
                break
            await asyncio.sleep(0.01)
        hooked = {n: [s for s, _, _ in d.bus.published if "hook" in s] for n, d in env.d.items()}
        assert hooked == {"pa": [], "pb": [subjects.hook_events("claude")]}


class TestPages:
    async def test_models_health_and_metrics_cover_every_domain(self, env: Env) -> None:
        await env.d["pa"].load(100_000, 0, None, ts=1.0)
        await env.d["pb"].load(100_000, 10, None, ts=1.0)
        assert await env.turn("s1") == "pa"
        models = orjson.loads(await (await env.client.get("/v1/models")).read())
        assert [m["id"] for m in models["data"]] == ["tao-sim"]
        health = orjson.loads(await (await env.client.get("/healthz")).read())
        assert set(health["domains"]) == {"pa", "pb"} and health["gateway_id"] == GW
        text = await (await env.client.get("/metrics")).text()
        assert text.count("# TYPE tao_gateway_requests_total counter") == 1
        assert 'tao_gateway_requests_total{domain="pa",endpoint="chat",outcome="ok"} 1' in text
        assert 'tao_gateway_routed_sessions_total{domain="pa",reason="least_loaded"} 1' in text
        assert 'tao_gateway_held_requests{domain="pb"} 0' in text


def test_labelled_union_keeps_one_header_per_family() -> None:
    page = '# HELP x h\n# TYPE x counter\nx{k="1"} 2\n# TYPE g gauge\ng 3\n'
    assert labelled_union({"a": page, "b": page}, "domain") == (
        '# HELP x h\n# TYPE x counter\nx{domain="a",k="1"} 2\nx{domain="b",k="1"} 2\n'
        '# TYPE g gauge\ng{domain="a"} 3\ng{domain="b"} 3\n'
    )
