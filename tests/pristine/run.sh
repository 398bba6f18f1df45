#!/usr/bin/env bash
# tests/pristine/run.sh: runs scripts/test in a pristine Debian 12 container.
#
# A machine that has been used for a while hides missing install steps (a
# newer Node.js than Debian's, a tool some other package pulled in).  This
# check builds a Debian 12 base image from Debian's own packages (debootstrap
# --variant=minbase bookworm, cached), copies a clean clone of the committed
# tree into a fresh container and runs scripts/test there as root, with no
# network but the package registries (--network host).  Run by hand, or in CI
# where podman is present; it needs root, podman, runc and debootstrap
# (scripts/lib/packages.txt lists them).  Exit status: scripts/test's, or 77
# (skipped) without podman.
#
# Knobs (environment), passed on to scripts/test in the container:
#   FUSEBOX_TEST_LABEL, FUSEBOX_TEST_REGEX, FUSEBOX_TEST_SKIP_ASAN, FUSEBOX_TEST_SKIP_TSAN,
#   FUSEBOX_TEST_JOBS, FUSEBOX_CUDA
# and for this script:
#   FUSEBOX_PRISTINE_CACHE=DIR  base image root and run logs (default /var/tmp/fusebox-pristine)
#   FUSEBOX_PRISTINE_MIRROR=URL Debian mirror (default http://deb.debian.org/debian)
#   FUSEBOX_PRISTINE_REBUILD=1  debootstrap the base image again
#   FUSEBOX_PRISTINE_KEEP=1     keep the container's copy of the tree (and its build/) afterwards
#   FUSEBOX_PRISTINE_IMAGE_ONLY=1  build the base image, run nothing
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${FUSEBOX_PRISTINE_CACHE:-/var/tmp/fusebox-pristine}
mirror=${FUSEBOX_PRISTINE_MIRROR:-http://deb.debian.org/debian}
image=debian:12-slim

say() { printf '\n==> %s\n' "$*"; }
die() {
    printf '\nerror: %s\n' "$*" >&2
    exit 1
}

if ! command -v podman >/dev/null; then
    echo "SKIPPED: podman is not installed (apt-get install podman runc debootstrap)"
    exit 77
fi
((EUID == 0)) || die "run as root: the container runs scripts/test as root and podman here is rootful"
for tool in runc debootstrap git; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install --no-install-recommends $tool)"
done
mkdir -p "$cache/runs"

# Podman 4.3 on this kind of host: runc as the runtime (crun is not
# installed), and no default ulimits (the host's hard limits are lower
# than podman's defaults, which makes every container fail to start).
conf=$cache/containers.conf
cat >"$conf" <<'CONF'
[containers]
default_ulimits = []
CONF
export CONTAINERS_CONF=$conf
# The container stands in for a Debian machine on which root runs
# scripts/test: --privileged, so that root may mount a tmpfs (the disk-full
# tests) and make network namespaces (the partition test) as on a machine;
# the host's network, for the package registries; a /dev/shm of a machine's
# size rather than podman's 64 MB, which Chromium outgrows.
podman_run=(podman run --rm --runtime runc --network host --privileged --shm-size 2g)

# The base image: Debian's minimal bookworm, made from Debian's packages
# (no image registry is needed), with the apt sources of Debian's own
# debian:12-slim image (main, updates and security).
if [[ ${FUSEBOX_PRISTINE_REBUILD:-0} == 1 ]] || ! podman image exists "$image"; then
    rootfs=$cache/rootfs
    if [[ ${FUSEBOX_PRISTINE_REBUILD:-0} == 1 || ! -x $rootfs/usr/bin/apt-get ]]; then
        say "debootstrap --variant=minbase bookworm ($mirror)"
        rm -rf -- "$rootfs"
        debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
            { tail -n 20 "$cache/debootstrap.log" >&2; die "debootstrap failed (log: $cache/debootstrap.log)"; }
    fi
    security=${mirror%/debian}/debian-security
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    # what debian:12-slim also leaves out: the package lists
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
    say "podman import $image"
    podman image rm -f "$image" >/dev/null 2>&1 || true
    tar -C "$rootfs" -c . | podman import - "$image" >/dev/null
fi

if [[ ${FUSEBOX_PRISTINE_IMAGE_ONLY:-0} == 1 ]]; then
    say "$image is ready"
    exit 0
fi

# A clean clone of the committed tree: nothing untracked, no build trees.
work=$(mktemp -d "$cache/run.XXXXXX")
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [[ ${FUSEBOX_PRISTINE_KEEP:-0} == 1 ]]; then
        echo "kept: $work/src"
    else
        rm -rf -- "$work"
    fi
}
trap cleanup EXIT
git clone --quiet --no-hardlinks "$root" "$work/src"
commit=$(git -C "$work/src" rev-parse --short HEAD)
if [[ -n $(git -C "$root" status --porcelain --untracked-files=no) ]]; then
    echo "note: uncommitted changes in $root are not part of this run (only $commit is)"
fi

env_args=(-e CI=true)
for v in FUSEBOX_TEST_LABEL FUSEBOX_TEST_REGEX FUSEBOX_TEST_SKIP_ASAN FUSEBOX_TEST_SKIP_TSAN \
    FUSEBOX_TEST_JOBS FUSEBOX_CUDA; do
    if [[ -n ${!v:-} ]]; then env_args+=(-e "$v=${!v}"); fi
done
# npm inside the container trusts what the host's npm trusts: the host's
# extra CA certificates, if any, go in as NODE_EXTRA_CA_CERTS.
if [[ -n ${NODE_EXTRA_CA_CERTS:-} && -r $NODE_EXTRA_CA_CERTS ]]; then
    env_args+=(-v "$NODE_EXTRA_CA_CERTS:/etc/fusebox-host-ca.crt:ro"
        -e NODE_EXTRA_CA_CERTS=/etc/fusebox-host-ca.crt)
fi

log=$cache/runs/$(date -u +%Y%m%dT%H%M%SZ)-$commit.log
say "scripts/test of $commit in a fresh $image container (log: $log)"
started=$SECONDS
set +e
"${podman_run[@]}" "${env_args[@]}" -v "$work/src:/src" -w /src "$image" \
    scripts/test \
    2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
printf '\npristine Debian 12: scripts/test of %s exited %d after %d s (log: %s)\n' "$commit" "$rc" \
    "$((SECONDS - started))" "$log"
exit "$rc"
