#!/usr/bin/env bash
# Device machine, call 1 of 2: unpack tritonserver (from the nvidia-pytriton wheel) and make a Python
# environment for the python-backend stub: numpy 1.26 first, then the image's torch environment, then
# FastPath's backend/ (Triton 2.51's python-backend stub breaks with numpy 2: docs/known-issues.md).
set -euo pipefail
mkdir -p /tmp/g && tar xJf .device/a/triton.txz -C /tmp/g
python3 -m venv --without-pip /tmp/venv
SITE=$(/tmp/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 -m pip install -q --no-index --no-deps --target "$SITE" .device/a/*.whl
python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$SITE/zz_image_torch.pth"
echo "$PWD/backend" > "$SITE/fastpath_backend.pth"
echo "$PWD" > "$SITE/fastpath_repo.pth"
/tmp/venv/bin/python -c "import numpy, torch, tokenizers, tritonclient.grpc.aio, fastpath; print('numpy', numpy.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
