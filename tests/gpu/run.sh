#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU checks and the GPU benchmark, for a bare machine
# with a CUDA device; made to fit in one call of at most 8 minutes on an H200,
# the build included.
#
# 0. Preflight (at most 30 s): the GPU (nvidia-smi), nvcc, CMake, ninja, the C
#    compiler, the kit (.gpu-kit/, made by tests/gpu/kit on Debian 12: the
#    libraries fusebox links, which such a machine lacks), cuDNN and NCCL
#    (asked of python3: the nvidia.cudnn and nvidia.nccl wheels, else beside
#    CUDA) and the python3 that imports PyTorch with CUDA.  Prints what it
#    found; stops with a message naming what is missing.
# 1. Configures build-gpu/ with CUDA on (for the local GPU's architecture
#    only, which keeps nvcc fast) against the kit (tests/gpu/kit-env.sh: a
#    copy of it in build-gpu/kit, nothing unpacked into /) and builds the gpu
#    tests and bench/gpu.
# 2. Runs `ctest -L gpu` (the self-test, the op-by-op cross-check against the
#    CPU reference, the large-size kernel checks, the timed cuDNN search, the
#    fusion-equivalence and PyTorch-parity tests on CUDA), then
#    scripts/lib/skips.py: where nvidia-smi lists a GPU, a skipped gpu test
#    fails the run unless it needs more GPUs than there are.
# 3. Runs bench/gpu/gpu_bench: cuBLAS SGEMM on the device, then for the MLP
#    and the small CNN at each B of FUSEBOX_GPU_BENCH_B: one fused array, the
#    same B jobs one after another, the same B jobs as concurrent processes,
#    and (where nvidia-cuda-mps-control exists) those processes under MPS.
# 4. Prints the tables last: the preflight, each test's result, the benchmark
#    (samples x models per second, fused over serial, fused over concurrent,
#    the fused run's fraction of the SGEMM rate) and the time of each phase.
#
# Everything goes under $OUT as it happens (a directory the caller collects;
# default build-gpu/out), so a run killed at its limit leaves what it had:
# run.log (all output), preflight.txt, ctest.log, gpu-junit.xml, tests.txt,
# bench.log, bench.txt.  Exit status: 0 when every step passed, 1 otherwise.
# Not run by scripts/test (that machine has no GPU), and it installs nothing.
# Knobs (environment):
#   OUT=DIR                         where the logs and tables go
#   FUSEBOX_GPU_KIT=.gpu-kit        the kit (relative to the repository)
#   FUSEBOX_GPU_TOTAL=480           seconds for the whole run; each phase gets
#                                   at most its own limit and what is left
#   FUSEBOX_GPU_ARCH=90             CUDA architectures (default: from nvidia-smi)
#   FUSEBOX_GPU_BUILD_DIR=build-gpu build directory (relative to the repository)
#   FUSEBOX_GPU_BUILD_TYPE=Release  CMAKE_BUILD_TYPE (empty: leave the directory's)
#   FUSEBOX_GPU_BUILD_TIMEOUT=220   seconds for configure + build
#   FUSEBOX_GPU_TEST_TIMEOUT=150    seconds for the whole ctest run
#   FUSEBOX_GPU_TEST_JOBS=4         gpu tests run at once (they share the device)
#   FUSEBOX_GPU_TEST_EXCLUDE=regex  gpu tests to leave out (ctest -E)
#   FUSEBOX_CUDNN_ROOT, FUSEBOX_NCCL_ROOT  cuDNN's and NCCL's directories (lib/,
#                                   include/), instead of asking python3
#   FUSEBOX_TORCH_PYTHON=python3    the python3 that imports torch with CUDA
#                                   (default: python3 on PATH)
#   FUSEBOX_GPU_BENCH=1             0 skips the benchmark
#   FUSEBOX_GPU_BENCH_B=1,4,16,64
#   FUSEBOX_GPU_BENCH_STEPS=40      timed steps of a fused run (and of each process)
#   FUSEBOX_GPU_BENCH_PROC_MAX=16   largest B run as concurrent processes
#   FUSEBOX_GPU_BENCH_TIMEOUT=90    seconds for the whole benchmark
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
t_begin=$(date +%s)
dir=${FUSEBOX_GPU_BUILD_DIR:-build-gpu}
mkdir -p "$dir" || exit 1
dir=$(cd "$dir" && pwd)
out=${OUT:-$dir/out}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
# every line of output also goes to $OUT/run.log, as it is printed
exec > >(tee -a "$out/run.log") 2>&1

