#!/usr/bin/env bash
# Device machine, start of call 2 (scripts/gpu_bundle.sh made .device/a and .device/b here): unpack tritonserver (from the
# nvidia-pytriton wheel) and make a Python environment for the python-backend stub: numpy 1.26 first,
# then the image's torch environment, then FastPath's backend/ (Triton 2.51's python-backend stub breaks
# with numpy 2: docs/known-issues.md). perf_analyzer goes to /tmp/pa with its two libraries in /tmp/pa/lib.
set -euo pipefail
mkdir -p /tmp/g && tar xJf .device/a/triton.txz -C /tmp/g
python3 -m venv --without-pip /tmp/venv
SITE=$(/tmp/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 -m pip install -q --no-index --no-deps --target "$SITE" .device/a/*.whl .device/b/*.whl
python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$SITE/zz_image_torch.pth"
echo "$PWD/backend" > "$SITE/fastpath_backend.pth"
echo "$PWD" > "$SITE/fastpath_repo.pth"
mkdir -p /tmp/pa/lib /tmp/pa/deb
python3 - "$SITE" <<'PY'
import pathlib, sys, zipfile
site = pathlib.Path(sys.argv[1])
for wheel in pathlib.Path(".device/a/pa").glob("nvidia_cuda_runtime_cu12-*.whl"):
    pathlib.Path("/tmp/pa/lib/libcudart.so.12").write_bytes(zipfile.ZipFile(wheel).read("nvidia/cuda_runtime/lib/libcudart.so.12"))
binary = next(site.rglob("perf_analyzer"), None) or next(pathlib.Path(site.parent).rglob("bin/perf_analyzer"))
pathlib.Path("/tmp/pa/perf_analyzer").write_bytes(binary.read_bytes())
PY
chmod +x /tmp/pa/perf_analyzer
dpkg -x .device/a/pa/libb64-0d_*.deb /tmp/pa/deb && cp -a /tmp/pa/deb/usr/lib/x86_64-linux-gnu/libb64.so.0d* /tmp/pa/lib/
LD_LIBRARY_PATH=/tmp/pa/lib /tmp/pa/perf_analyzer --version 2>&1 | head -2 || true
/tmp/venv/bin/python -c "import numpy, torch, tokenizers, tritonclient.grpc, fastpath; print('numpy', numpy.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
