"""The contract error tree: every failure to read or name a wire message is a ``ContractError``.

    ContractError(ValueError)
    ├── DecodeError      bytes that are not the message they claim to be
    │   └── FrameError   a ZMQ multipart message with the wrong frame count or a bad ``seq``
    └── SubjectError     a token that cannot be placed in a NATS subject

Each error keeps its data as attributes and builds its message from them, so a subscriber can
log the fields and dead-letter the payload without parsing strings.
"""

from __future__ import annotations

__all__ = ["ContractError", "DecodeError", "FrameError", "SubjectError"]


class ContractError(ValueError):
    """Base of every error raised by ``shared.contracts``."""


class DecodeError(ContractError):
    """``data`` could not be decoded as ``target``; ``reason`` says what was wrong and where.

    ``reason`` carries msgspec's own wording, which names the JSON path (``$.usage.total``) or
    the event index, e.g. ``"Expected `int`, got `str` - at `$.tick`"``.
    """

    def __init__(self, target: str, reason: str) -> None:
        self.target = target
        self.reason = reason
        super().__init__(f"cannot decode {target}: {reason}")


class FrameError(DecodeError):
    """A ZMQ KV-event message whose frames do not have the vLLM shape."""

    def __init__(self, reason: str) -> None:
        super().__init__("vLLM KV-event frames", reason)


class SubjectError(ContractError):
    """``value`` cannot be used as the ``what`` token of a NATS subject, for ``reason``."""

    def __init__(self, what: str, value: str, reason: str) -> None:
        self.what = what
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {what} {value!r} for a subject token: {reason}")
