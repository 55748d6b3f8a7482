"""Every Redis key name the scheduler uses, built by small functions (STYLE rule 5).

All keys of one scheduling *domain* share the Redis Cluster hash tag ``{<domain>}``, so every
multi-key Lua script of the store (``shared/infra/lua/*.lua``) touches one slot and runs
unchanged on a cluster. Layout, for the domain ``default``::

    tao:{default}:s:<sid>       hash   one session (fields below)
    tao:{default}:sessions      set    ids of every stored session (ended ones until deleted)
    tao:{default}:pool          set    pooled ids: not admitted, not ended, waiting or in a tool
    tao:{default}:admitted_tool set    admitted ids in a tool: the interrupt candidates
    tao:{default}:n:<node>      hash   one node: telemetry's status fields + ``reserved``
    tao:{default}:nodes         set    ids of every node telemetry reported
    tao:{default}:res:<sid>     hash   node id -> "k0 t_obs[ host]" (resident prefix tokens, when
                                       seen; tokens in the node's host KV tier, when any)
    tao:{default}:nres:<node>   set    ids with a residency entry on the node (for clearing it)
    tao:{default}:toolstats     hash   "tool:<name>" -> serialised ToolStats; "global" -> all tools
    tao:{default}:planner       hash   planner counters (ticks, plans_applied, ...)
    tao:{default}:solve_ms      list   the last SOLVE_SAMPLES solve times, newest first
    tao:{default}:ready         hash   the planning replica's readiness record, expiring
                                       (store_types.PlannerReady; the gateway's /readyz)

Session hash fields (the ones Lua reads and writes are separate; floats are stored as Python
``repr`` strings, which round-trip exactly, never through Lua numbers)::

    v           version (integer, HINCRBY-able)
    node        node id while admitted, "" otherwise
    weight      reserved tokens while admitted, 0 otherwise
    activity    idle | waiting | running | tool
    ended       "1" once the session ended, else "0"
    probe       readiness probe mark (repr float) or ""
    updated_at  repr float
    data        msgspec JSON of the other Session fields (id, tokens, model, tool, ...)

Node hash fields: ``url capacity_tokens target_utilisation usable healthy models block_size
used_tokens usage running waiting prefix_cache_queries prefix_cache_hits updated_at failures
kv_since kv_until reserved``; ``usable`` = ``floor(capacity × target)`` computed in Python
with the core's exact decimal rule (:func:`shared.core.valuation.free_capacity`) so Lua never
multiplies floats.

Ids: a domain and a node id must match ``[A-Za-z0-9_-]{1,128}`` (configured names, as in
:func:`shared.contracts.subjects.check_name`); the Lua scripts build node keys from node ids.
A session id may be any non-empty string from outside: it is escaped with the subjects'
reversible ``~XX`` escaping (:func:`shared.contracts.subjects.escape_token`), so ``:``, braces,
spaces or non-ASCII never change a key's shape or its hash slot; an id whose escaped form passes
512 characters, or that is not encodable as UTF-8, is refused with :class:`KeyNameError`. Set
members and hash fields hold raw ids (Redis strings are binary-safe).
"""

from __future__ import annotations

import re
from typing import Final

from shared.contracts.errors import ContractError
from shared.contracts.subjects import escape_token
from shared.infra.errors import StoreError

__all__ = [
    "GLOBAL_TOOL_FIELD",
    "PREFIX",
    "SOLVE_SAMPLES",
    "KeyNameError",
    "Keys",
    "StoreError",
    "check_domain",
    "check_node_id",
    "check_session_id",
    "tool_field",
]

PREFIX: Final = "tao"
SOLVE_SAMPLES: Final = 1000
"""How many recent solve times ``solve_ms`` keeps for the percentiles of ``tao status``."""
GLOBAL_TOOL_FIELD: Final = "global"
"""Field of the tool-stats hash holding the aggregate over every tool."""

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")


class KeyNameError(StoreError, ValueError):
    """``what`` (a domain, node or session id) has the unusable ``value`` because ``problem``."""

    def __init__(self, what: str, value: object, problem: str) -> None:
        self.what = what
        self.value = value
        self.problem = problem
        super().__init__(f"{what}: {problem}, got {value!r}")


