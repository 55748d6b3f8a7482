#!/usr/bin/env bash
# The main job: plan the bundled example snapshot with tao, then run every policy side by side
# on a generated snapshot (4 nodes, 64 pooled sessions, demand twice the free capacity).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

echo "== tao plan shared/examples/snapshot.json"
.venv/bin/tao plan shared/examples/snapshot.json
echo
echo "== tao compare --nodes 4 --candidates 64 --load 2"
.venv/bin/tao compare --nodes 4 --candidates 64 --load 2
