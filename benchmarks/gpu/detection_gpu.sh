#!/usr/bin/env bash
# Device machine, the last call of a run (scripts/gpu_bundle.sh; the earlier calls copied parts 00..N-1 to
# /tmp/parts): set up, check that `fastpath serve --device cuda` serves every model (benchmarks/gpu/serve_check.py),
# tests/gpu/test_detection_cuda.py, then benchmarks/gpu/served_detection_gpu.py. Leaves setup.log, serve_check.log,
# gpu_tests.log, detection_gpu.log and
# detection_gpu.json in $OUT and prints their ends.
set -uo pipefail
bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -25 "$OUT/setup.log"; exit 1; }
tail -4 "$OUT/setup.log"
source scripts/gpu_env.sh
if [ -z "${SKIP_CHECKS:-}" ]; then  # SKIP_CHECKS=1: the benchmark alone
    timeout 120 /tmp/venv/bin/python benchmarks/gpu/serve_check.py --photo /tmp/bundle/inputs/720_text.jpg > "$OUT/serve_check.log" 2>&1
    echo "== serve_check rc=$?"; tail -6 "$OUT/serve_check.log"
    timeout 150 /tmp/venv/bin/python -m pytest tests/gpu/test_detection_cuda.py -q -rs -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
    echo "== tests/gpu/test_detection_cuda.py rc=$?"; tail -4 "$OUT/gpu_tests.log"
fi
timeout "${BENCH_TIMEOUT_S:-300}" /tmp/venv/bin/python benchmarks/gpu/served_detection_gpu.py --inputs /tmp/bundle/inputs \
    --out "$OUT/detection_gpu.json" "$@" > "$OUT/detection_gpu.log" 2>&1
echo "== served_detection_gpu rc=$?"; tail -n 30 "$OUT/detection_gpu.log"
