"""The gateway's Prometheus metrics, rendered in the text exposition format.

Format: https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format
(``# HELP`` / ``# TYPE`` lines, then ``name{label="value"} value``; histograms as cumulative
``_bucket{le=...}`` series plus ``_sum`` and ``_count``). Kept in-process and tiny rather than
pulling in a client library: the gateway has a handful of series.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Final

__all__ = ["HOLD_BUCKETS_S", "GatewayMetrics", "escape_label", "labelled_union"]

HOLD_BUCKETS_S: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds of the hold-time histogram, seconds (default hold limit is 120 s)."""

Labels = tuple[tuple[str, str], ...]


def escape_label(value: str) -> str:
    """A label value in the exposition format (backslash, quote and newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in labels) + "}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class _Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self.values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        out += [f"{self.name}{_fmt_labels(k)} {_num(v)}" for k, v in sorted(self.values.items())]
        return out


class _Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            out.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {running}')
        out.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        out += [f"{self.name}_sum {_num(self.sum)}", f"{self.name}_count {self.count}"]
        return out


class GatewayMetrics:
    """Counters, the held-now gauge and the hold-time histogram of one gateway."""

    def __init__(
        self,
        held_now: Callable[[], int],
        admitted_now: Callable[[], int],
        paced_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._held_now = held_now
        self._admitted_now = admitted_now
        self._paced_s = paced_s
        self.requests = _Counter(
            "tao_gateway_requests_total", "Model requests answered, by endpoint and outcome."
        )
        self.unavailable = _Counter(
            "tao_gateway_unavailable_total", "Requests answered 503 after the hold timeout."
        )
        self.forwarded = _Counter("tao_gateway_forwarded_total", "Requests forwarded, by node.")
        self.upstream_errors = _Counter(
            "tao_gateway_upstream_errors_total", "Failed forwards, by node and kind."
        )
        self.placements = _Counter(
            "tao_gateway_placements_total", "Placements received, by kind and result."
        )
        self.store_admissions = _Counter(
            "tao_gateway_store_admissions_total",
            "Admissions read from the state store (placement missed), by when: arrival or held.",
        )
        self.hooks = _Counter(
            "tao_gateway_hooks_total",
            "Hook posts, by result: forwarded, dropped, unauthorized, not_found, rate_limited.",
        )
        self.hold_seconds = _Histogram(
            "tao_gateway_hold_seconds", "Time a request was held before admission.", HOLD_BUCKETS_S
        )

    def render(self) -> str:
        """The whole page in the Prometheus text format."""
        lines: list[str] = []
        for counter in (
            self.requests,
            self.unavailable,
            self.forwarded,
            self.upstream_errors,
            self.placements,
            self.store_admissions,
            self.hooks,
        ):
            lines += counter.render()
        lines += [
            "# HELP tao_gateway_held_requests Requests held now, waiting for admission.",
            "# TYPE tao_gateway_held_requests gauge",
            f"tao_gateway_held_requests {self._held_now()}",
            "# HELP tao_gateway_admitted_sessions Sessions admitted now, per received placements.",
            "# TYPE tao_gateway_admitted_sessions gauge",
            f"tao_gateway_admitted_sessions {self._admitted_now()}",
            "# HELP tao_gateway_body_paced_seconds_total Seconds request bodies waited for "
            "their client's byte budget (TAO_BODY_CLIENT_RATE).",
            "# TYPE tao_gateway_body_paced_seconds_total counter",
            f"tao_gateway_body_paced_seconds_total {_num(self._paced_s())}",
        ]
        lines += self.hold_seconds.render()
        return "\n".join(lines) + "\n"


def labelled_union(pages: dict[str, str], label: str) -> str:
    """One exposition page from several (``label`` value → page): each family's ``# HELP`` and
    ``# TYPE`` once, then every page's samples with ``label="<value>"`` added (the gateway of
    several domains: ``domain``). A sample belongs to the family of the comment lines before it
    (each family of these pages has its own)."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for value, page in pages.items():
        family = ""
        tag = f'{label}="{escape_label(value)}"'
        for line in page.splitlines():
            if not line:
                continue
            if line.startswith("# "):
                parts = line.split(" ", 3)
                family = parts[2] if len(parts) > 2 else ""
                head, _ = families.setdefault(family, ([], []))
                if line not in head:
                    head.append(line)
                continue
            name, brace, rest = line.partition("{")
            if brace:
                sample = f"{name}{{{tag},{rest}"
            else:
                metric, _, number = line.partition(" ")
                sample = f"{metric}{{{tag}}} {number}"
            families.setdefault(family or name.split(" ")[0], ([], []))[1].append(sample)
    return "".join("\n".join(head + samples) + "\n" for head, samples in families.values())
