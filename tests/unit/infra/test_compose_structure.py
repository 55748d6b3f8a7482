"""compose.yaml, docker/Dockerfile and .dockerignore, checked by structure (no Docker engine)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from services.simnode.__main__ import parse_config
from shared.cli.main import build_parser, main
from shared.infra.nodesfile import parse_nodes
from shared.infra.settings import NodeSpec, Settings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

IMAGE = "tao-scheduler:local"
CONTROL_PLANE = ("telemetry", "tools", "valuation", "planner", "gateway")
SIMNODES = ("simnode0", "simnode1")
TAO_SERVICES = CONTROL_PLANE + SIMNODES
KNOWN_SERVICE_PACKAGES = frozenset(
    {"telemetry", "tools", "valuation", "planner", "gateway", "simnode"}
)
REQUIRED_ENV = ("TAO_NATS_URL_FILE", "TAO_REDIS_URL_FILE", "TAO_NODES_FILE", "TAO_POLICY")
ACCESS_DIR = "/keys/all/access"
URL_FILES = ("/keys/nats-url", "/keys/redis-url")
KEYS_SCRIPT = ROOT / "docker" / "keys.sh"
NODES_TARGET = "/etc/tao/nodes.toml"
HEALTHY = {"condition": "service_healthy"}

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def _simnode_listeners(command: list[str]) -> dict[int, str]:
    """port → bind address of a simnode container's command, parsed by the simnode's own
    command line (so its defaults count): HTTP on --host:--port, ZMQ on its endpoints."""
    assert command[:2] == ["service", "simnode"], command
    _, host, port = parse_config(command[2:])
    out = {port: host}
    for flag in ("--kv-events", "--kv-replay"):
        bound = urlsplit(_option(command, flag).replace("*", "0.0.0.0"))
        assert bound.port is not None
        out[bound.port] = bound.hostname or ""
    return out


@cache
def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "compose.yaml is not a mapping"
    return data


def _service(name: str) -> dict[str, Any]:
    services = _compose()["services"]
    assert name in services, f"compose.yaml has no service {name!r}"
    service: dict[str, Any] = services[name]
    return service


def _environment(name: str) -> dict[str, str]:
    """The service's environment as a dict, `${VAR:-default}` resolved as with an empty shell."""
    env = _service(name).get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {
        key: _INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))
        for key, value in env.items()
    }


def _settings(name: str) -> Settings:
    """Settings.from_env of the service's environment, without the mounted nodes file (which
    exists only in the container; :func:`_nodes` reads the config it comes from)."""
    env = _environment(name)
    assert env.pop("TAO_NODES_FILE", NODES_TARGET) == NODES_TARGET
    for variable in ("TAO_NATS_URL_FILE", "TAO_REDIS_URL_FILE"):  # in the volume; see TestAccess
        env.pop(variable, None)
    return Settings.from_env(env)


def _nodes() -> tuple[NodeSpec, ...]:
    """The node inventory: the `nodes` config mounted at NODES_TARGET."""
    return parse_nodes(tomllib.loads(_compose()["configs"]["nodes"]["content"]))


def _keys_command(action: str) -> list[str]:
    """docker/keys.sh's `tao keys ACTION ...` line (continuations joined), without `tao`, as
    compose.yaml runs it: no TAO_KEYS_* variable is set (TestAccess), so each
    ``${TAO_KEYS_...:-default}`` is its default and ``"$@"`` is ``--namespace "$namespace"``."""
    text = KEYS_SCRIPT.read_text(encoding="utf-8").replace("\\\n", " ")
    text = re.sub(r'"\$\{TAO_KEYS_[A-Z_]+:-([^}]*)\}"', r"\1", text)
    text = text.replace('"$@"', '--namespace "$namespace"')
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"tao keys {action} "))
    words = shlex.split(line.replace('"$', "$").replace('" ', " "))
    return [w.strip('"').replace("$all/", "/keys/all/") for w in words[1:]]


