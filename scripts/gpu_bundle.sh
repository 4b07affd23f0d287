#!/usr/bin/env bash
# On this machine: gather what a GPU benchmark run needs on the device machine, which has no network.
#   .device/a  call 1 (carried only; it stays on the machine while it is warm): tritonserver from the
#              nvidia-pytriton wheel with its bundled libraries (triton.txz, the 3.12 stub only), cp312
#              wheels for the stub's environment (tritonclient 2.51 with perf_analyzer inside,
#              python-rapidjson, py-spy), and perf_analyzer's two libraries: libcudart.so.12
#              (nvidia-cuda-runtime-cu12) and libb64.so.0d (Debian libb64-0d)
#   .device/b  call 2, which runs scripts/gpu_setup.sh and then the benchmark: numpy 1.26 (cp312), the
#              text_embedding artifacts the torch runtime serves from (fp16 weights, tokenizer,
#              manifest, golden embeddings), and .device/b/prev: backend/ at $PREV_COMMIT (default
#              HEAD) for an A/B of two versions of the code in one run
# Each stays under the 64 MiB a device call carries (with the working tree). Run from the repository
# root after `make`; call 2 must follow call 1 within the 30 s the machine stays warm.
set -euo pipefail
PREV_COMMIT=${PREV_COMMIT:-HEAD}
rm -rf .device/a .device/b && mkdir -p .device/a/pa .device/b/prev
TRITON=$(.venv/bin/python -c "import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent)")
tar -C "$(dirname "$TRITON")" --exclude='python_backend_stubs/3.[0-9]' --exclude='python_backend_stubs/3.1[013]' \
    -cJf .device/a/triton.txz pytriton/tritonserver nvidia_pytriton.libs
PIP="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
$PIP -d .device/a tritonclient==2.51.0 python-rapidjson==1.20 py-spy==0.4.0
$PIP -d .device/b numpy==1.26.4
$PIP -d .device/a/pa nvidia-cuda-runtime-cu12==12.9.79
(cd .device/a/pa && apt-get download -q libb64-0d >/dev/null)
VERSION=model_repository/text_embedding/1
cp $VERSION/model.fp16.safetensors $VERSION/tokenizer.json $VERSION/manifest.json $VERSION/golden.npz .device/b/
git archive "$PREV_COMMIT" backend | tar -x -C .device/b/prev
du -sh .device/a .device/b
