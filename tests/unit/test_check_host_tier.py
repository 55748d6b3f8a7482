"""scripts/check-host-tier.py, the operator's check of TAO's host-tier residency against a vLLM
engine with the OffloadingConnector: its argument checks, its prediction of vLLM's
``cached_tokens`` from the tiered residency (docs/kv-tier.md §3), its verdicts and its reading of
vLLM's usage, on recorded shapes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-host-tier.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_host_tier", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_host_tier"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


chk = _load()

# A vLLM 0.32 /v1/completions reply with --enable-prompt-tokens-details: the usage block
# (entrypoints/openai/chat_completion/serving.py:90-108@0.32; cached = local + external,
# v1/core/sched/scheduler.py:1074-1081@0.32).
REPLY = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "Qwen/Qwen3-32B",
    "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
    "usage": {
        "prompt_tokens": 4097,
        "total_tokens": 4098,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 4096},
    },
}


class TestPredictedCached:
    @pytest.mark.parametrize(
        ("gpu", "host", "prompt", "want", "why"),
        [
            (0, 4096, 4097, 4096, "all in the host tier: loaded, counted as cached"),
            (1024, 4096, 4097, 4096, "GPU head, the host tier continues to its first miss"),
            (4096, 1024, 4097, 4096, "the GPU run is the longer"),
            (0, 0, 4097, 0, "nowhere"),
            (4096, 0, 4096, 4080, "the last token is always computed"),
            (0, 4100, 5000, 4096, "whole blocks only"),
        ],
    )
    def test_the_gpu_hit_then_the_host_run(
        self, gpu: int, host: int, prompt: int, want: int, why: str
    ) -> None:
        assert chk.predicted_cached(gpu, host, prompt, 16) == want, why

    def test_bad_block_size(self) -> None:
        with pytest.raises(ValueError, match="block_size"):
            chk.predicted_cached(0, 0, 10, 0)


class TestUsage:
    def test_cached_tokens_of_a_vllm_reply(self) -> None:
        assert chk.cached_tokens_of(REPLY) == 4096

    @pytest.mark.parametrize(
        "usage",
        [
            {"prompt_tokens": 10, "total_tokens": 11, "completion_tokens": 1},  # no details
            {"prompt_tokens_details": None},
            {"prompt_tokens_details": {"cached_tokens": True}},
        ],
    )
    def test_absent_details_are_none(self, usage: dict[str, object]) -> None:
        """A server without --enable-prompt-tokens-details sends no details."""
        assert chk.cached_tokens_of({"usage": usage}) is None
        assert chk.cached_tokens_of({}) is None


def _verdict(**kw: object) -> dict[str, bool]:
    base: dict[str, object] = {
        "prefix_tokens": 4096,
        "prompt_tokens": 4097,
        "block_size": 16,
        "host_events": 256,
        "stored": chk.View(4096, 4096),
        "before_reuse": chk.View(0, 4096),
        "cached": 4096,
    }
    base.update(kw)
    return {c.name: c.ok for c in chk.verdict(**base)}


class TestVerdict:
    def test_a_good_run_passes_every_check(self) -> None:
        assert _verdict() == dict.fromkeys(
            ("host_events", "stored_in_host", "pushed_out_of_gpu", "cached_tokens"), True
        )

    @pytest.mark.parametrize(
        ("change", "fails"),
        [
            ({"host_events": 0}, "host_events"),
            ({"stored": chk.View(4096, 2048)}, "stored_in_host"),
            ({"before_reuse": chk.View(4096, 4096)}, "pushed_out_of_gpu"),
            ({"cached": 2048}, "cached_tokens"),
            ({"cached": None}, "cached_tokens"),
        ],
    )
    def test_each_check_fails_on_its_own(self, change: dict[str, object], fails: str) -> None:
        got = _verdict(**change)
        assert [name for name, ok in got.items() if not ok] == [fails]

    def test_tolerance_and_telemetry(self) -> None:
        assert _verdict(cached=4080, tolerance_blocks=1)["cached_tokens"]
        assert _verdict(telemetry=chk.View(0, 4096))["telemetry_agrees"]
        assert not _verdict(telemetry=chk.View(0, 0))["telemetry_agrees"]


class TestArguments:
    def test_help_runs(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exc:
            chk.parse(["--help"])
        assert exc.value.code == 0 and "--kv-events" in capsys.readouterr().out

    @pytest.mark.parametrize(
        ("argv", "says"),
        [
            (["--kv-events", "tcp://h:1"], "--url"),
            (["--url", "h:8000", "--kv-events", "tcp://h:1"], "--url: must start with"),
            (["--url", "http://h", "--kv-events", "h:1"], "--kv-events: must start with"),
            (["--url", "http://h", "--kv-events", "tcp://h:1", "--prefix-tokens", "16"], "two"),
            (["--url", "http://h", "--kv-events", "tcp://h:1", "--settle-s", "nan"], "finite"),
        ],
    )
    def test_bad_arguments_exit_2_with_one_line(
        self, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exc:
            chk.parse(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and says in err[0], err
