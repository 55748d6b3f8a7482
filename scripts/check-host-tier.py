#!/usr/bin/env python3
"""Check TAO's host-tier residency against a real vLLM engine that offloads KV to CPU memory.

For an operator with GPUs: run it against one of your vLLM servers started with the
OffloadingConnector and KV events on, for example::

    vllm serve Qwen/Qwen3-32B --tensor-parallel-size 2 \\
        --kv-offloading-size 64 \\
        --enable-prompt-tokens-details \\
        --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                             "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'

(``--kv-offloading-size`` GiB is shorthand for ``--kv-transfer-config '{"kv_connector":
"OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes_to_use":
BYTES}}'``, docs/kv-tier.md §0.) Then::

    .venv/bin/python scripts/check-host-tier.py --url http://gpu-a:8000/v1 \\
        --kv-events tcp://gpu-a:5557 --kv-replay tcp://gpu-a:5558 --model Qwen/Qwen3-32B

What it does, step by step:

1. follows the node's KV-event stream with telemetry's own code (``KvFeed`` → ``decode_kv_batch``
   → ``KvIndex``), counting the host-tier (``medium="CPU"``) events it sees;
2. sends a prompt of ``--prefix-tokens`` random token ids (``/v1/completions`` with a token-id
   prompt, ``max_tokens`` 1) and waits until the index shows its full blocks in the host tier
   (vLLM stores prompt blocks write-through as it computes them, docs/kv-tier.md §1);
3. sends other prompts until the index shows the prefix gone from GPU memory (up to
   ``--max-fill`` of ``--fill-tokens`` each);
4. sends the prefix again with another last token and reads vLLM's
   ``usage.prompt_tokens_details.cached_tokens``, which counts host-loaded tokens as cached
   (docs/kv-tier.md §3);
5. checks that the stream carried host-tier events, that the prefix was stored in the host
   tier and pushed out of the GPU, and that the ``cached_tokens`` vLLM reported equals what
   TAO's tiered residency predicts: the GPU hit, continued by the host tier from there to its
   first miss (docs/kv-tier.md §3), in whole blocks.

With ``--nats URL`` it also asks the running telemetry (``tao inspect`` over NATS) for its view
of the node and the prefix just before the reuse, and checks that it saw the host tier too and
agrees with the script's own index.

It prints one line per check (``--json``: one object) and exits 0 when all pass, 1 when one
fails, 2 for bad arguments or an engine it cannot reach. **Not run here**: these machines have
no CUDA vLLM, and vLLM's CPU build refuses the connector ("CPU Offloading is currently only
supported on CUDA-alike and XPU GPUs", ``vllm/v1/kv_offload/cpu/spec.py:196-207@0.32``). Its
pure parts (the prediction, the checks, reading the usage) are unit-tested against recorded
shapes, and the whole script runs in the tests against a TAO simnode with a host tier
(``--host-kv``), which publishes the events as vLLM 0.32 does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from shared.contracts.kv import BlockStored, KVEventBatch, decode_kv_batch
from shared.core.blockkeys import chain_keys
from shared.core.kvindex import KvIndex
from shared.core.tiers import CPU, GPU, tier_of

SESSION = "check-host-tier"


# --- the pure parts (unit-tested) ---------------------------------------------------------------


def predicted_cached(gpu_tokens: int, host_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """The tokens vLLM reports as cached for a prompt whose leading run is ``gpu_tokens`` in GPU
    memory and ``host_tokens`` in the host tier (each from the start, whole blocks): the GPU hit,
    then the host tier from the GPU boundary to its first miss (osched:752-858@0.32), i.e. the
    longer of the two runs, in whole blocks that leave the prompt's last token to compute (the
    GPU hit stops before it; this script's prompts end one token past the prefix, so how vLLM
    counts a full-prompt host hit, vsched:3175-3189@0.32, never matters here)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hit = max(gpu_tokens, host_tokens) // block_size * block_size
    most = (prompt_tokens - 1) // block_size * block_size
    return max(0, min(hit, most))


