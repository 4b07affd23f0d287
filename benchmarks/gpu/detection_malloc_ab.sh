#!/usr/bin/env bash
# Device machine, the last call of a run (scripts/gpu_bundle.sh; the earlier calls copied parts 00..N-1 to
# /tmp/parts): does glibc's malloc giving image buffers back to the kernel cost text_detection's stub latency?
# Two servers of the shipped GPU config, one after the other, the same cells (c=1 and c=64 of 1280x720 JPEGs):
#   a  glibc's defaults (a freed buffer above the dynamic mmap threshold, or the arena top above the trim
#      threshold, goes back to the kernel, and the next request's decode writes fresh pages: minor faults)
#   b  MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=256 MiB, exported to tritonserver and its stubs
#      (freed image buffers stay in malloc's arenas for the next request)
# served_detection_gpu.py prints each cell's stub minor faults per image by thread group beside its p50.
# ORDER="b a" runs them the other way round (a second call on the same warm machine, setup skipped), so an
# order effect shows. Leaves a.json, a.log, b.json, b.log and setup.log in $OUT, and prints the cells.
set -uo pipefail
bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -25 "$OUT/setup.log"; exit 1; }
tail -2 "$OUT/setup.log"
CELLS="${CELLS:-text_detection:jpeg720:1,64}"
for variant in ${ORDER:-a b}; do
    if [ "$variant" = b ]; then export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456
    else unset MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_; fi
    SKIP_CHECKS=1 BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-200}" bash benchmarks/gpu/detection_gpu.sh --measurement-ms 2000 --raw 16 \
        --skip-numerics --cells "$CELLS" > "$OUT/$variant.out" 2>&1
    mv "$OUT/detection_gpu.json" "$OUT/$variant.json" 2>/dev/null
    mv "$OUT/detection_gpu.log" "$OUT/$variant.log" 2>/dev/null
    echo "== $variant"
    grep -E "^(text_detection|raw pipeline)|minor faults|failed cells" "$OUT/$variant.log" | cut -c1-400
done
