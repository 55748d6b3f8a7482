"""Sim node: a vLLM stand-in without a GPU, serving the engine model over HTTP."""

from __future__ import annotations

from services.simnode.app import NODE_KEY, SimNodeConfig, create_app

__all__ = ["NODE_KEY", "SimNodeConfig", "create_app"]
