"""``tao keys``: client API keys and hook tokens of the gateway's tenants (``TAO_TENANTS_FILE``).

::

    tao keys add --tenant team-a --kind api            # prints a new client API key once
    tao keys add --tenant team-a --kind hook           # prints a new hook token once
    tao keys add --tenant team-a --kind api --max-held 64
    tao keys list                                      # tenants, key counts, digest prefixes
    tao keys remove --tenant team-a --digest 9f86d0    # revoke one key by its digest's prefix
    tao keys placement --id p2 --private planner-key.toml --public placement-keys.toml
                                                       # a placement signing key pair
    tao keys access --dir /keys/access --nats-url nats://nats:4222 --redis-url redis://redis:6379/0
                                                       # NATS and Redis users per service

The file (``--file``, else ``TAO_TENANTS_FILE``) holds only SHA-256 digests
(:mod:`shared.infra.tenants`); a running gateway reads it again within a second of a change,
so a key added or removed takes effect without a restart. Rotate by adding the new key,
moving the clients to it, then removing the old one.

``tao keys access --dir DIR`` writes the NATS users and Redis ACL users, one per role, with the
URL files each service connects with (:mod:`shared.infra.access`; ``--rotate ROLE`` gives one
role a new password; ``--if-missing`` keeps a folder that exists).

``tao keys placement`` makes the planner's placement signing key (``TAO_PLACEMENT_KEY``, the
private file, mode 0600) and adds its public half to the gateways' trusted keys
(``TAO_PLACEMENT_KEYS``; :mod:`shared.infra.signing`, rotation there).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from shared.cli.ops import OpsError
from shared.infra.access import (
    ACCESS_FILE,
    NATS_CONF,
    REDIS_ACL,
    ROLES,
    TLS_SERVERS,
    Access,
    AccessFileError,
    read_access_dir,
    write_access_dir,
)
from shared.infra.signing import KeyFileError, new_key_files
from shared.infra.tenants import (
    TenantsFileError,
    add_secret,
    load_tenants_file,
    remove_secret,
)
from shared.tables import render

__all__ = ["add_keys_parser"]


def _file(args: argparse.Namespace) -> str:
    path: str | None = args.file or os.environ.get("TAO_TENANTS_FILE", "").strip() or None
    if path is None:
        raise OpsError("--file: no tenants file given (--file PATH, or TAO_TENANTS_FILE)")
    return path


def _cmd_add(args: argparse.Namespace, out: TextIO) -> int:
    path = _file(args)
    try:
        secret = add_secret(path, args.tenant, args.kind, max_held=args.max_held)
    except (TenantsFileError, ValueError) as exc:
        raise OpsError(str(exc)) from None
    except OSError as exc:
        raise OpsError(f"{path}: cannot write: {exc.strerror or exc}") from None
    out.write(secret + "\n")
    what = "API key" if args.kind == "api" else "hook token"
    header = (
        "Authorization: Bearer <key> (or x-api-key)"
        if args.kind == "api"
        else "Authorization: Bearer <token> (or X-TAO-Hook-Token) on POST /hooks/<harness>"
    )
    print(
        f"new {what} of tenant {args.tenant!r} written to {path} as its digest; it is shown "
        f"only now. Clients send it as {header}.",
        file=sys.stderr,
    )
    return 0


def _cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    path = _file(args)
    try:
        tenants = load_tenants_file(path)
    except TenantsFileError as exc:
        raise OpsError(str(exc)) from None
    rows = [
        [
            t.name,
            str(len(t.api_keys)),
            str(len(t.hook_tokens)),
            "-" if t.max_held is None else str(t.max_held),
            " ".join(d.removeprefix("sha256:")[:12] for d in (*t.api_keys, *t.hook_tokens)),
        ]
        for t in tenants.tenants
    ]
    out.write(render(["tenant", "api keys", "hook tokens", "max held", "digests"], rows) + "\n")
    return 0


def _cmd_remove(args: argparse.Namespace, out: TextIO) -> int:
    path = _file(args)
    try:
        removed = remove_secret(path, args.tenant, args.digest)
    except (TenantsFileError, ValueError) as exc:
        raise OpsError(str(exc)) from None
    except OSError as exc:
        raise OpsError(f"{path}: cannot write: {exc.strerror or exc}") from None
    out.write(f"removed {removed} from tenant {args.tenant!r}\n")
    return 0


def _cmd_placement(args: argparse.Namespace, out: TextIO) -> int:
    if args.if_missing and Path(args.private).expanduser().exists():
        out.write(f"placement key: {args.private} exists; nothing to do\n")
        return 0
    try:
        new_key_files(args.id, args.private, args.public)
    except KeyFileError as exc:
        raise OpsError(str(exc)) from None
    except FileExistsError:
        raise OpsError(f"--private: {args.private} exists; keys are never overwritten") from None
    except OSError as exc:
        raise OpsError(f"cannot write: {exc.strerror or exc}") from None
    out.write(
        f"placement key {args.id!r}: private half in {args.private} (TAO_PLACEMENT_KEY of the "
        f"planner), public half added to {args.public} (TAO_PLACEMENT_KEYS of the gateways)\n"
    )
    return 0


def _cmd_access(args: argparse.Namespace, out: TextIO) -> int:
    folder = Path(args.dir).expanduser()
    exists = (folder / ACCESS_FILE).exists()
    try:
        if exists and args.rotate:
            access = read_access_dir(folder)
            for role in args.rotate:
                access = access.rotated(role)
        elif exists and args.if_missing:
            out.write(f"access: {folder} exists; nothing to do\n")
            return 0
        elif exists:
            raise OpsError(f"--dir: {folder} holds an access file; pass --rotate or --if-missing")
        elif args.rotate:
            raise OpsError(f"--rotate: {folder} holds no access file yet")
        else:
            access = Access.new(
                args.nats_url, args.redis_url, args.namespace or [""], args.tls or ()
            )
        write_access_dir(access, folder)
    except (AccessFileError, ValueError) as exc:
        raise OpsError(str(exc)) from None
    except OSError as exc:
        raise OpsError(f"--dir: cannot write {folder}: {exc.strerror or exc}") from None
    done = f"rotated {', '.join(args.rotate)}" if args.rotate else "wrote"
    out.write(
        f"access: {done} {folder}: nats-server -c {folder / NATS_CONF}, valkey-server --aclfile "
        f"{folder / REDIS_ACL}; each service: TAO_NATS_URL_FILE={folder}/<role>.nats-url, "
        f"TAO_REDIS_URL_FILE={folder}/<role>.redis-url (roles: {', '.join(ROLES)})\n"
    )
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def add_keys_parser(sub: Any) -> None:
    """Register ``tao keys add|list|remove``."""
    keys = sub.add_parser(
        "keys",
        help="client API keys and hook tokens of the gateway's tenants",
        description=(__doc__ or "").split("\n\n")[0],
    )
    actions = keys.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--file", metavar="PATH", help="tenants file (default: TAO_TENANTS_FILE)")

    add = actions.add_parser("add", help="make a key for a tenant (created if new); print it")
    common(add)
    add.add_argument("--tenant", required=True, metavar="NAME", help="[A-Za-z0-9_-]{1,64}")
    add.add_argument("--kind", required=True, choices=("api", "hook"), help="what the key is for")
    add.add_argument(
        "--max-held", type=_positive, metavar="N", help="the tenant's held requests at most"
    )
    add.set_defaults(run=_cmd_add)

    ls = actions.add_parser("list", help="tenants, key counts and digest prefixes")
    common(ls)
    ls.set_defaults(run=_cmd_list)

    rm = actions.add_parser("remove", help="revoke one key by the prefix of its digest")
    common(rm)
    rm.add_argument("--tenant", required=True, metavar="NAME")
    rm.add_argument("--digest", required=True, metavar="PREFIX", help="as `tao keys list` shows")
    rm.set_defaults(run=_cmd_remove)

    pl = actions.add_parser("placement", help="make a placement signing key pair")
    pl.add_argument("--id", required=True, metavar="ID", help="key id, [A-Za-z0-9_.-]{1,64}")
    pl.add_argument("--private", required=True, metavar="PATH", help="the planner's key file")
    pl.add_argument("--public", required=True, metavar="PATH", help="the gateways' trusted keys")
    pl.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing when the private file exists (compose's one-shot `keys` service)",
    )
    pl.set_defaults(run=_cmd_placement)

    ac = actions.add_parser("access", help="NATS users and Redis ACL users, one per role")
    ac.add_argument("--dir", required=True, metavar="DIR", help="the access folder to write")
    ac.add_argument("--nats-url", default="nats://127.0.0.1:4222", metavar="URL",
                    help="the NATS server the URL files name (default: %(default)s)")  # fmt: skip
    ac.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", metavar="URL",
                    help="the Redis server the URL files name (default: %(default)s)")  # fmt: skip
    ac.add_argument("--namespace", action="append", metavar="NS",
                    help="a TAO_NAMESPACE the permissions cover (repeat)")  # fmt: skip
    ac.add_argument("--tls", action="append", choices=TLS_SERVERS, metavar="SERVER",
                    help="nats or redis: TLS only (a CA and certificate made here)")  # fmt: skip
    ac.add_argument("--rotate", action="append", choices=ROLES, metavar="ROLE",
                    help="give ROLE a new password in every file (repeat)")  # fmt: skip
    ac.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing when the folder holds an access file (compose's one-shot `keys`)",
    )
    ac.set_defaults(run=_cmd_access)
