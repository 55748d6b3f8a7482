"""deploy/compose.domains.yaml, run for real: two domains on a 3-server NATS cluster and a Redis
Cluster, one gateway. In file order on one stack: the first request after ``up --wait`` is
answered at once (ready means ready), sessions and streaming through the gateway, the demo
profile driving it to the end, each container holding only its role's secrets (NATS and Redis
users per role, as in compose.yaml), one leader per domain, clean logs (no violation, error,
traceback or restart), a killed tools and valuation container coming back with requests still
answered, and a planner failover: the leader of a domain is killed, its lease moves to the
standby within the lease's bound, and requests are still answered.

The domains part is a separate job (README, "The compose tier"): `.ci/run` runs test_compose.py
alone; run this with ``pytest -m compose tests/compose/test_domains.py``."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import openai
import pytest

from tests.compose.stack import FIRST_REQUEST_S, ComposeStack, wait_for

pytestmark = pytest.mark.compose

ROLES = {
    "telemetry": ("10011", "nats-url", "redis-url"),
    "tools": ("10012", "nats-url", "redis-url"),
    "valuation": ("10013", "nats-url", "redis-url"),
    "planner": ("10014", "nats-url", "placement-key.toml", "redis-url"),
    "gateway": ("10015", "gateway-key", "nats-url", "placement-keys.toml", "redis-url"),
}
"""Each role's uid and what its containers find in /keys (docker/keys.sh)."""
MASTER = (
    "/keys/all/access/access.toml",
    "/keys/all/placement-key.toml",
    "/keys/all/route-password",
)
"""The provisioner's copies: in no running container."""

PLANNERS = {"pool-a": ("planner-a1", "planner-a2"), "pool-b": ("planner-b1", "planner-b2")}


def _client(stack: ComposeStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.gateway_url}/v1", api_key=stack.gateway_key(), timeout=60, max_retries=0
    )


def _chat(client: openai.OpenAI, session: str) -> str:
    reply = client.chat.completions.create(
        model="tao-sim", messages=[{"role": "user", "content": "hi"}], max_tokens=8, user=session
    )
    return reply.choices[0].message.content or ""


def _leases(stack: ComposeStack, service: str) -> list[dict[str, object]]:
    """The service's lease_acquired events (its planner lease), oldest first."""
    events = []
    for line in stack.logs(service).splitlines():
        if '"lease_acquired"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if "planner" in str(event.get("key", "")):
            events.append(event)
    return events


