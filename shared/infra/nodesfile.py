"""The node inventory: a TOML file (path in ``TAO_NODES_FILE``) that every service reads.

One ``[[node]]`` table per inference node::

    [[node]]
    id = "gpu-a"                                  # [A-Za-z0-9_-]{1,128}, unique
    url = "http://10.0.0.5:8000/v1"               # OpenAI base URL (a trailing /v1 is optional)
    metrics_url = "http://10.0.0.5:8000/metrics"  # optional; default <url root>/metrics
    kv_events = "tcp://10.0.0.5:5557"             # optional; vLLM KV-event PUB endpoint
    kv_replay = "tcp://10.0.0.5:5558"             # optional; vLLM KV-event replay ROUTER
    model = "Qwen/Qwen3-32B"                      # optional; served model name
    capacity_tokens = 524288                      # optional; overrides vllm:cache_config_info
    return_token_ids = false                      # optional; default true (gateway asks for ids)
    domain = "pool-a"                             # optional; scheduling domain (default: any)
    kv_bytes_per_gpu_token = 131072               # optional; with h2d_gbs: the host KV tier
    h2d_gbs = 35.2                                # optional; one GPU's host->device GB/s
    profile = "qwen3-32b-tp2"                     # optional; the profile its prices start from
    prefill_s_per_token = 26.5e-6                 # optional; with attn_s_per_pair: a pinned price
    attn_s_per_pair = 2.7e-9                      # optional

``kv_events`` / ``kv_replay`` are the ``endpoint`` / ``replay_endpoint`` of vLLM's
``--kv-events-config`` as seen from the scheduler (``tcp://*:5557`` on the engine becomes
``tcp://<engine host>:5557`` here). A node without ``kv_events`` gets usage-based residency.
Unknown keys are errors (a typo must not silently drop a setting); every error names the file,
the node and the key.

``kv_bytes_per_gpu_token`` and ``h2d_gbs`` (both or neither) say the node's engine keeps KV in a
host tier (vLLM's OffloadingConnector, docs/kv-tier.md): the KV bytes of one token that one GPU
holds (its tensor-parallel shard; the whole latent under MLA) and one GPU's host→device
bandwidth in GB/s (10^9 bytes/s). The valuation prices a prefix found there by the time its load
takes (:func:`shared.core.tiers.load_s_per_token`); without them a node has no host tier.

``profile`` names the engine profile (``shared.core.engine.profiles``) whose prefill terms a
node's price starts from before its own metrics say otherwise (the default profile without it);
telemetry then measures the node (:class:`shared.core.nodecost.PrefillEstimator`).
``prefill_s_per_token`` and ``attn_s_per_pair`` (both or neither) pin the node's prefill price
instead: it is never measured (docs/internals.md, "The cost of a node").

``domain`` names the node's scheduling domain (docs/scale-out.md): each domain's services
(``TAO_DOMAIN``) see only its own nodes and the nodes that name no domain (:func:`domain_nodes`),
so one file can describe the whole fleet, and a file without the key is one domain's, whatever
that domain is called.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shared.core.engine.profiles import DEFAULT_PROFILE, PROFILES
from shared.core.nodecost import NodeCost, from_profile
from shared.core.tiers import load_s_per_token

from .errors import ConfigFileError
from .tomlfile import read_toml, tables

__all__ = [
    "NodeSpec",
    "NodesFileError",
    "domain_nodes",
    "load_nodes_file",
    "parse_nodes",
    "render_nodes_file",
    "url_root",
]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A configured inference node (one ``[[node]]`` of the nodes file, or ``TAO_NODES``).

    ``url`` is the server root (an OpenAI base URL's trailing ``/v1`` is removed when read);
    ``metrics_url`` defaults to ``url + "/metrics"``. ``kv_events`` is the engine's ZMQ PUB
    endpoint (``tcp://host:5557``) and ``kv_replay`` its ROUTER replay endpoint; without
    ``kv_events`` residency falls back to usage-based observations. ``model`` is the served
    model name (scraped from ``/v1/models`` when absent); ``capacity_tokens`` overrides the
    capacity read from ``vllm:cache_config_info``. ``return_token_ids = false`` stops the gateway
    asking the node for token ids (vLLM older than 0.10.2, or a proxy that refuses the field).
    ``kv_bytes_per_gpu_token`` and ``h2d_gbs``: the node's host KV tier (module docstring).
    """

    id: str
    url: str
    metrics_url: str | None = None
    kv_events: str | None = None
    kv_replay: str | None = None
    model: str | None = None
    capacity_tokens: int | None = None
    return_token_ids: bool = True
    domain: str | None = None
    kv_bytes_per_gpu_token: int | None = None
    h2d_gbs: float | None = None
    profile: str | None = None
    prefill_s_per_token: float | None = None
    attn_s_per_pair: float | None = None

    def prior_cost(self) -> NodeCost:
        """The node's prices before any measurement: its pin, else its profile's (the
        default profile's without one), with its host tier and the measured control loop."""
        base = from_profile(
            PROFILES[self.profile or DEFAULT_PROFILE], None, self.host_load_s_per_token
        )
        if self.prefill_s_per_token is None or self.attn_s_per_pair is None:
            return base
        return base.with_prefill(self.prefill_s_per_token, self.attn_s_per_pair, "pinned")

    @property
    def host_load_s_per_token(self) -> float:
        """Seconds to load one token of a prefix from the node's host KV tier (0: no tier)."""
        if self.kv_bytes_per_gpu_token is None or self.h2d_gbs is None:
            return 0.0
        return load_s_per_token(self.kv_bytes_per_gpu_token, self.h2d_gbs * 1e9)

    @property
    def metrics(self) -> str:
        """Where to scrape Prometheus metrics."""
        return self.metrics_url or f"{self.url.rstrip('/')}/metrics"

    @property
    def root(self) -> str:
        """The server root of :attr:`url` (an OpenAI base URL's ``…/v1`` taken off): where a
        vLLM server answers ``/health`` and ``/reset_prefix_cache``."""
        return url_root(self.url)


