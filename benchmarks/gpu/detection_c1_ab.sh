#!/usr/bin/env bash
# Device machine, the last call of a run (scripts/gpu_bundle.sh; the earlier calls copied parts 00..N-1 to
# /tmp/parts): what costs text_detection's c=1 latency in the stub, 1.33x the raw pipeline's one image on an H100?
# Two servers of the shipped GPU config, one after the other:
#   a  glibc's malloc defaults; the shipped text_detection (decode and post threads taken last-idle first,
#      thread_pool_order lifo) at c=64 and c=1, text_detection_fifo (taken longest-idle first, as shipped before)
#      at c=64 and c=1, and _one_decoder_c1 (one instance, one decode thread) at c=1
#      (benchmarks/gpu/detection_variants.py): what the threads' order and the count of idle threads cost c=1.
#   b  MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=256 MiB, exported to tritonserver and its stubs
#      (freed image buffers stay in malloc's arenas for the next request): the shipped config at c=64 and c=1. Does
#      glibc giving image buffers back to the kernel (fresh pages, minor faults, for the next decode) cost c=1?
# served_detection_gpu.py prints each cell's stub minor faults per image by thread group beside its p50.
# ORDER="b a" runs the servers the other way round (a second call on the same warm machine, setup skipped), so an
# order effect shows; ORDER=a runs server a alone; CELLS_A and CELLS_B replace the cells. Leaves a.json, a.log,
# b.json, b.log and setup.log in $OUT, and prints the cells. Results: docs/benchmarks/detection_gpu_h100.md, run 9.
set -uo pipefail
bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -25 "$OUT/setup.log"; exit 1; }
tail -2 "$OUT/setup.log"
CELLS_A="${CELLS_A:-text_detection:jpeg720:64,1;text_detection_fifo:jpeg720:64,1;text_detection_one_decoder_c1:jpeg720:1}"
CELLS_B="${CELLS_B:-text_detection:jpeg720:64,1}"
for variant in ${ORDER:-a b}; do
    if [ "$variant" = b ]; then export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456; cells=$CELLS_B
    else unset MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_; cells=$CELLS_A; fi
    SKIP_CHECKS=1 BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-200}" bash benchmarks/gpu/detection_gpu.sh --measurement-ms 2000 --raw 16 \
        --skip-numerics --cells "$cells" > "$OUT/$variant.out" 2>&1
    mv "$OUT/detection_gpu.json" "$OUT/$variant.json" 2>/dev/null
    mv "$OUT/detection_gpu.log" "$OUT/$variant.log" 2>/dev/null
    echo "== $variant"
    grep -E "^(text_detection|raw pipeline)|minor faults|failed cells" "$OUT/$variant.log" | cut -c1-400
done
