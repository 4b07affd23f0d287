#!/usr/bin/env bash
# Device machine, the last call of a run (scripts/gpu_bundle.sh made the parts; the earlier calls copied theirs
# to /tmp/parts, this one carries the last): set up, then one benchmarks/gpu/served_gpu.py run per argument, one
# server each. An argument is
# NAME=FLAGS ("6=--instances 6 --models ..."); GPU_TESTS names tests/gpu files to run first; PHASE_PROFILE=1 keeps
# each stub's phase profile (benchmarks/phases.py prints it per model). Each run leaves $OUT/NAME.json, $OUT/NAME.log and
# $OUT/NAME_csv.tgz (perf_analyzer's CSV files); the last lines of each log are printed.
set -uo pipefail
bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
source scripts/gpu_env.sh
if [ -n "${GPU_TESTS:-}" ]; then  # GPU_TESTS="tests/gpu/a.py tests/gpu/b.py": run them first, log in $OUT/gpu_tests.log
    # shellcheck disable=SC2086
    timeout 150 /tmp/venv/bin/python -m pytest $GPU_TESTS -q -rs -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
    echo "== $GPU_TESTS rc=$?"; tail -5 "$OUT/gpu_tests.log"
fi
for spec in "$@"; do
    name=${spec%%=*}
    # PHASE_PROFILE=1: every stub's phase sums (fastpath.profiling) in $OUT/NAME_phases/<instance>.json
    if [ -n "${PHASE_PROFILE:-}" ]; then export FASTPATH_PHASE_PROFILE="$OUT/${name}_phases"; fi
    # shellcheck disable=SC2086  # the flags are meant to split
    /tmp/venv/bin/python benchmarks/gpu/served_gpu.py --version-dir /tmp/bundle/artifacts/text_embedding --prev-backend /tmp/bundle/prev/backend \
        --out "$OUT/$name.json" --csv-dir "/tmp/csv_$name" ${spec#*=} > "$OUT/$name.log" 2>&1
    tar czf "$OUT/${name}_csv.tgz" -C "/tmp/csv_$name" .
    echo "== $name"; tail -n 28 "$OUT/$name.log"
    if [ -n "${PHASE_PROFILE:-}" ]; then  # each model's phases per request, side by side
        /tmp/venv/bin/python benchmarks/phases.py "$OUT/${name}_phases" --out "$OUT/${name}_phases.json"
    fi
done
