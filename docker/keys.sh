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
#   admin   (when mounted)        redis-url (the admin role's: redis-init forming a cluster)
#
# The uids are compose.yaml's `user:` of each service (TAO_UID_<NAME>). The gateway's key is
# TAO_GATEWAY_KEY when it is set (it replaces the kept one), else the kept one, else a new
# random one, printed once here (`docker compose logs keys`).
#
# The servers the URLs name and the namespaces the grants cover: compose.yaml's (nats:4222,
# redis:6379, TAO_NAMESPACE) unless TAO_KEYS_NATS_URL, TAO_KEYS_REDIS_URL and
# TAO_KEYS_NAMESPACES (space-separated) say otherwise. For a cluster (deploy/compose.domains.yaml):
#
#   TAO_NATS_ROUTES="nats-1 nats-2 ..."   nats.conf also gets a `cluster` block: the routes
#                                         between those servers, which need a route user of
#                                         their own (a password kept in /keys/all)
#   TAO_REDIS_REPLICATION=1               users.acl also gets a `replica` user (PSYNC, REPLCONF
#                                         and PING only) and the redis volume replication.conf
#                                         (masteruser/masterauth, for redis-server's config
#                                         file argument): a replica's link to its master
#
# Runs as root with no network, only to chown what it hands out; everything else runs as a
# non-root uid.
set -eu
umask 077
all=/keys/all
namespace=${TAO_NAMESPACE:-}

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

kept_password() {  # kept_password NAME: a random password kept in /keys/all/NAME
    if [ ! -s "$all/$1" ]; then
        python -c 'import secrets; print(secrets.token_urlsafe(32))' >"$all/$1"
    fi
    cat "$all/$1"
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
set --
for ns in ${TAO_KEYS_NAMESPACES:-}; do
    set -- "$@" --namespace "$ns"
done
[ $# -gt 0 ] || set -- --namespace "$namespace"
tao keys access --dir "$all/access" --nats-url "${TAO_KEYS_NATS_URL:-nats://nats:4222}" \
    --redis-url "${TAO_KEYS_REDIS_URL:-redis://redis:6379/0}" "$@" --if-missing
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
if [ -n "${TAO_NATS_ROUTES:-}" ]; then
    route=$(kept_password route-password)
    {
        printf 'cluster {\n  name: tao\n  listen: "0.0.0.0:6222"\n'
        printf '  authorization { user: route, password: "%s" }\n  routes: [\n' "$route"
        for host in $TAO_NATS_ROUTES; do
            printf '    "nats://route:%s@%s:6222"\n' "$route" "$host"
        done
        printf '  ]\n}\n'
    } >>/keys/nats/nats.conf
fi
if [ -d /keys/admin ]; then
    give admin 0 access/admin.redis-url:redis-url
fi
# The Redis image's user differs between images (999 upstream, Debian's redis here); the ACL
# file holds digests only, so it is readable by all, in the Redis container alone.
give redis 0 access/users.acl:users.acl
if [ "${TAO_REDIS_REPLICATION:-}" = 1 ]; then
    replica=$(kept_password replica-password)
    digest=$(printf %s "$replica" | sha256sum | cut -d' ' -f1)
    echo "user replica on #$digest resetkeys resetchannels -@all +psync +replconf +ping" \
        >>/keys/redis/users.acl
    printf 'masteruser replica\nmasterauth "%s"\n' "$replica" >/keys/redis/replication.conf
    chmod 0444 /keys/redis/replication.conf
fi
chmod 0444 /keys/redis/users.acl
chmod 0555 /keys/redis
echo "keys: each service's credentials are in its own volume" >&2
