"""``python -m services.gateway``: the gateway service under the common runner."""

from shared.infra import run_service

from .app import NAME, main

raise SystemExit(run_service(NAME, main, needs_redis=True))
