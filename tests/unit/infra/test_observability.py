"""deploy/: the Grafana dashboard and the Prometheus alert rules name only series the gateway
exports, and compose's observability profile mounts them where their configs point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from services.gateway.cluster_metrics import cluster_lines
from services.gateway.metrics import GatewayMetrics
from shared.infra.fake_store import FakeStore
from shared.infra.store_types import NodeUpdate

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
SERIES = re.compile(r"\b(tao_[a-z0-9_]+)\b")


async def _exported() -> set[str]:
    """Every series name /metrics gives: the gateway's own and the cluster's, as the TYPE lines
    declare them, with a histogram's _bucket / _sum / _count."""
    store = FakeStore()
    await store.put_node_status("n1", NodeUpdate(capacity_tokens=1000, healthy=True,
                                prefix_cache_queries=10, prefix_cache_hits=5))  # fmt: skip
    await store.record_solve(1.0, exact=True, method="k-first")
    text = GatewayMetrics(lambda: 0, lambda: 0).render()
    text += "\n".join(await cluster_lines(store))
    names: set[str] = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            name, kind = m.groups()
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def _alert_rules() -> list[dict[str, object]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "tao.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


async def test_every_named_series_is_exported() -> None:
    exported = await _exported()
    exprs = [str(r["expr"]) for r in _alert_rules()] + _dashboard_exprs()
    named = {n for e in exprs for n in SERIES.findall(e)}
    assert len(named) >= 15
    assert named - exported == set()


async def test_the_cluster_series_are_all_charted_or_alerted() -> None:
    """Nothing the gateway exports is forgotten by both the dashboard and the alerts."""
    exprs = " ".join([str(r["expr"]) for r in _alert_rules()] + _dashboard_exprs())
    named = set(SERIES.findall(exprs))
    exported = await _exported()
    unused = {
        n
        for n in exported
        if n not in named and not n.endswith(("_sum", "_count")) and f"{n}_bucket" not in exported
    }
    assert unused == set()


def test_alert_rules_are_well_formed() -> None:
    rules = _alert_rules()
    assert len(rules) >= 8
    for r in rules:
        assert set(r) >= {"alert", "expr", "labels", "annotations"}, r
        labels, notes = r["labels"], r["annotations"]
        assert isinstance(labels, dict) and labels["severity"] in {"info", "warning", "critical"}
        assert isinstance(notes, dict) and notes["summary"] and notes["description"]
    assert len({r["alert"] for r in rules}) == len(rules)


def test_dashboard_panels_are_unique_and_on_the_provisioned_datasource() -> None:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "tao.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"]
    source = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    uid = source["datasources"][0]["uid"]
    assert {p["datasource"]["uid"] for p in dash["panels"]} == {uid}


def test_compose_mounts_what_the_configs_name() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    mounts = dict(v.rsplit(":", 2)[:2] for v in compose["prometheus"]["volumes"])
    by_target = {t: s for s, t in mounts.items()}
    for rule_file in prom["rule_files"]:
        assert (ROOT / by_target[rule_file]).is_file()
    (target,) = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose and compose[host]["environment"]["TAO_GATEWAY_PORT"] == port
    grafana = dict(v.rsplit(":", 2)[:2] for v in compose["grafana"]["volumes"])
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/tao.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert {t: s for s, t in grafana.items()}[path] == "./deploy/grafana/dashboards"
    for source in grafana:
        assert (ROOT / source).is_dir()


class _Broken(FakeStore):
    async def nodes(self):  # type: ignore[no-untyped-def]
        raise ConnectionError("redis down")


async def test_cluster_lines_values_and_a_broken_store() -> None:
    store = FakeStore()
    await store.put_node_status("n1", NodeUpdate(capacity_tokens=1000, healthy=True, running=2,
                                prefix_cache_queries=10, prefix_cache_hits=5))  # fmt: skip
    await store.record_solve(1.5, exact=True, method="k-first")
    lines = await cluster_lines(store)
    for want in ('tao_node_capacity_tokens{node="n1"} 1000', 'tao_node_healthy{node="n1"} 1',
                 'tao_node_running_requests{node="n1"} 2',
                 'tao_node_prefix_cache_hits_total{node="n1"} 5', "tao_planner_solves_total 1",
                 'tao_planner_solve_ms{quantile="0.99"} 1.5', "tao_pool_sessions 0",
                 "tao_cluster_scrape_ok 1"):  # fmt: skip
        assert want in lines, want
    assert await cluster_lines(None) == []
    assert (await cluster_lines(_Broken()))[-1] == "tao_cluster_scrape_ok 0"
