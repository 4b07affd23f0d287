#!/usr/bin/env bash
# Make a Debian bookworm base image from Debian's packages (debootstrap), for building docker/Dockerfile.cpu
# where no image registry can be reached:
#
#   docker/debian-base.sh fastpath-base:bookworm
#   docker build -f docker/Dockerfile.cpu --build-arg BASE_IMAGE=fastpath-base:bookworm -t fastpath:0.1.0-cpu .
#
# Runs as root (debootstrap), needs debootstrap and a Docker engine. The root file system is cached as a
# tarball in $FASTPATH_CACHE (default ~/.cache/fastpath), named by a hash of what goes into it (suite,
# variant, mirror, packages, the host's extra CA certificates and this script), so later runs only import it.
#
# The CA certificates this host's administrator added (/usr/local/share/ca-certificates, e.g. of a
# TLS-inspecting proxy) are added to the image's trust store too, so that pip in `docker build` reaches
# PyPI through the same network as the host.
set -euo pipefail

NAME="${1:?usage: $0 IMAGE_NAME}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The Python the python-backend stub embeds (python3.11 + libpython3.11), venv support (python3.11-venv
# needs python3-distutils, which debootstrap does not resolve by itself), tini as PID 1, CA certificates, tcmalloc
# (fastpath serve preloads it into tritonserver).
PACKAGES=python3.11,python3.11-venv,python3-distutils,libpython3.11,tini,ca-certificates,libtcmalloc-minimal4
CACHE="${FASTPATH_CACHE:-$HOME/.cache/fastpath}"

EXTRA_CA=/usr/local/share/ca-certificates
key="$( (echo "$SUITE minbase $MIRROR $PACKAGES"; cat "$0"; find "$EXTRA_CA" -name '*.crt' -type f -print0 2>/dev/null \
  | sort -z | xargs -0r cat) | sha256sum | cut -c1-16)"
tarball="$CACHE/debian-base-$SUITE-$key.tar"

if [ ! -s "$tarball" ]; then
  command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
  mkdir -p "$CACHE"
  root="$(mktemp -d "$CACHE/debootstrap.XXXXXX")"
  trap 'rm -rf "$root" "$tarball.partial"' EXIT
  chmod 0755 "$root"  # it becomes the image's /
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; echo "debootstrap failed; log: $root.log" >&2; exit 1; }
  rm -f "$root.log"
  if compgen -G "$EXTRA_CA/*.crt" >/dev/null; then
    cp "$EXTRA_CA"/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null
  fi
  # What an image does not need: downloaded packages, package lists, documentation and translations.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/usr/share/info/* "$root"/debootstrap
  tar --numeric-owner -C "$root" -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
fi
if [ "$(docker image inspect -f '{{ index .Config.Labels "fastpath.base-key" }}' "$NAME" 2>/dev/null)" != "$key" ]; then
  docker import --change 'CMD ["/bin/bash"]' --change "LABEL fastpath.base-key=$key" "$tarball" "$NAME" >/dev/null
fi
echo "$NAME from $tarball"
