#!/usr/bin/env bash
# Planner benchmark tables (never part of the test pass/fail; the default run takes ~15-20 min,
# `bash scripts/bench.sh --quick` ~2-3 min). Extra arguments go to benchmarks/planner.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
PYTHONPATH=. .venv/bin/python -m benchmarks.planner "$@"
