#!/usr/bin/env bash
# bench/api/dashboards.sh [BUILD_DIR] [DASHBOARDS] [SECONDS] [RUNS]
#
# What DASHBOARDS (default 100) open dashboards cost fuseboxd, with and
# without conditional reads (ETag / If-None-Match, docs/api.md): fuseboxd and
# one CPU worker on a throwaway PostgreSQL (bench/lib/cluster.sh) train a
# 16-trial sweep to its end, then bench/api/dashboards.py polls as that many
# dashboards do (the jobs list, the cluster, one job, every 2 s), alternating
# plain and conditional runs, RUNS (default 3) of SECONDS (default 20) each,
# and prints requests per second, response bytes, the share of 304s and the
# CPU fuseboxd and PostgreSQL spend, side by side.  The jobs are finished,
# as on dashboards left open: while an array trains its job's answer changes
# with each progress report, and those reads are whole answers either way.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
boards=${2:-100}
secs=${3:-20}
runs=${4:-3}
# shellcheck source=../lib/cluster.sh
source "$root/bench/lib/cluster.sh"
bench_setup dashboards

bench_cluster dashboards 16
# shellcheck disable=SC2154 # api, dir, key, url: set by bench_cluster
# the dashboards' polls are many more requests a second than a tenant's default allows
tenant=$(curl -fsS -H "Authorization: Bearer $key" "$api/v1/tenant" | json "d['id']")
curl -fsS -X PATCH -H "Authorization: Bearer $(cat "$dir/admin.key")" \
    -H 'Content-Type: application/json' \
    -d '{"rate_limit": {"requests_per_second": 100000, "burst": 100000}}' \
    "$api/v1/tenants/$tenant" >/dev/null
curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d '{
  "name": "dash", "base": {"dataset": "fashion-mnist",
    "model": {"input": [1, 28, 28], "layers": [{"type": "flatten"},
      {"type": "linear", "out": 64}, {"type": "relu"}, {"type": "linear", "out": 10}]},
    "batch_size": 64, "steps": 100, "eval_every": 50, "optimizer": {"type": "adamw", "lr": 0.001}},
  "search": {"type": "random", "count": 16, "seed": 1,
    "params": {"optimizer.lr": {"distribution": "log_uniform", "low": 1e-4, "high": 1e-2}}}}' \
    "$api/v1/sweeps" >/dev/null
bench_wait
job=$(psql_q "$url" "SELECT id FROM jobs ORDER BY created_at LIMIT 1")

echo "Dashboards benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg);" \
     "$boards dashboards, $runs x ${secs} s per mode, 16 finished jobs"
echo "command: bench/api/dashboards.sh ${build#"$root"/} $boards $secs $runs"
echo
/usr/bin/python3 "$root/bench/api/dashboards.py" "$api" "$key" "$job" "${bench_pids[-2]}" \
    --dashboards "$boards" --seconds "$secs" --runs "$runs"
bench_stop