def _option(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def _http_check_url(service: dict[str, Any]) -> str:
    test = service.get("healthcheck", {}).get("test")
    assert isinstance(test, list) and test[0] == "CMD", f"healthcheck test not exec form: {test}"
    found = re.search(r"https?://[^'\"\s]+", " ".join(test[1:]))
    assert found, f"no URL in healthcheck {test}"
    return found.group(0)


@cache
def _instructions() -> list[tuple[str, str]]:
    """Dockerfile instructions as (KEYWORD, arguments), continuation lines joined."""
    joined: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        joined.append(pending + stripped)
        pending = ""
    result = []
    for text in joined:
        keyword, _, args = text.partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM")
    return instructions[last_from:]


def _resolve_from(args: str) -> str:
    """The FROM image with `${ARG}` replaced by the ARG default declared before the first FROM."""
    defaults: dict[str, str] = {}
    for keyword, arg in _instructions():
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in arg:
            key, value = arg.split("=", 1)
            defaults[key] = value
    image = args.split()[0]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), image)


def _copy_sources() -> list[str]:
    sources = []
    for keyword, args in _instructions():
        if keyword != "COPY":
            continue
        words = shlex.split(args)
        if any(w.startswith("--from") for w in words):
            continue  # copied from another stage, not from the build context
        paths = [w for w in words if not w.startswith("--")]
        sources.extend(paths[:-1])
    return sources


def _declared(relative: Path, declared: dict[str, list[str]]) -> bool:
    """Whether a package-data pattern of an enclosing package matches the file."""
    for package, patterns in declared.items():
        parts = tuple(package.split("."))
        if relative.parts[: len(parts)] != parts:
            continue
        inside = "/".join(relative.parts[len(parts) :])
        if any(fnmatch.fnmatch(inside, pattern) for pattern in patterns):
            return True
    return False


class TestBrokers:
    """NATS and Redis are the stack's only third-party services and report their health."""

    def test_nats_runs_jetstream_on_a_named_volume(self) -> None:
        """NATS starts with JetStream, its store on /data, backed by a declared named volume."""
        nats = _service("nats")
        assert nats["image"] == "${TAO_NATS_IMAGE:-nats:2.10-alpine}"  # base-images.sh
        command = nats["command"]
        assert "-js" in command
        assert _option(command, "-sd") == "/data"
        assert _option(command, "-m") == "8222"
        volume, _, target = nats["volumes"][0].partition(":")
        assert target == "/data"
        assert volume in (_compose().get("volumes") or {})

    def test_nats_healthcheck_requires_jetstream(self) -> None:
        """The NATS health check fetches the monitoring /healthz with js-enabled-only."""
        test = _service("nats")["healthcheck"]["test"]
        assert test[:2] == ["CMD", "wget"]
        url = urlsplit(test[-1])
        assert (url.hostname, url.port, url.path) == ("localhost", 8222, "/healthz")
        assert url.query == "js-enabled-only=true"

    def test_redis_healthcheck_pings(self) -> None:
        """Redis is checked with redis-cli ping."""
        redis = _service("redis")
        assert redis["image"] == "${TAO_REDIS_IMAGE:-redis:7-alpine}"
        assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]

    @pytest.mark.parametrize("name", ["nats", "redis"])
    def test_brokers_restart(self, name: str) -> None:
        """Both brokers come back after a crash unless stopped by hand."""
        assert _service(name)["restart"] == "unless-stopped"


class TestPlacementKeys:
    """Signed placements by default: the one-shot `keys` service (docker/keys.sh) makes the key
    pair; the planner alone mounts the private half, the gateway the public one."""

    def test_keys_is_a_one_shot_without_network(self) -> None:
        keys = _service("keys")
        assert keys["restart"] == "no" and keys["image"] == IMAGE
        assert keys["entrypoint"] == ["tao-compose-keys"]
        assert keys["network_mode"] == "none" and keys["cap_drop"] == ["ALL"]
        assert "tao-keys:/keys/all" in keys["volumes"]
        args = build_parser().parse_args(_keys_command("placement"))
        assert (args.command, args.action, args.if_missing) == ("keys", "placement", True)
        assert (args.private, args.public) == (
            "/keys/all/placement-key.toml",
            "/keys/all/placement-keys.toml",
        )

    @pytest.mark.parametrize(
        ("name", "variable", "path"),
        [
            ("planner", "TAO_PLACEMENT_KEY", "/keys/placement-key.toml"),
            ("gateway", "TAO_PLACEMENT_KEYS", "/keys/placement-keys.toml"),
        ],
    )
    def test_planner_signs_and_gateway_verifies(self, name: str, variable: str, path: str) -> None:
        service = _service(name)
        assert _environment(name)[variable] == path
        assert service["volumes"] == [f"tao-keys-{name}:/keys:ro"]
        assert f"tao-keys-{name}:/keys/{name}" in _service("keys")["volumes"]
        assert service["depends_on"]["keys"] == {"condition": "service_completed_successfully"}

    def test_the_image_lets_its_user_write_the_keys(self) -> None:
        text = (ROOT / "docker" / "Dockerfile").read_text()
        assert "mkdir -p /var/cache/tao/numba /keys" in text and "chown -R tao:tao" in text

    def test_the_keys_command_is_idempotent(self, tmp_path: Path) -> None:
        files = ["--private", str(tmp_path / "k.toml"), "--public", str(tmp_path / "t.toml")]
        argv = ["keys", "placement", "--id", "compose", *files, "--if-missing"]
        assert main(argv) == 0
        first = (tmp_path / "t.toml").read_text()
        assert main(argv) == 0  # the second `up`: nothing changes
        assert (tmp_path / "t.toml").read_text() == first


