#!/usr/bin/env python3
"""PyTorch's side of bench/fusion: the same jobs as fusion_bench.c.

  torch_bench.py --model mlp|cnn --mode solo|hfta|solo,hfta --threads T --B 1,2,4
                 [--work K | --steps S] [--warmup W]
  torch_bench.py rss --model mlp|cnn [--steps S]

solo: the B jobs one after another, each an ordinary nn.Sequential with its
own torch.optim.AdamW (what users do today).  Both modes pass foreach=True to
AdamW: PyTorch 1.13's default on the CPU (one op per parameter tensor) is about
5x slower here, so the multi-tensor path is the stronger baseline.  hfta: the B models fused by hand
as the HFTA paper (Wang et al., MLSys 2021) does it: the first layer is one
wide layer over the shared input (a linear with B*out features, a conv with
B*out channels), later convolutions are grouped (groups = B), later linears are
one torch.baddbmm over [B, N, in] x [B, in, out], and one AdamW updates the
fused [B, ...] parameters; the loss is the per-member mean summed over members,
as in fusebox.  Each timed step: forward, loss, backward, optimizer step, with
zero_grad(set_to_none=True) (PyTorch 1.13's fastest).  Timed steps per job (or
per array): S, or max(2, ceil(K / B)) as in fusion_bench.  Prints one line per B:
  train impl=torch-solo model=mlp threads=1 B=4 sps=...
rss: peak RSS of one solo training process (ru_maxrss), printed as
  rss_torch model=mlp solo_kib=...
"""
import argparse
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SIDE, CLASSES, POOL = 128, 28, 10, 4


def solo_model(model):
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


class BLinear(nn.Module):
    """B linears at once: x [B, N, in] -> [B, N, out] with one baddbmm."""

    def __init__(self, B, fin, fout):
        super().__init__()
        bound = 1.0 / fin ** 0.5
        self.weight = nn.Parameter(torch.empty(B, fin, fout).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(B, 1, fout).uniform_(-bound, bound))

    def forward(self, x):
        return torch.baddbmm(self.bias, x, self.weight)


class HftaMLP(nn.Module):
    def __init__(self, B):
        super().__init__()
        self.B = B
        self.fc1 = nn.Linear(784, B * 256)  # shared input: one wide GEMM
        self.fc2 = BLinear(B, 256, 128)
        self.fc3 = BLinear(B, 128, 10)

    def forward(self, x):
        N = x.shape[0]
        h = F.relu(self.fc1(x.reshape(N, 784)))              # [N, B*256]
        h = h.reshape(N, self.B, 256).transpose(0, 1)         # [B, N, 256]
        h = F.relu(self.fc2(h))
        return self.fc3(h)                                    # [B, N, 10]


class HftaCNN(nn.Module):
    def __init__(self, B):
        super().__init__()
        self.B = B
        self.conv1 = nn.Conv2d(1, B * 16, 3, padding=1)              # shared input
        self.conv2 = nn.Conv2d(B * 16, B * 32, 3, padding=1, groups=B)
        self.fc = BLinear(B, 32 * 7 * 7, 10)

    def forward(self, x):
        N = x.shape[0]
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)                   # [N, B*32, 7, 7]
        h = h.reshape(N, self.B, 32 * 7 * 7).transpose(0, 1)          # [B, N, 1568]
        return self.fc(h)                                             # [B, N, 10]


def make_data():
    g = torch.Generator().manual_seed(42)
    xs = torch.rand(POOL, BATCH, 1, SIDE, SIDE, generator=g)
    ys = torch.randint(0, CLASSES, (POOL, BATCH), generator=g)
    return xs, ys


def lr_of(i):
    return 1e-3 * (1.0 + 0.1 * (i % 8))


def run_solo(model, B, steps, warmup, data):
    xs, ys = data
    timed = 0.0
    for j in range(B):
        torch.manual_seed(100 + j)
        m = solo_model(model)
        opt = torch.optim.AdamW(m.parameters(), lr=lr_of(j), weight_decay=0.01, foreach=True)
        for s in range(warmup + steps):
            if s == warmup:
                t0 = time.perf_counter()
            x, y = xs[s % POOL], ys[s % POOL]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
        timed += time.perf_counter() - t0
    return timed


def run_hfta(model, B, steps, warmup, data):
    xs, ys = data
    torch.manual_seed(100)
    m = HftaMLP(B) if model == "mlp" else HftaCNN(B)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
    for s in range(warmup + steps):
        if s == warmup:
            t0 = time.perf_counter()
        x, y = xs[s % POOL], ys[s % POOL]
        opt.zero_grad(set_to_none=True)
        logits = m(x)                                                 # [B, N, 10]
        # per-member mean over N, summed over members: each member's own gradient
        loss = F.cross_entropy(logits.reshape(B * BATCH, CLASSES), y.repeat(B),
                               reduction="sum") / BATCH
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", nargs="?", default="train", choices=["train", "rss"])
    ap.add_argument("--model", choices=["mlp", "cnn"], required=True)
    ap.add_argument("--mode", choices=["solo", "hfta", "solo,hfta"], default="solo")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--B", default="1")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--work", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tag", default="", help="appended to the impl name of each line")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    data = make_data()
    if a.cmd == "rss":
        run_solo(a.model, 1, a.steps or 3, 1, data)
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print("rss_torch model=%s solo_kib=%d" % (a.model, kib))
        return 0
    # for each B, each mode in turn: the two are measured side by side
    for B in [int(v) for v in a.B.split(",")]:
        steps = max(2, a.steps or -(-a.work // B))
        for mode in a.mode.split(","):
            run = run_solo if mode == "solo" else run_hfta
            t = run(a.model, B, steps, a.warmup, data)
            print("train impl=torch-%s%s model=%s threads=%d B=%d sps=%.1f"
                  % (mode, a.tag, a.model, a.threads, B, B * steps * BATCH / t), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
