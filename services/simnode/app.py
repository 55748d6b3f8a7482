"""aiohttp application factory of the sim node (a vLLM stand-in without a GPU)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

from aiohttp import web

from services.simnode.handlers import SimNode, error_response
from services.simnode.kvpub import DEFAULT_BUFFER_STEPS, KvHashKind, KvPublisher, KvRoutes
from services.simnode.runner import EngineRunner
from shared.contracts.kv import KVEncoding
from shared.core.engine import DEFAULT_PROFILE, PROFILES, Engine, Profile
from shared.core.tiers import HostLink

__all__ = ["KVPUB_KEY", "NODE_KEY", "SimNodeConfig", "create_app"]

NODE_KEY: web.AppKey[SimNode] = web.AppKey("simnode", SimNode)
KVPUB_KEY: web.AppKey[KvPublisher] = web.AppKey("simnode_kvpub", KvPublisher)


@dataclass(frozen=True, slots=True)
class SimNodeConfig:
    """Everything the node needs, parsed once at start-up."""

    node_id: str
    profile: str = DEFAULT_PROFILE
    time_scale: float = 1.0
    model: str = "tao-sim"
    kv_tokens: int | None = None
    """Override of the profile's KV capacity (tokens, rounded down to whole blocks)."""
    stream_tick_s: float = 0.02
    kv_events: str | None = None
    """vLLM-style KV-event PUB endpoint (``tcp://*:5557``); ``None``: no KV events."""
    kv_replay: str | None = None
    """KV-event replay ROUTER endpoint (``tcp://*:5558``)."""
    kv_encoding: KVEncoding = "mapev"
    kv_hash: KvHashKind = "int"
    kv_buffer_steps: int = DEFAULT_BUFFER_STEPS
    kv_topic: str = ""
    kv_bind: bool = False
    """Bind the KV-event PUB even on an address vLLM would connect to (``tcp://127.0.0.1:P``:
    vLLM binds only wildcard, ``::`` and ipc endpoints, ``kv_events.py:449-455@0.32``)."""
    host_kv: float = 0.0
    """A host KV tier of ``host_kv`` × the GPU KV (vLLM's OffloadingConnector, as ``tao sim
    --host-kv``); 0: none. Its blocks are announced as vLLM announces them (``medium="CPU"``)."""

    def host_link(self) -> HostLink | None:
        """The node's host tier (``None``: none); ``ValueError`` names a bad factor."""
        try:
            return self.engine_profile().host_link(self.host_kv)
        except ValueError as exc:
            raise ValueError(f"host_kv: {exc}") from None

    def engine_profile(self) -> Profile:
        """The profile with the capacity override applied; ``ValueError`` names a bad value."""
        try:
            base = PROFILES[self.profile]
        except KeyError:
            raise ValueError(
                f"unknown profile {self.profile!r}; known: {', '.join(PROFILES)}"
            ) from None
        if self.kv_tokens is None:
            return base
        if self.kv_tokens < base.block_size:
            raise ValueError(f"kv_tokens: must be >= {base.block_size}, got {self.kv_tokens}")
        blocks = self.kv_tokens // base.block_size
        return replace(base, kv_tokens=blocks * base.block_size)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Unknown routes and stray exceptions become OpenAI-style JSON errors, never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(
                exc.status, exc.reason, "NotFoundError" if exc.status == 404 else "BadRequestError"
            )
        raise


def create_app(config: SimNodeConfig) -> web.Application:
    """The node's application; the engine driver starts and stops with it."""
    profile = config.engine_profile()
    app = web.Application(middlewares=[_errors])
    engine = Engine(
        config.node_id,
        profile,
        emit_kv_events=config.kv_events is not None,
        host=config.host_link(),
    )
    runner = EngineRunner(engine, time_scale=config.time_scale, stream_tick_s=config.stream_tick_s)
    node = SimNode(runner, config.node_id, config.model)
    app[NODE_KEY] = node
    kvpub = None
    if config.kv_events is not None:
        kvpub = KvPublisher(
            config.kv_events,
            config.kv_replay,
            encoding=config.kv_encoding,
            hash_kind=config.kv_hash,
            buffer_steps=config.kv_buffer_steps,
            topic=config.kv_topic,
            bind=config.kv_bind,
        )
        app[KVPUB_KEY] = kvpub
        runner.after_tick = lambda: kvpub.pump(runner)

    async def lifecycle(_app: web.Application) -> AsyncIterator[None]:
        if kvpub is not None:
            kvpub.start()
        runner.start()
        yield
        await runner.stop()
        if kvpub is not None:
            await kvpub.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/chat/completions", node.chat)
    app.router.add_post("/v1/completions", node.completions)
    app.router.add_post("/v1/messages", node.messages)
    app.router.add_post("/v1/responses", node.responses)
    app.router.add_get("/v1/models", node.models)
    app.router.add_get("/health", node.health)
    app.router.add_get("/healthz", node.health)
    app.router.add_get("/metrics", node.metrics)
    KvRoutes(runner, kvpub).register(app)
    return app
