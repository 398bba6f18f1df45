#!/usr/bin/env bash
# bench/fairshare/validate.sh [BUILD_DIR]
#
# Does the simulator predict reality?  On a small real cluster (fuseboxd with
# fair share every 2 s, two CPU workers of one device each, at most three
# arrays per device, fusion off so that every job is its own array;
# bench/fairshare/lib.sh), first measures the simulator's cost model on
# calibration jobs of their own (fair_calibrate: each model's step time alone,
# the arrays' start and end costs, the dispatch latency, the host's
# interference, and the step times alone fuseboxd stored as profiles; written
# to calibration.jsonl), then submits the validation: a dozen Fashion-MNIST MLP
# jobs of four sizes (about job_s seconds alone each) in three waves, with
# other sizes and arrivals than the calibration's.  The same jobs, with the
# submission times as they happened, then run in fusebox-sim three times:
# with the models' step times only (the model before the calibration's other
# terms), with the whole calibration, and with the calibration but no host
# interference (what that one term does).  Prints each job's completion time
# (submission to finish) in reality and in each, the ratios, and whether every
# job agrees within 15%.  Starts a throwaway PostgreSQL (scripts/lib/common.sh);
# BUILD_DIR (default build) must hold fuseboxd, fusebox-worker and
# fusebox-sim.  Run as root (or as a user that may run PostgreSQL's
# programs).  OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for the run.
# The cluster runs at niceness FAIR_NICE (default -15; lib.sh), so that other
# work on a shared machine disturbs it less.  With KEEP=DIR, the calibration
# and its raw measurements, the scenario, the three runs' outputs and the
# real jobs' timelines are copied to DIR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
[[ -x $build/sim/fusebox-sim ]] || { echo "build first: fusebox-sim is missing in $build" >&2; exit 2; }
# shellcheck source=../lib/cluster.sh
source "$root/bench/lib/cluster.sh"
# shellcheck source=lib.sh
source "$root/bench/fairshare/lib.sh"
bench_setup fairshare
job_s=8
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

fair_cluster
fair_calibrate "$dir/calibration.jsonl" "$dir/plain.jsonl"
declare -a steps
for m in 0 1 2 3; do
    steps[m]=$(/usr/bin/python3 -c "print(max(100, round($job_s / ${step_s[m]})))")
done

# three waves of one job per model, 5 s apart
for wave in 0 1 2; do
    for m in 0 1 2 3; do submit "m$m-w$wave" "$m" "${steps[m]}" >/dev/null; done
    [[ $wave == 2 ]] || sleep 5
done
fair_wait
[[ $(psql_q "$url" "SELECT count(*) FROM jobs WHERE state <> 'completed' AND name NOT LIKE 'cal%'") == 0 ]] ||
    fb_die "not every job completed"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# the validation for the simulator: the cluster on host "local" (the
# calibration's), the jobs as submitted
{
    echo "{\"type\": \"sim\", \"name\": \"validate\", \"period_s\": $((period_ms / 1000)), \"plan_gap_s\": 0.05, \"max_b\": 1, \"max_groups_per_device\": 3}"
    echo '{"type": "devices", "count": 2, "per_worker": 1, "kind": "cpu", "memory_gib": 64, "host": "local"}'
    echo '{"type": "tenant", "name": "bench"}'
    psql_q "$url" "SELECT format('{\"type\": \"job\", \"at\": %s, \"tenant\": \"bench\", \"profile\": \"%s\", \"steps\": %s}',
                     round(extract(epoch FROM created_at - min(created_at) OVER ())::numeric, 3),
                     split_part(name, '-', 1), steps) FROM jobs WHERE name NOT LIKE 'cal%'
                   ORDER BY created_at, seq"
} >"$dir/validate.jsonl"
"$build/sim/fusebox-sim" --jobs "$dir/plain.jsonl" "$dir/validate.jsonl" >"$dir/sim-plain.txt"
"$build/sim/fusebox-sim" --jobs "$dir/calibration.jsonl" "$dir/validate.jsonl" >"$dir/sim.txt"
sed -E 's/"interference": [0-9.e+-]+/"interference": 0/' "$dir/calibration.jsonl" >"$dir/no-host.jsonl"
"$build/sim/fusebox-sim" --jobs "$dir/no-host.jsonl" "$dir/validate.jsonl" >"$dir/sim-no-host.txt"
psql_q "$url" "SELECT name, round(extract(epoch FROM finished_at - created_at)::numeric, 2), slowdown
               FROM jobs WHERE name NOT LIKE 'cal%' ORDER BY created_at, seq" >"$dir/real.txt"
