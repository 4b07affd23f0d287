"""The CPU image, run as docs/deployment.md says: read-only root file system, tmpfs for /tmp and the swap
control plane, a host directory for the serving-version records, ``--network host`` on free ports.
Requests, a live swap that survives a reload and a new container, Prometheus on the dashboard's and the
prometheus-adapter's queries, and a SIGTERM while requests are in flight."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import skimage

from tests.conftest import free_ports
from tests.container.conftest import Phase, start_container
from tests.container.docker_env import REPO_ROOT, Prometheus, http_status, run
from tests.unit.test_deploy_files import adapter_rules, dashboard_queries

# docs/deployment.md, "Read-only root file system": the flags the docs give, verbatim.
READ_ONLY = ("--read-only", "--tmpfs", "/tmp", "--tmpfs", "/var/run/fastpath:uid=10001,gid=10001")
RECORDS = "/var/run/fastpath/versions"  # FASTPATH_VERSION_STATE_DIR of the images
FASTPATH = str(Path(sys.executable).parent / "fastpath")
GPU_ONLY = ("nv_gpu_",)  # Triton exports these only where it sees a GPU


@pytest.fixture(scope="module")
def ports() -> list[int]:
    return free_ports(3)


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> Path:
    """The host directory mounted at RECORDS, owned by the image's uid (a volume does the same in production)."""
    directory = tmp_path_factory.mktemp("versions")
    os.chown(directory, 10001, 10001)
    return directory


@pytest.fixture(scope="module")
def container(docker_image, admin_key, ports, versions):
    container = start_container("fastpath-test-serve", admin_key, ports, (*READ_ONLY, "-v", f"{versions}:{RECORDS}"))
    try:
        yield container
    finally:
        container.remove()


def infer_http(port: int, texts: list[str], timeout_s: float = 120) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/text_embedding/infer", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")}


def outputs(reply: dict) -> dict[str, dict]:
    return {output["name"]: output for output in reply["outputs"]}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_container_runs_read_only_as_uid_10001_with_every_model_ready(container, ports):
    state = container.inspect()
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    assert container.exec("id", "-u").stdout.strip() == "10001"
    assert container.exec("touch", "/opt/fastpath/model_repository/x").returncode != 0  # read-only really
    with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2", timeout=5) as reply:
        assert json.loads(reply.read())["version"] == "2.51.0"
    for model in ("text_embedding", "text_detection", "fastpath_admin"):  # FASTPATH_MODELS default: every model
        assert http_status(f"http://127.0.0.1:{ports[0]}/v2/models/{model}/ready") == 200, model


# Inside the container: which processes map a tcmalloc library ("tritonserver", "stub"), from /proc.
MAPS_PROBE = """
import pathlib
found = {}
for proc in pathlib.Path("/proc").iterdir():
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\\0")[0].decode()
        maps = (proc / "maps").read_text()
    except (OSError, ValueError):
        continue
    kind = "tritonserver" if argv.endswith("/tritonserver") else "stub" if argv.endswith("triton_python_backend_stub") else None
    if kind:
        found.setdefault(kind, set()).add("tcmalloc" in maps)
print({kind: sorted(values) for kind, values in found.items()})
"""


def test_tritonserver_in_the_image_runs_on_tcmalloc_and_its_stubs_on_glibc(container):
    """Invariant: the image's tritonserver maps tcmalloc (the package the image installs, found by fastpath serve),
    and none of its python-backend stubs does."""
    done = container.exec("python", "-c", MAPS_PROBE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'tritonserver': [True], 'stub': [False]}", done.stdout


def test_readme_curl_example_answers_two_embeddings(container, ports, reference):
    readme = (REPO_ROOT / "README.md").read_text()
    command = re.search(r"^curl -s localhost:8000/v2/models/text_embedding/infer .*?}'$", readme, flags=re.M | re.S).group(0)
    done = run(["bash", "-c", command.replace("localhost:8000", f"127.0.0.1:{ports[0]}")])
    embedding = outputs(json.loads(done.stdout))["EMBEDDING"]
    assert embedding["shape"] == [2, 384] and embedding["datatype"] == "FP32"
    got = np.asarray(embedding["data"], dtype=np.float32).reshape(2, 384)
    expected = reference(["A quick brown fox.", "Triton serves models."])
    assert cosines(got, expected).min() > 0.9999


def test_grpc_infer_matches_the_reference(container, ports, reference):
    import tritonclient.grpc as grpcclient

    texts = ["gRPC from the host.", "A second text, a little longer than the first one.", "Third."]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
    text = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t] for t in texts], dtype=object))
    got = client.infer("text_embedding", [text]).as_numpy("EMBEDDING")
    client.close()
    assert got.shape == (3, 384)
    assert cosines(got, reference(texts)).min() > 0.9999


