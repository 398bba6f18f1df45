#!/usr/bin/env bash
# Fashion-MNIST accuracy of the CPU engine against the dataset's published
# benchmark table: an MLP (target >= 0.88) and a 2-conv + pooling + batch-norm
# CNN (target >= 0.915; the table lists 0.916 for 2 conv + pooling, 0.934 with
# batch norm).  Prints a table: model, epochs, wall time, val_accuracy (the
# final validation, on the 10% of train held out) and test_accuracy (the test
# split: what the table's targets are).
# usage: bench/accuracy/run.sh [BUILD_DIR] [THREADS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
threads=${2:-2}
train=$build/workers/fusebox-train
[ -x "$train" ] || { echo "run.sh: $train is not built" >&2; exit 1; }
# OpenBLAS runs its own kernels here: the machine's OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE slow it, so this benchmark unsets both.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
echo "# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for this benchmark; threads=$threads"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-20s %7s %9s %13s %13s %8s\n' model epochs seconds val_accuracy test_accuracy target
for m in mlp:0.88 cnn:0.915; do
    name=${m%%:*} target=${m##*:}
    spec=$here/$name.json
    epochs=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['epochs'])" "$spec")
    start=$SECONDS
    "$train" --json --threads "$threads" --log-every 0 --out "$out" "$spec" > "$out/$name.log"
    read -r val acc < <(python3 -c "
import json,sys
last=[json.loads(l) for l in open(sys.argv[1]) if '\"done\"' in l][-1]
print('%.4f %.4f' % (last['val_accuracy'], last['test_accuracy']))" "$out/$name.log")
    grep '"eval"' "$out/$name.log" | python3 -c "
import json,sys
for l in sys.stdin:
    e=json.loads(l); print('#   step %6d  val_loss %.4f  val_accuracy %.4f' % (e['step'], e['val_loss'], e['val_accuracy']))"
    printf '%-20s %7s %9s %13s %13s %8s\n' "$name" "$epochs" "$((SECONDS - start))" "$val" "$acc" \
        "$target"
done
