#!/usr/bin/env bash
# bench/api/run.sh [BUILD_DIR]: fuseboxd's API against the database's limit.
#
# Starts a throwaway, durable PostgreSQL 15 (default settings: fsync,
# synchronous_commit and full_page_writes on) and fuseboxd from BUILD_DIR
# (default build/) on loopback, then measures side by side, alternating,
# FUSEBOX_BENCH_RUNS times (default 3) for FUSEBOX_BENCH_SECONDS each
# (default 8), and prints medians:
#   - durable POST /v1/jobs per second (wrk, 64 connections) next to
#     bench_api_raw, a raw libpq INSERT+COMMIT loop into the same jobs table
#     of the same database with as many connections as fuseboxd's pool
#     (FUSEBOX_BENCH_POOL, default one per core, fuseboxd's default): the
#     limit; target ratio >= 0.5;
#   - GET /v1/jobs/{id} per second and its p99 latency with 64 connections;
#     target p99 <= 20 ms; next to it GET /healthz's p99 under the same load,
#     which never touches the database: the floor this machine allows.
# Needs wrk, curl, python3 and the PostgreSQL server binaries; run as root
# (PostgreSQL then runs as postgres) or as a user who may run initdb.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$root/bench/api
build=${1:-$root/build}
runs=${FUSEBOX_BENCH_RUNS:-3}
secs=${FUSEBOX_BENCH_SECONDS:-8}
pool=${FUSEBOX_BENCH_POOL:-$(nproc)}
conns=64
pgbin=/usr/lib/postgresql/15/bin

die() { printf 'bench/api: %s\n' "$*" >&2; exit 1; }
for tool in wrk curl python3; do command -v "$tool" >/dev/null || die "$tool is missing (apt-get install $tool)"; done
[[ -x $pgbin/initdb ]] || die "$pgbin/initdb is missing (apt-get install postgresql)"
[[ -x $build/server/fuseboxd && -x $build/bench/api/bench_api_raw ]] ||
    die "build fuseboxd and bench_api_raw in $build first (cmake --build $build --target fuseboxd bench_api_raw)"