def url_root(url: str) -> str:
    """The server root of an OpenAI base URL (``…/v1`` → ``…``; a trailing ``/`` dropped)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
_HTTP: Final = ("http", "https")
_ZMQ: Final = ("tcp", "ipc", "inproc")
_KEYS: Final = (
    "id",
    "url",
    "metrics_url",
    "kv_events",
    "kv_replay",
    "model",
    "capacity_tokens",
    "return_token_ids",
    "domain",
    "kv_bytes_per_gpu_token",
    "h2d_gbs",
    "profile",
    "prefill_s_per_token",
    "attn_s_per_pair",
)


class NodesFileError(ConfigFileError):
    """The nodes file at ``path`` is unreadable or invalid, for ``reason``."""


def _url(value: object, where: str, key: str, schemes: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key} must be a string, got {type(value).__name__}")
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in schemes or not rest:
        raise ValueError(f"{where}: {key} must be a {'/'.join(schemes)} URL, got {value!r}")
    return value.rstrip("/")


def _node(raw: object, index: int) -> NodeSpec:
    where = f"node {index + 1}"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_KEYS))
    node_id = raw.get("id")
    if not isinstance(node_id, str) or not _ID_RE.fullmatch(node_id):
        raise ValueError(f"{where}: id must match [A-Za-z0-9_-]{{1,128}}, got {node_id!r}")
    where = f"node {node_id!r}"
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}")
    if "url" not in raw:
        raise ValueError(f"{where}: url is required")
    values: dict[str, Any] = {"id": node_id, "url": url_root(_url(raw["url"], where, "url", _HTTP))}
    if "metrics_url" in raw:
        values["metrics_url"] = _url(raw["metrics_url"], where, "metrics_url", _HTTP)
    for key in ("kv_events", "kv_replay"):
        if key in raw:
            values[key] = _url(raw[key], where, key, _ZMQ)
    if "kv_replay" in values and "kv_events" not in values:
        raise ValueError(f"{where}: kv_replay needs kv_events")
    if "model" in raw:
        model = raw["model"]
        if not isinstance(model, str) or not model:
            raise ValueError(f"{where}: model must be a non-empty string, got {model!r}")
        values["model"] = model
    if "capacity_tokens" in raw:
        cap = raw["capacity_tokens"]
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"{where}: capacity_tokens must be an integer >= 1, got {cap!r}")
        values["capacity_tokens"] = cap
    if "return_token_ids" in raw:
        ask = raw["return_token_ids"]
        if not isinstance(ask, bool):
            raise ValueError(f"{where}: return_token_ids must be true or false, got {ask!r}")
        values["return_token_ids"] = ask
    if "domain" in raw:
        domain = raw["domain"]
        if not isinstance(domain, str) or not _ID_RE.fullmatch(domain):
            raise ValueError(f"{where}: domain must match [A-Za-z0-9_-]{{1,128}}, got {domain!r}")
        values["domain"] = domain
    values.update(_host_tier(raw, where))
    values.update(_prices(raw, where))
    return NodeSpec(**values)


def _prices(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``profile`` (a known engine profile) and the pinned prefill price (both or neither)."""
    out: dict[str, Any] = {}
    if "profile" in raw:
        name = raw["profile"]
        if not isinstance(name, str) or name not in PROFILES:
            raise ValueError(f"{where}: profile must be one of {', '.join(PROFILES)}, got {name!r}")
        out["profile"] = name
    given = [k for k in ("prefill_s_per_token", "attn_s_per_pair") if k in raw]
    if len(given) == 1:
        other = "attn_s_per_pair" if given[0] == "prefill_s_per_token" else "prefill_s_per_token"
        raise ValueError(f"{where}: {given[0]} needs {other} (a pinned price takes both)")
    for key in given:
        value = raw[key]
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not (0 <= value < 1 and math.isfinite(value)):
            raise ValueError(f"{where}: {key} must be a number of seconds in [0, 1), got {value!r}")
        out[key] = float(value)
    return out


