#!/usr/bin/env bash
# Set up the development environment: .venv with the project installed editable, dev extras,
# and the numba kernels compiled into their cache (`tao warm`).
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

# The numba kernels compiled once, here, into numba's on-disk cache (__pycache__ beside each
# module, or NUMBA_CACHE_DIR): the planner then loads them at start in about a second instead of
# compiling them on its first start (tens of seconds on two cores). Again only when the core's
# code changed since the last warm.
WARM_STAMP=.venv/.tao-warmed
if [ -d shared/core ] && { [ ! -f "$WARM_STAMP" ] || [ "$STAMP" -nt "$WARM_STAMP" ] \
        || [ -n "$(find shared/core -name '*.py' -newer "$WARM_STAMP" -print -quit)" ]; }; then
    echo "setup: compiling the numba kernels into numba's cache (tao warm)" >&2
    .venv/bin/python -m shared.cli.warm >&2
    touch "$WARM_STAMP"
fi
