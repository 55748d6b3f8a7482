"""Coverage-guided fuzzing of TAO's decoders with atheris (libFuzzer), for a bounded time.

    python benchmarks/fuzz_decoders.py [--seconds 60] [--targets a,b,...]

Each target runs in its own process for ``--seconds`` (libFuzzer's ``-max_total_time``), with
the decoder's modules instrumented for coverage; an input is a crash when the decoder raises
anything but its own error (the contract the hypothesis suite, tests/unit/test_fuzz_decoders.py,
checks in CI). Prints one row per target: inputs run, coverage edges, crashes. Needs
``pip install atheris`` (not a dependency: a benchmark tool). A crash leaves its input as
``crash-*`` in the working directory, which the table names.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

TARGETS = ("nats", "kv", "frames", "hook", "mappers", "gateway", "nodes", "trace")


def _target(name: str) -> Callable[[bytes], None]:
    """The one-input function of target ``name`` (imports under atheris' instrumentation)."""
    import atheris

    with atheris.instrument_imports():
        import orjson

        from services.gateway.apis import CHAT, COMPLETIONS, MESSAGES
        from services.gateway.requests import BadRequest, read_body
        from services.tools.hooks import decode_hook
        from shared.contracts import codec
        from shared.contracts.errors import ContractError
        from shared.contracts.frames import parse_kv_frames
        from shared.contracts.kv import decode_kv_batch
        from shared.harness.registry import HARNESSES, mapper_for
        from shared.infra.nodesfile import NodesFileError, load_nodes_file
        from shared.sim.dists import WorkloadError
        from shared.sim.trace import parse_trace_line

    def json_of(data: bytes) -> object:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return None

    def nats(data: bytes) -> None:
        for dec in (codec.decode_message, codec.decode_tool_event, codec.decode_session_event):
            with contextlib.suppress(ContractError):
                dec(data)

    def kv(data: bytes) -> None:
        with contextlib.suppress(ContractError):
            decode_kv_batch(data)

    def frames(data: bytes) -> None:
        with contextlib.suppress(ContractError):
            parse_kv_frames(data.split(b"\x00", 3))

    def hook(data: bytes) -> None:
        with contextlib.suppress(ContractError):
            decode_hook(data)

    mappers_ = [mapper_for(h.name) for h in HARNESSES]

    def mappers(data: bytes) -> None:
        body = json_of(data)
        if not isinstance(body, dict):
            return
        for m in mappers_:
            with contextlib.suppress(ContractError):
                m.map(body, 1_000.0)

    def gateway(data: bytes) -> None:
        try:
            body = read_body(data)  # the gateway's one reading of a model request's body
        except BadRequest:
            return
        for api in (CHAT, COMPLETIONS, MESSAGES):
            try:
                info = api.describe(body)
            except BadRequest:
                continue
            api.identity({}, body, lambda: "gen")
            orjson.dumps(api.upstream(body, info, token_ids=True))

    tmp = Path(tempfile.mkdtemp(prefix="tao-fuzz-")) / "nodes.toml"

    def nodes(data: bytes) -> None:
        tmp.write_bytes(data)
        with contextlib.suppress(NodesFileError):
            load_nodes_file(tmp)

    def trace(data: bytes) -> None:
        with contextlib.suppress(WorkloadError):
            parse_trace_line(json_of(data), "fuzz:1")

    return {
        "nats": nats, "kv": kv, "frames": frames, "hook": hook, "mappers": mappers,
        "gateway": gateway, "nodes": nodes, "trace": trace,
    }[name]  # fmt: skip


def _child(name: str, seconds: int) -> None:
    import atheris

    fn = _target(name)
    atheris.Setup(
        [sys.argv[0], f"-max_total_time={seconds}", "-print_final_stats=1", "-rss_limit_mb=2048"],
        fn,
    )
    atheris.Fuzz()


def _run(name: str, seconds: int) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, "--seconds", str(seconds)],
        capture_output=True, text=True, timeout=seconds * 3 + 120, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)
    cov = re.findall(r"cov: (\d+)", out)
    crashes = re.findall(r"Test unit written to (\S+)", out)
    return {
        "target": name,
        "inputs": runs[-1] if runs else "?",
        "edges": cov[-1] if cov else "?",
        "crashes": str(len(crashes)) if proc.returncode in (0, 1, 77) or crashes else "?",
        "exit": str(proc.returncode),
        "first crash": crashes[0] if crashes else "-",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.child, args.seconds)
        return 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("fuzz_decoders: needs atheris (pip install atheris)", file=sys.stderr)
        return 2
    from shared.tables import render

    rows = [_run(t.strip(), args.seconds) for t in args.targets.split(",") if t.strip()]
    cols = ["target", "inputs", "edges", "crashes", "exit", "first crash"]
    print(render(cols, [[r[c] for c in cols] for r in rows]))
    return 0 if all(r["crashes"] == "0" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
