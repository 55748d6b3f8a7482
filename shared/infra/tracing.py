"""OpenTelemetry traces of each model turn, off unless the standard OTEL variables turn them on.

Spans (every one carries ``tao.session_id``, the correlation key across services):

* ``tao.turn`` (gateway, SERVER) — one model request from arrival to the last byte sent, with
  ``tao.endpoint``, ``tao.request_id``, ``http.response.status_code``;
  * ``tao.hold`` — the wait for admission (``tao.node`` once placed, ``tao.outcome``);
  * ``tao.forward`` (CLIENT) — the node's request and answer (``tao.node``);
* ``tao.tool`` (tools service) — a tool call as its hook reported it, from its start to its end
  (``tao.tool``, ``tao.source``), parented by the W3C ``traceparent`` header of the event's NATS
  message when there is one;
* ``tao.plan`` (planner) — one decision: ``tao.tick``, ``tao.method``, ``tao.exact``, the
  sessions admitted and interrupted (``tao.admitted`` / ``tao.interrupted``), the rule set
  (``tao.rules``) and one event per admit and release of its round record (``tao.admit`` /
  ``tao.release``: ``tao.session``, ``tao.node``, ``tao.rule``, ``tao.gain_s``, ``tao.cost_s``,
  ``tao.for``).

Propagation: the gateway's session events (request, response, cancel, end) carry the turn's
``traceparent`` / ``tracestate`` in their NATS headers (:func:`inject`), so a consumer continues
the trace (:func:`extract`).

Turning it on (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):
``OTEL_TRACES_EXPORTER`` = ``otlp`` (needs ``pip install 'tao-scheduler[otel]'``, the OTLP/HTTP
exporter, which reads ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends itself) or ``console``; an
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` alone means ``otlp``.
``OTEL_SERVICE_NAME`` names the service (default: the TAO service's name);
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` keep it off. Off, the spans are the
API's no-op ones: a context manager and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context

__all__ = [
    "configure_from_env",
    "exporter_from_env",
    "extract",
    "inject",
    "shutdown",
    "tracer",
    "use_provider",
]

_provider: Any = None


def tracer(name: str) -> trace.Tracer:
    """The tracer of module ``name`` (the no-op one until tracing is configured)."""
    return trace.get_tracer(name)


def use_provider(provider: Any) -> None:
    """Install ``provider`` (an SDK ``TracerProvider``) as the process's, once (the API keeps
    the first): what :func:`configure_from_env` does, and what tests do with an in-memory
    exporter. Tracers taken before it (module-level ones) follow it."""
    global _provider
    _provider = provider
    trace.set_tracer_provider(provider)


def exporter_from_env(env: Mapping[str, str]) -> tuple[str, Any] | None:
    """``(kind, span exporter)`` the OTEL variables of the module docstring ask for, or None
    when tracing stays off. Raises ValueError naming the variable for an exporter that is
    unknown or not installed."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    kind = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not kind and (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        kind = "otlp"
    if kind in ("", "none"):
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return kind, ConsoleSpanExporter()
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ValueError(
                "OTEL_TRACES_EXPORTER: otlp needs the OTLP exporter "
                "(pip install 'tao-scheduler[otel]')"
            ) from None
        return kind, OTLPSpanExporter()
    raise ValueError(f"OTEL_TRACES_EXPORTER: must be otlp, console or none, got {kind!r}")


def configure_from_env(env: Mapping[str, str], service: str) -> str | None:
    """Turn tracing on as :func:`exporter_from_env` says (batching spans to the exporter, the
    resource named ``OTEL_SERVICE_NAME`` or ``service``); returns the exporter kind, or None."""
    chosen = exporter_from_env(env)
    if chosen is None:
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    kind, exporter = chosen
    name = env.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use_provider(provider)
    return kind


def shutdown() -> None:
    """Flush and stop the configured provider (a service's exit); nothing when off."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def inject(headers: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` plus the current span's W3C trace context (unchanged when none is active)."""
    out = dict(headers or {})
    propagate.inject(out)
    return out


def extract(headers: Mapping[str, str] | None) -> Context:
    """The trace context a message's headers carry (an empty context without one)."""
    return propagate.extract(dict(headers or {}))
