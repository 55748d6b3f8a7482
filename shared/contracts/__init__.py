"""TAO wire contracts: typed messages, vLLM KV-event decoding, and every NATS subject name.

No I/O here. Services import from this package (``from shared.contracts import ToolStart``);
subject builders live in :mod:`shared.contracts.subjects` and are used as
``subjects.tool_event(session_id)``.
"""

from . import subjects
from .base import Message, Record
from .codec import (
    MESSAGE_TYPES,
    AnyMessage,
    decode,
    decode_message,
    decode_session_event,
    decode_tool_event,
    encode,
)
from .deadletter import DeadLetter
from .errors import ContractError, DecodeError, FrameError, SubjectError
from .frames import (
    REPLAY_END_SEQ,
    KVFrame,
    encode_seq,
    parse_kv_frames,
    parse_replay_answer,
    parse_seq,
    replay_request,
)
from .kv import (
    KV_ENCODINGS,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEncoding,
    KVEvent,
    KVEventBatch,
    decode_kv_batch,
    encode_kv_batch,
)
from .node import NodeStatus
from .plan import PLACEMENT_KINDS, Assignment, Objective, Placement, PlacementKind, Plan
from .session import (
    SessionCancel,
    SessionEnd,
    SessionEvent,
    SessionRequest,
    SessionResponse,
    ToolCallInfo,
    Usage,
)
from .tool import ToolEnd, ToolEvent, ToolProgress, ToolStart
from .valuation import (
    AdmittedSession,
    Candidate,
    InterruptCandidate,
    NodeView,
    Signature,
    ValuationSnapshot,
)
from .wake import Wake

__all__ = [
    "KV_ENCODINGS",
    "MESSAGE_TYPES",
    "PLACEMENT_KINDS",
    "REPLAY_END_SEQ",
    "AdmittedSession",
    "AllBlocksCleared",
    "AnyMessage",
    "Assignment",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "Candidate",
    "ContractError",
    "DeadLetter",
    "DecodeError",
    "FrameError",
    "InterruptCandidate",
    "KVEncoding",
    "KVEvent",
    "KVEventBatch",
    "KVFrame",
    "Message",
    "NodeStatus",
    "NodeView",
    "Objective",
    "Placement",
    "PlacementKind",
    "Plan",
    "Record",
    "SessionCancel",
    "SessionEnd",
    "SessionEvent",
    "SessionRequest",
    "SessionResponse",
    "Signature",
    "SubjectError",
    "ToolCallInfo",
    "ToolEnd",
    "ToolEvent",
    "ToolProgress",
    "ToolStart",
    "Usage",
    "ValuationSnapshot",
    "Wake",
    "decode",
    "decode_kv_batch",
    "decode_message",
    "decode_session_event",
    "decode_tool_event",
    "encode",
    "encode_kv_batch",
    "encode_seq",
    "parse_kv_frames",
    "parse_replay_answer",
    "parse_seq",
    "replay_request",
    "subjects",
]
