"""The Kubernetes probes of docker/k8s/deployment.yaml, run inside a container of the image (``docker exec``):
readiness on ``/v2/health/ready``, liveness ``python -m fastpath.server.stubs --check``, before and after a
python-backend stub is killed."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.conftest import free_ports
from tests.container.conftest import start_container
from tests.container.docker_env import REPO_ROOT, http_status
from tests.container.test_image import READ_ONLY, infer_http

# The stub of text_embedding's instance, found as the check finds stubs, killed, and the liveness probe run at
# once in the same shell: `fastpath serve` reloads such a model after 2 s (fastpath.server.stubs.StubSupervisor).
KILL_STUB = ("from fastpath.server.stubs import all_processes, list_stubs; import os, signal; "
             "(stub,) = [s for s in list_stubs(all_processes()) if s.model == 'text_embedding']; "
             "os.kill(stub.pid, signal.SIGKILL); print(stub.pid)")


@pytest.fixture(scope="module")
def probed(docker_image, admin_key):
    ports = free_ports(3)
    container = start_container("fastpath-test-probes", admin_key, ports, READ_ONLY)
    try:
        yield container, ports[0]
    finally:
        container.remove()


def deployment_probes() -> dict:
    (deployment,) = [d for d in yaml.safe_load_all((REPO_ROOT / "docker" / "k8s" / "deployment.yaml").read_text()) if d]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def probe_command(port: int) -> list[str]:
    command = deployment_probes()["livenessProbe"]["exec"]["command"]
    assert command[-2:] == ["--http-port", "8000"]
    return [*command[:-1], str(port)]


def test_readiness_url_answers_200_when_ready(probed):
    container, port = probed
    path = deployment_probes()["readinessProbe"]["httpGet"]["path"]
    assert http_status(f"http://127.0.0.1:{port}{path}") == 200
    done = container.exec("python", "-c", f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}{path}').status)")
    assert done.stdout.strip() == "200", done.stderr


def test_liveness_check_passes_when_healthy_and_fails_after_a_stub_is_killed(probed):
    container, port = probed
    healthy = container.exec(*probe_command(port))
    assert healthy.returncode == 0, healthy.stderr
    killed = container.exec("sh", "-c", f"python -c \"{KILL_STUB}\" && exec {' '.join(probe_command(port))}")
    assert killed.returncode == 1, killed.stdout + killed.stderr
    assert "text_embedding version 1: 0 of 1 python-backend stubs alive" in killed.stderr, killed.stderr
    # fastpath serve (the entrypoint) reloads the model: the check passes again and requests succeed
    deadline = time.monotonic() + 90
    while container.exec(*probe_command(port)).returncode != 0 or infer_http(port, ["back again"])[0] != 200:
        assert time.monotonic() < deadline, container.logs()[-5000:]
        time.sleep(1)
    assert "reloading 'text_embedding'" in container.logs()