def test_live_swap_needs_the_admin_key(container, ports, admin_key, tmp_path, reference):
    url = f"127.0.0.1:{ports[0]}"
    env = {k: v for k, v in os.environ.items() if k != "FASTPATH_ADMIN_KEY"} | {"HOME": str(tmp_path)}  # no key file either
    for key in (None, "a-wrong-key-of-enough-length"):
        refused = run([FASTPATH, "swap", "text_embedding", "2", "--url", url], check=False, timeout_s=180,
                      env=env | ({"FASTPATH_ADMIN_KEY": key} if key else {}))
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "key" in refused.stderr.lower(), refused.stderr
    status = json.loads(run([FASTPATH, "status", "text_embedding", "--url", url], env=env).stdout)
    assert status["active_version"] == 1
    done = run([FASTPATH, "swap", "text_embedding", "2", "--url", url], timeout_s=300, env=env | {"FASTPATH_ADMIN_KEY": admin_key})
    assert json.loads(run([FASTPATH, "status", "text_embedding", "--url", url], env=env).stdout)["active_version"] == 2, done.stdout
    code, reply = infer_http(ports[0], ["Served by the INT8 version.", "After a live swap."])
    assert code == 200, reply
    assert outputs(reply)["MODEL_VERSION"]["data"] == [2, 2]
    got = np.asarray(outputs(reply)["EMBEDDING"]["data"], dtype=np.float32).reshape(2, 384)
    assert cosines(got, reference(["Served by the INT8 version.", "After a live swap."])).min() > 0.99  # INT8 accuracy gate
    record = json.loads(container.exec("cat", f"{RECORDS}/text_embedding.json").stdout)
    assert (record["version"], record["previous_version"], record["reason"]) == (2, 1, "swap"), record


def status(port: int) -> dict:
    return json.loads(run([FASTPATH, "status", "text_embedding", "--url", f"127.0.0.1:{port}"]).stdout)


