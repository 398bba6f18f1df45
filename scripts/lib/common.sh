# shellcheck shell=bash
# What scripts/test and scripts/demo share: installing the Debian packages,
# configuring and building the CMake trees, and running PostgreSQL (a
# throwaway one for the tests, a persistent one under var/pg for the demo).
# Sourced, never executed; the caller sets `set -euo pipefail`.

FB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FB_PACKAGES_FILE="$FB_ROOT/scripts/lib/packages.txt"
FB_NVCC=/usr/local/cuda/bin/nvcc
FB_PG_BINDIR=/usr/lib/postgresql/15/bin

fb_say() { printf '\n==> %s\n' "$*"; }
fb_warn() { printf 'warning: %s\n' "$*" >&2; }
fb_die() {
    printf '\nerror: %s\n' "$*" >&2
    exit 1
}

# --- packages --------------------------------------------------------------

# The package names of packages.txt, one a line.
fb_packages() {
    sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$FB_PACKAGES_FILE"
}

# Installs the packages that are missing; apt-get update runs only then.
fb_install_packages() {
    local p status missing=()
    while read -r p; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [[ $status == "install ok installed" ]] || missing+=("$p")
    done < <(fb_packages)
    if ((${#missing[@]} == 0)); then
        fb_say "packages: all $(fb_packages | wc -l) present"
        return 0
    fi
    if ((EUID != 0)); then
        fb_die "missing Debian packages: ${missing[*]}
run as root, or install them: apt-get install --no-install-recommends ${missing[*]}"
    fi
    fb_say "packages: installing ${missing[*]}"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# Installs the npm modules, exactly as each package-lock.json pins them:
# tests/server (the OpenAPI linter and response validator), web/ (uPlot,
# which the build copies next to the dashboard) and tests/web
# (playwright-core for the browser test).
fb_npm_setup() {
    local rel dir
    for rel in tests/server web tests/web; do
        dir=$FB_ROOT/$rel
        [[ -f $dir/package-lock.json ]] || continue
        if ! command -v npm >/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm ||
                fb_die "npm is missing and could not be installed"
        fi
        if [[ $dir/node_modules/.package-lock.json -nt $dir/package-lock.json ]]; then
            fb_say "npm: $rel modules up to date"
            continue
        fi
        fb_say "npm: installing $rel modules (npm ci)"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || fb_die "npm ci in $rel failed"
    done
}

# --- build -----------------------------------------------------------------

# CMake arguments for the CUDA backend: on when nvcc exists, unless the
# FUSEBOX_CUDA knob (ON/OFF) says otherwise.  Sets FB_CUDA_ARGS and FB_CUDA.
fb_cuda_choice() {
    local want=${FUSEBOX_CUDA:-auto}
    case ${want,,} in
    auto) if [[ -x $FB_NVCC ]]; then FB_CUDA=ON; else FB_CUDA=OFF; fi ;;
    on | 1 | yes) FB_CUDA=ON ;;
    off | 0 | no) FB_CUDA=OFF ;;
    *) fb_die "FUSEBOX_CUDA must be ON, OFF or auto, not '$want'" ;;
    esac
    if [[ $FB_CUDA == ON ]]; then
        [[ -x $FB_NVCC ]] || fb_die "FUSEBOX_CUDA=ON but $FB_NVCC does not exist"
        FB_CUDA_ARGS=(-DFUSEBOX_CUDA=ON "-DCMAKE_CUDA_COMPILER=$FB_NVCC")
    else
        FB_CUDA_ARGS=(-DFUSEBOX_CUDA=OFF)
    fi
}

