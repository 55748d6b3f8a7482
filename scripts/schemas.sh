#!/usr/bin/env bash
# Regenerate schemas/ from shared/contracts (commit the result; test.sh checks for drift).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/python -m shared.contracts.schemagen
