"""Who may publish, subscribe and touch which keys: one NATS user and one Redis user per role.

Without it, anyone who reaches NATS can publish hook payloads for any tenant or placements for
any gateway, and anyone who reaches Redis can write an admission the gateway then serves. With
it (the default of ``tao up`` and compose), each service connects as its own user and may do
only what its code does:

======== ================================================ ======================================
role     NATS: publishes (and consumes)                   Redis
======== ================================================ ======================================
telemetry node status, dead letters; consumes session      writes nodes and residency, reads the
         events and KV events; answers ``inspect``        rest
tools    wake-ups, session ends, dead letters; consumes   writes sessions, their index sets and
         session, tool and hook events                    tool statistics, reads nodes
valuation snapshots, idle sessions' ends, domain loads,   writes probe marks and idle ends on
         dead letters; subscribes to wake-ups and plans   sessions, reads the rest
planner  **placements** (the only role that may), plans,  writes sessions, nodes' reservations,
         replan wake-ups, dead letters; subscribes to     the planner's counters
         snapshots
gateway  session events, hook payloads (its ``POST        **read only**: it cannot admit a
         /hooks``), dead letters; placements, node        session by writing the store
         status, session ends, domain loads
hook     **hook payloads only** (``tao hook``,            none
         mini-swe-agent's environment)
ops      the operator's CLIs: tool events (``tao demo``,  reads everything
         as a hook would), KV events (``tao kv-bridge``,
         which creates the streams if they are not
         there), ``inspect`` requests (``tao inspect``)
admin    everything (tests, an operator's repair)          everything
======== ================================================ ======================================

Each grant is what the role's code does, no more: ``tests/grant_uses.py`` reads every publish,
subscription, consumer, stream and lease call of each role's code, and
``tests/unit/infra/test_access.py`` (``TestGrantsMatchTheCode``) checks them against
:data:`NATS_GRANTS` and the rendered permissions, both ways. The JetStream API subjects are
the ones ``Bus`` calls (nats-py 2.x; ``tests/integration/test_access_grants.py`` records them
on a server): creating or updating the streams ``STREAM.INFO`` / ``CREATE`` / ``UPDATE``; a durable
consumer ``CONSUMER.DURABLE.CREATE`` and ``CONSUMER.INFO``, an ephemeral one
``CONSUMER.CREATE``, and acks on ``$JS.ACK``; the lease bucket ``STREAM.INFO`` / ``CREATE`` /
``MSG.GET`` of its stream (``DIRECT.GET`` when the bucket allows direct reads) and its
``$KV`` subjects.

Every role but ``admin`` gets its replies on an inbox of its own (``_INBOX_<role>.>``, set by
:class:`~shared.infra.bus.Bus` from the URL's user name), so no role can read another's
JetStream deliveries or replies. The ``default`` Redis user is left able to ``PING`` only (health
checks); NATS refuses a client without a user.

Files (:func:`write_access_dir`, ``tao keys access``), in one folder (mode 0700):

* ``nats.conf``: the ``authorization`` block, for ``nats-server -c`` (plain passwords, mode
  0600: the server compares them; an operator's own config may ``include`` it);
* ``users.acl``: Valkey/Redis ACL file (``--aclfile``), passwords as SHA-256 digests (0644);
* ``<role>.nats-url`` and ``<role>.redis-url``: the URL each role connects with, credentials
  included (0600), read by ``TAO_NATS_URL_FILE`` / ``TAO_REDIS_URL_FILE``;
* ``access.toml``: the roles' passwords, the namespace and the servers' addresses the URLs name
  (0600), so that ``--if-missing`` keeps them and a new namespace can be added.

Rotation: run ``tao keys access --rotate ROLE`` (a new password in every file), reload the
servers (``nats-server --signal reload``, ``ACL LOAD``) and restart that role's services.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final
from urllib.parse import quote, urlsplit, urlunsplit

from shared.contracts import subjects
from shared.contracts.subjects import Stream

from .errors import ConfigFileError
from .redisconn import is_cluster_url

__all__ = [
    "ACCESS_FILE",
    "ADMIN",
    "CA_FILE",
    "NATS_CONF",
    "REDIS_ACL",
    "ROLES",
    "SERVICE_ROLES",
    "TLS_SERVERS",
    "Access",
    "AccessFileError",
    "NatsGrant",
    "RedisGrant",
    "inbox_prefix",
    "nats_authorization",
    "read_access_dir",
    "redact",
    "redis_acl",
    "role_url",
    "write_access_dir",
]

ACCESS_FILE: Final = "access.toml"
NATS_CONF: Final = "nats.conf"
REDIS_ACL: Final = "users.acl"
ADMIN: Final = "admin"
CA_FILE: Final = "ca.pem"
CA_KEY: Final = "ca-key.pem"
SERVER_CERT: Final = "server.pem"
SERVER_KEY: Final = "server-key.pem"
CERT_DAYS: Final = 825
TLS_SERVERS: Final = ("nats", "redis")


class AccessFileError(ConfigFileError):
    """An access folder that cannot be read or written; names the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class NatsGrant:
    """What one role may do on NATS, in plain (namespace-less) subjects."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    consumes: tuple[Stream, ...] = ()
    """Streams it runs durable JetStream consumers on (create, info, acks)."""
    ephemeral: tuple[Stream, ...] = ()
    """Streams it runs ephemeral JetStream consumers on (create, acks)."""
    streams: bool = True
    """May create and update TAO's streams (whatever runs as a service does at start-up)."""
    responds: bool = False
    """Answers requests (``inspect``): may publish on the requester's reply subject."""
    leases: bool = False
    """Takes part in leader election: may create, read and write the lease bucket."""
    everything: bool = False


