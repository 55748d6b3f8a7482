#!/usr/bin/env bash
# The main job: set up, then `tao demo` — bring the whole stack up on embedded NATS + Valkey with
# two simulated vLLM nodes, drive agent sessions through the gateway with the openai client, once
# with `tao` and once with `thunderagent`, and print the side-by-side table. Extra arguments go to
# `tao demo` (e.g. `bash scripts/demo.sh --sessions 24`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/tao demo "$@"
