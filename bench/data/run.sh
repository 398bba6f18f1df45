#!/usr/bin/env bash
# bench/data/run.sh [BUILD_DIR] [bench_data options]
#
# Prints the data-loader table of bench/RESULTS.md ("## Data loader"):
# loader throughput cold and warm with 1, 2 and 4 reader threads against the
# consumption of a fused array of 16 MLPs, a plain read of the raw IDX file
# and `zstd -d` on the same chunks; the compression ratio; fusebox-train's
# I/O wait per step.  BUILD_DIR (default: build) must hold bench_data and
# fusebox-train:  cmake --build BUILD_DIR --target bench_data fusebox-train
# Options go to bench_data: --reps N (default 5), --epochs N, --train-steps N,
# --blas-threads N, --src DIR (Fashion-MNIST), --work DIR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
[[ $# -gt 0 ]] && shift
bin=$build/bench/data/bench_data
train=$build/workers/fusebox-train
if [[ ! -x $bin || ! -x $train ]]; then
    echo "bench/data/run.sh: build first: cmake --build $build --target bench_data fusebox-train" >&2
    exit 2
fi
command -v zstd > /dev/null || echo "note: no zstd command (apt-get install zstd): its row is n/a" >&2

# This machine sets both; they slow OpenBLAS. Unset for every command below alike.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

echo "Data loader benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for every command (bench_data, zstd, fusebox-train)."
echo "command: bench/data/run.sh ${build#"$root"/} $*"
echo
"$bin" --train-bin "$train" "$@"
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
