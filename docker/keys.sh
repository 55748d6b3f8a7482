#!/bin/sh
# compose.yaml's one-shot `keys` service: every credential of the stack, made on the first `up`
# and kept, then handed out so that each container mounts only its own (issue 31, item 3).
#
#   /keys/all       (volume tao-keys; mounted by this service alone) the access folder of
#                   `tao keys access` (every role's password), the placement key pair, the
#                   gateway's key
#   /keys/<name>    (volume tao-keys-<name>) what service <name> mounts at /keys, read-only,
#                   owned by its own uid, mode 0400 in a 0500 folder:
#
#   telemetry, tools, valuation   nats-url, redis-url (its NATS and Redis user)
#   planner                       nats-url, redis-url, placement-key.toml (the private key:
#                                 no other container has it)
#   gateway                       nats-url, redis-url, placement-keys.toml (public), gateway-key
#   ops                           nats-url, redis-url, gateway-key (tao demo, tao kv-bridge)
#   nats                          nats.conf (the users and their passwords)
#   redis                         users.acl (SHA-256 digests of the passwords)
#
# The uids are compose.yaml's `user:` of each service (TAO_UID_<NAME>). The gateway's key is
# TAO_GATEWAY_KEY when it is set (it replaces the kept one), else the kept one, else a new
# random one, printed once here (`docker compose logs keys`).
#
# Runs as root with no network, only to chown what it hands out; everything else runs as a
# non-root uid.
set -eu
umask 077
all=/keys/all
namespace=${TAO_NAMESPACE:-}
only=${1:-}  # "gateway": the gateway's key alone, to the gateway and to ops when TAO_UID_OPS is
            # set (deploy/compose.domains.yaml)

gateway_key() {
    if [ -n "${TAO_GATEWAY_KEY:-}" ]; then
        printf '%s\n' "$TAO_GATEWAY_KEY" >"$all/gateway-key"
        echo "keys: the gateway's key is TAO_GATEWAY_KEY" >&2
    elif [ ! -s "$all/gateway-key" ]; then
        python -c 'import secrets; print(secrets.token_urlsafe(32))' >"$all/gateway-key"
        echo "keys: the gateway's key (made now, printed once; clients send it as" \
            "'Authorization: Bearer KEY'): $(cat "$all/gateway-key")" >&2
    fi
}

give() {  # give NAME UID FILE:TARGET...: a 0500 folder of 0400 files owned by UID
    name=$1 uid=$2
    shift 2
    dir=/keys/$name
    find "$dir" -mindepth 1 -delete
    for pair in "$@"; do
        install -o "$uid" -g "$uid" -m 0400 "$all/${pair%%:*}" "$dir/${pair##*:}"
    done
    chown "$uid:$uid" "$dir"
    chmod 0500 "$dir"
}

gateway_key
if [ "$only" = gateway ]; then
    give gateway "$TAO_UID_GATEWAY" gateway-key:gateway-key
    if [ -n "${TAO_UID_OPS:-}" ]; then
        give ops "$TAO_UID_OPS" gateway-key:gateway-key
    fi
    echo "keys: the gateway's key is in its own volume (and ops', for the demo)" >&2
    exit 0
fi

tao keys access --dir "$all/access" --nats-url nats://nats:4222 \
    --redis-url redis://redis:6379/0 --namespace "$namespace" --if-missing
tao keys placement --id compose --private "$all/placement-key.toml" \
    --public "$all/placement-keys.toml" --if-missing

for name in telemetry tools valuation; do
    uid=$(eval "echo \${TAO_UID_$(echo "$name" | tr a-z A-Z)}")
    give "$name" "$uid" "access/$name.nats-url:nats-url" "access/$name.redis-url:redis-url"
done
give planner "$TAO_UID_PLANNER" access/planner.nats-url:nats-url \
    access/planner.redis-url:redis-url placement-key.toml:placement-key.toml
give gateway "$TAO_UID_GATEWAY" access/gateway.nats-url:nats-url \
    access/gateway.redis-url:redis-url placement-keys.toml:placement-keys.toml \
    gateway-key:gateway-key
give ops "$TAO_UID_OPS" access/ops.nats-url:nats-url access/ops.redis-url:redis-url \
    gateway-key:gateway-key
give nats 0 access/nats.conf:nats.conf
# The Redis image's user differs between images (999 upstream, Debian's redis here); the ACL
# file holds digests only, so it is readable by all, in the Redis container alone.
give redis 0 access/users.acl:users.acl
chmod 0444 /keys/redis/users.acl
chmod 0555 /keys/redis
echo "keys: each service's credentials are in its own volume" >&2