kit_src=${FUSEBOX_GPU_KIT:-.gpu-kit}
total=${FUSEBOX_GPU_TOTAL:-480}
build_type=${FUSEBOX_GPU_BUILD_TYPE-Release}
build_timeout=${FUSEBOX_GPU_BUILD_TIMEOUT:-220}
test_timeout=${FUSEBOX_GPU_TEST_TIMEOUT:-150}
test_jobs=${FUSEBOX_GPU_TEST_JOBS:-4}
test_exclude=${FUSEBOX_GPU_TEST_EXCLUDE:-}
bench=${FUSEBOX_GPU_BENCH:-1}
bench_b=${FUSEBOX_GPU_BENCH_B:-1,4,16,64}
bench_steps=${FUSEBOX_GPU_BENCH_STEPS:-40}
proc_max=${FUSEBOX_GPU_BENCH_PROC_MAX:-16}
bench_timeout=${FUSEBOX_GPU_BENCH_TIMEOUT:-90}
phases=""
rc=0

die() {
    printf 'error: %s\n' "$*" >&2
    printf 'stopped after %d s; logs in %s\n' "$(($(date +%s) - t_begin))" "$out" >&2
    exit 1
}
# Seconds of the whole run left, at least 1.
run_left() {
    local l=$((t_begin + total - $(date +%s)))
    echo $((l > 1 ? l : 1))
}
# The smaller of a phase's own limit and what is left of the run.
budget() {
    local l
    l=$(run_left)
    echo $(($1 < l ? $1 : l))
}
phase_done() { phases+=$(printf '%-12s %4d s\n' "$1" "$(($(date +%s) - $2))")$'\n'; }

[[ $bench_b =~ ^[0-9]+(,[0-9]+)*$ ]] || die "FUSEBOX_GPU_BENCH_B must be a comma-separated list of integers"
for v in "$total" "$build_timeout" "$test_timeout" "$test_jobs" "$bench_steps" "$proc_max" \
    "$bench_timeout"; do
    [[ $v =~ ^[0-9]+$ ]] || die "timeouts, steps and counts must be non-negative integers (got '$v')"
done

# ---- 0. preflight -----------------------------------------------------------
t0=$(date +%s)
pre=$out/preflight.txt
: >"$pre"
missing=()
found() { printf '%-14s %s\n' "$1" "$2" | tee -a "$pre"; }
lack() {
    missing+=("$1: $2")
    printf '%-14s MISSING: %s\n' "$1" "$2" | tee -a "$pre"
}
echo "==> preflight"
gpus=0
if command -v nvidia-smi >/dev/null; then
    gpu_line=$(timeout 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap \
        --format=csv,noheader 2>&1 | head -n 4)
    gpus=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    if ((gpus > 0)); then found gpu "$gpus: $(echo "$gpu_line" | paste -sd '|')"; else lack gpu "nvidia-smi lists none: $gpu_line"; fi
else
    lack gpu "nvidia-smi not found"
fi
arch=${FUSEBOX_GPU_ARCH:-}
if [[ -z $arch ]] && ((gpus > 0)); then
    arch=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
        tr -d '. ' | sort -u | paste -sd ';' || true)
fi
nvcc=$(command -v nvcc || true)
[[ -n $nvcc ]] || nvcc=/usr/local/cuda/bin/nvcc
if [[ -x $nvcc ]]; then
    found nvcc "$nvcc ($("$nvcc" --version | sed -n 's/.*release \([^,]*\).*/\1/p'))"
else
    lack nvcc "no nvcc on PATH or in /usr/local/cuda/bin"
fi
cuda_root=""
if [[ -x $nvcc ]]; then cuda_root=$(cd "$(dirname "$nvcc")/.." && pwd); fi
for tool in cmake ninja cc; do
    if command -v "$tool" >/dev/null; then
        found "$tool" "$(command -v "$tool") ($("$tool" --version 2>&1 | head -n 1))"
    else
        lack "$tool" "not on PATH"
    fi
done
glibc=$(ldd --version 2>&1 | head -n 1 | grep -o '[0-9][0-9.]*$' || true)
if [[ ! -f $kit_src/MANIFEST ]]; then
    lack kit "no $kit_src/MANIFEST: make the kit with tests/gpu/kit on a Debian 12 machine and carry .gpu-kit"
else
    need=$(sed -n 's/^glibc_min //p' "$kit_src/MANIFEST")
    if [[ -n $need && $(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -n 1) != "$need" ]]; then
        lack kit "the kit needs glibc >= $need, this machine has ${glibc:-an unknown one}"
    else
        # shellcheck source=tests/gpu/kit-env.sh
        source "$root/tests/gpu/kit-env.sh"
        if fb_kit_env "$kit_src" "$dir/kit" && kit_line=$(fb_kit_check); then
            found kit "$(sed -n 's/^size_mib //p' "$kit_src/MANIFEST") MiB, glibc $glibc; $kit_line"
        else
            lack kit "the kit does not load here (above)"
        fi
    fi
