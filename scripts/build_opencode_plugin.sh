#!/usr/bin/env bash
# Regenerate shared/harness/opencode_plugin/tao.mjs from tao.ts (the source), and type-check
# tao.ts against the published @opencode-ai/plugin types. Needs node and the npm registry.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="$here/shared/harness/opencode_plugin"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null
npm install --no-audit --no-fund --silent typescript@5 @opencode-ai/plugin @types/node
cp "$dir/tao.ts" .
flags=(--strict --target ES2022 --module ESNext --moduleResolution bundler --types node --skipLibCheck)
npx tsc "${flags[@]}" --outDir out tao.ts
{
  echo "// Generated from tao.ts (the source: read and edit that file), for Node versions that cannot"
  echo "// strip TypeScript types; regenerate with the command in docs/harnesses.md (\"The OpenCode plugin\")."
  echo "// Do not edit by hand: a test compares the string literals of both files."
  cat out/tao.js
} >"$dir/tao.mjs"
echo "wrote $dir/tao.mjs"
