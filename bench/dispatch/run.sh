#!/usr/bin/env bash
# bench/dispatch/run.sh [BUILD_DIR] [TRIALS] [STEPS]
#
# Prints the dispatch table of bench/RESULTS.md ("## Dispatch: fused vs
# unfused sweep"): one sweep of TRIALS (default 64) Fashion-MNIST MLP trials
# of STEPS steps (default 150) submitted over HTTP to fuseboxd with one CPU
# worker, once with fusion (--max-array 64) and once without (--max-array 1:
# every trial its own array, up to --max-groups-per-device of them sharing
# the device), side by side: submit-to-first-step latency (median and max over
# the trials, from the API's own timestamps), makespan, and jobs finished per
# hour.  Starts a throwaway PostgreSQL (scripts/lib/common.sh); BUILD_DIR
# (default build) must hold fuseboxd and fusebox-worker.  Run as root (or as a
# user that may run PostgreSQL's programs).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
trials=${2:-64}
steps=${3:-150}
# shellcheck source=../../scripts/lib/common.sh
source "$root/scripts/lib/common.sh"
for b in server/fuseboxd workers/fusebox-worker; do
    [[ -x $build/$b ]] || fb_die "build first: cmake --build $build (missing $b)"
done
# This machine sets both; they slow OpenBLAS.  Unset for both runs alike.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

work=$(mktemp -d /tmp/fusebox-bench-dispatch.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    fb_pg_throwaway_stop
    rm -rf -- "$work"
}
trap cleanup EXIT
fb_pg_throwaway_start >/dev/null

json() { /usr/bin/python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }
psql_q() { "$FB_PG_BINDIR/psql" "$1" -XtAq -c "$2"; }

# run NAME MAX_ARRAY: one server and worker on a fresh database; prints a row.
run() {
    local name=$1 max_array=$2 db dir port wport admin tenant key sweep t0 t1
    db=fusebox_bench_$name
    local pg_port url=${FB_TMP_PG_URL%/*}/$db
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
    pids+=($!)
    for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
    "$build/workers/fusebox-worker" --server "tcp://127.0.0.1:$wport" \
        --server-key "$dir/server.key.pub" --key "$dir/worker.key" --name "bench-$name" \
        --cpu-devices 1 2>"$dir/worker.log" &
    pids+=($!)
    local api=http://127.0.0.1:$port
    admin=$(cat "$dir/admin.key")
    tenant=$(curl -fsS -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
        -d '{"name": "bench", "quotas": {"max_queued_jobs": 100000}}' "$api/v1/tenants" | json "d['id']")
    key=$(curl -fsS -X POST -H "Authorization: Bearer $admin" "$api/v1/tenants/$tenant/keys" |
        json "d['key']")
    sleep 1 # the worker registers
    t0=$(date +%s.%N)
    sweep=$(curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "{
      \"name\": \"bench\", \"base\": {\"dataset\": \"fashion-mnist\",
        \"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"},
          {\"type\": \"linear\", \"out\": 256}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 10}]},
        \"batch_size\": 128, \"steps\": $steps, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.001}},
      \"search\": {\"type\": \"random\", \"count\": $trials, \"seed\": 1,
        \"params\": {\"optimizer.lr\": {\"distribution\": \"log_uniform\", \"low\": 1e-4, \"high\": 1e-2}}}}" \
        "$api/v1/sweeps" | json "d['id']")
    while [[ $(psql_q "$url" "SELECT count(*) FROM jobs WHERE state IN ('queued', 'scheduled', 'running')") != 0 ]]; do
        sleep 0.5
        kill -0 "${pids[-1]}" 2>/dev/null || { tail "$dir/worker.log" >&2; fb_die "the worker exited"; }
    done
    t1=$(date +%s.%N)
    psql_q "$url" "
      WITH s AS (SELECT j.id, extract(epoch FROM (SELECT min(e.recorded_at) FROM job_events e
                   WHERE e.job_id = j.id AND e.kind = 'started') - j.created_at) AS lat
                 FROM jobs j WHERE j.sweep_id = '$sweep')
      SELECT '$name', $max_array,
             (SELECT count(*) FROM jobs WHERE sweep_id = '$sweep' AND state = 'completed'),
             (SELECT count(DISTINCT group_id) FROM jobs WHERE sweep_id = '$sweep'),
             round(percentile_cont(0.5) WITHIN GROUP (ORDER BY lat)::numeric, 2),
             round(max(lat)::numeric, 2),
             round(($t1 - $t0)::numeric, 1),
             round((3600 * (SELECT count(*) FROM jobs WHERE sweep_id = '$sweep'
                           AND state = 'completed') / ($t1 - $t0))::numeric, 0)
      FROM s" | tr '|' ' '
    kill -TERM "${pids[-1]}" "${pids[-2]}" 2>/dev/null || true
    wait "${pids[-1]}" "${pids[-2]}" 2>/dev/null || true
}

echo "Dispatch benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, one CPU worker;" \
     "$trials trials x $steps steps (Fashion-MNIST MLP 784-256-10, batch 128)"
echo "OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for both runs."
echo "command: bench/dispatch/run.sh ${build#"$root"/} $trials $steps"
echo
fused=$(run fused 64)
solo=$(run unfused 1)
printf '%-8s %9s %9s %7s %16s %14s %11s %10s\n' run max_array completed arrays \
    "first step p50 s" "first step max" "makespan s" "jobs/hour"
for row in "$fused" "$solo"; do
    # shellcheck disable=SC2086
    printf '%-8s %9s %9s %7s %16s %14s %11s %10s\n' $row
done
read -r _ _ _ _ _ _ fm fj <<<"$fused"
read -r _ _ _ _ _ _ sm sj <<<"$solo"
/usr/bin/python3 -c "print('fused / unfused: jobs per hour x%.2f, makespan x%.2f' % ($fj / $sj, $sm / $fm))"
