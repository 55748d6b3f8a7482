"""``tao top``: a live terminal view of one scheduling domain, refreshed every second.

It reads what ``tao status`` reads (the domain's node records, sessions, planner counters and
tool history in Redis) and shows four panes:

* **nodes** — capacity, reserved, free, engine usage, running / waiting requests, prefix-cache
  hit rate, health;
* **pool** — the sessions waiting for admission, how long each has waited and why it is not
  admitted yet (:func:`why_waiting`, an estimate from the same records the planner reads: its
  weight against every eligible node's free room, or a tool it is still in);
* **tools** — admitted sessions in a tool call, the tool, how long it has run, its predicted
  return (the predictor of ``shared.core.predictor`` on the stored history) and readiness ``r``;
* **planner** — ticks, solve time p50 / p99, exact solves and fallbacks, plans applied /
  discarded / truncated, sessions admitted and interrupted.

Keys: ``s`` cycles the pool's sort (longest wait, most tokens, id), ``n`` cycles a node filter
(all nodes, then each node: the nodes and tools panes show that node only), ``q`` quits.
``--once`` prints one frame and exits (no terminal needed). Bad usage or an unreachable Redis
at start is one line and exit 2; a read that fails later shows in the frame and is retried.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import termios
import time
import tty
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from shared.cli.ops import OpsError, redis_url
from shared.core.predictor import History, predict_end
from shared.core.readiness import ReadinessState, readiness
from shared.core.session import Session
from shared.infra.store_stats import prefix_hit_rate
from shared.infra.store_types import NodeRecord

__all__ = ["SORTS", "Frame", "TopView", "add_top_parser", "render", "why_waiting"]

SORTS: tuple[str, ...] = ("wait", "tokens", "id")
"""The pool's sort keys, in the order ``s`` cycles them."""
RESERVE_TOKENS = 512
"""The growth reserve the weight estimate adds (``TAO_RESERVE_TOKENS``' default)."""
ROWS = 20
"""Rows per session pane; the rest is counted."""


@dataclass(slots=True)
class Frame:
    """One read of the domain."""

    domain: str
    now: float
    nodes: list[NodeRecord] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    planner: dict[str, Any] = field(default_factory=dict)
    history: History = field(default_factory=History)
    error: str | None = None


@dataclass(slots=True)
class TopView:
    """What the keys change: the pool's sort and the node filter."""

    sort: str = SORTS[0]
    node: str | None = None

    def next_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]

    def next_node(self, nodes: Sequence[str]) -> None:
        """All nodes → each node in turn → all nodes."""
        order: list[str | None] = [None, *sorted(nodes)]
        at = order.index(self.node) if self.node in order else 0
        self.node = order[(at + 1) % len(order)]

    def key(self, ch: str, frame: Frame) -> bool:
        """Apply one key; False when it quits."""
        if ch in "qQ":
            return False
        if ch in "sS":
            self.next_sort()
        elif ch in "nN":
            self.next_node([n.id for n in frame.nodes])
        return True


def _weight(s: Session) -> int:
    return s.tokens + RESERVE_TOKENS


def why_waiting(s: Session, nodes: Sequence[NodeRecord]) -> str:
    """Why a pooled session is not admitted yet, as far as the records show."""
    if s.activity == "tool" and s.tool is not None and s.tool.open:
        return f"in its tool ({s.tool.tool}); placed when it needs the GPU"
    usable = [n for n in nodes if n.healthy and (n.models is None or s.model in n.models)]
    if not usable:
        model = f" serves {s.model}" if s.model else " is healthy"
        return f"no node{model}"
    best = max(usable, key=lambda n: n.free)
    need = _weight(s)
    if need > max(n.usable for n in usable):
        return f"needs ~{need} tokens, more than any node holds"
    if need > best.free:
        return f"needs ~{need} tokens; most free is {best.free} on {best.id}"
    return f"room on {best.id}: waits for the next plan"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    return f"{s:.1f} s" if s < 60 else f"{s / 60:.1f} min"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ms(v: object) -> str:
    return f"{float(v):.1f}" if isinstance(v, int | float) else "-"


