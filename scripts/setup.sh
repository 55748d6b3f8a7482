#!/usr/bin/env bash
# Set up the development environment: .venv with the project installed editable, dev extras.
# Idempotent and quick on re-runs: it reinstalls only when pyproject.toml changed since the last
# install, or when the `tao` entry point is missing. Needs python3 (>= 3.11) with venv and pip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
STAMP=.venv/.tao-installed

# A .venv without a working pip (what a failed `python3 -m venv` leaves behind) would stop every
# later run at the install step: recreate it.
if [ -x .venv/bin/python ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    echo "setup: .venv has no working pip (a failed venv creation?); recreating it" >&2
    rm -rf .venv
fi

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "setup: $PYTHON is $("$PYTHON" -V 2>&1); TAO needs Python >= 3.11 (set PYTHON=...)" >&2
        exit 1
    }
    echo "setup: creating .venv with $PYTHON" >&2
    "$PYTHON" -m venv .venv || {
        rm -rf .venv
        echo "setup: '$PYTHON -m venv' failed; install its venv and pip (Debian: python3-venv)" >&2
        exit 1
    }
fi

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ ! -x .venv/bin/tao ]; then
    echo "setup: installing tao-scheduler[dev] into .venv (editable)" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    touch "$STAMP"
fi
