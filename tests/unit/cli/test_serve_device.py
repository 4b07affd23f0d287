"""`fastpath serve --device`: the tritonserver command line it builds (nothing is started), the GPU
configuration it selects, and its early, clear refusal where torch sees no CUDA device."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from unittest import mock

import pytest

from fastpath.cli import main as cli
from fastpath.cli import serve
from fastpath.cli.common import DEFAULT_REPOSITORY
from fastpath.errors import ServerError
from fastpath.server import devices
from fastpath.server.devices import CudaReport, cuda_report, resolve_device, select_configuration
from fastpath.server.process import server_command

ONE_GPU = CudaReport(("NVIDIA H200",))
NO_GPU = CudaReport((), "torch 2.13.0+cpu is a CPU-only build (torch.version.cuda is None): install a CUDA build of torch")


def parse(*argv: str):
    return cli.build_parser().parse_args(["serve", *argv])


def command_for(*argv: str, report: CudaReport = ONE_GPU) -> list[str]:
    options = serve.serve_options(parse(*argv), "key", probe=lambda: report)
    return server_command(options, Path("/backends"), Path("/dist"))


def test_the_default_device_is_the_cpu_and_loads_every_config_pbtxt():
    command = command_for(report=NO_GPU)
    assert not any(arg.startswith("--model-config-name") for arg in command)
    assert {f"--load-model={name}" for name in ("fastpath_admin", "text_detection", "text_embedding")} <= set(command)


def test_device_cuda_starts_tritonserver_with_the_gpu_model_configuration():
    command = command_for("--device", "cuda")
    assert command.count("--model-config-name=gpu") == 1
    assert command.index("--model-config-name=gpu") < command.index("--load-model=text_embedding")
    assert "--load-model=text_detection" in command  # from its configs/gpu.pbtxt too


def test_device_cuda_logs_which_configuration_each_model_loads(caplog):
    with caplog.at_level(logging.INFO, logger="fastpath"):
        command_for("--device", "cuda")
    text = caplog.text
    assert "device cuda (--device cuda: torch sees 1 CUDA device(s): NVIDIA H200)" in text
    assert "text_embedding: text_embedding/configs/gpu.pbtxt (KIND_GPU x6 on each visible GPU)" in text
    assert "text_detection: text_detection/configs/gpu.pbtxt (KIND_GPU x3 on each visible GPU)" in text
    assert "fastpath_admin: fastpath_admin/config.pbtxt (KIND_CPU x1)" in text


@pytest.mark.parametrize(("report", "device", "flag"), [(ONE_GPU, "cuda", ["--model-config-name=gpu"]), (NO_GPU, "cpu", [])])
def test_device_auto_picks_cuda_only_where_torch_sees_a_gpu_and_says_so(report, device, flag, caplog):
    with caplog.at_level(logging.INFO, logger="fastpath"):
        command = command_for("--device", "auto", report=report)
    assert [arg for arg in command if arg.startswith("--model-config-name")] == flag
    assert f"device {device} (--device auto: " in caplog.text
    if device == "cpu":
        assert "no CUDA device: torch 2.13.0+cpu is a CPU-only build" in caplog.text


def test_device_cuda_without_a_gpu_fails_before_tritonserver_starts_naming_what_is_missing(caplog):
    with mock.patch.object(devices, "probe_torch_cuda", return_value=NO_GPU), \
            mock.patch("fastpath.server.process.TritonServer") as server:
        code = cli.main(["serve", "--device", "cuda", "--http-port", "18990", "--grpc-port", "18991", "--metrics-port", "18992"])
    assert code == 1
    server.assert_not_called()
    assert ("--device cuda: no CUDA device; torch 2.13.0+cpu is a CPU-only build (torch.version.cuda is None): install a "
            "CUDA build of torch. Serve on the CPU with --device cpu (make serve DEVICE=cpu)") in caplog.text


def test_device_cuda_refuses_a_repository_without_a_gpu_configuration(tmp_path):
    shutil.copytree(DEFAULT_REPOSITORY / "fastpath_admin", tmp_path / "fastpath_admin", ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.raises(ServerError, match=r"none of the models to load \(fastpath_admin\) has configs/gpu.pbtxt in .*every one "
                                          r"would load its CPU config.pbtxt; expected text_embedding/configs/gpu.pbtxt"):
        command_for("--device", "cuda", "--model-repository", str(tmp_path))
    with pytest.raises(ServerError, match="none of the models to load \\(fastpath_admin\\)"):
        command_for("--device", "cuda", "--model", "fastpath_admin")


def test_device_auto_without_a_gpu_configuration_serves_the_cpu_without_asking_torch(caplog):
    def probe() -> CudaReport:
        raise AssertionError("torch was asked for CUDA devices though no model to load has a GPU configuration")

    with caplog.at_level(logging.INFO, logger="fastpath"):
        options = serve.serve_options(parse("--device", "auto", "--model", "fastpath_admin"), "key", probe=probe)
    assert options.model_config_name == ""
    assert "device cpu (--device auto: none of the models to load has configs/gpu.pbtxt)" in caplog.text


def test_an_unknown_device_is_refused():
    with pytest.raises(ServerError, match="--device 'tpu': expected one of cpu, cuda, auto"):
        resolve_device("tpu", lambda: ONE_GPU)
    with pytest.raises(ServerError, match="--device 'tpu': expected one of cpu, cuda, auto"):
        select_configuration("tpu", DEFAULT_REPOSITORY, ("text_detection",), lambda: ONE_GPU)
    with pytest.raises(SystemExit):
        parse("--device", "tpu")


def test_the_cpu_never_probes_for_cuda():
    def probe() -> CudaReport:
        raise AssertionError("--device cpu asked torch for CUDA devices")

    assert resolve_device("cpu", probe) == ("cpu", "asked for")


@pytest.mark.parametrize(("info", "environment", "driver", "missing"), [
    ({"import_error": "ModuleNotFoundError: No module named 'torch'"}, {}, True,
     "torch does not import here (ModuleNotFoundError: No module named 'torch'): the GPU configuration's engine (runtime torch) "
     "needs a CUDA build of torch in this environment"),
    ({"torch": "2.13.0+cpu", "cuda": None, "count": 0}, {}, True,
     "torch 2.13.0+cpu is a CPU-only build (torch.version.cuda is None)"),
    ({"torch": "2.13.0", "cuda": "12.6", "count": 0}, {"CUDA_VISIBLE_DEVICES": ""}, True,
     "torch 2.13.0 (CUDA 12.6) sees no CUDA device: CUDA_VISIBLE_DEVICES is set empty, which hides every GPU"),
    ({"torch": "2.13.0", "cuda": "12.6", "count": 0}, {}, False,
     "torch 2.13.0 (CUDA 12.6) sees no CUDA device: no NVIDIA driver is loaded (/proc/driver/nvidia/version is missing)"),
    ({"torch": "2.13.0", "cuda": "12.6", "count": 0, "error": "RuntimeError: driver too old"}, {"CUDA_VISIBLE_DEVICES": "3"}, True,
     "the NVIDIA driver is loaded but no GPU is usable (CUDA_VISIBLE_DEVICES='3'; check nvidia-smi); RuntimeError: driver too old"),
])
def test_what_is_missing_is_named(info, environment, driver, missing, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    with mock.patch.object(devices.Path, "exists", return_value=driver):
        report = cuda_report(info)
    assert report.devices == ()
    assert missing in report.missing


def test_a_gpu_torch_sees_is_reported_by_name():
    assert cuda_report({"torch": "2.13.0", "cuda": "12.6", "count": 2, "names": ["NVIDIA H200", "NVIDIA H200"]}).devices == (
        "NVIDIA H200", "NVIDIA H200")


def test_the_probe_runs_torch_in_a_child_interpreter():
    """The real probe against this environment's torch (a CPU-only build on the CI machines)."""
    report = devices.probe_torch_cuda()
    assert report.devices or "sees no CUDA device" in report.missing or "CPU-only build" in report.missing
    broken = devices.probe_torch_cuda(python="/nonexistent/python")
    assert broken.devices == () and "probing torch in /nonexistent/python failed (FileNotFoundError" in broken.missing
