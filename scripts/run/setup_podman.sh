#!/usr/bin/env bash
# Make this (Debian bookworm, root) machine able to build and run the images with podman.
# Idempotent: installs podman, runc and debootstrap only when missing, and writes the engine
# settings that work without systemd in a hybrid-cgroup VM. Run it as root before
# `make test` on a fresh machine; tests/containers/ needs it.
set -euo pipefail

usage() {
    echo "usage: $0 [--no-apt]" >&2
    echo "  installs podman runc debootstrap (apt) and writes /etc/containers/containers.conf" >&2
}

apt=1
case "${1:-}" in
    "") ;;
    --no-apt) apt=0 ;;
    -h | --help) usage; exit 0 ;;
    *) usage; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (apt-get and /etc/containers)" >&2
    exit 1
fi

missing=()
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$apt" -eq 0 ]; then
        echo "$0: missing ${missing[*]} and --no-apt was given" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q podman runc debootstrap slirp4netns
fi

# The defaults (crun, systemd cgroup manager) fail here with "cgroups in hybrid mode not
# supported"; without ulimit defaults runc fails with "setrlimit ... Operation not permitted".
conf=/etc/containers/containers.conf
want='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"'
if [ ! -f "$conf" ] || ! grep -q 'cgroup_manager = "cgroupfs"' "$conf"; then
    mkdir -p /etc/containers
    if [ -f "$conf" ]; then
        cp "$conf" "$conf.orig"
    fi
    printf '%s\n' "$want" >"$conf"
    echo "wrote $conf"
fi

podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}' >/dev/null
echo "podman $(podman version --format '{{.Client.Version}}') ready"
