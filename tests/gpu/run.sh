#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU checks and the GPU benchmark, for a machine with a
# CUDA device; made to fit in one 10-minute call on an H200.
#
# 1. Configures build-gpu/ with CUDA on (for the local GPU's architecture
#    only, which keeps nvcc fast) and builds the gpu tests and bench/gpu.
# 2. Runs `ctest -L gpu` (the self-test, the op-by-op cross-check against the
#    CPU reference, the large-size kernel checks, the timed cuDNN search, the
#    fusion-equivalence and PyTorch-parity tests on CUDA) and prints one line
#    per test.
# 3. Runs bench/gpu/gpu_bench: cuBLAS SGEMM on the device, then for the MLP
#    and the small CNN at B = 1, 2, 4, ..., 64: one fused array, the same B
#    jobs one after another, the same B jobs as concurrent processes, and
#    (where nvidia-cuda-mps-control exists) those processes under MPS.
# 4. Prints the table last: samples x models per second, fused over serial,
#    fused over concurrent, and the fused run's fraction of the SGEMM rate.
#
# Not run by scripts/test (that machine has no GPU), and it installs nothing:
# the packages of scripts/lib/packages.txt and the CUDA toolkit in
# /usr/local/cuda must be present.  Knobs (environment):
#   FUSEBOX_GPU_ARCH=90             CUDA architectures (default: from nvidia-smi)
#   FUSEBOX_GPU_BUILD_DIR=build-gpu build directory (relative to the repository)
#   FUSEBOX_GPU_BUILD_TYPE=Release  CMAKE_BUILD_TYPE (empty: leave the directory's)
#   FUSEBOX_GPU_BUILD_TIMEOUT=240   seconds for configure + build
#   FUSEBOX_GPU_TEST_TIMEOUT=200    seconds for the whole ctest run
#   FUSEBOX_GPU_TEST_EXCLUDE=regex  gpu tests to leave out (ctest -E)
#   FUSEBOX_GPU_BENCH=1             0 skips the benchmark
#   FUSEBOX_GPU_BENCH_B=1,2,4,8,16,32,64
#   FUSEBOX_GPU_BENCH_STEPS=40      timed steps of a fused run (and of each process)
#   FUSEBOX_GPU_BENCH_PROC_MAX=32   largest B run as concurrent processes
#   FUSEBOX_GPU_BENCH_TIMEOUT=240   seconds for the whole benchmark
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
nvcc=/usr/local/cuda/bin/nvcc
dir=${FUSEBOX_GPU_BUILD_DIR:-build-gpu}
build_type=${FUSEBOX_GPU_BUILD_TYPE-Release}
build_timeout=${FUSEBOX_GPU_BUILD_TIMEOUT:-240}
test_timeout=${FUSEBOX_GPU_TEST_TIMEOUT:-200}
test_exclude=${FUSEBOX_GPU_TEST_EXCLUDE:-}
bench=${FUSEBOX_GPU_BENCH:-1}
bench_b=${FUSEBOX_GPU_BENCH_B:-1,2,4,8,16,32,64}
bench_steps=${FUSEBOX_GPU_BENCH_STEPS:-40}
proc_max=${FUSEBOX_GPU_BENCH_PROC_MAX:-32}
bench_timeout=${FUSEBOX_GPU_BENCH_TIMEOUT:-240}
t_begin=$(date +%s)

[[ -x $nvcc ]] || {
    echo "error: $nvcc not found: the CUDA toolkit is needed" >&2
    exit 1
}
[[ $bench_b =~ ^[0-9]+(,[0-9]+)*$ ]] || {
    echo "error: FUSEBOX_GPU_BENCH_B must be a comma-separated list of integers" >&2
    exit 1
}
for v in "$build_timeout" "$test_timeout" "$bench_steps" "$proc_max" "$bench_timeout"; do
    [[ $v =~ ^[0-9]+$ ]] || {
        echo "error: timeouts, steps and counts must be non-negative integers (got '$v')" >&2
        exit 1
    }
done

arch=${FUSEBOX_GPU_ARCH:-}
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap \
        --format=csv,noheader || true
    if [[ -z $arch ]]; then
        arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
            tr -d '. ' | sort -u | paste -sd ';' || true)
    fi
else
    echo "nvidia-smi not found: the tests will report whether a device is usable"
fi
arch_args=()
if [[ -n $arch ]]; then arch_args=("-DCMAKE_CUDA_ARCHITECTURES=$arch"); fi
type_args=()
if [[ -n $build_type ]]; then type_args=("-DCMAKE_BUILD_TYPE=$build_type"); fi
gen_args=()
# Ninja when available, for a new build directory only (an existing one
# keeps the generator it was made with).
if [[ ! -f $dir/CMakeCache.txt ]] && command -v ninja >/dev/null; then gen_args=(-G Ninja); fi

echo "==> $dir/: configure and build (CUDA architectures: ${arch:-project default})"
if ! timeout "$build_timeout" cmake -S . -B "$dir" "${gen_args[@]}" -DFUSEBOX_CUDA=ON \
    "${type_args[@]}" "-DCMAKE_CUDA_COMPILER=$nvcc" "${arch_args[@]}" \
    >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log" >&2
    echo "error: configuring $dir failed" >&2
    exit 1
