#!/usr/bin/env bash
# bench/fairshare/validate.sh [BUILD_DIR]
#
# Does the simulator predict reality?  On a small real cluster (fuseboxd with
# fair share every 2 s, two CPU workers of one device each, at most three
# arrays per device, fusion off so that every job is its own array;
# bench/fairshare/lib.sh), first measures the simulator's cost model on
# calibration jobs of their own (fair_calibrate: each model's step time alone,
# the arrays' start and end costs, the dispatch latency, the host's
# interference, what taking turns on a device costs, and the step times alone fuseboxd stored as profiles; written
# to calibration.jsonl), then submits the validation: a dozen Fashion-MNIST MLP
# jobs of four sizes (about job_s seconds alone each) in three waves, with
# other sizes and arrivals than the calibration's.  The same jobs, with the
# submission times as they happened, then run in fusebox-sim three times:
# with the models' step times only (the model before the calibration's other
# terms), with the whole calibration, and with the calibration but no host
# interference (what that one term does).  Prints each job's completion time
# (submission to finish) in reality and in each, the ratios, and whether every
# job agrees within 15%.  With RUNS=N (1 to 9, default 1) the validation's
# jobs run N times, one run after the other on the same cluster and
# calibration, each compared with the simulator on its own submission times;
# the report then also sets the runs against each other (each job's completion
# time over its mean across the runs): how far reality strays from itself,
# which no model of it can do better than.  Starts a throwaway PostgreSQL
# (scripts/lib/common.sh); BUILD_DIR (default build) must hold fuseboxd, fusebox-worker and
# fusebox-sim.  Run as root (or as a user that may run PostgreSQL's
# programs).  OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for the run.
# The cluster runs at niceness FAIR_NICE (default -15; lib.sh), so that other
# work on a shared machine disturbs it less.  With KEEP=DIR, the calibration
# and its raw measurements, the scenarios, the simulator's outputs and the
# real jobs' timelines and progress reports are copied to DIR.
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

# RUNS times: three waves of one job per model, 5 s apart; each run starts
# once the one before has ended, on the same cluster and calibration
runs=${RUNS:-1}
[[ $runs =~ ^[1-9]$ ]] || fb_die "RUNS must be a number from 1 to 9, not '$runs'"
for run in $(seq "$runs"); do
    for wave in 0 1 2; do
        for m in 0 1 2 3; do submit "m$m-w$wave-r$run" "$m" "${steps[m]}" >/dev/null; done
        [[ $wave == 2 ]] || sleep 5
    done
    fair_wait
done
[[ $(psql_q "$url" "SELECT count(*) FROM jobs WHERE state <> 'completed' AND name NOT LIKE 'cal%'") == 0 ]] ||
    fb_die "not every job completed"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
sed -E 's/"interference": [0-9.e+-]+/"interference": 0/' "$dir/calibration.jsonl" >"$dir/no-host.jsonl"

# per run, the validation for the simulator: the cluster on host "local" (the
# calibration's), the jobs as submitted, in three variants of the model
for run in $(seq "$runs"); do
    {
        echo "{\"type\": \"sim\", \"name\": \"validate\", \"period_s\": $((period_ms / 1000)), \"plan_gap_s\": 0.05, \"max_b\": 1, \"max_groups_per_device\": 3}"
        echo '{"type": "devices", "count": 2, "per_worker": 1, "kind": "cpu", "memory_gib": 64, "host": "local"}'
        echo '{"type": "tenant", "name": "bench"}'
        psql_q "$url" "SELECT format('{\"type\": \"job\", \"at\": %s, \"tenant\": \"bench\", \"profile\": \"%s\", \"steps\": %s}',
                         round(extract(epoch FROM created_at - min(created_at) OVER ())::numeric, 3),
                         split_part(name, '-', 1), steps) FROM jobs WHERE name LIKE '%-r$run'
                       ORDER BY created_at, seq"
    } >"$dir/validate-r$run.jsonl"
    "$build/sim/fusebox-sim" --jobs "$dir/plain.jsonl" "$dir/validate-r$run.jsonl" >"$dir/sim-plain-r$run.txt"
    "$build/sim/fusebox-sim" --jobs "$dir/calibration.jsonl" "$dir/validate-r$run.jsonl" >"$dir/sim-r$run.txt"
    "$build/sim/fusebox-sim" --jobs "$dir/no-host.jsonl" "$dir/validate-r$run.jsonl" >"$dir/sim-no-host-r$run.txt"
    psql_q "$url" "SELECT name, round(extract(epoch FROM finished_at - created_at)::numeric, 2), slowdown
                   FROM jobs WHERE name LIKE '%-r$run' ORDER BY created_at, seq" >"$dir/real-r$run.txt"
