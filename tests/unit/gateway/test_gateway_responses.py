"""Unit tests of SSE framing and usage / finish / tool-call accumulation."""

from __future__ import annotations

import orjson

from services.gateway.responses import SSESplitter, StreamStats, event_data, stats_from_body
from shared.contracts import ToolCallInfo, Usage


def ev(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class TestSSESplitter:
    def test_events_across_chunk_boundaries(self) -> None:
        """Events split over reads come out whole and byte-identical."""
        stream = b"data: a\n\n" + b"data: b\r\n\r\n" + b": comment\n\ndata: [DONE]\n\n"
        splitter = SSESplitter()
        events = [e for i in range(0, len(stream), 3) for e in splitter.feed(stream[i : i + 3])]
        assert b"".join(events) == stream
        assert events == [b"data: a\n\n", b"data: b\r\n\r\n", b": comment\n\n", b"data: [DONE]\n\n"]
        assert splitter.rest() == b""

    def test_rest_keeps_an_unterminated_tail(self) -> None:
        """Bytes after the last blank line are kept for the caller."""
        splitter = SSESplitter()
        assert splitter.feed(b"data: x\n\ndata: y") == [b"data: x\n\n"]
        assert splitter.rest() == b"data: y"

    def test_event_data_joins_data_lines(self) -> None:
        """Multiple data lines join with newlines; events without data give None."""
        assert event_data(b"event: e\ndata: a\ndata:b\n\n") == "a\nb"
        assert event_data(b": ping\n\n") is None


class TestStreamStats:
    def test_usage_chunk_dropped_unless_kept(self) -> None:
        """The choices-less usage chunk is hidden unless the client asked for usage."""
        usage_chunk = ev(
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": 5,
                    "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 4},
                },
            }
        )
        hidden = StreamStats(keep_usage_chunk=False)
        assert hidden.observe(ev({"choices": [{"index": 0, "delta": {"content": "x"}}]}))
        assert not hidden.observe(usage_chunk)
        assert hidden.observe(b"data: [DONE]\n\n") and hidden.done
        assert hidden.result().usage == Usage(
            prompt_tokens=5, completion_tokens=2, cached_tokens=4, total_tokens=7
        )
        assert StreamStats(keep_usage_chunk=True).observe(usage_chunk)

    def test_tool_calls_accumulate_by_index(self) -> None:
        """Fragments join per index: id and name from the first, argument bytes summed."""
        stats = StreamStats(keep_usage_chunk=False)
        frags = [
            [{"index": 0, "id": "a", "function": {"name": "bash", "arguments": "{"}}],
            [{"index": 1, "id": "b", "function": {"name": "edit", "arguments": ""}}],
            [{"index": 0, "function": {"arguments": "}é"}}],
        ]
        for calls in frags:
            stats.observe(ev({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]}))
        stats.observe(ev({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}))
        result = stats.result()
        assert result.tool_calls == [
            ToolCallInfo(id="a", name="bash", arguments_bytes=4),
            ToolCallInfo(id="b", name="edit", arguments_bytes=0),
        ]
        assert result.finish_reason == "tool_calls"

    def test_first_token_is_first_output_not_role_chunk(self) -> None:
        """The role-only opening chunk does not count as the first token; content does."""
        stats = StreamStats(keep_usage_chunk=False)
        stats.observe(
            ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        )
        assert not stats.first_token_seen
        stats.observe(ev({"choices": [{"index": 0, "delta": {"content": "a"}}]}))
        assert stats.first_token_seen
        completion = StreamStats(keep_usage_chunk=False)
        completion.observe(ev({"choices": [{"index": 0, "text": "x"}]}))
        assert completion.first_token_seen

    def test_non_json_events_pass_through(self) -> None:
        """An event the gateway cannot read is forwarded and changes nothing."""
        stats = StreamStats(keep_usage_chunk=False)
        assert stats.observe(b"data: {not json\n\n")
        assert stats.result().usage == Usage() and not stats.first_token_seen


class TestStatsFromBody:
    def test_reads_usage_finish_and_tool_calls(self) -> None:
        """A JSON completion gives usage, finish reason and tool calls."""
        body = orjson.dumps(
            {
                "choices": [
                    {
                        "finish_reason": "tool_calls",
                        "message": {
                            "tool_calls": [
                                {"id": "c1", "function": {"name": "ls", "arguments": "{}"}}
                            ]
                        },
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )
        stats = stats_from_body(body)
        assert stats.usage.total_tokens == 4 and stats.finish_reason == "tool_calls"
        assert stats.tool_calls == [ToolCallInfo(id="c1", name="ls", arguments_bytes=2)]

    def test_unreadable_body_gives_empty_stats(self) -> None:
        """An error page that is not JSON yields empty stats rather than an exception."""
        stats = stats_from_body(b"<html>bad gateway</html>")
        assert stats.usage == Usage() and stats.finish_reason is None and stats.tool_calls == []