def _stamp(event: dict[str, object]) -> datetime:
    """An event's ``timestamp`` (structlog's ISO UTC, ``...Z``) as an aware datetime."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00"))


def _lease_ttl_s(stack: ComposeStack, service: str) -> float:
    """The service's TAO_LEASE_TTL_S as compose resolves it (the file's default is 2 s)."""
    config = json.loads(stack.compose("config", "--format", "json").stdout)
    return float(config["services"][service]["environment"]["TAO_LEASE_TTL_S"])


def _answered(client: openai.OpenAI, prefix: str, n: int = 4) -> bool:
    try:
        return all(_chat(client, f"{prefix}-{i}") for i in range(n))
    except openai.APIError:
        return False


def _leader(stack: ComposeStack, domain: str) -> str | None:
    """The planner of ``domain`` that took the lease last (None before any did)."""
    latest: tuple[str, str] | None = None
    for name in PLANNERS[domain]:
        for event in _leases(stack, name):
            stamp = str(event.get("timestamp", ""))
            if latest is None or stamp > latest[0]:
                latest = (stamp, name)
    return latest[1] if latest else None


class TestDomains:
    """The multi-domain example: ready, serving, clean, and surviving a crashed service and its
    leader planner."""

    def test_a_request_right_after_up_is_answered_at_once(self, domains: ComposeStack) -> None:
        """The first thing after ``up --wait``: four planners warm up here (15-17 s cold in
        issue 31), and the gateway is healthy only once each domain's planner is ready."""
        client = _client(domains)
        start = time.monotonic()
        assert _chat(client, "cd-first")
        took = time.monotonic() - start
        assert took < FIRST_REQUEST_S, f"first request took {took:.1f} s (planner not warm?)"

    def test_sessions_are_answered(self, domains: ComposeStack) -> None:
        client = _client(domains)
        for i in range(6):  # new sessions go to the domain least loaded after them
            assert _chat(client, f"cd-{i}")

    def test_streaming(self, domains: ComposeStack) -> None:
        stream = _client(domains).chat.completions.create(
            model="tao-sim",
            messages=[{"role": "user", "content": "stream"}],
            max_tokens=8,
            stream=True,
            user="cd-stream",
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def test_demo_runs_to_the_end(self, domains: ComposeStack) -> None:
        """`--profile demo`: every session of `tao demo --against` the gateway finishes."""
        done = domains.compose(
            "run", "--rm", "--no-deps", "demo",
            "demo", "--against", "http://gateway:8000", "--sessions", "6", "--turns", "3",
            profiles=["demo"], timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    def test_each_container_holds_its_roles_secrets_alone(self, domains: ComposeStack) -> None:
        """Every control-plane container runs as its role's uid and finds its role's files in
        /keys, no other, and none of the provisioner's copies."""
        for service in domains.containers(all_=False):
            role = service.split("-")[0]
            if role not in ROLES:
                continue
            uid, *files = ROLES[role]
            done = domains.exec(service, "sh", "-c", "id -u; ls /keys", check=True)
            assert done.stdout.split() == [uid, *files], (service, done.stdout)
            for path in MASTER:
                assert domains.exec(service, "cat", path).returncode != 0, (service, path)

    def test_each_domain_has_one_leader(self, domains: ComposeStack) -> None:
        for domain in PLANNERS:
            wait_for(f"a {domain} planner leads", lambda d=domain: _leader(domains, d) is not None,
                     timeout=60)  # fmt: skip

    def test_no_violation_error_traceback_or_restart(self, domains: ComposeStack) -> None:
        """Every container's log and restart count (ComposeStack.trouble), before any kill."""
        assert not domains.trouble()

    @pytest.mark.parametrize("service", ["tools-a", "valuation-b"])
    def test_a_killed_service_comes_back(self, domains: ComposeStack, service: str) -> None:
        """SIGKILL inside the container (a crash): its restart policy brings it back, the new
        process starts (a second ``service_started``), and sessions are answered."""
        before = domains.crash_and_restart(service)
        wait_for(
            f"{service} started again",
            lambda: domains.logs(service).count('"service_started"') >= before + 2,
            timeout=60,
        )
        client = _client(domains)
        wait_for("requests answered after the restart",
                 lambda: _answered(client, f"cd-after-{service}"), timeout=90)  # fmt: skip

    def test_planner_failover(self, domains: ComposeStack) -> None:
        """Kill pool-a's leader (``docker kill``: it stays down); the standby takes the lease
        within the lease's bound and requests are still answered.

        The bound (shared/infra/lease.py): the dead leader renewed at most ttl/3 before it died,
        so its key lapses within ttl of the kill, and the standby tries every ttl/4: ttl +
        ttl/4. The margin of 2 s is for `docker compose kill` itself (the clock starts before
        it) and NATS's expiry timer on a loaded two-core machine; issue 31 measured 2.6 s with
        the file's ttl of 2 s (bound 4.5 s). The time is the standby's own lease_acquired
        timestamp, so polling the logs adds nothing to it."""
        leader = _leader(domains, "pool-a")
        assert leader is not None
        standby = next(p for p in PLANNERS["pool-a"] if p != leader)
        ttl = _lease_ttl_s(domains, standby)
        bound = ttl + ttl / 4 + 2.0
        taken = len(_leases(domains, standby))
        killed_at = datetime.now(UTC)
        domains.compose("kill", leader)
        wait_for(
            f"{standby} takes the lease", lambda: len(_leases(domains, standby)) > taken, timeout=60
        )
        moved_s = (_stamp(_leases(domains, standby)[taken]) - killed_at).total_seconds()
        print(f"pool-a lease moved from {leader} to {standby} in {moved_s:.1f} s (bound {bound:g})")
        assert moved_s < bound, f"the lease moved in {moved_s:.1f} s, over {bound:g} s"
        client = _client(domains)
        wait_for("requests answered after the failover",
                 lambda: _answered(client, "cd-failover"), timeout=90)  # fmt: skip
