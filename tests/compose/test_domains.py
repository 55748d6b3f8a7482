"""deploy/compose.domains.yaml, run for real: two domains on a 3-server NATS cluster and a Redis
Cluster, sessions through the one gateway, clean logs, and a planner failover: the leader of a
domain is killed, its lease moves to the standby, and requests are still answered."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.compose.stack import ComposeStack, trouble, wait_for

pytestmark = pytest.mark.compose

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
    """The multi-domain example: up, serving, clean, and surviving its leader planner."""

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

    def test_each_domain_has_one_leader(self, domains: ComposeStack) -> None:
        for domain in PLANNERS:
            wait_for(f"a {domain} planner leads", lambda d=domain: _leader(domains, d) is not None,
                     timeout=60)  # fmt: skip

    def test_no_violation_error_or_restart(self, domains: ComposeStack) -> None:
        found = {s: trouble(domains.logs(s)) for s in domains.containers()}
        assert not {s: lines[:5] for s, lines in found.items() if lines}
        assert not {s: n for s, n in domains.restarts().items() if n}

    def test_planner_failover(self, domains: ComposeStack) -> None:
        """Kill pool-a's leader (``docker kill``: it stays down); the standby takes the lease
        within a few lease TTLs and requests are still answered."""
        leader = _leader(domains, "pool-a")
        assert leader is not None
        standby = next(p for p in PLANNERS["pool-a"] if p != leader)
        taken = len(_leases(domains, standby))
        domains.compose("kill", leader)
        start = time.monotonic()
        wait_for(
            f"{standby} takes the lease", lambda: len(_leases(domains, standby)) > taken, timeout=60
        )
        moved_s = time.monotonic() - start
        client = _client(domains)

        def answered() -> bool:
            try:
                return all(_chat(client, f"cd-failover-{i}") for i in range(4))
            except openai.APIError:
                return False

        wait_for("requests answered after the failover", answered, timeout=90)
        print(f"pool-a lease moved from {leader} to {standby} in {moved_s:.1f} s")