tmp=$(mktemp -d /tmp/fusebox-bench-api.XXXXXX)
server_pid=""
as_pg() { if ((EUID == 0)); then (cd / && runuser -u postgres -- "$@"); else (cd / && "$@"); fi; }
cleanup() {
    [[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
    as_pg "$pgbin/pg_ctl" -D "$tmp/pg" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf -- "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }

if ((EUID == 0)); then chown postgres:postgres "$tmp"; fi
as_pg "$pgbin/initdb" -D "$tmp/pg" -U postgres -A trust -E UTF8 --no-locale >"$tmp/initdb.log" 2>&1 ||
    { cat "$tmp/initdb.log"; die "initdb failed"; }
cat >>"$tmp/pg/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 100
shared_buffers = 256MB
CONF
pg_port=$(free_port)
as_pg "$pgbin/pg_ctl" -D "$tmp/pg" -l "$tmp/pg.log" -w -o "-p $pg_port" start >/dev/null
db="host=127.0.0.1 port=$pg_port user=postgres dbname=postgres"

mkdir -p "$tmp/data"
"$build/server/fuseboxd" --database-url "$db" --data-dir "$tmp/data" --port 0 \
    --port-file "$tmp/port" --db-pool "$pool" --threads "$pool" --log-level warn \
    --max-connections 1024 2>"$tmp/fuseboxd.log" &
server_pid=$!
for _ in $(seq 200); do [[ -s $tmp/port ]] && break; sleep 0.05; done
[[ -s $tmp/port ]] || { cat "$tmp/fuseboxd.log"; die "fuseboxd did not start"; }
url=http://127.0.0.1:$(cat "$tmp/port")
admin=$(cat "$tmp/data/admin.key")

json() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }
tenant=$(curl -sf -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
    -d '{"name": "bench", "quotas": {"max_queued_jobs": 10000000},
         "rate_limit": {"requests_per_second": 1000000, "burst": 1000000}}' \
    "$url/v1/tenants" | json '["id"]')
key=$(curl -sf -X POST -H "Authorization: Bearer $admin" "$url/v1/tenants/$tenant/keys" | json '["key"]')
export FUSEBOX_BENCH_KEY=$key FUSEBOX_BENCH_SPEC=$here/spec.json

# wrk_run ARGS...: prints "<requests/s> <p99 ms> <non-2xx>"
wrk_run() {
    wrk "$@" >"$tmp/wrk.out" 2>&1 || { cat "$tmp/wrk.out"; die "wrk failed"; }
    python3 - "$tmp/wrk.out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\b", text, re.M)
scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
p99_ms = float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan")
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errs = re.search(r"Socket errors:.*", text)
print(f"{rps:.1f} {p99_ms:.3f} {int(bad.group(1)) if bad else 0}")
if errs: print(errs.group(0), file=sys.stderr)
PY
}

printf 'bench/api: %s, %s cores, load %s, pool %s, %s x %ss\n' "$(date -u +%FT%TZ)" "$(nproc)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "$pool" "$runs" "$secs" >&2
post=() raw=()
for i in $(seq "$runs"); do
    read -r rps _ bad < <(wrk_run -t2 -c$conns -d${secs}s -s "$here/post_job.lua" "$url/v1/jobs")
    ((bad == 0)) || die "POST run $i: $bad responses were not 2xx"
    post+=("$rps")
    r=$("$build/bench/api/bench_api_raw" "$db" "$tenant" "$here/spec.json" "$pool" "$secs" |
        awk '/raw_inserts_per_s/ {print $2}')
    raw+=("$r")
    printf '  run %d: POST %s/s, raw INSERT+COMMIT %s/s\n' "$i" "$rps" "$r" >&2
done
job=$(curl -sf -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    --data @"$here/spec.json" "$url/v1/jobs" | json '["id"]')
get=() p99=()
for i in $(seq "$runs"); do
    read -r rps lat bad < <(wrk_run -t2 -c$conns -d${secs}s --latency -s "$here/get_job.lua" "$url/v1/jobs/$job")
    ((bad == 0)) || die "GET run $i: $bad responses were not 2xx"
    get+=("$rps") p99+=("$lat")
    printf '  run %d: GET %s/s, p99 %s ms\n' "$i" "$rps" "$lat" >&2
done
# the machine's floor: the same load on a route that never touches the database
floor=()
for i in $(seq "$runs"); do
    read -r _ lat bad < <(wrk_run -t2 -c$conns -d${secs}s --latency "$url/healthz")
    floor+=("$lat")
    printf '  run %d: GET /healthz p99 %s ms\n' "$i" "$lat" >&2
done
jobs_in_db=$(curl -sf -H "Authorization: Bearer $admin" "$url/v1/cluster" | json '["jobs"]["queued"]')

python3 - "${post[*]}" "${raw[*]}" "${get[*]}" "${p99[*]}" "${floor[*]}" "$pool" "$conns" "$jobs_in_db" <<'PY'
import statistics, sys
post, raw, get, p99, floor = ([float(x) for x in a.split()] for a in sys.argv[1:6])
pool, conns, queued = sys.argv[6], sys.argv[7], sys.argv[8]
m = statistics.median
print(f"| measure (median of {len(post)}) | fuseboxd | reference | ratio | target |")
print("|---|---|---|---|---|")
print(f"| durable POST /v1/jobs per s ({conns} conns, pool {pool}) vs raw libpq INSERT+COMMIT ({pool} conns) "
      f"| {m(post):.0f} | {m(raw):.0f} | {m(post)/m(raw):.2f} | >= 0.5 |")
print(f"| GET /v1/jobs/{{id}} per s ({conns} conns) | {m(get):.0f} | | | |")
print(f"| GET /v1/jobs/{{id}} p99 latency, ms ({conns} conns) vs the 20 ms target | {m(p99):.2f} | 20 | {m(p99)/20:.2f} | <= 1.0 |")
print(f"| the same vs GET /healthz p99 (no database: the loaded machine's floor) | {m(p99):.2f} | {m(floor):.2f} | {m(p99)/m(floor):.1f} | |")
print(f"\n(jobs queued at the end: {queued})")
PY
