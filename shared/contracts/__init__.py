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
from .domain import DomainLoadReport
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
from .plan import PLACEMENT_KINDS, Placement, PlacementKind, Plan, WireAssignment, WireObjective
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
    ValuationSnapshot,
    WireCandidate,
    WireInterruptCandidate,
    WireNodeView,
    WireSignature,
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
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "ContractError",
    "DeadLetter",
    "DecodeError",
    "DomainLoadReport",
    "FrameError",
    "KVEncoding",
    "KVEvent",
    "KVEventBatch",
    "KVFrame",
    "Message",
    "NodeStatus",
    "Placement",
    "PlacementKind",
    "Plan",
    "Record",
    "SessionCancel",
    "SessionEnd",
    "SessionEvent",
    "SessionRequest",
    "SessionResponse",
    "SubjectError",
    "ToolCallInfo",
    "ToolEnd",
    "ToolEvent",
    "ToolProgress",
    "ToolStart",
    "Usage",
    "ValuationSnapshot",
    "Wake",
    "WireAssignment",
    "WireCandidate",
    "WireInterruptCandidate",
    "WireNodeView",
    "WireObjective",
    "WireSignature",
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
