"""compose.yaml, run for real: healthy with ``up --wait`` and then ready (the first request is
answered without the planner's warm-up), one build, sessions through the gateway with the
OpenAI client, each container holding only its own secrets, the demo profile, clean logs (no
violation, error, traceback or restart), and a killed service coming back (issue 31). The tests
run in file order on one stack."""

from __future__ import annotations

import json
import time
import urllib.request

import openai
import pytest

from tests.compose.stack import FIRST_REQUEST_S, ComposeStack, run, wait_for

pytestmark = pytest.mark.compose

CONTROL_PLANE = ("telemetry", "tools", "valuation", "planner", "gateway")
TAO = (*CONTROL_PLANE, "simnode0", "simnode1")

SECRETS = {
    "telemetry": ("nats-url", "redis-url"),
    "tools": ("nats-url", "redis-url"),
    "valuation": ("nats-url", "redis-url"),
    "planner": ("nats-url", "redis-url", "placement-key.toml"),
    "gateway": ("nats-url", "redis-url", "placement-keys.toml", "gateway-key"),
    "nats": ("nats.conf",),
    "redis": ("users.acl",),
}
"""What each service finds in its own /keys (docker/keys.sh)."""

MASTER = ("/keys/all/access/access.toml", "/keys/all/placement-key.toml", "/keys/all/gateway-key")
"""The provisioner's copies: in no running container."""


def _client(stack: ComposeStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.gateway_url}/v1", api_key=stack.gateway_key(), timeout=60, max_retries=0
    )


def _chat(client: openai.OpenAI, session: str, text: str) -> str:
    reply = client.chat.completions.create(
        model="tao-sim",
        messages=[{"role": "user", "content": text}],
        max_tokens=16,
        user=session,
    )
    content = reply.choices[0].message.content
    assert content, reply
    return content


class TestReady:
    """Ready means ready: the first thing after ``up --wait`` (this class runs first) is a
    request, answered without the planner's warm-up delay."""

    def test_a_request_right_after_up_is_answered_at_once(self, stack: ComposeStack) -> None:
        client = _client(stack)  # reads the key first (docker exec), outside the timing
        start = time.monotonic()
        assert _chat(client, "ct-first", "hello")
        took = time.monotonic() - start
        assert took < FIRST_REQUEST_S, f"first request took {took:.1f} s (planner not warm?)"

    def test_readyz_answers_ready(self, stack: ComposeStack) -> None:
        with urllib.request.urlopen(f"{stack.gateway_url}/readyz", timeout=5) as reply:
            assert json.loads(reply.read())["status"] == "ready"


class TestOneImage:
    """Compose builds tao-scheduler:local once and every TAO container runs it."""

    def test_only_the_keys_service_builds(self, stack: ComposeStack) -> None:
        config = stack.compose("config", "--format", "json", profiles=["*"]).stdout
        services = json.loads(config)["services"]
        builders = sorted(n for n, s in services.items() if "build" in s)
        assert builders == ["keys"]
        for name, service in services.items():
            if service.get("image") == "tao-scheduler:local" and name != "keys":
                assert service["pull_policy"] == "never", name

    def test_every_tao_container_runs_the_same_image(self, stack: ComposeStack) -> None:
        containers = stack.containers()
        images = {stack.inspect(containers[name], "{{.Image}}") for name in (*TAO, "keys")}
        assert len(images) == 1, images


class TestSessions:
    """Requests through the published gateway are answered, streamed or not."""

    def test_a_session_of_several_turns(self, stack: ComposeStack) -> None:
        client = _client(stack)
        for turn in range(3):
            assert _chat(client, "ct-turns", f"turn {turn}")

    def test_streaming(self, stack: ComposeStack) -> None:
        stream = _client(stack).chat.completions.create(
            model="tao-sim",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=16,
            stream=True,
            user="ct-stream",
        )
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert len(pieces) > 1 and "".join(pieces)

    def test_models_are_listed(self, stack: ComposeStack) -> None:
        assert [m.id for m in _client(stack).models.list()] == ["tao-sim"]

    def test_a_request_without_the_key_is_refused(self, stack: ComposeStack) -> None:
        """Beyond loopback the gateway wants its key (issue 31, item 5)."""
        keyless = openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="wrong", timeout=30)
        with pytest.raises(openai.AuthenticationError):
            _chat(keyless, "ct-nokey", "let me in")


