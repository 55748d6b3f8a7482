"""Traces (shared.infra.tracing) with the SDK's in-memory exporter: a model turn's spans in
the gateway, its trace context on the NATS session events, a tool call's span in the tools
service, and the OTEL variables that turn export on."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from services.tools.app import start as start_tools
from shared.contracts import SessionRequest, ToolEnd, ToolStart
from shared.infra import tracing
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from tests.service.test_gateway_service import SETTINGS, Harness, make_harness

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider, with an in-memory exporter (installed once: the API
    keeps the first provider), emptied for each test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        tracing.use_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS):
        yield harness


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


class TestGatewayTurn:
    async def test_turn_hold_and_forward_spans(
        self, spans: InMemorySpanExporter, h: Harness
    ) -> None:
        """A held request gives tao.turn (SERVER) with tao.hold and tao.forward (CLIENT) under
        it, all with the session id; the SessionRequest on NATS carries the turn's trace."""
        task = asyncio.create_task(h.chat("s1"))
        [req] = await h.rec.next(SessionRequest)
        await h.place("admit", "s1", 1)
        assert (await task).status == 200
        await h.relay.flush()
        (turn,) = _named(spans, "tao.turn")
        (hold,) = _named(spans, "tao.hold")
        (fwd,) = _named(spans, "tao.forward")
        assert turn.kind == SpanKind.SERVER and fwd.kind == SpanKind.CLIENT
        assert turn.attributes is not None and turn.attributes["tao.session_id"] == "s1"
        assert turn.attributes["tao.request_id"] == req.request_id
        assert turn.attributes["http.response.status_code"] == 200
        assert hold.attributes is not None and hold.attributes["tao.node"] == "n1"
        assert fwd.attributes is not None and fwd.attributes["tao.node"] == "n1"
        assert turn.context is not None and hold.parent is not None and fwd.parent is not None
        assert hold.parent.span_id == fwd.parent.span_id == turn.context.span_id
        published = [hdrs for subj, data, hdrs in h.bus.published if b"SessionRequest" in data]
        assert published, "the request was published"
        trace_id = format(turn.context.trace_id, "032x")
        assert trace_id in (published[0] or {}).get("traceparent", "")
        responses = [hdrs for subj, data, hdrs in h.bus.published if b"SessionResponse" in data]
        assert trace_id in (responses[0] or {}).get("traceparent", "")

    async def test_no_spans_leak_without_a_turn(
        self, spans: InMemorySpanExporter, h: Harness
    ) -> None:
        """A request answered 400 still ends its turn span, with the status."""
        resp = await h.client.post("/v1/chat/completions", json={"model": "m"})
        assert resp.status == 400
        (turn,) = _named(spans, "tao.turn")
        assert turn.attributes is not None and turn.attributes["http.response.status_code"] == 400


class TestToolSpan:
    async def test_tool_call_span_from_its_hook_events(self, spans: InMemorySpanExporter) -> None:
        """A hook ToolEnd with a duration gives tao.tool from start to end, in the trace of
        the message's traceparent header."""
        bus, store = FakeBus(), FakeStore()
        await start_tools(store, bus)
        await bus.publish_msg(SessionRequest(session_id="s1", request_id="r1", model="m",
                                             arrived_at=10.0, gateway_id="g"))  # fmt: skip
        await bus.publish_msg(
            ToolStart(session_id="s1", call_id="c1", tool="Bash", started_at=11.0)
        )
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        end = ToolEnd(session_id="s1", call_id="c1", ended_at=14.5, tool="Bash", duration_s=3.5)
        await bus.publish_msg(end, headers={"traceparent": parent})
        await bus.settle()
        (span,) = _named(spans, "tao.tool")
        assert span.attributes is not None and span.attributes["tao.session_id"] == "s1"
        assert span.attributes["tao.tool"] == "Bash"
        assert (span.start_time, span.end_time) == (11_000_000_000, 14_500_000_000)
        assert span.context is not None
        assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
        await bus.drain()


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, None),
        ({"OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_exporter_from_env(env: dict[str, str], kind: str | None) -> None:
    chosen = tracing.exporter_from_env(env)
    assert (None if chosen is None else chosen[0]) == kind


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER: must be otlp, console or none"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "needs the OTLP exporter"),
    ],
)
def test_bad_or_missing_exporter_names_the_variable(env: dict[str, str], message: str) -> None:
    if "OTEL_EXPORTER_OTLP_ENDPOINT" in env and _installed("opentelemetry.exporter.otlp"):
        pytest.skip("the OTLP exporter (the optional otel extra) is installed here")
    with pytest.raises(ValueError, match=message):
        tracing.exporter_from_env(env)


class TestPlanSpan:
    async def test_plan_span_carries_each_decision_with_its_rule_and_price(
        self, spans: InMemorySpanExporter
    ) -> None:
        """tao.plan has one event per admit and release of the round record."""
        from services.planner.handlers import _trace_plan
        from shared.core.interrupt import InterruptCandidate
        from shared.core.policies import get_policy
        from shared.core.problem import Node
        from shared.core.tick import Applied, TickCandidate, TickSnapshot, decide

        w = TickCandidate("w", 1, 2048, 2048, 1, {}, frozenset({"n0"}), "", "reasoning")
        t = InterruptCandidate("t", "n0", 2048, 0, 0, 2048, 600.0)
        snap = TickSnapshot(3, 5.0, 512, (Node("n0", 0),), (w,), (t,), {"w": 1, "t": 1})
        d = decide(snap, get_policy("tao"))
        _trace_plan(3, "tao", d, Applied(discarded=False), 5.0, 1.0)
        (span,) = _named(spans, "tao.plan")
        assert span.attributes is not None and span.attributes["tao.rules"] == "tao"
        events = [(e.name, dict(e.attributes or {})) for e in span.events]
        assert [(n, a["tao.session"], a["tao.rule"]) for n, a in events] == [
            ("tao.release", "t", "demand"),
            ("tao.admit", "w", "search"),
        ]
        assert events[0][1]["tao.gain_s"] == 600.0 and events[0][1]["tao.cost_s"] > 0
