"""deploy/compose.domains.yaml, the multi-domain example, checked by structure (no Docker)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.cli.main import main
from shared.infra.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
FILE = ROOT / "deploy" / "compose.domains.yaml"
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


@cache
def _compose() -> dict[str, Any]:
    doc = yaml.safe_load(FILE.read_text())
    assert isinstance(doc, dict)
    return doc


def _services() -> dict[str, Any]:
    return dict(_compose()["services"])


def _tao(kind: str) -> list[str]:
    return sorted(
        n for n, s in _services().items() if s.get("command", [None, None])[1:2] == [kind]
    )


def _role(name: str) -> str | None:
    """The role whose credentials the service mounts at /keys (its volume tao-keys-<role>)."""
    for volume in _services()[name].get("volumes", []):
        source, _, target = str(volume).partition(":")
        if target.startswith("/keys") and source.startswith("tao-keys-"):
            return source.removeprefix("tao-keys-")
    return None


_ACCESS: dict[str, Path] = {}


def _access_dir(tmp: Path) -> Path:
    """`tao keys access` as docker/keys.sh runs it with the keys service's environment."""
    if "dir" not in _ACCESS:
        env = _services()["keys"]["environment"]
        argv = ["keys", "access", "--dir", str(tmp), "--nats-url", env["TAO_KEYS_NATS_URL"],
                "--redis-url", env["TAO_KEYS_REDIS_URL"]]  # fmt: skip
        for ns in str(env["TAO_KEYS_NAMESPACES"]).split():
            argv += ["--namespace", ns]
        assert main(argv) == 0
        _ACCESS["dir"] = tmp
    return _ACCESS["dir"]


def _settings(name: str, nodes_file: Path) -> Settings:
    """The service's Settings, its URL files those of its role as docker/keys.sh writes them."""
    env = {k: _INTERPOLATION.sub(lambda m: m.group(2) or "", str(v))
           for k, v in _services()[name]["environment"].items()}  # fmt: skip
    env["TAO_NODES_FILE"] = str(nodes_file)
    role = _role(name)
    if role is not None and "TAO_NATS_URL_FILE" in env:
        folder = _access_dir(nodes_file.parent / "access")
        env["TAO_NATS_URL_FILE"] = str(folder / f"{role}.nats-url")
        env["TAO_REDIS_URL_FILE"] = str(folder / f"{role}.redis-url")
    return Settings.from_env(env)


@pytest.fixture
def nodes_file(tmp_path: Path) -> Path:
    _ACCESS.clear()
    path = tmp_path / "nodes.toml"
    path.write_text(_compose()["configs"]["nodes"]["content"])
    return path


def test_three_nats_servers_route_to_each_other_with_jetstream() -> None:
    """Each server loads the users and the cluster block docker/keys.sh writes (routes to the
    three, TAO_NATS_ROUTES, as the route user)."""
    servers = [n for n in _services() if n.startswith("nats-")]
    assert len(servers) == 3
    for name in servers:
        cmd = _services()[name]["command"]
        assert "-js" in cmd and cmd[cmd.index("--name") + 1] == name
        assert cmd[cmd.index("-c") + 1] == "/keys/nats.conf"
        assert "tao-keys-nats:/keys:ro" in _services()[name]["volumes"]
    assert _services()["keys"]["environment"]["TAO_NATS_ROUTES"].split() == servers


def test_every_tao_service_parses_and_sees_only_its_domains_nodes(nodes_file: Path) -> None:
    """Each TAO container's environment is valid Settings; its nodes are its domain's; it
    names every NATS server and keeps 3 copies of the streams."""
    domains: set[str] = set()
    for name, svc in _services().items():
        if svc.get("image") != "tao-scheduler:local" or name in ("keys", "demo"):  # clients
            continue
        if svc["command"][1:2] == ["simnode"]:  # no NATS or Redis: no credentials
            assert _role(name) is None, name
            continue
        s = _settings(name, nodes_file)
        assert s.replicas == 3 and s.nats_url is not None and s.nats_url.count("nats://") == 3
        served = set(s.gateway_domains) or {s.domain}
        assert s.nodes and all(n.domain in served for n in s.nodes), name
        domains |= served
    assert domains == {"pool-a", "pool-b"}


