"""The infra error tree: every failure of the service shell's plumbing is an ``InfraError``.

    InfraError(Exception)
    ├── SettingsError(InfraError, ValueError)  a bad environment variable (named in the message)
    ├── BusError                               NATS connection or stream set-up failed
    │   └── RequestError                       a request got no reply (no responder, timeout)
    ├── EmbeddedServerError                    a server binary is missing or did not answer
    ├── RunFileError                           the ``tao up`` run file cannot be read
    ├── StoreError                             the state store refused or read a bad value
    │   └── KeyNameError(StoreError, ValueError)  an unusable domain, node or session id
    ├── KvReplayError                          a node's KV-event replay could not be had
    └── ConfigFileError(InfraError, ValueError)  a TOML file is unreadable or invalid: the
        nodes file (NodesFileError), the tenants file (TenantsFileError), a placement key
        file (KeyFileError)

Each error keeps its data as attributes and builds its message from them.
"""

from __future__ import annotations

__all__ = [
    "BusError",
    "ConfigFileError",
    "EmbeddedServerError",
    "InfraError",
    "KvReplayError",
    "RequestError",
    "RunFileError",
    "SettingsError",
    "StoreError",
]


class InfraError(Exception):
    """Base of every error raised by ``shared.infra``."""


class SettingsError(InfraError, ValueError):
    """Environment variable ``variable`` holds ``value``, which is wrong because ``problem``."""

    def __init__(self, variable: str, value: str | None, problem: str) -> None:
        self.variable = variable
        self.value = value
        self.problem = problem
        got = "" if value is None else f", got {value!r}"
        super().__init__(f"{variable}: {problem}{got}")


class BusError(InfraError):
    """The message bus could not be reached or set up."""


class RequestError(BusError):
    """A request on ``subject`` got no reply, for ``reason`` (no responders, or a timeout)."""

    def __init__(self, subject: str, reason: str) -> None:
        self.subject = subject
        self.reason = reason
        super().__init__(f"request on {subject}: {reason}")


class EmbeddedServerError(InfraError):
    """An embedded server (``what``) could not be started, for ``reason``."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


class RunFileError(InfraError):
    """The run file at ``path`` cannot be used, for ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"run file {path}: {reason}")


class ConfigFileError(InfraError, ValueError):
    """The file at ``path`` is unreadable or invalid, for ``reason`` (which names the table and
    key where it can)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class StoreError(InfraError):
    """Base of every error the state store raises."""


class KvReplayError(InfraError):
    """A replay of ``node`` from ``start_seq`` could not be had, for ``reason``."""

    def __init__(self, node: str, start_seq: int, reason: str) -> None:
        self.node = node
        self.start_seq = start_seq
        self.reason = reason
        super().__init__(f"node {node}: replay from seq {start_seq} failed: {reason}")
