"""``python -m services.gateway``: the gateway service under the common runner."""

from services.gateway.app import NAME, main
from shared.infra.runner import run_service

raise SystemExit(run_service(NAME, main, needs_redis=True))
