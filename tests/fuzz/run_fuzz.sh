#!/bin/sh
# Runs a libFuzzer binary for a bounded time from a read-only seed corpus,
# writing new inputs to a temporary corpus that is removed afterwards.
# usage: run_fuzz.sh BINARY SEED_DIR SECONDS
set -eu
bin=$1 seeds=$2 secs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$bin" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=8192 -timeout=10 \
    -print_final_stats=1 "$work" "$seeds"
