#!/usr/bin/env bash
# Device machine: the 10-minute soak of `fastpath serve --device cuda` (benchmarks/gpu/soak.py), run in the background
# across device calls (one call runs at most 600 s; /tmp and the soak last while the machine stays warm, 30 s after a
# call ends). Here first: `bash scripts/gpu_bundle.sh`; then, each call within 30 s of the previous one:
#   a call per part but the last, carrying it:  mkdir -p /tmp/parts && cp .device/parts/part-0N /tmp/parts/
#   the call carrying the last part:            bash benchmarks/gpu/soak_gpu.sh start
#   the next call:                              bash benchmarks/gpu/soak_gpu.sh wait 570
#   again while it says "still running":        bash benchmarks/gpu/soak_gpu.sh wait 570
# start: set up (scripts/gpu_setup.sh), start the soak detached (setsid nohup) in /tmp/soak/ (soak.log, serve.log,
#        probe.csv, soak_gpu.json and .md), return once it runs; arguments after `start` go to soak.py.
# wait SECONDS: print its progress lines for at most SECONDS while it runs; once it has ended, copy /tmp/soak/* to
#        $OUT and print its table and exit code (0: every goal met). stop: end it now (SIGTERM: it stops perf_analyzer
#        and the server and reports what it has), then as wait.
# The page: $OUT/soak_gpu.json and soak_gpu.md -> docs/benchmarks/.
set -uo pipefail
DIR=/tmp/soak
PY=/tmp/venv/bin/python
source scripts/gpu_env.sh

running() { [ -f "$DIR/wrapper.pid" ] && kill -0 "$(cat "$DIR/wrapper.pid")" 2>/dev/null; }

finish() {
    local name  # the results and logs only: a device call returns a limited number of files
    for name in soak_gpu.json soak_gpu.md soak.log serve.log probe.csv setup.log rc; do
        [ -f "$DIR/$name" ] && cp "$DIR/$name" "$OUT"/
    done
    echo "== soak ended, exit code $(cat "$DIR/rc" 2>/dev/null || echo unknown) (0: every goal met); files in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
    if grep -q '^soak: ' "$DIR/soak.log"; then sed -n '/^soak: /,$p' "$DIR/soak.log"; else tail -n 30 "$DIR/soak.log"; fi
}

wait_soak() {
    local limit=$1 began=$SECONDS seen lines
    [ -f "$DIR/wrapper.pid" ] || { echo "no soak in $DIR (a fresh machine? run: bash $0 start)"; exit 1; }
    seen=$(cat "$DIR/printed" 2>/dev/null || echo 0)  # the log lines an earlier call printed
    while running && (( SECONDS - began < limit )); do
        sleep $(( limit - (SECONDS - began) < 10 ? limit - (SECONDS - began) : 10 ))
        lines=$(wc -l < "$DIR/soak.log")
        (( lines > seen )) && sed -n "$((seen + 1)),${lines}p" "$DIR/soak.log" | grep '^\[' | cut -c1-220
        seen=$lines && echo "$seen" > "$DIR/printed"
    done
    if running; then
        echo "== still running after ${limit} s: $(grep '^\[' "$DIR/soak.log" | tail -n 1 | cut -c1-160); call wait again within 30 s"
        return 0
    fi
    finish
}

case "${1:-}" in
start)
    shift
    if running; then echo "a soak is already running: $(tail -n 1 "$DIR/soak.log")"; exit 1; fi
    bash scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -n 25 "$OUT/setup.log"; exit 1; }
    tail -n 4 "$OUT/setup.log"
    rm -rf "$DIR" && mkdir -p "$DIR" && cp "$OUT/setup.log" "$DIR/"
    # shellcheck disable=SC2016  # expanded by the detached shell: $0 the folder, $1 the interpreter, then soak.py's arguments
    setsid nohup bash -c 'echo $$ > "$0/wrapper.pid"; "$1" benchmarks/gpu/soak.py --device cuda --workdir "$0" \
        --out "$0/soak_gpu.json" "${@:2}"; echo $? > "$0/rc"' "$DIR" "$PY" "$@" > "$DIR/soak.log" 2>&1 < /dev/null &
    sleep 10
    if ! running; then echo "== the soak ended at once:"; finish; exit 1; fi
    echo "== soak running (pid $(cat "$DIR/soak.pid" 2>/dev/null)); next: bash $0 wait 570 within 30 s"
    grep '^\[' "$DIR/soak.log" | tail -n 3
    wc -l < "$DIR/soak.log" > "$DIR/printed"
    ;;
wait)
    wait_soak "${2:?usage: $0 wait SECONDS}"
    ;;
stop)
    if running; then kill -TERM "$(cat "$DIR/soak.pid")"; fi
    wait_soak 170
    ;;
*)
    echo "usage: $0 start [soak.py arguments] | wait SECONDS | stop" >&2
    exit 2
    ;;
esac
