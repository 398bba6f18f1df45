#!/usr/bin/env python3
"""PyTorch's side of bench/fusion: the same jobs as fusion_bench.c.

  torch_bench.py --model mlp|cnn|charlm --mode solo|hfta|solo,hfta --threads T --B 1,2,4
                 [--work K | --steps S] [--warmup W] [--data TOKENS]
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
charlm (the byte-level language model of fusion_bench.c, batch 32, Adam) trains
on TOKENS, the minibatches `fusion_bench tokens` wrote (int32 [n, 65]), in
order.  solo: nn.Embedding, a learned position table, two pre-LayerNorm blocks
of nn.MultiheadAttention (causal mask) and an nn.GELU MLP, nn.LayerNorm,
nn.Linear, each model with its own torch.optim.Adam.  hfta: the B models by
hand with batched matmuls: every parameter stacked [B, ...], activations
[B, N*T, D], each linear one baddbmm, attention one bmm over B*N*heads
matrices of [T, Dh], the embedding one gather from the [B*V, D] table, one
Adam over the stacked parameters.  Lines then also carry cpu_sps (samples x
models per CPU second of the process, steadier on a loaded machine).
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
LM_T, LM_BATCH, LM_V, LM_D, LM_H, LM_BLOCKS, LM_RATIO = 64, 32, 256, 128, 4, 2, 4


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


class LMBlock(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)), causal; exact GELU."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(LM_D)
        self.attn = nn.MultiheadAttention(LM_D, LM_H, batch_first=True)
        self.ln2 = nn.LayerNorm(LM_D)
        self.mlp = nn.Sequential(nn.Linear(LM_D, LM_RATIO * LM_D), nn.GELU(),
                                 nn.Linear(LM_RATIO * LM_D, LM_D))
        self.register_buffer("mask", torch.triu(torch.ones(LM_T, LM_T, dtype=torch.bool), 1))

    def forward(self, x):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=self.mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(LM_V, LM_D)
        self.pos = nn.Parameter(torch.randn(LM_T, LM_D) * 0.02)
        self.blocks = nn.Sequential(*[LMBlock() for _ in range(LM_BLOCKS)])
        self.ln = nn.LayerNorm(LM_D)
        self.head = nn.Linear(LM_D, LM_V)

    def forward(self, ids):
        return self.head(self.ln(self.blocks(self.emb(ids) + self.pos)))


def stacked(B, *shape, scale=None, value=None):
    t = torch.full((B,) + shape, value) if value is not None else torch.randn((B,) + shape) * scale
    return nn.Parameter(t)


class HftaCharLM(nn.Module):
    """B CharLMs by hand: stacked parameters, batched matmuls."""

    def __init__(self, B):
        super().__init__()
        D, R = LM_D, LM_RATIO * LM_D
        self.B = B
        self.emb = stacked(B, LM_V, D, scale=1.0)
        self.pos = stacked(B, LM_T, D, scale=0.02)
        self.blocks = nn.ModuleList()
        for _ in range(LM_BLOCKS):
            blk = nn.ParameterDict({
                "ln1_w": stacked(B, 1, D, value=1.0), "ln1_b": stacked(B, 1, D, value=0.0),
                "qkv_w": stacked(B, D, 3 * D, scale=D ** -0.5),
                "qkv_b": stacked(B, 1, 3 * D, value=0.0),
                "out_w": stacked(B, D, D, scale=D ** -0.5), "out_b": stacked(B, 1, D, value=0.0),
                "ln2_w": stacked(B, 1, D, value=1.0), "ln2_b": stacked(B, 1, D, value=0.0),
                "fc1_w": stacked(B, D, R, scale=D ** -0.5), "fc1_b": stacked(B, 1, R, value=0.0),
                "fc2_w": stacked(B, R, D, scale=R ** -0.5), "fc2_b": stacked(B, 1, D, value=0.0),
            })
            self.blocks.append(blk)
        self.ln_w = stacked(B, 1, D, value=1.0)
        self.ln_b = stacked(B, 1, D, value=0.0)
        self.head_w = stacked(B, D, LM_V, scale=D ** -0.5)
        self.head_b = stacked(B, 1, LM_V, value=0.0)
        self.register_buffer("mask", torch.triu(torch.ones(LM_T, LM_T, dtype=torch.bool), 1))
        self.register_buffer("offs", (torch.arange(B) * LM_V).view(B, 1, 1))

    def ln(self, x, w, b):
        return torch.addcmul(b, F.layer_norm(x, (LM_D,)), w)

    def forward(self, ids):                                           # ids [N, T]
        B, D, H = self.B, LM_D, LM_H
        N, T = ids.shape
        Dh = D // H
        x = self.emb.reshape(B * LM_V, D)[ids.unsqueeze(0) + self.offs]   # [B, N, T, D]
        x = (x + self.pos[:, None, :T]).reshape(B, N * T, D)
        for p in self.blocks:
            h = self.ln(x, p["ln1_w"], p["ln1_b"])
            qkv = torch.baddbmm(p["qkv_b"], h, p["qkv_w"])             # [B, NT, 3D]
            qkv = qkv.reshape(B, N, T, 3, H, Dh).permute(3, 0, 1, 4, 2, 5)
            q, k, v = (qkv[i].reshape(B * N * H, T, Dh) for i in range(3))
            s = torch.bmm(q, k.transpose(1, 2)) * Dh ** -0.5
            a = torch.softmax(s.masked_fill(self.mask, float("-inf")), dim=-1)
            o = torch.bmm(a, v).reshape(B, N, H, T, Dh).permute(0, 1, 3, 2, 4)
            x = x + torch.baddbmm(p["out_b"], o.reshape(B, N * T, D), p["out_w"])
            h = self.ln(x, p["ln2_w"], p["ln2_b"])
            h = F.gelu(torch.baddbmm(p["fc1_b"], h, p["fc1_w"]))
            x = x + torch.baddbmm(p["fc2_b"], h, p["fc2_w"])
        h = self.ln(x, self.ln_w, self.ln_b)
        return torch.baddbmm(self.head_b, h, self.head_w)              # [B, NT, V]


def load_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    rec = torch.frombuffer(bytearray(raw), dtype=torch.int32).view(-1, LM_T + 1).long()
    n = rec.shape[0] // LM_BATCH
    rec = rec[: n * LM_BATCH].view(n, LM_BATCH, LM_T + 1)
    return rec[:, :, :LM_T].contiguous(), rec[:, :, 1:].contiguous()


def run_lm(mode, B, steps, warmup, data):
    """Seconds and CPU seconds of the timed steps of B solo CharLMs one after
    another, or of one HftaCharLM of B."""
    xs, ys = data
    timed = cpu = 0.0
    jobs = B if mode == "solo" else 1
    for j in range(jobs):
        torch.manual_seed(100 + j)
        m = CharLM() if mode == "solo" else HftaCharLM(B)
        opt = torch.optim.Adam(m.parameters(), lr=lr_of(j), foreach=True)
        for s in range(warmup + steps):
            if s == warmup:
                t0, c0 = time.perf_counter(), time.process_time()
            x, y = xs[s % xs.shape[0]], ys[s % ys.shape[0]]
            opt.zero_grad(set_to_none=True)
            logits = m(x)
            if mode == "solo":
                loss = F.cross_entropy(logits.reshape(-1, LM_V), y.reshape(-1))
            else:  # per-member mean over N*T positions, summed over members
                loss = F.cross_entropy(logits.reshape(-1, LM_V), y.reshape(-1).repeat(B),
                                       reduction="sum") / y.numel()
            loss.backward()
            opt.step()
        timed += time.perf_counter() - t0
        cpu += time.process_time() - c0
    return timed, cpu


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
    ap.add_argument("--model", choices=["mlp", "cnn", "charlm"], required=True)
    ap.add_argument("--mode", choices=["solo", "hfta", "solo,hfta"], default="solo")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--B", default="1")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--work", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tag", default="", help="appended to the impl name of each line")
    ap.add_argument("--data", help="charlm: the token file of `fusion_bench tokens`")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.model == "charlm":
        if not a.data:
            ap.error("--model charlm needs --data")
        data = load_tokens(a.data)
        for B in [int(v) for v in a.B.split(",")]:
            steps = max(2, a.steps or -(-a.work // B))
            for mode in a.mode.split(","):
                t, c = run_lm(mode, B, steps, a.warmup, data)
                n = B * steps * LM_BATCH
                print("train impl=torch-%s%s model=charlm threads=%d B=%d sps=%.1f cpu_sps=%.1f"
                      % (mode, a.tag, a.threads, B, n / t, n / c), flush=True)
        return 0
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
