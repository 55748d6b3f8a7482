"""The gateway's own work on one abuse body, step by step (what the abuse benchmark's p99 meets).

A script, not a test: it prints a markdown table::

    PYTHONPATH=. .venv/bin/python -m benchmarks.body_work --repeat 5

For each body of ``benchmarks/gateway_abuse.py``'s attacks, the median over ``--repeat`` runs
of each step the gateway takes on it once its bytes have arrived (services/gateway/bodies.py,
requests.py): joining its 64 KiB chunks (on the event loop), the shape scan
(:func:`.jsonscan.scan`, numba, ``nogil``), and then what holds the GIL: the path an error
names (:func:`.requests.read_json` for a refused body; the regex walk of the text before the
refusal) or the parse (``orjson.loads``) for a body that passes. Receiving the bytes (the
server's socket reads and chunk callbacks) is not included.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson

from services.gateway import jsonscan
from services.gateway.requests import BadRequest, read_json
from shared.infra.settings import Settings

CHUNK = 64 * 1024


def _bodies() -> dict[str, bytes]:
    return {
        "wide 33 MB": b'{"messages":{},"x":[' + b",".join([b"{}"] * 11_000_000) + b"]}",
        "1M messages (30 MB)": orjson.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "m"}] * 1_000_000}
        ),
        "held 30 MB body": orjson.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "h" * 30_000_000}]}
        ),
        "an agent's 40 KB body": orjson.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": f"{k} " + "w" * 2000} for k in range(20)],
            }
        ),
    }


def _median_ms(step: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def _read(data: bytes, max_items: int) -> str:
    try:
        read_json(data, max_items=max_items)
    except BadRequest:
        return "refused"
    return "parsed"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    max_items = Settings().max_body_items
    jsonscan.warm()
    print("| body | size MB | join ms | scan ms | read_json ms (scan + path or parse) | outcome |")
    print("|---|---|---|---|---|---|")
    for name, data in _bodies().items():
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        join = _median_ms(lambda c=chunks: b"".join(c), args.repeat)  # type: ignore[misc]
        scan = _median_ms(
            lambda d=data: jsonscan.scan(d, 128, max_items),  # type: ignore[misc]
            args.repeat,
        )
        read = _median_ms(lambda d=data: _read(d, max_items), args.repeat)  # type: ignore[misc]
        print(
            f"| {name} | {len(data) / 1e6:.1f} | {join:.1f} | {scan:.1f} | {read:.1f} "
            f"| {_read(data, max_items)} |"
        )


if __name__ == "__main__":
    main()