def _host_tier(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``kv_bytes_per_gpu_token`` and ``h2d_gbs``, both or neither."""
    given = [k for k in ("kv_bytes_per_gpu_token", "h2d_gbs") if k in raw]
    if not given:
        return {}
    if len(given) == 1:
        other = "h2d_gbs" if given[0] == "kv_bytes_per_gpu_token" else "kv_bytes_per_gpu_token"
        raise ValueError(f"{where}: {given[0]} needs {other} (the host KV tier takes both)")
    size, gbs = raw["kv_bytes_per_gpu_token"], raw["h2d_gbs"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"{where}: kv_bytes_per_gpu_token must be an integer >= 1, got {size!r}")
    if (
        not isinstance(gbs, int | float)
        or isinstance(gbs, bool)
        or not (gbs > 0 and math.isfinite(gbs))
    ):
        raise ValueError(f"{where}: h2d_gbs must be a number > 0 (GB/s), got {gbs!r}")
    return {"kv_bytes_per_gpu_token": size, "h2d_gbs": float(gbs)}


def domain_nodes(nodes: Iterable[NodeSpec], domain: str) -> tuple[NodeSpec, ...]:
    """The nodes of ``domain`` and those naming none; ValueError naming the domains there are
    when that leaves none."""
    nodes = tuple(nodes)
    mine = tuple(n for n in nodes if n.domain is None or n.domain == domain)
    if nodes and not mine:
        there = ", ".join(sorted({n.domain for n in nodes if n.domain is not None}))
        raise ValueError(f"no node of domain {domain!r} (the file's domains: {there})")
    return mine


def parse_nodes(doc: Mapping[str, Any]) -> tuple[NodeSpec, ...]:
    """The nodes of a parsed TOML document; :class:`ValueError` names the node and key."""
    nodes: list[NodeSpec] = []
    for index, raw in enumerate(tables(doc, "node")):
        spec = _node(raw, index)
        if any(n.id == spec.id for n in nodes):
            raise ValueError(f"node id {spec.id!r} appears twice")
        nodes.append(spec)
    return tuple(nodes)


def load_nodes_file(path: str | Path) -> tuple[NodeSpec, ...]:
    """Read and check the nodes file; :class:`NodesFileError` says what is wrong and where."""
    doc = read_toml(path, NodesFileError)
    try:
        return parse_nodes(doc)
    except ValueError as exc:
        raise NodesFileError(str(path), str(exc)) from None


def _toml_value(value: str | int | float) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def render_nodes_file(nodes: Iterable[NodeSpec], header: str = "") -> str:
    """TOML text for ``nodes`` that :func:`load_nodes_file` reads back unchanged."""
    lines = [f"# {line}" for line in header.splitlines()]
    for spec in nodes:
        if lines:
            lines.append("")
        lines.append("[[node]]")
        for key in _KEYS:
            value = getattr(spec, key)
            if value is not None and not (key == "return_token_ids" and value):
                lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
