#!/usr/bin/env bash
# Make a local stand-in for the base image that both Dockerfiles start FROM, when no container
# registry can be reached (as on CI here). It is Debian bookworm (minbase) with bookworm's own
# Python 3.11 and pip, tagged with the real name (docker.io/library/python:3.11-slim-bookworm) so
# the real Dockerfiles build unchanged with `podman build --pull=never`.
#
# Idempotent and cached: the root filesystem is made once with debootstrap (about 2 minutes)
# and kept as a tarball under build/container-base/; later runs import the tarball (seconds) or
# do nothing when the image is already in podman's storage. A real python image with that name
# (one without our label) is left alone.
set -euo pipefail

RECIPE=1  # bump when the recipe below changes; it names the cached tarball
IMAGE=${BASE_IMAGE:-docker.io/library/python:3.11-slim-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${BASE_CACHE_DIR:-$ROOT/build/container-base}
TARBALL=$CACHE/python-3.11-bookworm-standin-r$RECIPE.tar
LABEL=phi3chat.standin

usage() {
    echo "usage: $0 [--force]" >&2
    echo "  makes $IMAGE from a debootstrap rootfs cached in $CACHE" >&2
}

force=0
case "${1:-}" in
    "") ;;
    --force) force=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage; exit 2 ;;
esac

command -v podman >/dev/null || { echo "$0: podman is not installed (scripts/run/setup_podman.sh)" >&2; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # two test runs at once share one debootstrap

have=$(podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)
if [ "$force" -eq 0 ] && [ "$have" = "r$RECIPE" ]; then
    echo "$IMAGE: stand-in r$RECIPE already present"
    exit 0
fi
if [ "$force" -eq 0 ] && podman image exists "$IMAGE" && [ -z "$have" ]; then
    echo "$IMAGE: a real image with this name is present; leaving it alone"
    exit 0
fi

if [ "$force" -eq 1 ] || [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || { echo "$0: debootstrap is not installed" >&2; exit 1; }
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    echo "debootstrap bookworm into $rootfs (about 2 minutes)"
    debootstrap --variant=minbase \
        --include=python3,python3-pip,python-is-python3,ca-certificates \
        bookworm "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    # What python:3.11-slim is like: pip installs into the system Python (no PEP 668 marker),
    # no apt lists, docs or caches.
    rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc/* \
        "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*
    find "$rootfs"/usr/lib/python3* -name __pycache__ -type d -prune -exec rm -rf {} +
    tar --numeric-owner -C "$rootfs" -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
    rm -rf "$rootfs"
    trap - EXIT
fi

podman image rm --force "$IMAGE" >/dev/null 2>&1 || true
podman import \
    --change "LABEL $LABEL=r$RECIPE" \
    --change "ENV LANG=C.UTF-8" \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change 'CMD ["python3"]' \
    "$TARBALL" "$IMAGE" >/dev/null
echo "$IMAGE: stand-in r$RECIPE imported from $TARBALL"
