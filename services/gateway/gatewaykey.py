"""Secure by default beyond loopback: the gateway's own key when no tenants file is set.

Which callers the gateway trusts (:func:`resolve`), first match wins:

1. ``TAO_TENANTS_FILE`` set: the tenants' API keys and hook tokens (:mod:`.auth`); the gateway
   key settings below must then be unset (a start-up error names them otherwise).
2. ``TAO_GATEWAY_AUTH=off``: nobody is asked for a key. Logged as a warning at start when the
   gateway listens beyond loopback, since anyone who reaches the port may then post tool ends
   for any session.
3. ``TAO_GATEWAY_AUTH=auto`` (the default) and a loopback listen address (``127.0.0.0/8``,
   ``::1``, ``localhost``): open, as ``tao up`` has always been on one machine.
4. Otherwise (``TAO_GATEWAY_AUTH=on``, or a non-loopback address such as compose's
   ``0.0.0.0``): one key, ``TAO_GATEWAY_KEY``; else the content of ``TAO_GATEWAY_KEY_FILE``
   (an operator's secret, e.g. a compose secret); else ``<state dir>/gateway.key``, generated
   on first start (256 bits, created owner-only 0600 and never overwritten) and printed once
   on stdout, as Jupyter prints its token; later starts read it and print nothing. The state
   dir is ``TAO_STATE_DIR``, else ``$XDG_STATE_HOME/tao``, else ``~/.local/state/tao``. A
   generated file that others may read (mode beyond 0600) stops the start with a message.

The key is one implicit tenant (:data:`.auth.IMPLICIT`): its API key and its hook token, so
requests send it as ``Authorization: Bearer`` or ``x-api-key`` and hooks as
``Authorization: Bearer`` or ``X-TAO-Hook-Token``, and the tenant checks of :mod:`.auth` do the
rest. Its sessions keep the client's own ids (no tenant prefix): one key, one tenant.
``/healthz``, ``/readyz`` and ``/metrics`` stay open.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TextIO

from shared.infra.errors import SettingsError
from shared.infra.settings import Settings

__all__ = [
    "KEY_FILE_NAME",
    "KeyPolicy",
    "announce",
    "default_state_dir",
    "is_loopback",
    "new_key",
    "resolve",
]

KEY_FILE_NAME: Final = "gateway.key"
_KEY_BYTES: Final = 32

Mode = Literal["tenants", "open", "off", "key"]
Source = Literal["", "TAO_GATEWAY_KEY", "TAO_GATEWAY_KEY_FILE", "generated", "state dir"]


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """How the gateway checks its callers (module docstring): ``mode``, and in mode ``key``
    the key, where it came from (``source``), its file (if any) and whether this start made
    it (``generated``: print it once)."""

    mode: Mode
    key: str | None = field(default=None, repr=False)
    source: Source = ""
    path: Path | None = None
    generated: bool = False

    @property
    def needs_key(self) -> bool:
        return self.mode in ("tenants", "key")


OPEN_POLICY: Final = KeyPolicy("open")


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches this machine only: ``localhost``, ``127.0.0.0/8``,
    ``::1`` (an empty host or ``0.0.0.0`` listens on every interface: not loopback)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def default_state_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``TAO_STATE_DIR``'s default: ``$XDG_STATE_HOME/tao``, else ``~/.local/state/tao``."""
    xdg = env.get("XDG_STATE_HOME", "").strip()
    base = Path(xdg) if xdg else Path(env.get("HOME") or Path.home()) / ".local" / "state"
    return base / "tao"


def new_key() -> str:
    """A fresh gateway key: ``tao-gw-`` and 256 random bits, URL-safe."""
    return f"tao-gw-{secrets.token_urlsafe(_KEY_BYTES)}"


def _read_key(path: Path, variable: str) -> str:
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(variable, str(path), f"cannot read the key file ({exc})") from None
    if not key or any(c.isspace() for c in key):
        raise SettingsError(variable, str(path), "the key file must hold one key, no spaces")
    return key


def _stored_key(path: Path) -> tuple[str, bool]:
    """The key in the generated file ``path``, made (0600, exclusively) when missing; whether
    this call made it."""
    what = "TAO_STATE_DIR"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SettingsError(what, str(path.parent), f"cannot create it ({exc})") from None
    key = new_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # a later start (or another gateway sharing the dir won the race)
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise SettingsError(
                what,
                str(path),
                f"the gateway key file has mode {mode:04o}, readable by others: "
                f"chmod 600 {path} (or set TAO_GATEWAY_KEY / TAO_GATEWAY_KEY_FILE)",
            ) from None
        return _read_key(path, what), False
    except OSError as exc:
        raise SettingsError(what, str(path), f"cannot write the gateway key ({exc})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(key + "\n")
    return key, True


def resolve(settings: Settings, env: Mapping[str, str] = os.environ) -> KeyPolicy:
    """The policy for ``settings`` (module docstring); generates the key file if it is
    needed and missing. :class:`SettingsError` names a bad combination or an unusable file."""
    given = [
        name
        for name, value in (
            ("TAO_GATEWAY_KEY", settings.gateway_key),
            ("TAO_GATEWAY_KEY_FILE", settings.gateway_key_file),
        )
        if value
    ]
    if settings.tenants_file is not None:
        if given:
            raise SettingsError(
                given[0], None, "set either TAO_TENANTS_FILE or a gateway key, not both"
            )
        return KeyPolicy("tenants")
    if settings.gateway_auth == "off":
        return KeyPolicy("off")
    if settings.gateway_auth == "auto" and is_loopback(settings.gateway_host) and not given:
        return OPEN_POLICY
    if settings.gateway_key:
        return KeyPolicy("key", settings.gateway_key, "TAO_GATEWAY_KEY")
    if settings.gateway_key_file:
        path = Path(settings.gateway_key_file).expanduser()
        key = _read_key(path, "TAO_GATEWAY_KEY_FILE")
        return KeyPolicy("key", key, "TAO_GATEWAY_KEY_FILE", path)
    folder = Path(settings.state_dir).expanduser() if settings.state_dir else default_state_dir(env)
    path = folder / KEY_FILE_NAME
    key, made = _stored_key(path)
    return KeyPolicy("key", key, "generated" if made else "state dir", path, made)


def announce(policy: KeyPolicy, url: str, out: TextIO) -> None:
    """Print a key this start generated, once (later starts read it and print nothing)."""
    if not policy.generated or policy.key is None:
        return
    out.write(
        "\n"
        "    The TAO gateway listens beyond loopback and needs a key (secure by default).\n"
        f"    A key was generated and stored in {policy.path} (owner only):\n\n"
        f"        {policy.key}\n\n"
        "    Clients send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>', hooks as\n"
        "    'X-TAO-Hook-Token: <key>'. It is shown this once; read the file to see it again.\n"
        f"    Gateway: {url}  (set TAO_GATEWAY_KEY to choose your own, TAO_GATEWAY_AUTH=off to\n"
        "    switch the check off)\n\n"
    )
    out.flush()
