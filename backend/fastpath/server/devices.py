"""Which device ``fastpath serve`` serves on, and which model configuration Triton loads for it.

``--device cuda`` uses Triton's custom model configuration: tritonserver runs with
``--model-config-name=gpu``, and loads ``<model>/configs/gpu.pbtxt`` for every model that has one
(``text_embedding``: the torch runtime in fp16 with CUDA graphs, ``KIND_GPU`` instances), and
``<model>/config.pbtxt`` for the others (verified on Triton 2.51: a model without the file loads
its ``config.pbtxt``). Nothing in the model repository is edited or generated, so a stub reload
(``fastpath.server.stubs``), a load through the repository API and the serving-version record
(``serving_version.json`` beside ``config.pbtxt``: Triton's ``args["model_repository"]`` is the
model's directory whichever configuration it read) behave as on the CPU.

Before starting tritonserver, ``--device cuda`` checks in a child interpreter (this one stays free
of torch and CUDA) that torch, which the GPU configuration's engine runs on, sees a CUDA device,
and refuses with what is missing otherwise: Triton itself would fail the load later with "instance
group text_embedding_0 of model text_embedding has kind KIND_GPU but no GPUs are available".
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fastpath.errors import ServerError

DEVICES = ("cpu", "cuda", "auto")
GPU_CONFIG_NAME = "gpu"

# Runs in a child interpreter: what torch sees, as one JSON line.
_PROBE = r"""
import json, os
try:
    import torch
except Exception as exc:
    print(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "count": 0, "names": []}
try:
    if torch.cuda.is_available():
        info["count"] = torch.cuda.device_count()
        info["names"] = [torch.cuda.get_device_name(i) for i in range(info["count"])]
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(info))
"""


@dataclasses.dataclass(frozen=True)
class CudaReport:
    """What torch in this interpreter's environment (the stubs' environment) sees.

    Attributes:
        devices: the CUDA device names torch sees (empty: none usable).
        missing: what is missing when ``devices`` is empty, one sentence; "" otherwise.
    """

    devices: tuple[str, ...]
    missing: str = ""


def probe_torch_cuda(python: str = sys.executable, timeout_s: float = 120.0) -> CudaReport:
    """Ask torch, in a child ``python``, which CUDA devices it sees; never raises."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, check=False)
        info = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return CudaReport((), f"probing torch in {python} failed ({type(exc).__name__}: {exc})")
    return cuda_report(info)


