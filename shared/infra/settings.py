"""Settings: parsed once from the environment at start-up, frozen, failing fast.

Every variable is optional. A bad value raises :class:`~shared.infra.errors.SettingsError` whose
message names the variable, what is wrong and what was given
(``TAO_TICK_S: must be a number > 0, got 'abc'``). Empty strings count as unset.

| Variable                  | Default   | Meaning                                                 |
|---------------------------|-----------|---------------------------------------------------------|
| TAO_NATS_URL              | (unset)   | NATS URL (JetStream on); unset: `tao up` starts one     |
| TAO_REDIS_URL             | (unset)   | Redis/Valkey URL, or `redis+cluster://h:p,h:p` for a    |
|                           |           | Redis Cluster; unset: `tao up` starts Valkey            |
| TAO_NATS_URL_FILE         | (unset)   | file holding TAO_NATS_URL (with the role's credentials, |
|                           |           | `tao keys access`); instead of TAO_NATS_URL             |
| TAO_REDIS_URL_FILE        | (unset)   | file holding TAO_REDIS_URL, the same way                |
| TAO_NAMESPACE             | ""        | prefix of every subject (`ns.`) and stream (`ns_`)      |
| TAO_DOMAIN                | default   | scheduling domain; the Redis hash tag `{domain}`        |
| TAO_TICK_S                | 1.0       | scheduling tick period, s (> 0)                         |
| TAO_DEBOUNCE_S            | 0.0005    | early-tick debounce after a wake-up event, s (>= 0);    |
|                           |           | below 1 ms, one pass of the event loop                  |
| TAO_POLICY                | tao       | placement policy, one of `tao policies`                 |
| TAO_HALF_LIFE_S           | 10        | residency credit half-life, s (> 0)                     |
| TAO_CREDIT_UNIT           | 256       | tokens per credit unit (> 0)                            |
| TAO_QUANTUM               | 512       | planner weight quantum, tokens (> 0)                    |
| TAO_RESERVE_TOKENS        | 512       | next-turn reserve per session, tokens (>= 0); under     |
|                           |           | `tao` the default of the growth rule                    |
| TAO_TARGET_UTILISATION    | 0.9       | share of node KV capacity the planner may fill, (0, 1]  |
| TAO_HORIZON_S             | 1.0       | readiness horizon, s (> 0)                              |
| TAO_FRESHNESS_S           | 30        | telemetry older than this is stale, s (> 0)             |
| TAO_SCRAPE_S              | 1.0       | telemetry scrape period per node, s (> 0)               |
| TAO_PLANNER_BUDGET        | 150000    | planner state budget per tick (> 0)                     |
| TAO_PLANNER_TIME_LIMIT_MS | 200       | planner wall-clock limit per tick, ms (> 0)             |
| TAO_TA_INTERVAL_S         | 5         | ThunderAgent policies' periodic check, s (> 0)          |
| TAO_GATEWAY_ID            | gw0       | this gateway's id, [A-Za-z0-9_-]{1,128}                 |
| TAO_GATEWAY_HOST          | 127.0.0.1 | gateway listen address                                  |
| TAO_GATEWAY_PORT          | 8000      | gateway listen port, 0–65535 (0: any free port)         |
| TAO_GATEWAY_DOMAINS       | (empty)   | domains one gateway serves, `pool-a,pool-b` (each on    |
|                           |           | namespace = its name; empty: TAO_DOMAIN only)           |
| TAO_HOLD_TIMEOUT_S        | 120       | longest a request is held before a 503, s (> 0)         |
| TAO_RETRY_AFTER_S         | 2         | Retry-After sent with the 503, s (> 0)                  |
| TAO_MAX_BODY_BYTES        | 33554432  | largest request body the gateway reads (413 beyond it)  |
| TAO_MAX_BODY_ITEMS        | 524288    | most items (array elements, object members) in a body   |
|                           |           | (400 beyond it, found before parsing)                   |
| TAO_MAX_COMPRESSION_RATIO | 100       | a gzip/deflate body may inflate this many times its     |
|                           |           | size past its first MiB (413 beyond it; >= 1)           |
| TAO_BODY_TIMEOUT_S        | 10        | time a body may take before TAO_BODY_MIN_RATE applies,  |
|                           |           | s (> 0); a body that falls behind is answered 408       |
| TAO_BODY_MIN_RATE         | 65536     | slowest a body may arrive after that, bytes/s (> 0)     |
| TAO_BODY_CLIENT_RATE      | 64000000  | decoded body bytes a second one client (tenant and      |
|                           |           | address) may send past its burst; beyond it the gateway |
|                           |           | reads that client more slowly (0: no limit)             |
| TAO_BODY_CLIENT_BURST     | 0         | bytes a client may send at once before the rate applies |
|                           |           | (0: TAO_MAX_BODY_BYTES, one largest body)               |
| TAO_HEADER_TIMEOUT_S      | 10        | a request's headers must be in this long after its      |
|                           |           | first byte (or the accept), s (> 0); else it is closed  |
| TAO_KEEPALIVE_S           | 75        | an idle keep-alive connection is closed after this, s   |
| TAO_MAX_CONNECTIONS       | 4096      | open client connections at most, and 192 below the file |
|                           |           | limit; past it the oldest idle one is closed (or 503)   |
| TAO_MAX_HELD              | 10000     | requests held at once, gateway-wide (503 beyond it)     |
| TAO_MAX_HELD_BYTES        | 536870912 | bytes of held requests' bodies, gateway-wide (503)      |
| TAO_TENANTS_FILE          | (unset)   | tenants, API keys, hook tokens (TOML; tenants.py): set, |
|                           |           | the gateway requires tenants' keys; unset: below        |
| TAO_GATEWAY_AUTH          | auto      | auto: a key is needed when the gateway listens beyond   |
|                           |           | loopback (no tenants file); on: always; off: never      |
| TAO_GATEWAY_KEY           | (unset)   | the key clients and hooks present (gatewaykey.py)       |
| TAO_GATEWAY_KEY_FILE      | (unset)   | file holding TAO_GATEWAY_KEY; neither set: generated    |
|                           |           | once into TAO_STATE_DIR/gateway.key (0600), printed once|
| TAO_STATE_DIR             | (below)   | the gateway's state; default $XDG_STATE_HOME/tao or     |
|                           |           | ~/.local/state/tao                                      |
| TAO_HOOK_RATE             | 20        | hook posts per second per session at the gateway (> 0)  |
| TAO_HOOK_BURST            | 200       | hook posts a session may send at once (429 beyond)      |
| TAO_HOOK_TENANT_RATE      | 1000      | hook posts per second per tenant, all its sessions (> 0)|
| TAO_HOOK_TENANT_BURST     | 5000      | hook posts a tenant may send at once (429 beyond)       |
| TAO_NODE_API_KEY          | (unset)   | sent to the nodes as `Authorization: Bearer` (vLLM      |
|                           |           | `--api-key`); unset: the client's own, if auth is off   |
| TAO_PLACEMENT_KEY         | (unset)   | planner: key file it signs placements with (signing.py) |
| TAO_PLACEMENT_KEYS        | (unset)   | gateway: trusted placement keys; set, unsigned, forged  |
|                           |           | or expired placements are rejected and counted          |
| TAO_IDLE_TIMEOUT_S        | 300       | a session idle this long is ended, s (> 0)              |
| TAO_CONTINUATION_SESSIONS | 100000    | unnamed sessions the gateway remembers per tenant to    |
|                           |           | join their continuations by content (>= 0, 0: off: a    |
|                           |           | request with no id is then a one-turn session)          |
| TAO_SERVICE_NAME          | (unset)   | overrides the service name (logs, NATS client name)     |
| TAO_INSTANCE              | (host)    | this replica's name in leader election (lease.py);      |
|                           |           | default `<hostname>-<service>`; unique per replica      |
| TAO_LEASE_TTL_S           | 2         | planner/valuation lease TTL, s (>= 0.2; 0: no election, |
|                           |           | one replica per domain, plans unfenced)                 |
| TAO_REPLICAS              | 1         | copies of each stream and the lease bucket, 1–5 (on a   |
|                           |           | NATS cluster, 3: a server may fail; docs/scale-out.md)  |
| TAO_SHARD                 | 0/1       | this process's share, INDEX/COUNT: tools of the        |
|                           |           | sessions, telemetry of the nodes (by id hash; shard.py) |
| TAO_SESSION_CACHE         | 8192      | session records the tools service keeps as it wrote     |
|                           |           | them (its batch then skips the read; >= 0, 0: off)      |
| TAO_LOG_LEVEL             | info      | debug, info, warning or error                           |
| TAO_LOG_FORMAT            | json      | json (JSON lines on stderr) or console                  |
| TAO_NODES_FILE            | (unset)   | node inventory, TOML `[[node]]` tables (nodesfile.py)   |
|                           |           | (a node's `domain` key: only TAO_DOMAIN's read it)      |
| TAO_NODES                 | (empty)   | short form without KV events: `id=url,id=url`           |
| TAO_MAX_DELIVER           | 5         | deliveries of a failing message before dead-lettering   |
| TAO_ACK_WAIT_S            | 30        | JetStream redelivery after an unacked delivery, s (> 0) |
| TAO_RETRY_BACKOFF_S       | 0.5       | first nak delay after a handler error (doubles, <=10 s) |
| TAO_RUN_FILE              | (below)   | `tao up` run file; default $XDG_RUNTIME_DIR/tao/run.json|
|                           |           | or ~/.cache/tao/run.json                                |
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .access import redact
from .errors import SettingsError
from .nodesfile import (
    NodesFileError,
    NodeSpec,
    domain_nodes,
    load_nodes_file,
    url_root,
)
from .redisconn import CLUSTER_SCHEMES, is_cluster_url, startup_nodes
from .shard import ONE, Shard, parse_shard

__all__ = [
    "DEFAULT_MAX_BODY_ITEMS",
    "GATEWAY_AUTH",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "URL_FILES",
    "VARIABLES",
    "NodeSpec",
    "Settings",
    "url_root",
    "with_url_files",
]

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("json", "console")
GATEWAY_AUTH: Final = ("auto", "on", "off")
DEFAULT_MAX_BODY_ITEMS: Final = 1 << 19
"""Items a request body may hold by default (TAO_MAX_BODY_ITEMS): parsing that many holds the
GIL for about 70-140 ms (orjson, measured in docs/reliability.md "Abuse"), and a token-id
prompt of 512k tokens fits."""
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
_NAMESPACE_RE: Final = re.compile(r"[A-Za-z0-9_-]{0,64}")


@dataclass(frozen=True, slots=True)
class Settings:
    """Every TAO setting; build with :meth:`from_env` (``Settings()`` gives the defaults)."""

    nats_url: str | None = None
    redis_url: str | None = None
    namespace: str = ""
    domain: str = "default"
    tick_s: float = 1.0
    debounce_s: float = 0.0005
    policy: str = "tao"
    half_life_s: float = 10.0
    credit_unit: int = 256
    quantum: int = 512
    reserve_tokens: int = 512
    target_utilisation: float = 0.9
    horizon_s: float = 1.0
    freshness_s: float = 30.0
    scrape_s: float = 1.0
    planner_budget: int = 150_000
    planner_time_limit_ms: int = 200
    ta_interval_s: float = 5.0
    gateway_id: str = "gw0"
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8000
    gateway_domains: tuple[str, ...] = ()
    hold_timeout_s: float = 120.0
    retry_after_s: float = 2.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_body_items: int = DEFAULT_MAX_BODY_ITEMS
    max_compression_ratio: float = 100.0
    body_timeout_s: float = 10.0
    body_min_rate: float = 65536.0
    body_client_rate: float = 64e6  # chosen by a sweep: docs/reliability.md, Abuse
    body_client_burst: int = 0
    header_timeout_s: float = 10.0
    keepalive_s: float = 75.0
    max_connections: int = 4096
    max_held: int = 10_000
    max_held_bytes: int = 512 * 1024 * 1024
    tenants_file: str | None = None
    gateway_auth: str = "auto"
    gateway_key: str | None = field(default=None, repr=False)
    gateway_key_file: str | None = None
    state_dir: str | None = None
    hook_rate: float = 20.0
    hook_burst: int = 200
    hook_tenant_rate: float = 1000.0
    hook_tenant_burst: int = 5000
    node_api_key: str | None = None
    placement_key: str | None = None
    placement_keys: str | None = None
    idle_timeout_s: float = 300.0
    continuation_sessions: int = 100_000
    service_name: str | None = None
    instance: str | None = None
    lease_ttl_s: float = 2.0
    replicas: int = 1
    shard: Shard = ONE
    session_cache: int = 8192
    log_level: str = "info"
    log_format: str = "json"
    nodes: tuple[NodeSpec, ...] = field(default_factory=tuple)
    nodes_file: str | None = None
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    retry_backoff_s: float = 0.5
    run_file: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Parse every ``TAO_*`` variable in ``env``; SettingsError names the first bad one."""
        values: dict[str, Any] = {}
        env = with_url_files(env)
        for attr, (variable, parse) in _PARSERS.items():
            raw = env.get(variable, "").strip()
            if raw:
                values[attr] = parse(variable, raw)
        if "nodes_file" in values:
            nodes = _nodes_file(values["nodes_file"], "nodes" in values)
            served = values.get("gateway_domains") or (values.get("domain", "default"),)
            try:  # each served domain must have nodes; a gateway of several keeps them all
                for domain in served:
                    values["nodes"] = domain_nodes(nodes, domain)
            except ValueError as exc:
                raise SettingsError("TAO_NODES_FILE", values["nodes_file"], str(exc)) from None
            if len(served) > 1:
                values["nodes"] = nodes
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (tests, ``tao up`` filling in embedded URLs)."""
        return dataclasses.replace(self, **changes)


# --- parsers: (variable, raw) -> value, raising SettingsError -------------------------------

Parser = Callable[[str, str], Any]


def _number(*, lo: float, lo_open: bool, hi: float | None = None) -> Parser:
    bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
    if hi is not None:
        bound = f"in ({lo:g}, {hi:g}]" if lo_open else f"in [{lo:g}, {hi:g}]"

    def parse(variable: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > lo if lo_open else value >= lo)
        if ok and hi is not None:
            ok = value <= hi
        if not ok:
            raise SettingsError(variable, raw, f"must be a number {bound}")
        return value

    return parse


def _integer(*, lo: int, hi: int | None = None) -> Parser:
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"

    def parse(variable: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(variable, raw, f"must be an integer {bound}") from None
        if value < lo or (hi is not None and value > hi):
            raise SettingsError(variable, raw, f"must be an integer {bound}")
        return value

    return parse


def _choice(choices: tuple[str, ...]) -> Parser:
    def parse(variable: str, raw: str) -> str:
        value = raw.lower()
        if value not in choices:
            raise SettingsError(variable, raw, f"must be one of {', '.join(choices)}")
        return value

    return parse


def _policy(variable: str, raw: str) -> str:
    from shared.core.policies import POLICY_NAMES  # imported here: it loads numba

    if raw not in POLICY_NAMES:
        raise SettingsError(variable, raw, f"must be one of {', '.join(POLICY_NAMES)}")
    return raw


def _name(variable: str, raw: str) -> str:
    if not _NAME_RE.fullmatch(raw):
        raise SettingsError(variable, raw, "must match [A-Za-z0-9_-]{1,128}")
    return raw


def _domains(variable: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    for n in names:
        if not _NAMESPACE_RE.fullmatch(n):
            raise SettingsError(
                variable, raw, f"{n!r}: each domain must match [A-Za-z0-9_-]{{1,64}}"
            )
    if len(set(names)) != len(names):
        raise SettingsError(variable, raw, "a domain is listed twice")
    return names


def _namespace(variable: str, raw: str) -> str:
    if not _NAMESPACE_RE.fullmatch(raw):
        raise SettingsError(variable, raw, "must match [A-Za-z0-9_-]{0,64}")
    return raw


def _url(*schemes: str) -> Parser:
    def parse(variable: str, raw: str) -> str:
        scheme, sep, rest = raw.partition("://")
        if not sep or scheme.lower() not in schemes or not rest:
            raise SettingsError(
                variable, redact(raw), f"must be a URL with scheme {' or '.join(schemes)}"
            )
        return raw

    return parse


_REDIS_SCHEMES: Final = _url("redis", "rediss", "unix", "valkey", *CLUSTER_SCHEMES)


def _redis_url(variable: str, raw: str) -> str:
    """One server's URL, or a cluster URL whose startup nodes all read as ``host:port``."""
    url = str(_REDIS_SCHEMES(variable, raw))
    if is_cluster_url(url):
        try:
            startup_nodes(url)
        except SettingsError as exc:
            raise SettingsError(variable, redact(raw), exc.problem) from None
    return url