def test_each_domain_has_its_own_namespace_services_and_two_planners(nodes_file: Path) -> None:
    by_domain: dict[str, dict[str, list[str]]] = {}
    for kind in ("telemetry", "tools", "valuation", "planner"):
        for name in _tao(kind):
            s = _settings(name, nodes_file)
            assert s.namespace == s.domain  # a domain's subjects and streams are its own
            by_domain.setdefault(s.domain, {}).setdefault(kind, []).append(name)
    for domain, kinds in by_domain.items():
        assert {k: len(v) for k, v in kinds.items()} == {
            "telemetry": 1, "tools": 1, "valuation": 1, "planner": 2,
        }, domain  # fmt: skip
        instances = {_settings(p, nodes_file).instance for p in kinds["planner"]}
        assert len(instances) == 2  # distinct names: a standby never takes over a live leader


def test_one_gateway_serves_both_domains(nodes_file: Path) -> None:
    (gateway,) = _tao("gateway")
    s = _settings(gateway, nodes_file)
    assert s.gateway_domains == ("pool-a", "pool-b")
    assert s.namespace in s.gateway_domains  # its own connection opens no other namespace
    assert {n.domain for n in s.nodes} == {"pool-a", "pool-b"}
    assert _services()[gateway]["ports"] == ["${TAO_GATEWAY_HOST_PORT:-8000}:8000"]


def test_the_store_is_a_redis_cluster_of_three_masters_with_a_replica_each(
    nodes_file: Path,
) -> None:
    servers = sorted(n for n in _services() if re.fullmatch(r"redis-\d", n))
    assert len(servers) == 6
    for name in servers:
        cmd = _services()[name]["command"]
        assert cmd[cmd.index("--cluster-enabled") + 1] == "yes"
    init = " ".join(_services()["redis-init"]["command"])
    assert "--cluster create --cluster-replicas 1" in init and "for n in 1 2 3 4 5 6" in init
    assert "--user admin" in init and _services()["redis-init"]["volumes"] == [
        "tao-keys-admin:/keys:ro"
    ]
    for name in servers:  # the ACL users, and the replica user for the link to the master
        cmd = _services()[name]["command"]
        assert cmd[1] == "/keys/replication.conf" and "--aclfile" in cmd
        assert "tao-keys-redis:/keys:ro" in _services()[name]["volumes"]
    assert _services()["keys"]["environment"]["TAO_REDIS_REPLICATION"] == "1"
    assert set(_services()["redis-init"]["depends_on"]) == set(servers)
    for name, svc in _services().items():
        if svc.get("image") != "tao-scheduler:local" or svc["command"][1:2] in ([], ["simnode"]):
            continue
        if name == "demo":  # a client of the gateway: no Redis (below)
            continue
        url = _settings(name, nodes_file).redis_url
        hosts = ",".join(f"{n}:6379" for n in servers)
        assert url is not None and url.startswith("redis+cluster://") and url.endswith(hosts), name
        assert svc["depends_on"]["redis-init"] == {"condition": "service_completed_successfully"}


def test_every_dollar_is_an_interpolation_or_escaped() -> None:
    """Compose reads ``$`` as the start of a variable: a shell ``$`` must be written ``$$``."""
    text = FILE.read_text().replace("$$", "")
    assert not re.findall(r"\$(?![{A-Za-z_])", text)


