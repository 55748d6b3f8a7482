"""The TAO gateway: an OpenAI-compatible proxy that holds each session's requests until the
planner admits the session, forwards them to the admitted node and reports what happened
(DESIGN §4). Run it with ``python -m services.gateway``."""

from services.gateway.app import NAME, RELAY, create_app, main, serve
from services.gateway.relay import Relay

__all__ = ["NAME", "RELAY", "Relay", "create_app", "main", "serve"]
