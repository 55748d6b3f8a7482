"""What each NATS role's code does on the bus, read from the code (for the grant checks).

:func:`role_uses` reads every call that reaches NATS in the code each role runs (its Python
syntax tree; nothing is imported or run): ``publish`` / ``publish_msg`` / ``request`` /
``subscribe`` / ``serve`` / ``consume`` / ``consume_batch`` / ``ensure_streams`` /
``lease_table`` on a bus, the hook client's ``publish``, the shared runners (which create the
streams) and the lease helper. A call's subject is read where it is written, from the helpers
of :mod:`shared.contracts.subjects` (``subjects.wake()``, ``subjects.placement(gw)``: each
argument not written out as a constant becomes ``x``) or from the message class constructed in
the call (``publish_msg(SessionEnd(...))``); a call whose subject is made elsewhere is named in
:data:`MADE_ELSEWHERE`, with what it publishes, and a check keeps that list equal to the calls
found. Rules of the bus itself: a role that subscribes or consumes may dead-letter
(:class:`~shared.infra.receiver.Receiver`); ``serve`` answers requests.

:func:`api_calls` turns a role's uses into the subjects its client publishes to on the wire,
JetStream API included, as ``Bus`` on nats-py 2.x makes them (``tests/integration/
test_access_grants.py`` records them on a server to keep this table true).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shared.contracts import (
    DeadLetter,
    DomainLoadReport,
    Message,
    NodeStatus,
    Placement,
    SessionCancel,
    SessionEnd,
    SessionRequest,
    SessionResponse,
    subjects,
)
from shared.contracts.subjects import ALL_STREAMS, Stream
from tests.unit.contracts.test_contract_messages import SAMPLES

ROOT: Final = Path(__file__).resolve().parents[1]

ROLE_CODE: Final[Mapping[str, tuple[str, ...]]] = {
    "telemetry": ("services/telemetry",),
    "tools": ("services/tools",),
    "valuation": ("services/valuation",),
    "planner": ("services/planner",),
    "gateway": ("services/gateway",),
    "hook": ("shared/harness",),
    "ops": ("shared/cli/demo.py", "shared/cli/inspect.py", "shared/cli/kvbridge.py"),
}
"""The code each role runs: a service as its own user; ``tao hook`` and mini-swe-agent's
environment (the hook client) as ``hook``; the operator's CLIs that reach NATS as ``ops``
(compose's ``kv-bridge`` and ``demo``, and the run file of ``tao up`` that ``tao inspect``,
``tao demo`` and ``tao kv-bridge`` read)."""
SCANNED: Final = ("services", "shared/cli", "shared/harness")
"""Where NATS may be reached from: a file there that does must belong to a role (or be
:data:`HELPERS`)."""
HELPERS: Final = frozenset({"services/_common.py"})
"""Code a role runs through a call the scan sees: ``leadership()`` (the lease)."""

BUS_METHODS: Final = frozenset(
    {"publish", "publish_msg", "request", "subscribe", "serve", "consume", "consume_batch",
     "ensure_streams", "lease_table"}
)  # fmt: skip
RUNNERS: Final = frozenset({"run_service", "run_service_async"})
"""The shared service runner: it connects the bus and creates or updates the streams."""

MADE_ELSEWHERE: Final[Mapping[tuple[str, str], tuple[type[Message] | str, ...]]] = {
    ("services/gateway/hooks.py", "HookForwarder._publish_all"): (subjects.hook_events("x"),),
    ("services/gateway/relay.py", "Relay._publish"): (
        SessionRequest,
        SessionResponse,
        SessionCancel,
        SessionEnd,
    ),
    ("services/planner/handlers.py", "Planner._publish"): (Placement,),
    ("services/telemetry/handlers.py", "NodeScrapers.scrape_one"): (NodeStatus,),
    ("services/tools/hooks.py", "HookIngest.on_hook_batch"): (SessionEnd,),
    ("services/tools/hooks.py", "HookIngest._reject"): (DeadLetter,),
    ("services/valuation/handlers.py", "Valuator._report_load"): (DomainLoadReport,),
    ("shared/cli/kvbridge.py", "bridge"): (subjects.kv_events("x"),),
    ("shared/harness/hookclient.py", "_drain_once"): (subjects.hook_events("x"),),
    ("shared/harness/hookclient.py", "_forward"): (subjects.hook_events("x"),),
    ("shared/harness/miniswe_env.py", "nats_sink.send"): (subjects.hook_events("x"),),
}
"""Calls whose subject or message is made elsewhere in the code, and what they publish:
(file, function) → message classes or subjects."""

_SUBJECT_OF: Final = {type(m): subjects.subject_for(m) for m in SAMPLES}


@dataclass(frozen=True, slots=True)
class Site:
    """One call that reaches NATS."""

    path: str
    scope: str
    line: int
    method: str
    target: str | Stream | None
    """The subject (or subscription pattern) or the stream; ``None`` when made elsewhere."""
    ephemeral: bool = False


@dataclass(slots=True)
class Uses:
    """What one role's code does on NATS, in the terms of :class:`~shared.infra.access.NatsGrant`
    (plain subjects: no namespace)."""

    publish: set[str] = field(default_factory=set)
    subscribe: set[str] = field(default_factory=set)
    consumes: set[Stream] = field(default_factory=set)
    ephemeral: set[Stream] = field(default_factory=set)
    streams: bool = False
    responds: bool = False
    leases: bool = False
    sites: list[Site] = field(default_factory=list)


def _subject(call: ast.expr) -> str | Stream | None:
    """The subject or stream an argument names, when it is written at the call."""
    if isinstance(call, ast.Attribute) and ast.unparse(call.value) == "subjects":
        value = getattr(subjects, call.attr)
        return value if isinstance(value, Stream) else None
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    if isinstance(func, ast.Attribute) and ast.unparse(func.value) == "subjects":
        args = [a.value if isinstance(a, ast.Constant) else "x" for a in call.args]
        out = getattr(subjects, func.attr)(*args)
        assert isinstance(out, str)
        return out
    if isinstance(func, ast.Name):  # publish_msg(SessionEnd(...))
        kind = next((t for t in _SUBJECT_OF if t.__name__ == func.id), None)
        return _SUBJECT_OF[kind] if kind is not None else None
    return None


class _Scan(ast.NodeVisitor):
    def __init__(self, path: str, hook_client: bool) -> None:
        self.path = path
        self.hook_client = hook_client
        self.scope: list[str] = []
        self.found: list[Site] = []

    def _enter(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _enter

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        method: str | None = None
        hook = False  # the hook client's publish(url, subject, ...)
        if isinstance(func, ast.Attribute):
            receiver = ast.unparse(func.value)
            if func.attr in BUS_METHODS and "bus" in receiver.lower():
                method = func.attr
            elif func.attr == "publish" and receiver == "hookclient":
                method, hook = "publish", True
        elif isinstance(func, ast.Name):
            if func.id in RUNNERS or func.id == "leadership":
                method = func.id
            elif func.id == "publish" and self.hook_client:
                method, hook = "publish", True
        if method is not None:
            target = None
            args = node.args[1:2] if hook else node.args[:1]
            if args:
                target = _subject(args[0])
            ephemeral = any(
                k.arg == "ephemeral" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords
            )
            self.found.append(
                Site(self.path, ".".join(self.scope), node.lineno, method, target, ephemeral)
            )
        self.generic_visit(node)


def sites_in(path: Path) -> list[Site]:
    """The calls of one file that reach NATS."""
    rel = path.relative_to(ROOT).as_posix()
    scan = _Scan(rel, hook_client=rel == "shared/harness/hookclient.py")
    scan.visit(ast.parse(path.read_text(encoding="utf-8"), rel))
    return scan.found


def code_files(where: str) -> list[Path]:
    """The Python files of ``where`` (a file or a folder, from the repository's root)."""
    path = ROOT / where
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def all_sites() -> dict[str, list[Site]]:
    """Every file of :data:`SCANNED` that reaches NATS, and its calls."""
    out: dict[str, list[Site]] = {}
    for where in SCANNED:
        for path in code_files(where):
            found = sites_in(path)
            if found:
                out[path.relative_to(ROOT).as_posix()] = found
    return out


def role_uses() -> dict[str, Uses]:
    """What each role of :data:`ROLE_CODE` does on NATS (module docstring)."""
    out: dict[str, Uses] = {}
    for role, code in ROLE_CODE.items():
        uses = Uses()
        for where in code:
            for path in code_files(where):
                uses.sites += sites_in(path)
        for site in uses.sites:
            targets: tuple[str | Stream | type[Message], ...]
            if site.target is not None:
                targets = (site.target,)
            else:
                targets = MADE_ELSEWHERE.get((site.path, site.scope), ())
            subjects_ = [_SUBJECT_OF[t] if isinstance(t, type) else t for t in targets]
            if site.method in ("publish", "publish_msg", "request"):
                uses.publish.update(s for s in subjects_ if isinstance(s, str))
            elif site.method in ("subscribe", "serve"):
                uses.subscribe.update(s for s in subjects_ if isinstance(s, str))
                uses.responds |= site.method == "serve"
            elif site.method in ("consume", "consume_batch"):
                streams = [s for s in subjects_ if isinstance(s, Stream)]
                (uses.ephemeral if site.ephemeral else uses.consumes).update(streams)
            elif site.method in ("ensure_streams", *RUNNERS):
                uses.streams = True
            elif site.method in ("lease_table", "leadership"):
                uses.leases = True
        if any(s.method in ("subscribe", "consume", "consume_batch") for s in uses.sites):
            uses.publish.add(subjects.dead_letter("x"))  # a receiver's dead letters
        out[role] = uses
    return out


def unresolved() -> set[tuple[str, str]]:
    """(file, function) of every call in :data:`SCANNED` whose subject is made elsewhere."""
    return {
        (s.path, s.scope)
        for found in all_sites().values()
        for s in found
        if s.target is None and s.method not in ("ensure_streams", "lease_table", "leadership")
        and s.method not in RUNNERS
    }  # fmt: skip


def _ns(ns: str, subject: str) -> str:
    return f"{ns}.{subject}" if ns else subject


def _stream(ns: str, stream: Stream) -> str:
    return f"{ns}_{stream.name}" if ns else stream.name


DURABLE: Final = "svc-durable"
"""A durable consumer's name in :func:`api_calls` (each service names its own)."""


def api_calls(role: str, uses: Uses, ns: str) -> tuple[set[str], set[str]]:
    """The subjects ``role``'s client publishes to and subscribes to on a bus with namespace
    ``ns``: its own, and the JetStream API's as ``Bus`` calls it (module docstring)."""
    pub = {_ns(ns, s) for s in uses.publish}
    sub = {_ns(ns, s) for s in uses.subscribe} | {f"_INBOX_{role}.x"}
    if uses.streams:  # Bus.ensure_streams: info, then create (absent) or update
        for stream in ALL_STREAMS:
            name = _stream(ns, stream)
            pub |= {f"$JS.API.STREAM.{verb}.{name}" for verb in ("INFO", "CREATE", "UPDATE")}
    for stream in uses.consumes:  # a durable push consumer: create (or update), read back
        name = _stream(ns, stream)
        pub |= {
            f"$JS.API.CONSUMER.DURABLE.CREATE.{name}.{DURABLE}",
            f"$JS.API.CONSUMER.INFO.{name}.{DURABLE}",
            f"$JS.ACK.{name}.{DURABLE}.1.1.1.1.0",
        }
    for stream in uses.ephemeral:  # the server names it
        name = _stream(ns, stream)
        pub |= {f"$JS.API.CONSUMER.CREATE.{name}", f"$JS.ACK.{name}.EPHEMERAL.1.1.1.1.0"}
    if uses.leases:  # the bucket's stream: bind (create when absent), read, write keys
        bucket = subjects.lease_bucket(ns)
        kv = f"KV_{bucket}"
        pub |= {f"$JS.API.STREAM.{verb}.{kv}" for verb in ("INFO", "CREATE", "MSG.GET")}
        pub |= {f"$JS.API.DIRECT.GET.{kv}.$KV.{bucket}.planner.d", f"$KV.{bucket}.planner.d"}
    return pub, sub