def cuda_report(info: dict) -> CudaReport:
    """:class:`CudaReport` from the probe's JSON: the devices, or the first thing missing."""
    if "import_error" in info:
        return CudaReport((), f"torch does not import here ({info['import_error']}): the GPU configuration's engine "
                              "(runtime torch) needs a CUDA build of torch in this environment")
    names = tuple(info.get("names") or ())
    if names:
        return CudaReport(names)
    version = info.get("torch", "?")
    if not info.get("cuda"):
        return CudaReport((), f"torch {version} is a CPU-only build (torch.version.cuda is None): install a CUDA build "
                              "of torch (https://pytorch.org/get-started/locally/)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        why = "CUDA_VISIBLE_DEVICES is set empty, which hides every GPU"
    elif not Path("/proc/driver/nvidia/version").exists():
        why = "no NVIDIA driver is loaded (/proc/driver/nvidia/version is missing) or no GPU is attached"
    else:
        why = f"the NVIDIA driver is loaded but no GPU is usable (CUDA_VISIBLE_DEVICES={visible!r}; check nvidia-smi)"
    detail = f"; {info['error']}" if info.get("error") else ""
    return CudaReport((), f"torch {version} (CUDA {info['cuda']}) sees no CUDA device: {why}{detail}")


def resolve_device(requested: str, probe: Callable[[], CudaReport] = probe_torch_cuda) -> tuple[str, str]:
    """``(device, why)`` for ``fastpath serve --device requested``.

    ``cpu`` is taken as asked; ``cuda`` needs a CUDA device torch sees; ``auto`` is ``cuda`` when
    torch sees one, else ``cpu``. ``why`` says what was found, for the log.

    Raises:
        ServerError: ``cuda`` without a CUDA device, naming what is missing; an unknown device.
    """
    if requested not in DEVICES:
        raise ServerError(f"--device {requested!r}: expected one of {', '.join(DEVICES)}")
    if requested == "cpu":
        return "cpu", "asked for"
    report = probe()
    if report.devices:
        return "cuda", f"torch sees {len(report.devices)} CUDA device(s): {', '.join(report.devices)}"
    if requested == "auto":
        return "cpu", f"no CUDA device: {report.missing}"
    raise ServerError(f"--device cuda: no CUDA device; {report.missing}. Serve on the CPU with --device cpu "
                      "(make serve DEVICE=cpu)")


def select_configuration(requested: str, model_repository: Path, models: Sequence[str],
                         probe: Callable[[], CudaReport] = probe_torch_cuda) -> tuple[str, str, str]:
    """``(device, model_config_name, why)`` for ``fastpath serve --device requested`` loading ``models``.

    The GPU configuration (:data:`GPU_CONFIG_NAME`) is chosen on ``cuda``; ``auto`` chooses it when
    one of ``models`` has it and torch sees a CUDA device. Torch is asked only when a model has it.

    Raises:
        ServerError: an unknown device; ``cuda`` where none of ``models`` has ``configs/gpu.pbtxt``
            (nothing would run on a GPU), or where torch sees no CUDA device (:func:`resolve_device`).
    """
    if requested not in DEVICES:
        raise ServerError(f"--device {requested!r}: expected one of {', '.join(DEVICES)}")
    has_gpu_config = any(path.name != "config.pbtxt" for path in config_files(model_repository, models, GPU_CONFIG_NAME).values())
    if requested != "cpu" and not has_gpu_config:
        if requested == "auto":
            return "cpu", "", f"none of the models to load has configs/{GPU_CONFIG_NAME}.pbtxt"
        raise ServerError(f"--device cuda: none of the models to load ({', '.join(models)}) has configs/{GPU_CONFIG_NAME}.pbtxt "
                          f"in {model_repository}, so every one would load its CPU config.pbtxt; expected "
                          f"text_embedding/configs/{GPU_CONFIG_NAME}.pbtxt (shipped in model_repository/)")
    device, why = resolve_device(requested, probe)
    return device, GPU_CONFIG_NAME if device == "cuda" else "", why


def config_files(model_repository: Path, models: Sequence[str], config_name: str) -> dict[str, Path]:
    """The configuration file Triton loads for each of ``models`` under ``--model-config-name=config_name``
    (``configs/<name>.pbtxt`` where the model has one, else ``config.pbtxt``; "" means config.pbtxt everywhere)."""
    files = {}
    for model in models:
        custom = model_repository / model / "configs" / f"{config_name}.pbtxt"
        files[model] = custom if config_name and custom.is_file() else model_repository / model / "config.pbtxt"
    return files


def describe_configs(model_repository: Path, models: Sequence[str], config_name: str) -> list[str]:
    """One line per model: the configuration file Triton loads for it and where its instances run."""
    lines = []
    for model, path in config_files(model_repository, models, config_name).items():
        if not path.is_file():
            lines.append(f"{model}: {path} is missing")
            continue
        where = ", ".join(instance_groups(path)) or "Triton's default instances"
        note = " (no GPU configuration: it stays on the CPU)" if config_name and path.name == "config.pbtxt" else ""
        lines.append(f"{model}: {path.relative_to(model_repository)} ({where}){note}")
    return lines


def instance_groups(path: Path) -> list[str]:
    """``["KIND_GPU x6 on each visible GPU", ...]`` from a model configuration file; [] when it cannot be read."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except Exception:  # noqa: BLE001 - a description only; Triton reports a broken file itself
        return []
    groups = []
    for group in config.instance_group:
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
        count = group.count or 1
        if kind == "KIND_GPU":
            where = f"each of GPUs {list(group.gpus)}" if group.gpus else "each visible GPU"
            groups.append(f"{kind} x{count} on {where}")
        else:
            groups.append(f"{kind} x{count}")
    return groups
