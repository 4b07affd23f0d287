#!/usr/bin/env bash
# tcmalloc for tritonserver, into a virtual environment (fastpath.server.malloc preloads it into tritonserver;
# its python-backend stubs keep glibc's malloc).
#   usage: bash scripts/install_tcmalloc.sh [VENV]   (default .venv; make setup runs it)
# From Debian's libtcmalloc-minimal4 (`apt-get download`, no root needed; `apt-get update` first when the package
# lists lack it and this runs as root): VENV/lib/tcmalloc/libtcmalloc_minimal.so.4.
# Ends by loading it into a process (python with LD_PRELOAD), which fails if it cannot be loaded.
set -euo pipefail
VENV=${1:-.venv}
PACKAGE=libtcmalloc-minimal4
LIB="$VENV/lib/tcmalloc"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# apt-get download writes into the current folder; as root it warns that it could not drop to the _apt user
if ! (cd "$WORK" && apt-get download -q "$PACKAGE" >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -q >/dev/null
        (cd "$WORK" && apt-get download -q "$PACKAGE" >/dev/null 2>&1)
    else
        echo "install_tcmalloc: apt-get download $PACKAGE failed; run apt-get update as root, then again" >&2
        exit 1
    fi
fi
dpkg -x "$WORK"/"$PACKAGE"_*.deb "$WORK/deb"
mkdir -p "$LIB"
cp -L "$WORK"/deb/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 "$LIB/libtcmalloc_minimal.so.4"
LD_PRELOAD="$(cd "$LIB" && pwd)/libtcmalloc_minimal.so.4" python3 -c "
import sys
maps = open('/proc/self/maps').read()
sys.exit(0 if 'libtcmalloc_minimal' in maps else 'install_tcmalloc: $LIB/libtcmalloc_minimal.so.4 was not loaded')"
echo "tcmalloc: $LIB/libtcmalloc_minimal.so.4"