class TestAccess:
    """NATS and Redis check every client by default: the one-shot `keys` service runs `tao keys
    access` into the `tao-keys` volume (which only it mounts) and hands each service its own
    URL files (credentials included) in a volume of its own, mounted read-only at /keys."""

    def _access_args(self) -> Any:
        args = build_parser().parse_args(_keys_command("access"))
        assert (args.command, args.action, args.dir, args.if_missing) == (
            "keys",
            "access",
            ACCESS_DIR,
            True,
        )
        return args

    def test_access_names_the_compose_servers_and_namespace(self) -> None:
        args = self._access_args()
        assert (args.nats_url, args.redis_url) == ("nats://nats:4222", "redis://redis:6379/0")
        assert _keys_command("access")[_keys_command("access").index("--namespace") + 1] == (
            "$namespace"
        )
        assert str(_service("keys")["environment"]["TAO_NAMESPACE"]) == "${TAO_NAMESPACE:-}"
        assert not [v for v in _service("keys")["environment"] if v.startswith("TAO_KEYS_")]
        assert str(_service("telemetry")["environment"]["TAO_NAMESPACE"]) == "${TAO_NAMESPACE:-}"

    @pytest.mark.parametrize(
        ("name", "flag", "path"),
        [("nats", "-c", "/keys/nats.conf"), ("redis", "--aclfile", "/keys/users.acl")],
    )
    def test_servers_load_the_users(self, name: str, flag: str, path: str) -> None:
        service = _service(name)
        assert _option(service["command"], flag) == path
        assert f"tao-keys-{name}:/keys:ro" in service["volumes"]
        assert f"tao-keys-{name}:/keys/{name}" in _service("keys")["volumes"]
        assert service["depends_on"]["keys"] == {"condition": "service_completed_successfully"}

    @pytest.mark.parametrize(
        ("name", "role"),
        [*((n, n) for n in CONTROL_PLANE), ("kv-bridge", "ops"), ("demo", "ops")],
    )
    def test_each_client_connects_as_its_role(self, name: str, role: str) -> None:
        """Its URL files are /keys/nats-url and /keys/redis-url of its role's own volume, which
        docker/keys.sh fills from that role's files, owned by the service's uid."""
        env = _environment(name)
        assert (env["TAO_NATS_URL_FILE"], env["TAO_REDIS_URL_FILE"]) == URL_FILES
        assert _service(name)["volumes"] == [f"tao-keys-{role}:/keys:ro"]
        script = KEYS_SCRIPT.read_text(encoding="utf-8")
        assert f"access/{role}.nats-url:nats-url" in script.replace("$name", role)
        uid = str(_service("keys")["environment"][f"TAO_UID_{role.upper()}"])
        assert str(_service(name)["user"]).split(":")[0] == uid

    def test_every_service_runs_as_its_own_uid(self) -> None:
        users = {n: str(_service(n)["user"]).split(":")[0] for n in CONTROL_PLANE}
        assert len(set(users.values())) == len(users) and "0" not in users.values()

    def test_the_access_command_writes_what_the_containers_read(self, tmp_path: Path) -> None:
        """Run the script's own `tao keys access` (into a temporary folder): every role's URL
        files name the compose servers as that role, nats-server accepts the config (`-t`),
        and a second run changes nothing."""
        from shared.infra.embedded import find_nats_server

        command = _keys_command("access")
        command[command.index("--dir") + 1] = str(tmp_path)
        command[command.index("--namespace") + 1] = ""
        assert main(command) == 0
        for role in (*CONTROL_PLANE, "ops"):
            nats = (tmp_path / f"{role}.nats-url").read_text().strip()
            redis = (tmp_path / f"{role}.redis-url").read_text().strip()
            assert (urlsplit(nats).hostname, urlsplit(nats).port) == ("nats", 4222)
            assert (urlsplit(redis).hostname, urlsplit(redis).port) == ("redis", 6379)
            assert urlsplit(nats).username == urlsplit(redis).username == role
            env = {"TAO_NATS_URL_FILE": str(tmp_path / f"{role}.nats-url")}
            assert Settings.from_env(env).nats_url == nats
        checked = subprocess.run(
            [find_nats_server(), "-t", "-c", str(tmp_path / "nats.conf")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
        assert main(command) == 0
        assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before


class TestTaoServices:
    """Every TAO container runs the one image, as `tao service <name>`, wired to the brokers."""

    @pytest.mark.parametrize("name", [*TAO_SERVICES, "demo"])
    def test_uses_the_one_image(self, name: str) -> None:
        """The service runs the shared image and never pulls or builds it: the `keys` service
        alone builds docker/Dockerfile from the repo root (one build for the stack)."""
        service = _service(name)
        assert service["image"] == IMAGE
        assert "build" not in service and service["pull_policy"] == "never"
        build = _service("keys")["build"]
        assert (build["context"], build["dockerfile"]) == (".", "docker/Dockerfile")
        assert (ROOT / build["dockerfile"]).is_file()
        builders = {n for n, s in _compose()["services"].items() if "build" in s}
        assert builders == {"keys"}

    def test_every_container_of_the_image_is_listed(self) -> None:
        """No service outside the known TAO set (and demo, kv-bridge) uses the TAO image."""
        users = {n for n, s in _compose()["services"].items() if s.get("image") == IMAGE}
        assert users == {*TAO_SERVICES, "demo", "kv-bridge", "keys"}

    @pytest.mark.parametrize("name", TAO_SERVICES)
    def test_command_names_a_service_package(self, name: str) -> None:
        """`service <pkg>` names a known service; once services/<pkg>/ exists it is runnable."""
        command = _service(name)["command"]
        assert command[0] == "service"
        package = command[1]
        assert package in KNOWN_SERVICE_PACKAGES
        directory = ROOT / "services" / package
        if directory.is_dir():
            assert (directory / "__main__.py").is_file(), f"services/{package}/__main__.py missing"

    @pytest.mark.parametrize("name", CONTROL_PLANE)
    def test_control_plane_waits_for_healthy_brokers(self, name: str) -> None:
        """A control-plane service starts only once NATS and Redis report healthy."""
        depends = _service(name)["depends_on"]
        assert depends["nats"] == HEALTHY
        assert depends["redis"] == HEALTHY

    @pytest.mark.parametrize("name", TAO_SERVICES)
    def test_restarts_unless_stopped(self, name: str) -> None:
        """Long-running TAO services restart after a crash unless stopped by hand."""
        assert _service(name)["restart"] == "unless-stopped"

    @pytest.mark.parametrize("name", CONTROL_PLANE)
    def test_required_environment(self, name: str) -> None:
        """Broker URLs point at the compose services, nodes are listed, the policy is settable."""
        env = _environment(name)
        assert set(REQUIRED_ENV) <= env.keys()
        assert "TAO_NATS_URL" not in env and "TAO_REDIS_URL" not in env  # no shared credentials
        assert (env["TAO_NATS_URL_FILE"], env["TAO_REDIS_URL_FILE"]) == URL_FILES
        raw_policy = str(_service(name)["environment"]["TAO_POLICY"])
        assert raw_policy == "${TAO_POLICY:-tao}"

    @pytest.mark.parametrize("name", [*TAO_SERVICES, "demo"])
    def test_environment_parses_as_settings(self, name: str) -> None:
        """The environment, with compose defaults filled in, is accepted by Settings.from_env."""
        env = _environment(name)
        settings = _settings(name)
        assert settings.service_name == env.get("TAO_SERVICE_NAME")

    def test_nodes_are_the_simnodes(self) -> None:
        """The nodes file names each simnode by its --node-id, at its service name and --port,
        with the KV-event endpoints it binds (`tcp://*:P` there, `tcp://<service>:P` here)."""
        expected = set()
        for name in SIMNODES:
            command = _service(name)["command"]
            assert command[:2] == ["service", "simnode"]
            port = _option(command, "--port")
            kv = _option(command, "--kv-events").replace("*", name)
            replay = _option(command, "--kv-replay").replace("*", name)
            expected.add((_option(command, "--node-id"), f"http://{name}:{port}", kv, replay))
        found = {(n.id, n.url, n.kv_events, n.kv_replay) for n in _nodes()}
        assert found == expected

    def test_every_node_endpoint_reaches_a_listener_beyond_loopback(self) -> None:
        """Each URL of the nodes config (HTTP, KV events, replay) names a compose service whose
        command, as the simnode's own parser reads it (its defaults included), listens on that
        port on a non-loopback address: another container can connect."""
        for node in _nodes():
            for endpoint in (node.url, node.kv_events, node.kv_replay):
                assert endpoint is not None, node
                target = urlsplit(endpoint)
                host, port = target.hostname, target.port
                assert host in _compose()["services"], f"{endpoint}: no service {host!r}"
                listening = _simnode_listeners(_service(host)["command"])
                assert port in listening, f"{endpoint}: {host} does not listen on {port}"
                bind = listening[port]
                assert bind not in LOOPBACK, f"{endpoint}: {host} listens on {bind} only"

    @pytest.mark.parametrize("name", [*TAO_SERVICES, "demo", "kv-bridge"])
    def test_nodes_file_is_mounted(self, name: str) -> None:
        """Every TAO container mounts the nodes config where TAO_NODES_FILE points."""
        assert _environment(name)["TAO_NODES_FILE"] == NODES_TARGET
        mounts = _service(name)["configs"]
        assert {"source": "nodes", "target": NODES_TARGET} in mounts

    @pytest.mark.parametrize("name", CONTROL_PLANE)
    def test_control_plane_agrees_on_nodes_and_policy(self, name: str) -> None:
        """Every control-plane service sees the same brokers, nodes and policy."""
        keys = ("TAO_NODES_FILE", "TAO_POLICY", "TAO_NAMESPACE")  # URL files: per role, above
        reference = _environment("planner")
        env = _environment(name)
        assert {k: env.get(k) for k in keys} == {k: reference.get(k) for k in keys}


class TestGateway:
    """The gateway is the one published port and reports health over HTTP."""

    def test_publishes_8000_and_listens_on_all_interfaces(self) -> None:
        """Port 8000 is published and the gateway binds 0.0.0.0:8000 inside the container."""
        gateway = _service("gateway")
        assert "${TAO_GATEWAY_HOST_PORT:-8000}:8000" in [str(p) for p in gateway["ports"]]
        env = _settings("gateway")
        assert (env.gateway_host, env.gateway_port) == ("0.0.0.0", 8000)

    def test_healthcheck_hits_readyz(self) -> None:
        """The gateway health check GETs /readyz on its own port (ready once a plan round ran),
        and the gateway starts after the planner."""
        url = urlsplit(_http_check_url(_service("gateway")))
        assert (url.port, url.path) == (8000, "/readyz")
        # /readyz alone: no fallback to /healthz (liveness), so healthy means ready
        assert "/healthz" not in " ".join(_service("gateway")["healthcheck"]["test"])
        assert _service("gateway")["depends_on"]["planner"] == {"condition": "service_started"}

    def test_only_the_gateway_is_published(self) -> None:
        """No other service of the default stack publishes a host port; the observability
        profile publishes Prometheus (9090) and Grafana (3000)."""
        services = _compose()["services"]
        published = {n for n, s in services.items() if s.get("ports") and not s.get("profiles")}
        assert published == {"gateway"}
        assert services["prometheus"]["ports"] == ["9090:9090"]
        assert services["grafana"]["ports"] == ["3000:3000"]


class TestSimnodes:
    """Each simulated node has its own id and a health check on its own port."""

    def test_node_ids_are_distinct(self) -> None:
        """The two simnodes run with different --node-id values."""
        ids = {_option(_service(n)["command"], "--node-id") for n in SIMNODES}
        assert len(ids) == len(SIMNODES)

    @pytest.mark.parametrize("name", SIMNODES)
    def test_healthcheck_hits_healthz_on_its_port(self, name: str) -> None:
        """The health check GETs /healthz on the port given by --port."""
        service = _service(name)
        url = urlsplit(_http_check_url(service))
        assert url.path == "/healthz"
        assert str(url.port) == _option(service["command"], "--port")


class TestDemoProfile:
    """The demo client exists only under `--profile demo` and waits for a healthy gateway."""

    def test_demo_only_in_demo_profile(self) -> None:
        """demo carries profile demo, kv-bridge profile bridge, Prometheus and Grafana profile
        observability, and no other service any."""
        assert _service("demo")["profiles"] == ["demo"]
        assert _service("kv-bridge")["profiles"] == ["bridge"]
        for name in ("prometheus", "grafana"):
            assert _service(name)["profiles"] == ["observability"]
        profiled = {n for n, s in _compose()["services"].items() if s.get("profiles")}
        assert profiled == {"demo", "kv-bridge", "prometheus", "grafana"}

    def test_bridge_forwards_a_listed_node(self) -> None:
        """`tao kv-bridge --node ID` names a node of the nodes file that has KV endpoints."""
        command = _service("kv-bridge")["command"]
        assert command[0] == "kv-bridge"
        node = next(n for n in _nodes() if n.id == _option(command, "--node"))
        assert node.kv_events is not None and node.kv_replay is not None

    def test_demo_targets_the_healthy_gateway(self) -> None:
        """demo runs `tao demo` against http://gateway:8000 after the gateway is healthy."""
        demo = _service("demo")
        assert demo["command"][0] == "demo"
        assert "http://gateway:8000" in demo["command"]
        assert demo["depends_on"]["gateway"] == HEALTHY
        assert demo["restart"] == "no"


class TestDockerfile:
    """docker/Dockerfile builds one non-root python:3.11 image whose entry point is `tao`."""

    def test_base_is_python_311(self) -> None:
        """Every stage starts FROM python:3.11 (a slim variant)."""
        froms = [_resolve_from(args) for kw, args in _instructions() if kw == "FROM"]
        assert froms
        assert all(image.startswith("python:3.11") for image in froms), froms

    def test_copies_what_pip_install_needs(self) -> None:
        """pyproject.toml, its readme and the shared, services and schemas trees are copied."""
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        sources = {s.rstrip("/") for s in _copy_sources()}
        assert {"pyproject.toml", project["project"]["readme"], "shared", "services"} <= sources
        assert "schemas" in sources

    def test_installs_the_project(self) -> None:
        """A RUN step installs the project from the copied tree with pip."""
        runs = [args for kw, args in _instructions() if kw == "RUN"]
        assert any(re.search(r"pip install (--no-deps )?\.(\s|$)", run) for run in runs), runs

    def test_entrypoint_is_the_tao_cli(self) -> None:
        """The final stage's exec-form ENTRYPOINT runs `tao`, the console script in pyproject."""
        entrypoints = [args for kw, args in _final_stage() if kw == "ENTRYPOINT"]
        assert entrypoints, "no ENTRYPOINT in the final stage"
        assert json.loads(entrypoints[-1]) == ["tao"]
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        assert "tao" in project["project"]["scripts"]

    def test_runs_as_non_root(self) -> None:
        """The final stage switches to a user other than root."""
        users = [args for kw, args in _final_stage() if kw == "USER"]
        assert users, "no USER in the final stage"
        assert users[-1].split(":")[0] not in {"root", "0"}

    def test_numba_cache_is_set(self) -> None:
        """NUMBA_CACHE_DIR is set in the final stage so compiled kernels can be cached."""
        envs = " ".join(args for kw, args in _final_stage() if kw == "ENV")
        assert re.search(r"NUMBA_CACHE_DIR=/\S+", envs), envs

    def test_copied_paths_exist_and_are_not_ignored(self) -> None:
        """Each COPY source exists in the repository and no .dockerignore pattern drops it."""
        patterns = [
            line.strip().rstrip("/")
            for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")
        ]
        for source in _copy_sources():
            path = source.rstrip("/")
            assert (ROOT / path).exists(), f"COPY source {path} does not exist"
            ignored = False  # the last pattern that matches decides; `!` takes a path back
            for pattern in patterns:
                if fnmatch.fnmatch(path, pattern.lstrip("!")):
                    ignored = not pattern.startswith("!")
            assert not ignored, f"COPY source {path} is excluded by .dockerignore"

    def test_package_data_ships_every_data_file(self) -> None:
        """Every non-Python file under shared/ and services/ is declared package data."""
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        declared: dict[str, list[str]] = project["tool"]["setuptools"]["package-data"]
        missing = [
            str(path.relative_to(ROOT))
            for tree in ("shared", "services")
            for path in sorted((ROOT / tree).rglob("*"))
            if path.is_file()
            and path.suffix not in {".py", ".pyc", ".nbi", ".nbc"}
            and "__pycache__" not in path.parts
            and not _declared(path.relative_to(ROOT), declared)
        ]
        assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