@dataclass(frozen=True, slots=True)
class RedisGrant:
    """What one role may do on Redis: key patterns it may write, and whether it may read all."""

    writes: tuple[str, ...] = ()
    """Key kinds (after ``tao:{<domain>}:``) it may write; ``*`` is every key."""
    reads: bool = True


_DLQ = subjects.dead_letters()
_S = subjects

NATS_GRANTS: Final[Mapping[str, NatsGrant]] = {
    "telemetry": NatsGrant(
        publish=(_S.node_statuses(), _DLQ),
        subscribe=(f"{_S.PREFIX}.inspect.*",),
        consumes=(_S.STREAM_SESSION,),
        ephemeral=(_S.STREAM_KV,),
        responds=True,
    ),
    "tools": NatsGrant(
        publish=(_S.wake(), _S.session_events("end"), _DLQ),
        consumes=(_S.STREAM_SESSION, _S.STREAM_TOOL, _S.STREAM_HOOK),
    ),
    "valuation": NatsGrant(
        publish=(_S.valuation_snapshot(), _S.session_events("end"), _S.domain_load(), _DLQ),
        subscribe=(_S.wake(), _S.plan()),
        leases=True,
    ),
    "planner": NatsGrant(
        publish=(_S.placements(), _S.plan(), _S.wake(), _DLQ),
        subscribe=(_S.valuation_snapshot(),),
        leases=True,
    ),
    "gateway": NatsGrant(
        publish=(_S.session_events(), _S.hook_events_all(), _DLQ),
        subscribe=(_S.node_statuses(), _S.session_events("end"), _S.domain_load()),
        ephemeral=(_S.STREAM_PLACEMENT,),
    ),
    "hook": NatsGrant(publish=(_S.hook_events_all(),), streams=False),
    "ops": NatsGrant(publish=(_S.tool_events(), _S.kv_events_all(), f"{_S.PREFIX}.inspect.*")),
    ADMIN: NatsGrant(everything=True),
}

_SESSION_KEYS: Final = ("s:*", "sessions", "pool", "admitted_tool", "res:*", "nres:*", "chain:*")
"""A session's record, its index sets and what its end deletes (residency, block chain)."""

REDIS_GRANTS: Final[Mapping[str, RedisGrant]] = {
    "telemetry": RedisGrant(writes=("n:*", "nodes", "res:*", "nres:*", "chain:*", "chains")),
    "tools": RedisGrant(writes=(*_SESSION_KEYS, "chains", "toolstats", "n:*")),
    "valuation": RedisGrant(writes=(*_SESSION_KEYS, "chains", "n:*")),
    "planner": RedisGrant(
        # "sessions": the batch write names the session index among its keys (a ThunderAgent
        # resume admits through it: services/planner/thunder_apply.py); the planner adds none
        writes=("s:*", "sessions", "pool", "admitted_tool", "n:*", "planner", "solve_ms", "ready")
    ),
    "gateway": RedisGrant(),
    "hook": RedisGrant(reads=False),
    "ops": RedisGrant(),
    ADMIN: RedisGrant(writes=("*",)),
}

