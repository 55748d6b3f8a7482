"""Signed placements: the planner signs each :class:`~shared.contracts.Placement` (Ed25519), the
gateway admits only what a key it trusts signed, recently.

Anyone who can publish on ``tao.v1.placement.<gateway>`` could otherwise admit any session on
any node, past every capacity check. With keys configured:

* the planner (``TAO_PLACEMENT_KEY``: a signing key file) sets ``key_id``, ``issued_at`` and
  ``signature`` on every placement it publishes; the signature is over the placement's JSON
  encoding with ``signature`` empty (msgspec encodes fields in their declared order, so both
  ends produce the same bytes);
* the gateway (``TAO_PLACEMENT_KEYS``: a file of trusted public keys) rejects and counts a
  placement that is unsigned, signed by a key it does not know, whose signature does not
  verify (forged or altered), or whose ``issued_at`` is more than ``max_age_s`` old or more
  than ``max_skew_s`` ahead of its clock (``expired``: a replay from a capture). Within that
  window a replay changes nothing: a gateway ignores a placement older than one it applied
  (the version check).

Key files (TOML; ``tao keys placement`` writes both)::

    # the planner's signing key (mode 0600)      # the gateway's trusted keys
    id = "p-2026-12-01"                          [[key]]
    private = "<base64 of the 32-byte seed>"     id = "p-2026-12-01"
                                                 public = "<base64 of the 32-byte key>"

**Rotation**: make a new key (a new ``id``), add its public half to the gateways' file (they
read it again within a second of a change), point the planner at the new private file and
restart it, then remove the old public key.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from shared.contracts import Placement, encode

from .errors import ConfigFileError
from .tomlfile import Reloading, read_toml, tables

__all__ = [
    "KeyFileError",
    "PlacementSigner",
    "PlacementVerifier",
    "Verdict",
    "load_signer",
    "load_verify_keys",
    "new_key_files",
]

Verdict = Literal["ok", "unsigned", "unknown_key", "forged", "expired"]
_ID_RE: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_AGE_S: Final = 60.0
MAX_SKEW_S: Final = 5.0


class KeyFileError(ConfigFileError):
    """A key file at ``path`` is unreadable or invalid, for ``reason``."""


def _signed_bytes(p: Placement) -> bytes:
    return encode(msgspec.structs.replace(p, signature=None))


def _b64(value: object, path: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise KeyFileError(path, f"{what} must be a base64 string")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise KeyFileError(path, f"{what} is not base64") from None
    if len(raw) != 32:
        raise KeyFileError(path, f"{what} must be 32 bytes, got {len(raw)}")
    return raw


def _key_id(value: object, path: str) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise KeyFileError(path, f"id must match [A-Za-z0-9_.-]{{1,64}}, got {value!r}")
    return value


def _toml(path: str | Path) -> dict[str, Any]:
    return read_toml(path, KeyFileError)


@dataclass(frozen=True, slots=True)
class PlacementSigner:
    """Signs placements with one private key (the planner's)."""

    key_id: str
    key: Ed25519PrivateKey

    def sign(self, p: Placement, now: float) -> Placement:
        """``p`` stamped with this key's id and ``now``, and signed."""
        stamped = msgspec.structs.replace(p, key_id=self.key_id, issued_at=now, signature=None)
        sig = self.key.sign(_signed_bytes(stamped))
        return msgspec.structs.replace(stamped, signature=base64.b64encode(sig).decode())


def load_signer(path: str | Path) -> PlacementSigner:
    """The signing key file at ``path``; :class:`KeyFileError` names what is wrong."""
    doc = _toml(path)
    unknown = sorted(set(doc) - {"id", "private"})
    if unknown:
        raise KeyFileError(str(path), f"unknown key(s) {', '.join(unknown)}; known: id, private")
    seed = _b64(doc.get("private"), str(path), "private")
    return PlacementSigner(
        _key_id(doc.get("id"), str(path)), Ed25519PrivateKey.from_private_bytes(seed)
    )


def load_verify_keys(path: str | Path) -> dict[str, Ed25519PublicKey]:
    """Key id → public key, from the trusted-keys file at ``path``."""
    name = str(path)
    doc = _toml(path)
    try:
        found = tables(doc, "key")
    except ValueError as exc:
        raise KeyFileError(name, str(exc)) from None
    out: dict[str, Ed25519PublicKey] = {}
    for i, t in enumerate(found):
        if not isinstance(t, Mapping):
            raise KeyFileError(name, f"key {i + 1}: must be a table")
        unknown = sorted(set(t) - {"id", "public"})
        if unknown:
            raise KeyFileError(name, f"key {i + 1}: unknown key(s) {', '.join(unknown)}")
        kid = _key_id(t.get("id"), name)
        if kid in out:
            raise KeyFileError(name, f"key id {kid!r} appears twice")
        out[kid] = Ed25519PublicKey.from_public_bytes(_b64(t.get("public"), name, f"key {kid!r}"))
    return out


class PlacementVerifier:
    """Checks placements against the trusted keys of a file, read again when it changes
    (:class:`~.tomlfile.Reloading`: a broken file keeps the last good keys)."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float],
        max_age_s: float = MAX_AGE_S,
        max_skew_s: float = MAX_SKEW_S,
        on_error: Callable[[ConfigFileError], None] | None = None,
        every_s: float = 1.0,
    ) -> None:
        self.clock = clock
        self.max_age_s = max_age_s
        self.max_skew_s = max_skew_s
        self.keys = Reloading(
            path, load_verify_keys, clock=clock, every_s=every_s, on_error=on_error
        )

    def verdict(self, p: Placement) -> Verdict:
        """``ok``, or why ``p`` must not be acted on."""
        if p.signature is None or p.key_id is None or p.issued_at is None:
            return "unsigned"
        key = self.keys.current().get(p.key_id)
        if key is None:
            return "unknown_key"
        try:
            key.verify(base64.b64decode(p.signature, validate=True), _signed_bytes(p))
        except (InvalidSignature, binascii.Error, ValueError):
            return "forged"
        age = self.clock() - p.issued_at
        if age > self.max_age_s or age < -self.max_skew_s:
            return "expired"
        return "ok"


def new_key_files(key_id: str, private_path: str | Path, public_path: str | Path) -> None:
    """Make a key pair: the private half written to ``private_path`` (mode 0600, refused if it
    exists), the public half added to the trusted keys at ``public_path`` (created if new)."""
    _key_id(key_id, str(private_path))
    pub_path = Path(public_path).expanduser()
    trusted = load_verify_keys(pub_path) if pub_path.exists() else {}
    if key_id in trusted:
        raise KeyFileError(str(pub_path), f"key id {key_id!r} is already trusted")
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes_raw()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    fd = os.open(Path(private_path).expanduser(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f'id = "{key_id}"\nprivate = "{base64.b64encode(seed).decode()}"\n')
    with open(pub_path, "a", encoding="utf-8") as fh:
        if not trusted and pub_path.stat().st_size == 0:
            fh.write("# TAO placement keys the gateway trusts (TAO_PLACEMENT_KEYS)\n")
        fh.write(f'\n[[key]]\nid = "{key_id}"\npublic = "{base64.b64encode(public).decode()}"\n')
