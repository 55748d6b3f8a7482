"""`tao top` driven in a pseudo-terminal against a real Redis: the screen shows the domain's
nodes, pool and tool sessions, `n` filters by node, `s` re-sorts, `q` quits with exit 0."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid

import redis.asyncio as aioredis

from shared.core.session import Session, ToolCall
from shared.infra.store import Store
from shared.infra.store_types import NodeUpdate

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")
DEADLINE_S = 30.0


def _screen_until(fd: int, want: str, seen: list[str]) -> str:
    """Read the terminal until ``want`` shows (ANSI stripped); the text read so far."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen.append(os.read(fd, 65536).decode(errors="replace"))
            except OSError:
                break
        text = ANSI.sub("", "".join(seen))
        if want in text:
            return text
    raise AssertionError(f"{want!r} not on screen: {ANSI.sub('', ''.join(seen))[-2000:]}")


async def test_top_in_a_pty(redis_url: str) -> None:
    domain = f"top{uuid.uuid4().hex[:8]}"
    client = aioredis.from_url(redis_url)
    store = Store(client, domain)
    try:
        await store.put_node_status("node-a", NodeUpdate(capacity_tokens=8000, healthy=True))
        await store.put_node_status("node-b", NodeUpdate(capacity_tokens=8000, healthy=True))
        now = time.time()
        await store.update_session(
            "waiter", lambda _: Session("waiter", version=1, activity="waiting", tokens=300,
                                        waiting_since=now - 42, request_id="r", model="m")
        )  # fmt: skip
        tool = ToolCall("c1", "pytest", now - 2.0)
        await store.update_session(
            "worker", lambda _: Session("worker", version=1, activity="tool", node="node-b",
                                        weight=700, tokens=600, tool=tool)
        )  # fmt: skip
        main, child = pty.openpty()
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
        env = {**os.environ, "TAO_REDIS_URL": redis_url, "COLUMNS": "150", "LINES": "50"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "shared.cli.entry", "top", "--domain", domain,
             "--interval", "0.2"],
            stdin=child, stdout=child, stderr=child, env=env, close_fds=True,
        )  # fmt: skip
        os.close(child)
        seen: list[str] = []
        try:
            screen = _screen_until(main, "interrupted", seen)  # the frame's last line
            assert "in a tool: 1" in screen
            assert "node-a" in screen and "node-b" in screen and "pool: 1 waiting" in screen
            assert "waiter" in screen and "room on node-a" in screen and "pytest" in screen
            os.write(main, b"n")
            _screen_until(main, "node: node-a", seen)
            seen.clear()
            os.write(main, b"n")
            screen = _screen_until(main, "node: node-b", seen)
            seen.clear()
            os.write(main, b"s")
            _screen_until(main, "sort: tokens", seen)
            os.write(main, b"q")
            assert proc.wait(timeout=DEADLINE_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(main)
    finally:
        await store.clear()
        await client.aclose()
