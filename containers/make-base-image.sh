#!/usr/bin/env bash
# Make the demo upstream's base image, localhost/bisect-npu-demo-base:py311, without a registry:
# a Debian bookworm minbase rootfs (debootstrap) with python3, pip, a C compiler (the demo's build
# step compiles csrc/*.c) and torch 2.13.0 CPU installed offline from the wheel on this disk,
# then `podman import`. `python` is python3, and pip may install system-wide (no EXTERNALLY-MANAGED).
# Cached twice: the finished image (skip everything when present) and the rootfs tarball under
# $BISECT_NPU_BUILD_CACHE (default build-cache/), so a rebuild costs one import.
set -euo pipefail

IMAGE="${BISECT_NPU_DEMO_BASE:-localhost/bisect-npu-demo-base:py311}"
CACHE="${BISECT_NPU_BUILD_CACHE:-build-cache}"
MIRROR="${BISECT_NPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TORCH="${BISECT_NPU_TORCH:-torch==2.13.0}"
TARBALL="$CACHE/rootfs-bookworm-py311-torch.tar"
PACKAGES=python3,python3-pip,python3-wheel,python-is-python3,gcc,libc6-dev

say() { echo "make-base-image: $*" >&2; }

if podman image exists "$IMAGE"; then
    say "$IMAGE already present"
    exit 0
fi
mkdir -p "$CACHE"

if [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || {
        say "installing debootstrap (apt)"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    }
    work="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
    rootfs="$work/rootfs"
    # debootstrap mounts /proc (and more) inside the rootfs and can leave it mounted on exit: unmount
    # whatever is still mounted there, deepest first, before the tarball and before removing it.
    unmount_inside() {
        awk -v root="$(realpath -m "$rootfs")" '$2 == root || index($2, root "/") == 1 { print $2 }' /proc/mounts |
            sort -r | while read -r mnt; do umount -l "$mnt" || true; done
    }
    trap 'unmount_inside; rm -rf "$work"' EXIT
    say "debootstrap bookworm ($PACKAGES)"
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
    unmount_inside

    # Containers get no network: the wheels come from the host's pip (torch from the local file).
    say "pip download $TORCH"
    mkdir -p "$rootfs/tmp/wheels"
    python3 -m pip download -q --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
        -d "$rootfs/tmp/wheels" "$TORCH"
    say "pip install --no-index inside the rootfs"
    env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root chroot "$rootfs" /usr/bin/python3 -m pip install -q \
        --no-index --no-cache-dir --no-compile --break-system-packages --root-user-action=ignore \
        --find-links /tmp/wheels "$TORCH"
    # pip is the package manager of this image: let Dockerfiles `pip install` without a flag.
    rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED

    # Smaller image: nothing here is needed at run time.
    rm -rf "$rootfs/tmp/wheels" "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/locale \
        "$rootfs"/usr/local/lib/python3.11/dist-packages/torch/include
    find "$rootfs" -name __pycache__ -type d -prune -exec rm -rf {} +
    tar -C "$rootfs" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
fi

say "podman import $TARBALL -> $IMAGE"
podman import --change 'CMD ["/usr/bin/python3"]' --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
    "$TARBALL" "$IMAGE" >/dev/null
say "done: $(podman image inspect --format '{{.Size}}' "$IMAGE") bytes"
