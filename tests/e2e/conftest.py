"""The whole stack (``shared.cli.stack.Stack``) on the test NATS and Redis, for end-to-end tests.

Two stacks, each started once for the test session (a stack starts in a few seconds):

* ``e2e`` — two simnodes with a small KV capacity (so capacity binds), a time scale of 20 (turns
  are fast), a long hold timeout (no request of a healthy run times out) and a short JetStream
  ack wait (a killed service's unacknowledged events come back within seconds);
* ``tight`` — one simnode and a 2 s hold timeout, for the 503 path.

Each stack gets a fresh bus namespace and Redis domain; on teardown every child (the stack's and
any service a test restarted through :meth:`E2E.respawn`) is stopped, then the namespace's
streams and the domain's keys are deleted, whatever the tests did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
import pytest
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from shared.cli.stack import Stack, StackConfig
from shared.contracts import ToolEnd, ToolStart
from shared.core.session import Session
from shared.infra import Bus
from shared.infra.embedded import stop_processes
from shared.infra.keys import Keys
from shared.infra.store import Store
from shared.infra.store_codec import as_str, decode_node, decode_session
from shared.infra.store_types import NodeRecord
from tests.logs import telling_lines

READY_TIMEOUT_S = 30.0
E2E_KV_TOKENS = 10_240
TIGHT_KV_TOKENS = 4_096
TIGHT_HOLD_TIMEOUT_S = 2.0
TIGHT_RETRY_AFTER_S = 3


WORDS = ("the", "file", "test", "module", "error", "value", "return", "import", "class", "data")


def text(rng: random.Random, words: int) -> str:
    """``words`` random words (the simnode counts one token per word)."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class E2E:
    """A running stack plus what the tests need to reach it and to restart its services."""

    stack: Stack
    namespace: str
    domain: str
    env: dict[str, str]
    extra: dict[str, tuple[subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        return self.stack.gateway_url

    @property
    def log_dir(self) -> Path:
        return self.stack.log_dir

    def proc(self, name: str) -> subprocess.Popen[bytes]:
        """The live process of child ``name``: a respawned one, else the stack's (read-only
        look at ``Stack._procs``: the stack offers no accessor)."""
        if name in self.extra:
            return self.extra[name][0]
        for child, proc, _ in self.stack._procs:
            if child == name:
                return proc
        raise KeyError(f"no child named {name!r} in the stack")

    def kill(self, name: str) -> None:
        """SIGKILL service ``name`` (a crash: no drain, nothing acknowledged) and reap it."""
        proc = self.proc(name)
        assert proc.poll() is None, f"{name} had already exited with {proc.returncode}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def respawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start child ``name`` (a service or a simnode) again, with the command and the
        environment it was started with; stopped on teardown."""
        assert self.proc(name).poll() is not None, f"{name} is still running"
        cmd, env = self.stack.launch_of(name)
        log = open(self.log_dir / f"{name}.restarted.log", "ab")  # noqa: SIM115 - closed in close()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.extra[name] = (proc, log)
        return proc

    def exited(self) -> list[tuple[str, int | None]]:
        """Children that are not running now (the live process of each name)."""
        names = [n for n, _, _ in self.stack._procs]
        return [(n, self.proc(n).returncode) for n in names if self.proc(n).poll() is not None]

    def close(self) -> None:
        stop_processes([proc for proc, _ in self.extra.values()])
        for _, log in self.extra.values():
            log.close()
        self.extra.clear()
        self.stack.stop()

    @contextlib.asynccontextmanager
    async def clients(self, role: str = "admin") -> AsyncIterator[Clients]:
        """An ``openai.AsyncOpenAI`` on the gateway (no retries), a bus in the stack's
        namespace and a Redis client, as ``role`` where the stack checks access; all closed
        afterwards."""
        import openai

        api = openai.AsyncOpenAI(
            base_url=f"{self.gateway}/v1", api_key="e2e", max_retries=0, timeout=120.0
        )
        bus = await Bus.connect(self.stack.nats_for(role), name="e2e", namespace=self.namespace)
        redis = aioredis.Redis.from_url(self.stack.redis_for(role))
        try:
            models = await api.models.list()
            yield Clients(api, bus, redis, models.data[0].id, self.domain)
        finally:
            await api.close()
            await bus.drain()
            await redis.aclose()

    def status_cli(self) -> dict[str, object]:
        """``tao status --json`` run as a subprocess against this stack's Redis and domain."""
        cmd = [sys.executable, "-m", "shared.cli.main", "status", "--json"]
        out = subprocess.run(
            [*cmd, "--redis", self.stack.redis_url, "--domain", self.domain],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert out.returncode == 0, f"tao status failed: {out.stderr.decode()}"
        doc = orjson.loads(out.stdout)
        assert isinstance(doc, dict)
        return doc


StartStack = Callable[..., E2E]


@dataclass
class Clients:
    """What a test talks to the stack with (see :meth:`E2E.clients`)."""

    api: Any
    bus: Bus
    redis: aioredis.Redis
    model: str
    domain: str

    async def snapshot(self) -> Snapshot:
        return await snapshot(self.redis, self.domain)

    async def await_session(
        self, sid: str, cond: Callable[[Session | None], bool], what: str, timeout_s: float = 20.0
    ) -> Session | None:
        return await await_session(self.redis, self.domain, sid, cond, what, timeout_s)

    async def agent(self, sid: str, **kw: Any) -> list[Turn]:
        return await agent_session(self.api, self.bus, sid, model=self.model, **kw)

    def store(self) -> Store:
        return Store(self.redis, self.domain)


# -- the store, read atomically ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every node and session record of a domain as of one instant."""

    nodes: dict[str, NodeRecord]
    sessions: dict[str, Session]

    def admitted_weight(self, node: str) -> int:
        return sum(s.weight for s in self.sessions.values() if s.node == node)


async def snapshot(client: aioredis.Redis, domain: str) -> Snapshot:
    """Read all node and session records in one MULTI/EXEC (WATCHing the id sets so no record
    created meanwhile is missed). ``Store.status()`` reads nodes and sessions in separate round
    trips, so a reservation applied between them would look like a mismatch."""
    keys = Keys(domain)
    transaction: Any = client.pipeline(transaction=True)  # redis-py: partly annotated
    async with transaction as pipe:
        while True:
            try:
                await pipe.watch(keys.sessions, keys.nodes)
                sids = sorted(as_str(x) for x in await pipe.smembers(keys.sessions))
                nids = sorted(as_str(x) for x in await pipe.smembers(keys.nodes))
                pipe.multi()
                for sid in sids:
                    pipe.hgetall(keys.session(sid))
                for nid in nids:
                    pipe.hgetall(keys.node(nid))
                raws = await pipe.execute()
                break
            except WatchError:
                continue
    sessions = {sid: decode_session(raw) for sid, raw in zip(sids, raws, strict=False)}
    nodes = {n: decode_node(n, raw) for n, raw in zip(nids, raws[len(sids) :], strict=True)}
    return Snapshot(
        nodes={n: r for n, r in nodes.items() if r is not None},
        sessions={k: v for k, v in sessions.items() if v is not None},
    )


async def await_session(
    client: aioredis.Redis,
    domain: str,
    sid: str,
    cond: Callable[[Session | None], bool],
    what: str,
    timeout_s: float = 20.0,
) -> Session | None:
    """Poll the store (an external system) until ``cond`` holds for session ``sid``."""
    store = Store(client, domain)
    deadline = time.monotonic() + timeout_s
    while True:
        rec = await store.get_session(sid)
        if cond(rec):
            return rec
        if time.monotonic() > deadline:
            raise AssertionError(f"session {sid!r} not {what} within {timeout_s:g} s: {rec}")
        await asyncio.sleep(0.05)


# -- an agent session through the gateway -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """What the client saw of one model call."""

    prompt_tokens: int
    cached_tokens: int
    finish_reason: str | None
    tool_call_id: str | None
    streamed: bool


async def agent_session(
    client: Any,
    bus: Bus,
    sid: str,
    *,
    model: str,
    turns: int,
    stream: bool,
    tool: str,
    seed: int,
    after_turn: Callable[[int], None] | None = None,
    before_end: Callable[[], Awaitable[None]] | None = None,
    retries: int = 0,
    failures: list[tuple[float, float, str]] | None = None,
) -> list[Turn]:
    """A coding-agent session with the real ``openai`` client: every turn but the last asks
    (``tao_script``) for a tool call, which is reported on NATS as a hook would (ToolStart,
    the tool "runs" for 50-200 ms, ToolEnd), and its output extends the next prompt. The
    session is ended with ``DELETE /v1/sessions/{id}`` (after ``before_end``, if given).

    ``retries``: a turn that fails (an error status, a connection error, a stream that ends
    in an error event) is sent again, as a harness does, after 0.5 s, up to that many times;
    each failure is appended to ``failures`` as (sent at, failed at, error) in
    ``time.monotonic()`` seconds."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are agent {sid}. " + text(rng, 1200)},
        {"role": "user", "content": "Fix the failing test. " + text(rng, 200)},
    ]
    seen: list[Turn] = []
    for turn in range(turns):
        last = turn == turns - 1
        script: dict[str, Any] = {"output_tokens": rng.randint(20, 60), "tool_call": None}
        if not last:
            script["tool_call"] = {"name": tool, "arguments": {"command": f"pytest -k t{turn}"}}
        common: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "extra_headers": {"X-Session-ID": sid},
            "extra_body": {"tao_script": script},
        }
        for attempt in range(retries + 1):
            sent = time.monotonic()
            try:
                seen.append(await (_streamed if stream else _unary)(client, common))
                break
            except Exception as exc:  # openai's errors: status, connection, stream error event
                if attempt == retries:
                    raise
                if failures is not None:
                    failures.append((sent, time.monotonic(), f"{type(exc).__name__}: {exc}"))
                await asyncio.sleep(0.5)  # the harness's back-off, not synchronisation
        if after_turn is not None:
            after_turn(turn)
        call_id = seen[-1].tool_call_id
        assistant: dict[str, Any] = {"role": "assistant", "content": None}
        if call_id is None:
            messages.append({"role": "assistant", "content": "done"})
            break
        assistant["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": tool,
                    "arguments": orjson.dumps(script["tool_call"]["arguments"]).decode(),
                },
            }
        ]
        messages.append(assistant)
        began = time.time()
        await _publish(
            bus,
            ToolStart(session_id=sid, call_id=call_id, tool=tool, started_at=began, harness="e2e"),
            retries,
        )
        duration = rng.uniform(0.05, 0.2)
        await asyncio.sleep(duration)  # the tool's run time (workload), not synchronisation
        end = ToolEnd(
            session_id=sid, call_id=call_id, ended_at=time.time(), tool=tool, duration_s=duration
        )
        await _publish(bus, end, retries)
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": text(rng, rng.randint(300, 600))}
        )
    if before_end is not None:
        await before_end()
    resp = await client.delete(f"/sessions/{sid}", cast_to=object)
    assert isinstance(resp, dict) and resp.get("deleted") is True, resp
    return seen


async def _publish(bus: Bus, msg: Any, retries: int) -> None:
    """Publish a hook's event; with ``retries``, again after 0.5 s while the bus is down (as
    ``tao hook`` spools and sends it later)."""
    for attempt in range(retries + 1):
        try:
            await bus.publish_msg(msg)
            return
        except Exception:
            if attempt == retries:
                raise
            await asyncio.sleep(0.5)  # the hook's back-off, not synchronisation


async def _unary(client: Any, common: dict[str, Any]) -> Turn:
    resp = await client.chat.completions.create(**common)
    choice = resp.choices[0]
    calls = choice.message.tool_calls or []
    details = resp.usage.prompt_tokens_details
    return Turn(
        prompt_tokens=resp.usage.prompt_tokens,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        finish_reason=choice.finish_reason,
        tool_call_id=calls[0].id if calls else None,
        streamed=False,
    )


async def _streamed(client: Any, common: dict[str, Any]) -> Turn:
    stream = await client.chat.completions.create(
        **common, stream=True, stream_options={"include_usage": True}
    )
    usage: Any = None
    finish: str | None = None
    call_id: str | None = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or ():
                call_id = tc.id or call_id
    assert usage is not None, "stream_options.include_usage: no usage chunk in the stream"
    details = usage.prompt_tokens_details
    return Turn(
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        finish_reason=finish,
        tool_call_id=call_id,
        streamed=True,
    )


async def _ready(stack: Stack, domain: str, nodes: int) -> None:
    """Wait until telemetry has reported every node (capacity and models) to the store and the
    gateway lists a model: before that no session can be admitted."""
    client = aioredis.Redis.from_url(stack.redis_url)
    store = Store(client, domain)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            recs = await store.nodes()
            known = [r for r in recs if r.healthy and r.capacity_tokens > 0]
            with urllib.request.urlopen(f"{stack.gateway_url}/v1/models", timeout=2) as resp:
                models = orjson.loads(resp.read())["data"]
            if len(known) == nodes and models:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"stack not ready in {READY_TIMEOUT_S:g} s: nodes {recs}, models {models} "
                    f"(logs: {stack.log_dir})"
                )
            await asyncio.sleep(0.2)  # polling an external system with a deadline
    finally:
        await client.aclose()


async def _cleanup(nats_url: str, redis_url: str, namespace: str, domain: str) -> None:
    bus = await Bus.connect(nats_url, name="e2e-cleanup", namespace=namespace)
    try:
        await bus.delete_streams()
    finally:
        await bus.drain()
    client = aioredis.Redis.from_url(redis_url)
    try:
        await Store(client, domain).clear()
    finally:
        await client.aclose()


def start_stack(
    nats_url: str,
    redis_url: str,
    started: list[E2E],
    *,
    sim_nodes: int,
    kv_tokens: int,
    extra_env: Mapping[str, str],
    time_scale: float = 20.0,
) -> E2E:
    """A stack on ``nats_url`` and ``redis_url`` in a fresh namespace and domain, appended to
    ``started`` before it starts (so a failed start is still stopped), ready to serve."""
    tag = uuid.uuid4().hex[:12]
    base = {**os.environ, "TAO_NATS_URL": nats_url, "TAO_REDIS_URL": redis_url}
    config = StackConfig(
        sim_nodes=sim_nodes,
        time_scale=time_scale,
        kv_tokens=kv_tokens,
        namespace="t" + tag,
        domain="d" + tag,
        extra_env={"TAO_LOG_LEVEL": "info", **extra_env},
        env=base,
    )
    stack = Stack(config)
    e2e = E2E(stack, config.namespace, "d" + tag, {})
    started.append(e2e)
    stack.start()
    e2e.env = dict(stack.env)
    asyncio.run(_ready(stack, e2e.domain, sim_nodes))
    return e2e


@pytest.fixture(scope="session")
def e2e_factory(nats_url: str, redis_url: str) -> Iterator[StartStack]:
    """Starts stacks on demand; stops every one and cleans its streams/keys at the end."""
    started: list[E2E] = []

    def start(
        *, sim_nodes: int, kv_tokens: int, extra_env: Mapping[str, str], time_scale: float = 20.0
    ) -> E2E:
        return start_stack(
            nats_url,
            redis_url,
            started,
            sim_nodes=sim_nodes,
            kv_tokens=kv_tokens,
            extra_env=extra_env,
            time_scale=time_scale,
        )

    try:
        yield start
    finally:
        errors: list[BaseException] = []
        for e2e in started:
            try:
                e2e.close()
            except BaseException as exc:  # keep cleaning the others
                errors.append(exc)
            try:
                asyncio.run(_cleanup(nats_url, redis_url, e2e.namespace, e2e.domain))
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture(scope="session")
def e2e(e2e_factory: StartStack) -> E2E:
    """The main stack: 2 simnodes of 10,240 KV tokens, time scale 20, hold timeout 60 s."""
    return e2e_factory(
        sim_nodes=2,
        kv_tokens=E2E_KV_TOKENS,
        extra_env={"TAO_HOLD_TIMEOUT_S": "60", "TAO_ACK_WAIT_S": "3", "TAO_TICK_S": "0.25"},
    )


@pytest.fixture(scope="session")
def tight(e2e_factory: StartStack) -> E2E:
    """A one-node stack whose gateway gives up on a held request after 2 s."""
    return e2e_factory(
        sim_nodes=1,
        kv_tokens=TIGHT_KV_TOKENS,
        extra_env={
            "TAO_HOLD_TIMEOUT_S": str(TIGHT_HOLD_TIMEOUT_S),
            "TAO_RETRY_AFTER_S": str(TIGHT_RETRY_AFTER_S),
            "TAO_TICK_S": "0.25",
        },
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed end-to-end test's report carries its stack's warnings and errors, so a CI log
    says why a stream broke off or a session stalled (the log folders stay on the machine)."""
    report = yield
    if report.failed and call.when == "call":
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, E2E):
                found = telling_lines(value.log_dir)
                report.sections.append((f"stack logs {value.log_dir}", found or "(nothing)"))
    return report