def test_one_build_for_every_tao_container() -> None:
    """The one-shot `keys` service alone builds the image; every other TAO container names it
    and never pulls it."""
    users = {n: s for n, s in _services().items() if s.get("image") == "tao-scheduler:local"}
    assert {n for n, s in _services().items() if "build" in s} == {"keys"}
    assert all(s["pull_policy"] == "never" for n, s in users.items() if n != "keys")
    assert all(s["depends_on"]["keys"] == {"condition": "service_completed_successfully"}
               for n, s in users.items() if n != "keys" and "depends_on" in s)  # fmt: skip


def test_the_gateway_is_ready_after_the_planners_and_needs_its_key() -> None:
    gateway = _services()["gateway"]
    check = " ".join(gateway["healthcheck"]["test"])
    assert "/readyz" in check and "/healthz" not in check  # no liveness fallback: ready is ready
    assert {p for p in gateway["depends_on"] if p.startswith("planner-")} == set(_tao("planner"))
    assert gateway["environment"]["TAO_GATEWAY_KEY_FILE"] == "/keys/gateway-key"
    assert gateway["volumes"] == ["tao-keys-gateway:/keys:ro"]


def test_the_demo_profile_drives_the_gateway_with_its_key_alone() -> None:
    """`--profile demo`: `tao demo --against` the gateway, with the gateway's key from the ops
    volume (docker/keys.sh) and no NATS or Redis URL (a session's domain is the gateway's)."""
    demo = _services()["demo"]
    assert demo["profiles"] == ["demo"] and demo["restart"] == "no"
    assert demo["command"] == ["demo", "--against", "http://gateway:8000"]
    assert demo["environment"]["TAO_GATEWAY_KEY_FILE"] == "/keys/gateway-key"
    assert not {"TAO_NATS_URL", "TAO_REDIS_URL"} & set(demo["environment"])
    assert demo["volumes"] == ["tao-keys-ops:/keys:ro"]
    assert demo["depends_on"]["gateway"] == {"condition": "service_healthy"}
    keys = _services()["keys"]
    assert "tao-keys-ops:/keys/ops" in keys["volumes"] and keys["environment"]["TAO_UID_OPS"]


UIDS = {"telemetry": "10011", "tools": "10012", "valuation": "10013", "planner": "10014",
        "gateway": "10015", "ops": "10016"}  # fmt: skip


def test_each_service_connects_as_its_role_with_its_own_uid(nodes_file: Path) -> None:
    """As in compose.yaml: a control-plane container mounts its role's volume alone, runs as
    the role's uid (keys.sh owns the files by TAO_UID_<ROLE>) and connects as that role, with
    grants covering both domains' namespaces."""
    keys = _services()["keys"]
    for name, svc in _services().items():
        if svc.get("image") != "tao-scheduler:local" or name == "keys":
            continue
        if svc["command"][1:2] == ["simnode"]:
            continue
        role = _role(name)
        assert role is not None and svc["volumes"] == [f"tao-keys-{role}:/keys:ro"], name
        assert (
            str(svc["user"]).split(":")[0]
            == UIDS[role]
            == keys["environment"][f"TAO_UID_{role.upper()}"]
        ), name
        assert f"tao-keys-{role}:/keys/{role}" in keys["volumes"]
        if name == "demo":
            continue
        assert svc["command"][1] == role or name.startswith(role), name
        s = _settings(name, nodes_file)
        assert s.nats_url is not None and s.nats_url.count(f"nats://{role}:") == 3, name
    assert str(keys["environment"]["TAO_KEYS_NAMESPACES"]).split() == ["pool-a", "pool-b"]
    conf = (_access_dir(nodes_file.parent / "access") / "nats.conf").read_text()
    assert "pool-a.tao.v1" in conf and "pool-b.tao.v1" in conf


def test_the_planners_sign_and_the_gateway_verifies() -> None:
    for name in _tao("planner"):
        assert _services()[name]["environment"]["TAO_PLACEMENT_KEY"] == "/keys/placement-key.toml"
    gateway = _services()["gateway"]["environment"]
    assert gateway["TAO_PLACEMENT_KEYS"] == "/keys/placement-keys.toml"