class TestSecretsPerService:
    """Each container reads its own credentials and cannot read any other's."""

    @pytest.mark.parametrize("service", sorted(SECRETS))
    def test_own_secrets_are_readable(self, stack: ComposeStack, service: str) -> None:
        for name in SECRETS[service]:
            done = stack.exec(service, "cat", f"/keys/{name}")
            assert done.returncode == 0 and done.stdout.strip(), (service, name, done.stderr)

    @pytest.mark.parametrize("service", sorted(SECRETS))
    def test_no_other_secret_is_readable(self, stack: ComposeStack, service: str) -> None:
        """Another service's file names at /keys (absent here, or not this uid's) and the
        provisioner's master copies: each ``cat`` fails with no such file or permission denied."""
        own = set(SECRETS[service])
        others = {n for s, names in SECRETS.items() if s != service for n in names} - own
        paths = [f"/keys/{n}" for n in sorted(others)] + list(MASTER)
        for path in paths:
            done = stack.exec(service, "cat", path)
            assert done.returncode != 0, f"{service} can read {path}"
            assert "No such file" in done.stderr or "Permission denied" in done.stderr, (
                service,
                path,
                done.stderr,
            )

    @pytest.mark.parametrize("service", CONTROL_PLANE)
    def test_each_service_runs_as_its_own_uid(self, stack: ComposeStack, service: str) -> None:
        uids = {s: stack.exec(s, "id", "-u", check=True).stdout.strip() for s in CONTROL_PLANE}
        assert uids[service] != "0"
        assert list(uids.values()).count(uids[service]) == 1, uids

    def test_the_private_key_is_not_readable_by_another_uid(self, stack: ComposeStack) -> None:
        """Even inside the planner's container, a uid other than the planner's cannot read it."""
        done = stack.exec("planner", "cat", "/keys/placement-key.toml", user="10001:10001")
        assert done.returncode != 0 and "Permission denied" in done.stderr, done


class TestDemoProfile:
    """`--profile demo`: the demo client drives the stack's gateway to the end."""

    def test_demo_runs_to_the_end(self, stack: ComposeStack) -> None:
        done = stack.compose(
            "run", "--rm", "--no-deps", "demo",
            "demo", "--against", "http://gateway:8000", "--sessions", "6", "--turns", "3",
            profiles=["demo"], timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


class TestObservability:
    """`--profile observability` as far as it goes without a registry: the configuration
    resolves, and the gateway's /metrics (what Prometheus scrapes) answers."""

    def test_the_profile_resolves(self, stack: ComposeStack) -> None:
        services = stack.compose("config", "--services", profiles=["observability"]).stdout
        assert {"prometheus", "grafana"} <= set(services.split())

    def test_the_scrape_target_answers(self, stack: ComposeStack) -> None:
        with urllib.request.urlopen(f"{stack.gateway_url}/metrics", timeout=10) as reply:
            body = reply.read().decode()
        assert "tao_" in body

    def test_prometheus_scrapes_the_gateway(self, stack: ComposeStack) -> None:
        images = ("prom/prometheus:v2.53.0", "grafana/grafana:11.1.0")
        for image in images:
            have = run(["docker", "image", "inspect", image], check=False).returncode == 0
            if not have and run(["docker", "pull", image], check=False, timeout=120).returncode:
                pytest.skip(f"{image}: not here and no registry answers (README: observability)")
        stack.compose("--profile", "observability", "up", "--detach", "--wait", timeout=300)
        query = "http://127.0.0.1:9090/api/v1/query?query=up"

        def gateway_up() -> bool:
            try:
                with urllib.request.urlopen(query, timeout=5) as reply:
                    return '"1"]' in reply.read().decode()
            except OSError:
                return False

        wait_for("prometheus sees the gateway up", gateway_up, timeout=120, every=2)


class TestLogs:
    """After all of the above: no permission violations, no errors, no restarts."""

    def test_no_violation_error_traceback_or_restart(self, stack: ComposeStack) -> None:
        """Every container's log (stack.trouble: permission violations, TAO error lines,
        nats-server [ERR] lines, Python tracebacks) and restart count."""
        assert not stack.trouble()


class TestRecovery:
    """A crashed service comes back by its restart policy, and the stack serves again."""

    @pytest.mark.parametrize("service", ["planner", "tools"])
    def test_a_killed_service_comes_back(self, stack: ComposeStack, service: str) -> None:
        stack.crash_and_restart(service)
        client = _client(stack)

        def answered() -> bool:
            try:
                return bool(_chat(client, f"ct-after-{service}", "are you back"))
            except openai.APIError:
                return False

        wait_for("a request answered after the restart", answered, timeout=90)
