"""The valuation service: per-tick snapshots of the pool for the planner."""

from services.valuation.app import NAME, Ticker, main, run
from services.valuation.handlers import Valuator, params_from

__all__ = ["NAME", "Ticker", "Valuator", "main", "params_from", "run"]
