"""Fixtures of the container tests (``make test-container``; not part of ``make test``: pyproject's
norecursedirs): Debian's tools, a Docker engine, the CPU image, and the time of each phase, printed at
the end of the run."""

from __future__ import annotations

import os
import secrets
import signal
import time

import pytest

from tests.container import docker_env
from tests.container.docker_env import Container

PHASES: list[tuple[str, float]] = []


class Phase:
    """``with Phase("build image"):`` records how long the block took (printed at the end of the run)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> Phase:
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        PHASES.append((self.name, time.monotonic() - self.start))


def pytest_sessionstart(session):
    session.config._container_start = time.monotonic()

    def _interrupt(signum, frame):  # a CI timeout's SIGTERM: unwind, so that the fixtures stop what they started
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.section("container test phases (wall time)")
    for name, seconds in PHASES:
        terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
    terminalreporter.write_line(f"{time.monotonic() - config._container_start:8.1f} s  total")


@pytest.fixture(scope="session")
def docker_image(tmp_path_factory):
    """The CPU image, built from the debootstrap base on a Docker engine that answers (started here if none)."""
    with Phase("install Debian tools (docker.io, debootstrap, prometheus) where missing"):
        docker_env.ensure_debian_tools()
    log_dir = tmp_path_factory.mktemp("dockerd")
    start = time.monotonic()
    with docker_env.docker_engine(log_dir):
        PHASES.append(("Docker engine answers", time.monotonic() - start))
        with Phase("debootstrap base (cached tarball) + docker build of the CPU image"):
            docker_env.build_image()
        try:
            yield docker_env.IMAGE
        finally:
            start = time.monotonic()
    PHASES.append(("stop what the run started", time.monotonic() - start))


@pytest.fixture(scope="session")
def admin_key() -> str:
    return secrets.token_urlsafe(24)


def start_container(name: str, admin_key: str, ports: list[int], options: tuple[str, ...] = ()) -> Container:
    """A container of the image on free ``ports`` (HTTP, gRPC, metrics), ready; removed by the caller."""
    http, grpc, metrics = ports
    container = Container(f"{name}-{os.getpid()}", {"FASTPATH_ADMIN_KEY": admin_key, "HTTP_PORT": str(http),
                                                    "GRPC_PORT": str(grpc), "METRICS_PORT": str(metrics)}, options)
    try:
        with Phase(f"{name}: docker run to ready"):
            docker_env.wait_ready(container, http)
    except BaseException:
        container.remove()
        raise
    return container