# fb_cmake_build DIR [--target NAME] [cmake args...]: configures DIR with
# Ninja (again each time, which is cheap and picks up new files) and builds
# everything in it, or only NAME and what it needs.
fb_cmake_build() {
    local dir=$1 target=()
    shift
    if [[ ${1:-} == --target ]]; then
        target=(--target "$2")
        shift 2
    fi
    if [[ -f $dir/CMakeCache.txt ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
        fb_die "$dir was configured with another generator than Ninja; remove it and run again"
    fi
    cmake -S "$FB_ROOT" -B "$dir" -G Ninja "$@" || fb_die "configuring $dir failed"
    cmake --build "$dir" "${target[@]}" || fb_die "building $dir failed"
}

# build/: the tree the demo runs and the first test pass uses.
fb_build_main() {
    fb_cuda_choice
    fb_say "build/: configure and build (CUDA $FB_CUDA, warnings are errors)"
    fb_cmake_build "$FB_ROOT/build" -DFUSEBOX_WERROR=ON "${FB_CUDA_ARGS[@]}"
}

# build-asan/: clang with AddressSanitizer, UBSan and the libFuzzer targets.
fb_build_asan() {
    fb_say "build-asan/: configure and build (clang, ASan + UBSan, fuzz targets, no CUDA)"
    fb_cmake_build "$FB_ROOT/build-asan" -DFUSEBOX_SANITIZE=ON -DFUSEBOX_CUDA=OFF \
        -DFUSEBOX_FUZZ=ON -DCMAKE_C_COMPILER=clang
}

# build-tsan/: clang with ThreadSanitizer, no CUDA, the CPU kernels without
# OpenMP (CMakeLists.txt says why).  Only what the `tsan`-labelled tests run
# is built (the fb_tsan_tests target, tests/CMakeLists.txt).
fb_build_tsan() {
    fb_say "build-tsan/: configure and build (clang, ThreadSanitizer, no CUDA, no OpenMP)"
    fb_cmake_build "$FB_ROOT/build-tsan" --target fb_tsan_tests -DFUSEBOX_TSAN=ON \
        -DFUSEBOX_CUDA=OFF -DCMAKE_C_COMPILER=clang
}

# --- PostgreSQL ------------------------------------------------------------

# Runs a PostgreSQL program as the postgres user when we are root (the
# server refuses to run as root), else as ourselves.  From / so that a
# working directory postgres cannot enter does not matter; pass absolute paths.
fb_as_pg() {
    if ((EUID == 0)); then
        (cd / && runuser -u postgres -- "$@")
    else
        (cd / && "$@")
    fi
}

# Gives DIR to the user the server will run as.
fb_pg_own() {
    if ((EUID == 0)); then chown postgres:postgres "$1"; fi
    chmod 700 "$1"
}

# A TCP port on 127.0.0.1 that nothing listens on right now.
fb_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# fb_pg_initdb DATADIR SOCKETDIR: a new cluster with one superuser, postgres,
# trusted on the unix socket and on loopback, listening on 127.0.0.1 only.
fb_pg_initdb() {
    local data=$1 sock=$2 log
    log=$(dirname "$data")/initdb.log
    if ! fb_as_pg "$FB_PG_BINDIR/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-locale \
        >"$log" 2>&1; then
        cat "$log" >&2
        fb_die "initdb $data failed"
    fi
    # The socket path must fit in sun_path (107 bytes); without it, TCP only.
    if ((${#sock} + 20 > 107)); then sock=""; fi
    cat >>"$data/postgresql.conf" <<EOF

# fusebox (scripts/lib/common.sh)
listen_addresses = '127.0.0.1'
unix_socket_directories = '$sock'
max_connections = 100
EOF
}

# fb_pg_start DATADIR LOGFILE PORT: starts the server and waits until it
# accepts connections.  Returns non-zero (log left in LOGFILE) on failure.
fb_pg_start() {
    fb_as_pg "$FB_PG_BINDIR/pg_ctl" -D "$1" -l "$2" -w -t 60 -o "-p $3" start >/dev/null
}

# fb_pg_running DATADIR: true while a server runs on DATADIR.
fb_pg_running() {
    fb_as_pg "$FB_PG_BINDIR/pg_ctl" -D "$1" status >/dev/null 2>&1
}

# fb_pg_stop DATADIR: immediate shutdown; kills the postmaster if pg_ctl cannot.
fb_pg_stop() {
    local data=$1 pid
    [[ -f $data/postmaster.pid ]] || return 0
    fb_as_pg "$FB_PG_BINDIR/pg_ctl" -D "$data" -m immediate -w -t 30 stop >/dev/null 2>&1 && return 0
    pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
    if [[ $pid =~ ^[0-9]+$ ]]; then kill -QUIT "$pid" 2>/dev/null || true; fi
}

# Throwaway server for the tests: temporary directory, free port, fast and
# unsafe settings.  Sets FB_TMP_PG_DIR and FB_TMP_PG_URL.  The caller traps
# EXIT to call fb_pg_throwaway_stop.
FB_TMP_PG_DIR=""
FB_TMP_PG_URL=""
fb_pg_throwaway_start() {
    local dir port _
    dir=$(mktemp -d /tmp/fusebox-pg.XXXXXX)
    FB_TMP_PG_DIR=$dir
    fb_pg_own "$dir"
    fb_pg_initdb "$dir/data" "$dir"
    cat >>"$dir/data/postgresql.conf" <<EOF
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    # The port is free when chosen but could be taken before the server
    # binds it; try another a few times.
    for _ in 1 2 3; do
        port=$(fb_free_port)
        if fb_pg_start "$dir/data" "$dir/server.log" "$port"; then
            FB_TMP_PG_URL="postgresql://postgres@127.0.0.1:$port/fusebox_test"
            fb_as_pg "$FB_PG_BINDIR/createdb" -h 127.0.0.1 -p "$port" -U postgres fusebox_test ||
                fb_die "createdb fusebox_test failed"
            fb_say "PostgreSQL (throwaway): $FB_TMP_PG_URL, data in $dir"
            return 0
        fi
        grep -q 'could not bind' "$dir/server.log" 2>/dev/null || break
    done
    tail -n 20 "$dir/server.log" >&2 || true
    fb_die "the throwaway PostgreSQL did not start"
}

# Stops the throwaway server and removes its directory; safe to call twice.
# Keeps a copy of the server log in build/Testing/ for failed tests.
fb_pg_throwaway_stop() {
    local dir=$FB_TMP_PG_DIR
    [[ -n $dir ]] || return 0
    FB_TMP_PG_DIR=""
    fb_pg_stop "$dir/data"
    if [[ -f $dir/server.log && -d $FB_ROOT/build/Testing ]]; then
        cp "$dir/server.log" "$FB_ROOT/build/Testing/postgresql-throwaway.log" 2>/dev/null || true
    fi
    rm -rf -- "$dir"
}
