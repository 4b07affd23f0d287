#!/usr/bin/env bash
# Device machine, the last call of a run (scripts/gpu_bundle.sh made the parts; the earlier calls copied theirs to
# /tmp/parts, this one carries the last): set up, then benchmarks/gpu/detection_engine.py, text_detection's engine
# alone (sweep A: time per call by batch, shape and session option; sweep B: CUDA graph capture and replay, one
# subprocess per variant). Extra arguments go to the script. Leaves setup.log, detection_engine.log,
# detection_engine.json and detection_engine_<variant>.json in $OUT and prints the log's end.
set -uo pipefail
bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -25 "$OUT/setup.log"; exit 1; }
tail -4 "$OUT/setup.log"
export PYTHONUNBUFFERED=1
timeout "${BENCH_TIMEOUT_S:-330}" /tmp/venv/bin/python benchmarks/gpu/detection_engine.py --inputs /tmp/bundle/inputs \
    --out "$OUT/detection_engine.json" "$@" > "$OUT/detection_engine.log" 2>&1
echo "== detection_engine rc=$?"; tail -n 60 "$OUT/detection_engine.log"
