#!/usr/bin/env python3
"""Prints the GPU benchmark table from gpu_bench's log (tests/gpu/run.sh).

Lines read: "sgemm n=... gflops=G", "train impl=fused|serial model=M B=B sps=S
gflops=G" and "proc mode=concurrent|mps B=B model=M start=T0 end=T1 samples=N
gflop=F" (one per process).  A concurrent run's rate is the samples of all its
processes over the span from the first start to the last end.  Columns:
samples x models per second of each way of running B jobs, fused over serial,
fused over concurrent (and over MPS), and the fused run's GEMM FLOP rate as a
fraction of the device's measured SGEMM rate.
"""
import sys
from collections import defaultdict


def fields(line):
    out = {}
    for tok in line.split()[1:]:
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = v
    return out


def main():
    if len(sys.argv) != 2:
        print("usage: table.py GPU_BENCH_LOG", file=sys.stderr)
        return 2
    sgemm = None
    train = {}  # (model, impl, B) -> (sps, gflops)
    procs = defaultdict(list)  # (model, mode, B) -> [(start, end, samples, gflop)]
    with open(sys.argv[1]) as f:
        for line in f:
            kind = line.split(" ", 1)[0]
            d = fields(line)
            try:
                if kind == "sgemm":
                    sgemm = float(d["gflops"])
                elif kind == "train":
                    train[(d["model"], d["impl"], int(d["B"]))] = (float(d["sps"]), float(d["gflops"]))
                elif kind == "proc":
                    procs[(d["model"], d["mode"], int(d["B"]))].append(
                        (float(d["start"]), float(d["end"]), int(d["samples"]), float(d["gflop"])))
            except (KeyError, ValueError):
                print(f"table.py: ignoring malformed line: {line.strip()}", file=sys.stderr)

    def proc_rate(model, mode, B):
        runs = procs.get((model, mode, B))
        if not runs or len(runs) != B:
            return None  # a process failed: no rate rather than a wrong one
        span = max(r[1] for r in runs) - min(r[0] for r in runs)
        return sum(r[2] for r in runs) / span if span > 0 else None

    def fmt(v, spec):
        if v is not None:
            return format(v, spec)
        width = spec.split(".")[0]
        return format("-", ">" + width) if width else "-"

    print(f"GPU benchmark: samples x models / s, batch 128; cuBLAS SGEMM "
          f"{fmt(sgemm, '.0f')} GFLOP/s (8192^3, float)")
    hdr = (f"{'model':5} {'B':>3} {'fused':>10} {'serial':>10} {'concurrent':>10} {'MPS':>10} "
           f"{'f/serial':>8} {'f/conc':>7} {'f/MPS':>6} {'GEMM frac':>9}")
    print(hdr)
    print("-" * len(hdr))
    best = {}
    for model in ("mlp", "cnn"):
        Bs = sorted({k[2] for k in train if k[0] == model} | {k[2] for k in procs if k[0] == model})
        for B in Bs:
            fu = train.get((model, "fused", B))
            se = train.get((model, "serial", B))
            co = proc_rate(model, "concurrent", B)
            mp = proc_rate(model, "mps", B)
            f = fu[0] if fu else None
            s = se[0] if se else None
            r_s = f / s if f and s else None
            r_c = f / co if f and co else None
            r_m = f / mp if f and mp else None
            frac = fu[1] / sgemm if fu and sgemm else None
            if r_s is not None and r_s > best.get(model, (0, 0))[0]:
                best[model] = (r_s, B)
            print(f"{model:5} {B:>3} {fmt(f, '10.0f')} {fmt(s, '10.0f')} {fmt(co, '10.0f')} "
                  f"{fmt(mp, '10.0f')} {fmt(r_s, '8.2f')} {fmt(r_c, '7.2f')} {fmt(r_m, '6.2f')} "
                  f"{fmt(frac, '9.3f')}")
    for model, (r, B) in best.items():
        print(f"{model}: best fused/serial {r:.2f}x at B={B} (target >= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
