#!/usr/bin/env bash
# bench/parallel/run.sh [BUILD_DIR] [STEPS] [BATCH] [HIDDEN] [B] [BUCKET_KIB]
#
# Prints the hybrid-parallelism tables of bench/RESULTS.md on this machine's
# CPU devices: one fused MLP array (B members, HIDDEN units, global batch
# BATCH) on one device and data-parallel on two, with the gradient
# all-reduce after backward (overlap off) and during it (overlap on): median
# step times, the share of communication backward hid, the target "step <=
# 1.1 x max(compute, comm)", the D=1 -> 2 speed-up; then the pipeline
# bubble for P = 2, 3 stages and m micro-batches, measured and played by
# 1F1B, against (P-1)/(m+P-1).  BUILD_DIR (default build) must hold
# bench/parallel/bench_parallel (built with the tests/parallel targets).
#
# CPU devices are threads on this machine's cores; on a machine shared with
# other work the times, and the speed-up most of all, say more about the
# load than about the code.  Say so next to the numbers.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
steps=${2:-15}
batch=${3:-64}
hidden=${4:-1024}
members=${5:-4}
bucket=${6:-1024}
bin=$build/bench/parallel/bench_parallel
if [[ ! -x $bin ]]; then
    echo "bench/parallel: $bin is missing; build it: make -C $build bench_parallel" >&2
    exit 1
fi
# OpenBLAS runs its own kernels here: the machine's OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE slow it, so this benchmark unsets both.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
echo "# bench/parallel $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for this benchmark; one thread per device"
"$bin" "$steps" "$batch" "$hidden" "$members" "$bucket"
