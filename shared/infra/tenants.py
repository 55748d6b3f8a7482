"""Tenants: who may call the gateway and post hooks, from a TOML file (``TAO_TENANTS_FILE``).

One ``[[tenant]]`` table per tenant::

    [[tenant]]
    name = "team-a"                   # [A-Za-z0-9_-]{1,64}, unique
    api_keys = ["sha256:9f86d0…"]     # SHA-256 (hex) of each client API key
    hook_tokens = ["sha256:60303a…"]  # SHA-256 (hex) of each hook token
    max_held = 256                    # optional: the tenant's requests held at once (429 beyond)

Only digests are stored, so the file is no secret: ``tao keys add`` makes a key, prints it
once and writes its digest. A digest names one tenant (the same digest twice is an error).

With a tenants file the gateway (:mod:`services.gateway.auth`) answers 401 to a model request
without a known API key (``Authorization: Bearer <key>`` or ``x-api-key``), and to a hook post
without a known hook token; it serves the tenant's sessions under :func:`qualify`'d ids
(``<tenant>:<id>``), so one tenant's ids, ``DELETE /v1/sessions/{id}`` and hook events can
never name another tenant's session. **Rotation**: add the new key (several may be valid at
once), move the clients, remove the old one; the gateway reads the file again when it changes
(:class:`TenantsWatch`), no restart. Unknown keys are errors; every error names the file, the
tenant and the key.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from .errors import ConfigFileError
from .tomlfile import Reloading, read_toml, tables

__all__ = [
    "SEPARATOR",
    "TENANT_HEADER",
    "SecretKind",
    "Tenant",
    "Tenants",
    "TenantsFileError",
    "TenantsWatch",
    "add_secret",
    "digest",
    "load_tenants_file",
    "new_secret",
    "parse_tenants",
    "qualify",
    "remove_secret",
    "render_tenants_file",
    "unqualify",
    "valid_name",
]

TENANT_HEADER: Final = "Tao-Tenant"
"""Bus header of a hook payload the gateway forwarded: the tenant whose hook token posted it.
The tools service serves the payload's session ids as :func:`qualify`'d with it."""
SEPARATOR: Final = ":"
"""Between the tenant and the client's session id; tenant names cannot contain it."""
SecretKind = Literal["api", "hook"]
_FIELD: Final[dict[SecretKind, str]] = {"api": "api_keys", "hook": "hook_tokens"}
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_DIGEST_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")
_KEYS: Final = ("name", "api_keys", "hook_tokens", "max_held")
_SECRET_BYTES: Final = 32


class TenantsFileError(ConfigFileError):
    """The tenants file at ``path`` is unreadable or invalid, for ``reason``."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    api_keys: tuple[str, ...] = ()
    hook_tokens: tuple[str, ...] = ()
    max_held: int | None = None

    def secrets_of(self, kind: SecretKind) -> tuple[str, ...]:
        return self.api_keys if kind == "api" else self.hook_tokens


@dataclass(frozen=True, slots=True)
class Tenants:
    """The tenants of one file, looked up by the digest of a presented secret."""

    tenants: tuple[Tenant, ...] = ()
    _by: dict[tuple[SecretKind, str], Tenant] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for t in self.tenants:
            for kind in _FIELD:
                for d in t.secrets_of(kind):
                    self._by[(kind, d)] = t

    def find(self, kind: SecretKind, secret: str) -> Tenant | None:
        """The tenant whose ``kind`` secret this is, else ``None`` (an empty secret: ``None``)."""
        return self._by.get((kind, digest(secret))) if secret else None

    def get(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants if t.name == name), None)


def valid_name(name: str) -> bool:
    """Whether ``name`` can name a tenant: ``[A-Za-z0-9_-]{1,64}``."""
    return _NAME_RE.fullmatch(name) is not None


def digest(secret: str) -> str:
    """``sha256:<hex>`` of ``secret`` (what the file stores)."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


def new_secret(kind: SecretKind) -> str:
    """A fresh random secret: ``tao-api-…`` or ``tao-hook-…`` (256 bits, URL-safe)."""
    return f"tao-{kind}-{secrets.token_urlsafe(_SECRET_BYTES)}"


def qualify(tenant: str, session_id: str) -> str:
    """The id TAO keeps for ``tenant``'s session ``session_id``."""
    return f"{tenant}{SEPARATOR}{session_id}"


def unqualify(tenant: str, session_id: str) -> str:
    """The client's id of a :func:`qualify`'d ``session_id`` (unchanged if not ``tenant``'s)."""
    return session_id.removeprefix(f"{tenant}{SEPARATOR}")


def _digests(raw: object, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, str) for d in raw):
        raise ValueError(f"{where}: {key} must be a list of strings")
    for d in raw:
        if not _DIGEST_RE.fullmatch(d):
            shown = d if len(d) <= 16 else d[:12] + "…"
            raise ValueError(
                f"{where}: {key} holds {shown!r}, not a 'sha256:<64 hex digits>' digest "
                "(store digests, never the keys: tao keys add)"
            )
    return tuple(raw)


def _tenant(raw: object, index: int) -> Tenant:
    where = f"tenant {index + 1}"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: must be a table, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"{where}: name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    where = f"tenant {name!r}"
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}")
    values: dict[str, Any] = {"name": name}
    for key in ("api_keys", "hook_tokens"):
        if key in raw:
            values[key] = _digests(raw[key], where, key)
    if "max_held" in raw:
        cap = raw["max_held"]
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"{where}: max_held must be an integer >= 1, got {cap!r}")
        values["max_held"] = cap
    return Tenant(**values)


