"""scripts/check-host-tier.py run whole against a TAO simnode with a host KV tier (``host_kv``),
which publishes its host events as vLLM 0.32's OffloadingConnector does: every check passes.
(The script is meant for a real vLLM with the connector on; none runs here, docs/kv-tier.md.)"""

from __future__ import annotations

from aiohttp import web

from services.simnode.app import SimNodeConfig, create_app
from shared.infra.embedded import free_port
from tests.unit.test_check_host_tier import chk


async def test_the_script_passes_against_a_tiered_simnode() -> None:
    pub, replay = free_port(), free_port()
    config = SimNodeConfig(
        "sim1",
        time_scale=1000.0,
        kv_tokens=256 * 16,
        kv_events=f"tcp://*:{pub}",
        kv_replay=f"tcp://*:{replay}",
        host_kv=4.0,
    )
    runner = web.AppRunner(create_app(config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        args = chk.parse(
            [
                "--url", f"http://127.0.0.1:{port}/v1",
                "--kv-events", f"tcp://127.0.0.1:{pub}",
                "--kv-replay", f"tcp://127.0.0.1:{replay}",
                "--prefix-tokens", "512",
                "--fill-tokens", "1024",
                "--max-fill", "40",
                "--fill-concurrency", "2",
                "--seed", "7",
                "--settle-s", "10",
            ]
        )  # fmt: skip
        checks, facts = await chk.run(args)
    finally:
        await runner.cleanup()
    assert [c.name for c in checks if not c.ok] == [], (checks, facts)
    assert facts["before_reuse"]["gpu"] < 512 <= facts["before_reuse"]["host"]
    assert facts["cached_tokens"] == 512 and facts["host_events"] >= 32