ROLES: Final = tuple(NATS_GRANTS)
SERVICE_ROLES: Final = ("telemetry", "tools", "valuation", "planner", "gateway")
"""The roles ``tao up`` and compose start a service as (the service's own name)."""


def inbox_prefix(user: str) -> str:
    """The reply inbox of a role's clients (``_INBOX_<user>``; its permissions allow only it)."""
    return f"_INBOX_{user}"


def _ns_subject(namespace: str, subject: str) -> str:
    return f"{namespace}.{subject}" if namespace else subject


def _ns_stream(namespace: str, stream: Stream) -> str:
    return f"{namespace}_{stream.name}" if namespace else stream.name


def _nats_permissions(role: str, namespaces: Iterable[str]) -> dict[str, object]:
    grant = NATS_GRANTS[role]
    if grant.everything:
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    pub: list[str] = []
    sub: list[str] = [f"{inbox_prefix(role)}.>"]
    for ns in namespaces:
        pub += [_ns_subject(ns, s) for s in grant.publish]
        sub += [_ns_subject(ns, s) for s in grant.subscribe]
        if grant.streams:  # Bus.ensure_streams: info, then create or update
            for verb in ("INFO", "CREATE", "UPDATE"):
                pub += [f"$JS.API.STREAM.{verb}.{_ns_stream(ns, s)}" for s in subjects.ALL_STREAMS]
        if grant.leases:  # Bus.lease_table and the lease's KV operations
            bucket = subjects.lease_bucket(ns)
            kv = f"KV_{bucket}"
            pub += [f"$JS.API.STREAM.INFO.{kv}", f"$JS.API.STREAM.CREATE.{kv}"]
            pub += [f"$KV.{bucket}.>", f"$JS.API.STREAM.MSG.GET.{kv}"]
            pub += [f"$JS.API.DIRECT.GET.{kv}.>"]  # a bucket made with direct reads allowed
        for stream in grant.consumes:  # durable consumers: (re)created by name, read back
            name = _ns_stream(ns, stream)
            pub += [f"$JS.API.CONSUMER.DURABLE.CREATE.{name}.*", f"$JS.API.CONSUMER.INFO.{name}.*"]
            pub += [f"$JS.ACK.{name}.>"]
        for stream in grant.ephemeral:  # ephemeral consumers: named by the server
            name = _ns_stream(ns, stream)
            pub += [f"$JS.API.CONSUMER.CREATE.{name}", f"$JS.ACK.{name}.>"]
    perms: dict[str, object] = {
        "publish": {"allow": sorted(set(pub))},
        "subscribe": {"allow": sorted(set(sub))},
    }
    if grant.responds:
        perms["allow_responses"] = True
    return perms


def _nats_quote(value: str) -> str:
    """A NATS config string literal (the format takes JSON strings)."""
    import json

    return json.dumps(value)


def nats_authorization(passwords: Mapping[str, str], namespaces: Iterable[str]) -> str:
    """The ``authorization { users = [...] }`` block of ``nats-server``'s config for these
    roles' passwords, their permissions covering each of ``namespaces`` ("" for none)."""
    import json

    spaces = tuple(dict.fromkeys(namespaces)) or ("",)
    lines = [
        "# TAO's NATS users, one per role (shared/infra/access.py; `tao keys access` writes it)",
        "authorization {",
        "  users = [",
    ]
    for role in ROLES:
        if role not in passwords:
            continue
        perms = json.dumps(_nats_permissions(role, spaces), separators=(", ", ": "))
        lines.append(
            f"    {{user: {_nats_quote(role)}, password: {_nats_quote(passwords[role])}, "
            f"permissions: {perms}}}"
        )
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def redis_acl(passwords: Mapping[str, str]) -> str:
    """A Valkey/Redis ACL file for these roles (SHA-256 digests, never the passwords); the
    ``default`` user may only ``PING`` (health checks), with no key."""
    lines = [
        "user default on nopass resetkeys resetchannels -@all +ping",
    ]
    for role in ROLES:
        if role not in passwords:
            continue
        grant = REDIS_GRANTS[role]
        digest = hashlib.sha256(passwords[role].encode()).hexdigest()
        rule = [f"user {role} on #{digest} resetkeys resetchannels"]
        if "*" in grant.writes:
            rule += ["~*", "&*", "+@all"]
        elif not grant.reads:
            rule += ["-@all"]
        else:
            rule += ["%R~tao:*"]
            rule += [f"%RW~tao:{{*}}:{kind}" for kind in grant.writes]
            rule += ["-@all", "+@read", "+@connection", "+@scripting", "+@transaction"]
            if grant.writes:
                rule += ["+@write"]
            rule += ["-@dangerous", "+info", "+script|load", "+script|exists"]
            rule += ["+cluster|slots", "+cluster|shards"]  # a Redis Cluster's slot map (@slow)
            rule += ["+client|setname", "+ping"]
        lines.append(" ".join(rule))
    return "\n".join(lines) + "\n"


