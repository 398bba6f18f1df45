#!/bin/sh
# Runs a libFuzzer binary in one of two modes.
#
#   run_fuzz.sh replay BINARY CORPUS_DIR ARTIFACT_DIR
#       Runs every input of the committed corpus once (-runs=0), in order, and
#       nothing else: deterministic, so it gates.  A crash leaves its input
#       under ARTIFACT_DIR and prints the path and the command that replays it.
#   run_fuzz.sh explore BINARY CORPUS_DIR ARTIFACT_DIR SECONDS
#       Mutates from the corpus for SECONDS (a seed printed for a rerun), new
#       inputs going to a temporary corpus that is removed afterwards; crash
#       inputs are kept under ARTIFACT_DIR with their paths printed.  Its
#       findings are reported, not gated (scripts/test runs it apart).
set -eu
mode=$1 bin=$2 corpus=$3 art=$4
mkdir -p "$art"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
common="-rss_limit_mb=2048 -max_len=8192 -timeout=10 -artifact_prefix=$art/"
report() {
    rc=$1
    found=$(find "$art" -type f -newer "$work" 2>/dev/null || true)
    if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
        echo "fuzz: $(basename "$bin") failed (exit $rc); inputs kept:"
        for f in $found; do echo "  $f"; echo "  replay: $bin $f"; done
        [ "$rc" -ne 0 ] || rc=1
    fi
    exit "$rc"
}
case $mode in
replay)
    n=$(find "$corpus" -type f | wc -l)
    [ "$n" -gt 0 ] || { echo "fuzz: no corpus in $corpus"; exit 1; }
    set +e
    # shellcheck disable=SC2086
    "$bin" -runs=0 $common "$work" "$corpus"
    rc=$?
    set -e
    [ "$rc" -eq 0 ] && echo "fuzz: $(basename "$bin") replayed $n corpus inputs"
    report "$rc"
    ;;
explore)
    secs=$5
    seed=${FUSEBOX_FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
    echo "fuzz: exploring for $secs s with -seed=$seed (FUSEBOX_FUZZ_SEED=$seed repeats the run)"
    set +e
    # shellcheck disable=SC2086
    "$bin" -seed="$seed" -max_total_time="$secs" -print_final_stats=1 $common "$work" "$corpus"
    rc=$?
    set -e
    report "$rc"
    ;;
*)
    echo "usage: run_fuzz.sh replay|explore BINARY CORPUS_DIR ARTIFACT_DIR [SECONDS]" >&2
    exit 2
    ;;
esac
