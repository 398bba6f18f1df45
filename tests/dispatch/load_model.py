"""Loads a model downloaded from fuseboxd into the equivalent PyTorch module.

usage: load_model.py MODEL.safetensors
The model is the dispatch tests' MLP (Linear(16, 32), ReLU, Linear(32, 4)),
loaded with load_state_dict(strict=True): every tensor name and shape must be
PyTorch's, or the load raises and the exit status is 1.  Then runs it on a
few fixed inputs and prints the predicted classes.  Exit 77 without PyTorch.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
try:
    import torch
    import torch.nn as nn
    from test_torch_parity import st_read
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIPPED: PyTorch not importable ({e})")
    sys.exit(77)


def main():
    state = {k: torch.from_numpy(v.copy()) for k, v in st_read(sys.argv[1]).items()}
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model.load_state_dict(state, strict=True)
    x = torch.linspace(-1, 1, 8 * 16).reshape(8, 16)
    with torch.no_grad():
        print(" ".join(str(int(i)) for i in model(x).argmax(dim=1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
