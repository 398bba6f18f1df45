#!/usr/bin/env bash
# bench/fairshare/validate.sh [BUILD_DIR]
#
# Does the simulator predict reality?  Runs a small real cluster (fuseboxd
# with fair share every 2 s, two CPU workers of one device each, at most three
# arrays per device, fusion off so that every job is its own array) on a dozen
# Fashion-MNIST MLP jobs of four sizes submitted in three waves, then the same
# scenario in fusebox-sim, its step-time model calibrated from the real run:
# each model first trains alone for a few seconds (one at a time), which
# leaves its isolated step time in the server's profiles
# table; the simulator's profiles take those, the jobs are sized from them
# (about job_s seconds alone each), and the submission times are as they
# happened.  Prints each job's completion time
# (submission to finish) in both and their difference, and whether every job
# agrees within 15%.  Starts a throwaway PostgreSQL (scripts/lib/common.sh);
# BUILD_DIR (default build) must hold fuseboxd, fusebox-worker and
# fusebox-sim.  Run as root (or as a user that may run PostgreSQL's
# programs).  OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for the run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
[[ -x $build/sim/fusebox-sim ]] || { echo "build first: fusebox-sim is missing in $build" >&2; exit 2; }
# shellcheck source=../lib/cluster.sh
source "$root/bench/lib/cluster.sh"
bench_setup fairshare

# the models' hidden widths; each job is sized to about job_s seconds alone
hidden=(64 128 256 512)
job_s=8
period_ms=2000

