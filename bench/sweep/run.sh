#!/usr/bin/env bash
# bench/sweep/run.sh [BUILD_DIR] [TRIALS] [STEPS] [GRACE_STEPS] [MAX_RUNGS]
#
# Prints the early-stopping table of bench/RESULTS.md ("## Sweep: fused ASHA
# vs unfused ASHA vs full grid"): one random-search sweep of TRIALS (default
# 27) Fashion-MNIST MLP trials of STEPS steps (default 900) submitted over
# HTTP to fuseboxd with one CPU worker, three ways on fresh databases, side by
# side:
#   fused-asha    ASHA (reduction factor 3, rungs at GRACE_STEPS * 3^r,
#                 r < MAX_RUNGS; defaults 100 and 2), every trial in one array
#                 (--max-array 64) that the stopped ones leave;
#   unfused-asha  the same rule, every trial its own array (--max-array 1, up
#                 to --max-groups-per-device of them sharing the device);
#   full-grid     no early stopping, unfused: every trial trains to the end.
# For each: the trial that trained to the end with the best validation
# accuracy (the sweep decides on validation only) and its test accuracy, the
# time from submission until that trial finished (time to best result), the makespan, the steps trained over all trials, and how many
# trials stopped early.  The same seed gives the same trials in all three.
# Starts a throwaway PostgreSQL (scripts/lib/common.sh); BUILD_DIR (default
# build) must hold fuseboxd and fusebox-worker; the worker reads
# fashion-mnist from its default data directory.  Run as root (or as a user
# that may run PostgreSQL's programs).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
trials=${2:-27}
steps=${3:-900}
grace=${4:-100}
rungs=${5:-2}
# shellcheck source=../lib/cluster.sh
source "$root/bench/lib/cluster.sh"
bench_setup sweep

# run NAME MAX_ARRAY EARLY_STOPPING(json or null): one server and worker on a
# fresh database; prints a row.
run() {
    local name=$1 max_array=$2 es=$3 url api dir key sweep
    bench_cluster "$name" "$max_array"
    sweep=$(curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "{
      \"name\": \"bench\", \"base\": {\"dataset\": \"fashion-mnist\",
        \"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"},
          {\"type\": \"linear\", \"out\": 256}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 10}]},
        \"batch_size\": 128, \"steps\": $steps, \"eval_every\": $grace,
        \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.001}},
      \"search\": {\"type\": \"random\", \"count\": $trials, \"seed\": 1,
        \"params\": {\"optimizer.lr\": {\"distribution\": \"log_uniform\", \"low\": 1e-4, \"high\": 3e-2},
                     \"optimizer.weight_decay\": {\"distribution\": \"uniform\", \"low\": 0, \"high\": 0.1}}},
      \"early_stopping\": $es}" "$api/v1/sweeps" | json "d['id']")
    bench_wait
    # times from the database's own clock: submission (the sweep's created_at) to finish
    psql_q "$url" "
      WITH s AS (SELECT created_at FROM sweeps WHERE id = '$sweep'),
      t AS (SELECT j.*, (j.latest_metrics->>'val_accuracy')::float8 AS val,
                   (j.latest_metrics->>'test_accuracy')::float8 AS acc,
                   extract(epoch FROM j.finished_at - (SELECT created_at FROM s)) AS done_s
            FROM jobs j WHERE j.sweep_id = '$sweep'),
      best AS (SELECT acc, done_s FROM t WHERE state = 'completed' AND end_reason IS NULL
               AND step = steps AND val IS NOT NULL ORDER BY val DESC, done_s LIMIT 1)
      SELECT '$name', $max_array,
             (SELECT count(*) FROM t WHERE state = 'completed'),
             (SELECT count(*) FROM t WHERE end_reason = 'early_stopped'),
             (SELECT count(DISTINCT group_id) FROM t),
             (SELECT sum(step) FROM t),
             round((SELECT acc FROM best)::numeric, 4),
             round((SELECT done_s FROM best)::numeric, 1),
             round((SELECT max(done_s) FROM t)::numeric, 1)" | tr '|' ' '
    bench_stop
}

asha="{\"type\": \"asha\", \"metric\": \"val_accuracy\", \"mode\": \"max\", \"grace_steps\": $grace,
       \"reduction_factor\": 3, \"max_rungs\": $rungs}"
echo "Sweep benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, one CPU worker;" \
     "$trials random trials x $steps steps (Fashion-MNIST MLP 784-256-10, AdamW, batch 128," \
     "lr log-uniform 1e-4..3e-2, weight decay uniform 0..0.1, eval every $grace steps);" \
     "ASHA on val_accuracy, reduction factor 3, grace $grace steps, $rungs rungs;" \
     "best = best val_accuracy, its test accuracy shown"
echo "OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for every run."
echo "command: bench/sweep/run.sh ${build#"$root"/} $trials $steps $grace $rungs"
echo
fused=$(run fused-asha 64 "$asha")
unfused=$(run unfused-asha 1 "$asha")
grid=$(run full-grid 1 null)
printf '%-13s %9s %9s %13s %7s %12s %9s %14s %11s\n' run max_array completed early_stopped \
    arrays steps_trained best_test "time to best s" "makespan s"
for row in "$fused" "$unfused" "$grid"; do
    # shellcheck disable=SC2086
    printf '%-13s %9s %9s %13s %7s %12s %9s %14s %11s\n' $row
done
read -r _ _ _ _ _ fs fa ft fm <<<"$fused"
read -r _ _ _ _ _ us ua ut um <<<"$unfused"
read -r _ _ _ _ _ gs ga gt gm <<<"$grid"
/usr/bin/python3 -c "
print('time to best: full grid / fused ASHA x%.2f, unfused ASHA / fused ASHA x%.2f'
      % ($gt / $ft, $ut / $ft))
print('makespan: full grid / fused ASHA x%.2f, unfused ASHA / fused ASHA x%.2f' % ($gm / $fm, $um / $fm))
print('steps trained: fused ASHA / full grid %.2f, unfused ASHA / full grid %.2f' % ($fs / $gs, $us / $gs))
print('test accuracy of the best trial minus the full grid\'s: fused ASHA %+.2f points, unfused ASHA %+.2f points'
      % (100 * ($fa - $ga), 100 * ($ua - $ga)))"
