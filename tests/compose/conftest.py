"""The compose tier: ``docker compose up`` of compose.yaml and deploy/compose.domains.yaml, run
for real on this machine's Docker Engine (issue 31).

The tier is not part of the default run (``pytest`` deselects it: a first run installs Docker,
makes the base images and builds the image, minutes): it runs when selected, ``pytest -m
compose`` (what CI runs for it), when ``tests/compose`` is named on the command line, or with
``TAO_COMPOSE=1``.

Before the first stack, :func:`docker` makes sure of an engine and a Compose v2 CLI
(``scripts/docker.sh install``), the base images (``scripts/base-images.sh``: pulled, else made
locally) and the one image, built once (``docker compose build``). Each stack runs as its own
compose project (``tao-ct-<hex>``) with the gateway published on a free port, and ends with
``down -v`` in a finalizer, whatever happened.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compose.stack import ROOT, ComposeStack, run

HERE = Path(__file__).parent


def _selected(config: pytest.Config) -> bool:
    if "compose" in (config.option.markexpr or "") or os.environ.get("TAO_COMPOSE") == "1":
        return True
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the compose tier unless it was asked for (module docstring)."""
    if _selected(config):
        return
    drop = [i for i in items if i.get_closest_marker("compose") is not None]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i.get_closest_marker("compose") is None]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def docker() -> None:
    """An engine, Compose v2, the base images and the one TAO image (built once)."""
    if os.geteuid() != 0 and run(["docker", "info"], check=False).returncode != 0:
        pytest.skip("no Docker Engine answers and installing one needs root")
    run(["bash", "scripts/docker.sh", "install"], timeout=900)
    run(["bash", "scripts/base-images.sh"], timeout=1200)
    # compose.yaml builds tao-scheduler:local in its one `keys` service; the domains file uses it
    run(["docker", "compose", "-f", "compose.yaml", "build"], timeout=1200)


def _stack(file: str, project: str, env: dict[str, str]) -> Iterator[ComposeStack]:
    stack = ComposeStack(ROOT / file, project, env)
    try:
        stack.up()
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="module")
def stack(docker: None) -> Iterator[ComposeStack]:
    """compose.yaml, up and healthy (``up --wait``)."""
    env = {"TAO_GATEWAY_HOST_PORT": str(free_port())}
    yield from _stack("compose.yaml", f"tao-ct-{uuid.uuid4().hex[:8]}", env)


@pytest.fixture(scope="module")
def domains(docker: None) -> Iterator[ComposeStack]:
    """deploy/compose.domains.yaml, up and healthy."""
    env = {"TAO_GATEWAY_HOST_PORT": str(free_port())}
    yield from _stack("deploy/compose.domains.yaml", f"tao-cd-{uuid.uuid4().hex[:8]}", env)
