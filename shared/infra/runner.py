"""One lifecycle for every service: settings → logging → bus/Redis → main → clean shutdown.

    # services/tools/__main__.py
    raise SystemExit(run_service("tools", app.main, needs_redis=True))

Exit codes: 0 when ``main`` returns or SIGINT/SIGTERM arrives; 1 when ``main`` (or a
connection at start-up) fails, logged with its traceback; 2 for bad settings, reported as one
line on stderr (``tools: TAO_TICK_S: must be a number > 0, got 'abc'``). On the way out: cancel
``main`` → ``bus.drain()`` (in-flight handlers finish, publishes flushed) → close Redis.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus
from structlog.typing import FilteringBoundLogger

from . import tracing
from .bus import Bus
from .busapi import MessageBus
from .errors import InfraError, SettingsError
from .logging import configure_logging, get_logger
from .settings import Settings

__all__ = [
    "EXIT_CRASH",
    "EXIT_OK",
    "EXIT_USAGE",
    "BusFactory",
    "Main",
    "RedisFactory",
    "ServiceContext",
    "run_service",
    "run_service_async",
    "service_usage",
]

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USAGE = 2


@dataclass(slots=True)
class ServiceContext:
    """What ``main`` gets besides the settings: its name, the bus, Redis and a logger."""

    name: str
    settings: Settings
    bus: MessageBus | None
    redis: Any  # redis.asyncio.Redis | None (the store helper wraps it)
    log: FilteringBoundLogger

    def require_bus(self) -> MessageBus:
        """The bus; RuntimeError if this service was started without one."""
        if self.bus is None:
            raise RuntimeError(f"{self.name} was started with needs_bus=False")
        return self.bus


Main = Callable[[Settings, ServiceContext], Awaitable[None]]
BusFactory = Callable[[Settings, str], Awaitable[MessageBus]]
RedisFactory = Callable[[str], Awaitable[Any]]


async def _connect_bus(settings: Settings, name: str) -> MessageBus:
    bus = await Bus.from_settings(settings, name=name)
    await bus.ensure_streams()
    return bus


async def _connect_redis(url: str) -> Any:
    from .redisconn import open_redis  # only services that need Redis pay for the import

    client = open_redis(url)
    await client.ping()
    return client


def service_usage(name: str) -> str:
    """``tao service NAME --help``: a service takes no arguments; the ``TAO_*`` environment
    variables configure it (the table of :mod:`shared.infra.settings`)."""
    from . import settings as settings_module

    table = [ln for ln in (settings_module.__doc__ or "").splitlines() if ln.startswith("|")]
    return (
        f"usage: tao service {name}   (or: python -m services.{name})\n\n"
        f"Runs the {name} service in the foreground until SIGINT/SIGTERM. It takes no\n"
        "arguments: TAO_* environment variables configure it (empty counts as unset):\n\n"
        + "\n".join(table)
        + "\n"
    )


YOUNG_COLLECTION_EVERY: Final = 10_000
"""A service process's first collector threshold (allocations less deallocations between
young collections; CPython's default is 700). Consuming a backlog after the freeze, the tools
service made 770 young collections and 75 older ones in 2.4 s, 131 ms in all (5 %), each
scanning the batch in flight; at 10,000 it made 3 (6 ms). Cyclic garbage then waits for at
most that many allocations (a few MB)."""


def run_service(
    name: str,
    main: Main,
    *,
    needs_bus: bool = True,
    needs_redis: bool = False,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """Run ``main`` as service ``name`` until it returns or a signal arrives; the exit code.
    ``argv`` (default ``sys.argv[1:]``): ``-h`` / ``--help`` prints :func:`service_usage`;
    anything else is a usage error (exit 2, one line)."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] in (["-h"], ["--help"]):
        print(service_usage(name), end="")
        return EXIT_OK
    if given:
        print(f"{name}: takes no arguments (TAO_* variables configure it; see --help), "
              f"got {given[0]!r}", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    return anyio.run(
        lambda: run_service_async(
            name, main, env=env, needs_bus=needs_bus, needs_redis=needs_redis, freeze_heap=True
        )
    )


async def run_service_async(
    name: str,
    main: Main,
    *,
    settings: Settings | None = None,
    env: Mapping[str, str] | None = None,
    needs_bus: bool = True,
    needs_redis: bool = False,
    bus_factory: BusFactory | None = None,
    redis_factory: RedisFactory | None = None,
    freeze_heap: bool = False,
) -> int:
    """:func:`run_service` inside a running event loop; factories replace the real clients.

    ``freeze_heap`` (a service process, not a test's): once the clients are connected, every
    object alive (the imported modules, numba's and the clients' state: about 100,000 in the
    tools service) moves to the collector's permanent generation (:func:`gc.freeze`). A full
    collection then scans only what the service made since. Without it, a full collection of
    the tools service took 30 ms, seven times in 2.3 s of consuming a backlog, about a tenth
    of the time (docs/benchmarks.md, tools service throughput). The youngest generation is
    then collected every :data:`YOUNG_COLLECTION_EVERY` allocations instead of 700."""
    try:
        settings = settings if settings is not None else Settings.from_env(env or os.environ)
        if needs_bus and settings.nats_url is None and bus_factory is None:
            raise SettingsError("TAO_NATS_URL", None, "not set (run `tao up`, or set it)")
        if needs_redis and settings.redis_url is None and redis_factory is None:
            raise SettingsError("TAO_REDIS_URL", None, "not set (run `tao up`, or set it)")
        try:
            exporter = tracing.configure_from_env(env or os.environ, settings.service_name or name)
        except ValueError as exc:
            var, _, why = str(exc).partition(": ")
            raise SettingsError(var, None, why) from None
    except SettingsError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings, service=name)
    log = get_logger("shared.infra.runner")
    bus: MessageBus | None = None
    redis: Any = None
    code = EXIT_OK
    try:
        if needs_bus:
            bus = await (bus_factory or _connect_bus)(settings, name)
        if needs_redis:
            redis = await (redis_factory or _connect_redis)(settings.redis_url or "")
        ctx = ServiceContext(name, settings, bus, redis, get_logger(name))
        if freeze_heap:
            gc.collect()  # what start-up left as garbage goes now, not into the frozen heap
            gc.freeze()
            gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])
        log.info("service_started", bus=bus is not None, redis=redis is not None, traces=exporter)
        code = await _run_until_signal(main, settings, ctx, log)
    except InfraError as exc:
        log.error("service_start_failed", error=str(exc))
        code = EXIT_CRASH
    except Exception:
        log.exception("service_crashed")
        code = EXIT_CRASH
    finally:
        with anyio.CancelScope(shield=True):
            await _close(bus, redis, log)
        tracing.shutdown()
    log.info("service_stopped", exit_code=code)
    return code


async def _run_until_signal(
    main: Main, settings: Settings, ctx: ServiceContext, log: FilteringBoundLogger
) -> int:
    """Run ``main`` and a signal watcher side by side; the first to finish ends both."""
    code = EXIT_OK
    async with anyio.create_task_group() as tg:

        async def watch_signals(*, task_status: TaskStatus[None]) -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    log.info("signal_received", signal=signal.Signals(signum).name)
                    tg.cancel_scope.cancel()
                    return

        async def run_main() -> None:
            nonlocal code
            try:
                await main(settings, ctx)
            except Exception:
                log.exception("service_crashed")
                code = EXIT_CRASH
            tg.cancel_scope.cancel()

        await tg.start(watch_signals)
        tg.start_soon(run_main)
    return code


async def _close(bus: MessageBus | None, redis: Any, log: FilteringBoundLogger) -> None:
    if bus is not None:
        try:
            await bus.drain()
        except Exception as exc:
            log.warning("bus_drain_failed", error=f"{type(exc).__name__}: {exc}")
    if redis is not None:
        try:
            await redis.aclose()
        except Exception as exc:
            log.warning("redis_close_failed", error=f"{type(exc).__name__}: {exc}")
