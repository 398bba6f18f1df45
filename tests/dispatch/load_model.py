"""Loads a model downloaded from fuseboxd into the equivalent PyTorch module
and checks its predictions against what fuseboxd reported.

usage: load_model.py MODEL.safetensors TEST_ACCURACY TEST_LOSS
The model is the dispatch tests' MLP (Linear(16, 32), ReLU, Linear(32, 4)),
loaded with load_state_dict(strict=True): every tensor name and shape must be
PyTorch's, or the load raises.  Then PyTorch classifies the test split of the
dispatch tests' dataset "synth" (tests/dispatch/e2e.c's import_split, made
again here from the same generator and seed) and the result must be the
job's test evaluation (test_accuracy, test_loss) as fuseboxd reported it:
the accuracy within 1e-6 (the same samples right), the mean cross-entropy
within a relative 1e-4 (float sums in another order).  Prints the predicted classes of the first samples
and both numbers.  Exit 0 when both agree, 1 when not, 77 without PyTorch
(under FUSEBOX_TEST_STRICT=1, which scripts/test sets, 1).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from test_torch_parity import st_read
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("FUSEBOX_TEST_STRICT") == "1":
        print(f"FAILED: a prerequisite is missing under FUSEBOX_TEST_STRICT=1: PyTorch ({e})")
        sys.exit(1)
    print(f"SKIPPED: PyTorch not importable ({e})")
    sys.exit(77)

ACC_TOL = 1e-6
LOSS_TOL = 1e-4
M64 = (1 << 64) - 1


def synth_split(n, seed):
    """e2e.c's import_split: x uniform in [-1, 1) from a 64-bit LCG, the
    label the argmax of a fixed integer map of x summed in float32."""
    coef = np.array([[((f * 7 + k * 3) % 5) - 2 for k in range(4)] for f in range(16)],
                    dtype=np.float32)
    x = np.empty((n, 16), dtype=np.float32)
    y = np.empty(n, dtype=np.int64)
    s = seed
    for i in range(n):
        score = np.zeros(4, dtype=np.float32)
        for f in range(16):
            s = (s * 6364136223846793005 + 1442695040888963407) & M64
            v = np.float32((s >> 11) / 9007199254740992.0 * 2.0 - 1.0)
            x[i, f] = v
            score += v * coef[f]  # float32, in the C loop's order
        y[i] = int(np.argmax(score))  # the first of equal scores, as in C
    return x, y


def main():
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[1].splitlines()[0])
        return 2
    path, want_acc, want_loss = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    state = {k: torch.from_numpy(v.copy()) for k, v in st_read(path).items()}
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model.load_state_dict(state, strict=True)
    x, y = synth_split(512, 12)
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        pred = logits.argmax(dim=1)
        acc = float((pred == torch.from_numpy(y)).double().mean())
        loss = float(F.cross_entropy(logits.double(), torch.from_numpy(y)))
    print("predicted classes of the first 16 test samples:", " ".join(str(int(i)) for i in pred[:16]))
    print("labels:                                        ", " ".join(str(int(i)) for i in y[:16]))
    print(f"test accuracy: PyTorch {acc:.9g}, fuseboxd {want_acc:.9g}")
    print(f"test loss:     PyTorch {loss:.9g}, fuseboxd {want_loss:.9g}")
    ok = abs(acc - want_acc) <= ACC_TOL
    ok = ok and abs(loss - want_loss) <= LOSS_TOL * max(abs(want_loss), 1e-6)
    if not ok:
        print(f"FAIL: the model's predictions differ from fuseboxd's evaluation"
              f" (tolerances {ACC_TOL:g} absolute, {LOSS_TOL:g} relative)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
