#!/usr/bin/env bash
# perf_analyzer (Triton's C++ load generator) for the served benchmarks, into a virtual environment.
#   usage: bash scripts/install_perf_analyzer.sh [VENV]   (default .venv; `make perf-analyzer` runs it)
# The binary ships inside the tritonclient 2.51.0 wheel (pyproject.toml pins it: the server's release), so pip
# already put VENV/bin/perf_analyzer there. It links two libraries no wheel of ours brings; this puts them in
# VENV/lib/perf_analyzer, beside the binary, which VENV/bin/perf_analyzer (a wrapper) runs:
#   libcudart.so.12  from PyPI's nvidia-cuda-runtime-cu12 (unpacked there, not installed: a CUDA 12 runtime in
#                    site-packages could be picked up by the CUDA 13 bindings; perf_analyzer itself runs without a GPU)
#   libb64.so.0d     from Debian's libb64-0d (`apt-get download`, no root needed; `apt-get update` first when
#                    the package lists lack it and this runs as root)
# Ends with `perf_analyzer --version`, which fails if a library is still missing.
set -euo pipefail
VENV=${1:-.venv}
CUDA_RUNTIME=nvidia-cuda-runtime-cu12==12.9.79
BINARY="$VENV/bin/perf_analyzer"
LIB="$VENV/lib/perf_analyzer"
if [ ! -x "$BINARY" ]; then
    echo "install_perf_analyzer: $BINARY is missing: it comes with tritonclient==2.51.0 (make setup installs it)" >&2
    exit 1
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$LIB"
"$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: --dest "$WORK" "$CUDA_RUNTIME"
"$VENV/bin/python" - "$WORK" "$LIB" <<'PY'
import pathlib, sys, zipfile
work, lib = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("nvidia_cuda_runtime_cu12-*.whl"))
(lib / "libcudart.so.12").write_bytes(zipfile.ZipFile(wheel).read("nvidia/cuda_runtime/lib/libcudart.so.12"))
PY
# apt-get download writes into the current folder; as root it warns that it could not drop to the _apt user
if ! (cd "$WORK" && apt-get download -q libb64-0d >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -q >/dev/null
        (cd "$WORK" && apt-get download -q libb64-0d >/dev/null 2>&1)
    else
        echo "install_perf_analyzer: apt-get download libb64-0d failed; run apt-get update as root, then again" >&2
        exit 1
    fi
fi
dpkg -x "$WORK"/libb64-0d_*.deb "$WORK/deb"
cp -a "$WORK"/deb/usr/lib/x86_64-linux-gnu/libb64.so.0d* "$LIB/"
# VENV/bin/perf_analyzer becomes a wrapper that puts LIB on LD_LIBRARY_PATH, so the command runs as it is; the
# wheel's binary moves beside its libraries (a reinstall of tritonclient brings the binary back: run this again)
if [ "$(head -c 4 "$BINARY" | tail -c 3)" = "ELF" ]; then
    mv -f "$BINARY" "$LIB/perf_analyzer"
fi
cat > "$BINARY" <<'SH'
#!/bin/sh
# perf_analyzer from the tritonclient 2.51.0 wheel with the two libraries it links (scripts/install_perf_analyzer.sh)
LIB="$(dirname "$(readlink -f "$0")")/../lib/perf_analyzer"
LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$LIB/perf_analyzer" "$@"
SH
chmod +x "$BINARY"
"$BINARY" --version
