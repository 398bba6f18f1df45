# shellcheck shell=bash
# shellcheck disable=SC2154 # root and build come from the caller, work from bench_setup
# What bench/fairshare/calibrate.sh and validate.sh share: the small real
# cluster both run on (fuseboxd with fair share every 2 s, two CPU workers of
# one device each, at most three arrays per device, fusion off so that every
# job is its own array), job submission, and the calibration that measures
# the simulator's cost model on it.  Sourced after bench/lib/cluster.sh's
# bench_setup; the caller sets `set -euo pipefail`, root and build.

# the models' hidden widths (784-H-10 MLPs on Fashion-MNIST)
hidden=(64 128 256 512)
period_ms=2000
# The cluster (PostgreSQL, fuseboxd, the workers) runs at this niceness, so
# that other work on a shared machine disturbs what is measured less.  Only
# root may raise a priority; for anyone else nice says so and the processes
# run at the usual one.
fair_nice=${FAIR_NICE:--15}

# fair_cluster: a fresh database, fuseboxd and the two workers.  Sets url, api,
# dir and key as bench_cluster does.
fair_cluster() {
    local db pg_port port wport admin tenant w pg_pid
    # the database's server and its processes; backends it starts later inherit it
    pg_pid=$(head -n 1 "$FB_TMP_PG_DIR/data/postmaster.pid")
    # shellcheck disable=SC2046 # one pid a word
    renice -n "$fair_nice" -p "$pg_pid" $(pgrep -P "$pg_pid") >/dev/null 2>&1 ||
        fb_warn "the cluster runs at the usual priority (renice refused)"
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
    nice -n "$fair_nice" "$build/server/fuseboxd" --database-url "$url" --data-dir "$dir" --port "$port" \
        --worker-listen "tcp://127.0.0.1:$wport" --max-array 1 --max-groups-per-device 3 \
        --rebalance-ms "$period_ms" --log-level warn 2>"$dir/fuseboxd.log" &
    bench_pids+=($!)
    for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
    for w in 1 2; do
        nice -n "$fair_nice" "$build/workers/fusebox-worker" --server "tcp://127.0.0.1:$wport" \
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
}

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

# fair_running ID: until the job trains (its placement is then recorded).
fair_running() {
    for _ in $(seq 600); do
        [[ $(psql_q "$url" "SELECT state IN ('running', 'completed') FROM jobs WHERE id = '$1'") == t ]] &&
            return 0
        sleep 0.1
    done
    fb_die "job $1 did not start training within a minute"
}

# fair_wait: until no job waits or trains, checking that the cluster lives.
fair_wait() {
    local p
    while [[ $(psql_q "$url" "SELECT count(*) FROM jobs WHERE state IN ('queued', 'scheduled', 'running')") != 0 ]]; do
        sleep 0.5
        for p in "${bench_pids[@]}"; do
            kill -0 "$p" 2>/dev/null || fb_die "a process of the cluster exited (logs in $dir)"
        done
    done
    # the groups too: an array holds its device until its end is recorded
    while [[ $(psql_q "$url" "SELECT count(*) FROM groups WHERE state <> 'finished'") != 0 ]]; do
        sleep 0.2
    done
}

