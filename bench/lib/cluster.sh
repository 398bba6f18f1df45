# shellcheck shell=bash
# What the end-to-end benchmarks share (bench/dispatch, bench/sweep): a
# throwaway PostgreSQL, and per run a fresh database with fuseboxd and one
# CPU worker on free loopback ports and a tenant key.  Sourced by a
# benchmark after it sets root and build; the caller sets `set -euo pipefail`.

# shellcheck source=../../scripts/lib/common.sh
source "$root/scripts/lib/common.sh"

# bench_setup TAG: checks the binaries, unsets the OpenBLAS settings this
# machine makes (for every run alike), makes the scratch directory $work and
# starts PostgreSQL; everything is stopped and removed on exit.
bench_setup() {
    local b
    for b in server/fuseboxd workers/fusebox-worker; do
        [[ -x $build/$b ]] || fb_die "build first: cmake --build $build (missing $b)"
    done
    unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
    work=$(mktemp -d "/tmp/fusebox-bench-$1.XXXXXX")
    bench_pids=()
    trap bench_cleanup EXIT
    fb_pg_throwaway_start >/dev/null
}

bench_cleanup() {
    local p
    for p in "${bench_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    fb_pg_throwaway_stop
    rm -rf -- "$work"
}

# JSON on stdin, a Python expression over it (d) out.
json() { /usr/bin/python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }
psql_q() { "$FB_PG_BINDIR/psql" "$1" -XtAq -c "$2"; }

# bench_cluster NAME MAX_ARRAY: a fresh database, fuseboxd with --max-array
# MAX_ARRAY and one registered CPU worker.  Sets url (the database), api,
# dir (the run's scratch directory) and key (a tenant's API key).
bench_cluster() {
    local name=$1 max_array=$2 db pg_port port wport admin tenant
    db=fusebox_bench_${name//-/_}
    url=${FB_TMP_PG_URL%/*}/$db
    pg_port=$(sed -E 's|.*:([0-9]+)/.*|\1|' <<<"$FB_TMP_PG_URL")
    fb_as_pg "$FB_PG_BINDIR/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres "$db"
    dir=$work/$name
    mkdir -p "$dir"
    "$build/workers/fusebox-worker" --gen-key "$dir/worker.key" >/dev/null 2>&1
    sed -n 's/^public: //p' "$dir/worker.key" >"$dir/worker-keys"
    port=$(fb_free_port)
    wport=$(fb_free_port)
    "$build/server/fuseboxd" --database-url "$url" --data-dir "$dir" --port "$port" \
        --worker-listen "tcp://127.0.0.1:$wport" --max-array "$max_array" \
        --log-level warn 2>"$dir/fuseboxd.log" &
    bench_pids+=($!)
    for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
    "$build/workers/fusebox-worker" --server "tcp://127.0.0.1:$wport" \
        --server-key "$dir/server.key.pub" --key "$dir/worker.key" --name "bench-$name" \
        --cpu-devices 1 2>"$dir/worker.log" &
    bench_pids+=($!)
    api=http://127.0.0.1:$port
    admin=$(cat "$dir/admin.key")
    tenant=$(curl -fsS -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
        -d '{"name": "bench", "quotas": {"max_queued_jobs": 100000}}' "$api/v1/tenants" | json "d['id']")
    key=$(curl -fsS -X POST -H "Authorization: Bearer $admin" "$api/v1/tenants/$tenant/keys" |
        json "d['key']")
    sleep 1 # the worker registers
}

# bench_wait: until no job of the run's database waits or trains.
bench_wait() {
    while [[ $(psql_q "$url" "SELECT count(*) FROM jobs WHERE state IN ('queued', 'scheduled', 'running')") != 0 ]]; do
        sleep 0.5
        kill -0 "${bench_pids[-1]}" 2>/dev/null || { tail "$dir/worker.log" >&2; fb_die "the worker exited"; }
    done
}

# bench_stop: stops the run's worker and server.
bench_stop() {
    kill -TERM "${bench_pids[-1]}" "${bench_pids[-2]}" 2>/dev/null || true
    wait "${bench_pids[-1]}" "${bench_pids[-2]}" 2>/dev/null || true
}