def parse_tenants(doc: Mapping[str, Any]) -> Tenants:
    """The tenants of a parsed TOML document; :class:`ValueError` names the tenant and key."""
    out: list[Tenant] = []
    owner: dict[str, str] = {}
    for index, raw in enumerate(tables(doc, "tenant")):
        t = _tenant(raw, index)
        if any(o.name == t.name for o in out):
            raise ValueError(f"tenant name {t.name!r} appears twice")
        for d in (*t.api_keys, *t.hook_tokens):
            if d in owner:
                raise ValueError(
                    f"digest {d[:19]}… appears twice (tenants {owner[d]!r} and {t.name!r})"
                )
            owner[d] = t.name
        out.append(t)
    return Tenants(tuple(out))


def load_tenants_file(path: str | Path) -> Tenants:
    """Read and check the tenants file; :class:`TenantsFileError` says what is wrong, where."""
    doc = read_toml(path, TenantsFileError)
    try:
        return parse_tenants(doc)
    except ValueError as exc:
        raise TenantsFileError(str(path), str(exc)) from None


def _toml_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def render_tenants_file(tenants: Tenants) -> str:
    """TOML text for ``tenants`` that :func:`load_tenants_file` reads back unchanged."""
    lines = ["# TAO tenants (TAO_TENANTS_FILE): digests only; edit with `tao keys`."]
    for t in tenants.tenants:
        lines += ["", "[[tenant]]", f'name = "{t.name}"']
        lines.append(f"api_keys = {_toml_list(t.api_keys)}")
        lines.append(f"hook_tokens = {_toml_list(t.hook_tokens)}")
        if t.max_held is not None:
            lines.append(f"max_held = {t.max_held}")
    return "\n".join(lines) + "\n"


def _edit(path: str | Path, change: Callable[[Tenants], Tenants]) -> None:
    """Apply ``change`` to the file's tenants (a missing file: none) and write it atomically
    (owner read/write only: a digest is no secret, but who holds keys is the operator's)."""
    p = Path(path).expanduser()
    tenants = load_tenants_file(p) if p.exists() else Tenants()
    text = render_tenants_file(change(tenants))
    tmp = p.with_name(p.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, p)


def add_secret(
    path: str | Path, tenant: str, kind: SecretKind, *, max_held: int | None = None
) -> str:
    """Make a new ``kind`` secret for ``tenant`` (created if new), write its digest to the
    file at ``path`` (created if missing) and return the secret (shown once)."""
    if not _NAME_RE.fullmatch(tenant):
        raise ValueError(f"tenant name must match [A-Za-z0-9_-]{{1,64}}, got {tenant!r}")
    secret = new_secret(kind)

    def change(ts: Tenants) -> Tenants:
        old = ts.get(tenant) or Tenant(tenant)
        held = max_held if max_held is not None else old.max_held
        more = (*old.secrets_of(kind), digest(secret))
        new = (
            replace(old, max_held=held, api_keys=more)
            if kind == "api"
            else replace(old, max_held=held, hook_tokens=more)
        )
        kept = [new if t.name == tenant else t for t in ts.tenants]
        return parse_tenants_of(kept if ts.get(tenant) else [*kept, new])

    _edit(path, change)
    return secret


def remove_secret(path: str | Path, tenant: str, prefix: str) -> str:
    """Remove the one digest of ``tenant`` that starts with ``prefix`` (``sha256:`` optional);
    return it. :class:`ValueError` when none or several match."""
    want = prefix if prefix.startswith("sha256:") else "sha256:" + prefix
    removed: list[str] = []

    def change(ts: Tenants) -> Tenants:
        old = ts.get(tenant)
        if old is None:
            raise ValueError(f"no tenant {tenant!r} in {path}")
        hits = [d for d in (*old.api_keys, *old.hook_tokens) if d.startswith(want)]
        if len(hits) != 1:
            what = "no digest" if not hits else f"{len(hits)} digests"
            raise ValueError(f"{what} of tenant {tenant!r} start with {want!r}")
        removed.append(hits[0])
        new = replace(
            old,
            api_keys=tuple(d for d in old.api_keys if d != hits[0]),
            hook_tokens=tuple(d for d in old.hook_tokens if d != hits[0]),
        )
        return Tenants(tuple(new if t.name == tenant else t for t in ts.tenants))

    _edit(path, change)
    return removed[0]


def parse_tenants_of(tenants: Iterable[Tenant]) -> Tenants:
    """``tenants`` checked as a file's would be (names and digests unique)."""
    return parse_tenants(
        {
            "tenant": [
                {
                    "name": t.name,
                    "api_keys": list(t.api_keys),
                    "hook_tokens": list(t.hook_tokens),
                    **({"max_held": t.max_held} if t.max_held is not None else {}),
                }
                for t in tenants
            ]
        }
    )


class TenantsWatch(Reloading[Tenants]):
    """The tenants of a file, read again when it changes (:class:`~.tomlfile.Reloading`: a
    file that became invalid keeps the last good tenants and reports the error once)."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float],
        every_s: float = 1.0,
        on_error: Callable[[ConfigFileError], None] | None = None,
    ) -> None:
        super().__init__(path, load_tenants_file, clock=clock, every_s=every_s, on_error=on_error)

    @property
    def tenants(self) -> Tenants:
        return self.value