# fair_calibrate OUT PLAIN: measures the cost model on calibration jobs (names cal-*)
# and writes it to OUT as scenario records: one profile per model (step time
# alone, start and end cost, and the step time alone that fuseboxd's profiles
# table holds, which its controller acts on), the host's interference and the
# sim record's dispatch latency and cost of taking turns on a device.  Sets step_s (the models' step times alone as
# fuseboxd profiled them, s; they size jobs).  The phases, each on an idle cluster:
#   0. each model trains alone until fuseboxd's profiles table holds its
#      isolated step time (which sizes the jobs below, and which the validation
#      then reuses, as fuseboxd would), then is cancelled;
#   A. each model alone, one job of about cal_s seconds to the end;
#   B. two models side by side, one on each worker (m0 with m3, m1 with m2);
#   C. the four models at once, two arrays on each device;
#   D. six arrays at once (m0, m1, m2 twice), three on each device.
# In B, C and D each job is submitted once the one before trains, so that the
# planner sees where that one went and the arrays spread over the devices.
# PLAIN gets the same profiles with their step times only.
# bench/fairshare/calibrate.py turns the jobs' times and progress reports into
# the parameters.
fair_calibrate() {
    local out=$1 plain=$2 m id ms cal_s=8 pair
    profile_ms() {
        psql_q "$url" "SELECT p.isolated_step_ms FROM profiles p WHERE p.warm AND p.n_models = 1
                       AND p.fusion_key = (SELECT fusion_key FROM jobs WHERE name = 'cal0-m$1')"
    }
    declare -ga step_s=()
    for m in 0 1 2 3; do
        id=$(submit "cal0-m$m" "$m" 10000000)
        for _ in $(seq 600); do [[ -n $(profile_ms "$m") ]] && break; sleep 0.1; done
        sleep 4 # twenty more reports settle the profile
        curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $key" "$api/v1/jobs/$id/cancel"
        fair_wait
        ms=$(profile_ms "$m")
        [[ -n $ms ]] || fb_die "model m$m was not profiled"
        step_s[m]=$(/usr/bin/python3 -c "print($ms / 1000)")
    done
    # cal_steps MODEL SECONDS: steps of about SECONDS alone
    cal_steps() { /usr/bin/python3 -c "print(max(50, round($2 / ${step_s[$1]})))"; }
    for m in 0 1 2 3; do
        submit "calA-m$m" "$m" "$(cal_steps "$m" $cal_s)" >/dev/null
        fair_wait
    done
    for pair in "0 3" "1 2"; do
        for m in $pair; do fair_running "$(submit "calB-m$m" "$m" "$(cal_steps "$m" $cal_s)")"; done
        fair_wait
    done
    # two arrays to a device, each about 2 cal_s alone so that they share for a while
    for m in 0 1 2 3; do
        fair_running "$(submit "calC-m$m" "$m" "$(cal_steps "$m" $((2 * cal_s)))")"
    done
    fair_wait
    # three arrays to a device (m0, m1, m2 twice over: calD and calE), each about 3 cal_s
    # alone, so that the three on a device share for a while
    for m in 0 1 2; do
        fair_running "$(submit "calD-m$m" "$m" "$(cal_steps "$m" $((3 * cal_s)))")"
        fair_running "$(submit "calE-m$m" "$m" "$(cal_steps "$m" $((3 * cal_s)))")"
    done
    fair_wait
    psql_q "$url" "SELECT j.name, j.steps, extract(epoch FROM j.created_at), extract(epoch FROM j.scheduled_at),
                          extract(epoch FROM j.started_at), extract(epoch FROM j.finished_at),
                          w.name, j.state
                   FROM jobs j JOIN groups g ON g.id = j.group_id LEFT JOIN workers w ON w.id = g.worker_id
                   WHERE j.name LIKE 'cal_-%' ORDER BY j.seq" >"$dir/cal-jobs.txt"
    psql_q "$url" "SELECT j.name, x.step, extract(epoch FROM x.recorded_at)
                   FROM job_metrics x JOIN jobs j ON j.id = x.job_id
                   WHERE j.name LIKE 'cal_-%' AND x.loss IS NOT NULL ORDER BY j.seq, x.step" >"$dir/cal-progress.txt"
    # what fuseboxd's controller will take for each model's step time alone
    psql_q "$url" "SELECT split_part(j.name, '-', 2), p.isolated_step_ms / 1000
                   FROM profiles p JOIN jobs j ON j.fusion_key = p.fusion_key
                   WHERE j.name LIKE 'cal0-%' AND p.n_models = 1 ORDER BY j.seq" >"$dir/cal-profiles.txt"
    /usr/bin/python3 "$root/bench/fairshare/calibrate.py" "$dir/cal-jobs.txt" "$dir/cal-progress.txt" \
        "$dir/cal-profiles.txt" "$(nproc)" "$out" "$plain"
}
