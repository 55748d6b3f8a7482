"""deploy/compose.domains.yaml, the multi-domain example, checked by structure (no Docker)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    return sorted(n for n, s in _services().items() if s.get("command", [None, None])[1] == kind)


def _settings(name: str, nodes_file: Path) -> Settings:
    env = {k: _INTERPOLATION.sub(lambda m: m.group(2) or "", str(v))
           for k, v in _services()[name]["environment"].items()}  # fmt: skip
    env["TAO_NODES_FILE"] = str(nodes_file)
    return Settings.from_env(env)


@pytest.fixture
def nodes_file(tmp_path: Path) -> Path:
    path = tmp_path / "nodes.toml"
    path.write_text(_compose()["configs"]["nodes"]["content"])
    return path


def test_three_nats_servers_route_to_each_other_with_jetstream() -> None:
    servers = [n for n in _services() if n.startswith("nats-")]
    assert len(servers) == 3
    for name in servers:
        cmd = _services()[name]["command"]
        assert "-js" in cmd and cmd[cmd.index("--name") + 1] == name
        routes = cmd[cmd.index("--routes") + 1].split(",")
        assert sorted(routes) == sorted(f"nats://{s}:6222" for s in servers)


def test_every_tao_service_parses_and_sees_only_its_domains_nodes(nodes_file: Path) -> None:
    """Each TAO container's environment is valid Settings; its nodes are its domain's; it
    names every NATS server and keeps 3 copies of the streams."""
    domains: set[str] = set()
    for name, svc in _services().items():
        if svc.get("image") != "tao-scheduler:local":
            continue
        s = _settings(name, nodes_file)
        assert s.replicas == 3 and s.nats_url is not None and s.nats_url.count("nats://") == 3
        assert s.nodes and all(n.domain == s.domain for n in s.nodes), name
        domains.add(s.domain)
    assert domains == {"pool-a", "pool-b"}


def test_each_domain_has_its_own_namespace_services_and_two_planners(nodes_file: Path) -> None:
    by_domain: dict[str, dict[str, list[str]]] = {}
    for kind in ("telemetry", "tools", "valuation", "planner", "gateway"):
        for name in _tao(kind):
            s = _settings(name, nodes_file)
            assert s.namespace == s.domain  # a domain's subjects and streams are its own
            by_domain.setdefault(s.domain, {}).setdefault(kind, []).append(name)
    for domain, kinds in by_domain.items():
        assert {k: len(v) for k, v in kinds.items()} == {
            "telemetry": 1, "tools": 1, "valuation": 1, "planner": 2, "gateway": 1,
        }, domain  # fmt: skip
        instances = {_settings(p, nodes_file).instance for p in kinds["planner"]}
        assert len(instances) == 2  # distinct names: a standby never takes over a live leader
    gateways = [_services()[g]["ports"][0] for g in _tao("gateway")]
    assert len(set(gateways)) == len(gateways)