done
if [[ -n ${KEEP:-} ]]; then
    mkdir -p "$KEEP"
    cp "$dir"/{calibration.jsonl,plain.jsonl,no-host.jsonl} "$dir"/validate-r*.jsonl "$dir"/sim-*r*.txt "$KEEP/"
    cp "$dir"/real-r*.txt "$dir"/{cal-jobs.txt,cal-progress.txt,cal-profiles.txt} "$KEEP/"
    # the real jobs' timelines (s from their run's first submission), where they ran,
    # and their progress reports
    psql_q "$url" "SELECT j.name, w.name, round(extract(epoch FROM j.created_at - f.t0)::numeric, 2),
                          round(extract(epoch FROM j.scheduled_at - f.t0)::numeric, 2),
                          round(extract(epoch FROM j.started_at - f.t0)::numeric, 2),
                          round(extract(epoch FROM j.finished_at - f.t0)::numeric, 2)
                   FROM jobs j JOIN groups g ON g.id = j.group_id LEFT JOIN workers w ON w.id = g.worker_id,
                        LATERAL (SELECT min(created_at) AS t0 FROM jobs k
                                 WHERE k.name LIKE '%-' || split_part(j.name, '-', 3)) f
                   WHERE j.name NOT LIKE 'cal%' ORDER BY j.created_at, j.seq" >"$KEEP/real-times.txt"
    psql_q "$url" "SELECT j.name, x.step, extract(epoch FROM x.recorded_at)
                   FROM job_metrics x JOIN jobs j ON j.id = x.job_id
                   WHERE j.name NOT LIKE 'cal%' AND x.loss IS NOT NULL ORDER BY j.seq, x.step" \
        >"$KEEP/real-progress.txt"
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
/usr/bin/python3 - "$dir" "$runs" <<'PY'
import sys
d, runs = sys.argv[1], int(sys.argv[2])
def real(r):
    rows = [l.split('|') for l in open('%s/real-r%d.txt' % (d, r)).read().split('\n') if l]
    return [(n.rsplit('-', 1)[0], float(t)) for n, t, _ in rows]
def sim(path, n):
    out = []
    for l in open(path):
        f = l.split()
        if len(f) == 8 and f[0].isdigit():
            out.append(float(f[6]) - float(f[4]))  # finished - submitted
    assert len(out) == n, (len(out), n)
    return out
def errors(v, ref):
    return [abs(x / y - 1) for x, y in zip(v, ref)]
def summary(label, e):
    print('%-10s mean |sim/real - 1| %5.1f%%, max %5.1f%%; every job within 15%%: %s'
          % (label, 100 * sum(e) / len(e), 100 * max(e), 'yes' if max(e) <= 0.15 else 'NO'))
reals = [real(r) for r in range(1, runs + 1)]
for r, rl in enumerate(reals, 1):
    n = len(rl)
    a, b, c = (sim('%s/%s-r%d.txt' % (d, k, r), n) for k in ('sim-plain', 'sim', 'sim-no-host'))
    t = [x for _, x in rl]
    print('run %d of %d: completion time (s): real, and the simulator with step times only /'
          % (r, runs))
    print('calibrated / calibrated without host interference')
    print('%-8s %7s %10s %6s %10s %6s %10s %6s'
          % ('job', 'real', 'step only', 'ratio', 'calibrated', 'ratio', 'no host', 'ratio'))
    for (name, y), x, u, z in zip(rl, a, b, c):
        print('%-8s %7.1f %10.1f %6.3f %10.1f %6.3f %10.1f %6.3f'
              % (name, y, x, x / y, u, u / y, z, z / y))
    for label, v in (('step only', a), ('calibrated', b), ('no host', c)):
        summary(label, errors(v, t))
    print()
if runs > 1:
    # reality against itself: the same jobs, the same cluster, minutes apart
    print('reality against itself: each job\'s completion time in every run over its mean')
    names = [n for n, _ in reals[0]]
    print('%-8s %s %8s' % ('job', ' '.join('%7s' % ('run %d' % r) for r in range(1, runs + 1)),
                           'spread'))
    spread = []
    for i, name in enumerate(names):
        v = [rl[i][1] for rl in reals]
        m = sum(v) / len(v)
        spread.append(max(abs(x / m - 1) for x in v))
        print('%-8s %s %7.1f%%' % (name, ' '.join('%7.3f' % (x / m) for x in v), 100 * spread[-1]))
    print('largest |run/mean - 1| of a job: mean over jobs %.1f%%, max %.1f%%'
          % (100 * sum(spread) / len(spread), 100 * max(spread)))
PY