URL_FILES: Final = ("TAO_NATS_URL", "TAO_REDIS_URL")
"""Variables that may instead be read from the file ``<variable>_FILE`` names (the Docker
secrets convention): a URL with a role's password stays out of the environment."""


def with_url_files(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with each ``<variable>_FILE`` of :data:`URL_FILES` read into ``<variable>``."""
    out: dict[str, str] | None = None
    for variable in URL_FILES:
        path = env.get(f"{variable}_FILE", "").strip()
        if not path:
            continue
        if env.get(variable, "").strip():
            raise SettingsError(f"{variable}_FILE", path, f"set either {variable} or this")
        try:
            value = open(path, encoding="utf-8").read().strip()  # noqa: SIM115 - one read
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{variable}_FILE", path, f"cannot read: {exc}") from None
        if not value:
            raise SettingsError(f"{variable}_FILE", path, "the file is empty")
        out = dict(env) if out is None else out
        out[variable] = value
    return env if out is None else out


def _text(variable: str, raw: str) -> str:
    return raw


def _nodes(variable: str, raw: str) -> tuple[NodeSpec, ...]:
    nodes: list[NodeSpec] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        node_id, sep, url = item.partition("=")
        node_id, url = node_id.strip(), url.strip()
        if not sep or not _NAME_RE.fullmatch(node_id) or "://" not in url:
            raise SettingsError(
                variable, raw, f"entry {item!r} is not id=url (id [A-Za-z0-9_-], url http://…)"
            )
        if any(n.id == node_id for n in nodes):
            raise SettingsError(variable, raw, f"node id {node_id!r} appears twice")
        nodes.append(NodeSpec(node_id, url.rstrip("/")))
    return tuple(nodes)


def _nodes_file(path: str, also_inline: bool) -> tuple[NodeSpec, ...]:
    if also_inline:
        raise SettingsError("TAO_NODES_FILE", path, "set either TAO_NODES or TAO_NODES_FILE")
    try:
        return load_nodes_file(path)
    except NodesFileError as exc:
        raise SettingsError("TAO_NODES_FILE", path, exc.reason) from None


_POSITIVE: Final = _number(lo=0.0, lo_open=True)


def _shard(variable: str, raw: str) -> Shard:
    try:
        return parse_shard(raw)
    except ValueError as exc:
        raise SettingsError(variable, raw, str(exc).split(", got")[0]) from None


def _lease_ttl(variable: str, raw: str) -> float:
    value = _number(lo=0.0, lo_open=False)(variable, raw)
    if 0 < value < 0.2:
        raise SettingsError(variable, raw, "must be 0 (no election) or a number >= 0.2")
    return float(value)


_PARSERS: Final[dict[str, tuple[str, Parser]]] = {
    "nats_url": ("TAO_NATS_URL", _url("nats", "tls", "ws", "wss")),
    "redis_url": ("TAO_REDIS_URL", _redis_url),
    "namespace": ("TAO_NAMESPACE", _namespace),
    "domain": ("TAO_DOMAIN", _name),
    "tick_s": ("TAO_TICK_S", _POSITIVE),
    "debounce_s": ("TAO_DEBOUNCE_S", _number(lo=0.0, lo_open=False)),
    "policy": ("TAO_POLICY", _policy),
    "half_life_s": ("TAO_HALF_LIFE_S", _POSITIVE),
    "credit_unit": ("TAO_CREDIT_UNIT", _integer(lo=1)),
    "quantum": ("TAO_QUANTUM", _integer(lo=1)),
    "reserve_tokens": ("TAO_RESERVE_TOKENS", _integer(lo=0)),
    "target_utilisation": ("TAO_TARGET_UTILISATION", _number(lo=0.0, lo_open=True, hi=1.0)),
    "horizon_s": ("TAO_HORIZON_S", _POSITIVE),
    "freshness_s": ("TAO_FRESHNESS_S", _POSITIVE),
    "scrape_s": ("TAO_SCRAPE_S", _POSITIVE),
    "planner_budget": ("TAO_PLANNER_BUDGET", _integer(lo=1)),
    "planner_time_limit_ms": ("TAO_PLANNER_TIME_LIMIT_MS", _integer(lo=1)),
    "ta_interval_s": ("TAO_TA_INTERVAL_S", _POSITIVE),
    "gateway_id": ("TAO_GATEWAY_ID", _name),
    "gateway_domains": ("TAO_GATEWAY_DOMAINS", _domains),
    "gateway_host": ("TAO_GATEWAY_HOST", _text),
    "gateway_port": ("TAO_GATEWAY_PORT", _integer(lo=0, hi=65535)),
    "hold_timeout_s": ("TAO_HOLD_TIMEOUT_S", _POSITIVE),
    "retry_after_s": ("TAO_RETRY_AFTER_S", _POSITIVE),
    "max_body_bytes": ("TAO_MAX_BODY_BYTES", _integer(lo=1024)),
    "max_body_items": ("TAO_MAX_BODY_ITEMS", _integer(lo=1)),
    "max_compression_ratio": ("TAO_MAX_COMPRESSION_RATIO", _number(lo=1.0, lo_open=False)),
    "body_timeout_s": ("TAO_BODY_TIMEOUT_S", _POSITIVE),
    "body_min_rate": ("TAO_BODY_MIN_RATE", _POSITIVE),
    "body_client_rate": ("TAO_BODY_CLIENT_RATE", _number(lo=0.0, lo_open=False)),
    "body_client_burst": ("TAO_BODY_CLIENT_BURST", _integer(lo=0)),
    "header_timeout_s": ("TAO_HEADER_TIMEOUT_S", _POSITIVE),
    "keepalive_s": ("TAO_KEEPALIVE_S", _POSITIVE),
    "max_connections": ("TAO_MAX_CONNECTIONS", _integer(lo=1)),
    "max_held": ("TAO_MAX_HELD", _integer(lo=1)),
    "max_held_bytes": ("TAO_MAX_HELD_BYTES", _integer(lo=1)),
    "tenants_file": ("TAO_TENANTS_FILE", _text),
    "gateway_auth": ("TAO_GATEWAY_AUTH", _choice(GATEWAY_AUTH)),
    "gateway_key": ("TAO_GATEWAY_KEY", _text),
    "gateway_key_file": ("TAO_GATEWAY_KEY_FILE", _text),
    "state_dir": ("TAO_STATE_DIR", _text),
    "hook_rate": ("TAO_HOOK_RATE", _POSITIVE),
    "hook_burst": ("TAO_HOOK_BURST", _integer(lo=1)),
    "hook_tenant_rate": ("TAO_HOOK_TENANT_RATE", _POSITIVE),
    "hook_tenant_burst": ("TAO_HOOK_TENANT_BURST", _integer(lo=1)),
    "node_api_key": ("TAO_NODE_API_KEY", _text),
    "placement_key": ("TAO_PLACEMENT_KEY", _text),
    "placement_keys": ("TAO_PLACEMENT_KEYS", _text),
    "idle_timeout_s": ("TAO_IDLE_TIMEOUT_S", _POSITIVE),
    "continuation_sessions": ("TAO_CONTINUATION_SESSIONS", _integer(lo=0)),
    "service_name": ("TAO_SERVICE_NAME", _name),
    "instance": ("TAO_INSTANCE", _name),
    "lease_ttl_s": ("TAO_LEASE_TTL_S", _lease_ttl),
    "replicas": ("TAO_REPLICAS", _integer(lo=1, hi=5)),
    "shard": ("TAO_SHARD", _shard),
    "session_cache": ("TAO_SESSION_CACHE", _integer(lo=0)),
    "log_level": ("TAO_LOG_LEVEL", _choice(LOG_LEVELS)),
    "log_format": ("TAO_LOG_FORMAT", _choice(LOG_FORMATS)),
    "nodes": ("TAO_NODES", _nodes),
    "nodes_file": ("TAO_NODES_FILE", _text),
    "max_deliver": ("TAO_MAX_DELIVER", _integer(lo=1)),
    "ack_wait_s": ("TAO_ACK_WAIT_S", _POSITIVE),
    "retry_backoff_s": ("TAO_RETRY_BACKOFF_S", _number(lo=0.0, lo_open=False)),
    "run_file": ("TAO_RUN_FILE", _text),
}
"""Settings attribute -> (environment variable, parser). Unset or empty: the field default."""

VARIABLES: Final[tuple[str, ...]] = (
    *(variable for variable, _ in _PARSERS.values()),
    *(f"{variable}_FILE" for variable in URL_FILES),
)
