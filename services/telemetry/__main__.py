"""``python -m services.telemetry``: run the telemetry service until SIGINT/SIGTERM."""

from services.telemetry.app import NAME, main
from shared.infra.runner import run_service

raise SystemExit(run_service(NAME, main, needs_redis=True))
