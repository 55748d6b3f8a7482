"""The Prometheus text parser and the vLLM metric extraction (services.telemetry)."""

from __future__ import annotations

import math

import pytest

from services.telemetry.prom import PromParseError, Sample, parse, parse_lenient, parse_line
from services.telemetry.vllm_metrics import from_samples

VLLM_V1 = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27034",sliding_window="None"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 12000.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 9000.0
vllm:prefix_cache_hits_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7e+09
"""  # noqa: E501


class TestParseLine:
    def test_sample_with_labels(self) -> None:
        """A sample line yields its name, labels and value."""
        s = parse_line('m{a="1",b="x y"} 2.5')
        assert s == Sample(name="m", value=2.5, labels={"a": "1", "b": "x y"})

    def test_comments_and_blank_lines(self) -> None:
        """HELP/TYPE comments and blank lines yield nothing."""
        assert parse_line("# HELP m help") is None
        assert parse_line("   ") is None

    def test_escapes_in_label_values(self) -> None:
        """Backslash, quote and newline escapes are decoded; braces and commas inside quotes
        are data."""
        s = parse_line(r'm{p="a\\b",q="say \"hi\"",r="l1\nl2",s="{,}"} 1')
        assert s is not None
        assert s.labels == {"p": "a\\b", "q": 'say "hi"', "r": "l1\nl2", "s": "{,}"}

    def test_special_values_and_timestamp(self) -> None:
        """NaN, +Inf, -Inf parse and a trailing timestamp is accepted."""
        nan = parse_line("m NaN")
        assert nan is not None and math.isnan(nan.value)
        assert parse_line("m +Inf 1700000000000") == Sample("m", math.inf, {})
        assert parse_line("m{} -Inf") == Sample("m", -math.inf, {})

    def test_spaces_and_trailing_comma(self) -> None:
        """Spaces around label tokens and a trailing comma in the label set are accepted."""
        assert parse_line('m{ a = "1" , } 7') == Sample("m", 7.0, {"a": "1"})

    @pytest.mark.parametrize(
        ("line", "reason"),
        [
            ('m{a="1"', "expected ',' or '}'"),
            ("m{a=1} 2", "double-quoted"),
            ('m{a="1} 2', "unterminated"),
            ("m", "has no value"),
            ("m abc", "not a number"),
            ("m 1 2 3", "unexpected text"),
            ('{a="1"} 2', "metric name"),
        ],
    )
    def test_bad_lines_name_the_problem(self, line: str, reason: str) -> None:
        """A malformed line raises PromParseError saying what is wrong."""
        with pytest.raises(PromParseError, match=reason):
            parse_line(line, 7)


class TestParsePage:
    def test_strict_raises_with_line_number(self) -> None:
        """The strict parser names the first bad line's number."""
        with pytest.raises(PromParseError, match="metrics line 2"):
            parse("a 1\nb{x} 2\n")

    def test_lenient_skips_bad_lines(self) -> None:
        """The lenient parser keeps the good samples and reports the bad lines."""
        samples, errors = parse_lenient("a 1\nb{x} 2\nc 3\n")
        assert [s.name for s in samples] == ["a", "c"]
        assert [e.line for e in errors] == [2]


class TestVllmMetrics:
    def test_v1_page(self) -> None:
        """A vLLM v1 page gives capacity = blocks × block size, usage, counts and counters."""
        m = from_samples(parse(VLLM_V1))
        assert m.capacity_tokens == 27034 * 16
        assert m.block_size == 16
        assert m.usage == 0.25
        assert m.used_tokens == round(0.25 * 27034 * 16)
        assert (m.running, m.waiting) == (3, 2)
        assert (m.prefix_cache_queries, m.prefix_cache_hits) == (12000, 9000)
        assert m.model_names == ("Qwen/Qwen3-8B",)

    def test_order_does_not_matter(self) -> None:
        """The same series in reverse order give the same metrics."""
        lines = VLLM_V1.splitlines()
        assert from_samples(parse("\n".join(reversed(lines)))) == from_samples(parse(VLLM_V1))

    def test_v0_names_are_fallbacks(self) -> None:
        """vLLM v0's gpu_cache_usage_perc and gpu_prefix_cache_* names are read."""
        page = (
            'vllm:cache_config_info{block_size="32",num_gpu_blocks="100"} 1\n'
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
            'vllm:gpu_prefix_cache_queries_total{model_name="m"} 10\n'
            'vllm:gpu_prefix_cache_hits_total{model_name="m"} 4\n'
        )
        m = from_samples(parse(page))
        assert (m.capacity_tokens, m.usage) == (3200, 0.5)
        assert (m.prefix_cache_queries, m.prefix_cache_hits) == (10, 4)

    def test_data_parallel_engines_are_summed(self) -> None:
        """Two engines: capacity and counts add up, usage is block-weighted."""
        page = (
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1\n'
            'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="300"} 1\n'
            'vllm:kv_cache_usage_perc{engine="0"} 1.0\n'
            'vllm:kv_cache_usage_perc{engine="1"} 0.0\n'
            'vllm:num_requests_running{engine="0"} 1\n'
            'vllm:num_requests_running{engine="1"} 2\n'
        )
        m = from_samples(parse(page))
        assert m.capacity_tokens == 400 * 16
        assert m.usage == 0.25
        assert m.running == 3

    def test_unprofiled_capacity_is_zero(self) -> None:
        """num_gpu_blocks="None" (engine not profiled yet) leaves the capacity unknown (0)."""
        m = from_samples(parse('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1'))
        assert m.capacity_tokens == 0
        assert m.prefix_cache_queries is None

    def test_usage_is_clamped_and_nan_ignored(self) -> None:
        """A NaN usage series is ignored and a value above 1 is clamped."""
        assert from_samples(parse("vllm:kv_cache_usage_perc NaN")).usage == 0.0
        assert from_samples(parse("vllm:kv_cache_usage_perc 1.5")).usage == 1.0
