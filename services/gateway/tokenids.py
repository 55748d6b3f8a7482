"""Token ids from the nodes: asking for them, reading them, hiding them, keying their blocks.

vLLM's OpenAI server takes a request field ``return_token_ids`` (a bool, added in vLLM 0.10.2 by
vllm-project/vllm PR #22587; ``ChatCompletionRequest`` in
vllm/entrypoints/openai/chat_completion/protocol.py and ``CompletionRequest`` in
vllm/entrypoints/openai/completion/protocol.py, formerly both in
vllm/entrypoints/openai/protocol.py). When it is true the response carries:

* chat, non-streaming: ``prompt_token_ids`` at the top level (``ChatCompletionResponse``) and
  ``token_ids`` on each choice (``ChatCompletionResponseChoice``);
* chat, streaming: ``prompt_token_ids`` at the top level of the first chunk only (the role
  chunk) and ``token_ids`` on each streamed choice with that chunk's new ids
  (``ChatCompletionStreamResponse`` / ``ChatCompletionResponseStreamChoice``); with the field
  set vLLM sends a chunk even when a parser held the text back, so every id is streamed
  (``delta_message is None`` branch of vllm/entrypoints/openai/chat_completion/serving.py);
* completions: ``prompt_token_ids`` and ``token_ids`` on the choice, the prompt ids on the first
  streamed chunk of a choice (``CompletionResponseChoice`` / ``CompletionResponseStreamChoice``).

The gateway asks for them (unless the node is known not to take the field), reads the ids of
choice 0, and removes the three fields from what the client receives unless the client asked
for them itself. Only chat and completions have the field; vLLM's Anthropic ``/v1/messages``
request model does not (vllm/entrypoints/anthropic/protocol.py).

Fallback: a node that refuses the field (HTTP 400/422 naming it, or "extra inputs are not
permitted") gets the request once more without it and is not asked again (logged once); a
response without ids, or a node of unknown block size, gives no block keys, and telemetry keeps
to usage-based residency.

Block keys are TAO's own chain (:func:`shared.core.blockkeys.chain_keys`) over the *prompt* ids
with the node's block size, computed once per response. The output ids are left out: vLLM
caches the blocks its output fills, but the next request of a chat session carries the reply
as a message that the chat template renders and the tokenizer encodes again, so the ids (and
the block hashes) after the prompt need not be the ones generated, and the next prompt shares
only the previous prompt's blocks for certain. Measured on vLLM 0.32 (CPU build, a tiny local
model, block size 32): counting output blocks credited 960 and 1,152 tokens where the next
request's ``cached_tokens`` were 896 and 1,120.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from shared.core.blockkeys import chain_keys

__all__ = [
    "FIELD",
    "TokenIdNodes",
    "block_keys_of",
    "client_wants_ids",
    "rejects_field",
    "take_ids",
]

FIELD: Final = "return_token_ids"
_PROMPT: Final = "prompt_token_ids"
_OUTPUT: Final = "token_ids"


def client_wants_ids(body: Mapping[str, Any]) -> bool:
    """Whether the client itself asked for token ids (then the gateway leaves them in)."""
    return body.get(FIELD) is True


def rejects_field(status: int, body: bytes) -> bool:
    """Whether an error answer refuses ``return_token_ids`` (so a retry without it may pass)."""
    if status not in (400, 422):
        return False
    text = body.lower()
    return FIELD.encode() in text or (b"extra" in text and b"not permitted" in text)


def _choice0(obj: dict[str, Any]) -> dict[str, Any] | None:
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def take_ids(
    obj: dict[str, Any], strip: str | None = None
) -> tuple[list[Any] | None, list[Any] | None, bool]:
    """Prompt ids and choice-0 output ids of one response or chunk ``obj``, and whether any id
    field held a value. ``strip="null"`` sets the fields of every choice to ``null`` (how vLLM
    writes a non-streaming response not asked for ids), ``strip="drop"`` removes them (how it
    writes a chunk); ``None`` leaves ``obj`` as it is.

    Ids are taken as sent; :func:`block_keys_of` refuses lists that are not token ids.
    """
    holders: list[dict[str, Any]] = [obj]
    choices = obj.get("choices")
    if isinstance(choices, list):
        holders += [c for c in choices if isinstance(c, dict)]
    first = _choice0(obj)
    prompt = obj.get(_PROMPT)
    if prompt is None and first is not None:
        prompt = first.get(_PROMPT)
    output = first.get(_OUTPUT) if first is not None else None
    found = False
    for holder in holders:
        for key in (_PROMPT, _OUTPUT):
            if holder.get(key) is not None:
                found = True
                if strip == "drop":
                    del holder[key]
                elif strip == "null":
                    holder[key] = None
    return (
        prompt if isinstance(prompt, list) else None,
        output if isinstance(output, list) else None,
        found,
    )


def block_keys_of(prompt: list[Any] | None, block_size: int | None) -> list[int] | None:
    """TAO's keys of the full blocks of ``prompt`` (what the session's next prompt can share;
    the module docstring says why not its output); ``None`` without prompt ids, with no known
    block size, or when the ids are not token ids (uint32)."""
    if prompt is None or not block_size or block_size < 1:
        return None
    try:
        return chain_keys(prompt, block_size)
    except (ValueError, TypeError, OverflowError):
        return None


class TokenIdNodes:
    """Which nodes the gateway asks for token ids: all but those disabled by configuration
    and those that refused the field (remembered for the life of the process)."""

    def __init__(self, disabled: Iterable[str] = ()) -> None:
        self._off: dict[str, str] = {node: "disabled" for node in disabled}

    def ask(self, node_id: str) -> bool:
        """Whether requests forwarded to ``node_id`` should carry ``return_token_ids``."""
        return node_id not in self._off

    def refused(self, node_id: str) -> bool:
        """``node_id`` refused the field: stop asking it; whether this is the first time (the
        caller logs it then)."""
        if node_id in self._off:
            return False
        self._off[node_id] = "refused"
        return True