def check_domain(domain: str) -> str:
    """Return ``domain`` if it is a valid scheduling domain name, else raise KeyNameError."""
    if not isinstance(domain, str) or not _NAME_RE.fullmatch(domain):
        raise KeyNameError("domain", domain, "must match [A-Za-z0-9_-]{1,128}")
    return domain


def check_node_id(node: str) -> str:
    """Return ``node`` if it is a valid node id, else raise KeyNameError."""
    if not isinstance(node, str) or not _NAME_RE.fullmatch(node):
        raise KeyNameError("node id", node, "must match [A-Za-z0-9_-]{1,128}")
    return node


def check_session_id(sid: str) -> str:
    """Return the key-safe escaped form of session id ``sid``, else raise KeyNameError."""
    if not isinstance(sid, str):
        raise KeyNameError("session id", sid, "must be a string")
    try:
        return escape_token(sid)
    except (ContractError, UnicodeEncodeError) as exc:
        raise KeyNameError("session id", sid, str(exc)) from None


def tool_field(tool: str) -> str:
    """Field of the tool-stats hash for ``tool`` (prefixed so no name collides with global)."""
    if not isinstance(tool, str) or not tool:
        raise KeyNameError("tool", tool, "must be a non-empty string")
    return f"tool:{tool}"


class Keys:
    """The key names of one scheduling domain (module docstring)."""

    __slots__ = ("base", "domain")

    def __init__(self, domain: str = "default") -> None:
        self.domain = check_domain(domain)
        self.base = f"{PREFIX}:{{{domain}}}:"

    def session(self, sid: str) -> str:
        """``tao:{d}:s:<escaped sid>``: the session's hash."""
        return f"{self.base}s:{check_session_id(sid)}"

    def residency(self, sid: str) -> str:
        """``tao:{d}:res:<escaped sid>``: node -> "k0 t_obs" of the session's prefix."""
        return f"{self.base}res:{check_session_id(sid)}"

    def chain(self, sid: str) -> str:
        """``tao:{d}:chain:<escaped sid>``: the session's block-key chain (see
        :func:`shared.infra.store_codec.encode_chain`), so a restarted telemetry service can
        match it against the KV events again."""
        return f"{self.base}chain:{check_session_id(sid)}"

    @property
    def chains(self) -> str:
        """``tao:{d}:chains``: the ids of the sessions with a stored chain (a sorted set
        scored by when the chain expires)."""
        return f"{self.base}chains"

    def node_residents(self, node: str) -> str:
        """``tao:{d}:nres:<node>``: ids of the sessions with residency recorded on ``node``."""
        return f"{self.base}nres:{check_node_id(node)}"

    def node(self, node: str) -> str:
        """``tao:{d}:n:<node>``: the node's hash."""
        return f"{self.base}n:{check_node_id(node)}"

    @property
    def session_prefix(self) -> str:
        """What :meth:`session` puts before the escaped id (the Lua scripts append ids to it)."""
        return f"{self.base}s:"

    @property
    def residency_prefix(self) -> str:
        """What :meth:`residency` puts before the escaped id."""
        return f"{self.base}res:"

    @property
    def node_prefix(self) -> str:
        """What :meth:`node` puts before the node id (the Lua scripts append ids to it)."""
        return f"{self.base}n:"

    @property
    def sessions(self) -> str:
        return f"{self.base}sessions"

    @property
    def pool(self) -> str:
        return f"{self.base}pool"

    @property
    def admitted_tool(self) -> str:
        return f"{self.base}admitted_tool"

    @property
    def nodes(self) -> str:
        return f"{self.base}nodes"

    @property
    def toolstats(self) -> str:
        return f"{self.base}toolstats"

    @property
    def planner(self) -> str:
        return f"{self.base}planner"

    @property
    def solve_ms(self) -> str:
        return f"{self.base}solve_ms"

    @property
    def ready(self) -> str:
        return f"{self.base}ready"

    def pattern(self) -> str:
        """A SCAN pattern matching every key of this domain (for tests and ``tao reset``)."""
        return f"{PREFIX}:{{{self.domain}}}:*"
