"""The service shell: settings, logging, the NATS bus (and its fake), the service runner,
embedded servers and the ``tao up`` run file. The Redis store lives in :mod:`.store`."""

from .bus import Bus
from .busapi import BatchHandler, Decoder, Deliver, Delivery, Handler, MessageBus, Subscription
from .embedded import (
    EmbeddedServers,
    find_nats_server,
    find_valkey_server,
    nats_answers,
    redis_answers,
)
from .errors import BusError, EmbeddedServerError, InfraError, RunFileError, SettingsError
from .fakes import FakeBus
from .logging import configure_logging, get_logger
from .runfile import (
    RunInfo,
    find_running,
    read_run_file,
    remove_run_file,
    run_file_path,
    write_run_file,
)
from .runner import ServiceContext, run_service, run_service_async
from .settings import NodeSpec, Settings

__all__ = [
    "BatchHandler",
    "Bus",
    "BusError",
    "Decoder",
    "Deliver",
    "Delivery",
    "EmbeddedServerError",
    "EmbeddedServers",
    "FakeBus",
    "Handler",
    "InfraError",
    "MessageBus",
    "NodeSpec",
    "RunFileError",
    "RunInfo",
    "ServiceContext",
    "Settings",
    "SettingsError",
    "Subscription",
    "configure_logging",
    "find_nats_server",
    "find_running",
    "find_valkey_server",
    "get_logger",
    "nats_answers",
    "read_run_file",
    "redis_answers",
    "remove_run_file",
    "run_file_path",
    "run_service",
    "run_service_async",
    "write_run_file",
]