if [[ -n ${KEEP:-} ]]; then
    mkdir -p "$KEEP"
    cp "$dir"/{calibration.jsonl,plain.jsonl,validate.jsonl,sim-plain.txt,sim.txt,sim-no-host.txt} "$KEEP/"
    cp "$dir"/{real.txt,cal-jobs.txt,cal-progress.txt,cal-profiles.txt} "$KEEP/"
    # the real jobs' timelines (s from the first submission) and where they ran
    psql_q "$url" "SELECT j.name, w.name, round(extract(epoch FROM j.created_at - t0)::numeric, 2),
                          round(extract(epoch FROM j.scheduled_at - t0)::numeric, 2),
                          round(extract(epoch FROM j.started_at - t0)::numeric, 2),
                          round(extract(epoch FROM j.finished_at - t0)::numeric, 2)
                   FROM jobs j JOIN groups g ON g.id = j.group_id LEFT JOIN workers w ON w.id = g.worker_id,
                        (SELECT min(created_at) AS t0 FROM jobs WHERE name NOT LIKE 'cal%') f
                   WHERE j.name NOT LIKE 'cal%' ORDER BY j.created_at, j.seq" >"$KEEP/real-times.txt"
fi

echo "Fair-share validation, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores (shared with other work:"
echo "load average $load_before before, $load_after after); command: bench/fairshare/validate.sh ${build#"$root"/}"
echo "fuseboxd --rebalance-ms $period_ms --max-array 1 --max-groups-per-device 3, 2 CPU workers x 1 device;"
echo "12 Fashion-MNIST MLP jobs (784-H-10, batch 128) in 3 waves 5 s apart. OPENBLAS_CORETYPE and"
echo "OPENBLAS_L2_SIZE unset."
echo
echo "calibration (calibration.jsonl):"
cat "$dir/calibration.jsonl"
echo
for m in 0 1 2 3; do
    printf 'model m%d: H=%d, %d steps\n' "$m" "${hidden[m]}" "${steps[m]}"
done
echo
/usr/bin/python3 - "$dir/real.txt" "$dir/sim-plain.txt" "$dir/sim.txt" "$dir/sim-no-host.txt" <<'PY'
import sys
real = [l.split('|') for l in open(sys.argv[1]).read().split('\n') if l]
def sim(path):
    out = []
    for l in open(path):
        f = l.split()
        if len(f) == 8 and f[0].isdigit():
            out.append(float(f[6]) - float(f[4]))  # finished - submitted
    assert len(out) == len(real), (len(out), len(real))
    return out
a, b, c = sim(sys.argv[2]), sim(sys.argv[3]), sim(sys.argv[4])
print('completion time (s): real, and the simulator with step times only / calibrated /')
print('calibrated without host interference')
print('%-8s %7s %10s %6s %10s %6s %10s %6s'
      % ('job', 'real', 'step only', 'ratio', 'calibrated', 'ratio', 'no host', 'ratio'))
for (name, done, _), x, y, z in zip(real, a, b, c):
    r = float(done)
    print('%-8s %7.1f %10.1f %6.3f %10.1f %6.3f %10.1f %6.3f'
          % (name, r, x, x / r, y, y / r, z, z / r))
for label, v in (('step only', a), ('calibrated', b), ('no host', c)):
    e = [abs(x / float(d) - 1) for (_, d, _), x in zip(real, v)]
    print('%-10s mean |sim/real - 1| %5.1f%%, max %5.1f%%; every job within 15%%: %s'
          % (label, 100 * sum(e) / len(e), 100 * max(e), 'yes' if max(e) <= 0.15 else 'NO'))
PY