def test_the_swap_survives_a_reload_with_a_config_override(container, ports, admin_key):
    """An operator's reload through Triton's repository API (needs the key) comes back on version 2, from
    the record on the mounted directory: the read-only model repository could not hold it."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
    config = client.get_model_config("text_embedding")
    config["parameters"]["max_queue_delay_us"] = {"string_value": "2001"}
    client.load_model("text_embedding", headers={"fastpath-admin-key": admin_key}, config=json.dumps(config))
    client.close()
    deadline = time.monotonic() + 60
    while len(status(ports[0])["instances"]) != 1:  # the replaced instance has left the control plane
        assert time.monotonic() < deadline, status(ports[0])
        time.sleep(0.5)
    reloaded = status(ports[0])
    instance = next(iter(reloaded["instances"].values()))
    assert reloaded["active_version"] == 2 and instance["restore"] == {"version": 2, "ok": True, "error": None}, reloaded
    code, reply = infer_http(ports[0], ["After a reload."])
    assert code == 200 and outputs(reply)["MODEL_VERSION"]["data"] == [2], reply


# --- Prometheus ----------------------------------------------------------------------------------

RATE_INTERVAL = "15s"  # Grafana's $__rate_interval for a 1 s scrape interval is 4 x 1 s; 15 s spans the load
POD = "fastpath-0"  # the namespace/pod labels the Kubernetes scrape job adds (docker/k8s/prometheus-scrape-job.yaml)


def grafana_substitute(query: str) -> str:
    """A dashboard query as Grafana sends it with "All" selected (allValue ``.*``) and a 15 s rate interval."""
    return re.sub(r"\$\{?(model|instance)\}?", ".*", query.replace("$__rate_interval", RATE_INTERVAL))


def adapter_substitute(query: str) -> str:
    """A prometheus-adapter rule as the adapter sends it for the pods of namespace "default"."""
    return query.replace("<<.GroupBy>>", "pod").replace("<<.LabelMatchers>>", f'namespace="default",pod=~"{POD}"')


def queries() -> list[tuple[str, str]]:
    found = [(where, grafana_substitute(q)) for where, q in dashboard_queries()]
    found += [(f"adapter {rule['name']['as']} {field}", adapter_substitute(rule[field]))
              for rule in adapter_rules() for field in ("seriesQuery", "metricsQuery")]
    return found


@pytest.fixture(scope="module")
def prometheus_after_load(container, ports):
    """Prometheus scraping the container, after 20 s of load on both models plus one bad request."""
    prometheus = Prometheus(f"127.0.0.1:{ports[2]}", free_ports(1)[0], {"namespace": "default", "pod": POD})
    try:
        with Phase("Prometheus up and scraping, 20 s of load"):
            deadline = time.monotonic() + 30
            while not prometheus.targets_up():
                assert time.monotonic() < deadline, "prometheus never scraped the container"
                time.sleep(0.5)
            bad = urllib.request.Request(
                f"http://127.0.0.1:{ports[0]}/v2/models/text_embedding/infer", headers={"Content-Type": "application/json"},
                data=json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}],
                                 "parameters": {"fastpath_priority": "not-a-priority"}}).encode())
            try:
                urllib.request.urlopen(bad, timeout=30)
            except urllib.error.HTTPError:
                pass
            stop = time.monotonic() + 20
            errors: list[str] = []

            def load(worker: int) -> None:
                while time.monotonic() < stop:
                    code, reply = infer_http(ports[0], [f"load {worker} {i} " * (1 + i % 7) for i in range(1 + worker * 3)])
                    if code != 200:
                        errors.append(str(reply))

            threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
            for thread in threads:
                thread.start()
            png = (Path(skimage.data.__file__).parent / "page.png").read_bytes()
            detect_image(ports[0], png)
            for thread in threads:
                thread.join()
            assert not errors, errors[:3]
            time.sleep(3)  # two more scrapes after the last request
        yield prometheus
    finally:
        prometheus.stop()


def detect_image(port: int, png: bytes) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    image = httpclient.InferInput("IMAGE_BYTES", [1], "BYTES")
    image.set_data_from_numpy(np.array([png], dtype=np.object_))
    assert client.infer("text_detection", [image]).as_numpy("BOX_COUNTS")[0] > 0
    client.close()


@pytest.mark.parametrize("where, query", [pytest.param(w, q, id=f"{i}-{w}") for i, (w, q) in enumerate(queries())])
def test_every_dashboard_and_adapter_query_returns_data(prometheus_after_load, where, query):
    result = prometheus_after_load.query(query)
    if any(name in query for name in GPU_ONLY):
        assert result == [], f"{where}: a GPU series on a machine without GPU: {result}"
        pytest.skip(f"{where}: GPU-only series (nv_gpu_*), exported only where Triton sees a GPU")
    assert result, f"{where}: empty result for {query}"


def test_load_shows_in_the_throughput_and_batch_size_queries(prometheus_after_load):
    rate = prometheus_after_load.query(f'sum(rate(nv_inference_count{{model="text_embedding"}}[{RATE_INTERVAL}]))')
    assert float(rate[0]["value"][1]) > 1, rate
    sizes = prometheus_after_load.query('sum(fastpath_batch_size_sum{model="text_embedding"})')
    assert float(sizes[0]["value"][1]) > 20, sizes
    invalid = prometheus_after_load.query('sum(fastpath_invalid_requests_total{model="text_embedding"})')
    assert float(invalid[0]["value"][1]) >= 1, invalid


# --- SIGTERM (it stops the container), then a new container on the same records -----------------

def test_sigterm_drains_in_flight_requests_and_exits_0(container, ports, prometheus_after_load):
    texts = [f"text number {i}: " + "a sentence of some length to keep the engine busy for a while. " * 6 for i in range(64)]
    answers: list[tuple[int, dict, float]] = []

    def send() -> None:
        code, reply = infer_http(ports[0], texts)
        answers.append((code, reply, time.monotonic()))

    senders = [threading.Thread(target=send) for _ in range(4)]
    for sender in senders:
        sender.start()
    time.sleep(0.3)
    with Phase("docker stop -t 40 with 4 requests of 64 texts in flight"):
        stop_at = time.monotonic()
        stopped = subprocess.run(["docker", "stop", "-t", "40", container.name], capture_output=True, text=True, timeout=90)
        stop_s = time.monotonic() - stop_at
    for sender in senders:
        sender.join(60)
    assert stopped.returncode == 0, stopped.stderr
    state = container.inspect()["State"]
    log = container.logs()
    assert state["ExitCode"] == 0 and not state["OOMKilled"], log[-3000:]
    assert stop_s < 40, f"took {stop_s:.1f} s: the grace period ran out"
    assert "received SIGTERM" in log and "tritonserver exited with code 0" in log, log[-3000:]
    assert len(answers) == 4
    for code, reply, _ in answers:
        assert code == 200, reply
        assert outputs(reply)["EMBEDDING"]["shape"] == [64, 384]
    assert max(at for _, _, at in answers) > stop_at, "every answer came before the stop: nothing was in flight"
    print(f"docker stop took {stop_s:.1f} s; answers {[round(at - stop_at, 2) for _, _, at in answers]} s after it began")


def test_a_new_container_on_the_same_records_serves_the_swapped_version(container, admin_key, versions):
    """After the stop above: a fresh container (fresh tmpfs, same mounted record directory) starts on version 2."""
    ports = free_ports(3)
    again = start_container("fastpath-test-again", admin_key, ports, (*READ_ONLY, "-v", f"{versions}:{RECORDS}"))
    try:
        assert status(ports[0])["active_version"] == 2
        code, reply = infer_http(ports[0], ["A new container.", "Same record."])
        assert code == 200 and outputs(reply)["MODEL_VERSION"]["data"] == [2, 2], reply
    finally:
        again.remove()