db=fusebox_bench_fair
url=${FB_TMP_PG_URL%/*}/$db
pg_port=$(sed -E 's|.*:([0-9]+)/.*|\1|' <<<"$FB_TMP_PG_URL")
fb_as_pg "$FB_PG_BINDIR/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres "$db"
dir=$work/run
mkdir -p "$dir"
"$build/workers/fusebox-worker" --gen-key "$dir/worker.key" >/dev/null 2>&1
sed -n 's/^public: //p' "$dir/worker.key" >"$dir/worker-keys"
port=$(fb_free_port)
wport=$(fb_free_port)
"$build/server/fuseboxd" --database-url "$url" --data-dir "$dir" --port "$port" \
    --worker-listen "tcp://127.0.0.1:$wport" --max-array 1 --max-groups-per-device 3 \
    --rebalance-ms "$period_ms" --log-level warn 2>"$dir/fuseboxd.log" &
bench_pids+=($!)
for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
for w in 1 2; do
    "$build/workers/fusebox-worker" --server "tcp://127.0.0.1:$wport" \
        --server-key "$dir/server.key.pub" --key "$dir/worker.key" --name "fair-$w" \
        --cpu-devices 1 --threads-per-device 1 2>"$dir/worker-$w.log" &
    bench_pids+=($!)
done
api=http://127.0.0.1:$port
admin=$(cat "$dir/admin.key")
tenant=$(curl -fsS -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
    -d '{"name": "bench"}' "$api/v1/tenants" | json "d['id']")
key=$(curl -fsS -X POST -H "Authorization: Bearer $admin" "$api/v1/tenants/$tenant/keys" |
    json "d['key']")
sleep 1 # the workers register

# submit NAME MODEL STEPS: one job; prints its id
submit() {
    curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "{
      \"name\": \"$1\", \"dataset\": \"fashion-mnist\",
      \"model\": {\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"},
        {\"type\": \"linear\", \"out\": ${hidden[$2]}}, {\"type\": \"relu\"},
        {\"type\": \"linear\", \"out\": 10}]},
      \"batch_size\": 128, \"steps\": $3, \"eval_every\": $3, \"checkpoint_every\": $3,
      \"seed\": 1, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001}}" "$api/v1/jobs" |
        json "d['id']"
}
# profile_ms MODEL: the server's isolated step time of the model (B = 1), "" while none is warm
profile_ms() {
    psql_q "$url" "SELECT p.isolated_step_ms FROM profiles p WHERE p.warm AND p.n_models = 1
                   AND p.fusion_key = (SELECT fusion_key FROM jobs WHERE name = 'cal-m$1')"
}

# calibration, one model at a time (alone on its device, the other worker idle): the
# profiles table then holds every model's isolated step time
declare -a step_s steps
for pair in 0 1 2 3; do
    ids=()
    for m in $pair; do ids+=("$(submit "cal-m$m" "$m" 10000000)"); done
    for m in $pair; do
        for _ in $(seq 600); do [[ -n $(profile_ms "$m") ]] && break; sleep 0.1; done
    done
    sleep 4 # twenty more reports settle the profiles
    for id in "${ids[@]}"; do
        curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $key" "$api/v1/jobs/$id/cancel"
    done
    while [[ $(psql_q "$url" "SELECT count(*) FROM groups WHERE state <> 'finished'") != 0 ]]; do
        sleep 0.2
    done
done
for m in 0 1 2 3; do
    ms=$(profile_ms "$m")
    [[ -n $ms ]] || fb_die "model m$m was not profiled"
    step_s[m]=$(/usr/bin/python3 -c "print($ms / 1000)")
    steps[m]=$(/usr/bin/python3 -c "print(max(100, round($job_s / ${step_s[m]})))")
done

# three waves of one job per model, 5 s apart
for wave in 0 1 2; do
    for m in 0 1 2 3; do submit "m$m-w$wave" "$m" "${steps[m]}" >/dev/null; done
    [[ $wave == 2 ]] || sleep 5
done
while [[ $(psql_q "$url" "SELECT count(*) FROM jobs WHERE state IN ('queued', 'scheduled', 'running')") != 0 ]]; do
    sleep 1
    for p in "${bench_pids[@]}"; do kill -0 "$p" 2>/dev/null || fb_die "a process of the cluster exited (logs in $dir)"; done
done
[[ $(psql_q "$url" "SELECT count(*) FROM jobs WHERE state <> 'completed' AND name NOT LIKE 'cal-%'") == 0 ]] ||
    fb_die "not every job completed"

# the same scenario for the simulator, twice: step times from the profiles (a step alone,
# wall clock), and from the busy part of the steps the jobs reported while they shared
# (compute and I/O: what a step holds the device for; a CPU worker's step also has work
# outside its device turn, which overlaps the other arrays' turns)
declare -a busy_s
for m in 0 1 2 3; do
    busy_s[m]=$(psql_q "$url" "
      SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.compute_ms + x.io_ms) / 1000
      FROM job_metrics x JOIN jobs j ON j.id = x.job_id
      WHERE j.name LIKE 'm$m-w%' AND x.compute_ms IS NOT NULL")
done
# scenario FILE STEP_S...: writes the scenario with these step times
scenario() {
    local f=$1 m
    shift
    {
        echo "{\"type\": \"sim\", \"name\": \"validate\", \"period_s\": $((period_ms / 1000)), \"plan_gap_s\": 0.05, \"max_b\": 1, \"max_groups_per_device\": 3}"
        echo '{"type": "devices", "count": 2, "per_worker": 1, "kind": "cpu", "memory_gib": 64}'
        echo '{"type": "tenant", "name": "bench"}'
        for m in 0 1 2 3; do
            echo "{\"type\": \"profile\", \"name\": \"m$m\", \"step_s\": $1, \"batch\": 128, \"kind\": \"cpu\", \"member_gib\": 0.05, \"shared_gib\": 0.01}"
            shift
        done
        psql_q "$url" "SELECT format('{\"type\": \"job\", \"at\": %s, \"tenant\": \"bench\", \"profile\": \"%s\", \"steps\": %s}',
                         round(extract(epoch FROM created_at - min(created_at) OVER ())::numeric, 3),
                         split_part(name, '-', 1), steps) FROM jobs WHERE name NOT LIKE 'cal-%'
                       ORDER BY created_at, seq"
    } >"$f"
}
scenario "$dir/profiles.jsonl" "${step_s[@]}"
scenario "$dir/busy.jsonl" "${busy_s[@]}"
"$build/sim/fusebox-sim" --jobs "$dir/profiles.jsonl" >"$dir/sim.txt"
"$build/sim/fusebox-sim" --jobs "$dir/busy.jsonl" >"$dir/sim-busy.txt"

echo "Fair-share validation, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores (shared with other work);"
echo "fuseboxd --rebalance-ms $period_ms --max-array 1 --max-groups-per-device 3, 2 CPU workers x 1 device;"
echo "12 Fashion-MNIST MLP jobs (784-H-10, batch 128) in 3 waves 5 s apart. OPENBLAS_CORETYPE and"
echo "OPENBLAS_L2_SIZE unset.  command: bench/fairshare/validate.sh ${build#"$root"/}"
for m in 0 1 2 3; do
    printf 'model m%d: H=%d, %d steps, step alone %.2f ms (profile), busy part shared %.2f ms\n' \
        "$m" "${hidden[m]}" "${steps[m]}" "$(/usr/bin/python3 -c "print(${step_s[m]} * 1000)")" \
        "$(/usr/bin/python3 -c "print(${busy_s[m]} * 1000)")"
done
echo
psql_q "$url" "SELECT name, round(extract(epoch FROM finished_at - created_at)::numeric, 2), slowdown
               FROM jobs WHERE name NOT LIKE 'cal-%' ORDER BY created_at, seq" >"$dir/real.txt"
/usr/bin/python3 - "$dir/real.txt" "$dir/sim.txt" "$dir/sim-busy.txt" <<'PY'
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
a, b = sim(sys.argv[2]), sim(sys.argv[3])
print('completion time (s): real, and the simulator calibrated by profiles / by busy part')
print('%-8s %9s %9s %9s %9s %9s' % ('job', 'real', 'profiles', 'ratio', 'busy', 'ratio'))
for (name, done, _), x, y in zip(real, a, b):
    r = float(done)
    print('%-8s %9.1f %9.1f %9.3f %9.1f %9.3f' % (name, r, x, x / r, y, y / r))
for label, v in (('profiles', a), ('busy part', b)):
    e = [abs(x / float(d) - 1) for (_, d, _), x in zip(real, v)]
    print('%-10s mean |sim/real - 1| %5.1f%%, max %5.1f%%; every job within 15%%: %s'
          % (label, 100 * sum(e) / len(e), 100 * max(e), 'yes' if max(e) <= 0.15 else 'NO'))
PY
