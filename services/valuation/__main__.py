"""``python -m services.valuation``: run the valuation service until SIGINT/SIGTERM."""

from services.valuation.app import NAME, main
from shared.infra.runner import run_service

raise SystemExit(run_service(NAME, main, needs_redis=True))
