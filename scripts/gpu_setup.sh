#!/usr/bin/env bash
# Device machine, first step of the last call of a run (scripts/gpu_bundle.sh made the parts; the earlier calls
# copied theirs to /tmp/parts): join the parts into /tmp/bundle, unpack tritonserver (from the nvidia-pytriton wheel),
# and make a Python environment for the python-backend stub in /tmp/venv: the bundle's wheels first (numpy 1.26,
# onnxruntime-gpu, OpenCV 4.11, pyclipper, tritonclient, inotify_simple), then the image's torch environment, then FastPath's
# backend/ (Triton 2.51's python-backend stub breaks with numpy 2: docs/known-issues.md). The artifacts go into
# model_repository/, so `fastpath serve --device cuda` serves every model. perf_analyzer goes to /tmp/pa with its
# two libraries in /tmp/pa/lib; tcmalloc (preloaded into tritonserver) to /tmp/venv/lib/tcmalloc.
set -euo pipefail
B=/tmp/bundle
artifacts() {  # the bundle's artifacts into model_repository/ (a BUNDLE=text bundle has text_embedding/1's only)
    cp "$B"/artifacts/text_embedding/* model_repository/text_embedding/1/
    if [ -d "$B"/artifacts/text_embedding_2 ]; then cp "$B"/artifacts/text_embedding_2/* model_repository/text_embedding/2/; fi
    if [ -d "$B"/artifacts/text_detection ]; then cp "$B"/artifacts/text_detection/* model_repository/text_detection/1/; fi
}
if [ -f /tmp/venv/.fastpath-ready ]; then  # a warm machine set up by an earlier call: only the artifacts
    artifacts
    echo "set up already (/tmp/venv/.fastpath-ready)"; exit 0
fi
mkdir -p /tmp/parts "$B"
cp .device/parts/part-* .device/parts_text/part-* /tmp/parts/ 2>/dev/null || true
cat /tmp/parts/part-* | tar -x -C "$B"
mkdir -p /tmp/g && tar xJf "$B/triton.txz" -C /tmp/g
python3 -m venv --without-pip /tmp/venv
SITE=$(/tmp/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$B"/wheels/*.whl
python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$SITE/zz_image_torch.pth"
echo "$PWD/backend" > "$SITE/fastpath_backend.pth"
echo "$PWD" > "$SITE/fastpath_repo.pth"
artifacts
mkdir -p /tmp/pa/lib /tmp/pa/deb
python3 - "$SITE" "$B" <<'PY'
import pathlib, sys, zipfile
site, bundle = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in (bundle / "pa").glob("nvidia_cuda_runtime_cu12-*.whl"):
    pathlib.Path("/tmp/pa/lib/libcudart.so.12").write_bytes(zipfile.ZipFile(wheel).read("nvidia/cuda_runtime/lib/libcudart.so.12"))
binary = next(site.rglob("perf_analyzer"), None) or next(pathlib.Path(site.parent).rglob("bin/perf_analyzer"))
pathlib.Path("/tmp/pa/perf_analyzer").write_bytes(binary.read_bytes())
PY
chmod +x /tmp/pa/perf_analyzer
dpkg -x "$B"/pa/libb64-0d_*.deb /tmp/pa/deb && cp -a /tmp/pa/deb/usr/lib/x86_64-linux-gnu/libb64.so.0d* /tmp/pa/lib/
# tcmalloc for tritonserver where fastpath.server.malloc looks first (sys.prefix/lib/tcmalloc)
mkdir -p /tmp/venv/lib/tcmalloc && dpkg -x "$B"/pa/libtcmalloc-minimal4_*.deb /tmp/pa/deb \
    && cp -L /tmp/pa/deb/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 /tmp/venv/lib/tcmalloc/
LD_LIBRARY_PATH=/tmp/pa/lib /tmp/pa/perf_analyzer --version 2>&1 | head -2 || true
/tmp/venv/bin/python -c "import numpy, torch, tokenizers, tritonclient.grpc, inotify_simple, fastpath; print('numpy', numpy.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
if [ -d "$B"/artifacts/text_detection ]; then
    /tmp/venv/bin/python -c "import cv2, onnxruntime, pyclipper; print('cv2', cv2.__version__, 'onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
touch /tmp/venv/.fastpath-ready
