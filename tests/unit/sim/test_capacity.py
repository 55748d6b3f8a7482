"""Agents within an SLO (shared/sim/capacity.py, ``tao sim --capacity``): SLO parsing and
evaluation, the doubling-then-bisection search on fake monotone evaluators, and one small
end-to-end run of the command."""

from __future__ import annotations

import io
import os

import orjson
import pytest

from shared.cli.main import build_parser
from shared.sim.capacity import SloTerm, interval, parse_slo, search_capacity


class TestSlo:
    """``metric=value`` terms: times are upper bounds, decode rates floors; bad terms raise."""

    def test_parse(self) -> None:
        slo = parse_slo("ttft_p90=2, decode_p10=15,latency_mean=300")
        assert slo.terms == (
            SloTerm("ttft_p90", 2.0),
            SloTerm("decode_p10", 15.0),
            SloTerm("latency_mean", 300.0),
        )
        assert str(slo) == "ttft_p90<=2,decode_p10>=15,latency_mean<=300"

    @pytest.mark.parametrize(
        "text", ["ttft=2", "ttft_p90", "ttft_p90=-1", "ttft_p0=1", "decode_mean=3", "x_p90=1",
                 "ttft_p90=2,ttft_p90=3", "ttft_p90=abc"],
    )  # fmt: skip
    def test_rejects(self, text: str) -> None:
        with pytest.raises(ValueError, match="slo"):
            parse_slo(text)

    def test_met(self) -> None:
        slo = parse_slo("ttft_p90=2,decode_p10=10")
        assert slo.met({"ttft_p90": 2.0, "decode_p10": 10.0})
        assert not slo.met({"ttft_p90": 2.01, "decode_p10": 50.0})
        assert not slo.met({"ttft_p90": 1.0, "decode_p10": 9.9})
        assert not slo.met({"ttft_p90": None, "decode_p10": 50.0})  # no requests: not met


class TestSearch:
    """Doubling from ``start`` while the SLO holds, then bisection to the resolution."""

    @pytest.mark.parametrize("true_cap", [0, 1, 3, 4, 5, 17, 63, 64, 100, 511])
    def test_finds_the_largest_passing_count_exactly_at_resolution_zero(
        self, true_cap: int
    ) -> None:
        s = search_capacity(lambda w: w <= true_cap, start=4, max_workers=512, resolution=0.0)
        assert s.best == true_cap
        assert not s.capped
        assert all(ok == (w <= true_cap) for w, ok in s.tried.items())

    def test_doubling_then_bisection_order(self) -> None:
        s = search_capacity(lambda w: w <= 20, start=4, max_workers=512, resolution=0.0)
        assert list(s.tried) == [4, 8, 16, 32, 24, 20, 22, 21]

    def test_relative_resolution_stops_early_within_it(self) -> None:
        s = search_capacity(lambda w: w <= 100, start=4, max_workers=512, resolution=0.1)
        fail = min(w for w, ok in s.tried.items() if not ok)
        assert s.best <= 100 < fail
        assert fail - s.best <= max(1, 0.1 * s.best)
        assert len(s.tried) < len(search_capacity(lambda w: w <= 100, resolution=0.0).tried)

    def test_capped_when_nothing_fails(self) -> None:
        s = search_capacity(lambda w: True, start=4, max_workers=50)
        assert (s.best, s.capped) == (50, True)
        assert list(s.tried) == [4, 8, 16, 32, 50]

    def test_each_count_runs_once(self) -> None:
        calls: list[int] = []

        def meets(w: int) -> bool:
            calls.append(w)
            return w <= 9

        search_capacity(meets, start=3, resolution=0.0)
        assert len(calls) == len(set(calls))

    def test_bad_bounds(self) -> None:
        with pytest.raises(ValueError, match="start"):
            search_capacity(lambda w: True, start=0)
        with pytest.raises(ValueError, match="resolution"):
            search_capacity(lambda w: True, resolution=-1)

    def test_interval(self) -> None:
        assert interval([3.0]) == (3.0, None)
        m, h = interval([2.0, 4.0])
        assert m == 3.0 and h is not None and 12.0 < h < 13.0  # t(0.975, 1) = 12.706


class TestCommand:
    """``tao sim --capacity`` end to end on a tiny config: the table, JSON and the PNG."""

    def _run(self, tmp_path: os.PathLike[str], *extra: str) -> str:
        args = build_parser().parse_args(
            ["sim", "--capacity", "--workload", "swe-lite", "--nodes", "1", "--tasks", "8",
             "--seeds", "2", "--start-workers", "2", "--max-workers", "4",
             "--policies", "tao,thunderagent", "--quiet", "--out", str(tmp_path), *extra]
        )  # fmt: skip
        out = io.StringIO()
        assert args.run(args, out) == 0
        return out.getvalue()

    def test_json_and_plot(self, tmp_path: os.PathLike[str]) -> None:
        doc = orjson.loads(self._run(tmp_path, "--json"))
        assert doc["slo"] == "ttft_p90<=2"
        rows = {r["policy"]: r for r in doc["rows"]}
        assert set(rows) == {"tao", "thunderagent"}
        for r in rows.values():
            assert set(r["agents_per_node"]) == {"0", "1"}
            assert all(0 <= v <= 4 for v in r["agents_per_node"].values())
        assert doc["best_baseline"] == "thunderagent"
        assert os.path.getsize(os.path.join(tmp_path, "capacity-swe-lite.png")) > 1000

    def test_table_and_bad_slo(self, tmp_path: os.PathLike[str]) -> None:
        text = self._run(tmp_path, "--slo", "ttft_p99=5,decode_p10=1")
        assert "SLO ttft_p99<=5,decode_p10>=1" in text
        assert "agents/node" in text and "thunderagent" in text
        args = build_parser().parse_args(["sim", "--capacity", "--slo", "ttft=2"])
        with pytest.raises(Exception, match="--slo"):
            args.run(args, io.StringIO())

    def test_search_stops_at_the_task_count(self, tmp_path: os.PathLike[str]) -> None:
        """More workers than tasks is the same run (every task at once): a search whose SLO
        always holds tops out at the task count, not at --max-workers, and the table says
        the figure is a lower bound."""
        args = build_parser().parse_args(
            ["sim", "--capacity", "--workload", "swe-lite", "--nodes", "1", "--tasks", "3",
             "--seeds", "1", "--start-workers", "2", "--max-workers", "64",
             "--slo", "ttft_p90=100000", "--policies", "tao", "--quiet", "--json"]
        )  # fmt: skip
        out = io.StringIO()
        assert args.run(args, out) == 0
        doc = orjson.loads(out.getvalue())
        (row,) = doc["rows"]
        assert row["agents_per_node"] == {"0": 3.0} and row["capped"]
        assert sorted({p[2] for p in doc["points"]}) == [2, 3]
        args = build_parser().parse_args(
            ["sim", "--capacity", "--workload", "swe-lite", "--nodes", "1", "--tasks", "3",
             "--seeds", "1", "--max-workers", "64", "--slo", "ttft_p90=100000",
             "--policies", "tao", "--quiet"]
        )  # fmt: skip
        out = io.StringIO()
        assert args.run(args, out) == 0
        assert "a lower bound, not a capacity" in out.getvalue()
