#!/usr/bin/env bash
# Device machine, the last call of a run (scripts/gpu_bundle.sh made the parts; the earlier calls copied theirs to
# /tmp/parts, this one carries the last and .device/precision): set up, then benchmarks/gpu/detection_precision.py,
# text_detection's engine in float32, TF32 and the fp16 candidates, each with and without prefer_nhwc: ms per call,
# images/s, and boxes against the CPU path (~100 s after set-up, 150 s at most). The fp16 candidates are built
# beforehand on the developer's machine (the device has no onnx package), ~6.5 MB to carry with the last part
# (or, when that part leaves no room, in an earlier call: mkdir -p /tmp/precision && cp .device/precision/* /tmp/precision/):
#   PYTHONPATH=backend .venv/bin/python -m fastpath.artifacts.detection_fp16 --out .device/precision
# Extra arguments go to the script. Leaves setup.log, detection_precision.log and detection_precision.json in $OUT,
# prints the table; exits non-zero when set-up fails, the candidates are missing, or the script fails.
set -uo pipefail
MODELS=${MODELS:-.device/precision}
ls "$MODELS"/model.uint8.fp16.*.onnx >/dev/null 2>&1 || MODELS=/tmp/precision
if ! ls "$MODELS"/model.uint8.fp16.*.onnx >/dev/null 2>&1; then
    echo "no model.uint8.fp16.*.onnx in .device/precision or /tmp/precision: build them (python -m fastpath.artifacts.detection_fp16) and carry .device/precision"
    exit 1
fi
bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -25 "$OUT/setup.log"; exit 1; }
tail -4 "$OUT/setup.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1
timeout "${BENCH_TIMEOUT_S:-150}" /tmp/venv/bin/python benchmarks/gpu/detection_precision.py --inputs /tmp/bundle/inputs \
    --models "$MODELS" --out "$OUT/detection_precision.json" "$@" > "$OUT/detection_precision.log" 2>&1
rc=$?
echo "== detection_precision rc=$rc"; tail -n 30 "$OUT/detection_precision.log"
exit $rc