def cached_tokens_of(body: Mapping[str, Any]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of an OpenAI completion (``None``: absent,
    e.g. a server without ``--enable-prompt-tokens-details``)."""
    usage = body.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else None


def random_tokens(seed: int, n: int, vocab: int) -> list[int]:
    """``n`` token ids drawn from ``[100, vocab)`` by ``seed`` (no two runs share a prefix)."""
    rng = random.Random(seed)
    return [rng.randrange(100, vocab) for _ in range(n)]


@dataclass(frozen=True, slots=True)
class View:
    """Where the prefix lies, as an index sees it: its leading run per tier (tokens)."""

    gpu: int
    host: int


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def verdict(
    *,
    prefix_tokens: int,
    prompt_tokens: int,
    block_size: int,
    host_events: int,
    stored: View,
    before_reuse: View,
    cached: int | None,
    tolerance_blocks: int = 0,
    telemetry: View | None = None,
) -> list[Check]:
    """The checks of one run (module docstring, step 5)."""
    full = prefix_tokens // block_size * block_size
    checks = [
        Check("host_events", host_events > 0, f"{host_events} host-tier (medium CPU) stores seen"),
        Check(
            "stored_in_host",
            stored.host >= full,
            f"host tier held {stored.host} of the prefix's {full} tokens after its first request",
        ),
        Check(
            "pushed_out_of_gpu",
            before_reuse.gpu < full,
            f"GPU held {before_reuse.gpu} of {full} prefix tokens before the reuse "
            f"(host tier {before_reuse.host})",
        ),
    ]
    if cached is None:
        checks.append(
            Check(
                "cached_tokens",
                False,
                "the reply has no usage.prompt_tokens_details.cached_tokens "
                "(start vLLM with --enable-prompt-tokens-details)",
            )
        )
    else:
        want = predicted_cached(before_reuse.gpu, before_reuse.host, prompt_tokens, block_size)
        off = abs(cached - want)
        checks.append(
            Check(
                "cached_tokens",
                off <= tolerance_blocks * block_size,
                f"vLLM reported {cached} cached tokens; TAO's tiered residency predicts {want} "
                f"(GPU {before_reuse.gpu}, host {before_reuse.host})",
            )
        )
    if telemetry is not None:
        checks.append(
            Check(
                "telemetry_agrees",
                telemetry == before_reuse and telemetry.host > 0,
                f"telemetry: GPU {telemetry.gpu}, host {telemetry.host}; "
                f"this script's index: GPU {before_reuse.gpu}, host {before_reuse.host}",
            )
        )
    return checks


# --- the run -------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"check-host-tier: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="scripts/check-host-tier.py",
        description="Check TAO's host-tier residency against a vLLM engine that offloads KV to "
        "CPU (OffloadingConnector); see the module docstring.",
    )
    p.add_argument("--url", required=True, help="the engine's OpenAI base URL (http://h:8000/v1)")
    p.add_argument("--kv-events", required=True, metavar="ENDPOINT", help="tcp://h:5557")
    p.add_argument("--kv-replay", metavar="ENDPOINT", help="tcp://h:5558 (optional)")
    p.add_argument("--model", help="served model name (default: the first of /v1/models)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer")
    p.add_argument("--block-size", type=int, default=16, help="vLLM's block size (default 16)")
    p.add_argument("--prefix-tokens", type=int, default=4096, help="prefix length (4096)")
    p.add_argument("--fill-tokens", type=int, default=8192, help="tokens per fill prompt (8192)")
    p.add_argument("--max-fill", type=int, default=400, help="most fill prompts (400)")
    p.add_argument("--fill-concurrency", type=int, default=8, help="fill prompts at once (8)")
    p.add_argument("--vocab", type=int, default=30_000, help="token ids drawn below this (30000)")
    p.add_argument("--seed", type=int, default=None, help="prompt seed (default: the time)")
    p.add_argument("--settle-s", type=float, default=30.0, help="most wait per step (30 s)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per request (300 s)")
    p.add_argument("--tolerance-blocks", type=int, default=0, help="allowed mismatch (0)")
    p.add_argument("--nats", metavar="URL", help="also ask the running telemetry (tao inspect)")
    p.add_argument("--node", default="check", help="the node's id in TAO (with --nats)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("block_size", "prefix_tokens", "fill_tokens", "max_fill", "fill_concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.prefix_tokens < 2 * args.block_size:
        parser.error(f"--prefix-tokens: must be at least two blocks ({2 * args.block_size})")
    if args.vocab <= 100:
        parser.error(f"--vocab: must be > 100, got {args.vocab}")
    for name in ("settle_s", "timeout_s"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            parser.error(f"--{name.replace('_', '-')}: must be finite and > 0, got {value}")
    if args.tolerance_blocks < 0:
        parser.error(f"--tolerance-blocks: must be >= 0, got {args.tolerance_blocks}")
    for flag, value, schemes in (
        ("--url", args.url, ("http://", "https://")),
        ("--kv-events", args.kv_events, ("tcp://", "ipc://")),
        ("--kv-replay", args.kv_replay, ("tcp://", "ipc://")),
    ):
        if value is not None and not value.startswith(schemes):
            parser.error(f"{flag}: must start with {' or '.join(schemes)}, got {value!r}")
    return args


class Follower:
    """The node's KV stream applied to an index, as telemetry applies it."""

    def __init__(self, node: str, block_size: int) -> None:
        self.node = node
        self.index = KvIndex()
        self.block_size = block_size
        self.host_events = 0
        self.batches = 0

    def apply(self, seq: int, payload: bytes, received_at: float) -> None:
        try:
            batch = decode_kv_batch(payload)
        except Exception:
            batch = KVEventBatch(ts=received_at, events=[])
        self.host_events += sum(
            1 for e in batch.events if type(e) is BlockStored and tier_of(e.medium) == CPU
        )
        self.index.apply(self.node, seq, batch, received_at)
        self.batches += 1

    def view(self) -> View:
        index, bs = self.index, self.block_size
        return View(
            index.prefix_blocks(SESSION, self.node, GPU) * bs,
            index.prefix_blocks(SESSION, self.node, CPU) * bs,
        )


async def _follow(follower: Follower, endpoint: str, replay: str | None) -> None:
    from shared.infra.kvzmq import KvFeed

    feed = KvFeed(follower.node, endpoint, replay, catch_up=True)
    async for msg in feed.messages():
        follower.apply(msg.seq, msg.payload, msg.received_at)


async def _until(pred: Any, settle_s: float) -> bool:
    deadline = time.monotonic() + settle_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _telemetry_view(url: str, node: str, tokens: list[int]) -> View | None:
    from shared.contracts import subjects
    from shared.contracts.inspect import PrefixInspect, PrefixQuery, decode_reply, encode_body
    from shared.infra.bus import Bus

    bus = await Bus.connect(url, name="check-host-tier", allow_reconnect=False, quiet=True)
    try:
        raw = await bus.request(
            subjects.inspect("prefix"), encode_body(PrefixQuery(node, tokens)), 5
        )
        reply = decode_reply(raw, PrefixInspect)
        return View(reply.resident_prefix_tokens, reply.host_prefix_tokens)
    finally:
        with contextlib.suppress(Exception):
            await bus.nc.close()


async def run(args: argparse.Namespace) -> tuple[list[Check], dict[str, Any]]:
    import aiohttp

    bs = args.block_size
    seed = args.seed if args.seed is not None else time.time_ns()
    prefix = random_tokens(seed, args.prefix_tokens // bs * bs, args.vocab)
    follower = Follower(args.node, bs)
    follower.index.register(SESSION, chain_keys(prefix, bs), bs, time.time())
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    follow = asyncio.ensure_future(_follow(follower, args.kv_events, args.kv_replay))
    try:
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
            model = args.model
            if model is None:
                async with http.get(f"{base}/models") as r:
                    model = (await r.json())["data"][0]["id"]

            async def complete(prompt: list[int]) -> dict[str, Any]:
                body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
                async with http.post(f"{base}/completions", json=body) as r:
                    if r.status != 200:
                        raise RuntimeError(f"/v1/completions answered {r.status}: {await r.text()}")
                    out: dict[str, Any] = await r.json()
                    return out

            await complete([*prefix, 11])
            await _until(lambda: follower.view().host >= len(prefix), args.settle_s)
            stored = follower.view()
            sent = 0
            while follower.view().gpu >= len(prefix) and sent < args.max_fill:
                n = min(args.fill_concurrency, args.max_fill - sent)
                fills = [
                    random_tokens(seed + 1 + sent + i, args.fill_tokens, args.vocab)
                    for i in range(n)
                ]
                await asyncio.gather(*(complete(f) for f in fills))
                sent += n
                await asyncio.sleep(0.2)  # the batches of those steps arrive
            await asyncio.sleep(0.5)
            before = follower.view()
            telemetry = (
                await _telemetry_view(args.nats, args.node, [*prefix, 12]) if args.nats else None
            )
            reply = await complete([*prefix, 12])
    finally:
        follow.cancel()
        with contextlib.suppress(BaseException):
            await follow
    cached = cached_tokens_of(reply)
    checks = verdict(
        prefix_tokens=len(prefix),
        prompt_tokens=len(prefix) + 1,
        block_size=bs,
        host_events=follower.host_events,
        stored=stored,
        before_reuse=before,
        cached=cached,
        tolerance_blocks=args.tolerance_blocks,
        telemetry=telemetry,
    )
    facts = {
        "seed": seed,
        "model": model,
        "prefix_tokens": len(prefix),
        "fill_prompts": sent,
        "batches": follower.batches,
        "host_events": follower.host_events,
        "stored": asdict(stored),
        "before_reuse": asdict(before),
        "telemetry": None if telemetry is None else asdict(telemetry),
        "cached_tokens": cached,
    }
    return checks, facts


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        checks, facts = asyncio.run(run(args))
    except Exception as exc:  # an engine that cannot be reached, a refused request
        print(f"check-host-tier: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    ok = all(c.ok for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks], **facts}))
    else:
        for c in checks:
            print(f"{'PASS' if c.ok else 'FAIL'}  {c.name:<18} {c.detail}")
        print(f"{'all checks passed' if ok else 'some checks failed'} (seed {facts['seed']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