def redact(url: str) -> str:
    """``url`` without its password (for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def role_url(url: str, role: str, password: str) -> str:
    """``url`` (no credentials) with ``role`` and ``password`` as its user information: on each
    server of a comma-separated list (NATS: ``nats://a:4222,nats://b:4222``), once on a Redis
    Cluster URL (``redis+cluster://a:6379,b:6379``: one user information for all its hosts)."""
    if is_cluster_url(url):
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2]
        netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{hosts}"
        return urlunsplit(parts._replace(netloc=netloc))
    if "," in url:
        return ",".join(role_url(u.strip(), role, password) for u in url.split(",") if u.strip())
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True, slots=True)
class Access:
    """The roles' passwords and where the servers are, as an access folder records them."""

    passwords: Mapping[str, str]
    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    namespaces: tuple[str, ...] = ("",)
    tls: tuple[str, ...] = ()
    """The servers that take TLS only (``nats``, ``redis``): their URLs say so (``tls://``,
    ``rediss://``) and name the folder's CA; the folder holds the CA and a server certificate."""
    folder: str = ""
    """Where the folder is (the URLs name its ``ca.pem``); set by :func:`write_access_dir`."""

    @classmethod
    def new(
        cls,
        nats_url: str = "nats://127.0.0.1:4222",
        redis_url: str = "redis://127.0.0.1:6379/0",
        namespaces: Iterable[str] = ("",),
        tls: Iterable[str] = (),
    ) -> Access:
        """Fresh 256-bit random passwords for every role."""
        wanted = tuple(dict.fromkeys(tls))
        unknown = [t for t in wanted if t not in TLS_SERVERS]
        if unknown:
            raise ValueError(f"unknown TLS server {unknown[0]!r} (one of {', '.join(TLS_SERVERS)})")
        return cls(
            {role: secrets.token_urlsafe(32) for role in ROLES},
            nats_url,
            redis_url,
            tuple(dict.fromkeys(namespaces)) or ("",),
            wanted,
        )

    def rotated(self, role: str) -> Access:
        """A new password for ``role``; every other stays."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r} (roles: {', '.join(ROLES)})")
        return replace(self, passwords={**self.passwords, role: secrets.token_urlsafe(32)})

    @property
    def ca(self) -> str:
        """The CA file the TLS URLs name."""
        return str(Path(self.folder) / CA_FILE)

    def nats(self, role: str) -> str:
        """The NATS URL ``role`` connects with."""
        url = role_url(self.nats_url, role, self.passwords[role])
        if "nats" not in self.tls:
            return url
        query = f"ca={quote(self.ca)}"
        return ",".join(
            urlunsplit(urlsplit(u)._replace(scheme="tls", query=query)) for u in url.split(",")
        )

    def redis(self, role: str) -> str:
        """The Redis URL ``role`` connects with."""
        url = role_url(self.redis_url, role, self.passwords[role])
        if "redis" not in self.tls:
            return url
        query = f"ssl_ca_certs={quote(self.ca)}"
        return urlunsplit(urlsplit(url)._replace(scheme="rediss", query=query))


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def write_access_dir(access: Access, folder: str | Path) -> Path:
    """Write every file of the access folder (see the module docstring); returns it."""
    root = Path(folder).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # the servers' containers read nats.conf / users.acl from it
    access = replace(access, folder=str(root))
    record = ["# TAO access: the roles' passwords (tao keys access; keep secret)"]
    record.append(f"nats_url = {_nats_quote(access.nats_url)}")
    record.append(f"redis_url = {_nats_quote(access.redis_url)}")
    record.append(f"namespaces = [{', '.join(_nats_quote(ns) for ns in access.namespaces)}]")
    record.append(f"tls = [{', '.join(_nats_quote(t) for t in access.tls)}]")
    record.append("[passwords]")
    record += [f"{role} = {_nats_quote(pw)}" for role, pw in access.passwords.items()]
    _write(root / ACCESS_FILE, "\n".join(record) + "\n", 0o600)
    conf = nats_authorization(access.passwords, access.namespaces)
    if access.tls:
        hosts = (urlsplit(access.nats_url).hostname, urlsplit(access.redis_url).hostname)
        _certificates(root, hosts)
    if "nats" in access.tls:
        conf += _nats_tls(root)
    _write(root / NATS_CONF, conf, 0o600)
    _write(root / REDIS_ACL, redis_acl(access.passwords), 0o644)
    for role in access.passwords:
        _write(root / f"{role}.nats-url", access.nats(role) + "\n", 0o600)
        _write(root / f"{role}.redis-url", access.redis(role) + "\n", 0o600)
    return root


def read_access_dir(folder: str | Path) -> Access:
    """The access folder's record; :class:`AccessFileError` naming what is wrong."""
    path = Path(folder).expanduser() / ACCESS_FILE
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AccessFileError(str(path), "not found (run `tao keys access`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessFileError(str(path), f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AccessFileError(str(path), f"not TOML: {exc}") from None
    pw = doc.get("passwords")
    if not isinstance(pw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in pw.items()
    ):
        raise AccessFileError(str(path), "[passwords] must map roles to non-empty strings")
    unknown = sorted(set(pw) - set(ROLES))
    if unknown:
        raise AccessFileError(str(path), f"unknown role {unknown[0]!r} in [passwords]")
    spaces = doc.get("namespaces", [""])
    if not isinstance(spaces, list) or not all(isinstance(s, str) for s in spaces):
        raise AccessFileError(str(path), "namespaces must be a list of strings")
    urls = {k: doc.get(k) for k in ("nats_url", "redis_url")}
    for key, value in urls.items():
        if not isinstance(value, str) or "://" not in value:
            raise AccessFileError(str(path), f"{key} must be a URL")
    tls = doc.get("tls", [])
    if not isinstance(tls, list) or not all(t in TLS_SERVERS for t in tls):
        raise AccessFileError(str(path), f"tls must list servers of {', '.join(TLS_SERVERS)}")
    return Access(
        dict(pw),
        str(urls["nats_url"]),
        str(urls["redis_url"]),
        tuple(spaces) or ("",),
        tuple(tls),
        str(path.parent.resolve()),
    )


def _nats_tls(root: Path) -> str:
    """The ``tls {}`` block: the server certificate; clients verify it with the CA."""
    files = {"cert_file": SERVER_CERT, "key_file": SERVER_KEY, "ca_file": CA_FILE}
    body = ", ".join(f"{k}: {_nats_quote(str(root / v))}" for k, v in files.items())
    return f"tls {{{body}, timeout: 2}}\n"


def _certificates(root: Path, hosts: Iterable[str | None]) -> None:
    """A CA and a server certificate signed by it, for ``hosts`` and loopback, unless the
    folder has them (a rotation keeps them; delete them to make new ones)."""
    if (root / CA_FILE).exists() and (root / SERVER_CERT).exists():
        return
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "TAO access CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
    for host in dict.fromkeys(h for h in hosts if h):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "TAO servers")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(list(dict.fromkeys(names))), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    raw = serialization.PrivateFormat.PKCS8
    none = serialization.NoEncryption()
    _write(root / CA_KEY, ca_key.private_bytes(pem, raw, none).decode(), 0o600)
    _write(root / SERVER_KEY, key.private_bytes(pem, raw, none).decode(), 0o600)
    _write(root / CA_FILE, ca.public_bytes(pem).decode(), 0o644)
    _write(root / SERVER_CERT, cert.public_bytes(pem).decode(), 0o644)
