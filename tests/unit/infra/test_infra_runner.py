"""The service runner: exit codes, signals, and shutdown order, with a fake main and fake bus."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from shared.infra import BusError, FakeBus, MessageBus, ServiceContext, Settings
from shared.infra.runner import (
    EXIT_CRASH,
    EXIT_OK,
    EXIT_USAGE,
    YOUNG_COLLECTION_EVERY,
    run_service,
    run_service_async,
)


class FakeRedis:
    """Stands in for redis.asyncio.Redis: records that it was closed."""

    def __init__(self) -> None:
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


class Harness:
    """Factories that hand out one FakeBus and one FakeRedis and keep them for inspection."""

    def __init__(self) -> None:
        self.bus = FakeBus()
        self.redis = FakeRedis()

    async def bus_factory(self, settings: Settings, name: str) -> MessageBus:
        return self.bus

    async def redis_factory(self, url: str) -> Any:
        return self.redis

    async def run(self, main: Any, **kwargs: Any) -> int:
        return await run_service_async(
            "svc",
            main,
            settings=kwargs.pop("settings", Settings()),
            needs_redis=True,
            bus_factory=self.bus_factory,
            redis_factory=self.redis_factory,
            **kwargs,
        )


class TestExitCodes:
    async def test_main_returning_exits_zero_and_closes_bus_and_redis(self) -> None:
        """A main that returns gives exit 0, and the bus is drained and Redis closed."""
        h = Harness()
        seen: list[ServiceContext] = []

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            seen.append(ctx)

        assert await h.run(main) == EXIT_OK
        assert seen[0].bus is h.bus and seen[0].redis is h.redis and seen[0].name == "svc"
        assert h.bus.closed and h.redis.closed

    async def test_main_raising_exits_one_and_still_closes(self) -> None:
        """A crash in main gives exit 1; the bus and Redis are still closed."""
        h = Harness()

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            raise RuntimeError("boom")

        assert await h.run(main) == EXIT_CRASH
        assert h.bus.closed and h.redis.closed

    async def test_bad_settings_exit_two_with_one_line(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A bad variable: exit 2, one stderr line naming it; main never runs."""
        ran: list[bool] = []

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            ran.append(True)

        code = await run_service_async("svc", main, env={"TAO_TICK_S": "abc"}, needs_bus=False)
        err = capsys.readouterr().err
        assert code == EXIT_USAGE and ran == []
        assert err == "svc: TAO_TICK_S: must be a number > 0, got 'abc'\n"

    async def test_missing_nats_url_exits_two(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A service that needs the bus, with TAO_NATS_URL unset, exits 2 naming the variable."""

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            raise AssertionError("must not run")

        assert await run_service_async("svc", main, env={}) == EXIT_USAGE
        assert capsys.readouterr().err.startswith("svc: TAO_NATS_URL: not set")

    async def test_bus_connection_failure_exits_one(self) -> None:
        """When the bus cannot be reached the service exits 1 without running main."""

        async def failing_bus(settings: Settings, name: str) -> MessageBus:
            raise BusError("cannot connect to NATS at nats://nowhere:1")

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            raise AssertionError("must not run")

        code = await run_service_async("svc", main, settings=Settings(), bus_factory=failing_bus)
        assert code == EXIT_CRASH


class TestSignals:
    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
    async def test_signal_cancels_main_and_exits_zero(self, signum: signal.Signals) -> None:
        """SIGTERM or SIGINT cancels a main that would run forever; exit 0, bus drained."""
        h = Harness()
        cancelled: list[bool] = []

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            import anyio

            os.kill(os.getpid(), signum)
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise

        assert await h.run(main) == EXIT_OK
        assert cancelled == [True]
        assert h.bus.closed and h.redis.closed


class TestRunServiceSync:
    def test_run_service_runs_its_own_event_loop(self) -> None:
        """run_service (the __main__ entry point) runs main in a fresh loop and returns its code."""
        from shared.infra import run_service

        ran: list[str] = []

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            ran.append(ctx.name)

        threshold = gc.get_threshold()
        try:
            assert run_service("svc", main, needs_bus=False, env={}, argv=[]) == EXIT_OK
        finally:  # it froze this process's heap and set its collector, as a service's
            gc.unfreeze()
            gc.set_threshold(*threshold)
        assert ran == ["svc"]

    def test_a_service_process_freezes_its_start_up_heap(self) -> None:
        """run_service moves what start-up left alive out of the collector's reach before
        main runs (gc.freeze), so full collections scan only the service's own objects, and
        collects the young generation less often. In a fresh interpreter: both would outlive
        an in-process test."""
        code = (
            "import gc\n"
            "from shared.infra.runner import run_service\n"
            "async def main(settings, ctx):\n"
            "    print(gc.get_threshold()[0], gc.get_freeze_count())\n"
            "raise SystemExit(run_service('svc', main, needs_bus=False, env={}, argv=[]))\n"
        )
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root,
            env=dict(os.environ, PYTHONPATH=root), check=True,
        )  # fmt: skip
        threshold, frozen = map(int, out.stdout.split()[-2:])
        assert frozen > 10_000 and threshold == YOUNG_COLLECTION_EVERY

    async def test_in_process_runs_freeze_nothing(self) -> None:
        """run_service_async (what tests and embedded runs call) leaves the heap as it is."""
        frozen: list[int] = []

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            frozen.append(gc.get_freeze_count())

        gc.unfreeze()
        assert await Harness().run(main) == EXIT_OK
        assert frozen == [0]


class TestServiceArguments:
    """A service takes no arguments: ``--help`` describes its configuration (it used to
    answer ``TAO_NATS_URL: not set``), anything else is one usage line."""

    def test_help_lists_the_settings(self, capsys: pytest.CaptureFixture[str]) -> None:
        async def main(settings: Settings, ctx: ServiceContext) -> None:
            raise AssertionError("--help must not start the service")

        for flag in ("--help", "-h"):
            assert run_service("gateway", main, env={}, argv=[flag]) == EXIT_OK
            out, err = capsys.readouterr()
            assert out.startswith("usage: tao service gateway") and err == ""
            for var in ("TAO_NATS_URL", "TAO_REDIS_URL", "TAO_POLICY", "TAO_GATEWAY_PORT"):
                assert f"| {var} " in out

    def test_other_arguments_are_one_usage_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        async def main(settings: Settings, ctx: ServiceContext) -> None:
            raise AssertionError("a usage error must not start the service")

        assert run_service("planner", main, env={}, argv=["--bogus"]) == EXIT_USAGE
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "takes no arguments" in err
        assert "'--bogus'" in err

    def test_through_tao_service(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`tao service tools --help` reaches the service's help, exit 0."""
        from shared.cli.main import main as cli

        assert cli(["service", "tools", "--help"]) == 0
        assert capsys.readouterr().out.startswith("usage: tao service tools")

    def test_bad_trace_exporter_is_one_usage_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        """OTEL_TRACES_EXPORTER naming no exporter stops the service with one line, exit 2."""

        async def main(settings: Settings, ctx: ServiceContext) -> None:
            raise AssertionError("must not start")

        env = {"OTEL_TRACES_EXPORTER": "zipkin"}
        assert run_service("tools", main, needs_bus=False, env=env, argv=[]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "tools: OTEL_TRACES_EXPORTER: must be otlp" in err
