#!/usr/bin/env bash
# Fused arrays against solo training and PyTorch, side by side in one run.
#
# For the MLP (784-256-128-10) and the small CNN of fusion_bench.c, batch 128,
# B = 1 2 4 8 16 32 and 1 and 2 threads, measures samples x models per second
# of (1) a fusebox fused array of B, (2) the same B jobs trained one after
# another in fusebox, (3) the same in PyTorch, (4) PyTorch fused by hand as
# HFTA does it; the fused array's training FLOP rate against OpenBLAS SGEMM
# (n = 2048) measured in the same run; and peak RSS of a fused array of 16
# against 16 solo processes.  MODELS=charlm measures the byte-level language
# model of fusion_bench.c (T = 64, D = 128, 2 blocks of 4 heads, batch 32,
# Adam) instead, at B = LM_BS ("1 8"), on the built-in licence corpus that
# fusebox-data imports here, the same minibatches for fusebox and PyTorch.  Every figure is the median of REPS repetitions;
# the repetitions are interleaved (each one runs every configuration once),
# so a load change on this shared machine hits all of them alike.
#
# usage: bench/fusion/run.sh [BUILD_DIR]
#   env: REPS (5), BS ("1 2 4 8 16 32"), THREADS ("1 2"), MODELS ("mlp cnn"; or "charlm"),
#        WINDOW (8: fusebox trains windows of that many steps, as fusebox-train and the
#        worker do, fb_train_opts.window; 1: one step at a time),
#        LM_BS ("1 8"), LM_WORK (16), LM_WARMUP (1),
#        RAW (file to keep the raw lines in; default a temporary file)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-perf}
bench=$build/bench/fusion/fusion_bench
[ -x "$bench" ] || { echo "run.sh: $bench is not built" >&2; exit 1; }
py=/usr/bin/python3
reps=${REPS:-5}
bs=${BS:-1 2 4 8 16 32}
threads=${THREADS:-1 2}
models=${MODELS:-mlp cnn}
window=${WINDOW:-8}
raw=${RAW:-$(mktemp)}
: > "$raw"
blist_of() { [ "$1" = charlm ] && echo ${LM_BS:-1 8} | tr ' ' ',' || echo $bs | tr ' ' ','; }
data_args=()
case " $models " in
*" charlm "*)
    data=$(mktemp -d)
    trap 'rm -rf "$data"' EXIT
    "$build/workers/data/fusebox-data" import text --builtin licenses --context 64 \
        --out "$data/licenses" --name licenses --split train > /dev/null
    "$bench" tokens --data "$data/licenses" --out "$data/tokens.bin"
    data_args=(--data "$data/licenses")
    tokens_args=(--data "$data/tokens.bin")
    ;;
esac

# This machine sets both for OpenBLAS, and they slow it; every command of
# this benchmark (fusebox, PyTorch and the SGEMM reference alike) runs without.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
# glibc hands out blocks above 128 KiB..32 MiB as fresh mmap'd pages and trims
# the heap on free: PyTorch's per-step activations then page-fault every step,
# which this VM makes expensive (the CNN trains ~4x slower).  Every command
# runs with both thresholds raised, so PyTorch is measured at its best;
# fusebox allocates nothing in a step and is unaffected.  One extra PyTorch
# solo run with glibc's defaults shows what a user gets without this.
export MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483647

# Timed work per configuration, in member-steps (steps x members; at least 2
# timed steps), and untimed warm-up steps per array or job.
work_of() {
    case $1 in
    mlp) echo "${MLP_WORK:-256} ${MLP_WARMUP:-3}" ;;
    cnn) echo "${CNN_WORK:-24} ${CNN_WARMUP:-1}" ;;
    *) echo "${LM_WORK:-16} ${LM_WARMUP:-1}" ;;
    esac
}
load() { echo "load when=$1 avg1=$(cut -d' ' -f1 /proc/loadavg)" >> "$raw"; }
# Busy fraction of all cores over the last half second (/proc/stat).
busy() {
    local a b
    a=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat)
    sleep 0.5
    b=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat)
    echo "$a $b" | awk '{d = $4 - $2; printf "%.2f", (d > 0 ? ($3 - $1) / d : 0)}'
}
# This machine is shared: before each measurement wait until other processes
# leave the cores at most 15% busy (up to QUIET_WAIT seconds per measurement,
# 30 by default, and QUIET_BUDGET seconds over the whole run, 180), and record
# how busy they were.
waited_total=0
quiet() {
    local waited=0 b
    b=$(busy)
    while awk -v b="$b" 'BEGIN { exit !(b > 0.15) }' && [ "$waited" -lt "${QUIET_WAIT:-30}" ] &&
        [ "$waited_total" -lt "${QUIET_BUDGET:-180}" ]; do
        sleep 2
        waited=$((waited + 3))
        waited_total=$((waited_total + 3))
        b=$(busy)
    done
    echo "busy before=$b waited=$waited" >> "$raw"
}
with_threads() {
    local t=$1; shift
    OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$@"
}

start=$(date +%s)
load start
for r in $(seq "$reps"); do
    for t in $threads; do
        quiet
        with_threads "$t" "$bench" sgemm --threads "$t" --reps 3 >> "$raw"
    done
    for m in $models; do
        read -r work warm <<< "$(work_of "$m")"
        blist=$(blist_of "$m")
        margs=()
        targs=()
        [ "$m" = charlm ] && margs=("${data_args[@]}") && targs=("${tokens_args[@]}")
        for t in $threads; do
            quiet
            with_threads "$t" "$bench" train --model "$m" --mode fused,solo --threads "$t" \
                --B "$blist" --work "$work" --warmup "$warm" --window "$window" "${margs[@]}" >> "$raw"
            quiet
            OMP_WAIT_POLICY=PASSIVE with_threads "$t" "$py" "$here/torch_bench.py" \
                --model "$m" --mode solo,hfta --threads "$t" --B "$blist" --work "$work" \
                --warmup "$warm" "${targs[@]}" >> "$raw"
            [ "$m" = charlm ] && continue
            quiet
            env -u MALLOC_MMAP_THRESHOLD_ -u MALLOC_TRIM_THRESHOLD_ OMP_WAIT_POLICY=PASSIVE \
                OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" "$py" "$here/torch_bench.py" \
                --model "$m" --mode solo --tag=-glibc --threads "$t" --B 1,16 --work "$work" \
                --warmup "$warm" >> "$raw"
        done
    done
    echo "run.sh: repetition $r of $reps done after $(( $(date +%s) - start )) s" >&2
done
# Peak RSS: fusion_bench forks the fused array and the 16 solo processes
# itself; PyTorch's 16 solo jobs are 16 processes of one job each.
for m in $models; do
    [ "$m" = charlm ] && continue
    with_threads 1 "$bench" rss --model "$m" --B 16 --steps 3 >> "$raw"
    for i in $(seq 16); do
        with_threads 1 "$py" "$here/torch_bench.py" rss --model "$m" --steps 3 >> "$raw"
    done
done
load end

echo "# bench/fusion/run.sh $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(( $(date +%s) - start )) s"
echo "# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for every command (fusebox, PyTorch, SGEMM);"
echo "# MALLOC_MMAP_THRESHOLD_=1 GiB, MALLOC_TRIM_THRESHOLD_=2 GiB for every command (see run.sh)"
echo "# OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = the thread count for every command; PyTorch"
echo "# $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) also gets torch.set_num_threads and OMP_WAIT_POLICY=PASSIVE (its OpenMP"
echo "# threads otherwise spin against OpenBLAS's own at 2 threads, up to 10x slower here)"
"$py" "$here/table.py" "$raw"
