"""`tao demo` as a user runs it: a short run leaves no log folders behind (each run used to
leave an undocumented /tmp/tao-logs-* per policy), keeps them where --log-dir says, and its
table has no row that repeats another (\"wall time\" was the task latency maximum), and it
times no policy on a cold stack."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import nats
import redis.asyncio as aioredis

DEADLINE_S = 240.0


def _demo(tmp: Path, nats_url: str, redis_url: str, *extra: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    env = {**os.environ, "TMPDIR": str(tmp), "TAO_NATS_URL": nats_url,
           "TAO_REDIS_URL": redis_url, "TAO_RUN_FILE": str(tmp / "run.json")}  # fmt: skip
    cmd = [sys.executable, "-m", "shared.cli.entry", "demo", "--sessions", "2", "--turns", "2",
           "--policies", "tao", "--time-scale", "20", "--workload", "short", *extra]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=DEADLINE_S,
                          check=False)  # fmt: skip


def test_a_clean_run_leaves_no_log_folders(tmp_path: Path, nats_url: str, redis_url: str) -> None:
    done = _demo(tmp_path, nats_url, redis_url)
    assert done.returncode == 0, done.stderr
    rows = [line.split("  ")[0].strip() for line in done.stdout.splitlines()]
    assert "tasks done" in rows and "wall time" not in rows
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(("tao-demo-", "tao-logs-"))]
    assert left == [] and "logs are in" not in done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if "warmed up" in ln]  # said, untimed
    assert line.startswith("tao demo: tao: warmed up: ") and "nodes sim0, sim1" in line
    assert "not timed" in line


async def _left_on_servers(nats_url: str, redis_url: str) -> tuple[set[str], set[str]]:
    """The demo runs' streams on the NATS server and their domains' keys in Redis."""
    nc = await nats.connect(nats_url)
    try:
        streams = {s.config.name for s in await nc.jetstream().streams_info()}
    finally:
        await nc.close()
    client = aioredis.from_url(redis_url)
    try:
        keys = {k.decode() async for k in client.scan_iter(match="tao:{demo-*")}
    finally:
        await client.aclose()
    return {s for s in streams if s.startswith(("demo", "KV_demo"))}, keys


def test_a_run_on_given_servers_leaves_nothing_on_them(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    """On the operator's NATS and Redis (``TAO_NATS_URL`` / ``TAO_REDIS_URL``) each policy's run
    deletes its namespace's streams and lease bucket and its domain's keys when it ends: they
    used to pile up, seven streams and six keys a run, on the servers CI shares across runs."""
    before = asyncio.run(_left_on_servers(nats_url, redis_url))
    done = _demo(tmp_path, nats_url, redis_url, "--policies", "tao,cache-aware")
    assert done.returncode == 0, done.stderr
    assert "could not delete" not in done.stderr
    assert asyncio.run(_left_on_servers(nats_url, redis_url)) == before


def test_log_dir_keeps_each_policys_logs(tmp_path: Path, nats_url: str, redis_url: str) -> None:
    logs = tmp_path / "kept"
    done = _demo(tmp_path, nats_url, redis_url, "--log-dir", str(logs))
    assert done.returncode == 0, done.stderr
    assert {p.name for p in (logs / "tao").iterdir()} >= {"gateway.log", "planner.log"}
    assert f"logs are in {logs}" in done.stderr


def test_the_policy_is_timed_on_a_warm_stack(tmp_path: Path, nats_url: str, redis_url: str) -> None:
    """Before its timed sessions the run warms its stack until both simnodes have served a
    request; those requests are recorded as the warm-up and counted nowhere else (the timed
    turns are exactly sessions x turns)."""
    done = _demo(tmp_path, nats_url, redis_url, "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout.strip().splitlines()[-1])["runs"]
    assert row["warmup_nodes"] == ["sim0", "sim1"]
    assert row["warmup_requests"] >= 2 and row["warmup_s"] > 0
    assert (row["tasks_done"], row["turns"]) == (2, 2 * 2)
