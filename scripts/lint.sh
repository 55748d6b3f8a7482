#!/usr/bin/env bash
# Lint and type-check: ruff over the repository, mypy (strict on shared/core, shared/contracts,
# shared/cli, shared/infra, shared/harness, shared/trace and the hook client, via pyproject).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

echo "== ruff check" >&2
.venv/bin/ruff check .
echo "== import graph (no loops, no import against the layers)" >&2
.venv/bin/python scripts/import_graph.py
echo "== mypy" >&2
.venv/bin/mypy shared/core shared/contracts shared/cli shared/infra shared/examples shared/harness \
    shared/trace services
