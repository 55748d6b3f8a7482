"""``python -m services.planner``: run the planner service until SIGINT/SIGTERM."""

from services.planner.app import NAME, main
from shared.infra.runner import run_service

raise SystemExit(run_service(NAME, main, needs_redis=True))
