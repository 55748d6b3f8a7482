"""``python -m services.gateway``: the gateway service under the common runner."""

from shared.infra import run_service

from .app import SERVICE, main

raise SystemExit(run_service(SERVICE, main, needs_redis=True))
