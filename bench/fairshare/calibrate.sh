#!/usr/bin/env bash
# bench/fairshare/calibrate.sh [BUILD_DIR] [OUT]
#
# Measures the simulator's cost model on a small real cluster (fuseboxd with
# fair share every 2 s, two CPU workers of one device each; bench/fairshare/
# lib.sh): each model's step time alone, an array's start cost (placement to
# steady stepping) and end cost (last step to recorded completion), the
# control loop's dispatch latency, the step-time inflation of two busy devices
# on this host (with one and with two arrays on each device), and the step
# times alone that fuseboxd stored as profiles, which its controller acts on.
# Writes them as scenario records to OUT (default calibration.jsonl), to be
# read before a scenario that names host "local" and profiles m0..m3, and the
# jobs' times, progress reports and fuseboxd's profiles it took them from
# beside it (OUT without .jsonl, then -jobs.txt, -progress.txt and
# -profiles.txt):
#
#   fusebox-sim --jobs calibration.jsonl my-scenario.jsonl
#
# bench/fairshare/validate.sh runs the same calibration before it compares
# the simulator with the real cluster.  Starts a throwaway PostgreSQL
# (scripts/lib/common.sh); BUILD_DIR (default build) must hold fuseboxd and
# fusebox-worker.  Run as root (or as a user that may run PostgreSQL's
# programs).  OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for the run,
# and the cluster runs at niceness FAIR_NICE (default -15; lib.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
out=$(realpath -m "${2:-calibration.jsonl}")
mkdir -p "$(dirname "$out")"
# shellcheck source=../lib/cluster.sh
source "$root/bench/lib/cluster.sh"
# shellcheck source=lib.sh
source "$root/bench/fairshare/lib.sh"
bench_setup fairshare
fair_cluster
fair_calibrate "$out" "$dir/plain.jsonl"
# the raw measurements beside it, for bench/fairshare/calibrate.py to read again
cp "$dir/cal-jobs.txt" "${out%.jsonl}-jobs.txt"
cp "$dir/cal-progress.txt" "${out%.jsonl}-progress.txt"
cp "$dir/cal-profiles.txt" "${out%.jsonl}-profiles.txt"
cat "$out"
