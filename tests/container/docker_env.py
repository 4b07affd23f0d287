"""The machinery of the container tests: tools from Debian's packages, a Docker engine, the debootstrap base,
the CPU image, containers and a Prometheus server, each with a way to stop it.

Everything talks to 127.0.0.1 only (containers run with ``--network host``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE = "fastpath:0.1.0-cpu"
BASE_IMAGE = "fastpath-base:bookworm"
DEBIAN_PACKAGES = {"docker": "docker.io", "dockerd": "docker.io", "debootstrap": "debootstrap",
                   "prometheus": "prometheus", "promtool": "prometheus"}
# dockerd on a machine without overlayfs support or iptables rights: vfs copies layers, no bridge network
# (containers use the host's network).
DOCKERD_FLAGS = ("--storage-driver=vfs", "--iptables=false", "--bridge=none")


def run(command: Sequence[str], *, timeout_s: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` with text output captured; raises with the output when ``check`` and it failed."""
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def ensure_debian_tools() -> None:
    """Install Debian's docker.io, debootstrap and prometheus when one of their commands is missing (CI runs as
    root on a fresh Debian machine)."""
    missing = sorted({package for tool, package in DEBIAN_PACKAGES.items() if shutil.which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise AssertionError(f"missing {', '.join(missing)}: run as root, or apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], timeout_s=600, env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], timeout_s=900, env=env)


def engine_answers() -> bool:
    return run(["docker", "info"], timeout_s=30, check=False).returncode == 0


@contextlib.contextmanager
def docker_engine(log_dir: Path) -> Iterator[None]:
    """A Docker engine: the one that answers, else a ``dockerd`` started here and stopped on exit."""
    if engine_answers():
        yield
        return
    log = open(log_dir / "dockerd.log", "ab")
    process = subprocess.Popen(["dockerd", *DOCKERD_FLAGS], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not engine_answers():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"dockerd did not start; log {log_dir / 'dockerd.log'}:\n"
                                     + (log_dir / "dockerd.log").read_text()[-3000:])
            time.sleep(0.5)
        yield
    finally:
        process.send_signal(signal.SIGTERM)  # dockerd stops its containers and exits
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def image_id(name: str) -> str | None:
    """The ID of the image tagged ``name``, or None when there is none."""
    done = run(["docker", "image", "inspect", "--format", "{{.Id}}", name], timeout_s=60, check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def build_image() -> None:
    """The debootstrap base (docker/debian-base.sh, cached tarball) and the CPU image on top of it.

    The image that the new build untags is deleted: under the vfs storage driver every image is a full copy
    of its layers (~1.3 GB here), so the untagged images of earlier builds would fill the disk run by run.
    """
    run([str(REPO_ROOT / "docker" / "debian-base.sh"), BASE_IMAGE], timeout_s=900)
    previous = image_id(IMAGE)
    run(["docker", "build", "--network", "host", "-f", str(REPO_ROOT / "docker" / "Dockerfile.cpu"),
         "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "-t", IMAGE, str(REPO_ROOT)], timeout_s=1200)
    if previous is not None and previous != image_id(IMAGE):
        run(["docker", "rmi", previous], timeout_s=300, check=False)  # fails harmlessly if a container uses it


class Container:
    """A detached ``docker run --network host`` of the image; :meth:`remove` stops and deletes it."""

    def __init__(self, name: str, env: dict[str, str], options: Sequence[str] = ()) -> None:
        self.name, self.env = name, env
        environment = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
        run(["docker", "run", "-d", "--name", name, "--network", "host", "--shm-size=1g", *options, *environment, IMAGE])

    def logs(self) -> str:
        done = run(["docker", "logs", self.name], check=False)
        return done.stdout + done.stderr

    def exec(self, *command: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return run(["docker", "exec", self.name, *command], timeout_s=timeout_s, check=False)

    def inspect(self) -> dict:
        return json.loads(run(["docker", "inspect", self.name]).stdout)[0]

    def remove(self) -> None:
        run(["docker", "rm", "-f", self.name], check=False)


def http_status(url: str, timeout_s: float = 2.0) -> int:
    """The status of a GET of ``url``, 0 when nothing answers (:func:`fastpath.server.triton_api.http_status`)."""
    from fastpath.server.triton_api import http_status as status

    return status(url, timeout_s)


def wait_ready(container: Container, http_port: int, timeout_s: float = 300) -> float:
    """Seconds until ``/v2/health/ready`` answers 200; fails with the container's log if it exits or times out."""
    start = time.monotonic()
    while http_status(f"http://127.0.0.1:{http_port}/v2/health/ready") != 200:
        if not container.inspect()["State"]["Running"] or time.monotonic() - start > timeout_s:
            raise AssertionError(f"container {container.name} not ready after {time.monotonic() - start:.0f} s:\n"
                                 + container.logs()[-5000:])
        time.sleep(0.5)
    return time.monotonic() - start


class Prometheus:
    """Debian's ``prometheus`` scraping ``target`` every second, with the config of docker/prometheus/prometheus.yml
    (its job and labels) pointed at that target, plus ``labels`` on the target."""

    def __init__(self, target: str, port: int, labels: dict[str, str]) -> None:
        import yaml

        self.port = port
        self.directory = Path(tempfile.mkdtemp(prefix="fastpath-prometheus-"))
        config = yaml.safe_load((REPO_ROOT / "docker" / "prometheus" / "prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        (job,) = config["scrape_configs"]
        (static,) = job["static_configs"]
        static["targets"] = [target]
        static["labels"] = {**static.get("labels", {}), **labels}
        (self.directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        run(["promtool", "check", "config", str(self.directory / "prometheus.yml")])
        self.log = open(self.directory / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={self.directory / 'prometheus.yml'}", f"--storage.tsdb.path={self.directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{port}/-/ready") != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("prometheus did not start:\n" + (self.directory / "prometheus.log").read_text()[-3000:])
            time.sleep(0.2)

    def query(self, promql: str) -> list[dict]:
        """The result vector of an instant query (``/api/v1/query``)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def targets_up(self) -> bool:
        return any(float(sample["value"][1]) == 1 for sample in self.query("up"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

