"""The ``paper-deepseek`` profile: built in, selectable by ``tao sim``, fitted to baselines only."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.fit_paper_profile import (
    FIT_POLICIES,
    PAPER_BASELINES,
    best_baseline,
    candidate,
    objective,
)
from shared.cli.main import main
from shared.core.engine import PROFILES
from shared.sim.report import is_baseline

# TAO's own figures in the paper's Table 1 (DeepSeek, SWE-Lite; summary §4.2): the fit must
# never read them.
TAO_TABLE1 = (
    (16, "latency_mean", 113.264),
    (16, "ttft_mean", 0.135),
    (16, "decode_tps", 934.967),
    (64, "latency_mean", 185.410),
    (64, "ttft_mean", 0.224),
    (64, "decode_tps", 2021.523),
)

Metrics = dict[str, float | int | None]


def runs_at_paper(
    extra: dict[tuple[str, int], Metrics] | None = None,
) -> dict[tuple[str, int], Metrics]:
    """Every fit baseline at every fit point, each exactly at the paper's best-baseline figure."""
    runs: dict[tuple[str, int], Metrics] = {}
    for pol in FIT_POLICIES:
        for w in {f.workers for f in PAPER_BASELINES}:
            runs[(pol, w)] = {f.metric: f.value for f in PAPER_BASELINES if f.workers == w}
    runs.update(extra or {})
    return runs


class TestProfile:
    """The profile is built in, well-formed, and says it was fitted."""

    @pytest.mark.parametrize(
        ("field", "check"),
        [
            ("kv_tokens", lambda p: p.kv_tokens % p.block_size == 0),
            ("kv_tokens", lambda p: p.kv_tokens > PROFILES["deepseek-4xh100"].kv_tokens),
            ("decode_c", lambda p: p.decode_c > 0),
            ("prefill_b", lambda p: p.prefill_b > 0),
            ("source", lambda p: "fit_paper_profile" in p.source and "baseline" in p.source),
        ],
    )
    def test_fields(self, field: str, check: object) -> None:
        """Whole KV blocks, positive costs, more KV than the stand-in, the fit named in source."""
        p = PROFILES["paper-deepseek"]
        assert callable(check) and check(p), field

    def test_selectable_by_tao_sim(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``tao sim --profile paper-deepseek`` runs and reports its runs."""
        code = main(["sim", "--profile", "paper-deepseek", "--tasks", "2", "--workers", "2",
                     "--policies", "cache-aware", "--json", "--quiet"])  # fmt: skip
        out, _ = capsys.readouterr()
        assert code == 0
        runs = json.loads(out)["runs"]
        assert [r["policy"] for r in runs] == ["cache-aware"] and runs[0]["metrics"]["tasks"] == 2

    def test_listed_in_help(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The profile is among those --help lists."""
        assert main(["sim", "--help"]) == 0
        assert "paper-deepseek" in capsys.readouterr().out


class TestFitUsesBaselinesOnly:
    """The fit's targets and objective read the paper's baseline rows and nothing of TAO's."""

    @pytest.mark.parametrize(("workers", "metric", "value"), TAO_TABLE1)
    def test_no_tao_figure_is_a_target(self, workers: int, metric: str, value: float) -> None:
        """None of TAO's Table 1 figures is among the targets."""
        assert all(f.value != value for f in PAPER_BASELINES)
        target = [f for f in PAPER_BASELINES if (f.workers, f.metric) == (workers, metric)]
        assert len(target) == 1 and target[0].value != value

    def test_every_target_is_a_baseline_row(self) -> None:
        """Each target is labelled as the paper's best-baseline column."""
        assert {f.row for f in PAPER_BASELINES} == {"best baseline"}

    @pytest.mark.parametrize("policy", FIT_POLICIES)
    def test_simulated_side_is_baselines(self, policy: str) -> None:
        """The fit simulates baselines only, no TAO-family policy."""
        assert is_baseline(policy) and not policy.startswith("tao")

    def test_zero_at_the_paper(self) -> None:
        """Simulated best baselines equal to the paper's give objective 0."""
        assert objective(runs_at_paper()) == pytest.approx(0.0, abs=1e-12)

    @pytest.mark.parametrize("w", [16, 64])
    def test_tao_runs_change_nothing(self, w: int) -> None:
        """A TAO run among the runs, however good, leaves the objective as it was."""
        tao: Metrics = {"latency_mean": 1.0, "ttft_mean": 0.001, "decode_tps": 1e6}
        assert objective(runs_at_paper({("tao", w): tao})) == objective(runs_at_paper())

    @pytest.mark.parametrize(
        ("metric", "factor", "which", "best_factor"),
        [
            ("latency_mean", 2.0, "all", 2.0),  # every baseline slower: the best is slower
            ("latency_mean", 2.0, "one", 1.0),  # one slower: the best is unchanged
            ("ttft_mean", 0.5, "one", 0.5),  # one faster: it is the best now
            ("decode_tps", 2.0, "one", 2.0),  # higher is better for decode
        ],
    )
    def test_the_best_baseline_is_compared(
        self, metric: str, factor: float, which: str, best_factor: float
    ) -> None:
        """The best of the four baselines per metric is what the paper's figure is compared
        with; the objective moves by ln(best / paper)² for the fitted figures only."""
        runs = runs_at_paper()
        base = runs[("rr", 64)][metric]
        assert isinstance(base, float)
        for pol in FIT_POLICIES if which == "all" else FIT_POLICIES[:1]:
            runs[(pol, 64)] = {**runs[(pol, 64)], metric: base * factor}
        assert best_baseline(runs, 64, metric) == pytest.approx(base * best_factor)
        fitted = any(f.fitted for f in PAPER_BASELINES if (f.workers, f.metric) == (64, metric))
        expected = math.log(best_factor) ** 2 if fitted else 0.0
        assert objective(runs) == pytest.approx(expected)


class TestTheFitsResult:
    """The built-in profile is the point the fit script reached, not numbers set by hand."""

    @pytest.mark.parametrize(
        "field",
        ["kv_tokens", "prefill_a", "prefill_b", "prefill_f", "decode_c", "decode_d", "decode_e",
         "max_num_seqs", "max_batched_tokens", "block_size"],
    )  # fmt: skip
    def test_equals_the_candidate(self, field: str) -> None:
        """Each field equals the fit's candidate at (589,824 tokens, prefill x1.41, x0.354)."""
        assert getattr(PROFILES["paper-deepseek"], field) == getattr(
            candidate(589_824, 1.41, 0.354), field
        )


class TestCandidate:
    """A fit candidate scales the stand-in's prefill and decode terms, and nothing else."""

    @pytest.mark.parametrize(
        ("field", "scale"),
        [("prefill_a", "p"), ("prefill_b", "p"), ("prefill_f", "p"),
         ("decode_c", "d"), ("decode_d", "d"), ("decode_e", "d")],
    )  # fmt: skip
    def test_scaled(self, field: str, scale: str) -> None:
        """Each step term is the stand-in's times its factor."""
        base = PROFILES["deepseek-4xh100"]
        p = candidate(300_000, 0.5, 0.25)
        factor = 0.5 if scale == "p" else 0.25
        assert getattr(p, field) == pytest.approx(getattr(base, field) * factor)
        assert p.kv_tokens == 300_000 and p.max_num_seqs == base.max_num_seqs
