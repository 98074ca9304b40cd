#!/usr/bin/env bash
# Build fedsynth's image on a machine that cannot pull from a registry (run as root).
#
#   sudo deploy/build-local-base.sh [--rootfs DIR] [--venv DIR] [--mirror URL] [--skip-image]
#
# 1. debootstrap a minimal Debian bookworm (Python 3.11, as python:3.11-slim-bookworm has) into
#    --rootfs (default /var/tmp/fedsynth-rootfs; an existing one is reused);
# 2. preinstall the pinned dependencies into its /opt/venv by copying the site-packages of an
#    existing virtualenv with them (--venv, default this checkout's .venv) -- no package index is
#    needed, and the image's pip then finds every requirement already satisfied;
# 3. `docker import` the tree as fedsynth-base:local (PIP_NO_INDEX=1: a missing requirement fails
#    the build instead of going to the network), labelled fedsynth.requirements=<sha256 of
#    deploy/requirements.txt>, so that a cached base can be checked against the pins (.ci/run);
# 4. build fedsynth:latest from deploy/Dockerfile on top of it (unless --skip-image).
# The Debian mirror (default http://deb.debian.org/debian) must be reachable, or a local one given.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
rootfs=/var/tmp/fedsynth-rootfs venv="$root/.venv" mirror=http://deb.debian.org/debian image=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rootfs) rootfs="$2"; shift 2 ;;
        --venv) venv="$2"; shift 2 ;;
        --mirror) mirror="$2"; shift 2 ;;
        --skip-image) image=0; shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "build-local-base.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "build-local-base.sh: run as root (debootstrap, chroot)" >&2; exit 2; }
for tool in debootstrap docker; do
    command -v "$tool" >/dev/null || { echo "build-local-base.sh: needs $tool (apt-get install debootstrap docker.io)" >&2; exit 2; }
done
site="$venv/lib/python3.11/site-packages"
[ -d "$site/flwr" ] && [ -d "$site/torch" ] || { echo "build-local-base.sh: $venv has no Python 3.11 site-packages with flwr and torch" >&2; exit 2; }

step() { echo "== $(date +%H:%M:%S) $*"; }
if [ ! -x "$rootfs/usr/bin/python3.11" ]; then
    step "debootstrap bookworm into $rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" >/dev/null
fi
step "Python dependencies into $rootfs/opt/venv (from $venv)"
rm -rf "$rootfs/opt/venv"
chroot "$rootfs" python3 -m venv /opt/venv
target="$rootfs/opt/venv/lib/python3.11/site-packages"
# Everything but this checkout's editable install and bytecode caches.
tar -C "$site" --exclude='__pycache__' --exclude='./__editable__*' --exclude='./fedsynth-*.dist-info' -cf - . \
    | tar -C "$target" -xf -
# Console scripts (flower-superlink, flwr, ...) with the interpreter of the image.
for script in "$venv"/bin/*; do
    [ -f "$script" ] && [ ! -L "$script" ] || continue
    head -c 2 "$script" | grep -q '^#!' || continue
    head -n 1 "$script" | grep -q python || continue
    name="$(basename "$script")"
    case "$name" in activate*|python*) continue ;; esac
    { echo '#!/opt/venv/bin/python3'; tail -n +2 "$script"; } > "$rootfs/opt/venv/bin/$name"
    chmod 755 "$rootfs/opt/venv/bin/$name"
done
mount -t proc proc "$rootfs/proc"
trap 'umount "$rootfs/proc" 2>/dev/null || true' EXIT
chroot "$rootfs" /opt/venv/bin/python -c "import flwr, torch, torchvision" \
    || { echo "build-local-base.sh: the copied dependencies do not import in the image's Python" >&2; exit 1; }
umount "$rootfs/proc"

step "docker import -> fedsynth-base:local"
tar -C "$rootfs" --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -cf - . \
    | docker import \
        --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV PIP_NO_INDEX=1' \
        --change 'CMD ["/bin/bash"]' \
        --change "LABEL fedsynth.requirements=$(sha256sum < "$here/requirements.txt" | cut -d' ' -f1)" \
        - fedsynth-base:local >/dev/null
if [ "$image" = 1 ]; then
    step "docker build -f deploy/Dockerfile -> fedsynth:latest"
    docker build --build-arg BASE_IMAGE=fedsynth-base:local -f "$root/deploy/Dockerfile" -t fedsynth:latest "$root"
fi
step "done"