def render(view: TopView, f: Frame) -> Any:
    """The frame as rich renderables (a Group of tables), for ``view``'s sort and filter."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = (
        f"tao top — domain {f.domain} — sort: {view.sort} — node: {view.node or 'all'} — "
        f"{time.strftime('%H:%M:%S', time.localtime(f.now))}   keys: s sort  n node  q quit"
    )
    parts: list[Any] = [Text(title, style="bold")]
    if f.error is not None:
        parts.append(Text(f"store unreachable, retrying: {f.error}", style="bold red"))
    nodes = [n for n in f.nodes if view.node is None or n.id == view.node]
    nt = Table(title="nodes", title_justify="left", expand=False)
    for col in ("node", "health", "capacity", "reserved", "free", "usage", "run/wait", "hit"):
        nt.add_column(col, justify="left" if col in ("node", "health") else "right")
    for n in sorted(nodes, key=lambda r: r.id):
        nt.add_row(
            n.id, "ok" if n.healthy else "DOWN", str(n.capacity_tokens), str(n.reserved),
            str(n.free), _pct(n.usage), f"{n.running}/{n.waiting}",
            _pct(prefix_hit_rate(n.prefix_cache_queries, n.prefix_cache_hits)),
        )  # fmt: skip
    parts.append(nt)
    live = [s for s in f.sessions if not s.ended]
    pool = [s for s in live if s.pooled]
    waited = {s.id: (f.now - s.waiting_since) if s.waiting_since else None for s in pool}
    if view.sort == "wait":
        pool.sort(key=lambda s: (-(waited[s.id] or 0.0), s.id))
    elif view.sort == "tokens":
        pool.sort(key=lambda s: (-s.tokens, s.id))
    else:
        pool.sort(key=lambda s: s.id)
    pt = Table(title=f"pool: {len(pool)} waiting", title_justify="left")
    for col in ("session", "activity", "waited", "tokens", "why not admitted"):
        pt.add_column(col, justify="right" if col in ("waited", "tokens") else "left")
    for s in pool[:ROWS]:
        pt.add_row(s.id[:32], s.activity, _age(waited[s.id]), str(s.tokens),
                   why_waiting(s, f.nodes))  # fmt: skip
    if len(pool) > ROWS:
        pt.caption = f"... {len(pool) - ROWS} more"
    parts.append(pt)
    tools = [s for s in live if s.node is not None and s.activity == "tool" and s.tool is not None]
    tools = [s for s in tools if view.node is None or s.node == view.node]
    rows: list[tuple[float, Session, str, int]] = []
    for s in tools:
        assert s.tool is not None
        pred = predict_end(s.tool.view(), f.history, f.now)
        ready = readiness(ReadinessState(pred, s.probe_mark), f.now).r
        rows.append((pred.predicted_end - f.now, s, str(pred.evidence), ready))
    rows.sort(key=lambda row: (row[0], row[1].id))
    tt = Table(title=f"in a tool: {len(tools)}", title_justify="left")
    for col in ("session", "node", "tool", "running", "returns in", "from", "r"):
        tt.add_column(col, justify="right" if col in ("running", "returns in", "r") else "left")
    for left, s, source, ready in rows[:ROWS]:
        assert s.tool is not None
        back = "returned" if s.tool.completed_at is not None else _age(left) if left > 0 else "due"
        tt.add_row(s.id[:32], str(s.node), s.tool.tool, _age(f.now - s.tool.started_at), back,
                   source, str(ready))  # fmt: skip
    parts.append(tt)
    p = f.planner
    solve = p.get("solve_ms") or {}
    parts.append(
        Text(
            f"planner: ticks {p.get('ticks', 0)}  solve ms p50 {_ms(solve.get('p50'))} "
            f"p99 {_ms(solve.get('p99'))}  exact {p.get('solves_exact', 0)}/"
            f"{p.get('solves', 0)}  fallbacks {p.get('fallbacks', 0)}  plans applied "
            f"{p.get('plans_applied', 0)} discarded {p.get('plans_discarded', 0)} truncated "
            f"{p.get('plans_truncated', 0)}  admitted {p.get('sessions_admitted', 0)} "
            f"interrupted {p.get('sessions_interrupted', 0)}"
        )
    )
    return Group(*parts)


async def read_frame(store: Any, domain: str) -> Frame:
    """One read of everything a frame shows (``store`` is a ``StateStore``)."""
    return Frame(
        domain=domain,
        now=time.time(),
        nodes=await store.nodes(),
        sessions=await store.sessions(),
        planner=dict(await store.planner_stats()),
        history=await store.history(),
    )


@contextlib.contextmanager
def _cbreak(fd: int) -> Iterator[None]:
    """Keys arrive one by one, unechoed, while the view runs (restored after)."""
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


async def _run(url: str, domain: str, interval: float, once: bool, out: TextIO) -> int:
    from redis.exceptions import RedisError
    from rich.console import Console
    from rich.live import Live

    from shared.infra.redisconn import open_redis
    from shared.infra.store import Store

    client = open_redis(url, socket_connect_timeout=2.0, socket_timeout=5.0)
    store = Store(client, domain)
    view = TopView()
    try:
        try:
            frame = await read_frame(store, domain)
        except (RedisError, OSError) as exc:
            raise OpsError(f"cannot read {url}: {exc}") from None
        console = Console(file=out)
        if once or not sys.stdin.isatty():
            console.print(render(view, frame))
            return 0
        keys: asyncio.Queue[str] = asyncio.Queue()
        fd = sys.stdin.fileno()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, lambda: keys.put_nowait(os.read(fd, 64).decode(errors="ignore")))
        try:
            with _cbreak(fd), Live(console=console, screen=True, auto_refresh=False) as live:
                while True:
                    live.update(render(view, frame), refresh=True)
                    try:
                        typed = await asyncio.wait_for(keys.get(), interval)
                    except TimeoutError:
                        typed = ""
                    for ch in typed:
                        if not view.key(ch, frame):
                            return 0
                    try:
                        frame = await read_frame(store, domain)
                    except (RedisError, OSError) as exc:
                        frame.error = str(exc)
        finally:
            loop.remove_reader(fd)
    finally:
        await client.aclose()


def _cmd_top(args: argparse.Namespace, out: TextIO) -> int:
    if not args.interval > 0:
        raise OpsError(f"--interval: must be > 0, got {args.interval}")
    url = redis_url(args)
    domain = args.domain or os.environ.get("TAO_DOMAIN") or "default"
    return asyncio.run(_run(url, domain, args.interval, args.once, out))


def add_top_parser(sub: Any) -> None:
    """Register ``tao top``."""
    p = sub.add_parser(
        "top",
        help="live view of nodes, pool, sessions in tools and the planner (q quits)",
        description="A live terminal view of one scheduling domain, read from Redis each "
        "second. Keys: s sort the pool, n filter by node, q quit.",
    )
    p.add_argument("--redis", metavar="URL", help="Redis URL (default: env, then the run file)")
    p.add_argument("--domain", metavar="NAME", help="scheduling domain (default: TAO_DOMAIN)")
    p.add_argument("--interval", type=float, default=1.0, help="refresh period, s")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(run=_cmd_top)
