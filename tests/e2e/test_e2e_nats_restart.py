"""NATS killed (SIGKILL) mid-load and started again on the same port and store directory.

A stack of its own (its services, gateway and two simnodes) on a nats-server this test starts,
so the rest of the suite keeps its bus. Agents run sessions through the gateway with retries,
as harnesses do (a request the gateway cannot register while the bus is down is answered 503
at once; a hook event that cannot be published is sent again). Checked: every service and
simnode survives the outage (the clients reconnect; the durable consumers resume from the
store directory), every session completes every turn, every tool end reported is recorded
once, and the recovery time (restart → every session's next turn answered) is reported
(``TAO_FAULT_REPORT``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.infra.embedded import find_nats_server, free_port, nats_answers
from tests.e2e.conftest import E2E, E2E_KV_TOKENS, _cleanup, start_stack

DEADLINE_S = 30.0
RUN_DEADLINE_S = 120.0
OUTAGE_S = 2.0


class OwnNats:
    """A nats-server (JetStream, file store) that can be killed and started again."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="tao-nats-restart-")
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        store = Path(self.root) / "js"
        log = open(Path(self.root) / "nats.log", "ab")  # noqa: SIM115 - the child holds it
        cmd = [
            find_nats_server(),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-sd",
            str(store),
        ]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + DEADLINE_S
        while not nats_answers(self.url):
            assert self.proc.poll() is None, f"nats-server exited: {self.root}/nats.log"
            assert time.monotonic() < deadline, "nats-server did not answer"
            time.sleep(0.05)  # polling a child at start-up, not test synchronisation

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def own(redis_url: str) -> Iterator[tuple[OwnNats, E2E]]:
    nats = OwnNats()
    nats.start()
    started: list[E2E] = []
    try:
        e2e = start_stack(
            nats.url,
            redis_url,
            started,
            sim_nodes=2,
            kv_tokens=E2E_KV_TOKENS,
            extra_env={"TAO_HOLD_TIMEOUT_S": "60", "TAO_ACK_WAIT_S": "3", "TAO_TICK_S": "0.25"},
        )
        yield nats, e2e
    finally:
        for e in started:
            e.close()
            asyncio.run(_cleanup(nats.url, redis_url, e.namespace, e.domain))
        nats.stop()


async def test_nats_restart_mid_load(own: tuple[OwnNats, E2E]) -> None:
    nats, e2e = own
    tag = uuid.uuid4().hex[:8]
    tool = f"natsrestart-{tag}"
    sids = [f"nr-{tag}-{i}" for i in range(6)]
    turns = 5
    done_turns = {sid: 0 for sid in sids}
    failures: list[tuple[float, float, str]] = []

    def count(sid: str) -> Any:
        def after(turn: int) -> None:
            done_turns[sid] = turn + 1

        return after

    async with e2e.clients() as c:
        tasks = [
            asyncio.create_task(
                c.agent(sid, turns=turns, stream=i % 2 == 0, tool=tool, seed=700 + i,
                        after_turn=count(sid), retries=60, failures=failures)
            )
            for i, sid in enumerate(sids)
        ]  # fmt: skip
        async with asyncio.timeout(DEADLINE_S):
            while min(done_turns.values()) < 1:
                await asyncio.sleep(0.05)  # waiting on the agents' progress
        nats.kill()
        await asyncio.sleep(OUTAGE_S)  # the outage
        at_kill = dict(done_turns)
        nats.start()
        restarted = time.monotonic()
        async with asyncio.timeout(RUN_DEADLINE_S):
            while any(
                done_turns[s] <= at_kill[s] and done_turns[s] < turns for s in sids
            ):  # every session answered again after the restart
                await asyncio.sleep(0.05)
            recovery_s = time.monotonic() - restarted
            results = await asyncio.gather(*tasks)
        for sid, got in zip(sids, results, strict=True):
            assert [t.finish_reason for t in got] == ["tool_calls"] * (turns - 1) + ["stop"], sid
        recorded = (await c.store().history()).of(tool).count
    assert e2e.exited() == [], f"children exited after the NATS restart: {e2e.exited()}"
    assert recorded == len(sids) * (turns - 1), "a tool end was lost or recorded twice"
    report = os.environ.get("TAO_FAULT_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as fh:
            fh.write(f"nats-restart\t{recovery_s:.2f}\nnats-failures\t{len(failures)}\n")
