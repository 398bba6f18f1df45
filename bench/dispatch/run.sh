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
# shellcheck source=../lib/cluster.sh
source "$root/bench/lib/cluster.sh"
bench_setup dispatch

# run NAME MAX_ARRAY: one server and worker on a fresh database; prints a row.
run() {
    local name=$1 max_array=$2 url api dir key sweep t0 t1
    bench_cluster "$name" "$max_array"
    t0=$(date +%s.%N)
    sweep=$(curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "{
      \"name\": \"bench\", \"base\": {\"dataset\": \"fashion-mnist\",
        \"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"},
          {\"type\": \"linear\", \"out\": 256}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 10}]},
        \"batch_size\": 128, \"steps\": $steps, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.001}},
      \"search\": {\"type\": \"random\", \"count\": $trials, \"seed\": 1,
        \"params\": {\"optimizer.lr\": {\"distribution\": \"log_uniform\", \"low\": 1e-4, \"high\": 1e-2}}}}" \
        "$api/v1/sweeps" | json "d['id']")
    bench_wait
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
    bench_stop
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
