#!/usr/bin/env bash
# bench/reliability/run.sh [BUILD_DIR] [TEST ...]
#
# The reliability suite's long modes (issue 13, faults and load): each test
# of tests/reliability/faults and tests/reliability/load runs with --long
# (20 rounds of SIGKILL on a worker, 10 on fuseboxd, a 10 s PostgreSQL
# outage, 50 dataset imports into a full disk, 100 running arrays over
# 10,000 queued jobs) and prints a "result:" line of counts; this script
# collects them into the table of docs/RELIABILITY.md, one row per test with
# its exit status.  TEST names (e.g. test_rel_worker_kill) pick a subset; the
# default is all of them.
#
# BUILD_DIR (default build) must hold the tests, fuseboxd, fusebox-worker,
# fusebox-train and fusebox-data.  Uses FUSEBOX_TEST_DATABASE_URL when set,
# else starts a throwaway PostgreSQL (scripts/lib/common.sh) and stops it at
# the end.  The disk-full and network tests need root (mount, ip netns) and
# report "skipped" without it.  FUSEBOX_RELIABILITY_SEED repeats a run's
# random choices.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
shift || true
tests=("$@")
if [[ ${#tests[@]} -eq 0 ]]; then
    tests=(test_rel_worker_kill test_rel_server_kill test_rel_pg_outage test_rel_disk_full
           test_rel_disk_full_import test_rel_netsplit test_rel_load)
fi
# shellcheck source=../../scripts/lib/common.sh
source "$root/scripts/lib/common.sh"
if [[ -z ${FUSEBOX_TEST_DATABASE_URL:-} ]]; then
    fb_pg_throwaway_start
    trap fb_pg_throwaway_stop EXIT
    export FUSEBOX_TEST_DATABASE_URL=$FB_TMP_PG_URL
fi
export FB_BINARY_DIR=$build FB_SOURCE_DIR=$root

logs=$(mktemp -d /tmp/fusebox-reliability.XXXXXX)
echo "Reliability suite, long modes, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
echo "command: bench/reliability/run.sh ${build#"$root"/} ${tests[*]}"
echo "logs: $logs"
echo
echo "| test | exit | result |"
echo "|---|---|---|"
status=0
for t in "${tests[@]}"; do
    exe=$(find "$build/tests/reliability" -type f -name "$t" -perm -u+x | head -n 1)
    if [[ -z $exe ]]; then
        echo "| $t | missing | build it first: make -C $build $t |"
        status=1
        continue
    fi
    args=(--long)
    # the PostgreSQL outage is the dispatch suite's restart test with a longer outage
    [[ $t == test_rel_pg_outage ]] && args=(--outage-ms 10000)
    rc=0
    "$exe" "${args[@]}" >"$logs/$t.log" 2>&1 || rc=$?
    line=$(grep -a '^result:' "$logs/$t.log" | tail -n 1 | sed 's/^result: //' || true)
    if [[ $rc -eq 77 ]]; then
        line="skipped: $(grep -a 'SKIPPED' "$logs/$t.log" | head -n 1 || true)"
    elif [[ $rc -ne 0 ]]; then
        status=1
    fi
    echo "| $t | $rc | ${line:-no result line; see $logs/$t.log} |"
done
exit $status
