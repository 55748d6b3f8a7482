"""The external contract of ``tao inspect``, spelled out once for the tests that check it.

Written out literally on purpose (not derived from :class:`shared.contracts.inspect.NodeInspect`):
the tests check that the struct still answers with these keys in this order.
"""

from __future__ import annotations

from typing import Final

NODE_KEYS: Final = [
    "node",
    "blocks",
    "resident_tokens",
    "seq",
    "incarnation",
    "healthy",
    "capacity_tokens",
    "host_blocks",
    "host_resident_tokens",
]
"""The keys of an inspect-node reply (``tao inspect node --json``), in order."""
