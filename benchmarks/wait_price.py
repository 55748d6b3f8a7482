"""How the released session's expected pool wait, priced into a release, moves the TTFT tail.

A script, not a test: it prints a markdown table, one row per (workers, variant), means over
the seeds (every variant runs the same tasks per seed). Variants:

* ``none``: ``tao`` (a release costs its recompute and requeue);
* ``mean``: ``tao-slo`` (plus the pool's mean wait so far, :func:`shared.core.round.pool_wait`);
* ``max``: the same with the pool's longest wait so far instead (a patch of
  ``View.release_price`` for this script only; not a policy);
* ``tail-priced``: ``tao-fair`` with its fixed 200 s replaced by a price: a pooled request is
  placed first (its node cleared for it) once its wait so far covers what clearing that node
  costs, the sum of the releases' prices (a ski-rental rule; a patch of ``round.tail`` for this
  script only, tried for the tail target of docs/evaluation.md, "The released session's wait");
* any other policy name (``cache-aware``, ``thunderagent-ideal``, ``tao-fair``, ...) as a
  reference.

The sweep that chose ``mean`` for ``tao-slo`` (docs/evaluation.md, "The released session's
wait")::

    python -m benchmarks.wait_price --workload claude-code --workers 8,10,12,32 --seeds 3 \\
        --variants none,mean,max,thunderagent-ideal,cache-aware

``--breakdown`` prints instead, per (workers, variant, seed), where the requests that wait
are: a task's first request, a request whose session was released during the tool call
before it (``RequestRecord.release``), and the rest (kept on their node): how many, the
mean and p50/p90 of their hold in the pool, their TTFT p90, how many had a TTFT over 2 s (the
default SLO's bound) and how many of those spent over 2 s in the engine (queued behind other
requests' prefills, or their own) rather than in the pool.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

import shared.core.round as rnd
from shared.core.interrupt import InterruptCandidate
from shared.core.snapshot import TickCandidate
from shared.sim.des import SimConfig
from shared.sim.records import RequestRecord
from shared.sim.runner import simulate
from shared.sim.workloads import generate_tasks, load_workload
from shared.tables import render

_PRICE = rnd.View.release_price


def _longest_wait(view: rnd.View, ic: InterruptCandidate) -> tuple[float, float]:
    gain, cost = _PRICE(view, ic)
    snap = view.snapshot
    ages = [snap.now - c.waiting_since for c in snap.candidates if c.waiting_since is not None]
    return gain, cost + (max(ages) if ages else 0.0)


_TAIL = rnd.tail


def _priced_tail(view: rnd.View, pool: Sequence[TickCandidate]) -> list[rnd.Proposal]:
    snap = view.snapshot
    due: set[str] = set()
    for c in pool:
        if c.waiting_since is None:
            continue
        if any(c.weight <= view.free.get(b, 0) for b in c.eligible):
            price = 0.0
        else:
            target = rnd._clear_for(c, snap.interrupts, set(view.taken), view.free)
            if target is None:
                continue
            price = sum(view.release_price(ic)[1] for ic in target[1])
        if snap.now - c.waiting_since >= price:
            due.add(c.id)
    now = replace(view, rules=replace(view.rules, starve_s=1e-9))
    return _TAIL(now, [c for c in pool if c.id in due])


_VARIANTS: dict[str, tuple[str, Callable[..., tuple[float, float]], Callable[..., object]]] = {
    "none": ("tao", _PRICE, _TAIL),
    "mean": ("tao-slo", _PRICE, _TAIL),
    "max": ("tao", _longest_wait, _TAIL),
    "tail-priced": ("tao-fair", _PRICE, _priced_tail),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="claude-code")
    ap.add_argument("--profile", default="deepseek-4xh100")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=80)
    ap.add_argument("--workers", default="8,10,12,32")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--variants", default="none,mean,max,cache-aware")
    ap.add_argument("--breakdown", action="store_true")
    args = ap.parse_args()
    spec = load_workload(args.workload)
    rows: list[list[str]] = []
    for w in (int(x) for x in args.workers.split(",")):
        cfg = SimConfig(nodes=args.nodes, profile=args.profile, workers=w)
        per: dict[str, list[list[float]]] = {}
        for seed in range(args.seeds):
            tasks = generate_tasks(spec, args.tasks, seed)
            for v in args.variants.split(","):
                policy, price, tail = _VARIANTS.get(v, (v, _PRICE, _TAIL))
                rnd.View.release_price = price  # type: ignore[method-assign]
                rnd.tail = tail
                try:
                    res = simulate(tasks, cfg, policy, seed)
                finally:
                    rnd.View.release_price = _PRICE  # type: ignore[method-assign]
                    rnd.tail = _TAIL
                ttft = np.array([q.first_token - q.issued for q in res.requests])
                if args.breakdown:
                    _breakdown(w, v, seed, res.requests, rows)
                    continue
                latency = float(np.mean([t.end - t.start for t in res.tasks]))
                releases = sum(n for k, n in res.counters.items() if k.startswith("releases_"))
                per.setdefault(v, []).append(
                    [
                        float(np.percentile(ttft, 90)),
                        float(np.percentile(ttft, 99)),
                        latency,
                        max(t.end for t in res.tasks),
                        releases,
                    ]
                )
        for v, vals in [] if args.breakdown else per.items():
            m = np.mean(np.asarray(vals), axis=0)
            rows.append([str(w), v, f"{m[0]:.2f}", f"{m[1]:.1f}", *(f"{x:.0f}" for x in m[2:])])
    if args.breakdown:
        head = ["workers", "variant", "seed", "requests", "n", "hold mean s", "hold p50 s"]
        tail = ["hold p90 s", "TTFT p90 s", "TTFT > 2 s", "> 2 s in the engine"]
        print(render([*head, *tail], rows, markdown=True))
        return
    head = ["workers", "variant", "TTFT p90 s", "TTFT p99 s", "latency s", "makespan s"]
    print(render([*head, "releases"], rows, markdown=True))


def _breakdown(
    w: int, v: str, seed: int, reqs: Sequence[RequestRecord], rows: list[list[str]]
) -> None:
    hold = np.array([q.submitted - q.issued for q in reqs])
    ttft = np.array([q.first_token - q.issued for q in reqs])
    first = np.array([q.tool_end is None for q in reqs])
    released = np.array([q.release is not None for q in reqs]) & ~first
    for name, mask in (("first", first), ("released", released), ("kept", ~first & ~released)):
        if not mask.any():
            continue
        h = hold[mask]
        p50, p90 = np.percentile(h, [50, 90])
        over = ttft[mask] > 2.0
        engine = int((over & (ttft[mask] - h > 2.0)).sum())
        rows.append(
            [str(w), v, str(seed), name, str(int(mask.sum())), f"{h.mean():.2f}", f"{p50:.2f}",
             f"{p90:.2f}", f"{np.percentile(ttft[mask], 90):.2f}", str(int(over.sum())),
             str(engine)]
        )  # fmt: skip


if __name__ == "__main__":
    main()