fi
torch_py=${FUSEBOX_TORCH_PYTHON:-$(command -v python3 || true)}
if [[ -z $torch_py ]]; then
    lack python3 "no python3 on PATH (FUSEBOX_TORCH_PYTHON names one)"
else
    torch_line=$(timeout 25 "$torch_py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available" if torch.cuda.is_available() else "NOT AVAILABLE")' 2>&1 | tail -n 1)
    if [[ $torch_line == *" available" ]]; then
        found python3 "$torch_py: torch $torch_line"
    else
        lack python3 "$torch_py does not import torch with CUDA: $torch_line"
    fi
fi
# cuDNN and NCCL: FUSEBOX_*_ROOT, else the wheels python3 knows, else beside CUDA.
wheel_dir() {
    [[ -n $torch_py ]] || return 0
    timeout 20 "$torch_py" -c "import importlib, sys
try:
    m = importlib.import_module(sys.argv[1])
    print(list(m.__path__)[0])
except Exception:
    pass" "$1" 2>/dev/null
}
# find_dep NAME LIBGLOB HEADER ROOTVAR MODULE: sets dep_lib and dep_inc (the
# library and its header), from $ROOTVAR, else MODULE's wheel, else CUDA's folder.
find_dep() {
    local name=$1 glob=$2 header=$3 root=${!4:-} lib="" inc=""
    [[ -n $root ]] || root=$(wheel_dir "$5")
    if [[ -n $root ]]; then
        lib=$(find "$root" -name "$glob" 2>/dev/null | sort | head -n 1)
        inc=$(find "$root" -name "$header" 2>/dev/null | head -n 1)
    fi
    if [[ -z $inc && -n $cuda_root && -f $cuda_root/include/$header ]]; then inc=$cuda_root/include/$header; fi
    if [[ -z $lib && -n $cuda_root ]]; then
        lib=$(find "$cuda_root/" -name "$glob" 2>/dev/null | sort | head -n 1)
    fi
    dep_lib=$lib dep_inc=$inc
    if [[ -z $lib ]]; then lack "$name" "no $glob (${root:-no $5 wheel}, nor beside CUDA)"; return; fi
    if [[ -z $inc ]]; then lack "$name" "no $header (${root:-no $5 wheel}, nor in $cuda_root/include)"; return; fi
    found "$name" "$lib, $inc"
}
find_dep cudnn 'libcudnn.so.9*' cudnn.h FUSEBOX_CUDNN_ROOT nvidia.cudnn
cudnn_lib=$dep_lib cudnn_inc=$dep_inc
find_dep nccl 'libnccl.so.2*' nccl.h FUSEBOX_NCCL_ROOT nvidia.nccl
nccl_lib=$dep_lib nccl_inc=$dep_inc
phase_done preflight "$t0"
if ((${#missing[@]})); then
    printf '%s\n' "${missing[@]}" | sed 's/^/  missing: /' >&2
    die "the preflight found ${#missing[@]} thing(s) missing (above; also $pre)"
fi

# ---- 1. configure and build ---------------------------------------------------
t0=$(date +%s)
arch_args=()
if [[ -n $arch ]]; then arch_args=("-DCMAKE_CUDA_ARCHITECTURES=$arch"); fi
type_args=()
if [[ -n $build_type ]]; then type_args=("-DCMAKE_BUILD_TYPE=$build_type"); fi
gen_args=()
# Ninja for a new build directory only (an existing one keeps its generator).
if [[ ! -f $dir/CMakeCache.txt ]]; then gen_args=(-G Ninja); fi
# The libraries found above, by their directories: the loader finds cuDNN's and
# NCCL's siblings there (cuDNN loads its engines by name at run time).
LD_LIBRARY_PATH=$(dirname "$cudnn_lib"):$(dirname "$nccl_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
# A wheel's folder (lib/libcudnn.so.9, include/cudnn.h) is a FUSEBOX_*_ROOT for
# CMakeLists.txt; any other layout names the library and the headers.
dep_cmake() {
    local var=$1 root_var=$2 lib=$3 inc=$4 r
    r=$(dirname "$(dirname "$lib")")
    if [[ $(basename "$(dirname "$lib")") == lib* && $(dirname "$inc") == "$r/include" ]]; then
        dep_args+=("-D$root_var=$r")
    else
        dep_args+=("-D${var}_LIBRARY=$lib" "-D${var}_INCLUDE_DIR=$(dirname "$inc")")
    fi
}
dep_args=("-DFUSEBOX_TORCH_PYTHON=$torch_py" "-DPKG_CONFIG_EXECUTABLE=$FB_KIT_PKG_CONFIG")
dep_cmake CUDNN FUSEBOX_CUDNN_ROOT "$cudnn_lib" "$cudnn_inc"
dep_cmake NCCL FUSEBOX_NCCL_ROOT "$nccl_lib" "$nccl_inc"
echo "==> $dir/: configure and build (CUDA architectures: ${arch:-project default}; at most $(budget "$build_timeout") s)"
if ! timeout "$(budget "$build_timeout")" cmake -S . -B "$dir" "${gen_args[@]}" -DFUSEBOX_CUDA=ON \
    "${type_args[@]}" "-DCMAKE_CUDA_COMPILER=$nvcc" "${arch_args[@]}" "${dep_args[@]}" \
    >"$out/configure.log" 2>&1; then
    tail -n 40 "$out/configure.log" >&2
    die "configuring $dir failed (the whole log: $out/configure.log)"
fi
grep -E 'cuDNN:|CUDA compiler identification' "$out/configure.log" || true
rm -f "$out/configure.log"
targets=(test_gpu_selftest test_gpu_crosscheck test_gpu_large test_gpu_conv_search
         test_gpu_span_nccl test_gpu_nccl_deadline_join test_gpu_nccl_deadline_sum
         test_fusion_equivalence torch_driver gpu_bench)
if ! timeout "$(budget "$build_timeout")" cmake --build "$dir" --parallel "$(nproc)" --target "${targets[@]}"; then
    die "building ${targets[*]} failed or ran past its time"
fi
phase_done build "$t0"
echo "    built in $(($(date +%s) - t0)) s"

# ---- 2. the gpu tests ---------------------------------------------------------
t0=$(date +%s)
tbudget=$(budget "$test_timeout")
echo "==> ctest -L gpu (at most $tbudget s, $test_jobs at a time)"
junit=$out/gpu-junit.xml
exclude_args=()
if [[ -n $test_exclude ]]; then exclude_args=(-E "$test_exclude"); fi
timeout "$tbudget" ctest --test-dir "$dir" -L gpu --output-on-failure -j "$test_jobs" \
    --timeout "$tbudget" --output-junit "$junit" "${exclude_args[@]}" 2>&1 | tee "$out/ctest.log"
test_rc=${PIPESTATUS[0]}
if ((test_rc == 124)); then echo "error: ctest ran past $tbudget s" >&2; fi
((test_rc == 0)) || rc=1
if [[ -f $junit ]]; then
    ctest --test-dir "$dir" --show-only=json-v1 >"$dir/gpu-tests.json" 2>/dev/null
    if ! python3 "$root/scripts/lib/skips.py" --gpus "$gpus" "$junit" "$dir/gpu-tests.json"; then
        rc=1
    fi
fi
phase_done tests "$t0"

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
    echo "$test_table" | tee "$out/tests.txt"
fi

# The tables, last: what the preflight found, the tests, the benchmark, the phases.
summary() {
    echo
    echo "==> summary (logs and tables in $out)"
    cat "$pre"
    if [[ -n $test_table ]]; then echo; echo "$test_table"; fi
    if [[ -s $out/bench.txt ]]; then echo; cat "$out/bench.txt"; fi
    echo
    printf '%s' "$phases"
    printf '%-12s %4d s (limit %d s); exit %d\n' total "$(($(date +%s) - t_begin))" "$total" "$rc"
}

if [[ $bench != 1 ]] || (($(run_left) < 20)); then
    [[ $bench != 1 ]] || echo "no time left for the benchmark"
    summary
    exit "$rc"
fi

t0=$(date +%s)
bin=$dir/bench/gpu/gpu_bench
log=$out/bench.log
: >"$log"
tmp=$(mktemp -d)
mps_up=0
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if ((mps_up)); then
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe nvidia-cuda-mps-control >/dev/null 2>&1
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
bench_end=$(($(date +%s) + $(budget "$bench_timeout")))
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

echo "==> bench/gpu (at most $(left) s)"
timeout "$(left)" "$bin" sgemm --n 8192 --reps 5 | tee -a "$log"
if ((PIPESTATUS[0] == 77)); then
    echo "no usable CUDA device: no benchmark"
    rc=1
    summary
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
python3 "$root/bench/gpu/table.py" "$log" >"$out/bench.txt" || rc=1
phase_done bench "$t0"
summary
exit "$rc"