fi
rm -f "$dir.configure.log"
targets=(test_gpu_selftest test_gpu_crosscheck test_gpu_large test_gpu_conv_search
         test_gpu_span_nccl test_gpu_nccl_deadline_join test_gpu_nccl_deadline_sum
         test_fusion_equivalence torch_driver gpu_bench)
if ! timeout "$build_timeout" cmake --build "$dir" --parallel "$(nproc)" --target "${targets[@]}"; then
    echo "error: building ${targets[*]} failed or ran past $build_timeout s" >&2
    exit 1
fi
echo "    built in $(($(date +%s) - t_begin)) s"

echo "==> ctest -L gpu (at most $test_timeout s)"
junit=$root/$dir/Testing/gpu-junit.xml
mkdir -p "$(dirname "$junit")"
exclude_args=()
if [[ -n $test_exclude ]]; then exclude_args=(-E "$test_exclude"); fi
timeout "$test_timeout" ctest --test-dir "$dir" -L gpu --output-on-failure \
    --output-junit "$junit" "${exclude_args[@]}"
rc=$?
if ((rc == 124)); then echo "error: ctest ran past $test_timeout s" >&2; fi

test_table=""
if [[ -f $junit ]]; then
    test_table=$(python3 - "$junit" <<'EOF'
import sys
import xml.etree.ElementTree as ET

rows = []
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if case.find("failure") is not None or case.get("status") == "fail":
        result = "FAILED"
    elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
        result = "skipped"
    else:
        result = "passed"
    out = (case.findtext("system-out") or "").strip().splitlines()
    rows.append((case.get("name", "?"), result, float(case.get("time", 0)), out[-1] if out else ""))
print(f"{'test':<30} {'result':<8} {'seconds':>8}  last line of output")
for name, result, secs, last in rows:
    print(f"{name:<30} {result:<8} {secs:>8.2f}  {last[:90]}")
EOF
)
    echo "$test_table"
fi

if [[ $bench != 1 ]]; then exit "$rc"; fi

bin=$root/$dir/bench/gpu/gpu_bench
log=$root/$dir/gpu-bench.log
: >"$log"
tmp=$(mktemp -d)
mps_up=0
cleanup() {
    if ((mps_up)); then
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe nvidia-cuda-mps-control >/dev/null 2>&1
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
bench_end=$(($(date +%s) + bench_timeout))
# Seconds of benchmark time left, at least 1 (timeout 0 would mean none).
left() {
    local l=$((bench_end - $(date +%s)))
    echo $((l > 1 ? l : 1))
}

# B solo jobs as concurrent processes, started together: each warms up, then
# waits for a common start second, so the timed steps overlap.  Appends one
# "proc" line per process, tagged with the mode and B, to the log.
run_procs() {
    local mode=$1 model=$2 B=$3 start pids=() i
    start=$(python3 -c "import time; print(f'{time.time() + 4 + 0.25 * $B:.3f}')")
    for ((i = 0; i < B; i++)); do
        timeout "$(left)" "$bin" proc --model "$model" --steps "$bench_steps" --warmup 3 \
            --start-at "$start" >"$tmp/proc.$i" 2>&1 &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    for ((i = 0; i < B; i++)); do
        sed -n "s/^proc /proc mode=$mode B=$B /p" "$tmp/proc.$i" >>"$log"
        grep -v '^proc ' "$tmp/proc.$i" >&2 || true
    done
}

echo "==> bench/gpu (at most $bench_timeout s)"
timeout "$(left)" "$bin" sgemm --n 8192 --reps 5 | tee -a "$log"
if ((PIPESTATUS[0] == 77)); then
    echo "no usable CUDA device: no benchmark"
    exit "$rc"
fi
for model in mlp cnn; do
    for mode in fused serial; do
        (($(left) > 10)) || break
        timeout "$(left)" "$bin" train --model "$model" --mode "$mode" --B "$bench_b" \
            --steps "$bench_steps" | tee -a "$log"
    done
done
IFS=, read -r -a bs <<<"$bench_b"
for model in mlp cnn; do
    for B in "${bs[@]}"; do
        ((B <= proc_max && $(left) > 20)) || continue
        run_procs concurrent "$model" "$B"
    done
done
if command -v nvidia-cuda-mps-control >/dev/null && (($(left) > 30)); then
    mkdir -p "$tmp/mps-pipe" "$tmp/mps-log"
    export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
    if nvidia-cuda-mps-control -d; then
        mps_up=1
        for model in mlp cnn; do
            for B in "${bs[@]}"; do
                ((B <= proc_max && $(left) > 20)) || continue
                run_procs mps "$model" "$B"
            done
        done
        echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
        mps_up=0
    else
        echo "MPS: the control daemon did not start; no MPS rows" >&2
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
    echo "MPS: nvidia-cuda-mps-control not found (or no time left); no MPS rows"
fi

echo
if [[ -n $test_table ]]; then echo "$test_table"; echo; fi
python3 "$root/bench/gpu/table.py" "$log"
echo "total $(($(date +%s) - t_begin)) s"
exit "$rc"
