"""``python -m services.tools``: run the tools service until SIGINT/SIGTERM."""

from services.tools.app import NAME, main
from shared.infra.runner import run_service

raise SystemExit(run_service(NAME, main, needs_redis=True))
