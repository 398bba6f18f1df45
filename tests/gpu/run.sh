#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU checks, for a machine with a CUDA device.
#
# Configures build-gpu/ with CUDA on (for the local GPU's architecture only,
# which keeps nvcc fast), builds the gpu-labelled tests, runs `ctest -L gpu`
# and prints one line per test.  Everything is time-bounded; there is no
# benchmark here yet.  Not run by scripts/test (that machine has no GPU), and
# it installs nothing: the packages of scripts/lib/packages.txt and the CUDA
# toolkit in /usr/local/cuda must be present.  Knobs (environment):
#   FUSEBOX_GPU_ARCH=90            CUDA architectures (default: from nvidia-smi)
#   FUSEBOX_GPU_BUILD_TIMEOUT=600  seconds for configure + build
#   FUSEBOX_GPU_TEST_TIMEOUT=300   seconds for the whole ctest run
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
nvcc=/usr/local/cuda/bin/nvcc
dir=build-gpu
build_timeout=${FUSEBOX_GPU_BUILD_TIMEOUT:-600}
test_timeout=${FUSEBOX_GPU_TEST_TIMEOUT:-300}

[[ -x $nvcc ]] || {
    echo "error: $nvcc not found: the CUDA toolkit is needed" >&2
    exit 1
}

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

echo "==> $dir/: configure and build the gpu tests (CUDA architectures: ${arch:-project default})"
timeout "$build_timeout" cmake -S . -B "$dir" -G Ninja -DFUSEBOX_CUDA=ON \
    "-DCMAKE_CUDA_COMPILER=$nvcc" "${arch_args[@]}" >"$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log" >&2
    echo "error: configuring $dir failed" >&2
    exit 1
}
rm -f "$dir.configure.log"
# A test's target has the test's name (tests/CMakeLists.txt, fb_add_test).
mapfile -t targets < <(ctest --test-dir "$dir" -L gpu -N | sed -n 's/^ *Test *#[0-9]*: *//p')
((${#targets[@]} > 0)) || {
    echo "error: no test has the gpu label" >&2
    exit 1
}
timeout "$build_timeout" cmake --build "$dir" --target "${targets[@]}"

echo "==> ctest -L gpu (${#targets[@]} tests, at most $test_timeout s)"
junit=$root/$dir/Testing/gpu-junit.xml
mkdir -p "$(dirname "$junit")"
set +e
timeout "$test_timeout" ctest --test-dir "$dir" -L gpu --output-on-failure \
    --output-junit "$junit"
rc=$?
set -e

if [[ -f $junit ]]; then
    python3 - "$junit" <<'EOF'
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
print()
print(f"{'test':<28} {'result':<8} {'seconds':>8}  last line of output")
for name, result, secs, last in rows:
    print(f"{name:<28} {result:<8} {secs:>8.2f}  {last[:100]}")
EOF
fi
if ((rc == 124)); then echo "error: ctest ran past $test_timeout s" >&2; fi
exit "$rc"
