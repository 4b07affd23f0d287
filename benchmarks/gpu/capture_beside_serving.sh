#!/usr/bin/env bash
# Device machine, the last call of a run (scripts/gpu_bundle.sh; the earlier calls copied parts 00..N-1 to
# /tmp/parts): set up, then tests/gpu/test_graphs.py (a graph capture beside a runner serving on another thread,
# as a live swap does) twice: as shipped (capture_error_mode="thread_local") and with the capture in CUDA's global
# mode, which must fail there; then benchmarks/gpu/detection_gpu.sh with this script's arguments (SKIP_CHECKS=1).
# Leaves setup.log, graphs_tests.log, graphs_tests_global.log and detection_gpu's files in $OUT.
set -uo pipefail
bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -25 "$OUT/setup.log"; exit 1; }
tail -2 "$OUT/setup.log"
timeout 150 /tmp/venv/bin/python -m pytest tests/gpu/test_graphs.py -q -rs -p no:cacheprovider > "$OUT/graphs_tests.log" 2>&1
echo "== tests/gpu/test_graphs.py rc=$?"; tail -3 "$OUT/graphs_tests.log"
rm -rf /tmp/backend_global && cp -r backend /tmp/backend_global
sed -i 's/, capture_error_mode="thread_local"//' /tmp/backend_global/fastpath/graphs/runner.py
PYTHONPATH=/tmp/backend_global timeout 150 /tmp/venv/bin/python -m pytest tests/gpu/test_graphs.py -q -p no:cacheprovider \
    -k beside > "$OUT/graphs_tests_global.log" 2>&1
echo "== the same test, capture in global mode (expected to fail) rc=$?"; grep -m3 -E "Error|assert errors" "$OUT/graphs_tests_global.log" | cut -c1-300
SKIP_CHECKS=1 BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-280} bash benchmarks/gpu/detection_gpu.sh "$@"
