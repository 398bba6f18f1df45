#!/usr/bin/env python3
"""Turns the raw lines of bench/fusion/run.sh into its table of medians and ratios.

usage: table.py RAW_FILE
Raw lines are "KIND key=value ..." as printed by fusion_bench and torch_bench.py:
  train impl=... model=... threads=... B=... sps=... [gflops=...] [cpu_sps=...]
  sgemm threads=... n=... gflops=...
  rss model=... B=... fused_kib=... solo_sum_kib=... solo_max_kib=...
  rss_torch model=... solo_kib=...
  load when=... avg1=...
Every figure is the median over the repetitions found in the file.  For the
charlm model (whose lines all carry cpu_sps) the table also gives the ratios
of samples per CPU second, steadier than wall time on a shared machine.
"""
import statistics
import sys
from collections import defaultdict

IMPLS = ["fusebox-fused", "fusebox-solo", "torch-solo", "torch-hfta"]


def parse(path):
    rows = []
    for line in open(path):
        parts = line.split()
        if not parts or "=" in parts[0]:
            continue
        kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        rows.append((parts[0], kv))
    return rows


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def ratio(a, b):
    return a / b if a == a and b == b and b > 0 else float("nan")


def main():
    rows = parse(sys.argv[1])
    sps = defaultdict(list)     # (impl, model, threads, B) -> [samples x models / s]
    cps = defaultdict(list)     # the same per CPU second, where a line gives it
    gfl = defaultdict(list)     # (model, threads, B) -> fused GFLOP/s
    sgemm = defaultdict(list)   # threads -> GFLOP/s
    rss, rss_torch, load = {}, defaultdict(list), []
    for kind, kv in rows:
        if kind == "train":
            key = (kv["impl"], kv["model"], int(kv["threads"]), int(kv["B"]))
            sps[key].append(float(kv["sps"]))
            if "cpu_sps" in kv:
                cps[key].append(float(kv["cpu_sps"]))
            if kv["impl"] == "fusebox-fused":
                gfl[key[1:]].append(float(kv["gflops"]))
        elif kind == "sgemm":
            sgemm[int(kv["threads"])].append(float(kv["gflops"]))
        elif kind == "rss":
            rss[kv["model"]] = kv
        elif kind == "rss_torch":
            rss_torch[kv["model"]].append(int(kv["solo_kib"]))
        elif kind == "load":
            load.append("%s %s" % (kv.get("when", "?"), kv.get("avg1", "?")))

    models = sorted({k[1] for k in sps}, key=lambda m: ["mlp", "cnn", "charlm"].index(m))
    threads = sorted({k[2] for k in sps})
    reps = max((len(v) for v in sps.values()), default=0)
    print("# medians of %d repetitions; samples x models per second; load average (1 min) %s"
          % (reps, ", ".join(load)))
    for t in threads:
        print("# SGEMM %d thread(s), n=2048: %.1f GFLOP/s (median of %d)"
              % (t, med(sgemm[t]), len(sgemm[t])))
    checks = []
    for m in models:
        Bs = sorted({k[3] for k in sps if k[1] == m})
        for t in threads:
            peak = med(sgemm[t])
            print()
            print("## %s, %d thread(s)" % (m, t))
            print("%4s %11s %11s %11s %11s | %7s %8s %8s | %7s %6s"
                  % ("B", "fused", "solo", "torch-solo", "torch-hfta", "f/solo", "f/t-solo",
                     "f/t-hfta", "GFLOP/s", "%SGEMM"))
            for B in Bs:
                v = [med(sps[(i, m, t, B)]) for i in IMPLS]
                g = med(gfl[(m, t, B)])
                print("%4d %11.0f %11.0f %11.0f %11.0f | %7.2f %8.2f %8.2f | %7.1f %5.0f%%"
                      % (B, v[0], v[1], v[2], v[3], ratio(v[0], v[1]), ratio(v[0], v[2]),
                         ratio(v[0], v[3]), g, 100 * ratio(g, peak)))
            if m == "charlm":
                print("  per CPU second (spread: min..max over the repetitions):")
                for B in Bs:
                    c = [med(cps[(i, m, t, B)]) for i in IMPLS]
                    spread = "  ".join("%s %.0f..%.0f" % (i, min(cps[(i, m, t, B)]),
                                                          max(cps[(i, m, t, B)]))
                                       for i in IMPLS if cps[(i, m, t, B)])
                    print("%4d %11.0f %11.0f %11.0f %11.0f | %7.2f %8.2f %8.2f |  %s"
                          % (B, c[0], c[1], c[2], c[3], ratio(c[0], c[1]), ratio(c[0], c[2]),
                             ratio(c[0], c[3]), spread))
                if 8 in Bs and t == 1:
                    checks.append(("charlm t=1 fused B=8 / torch solo >= 2 (wall)",
                                   ratio(med(sps[("fusebox-fused", m, t, 8)]),
                                         med(sps[("torch-solo", m, t, 8)])), 2.0))
                    checks.append(("charlm t=1 fused B=8 / torch solo >= 2 (CPU time)",
                                   ratio(med(cps[("fusebox-fused", m, t, 8)]),
                                         med(cps[("torch-solo", m, t, 8)])), 2.0))
            glibc = [med(sps[("torch-solo-glibc", m, t, B)]) for B in (1, 16)]
            if glibc[0] == glibc[0]:
                print("     PyTorch solo with glibc's default malloc: B=1 %.0f, B=16 %.0f; "
                      "fused B=16 / it: %.2f"
                      % (glibc[0], glibc[1], ratio(med(sps[("fusebox-fused", m, t, 16)]),
                                                   glibc[1])))
            if 16 in Bs:
                v = [med(sps[(i, m, t, 16)]) for i in IMPLS]
                checks.append(("%s t=%d fused B=16 / fusebox solo >= 3" % (m, t),
                               ratio(v[0], v[1]), 3.0))
                checks.append(("%s t=%d fused B=16 / torch solo >= 4" % (m, t),
                               ratio(v[0], v[2]), 4.0))
                checks.append(("%s t=%d fused B=16 / torch hand-fused >= 1.5" % (m, t),
                               ratio(v[0], v[3]), 1.5))
            if 1 in Bs:
                checks.append(("%s t=%d B=1 fusebox / torch >= 1.0" % (m, t),
                               ratio(med(sps[("fusebox-fused", m, t, 1)]),
                                     med(sps[("torch-solo", m, t, 1)])), 1.0))
            if m == "mlp":
                for B in [b for b in Bs if b >= 16]:
                    checks.append(("mlp t=%d fused B=%d GFLOP/s / SGEMM >= 0.5" % (t, B),
                                   ratio(med(gfl[(m, t, B)]), peak), 0.5))
        if 1 in threads and 2 in threads:
            print()
            print("## %s, fused array: 2 threads / 1 thread" % m)
            print("  ".join("B=%d %.2f" % (B, ratio(med(sps[("fusebox-fused", m, 2, B)]),
                                                    med(sps[("fusebox-fused", m, 1, B)])))
                            for B in Bs))
            if 16 in Bs:
                checks.append(("%s fused B=16 2 threads / 1 thread >= 1.6" % m,
                               ratio(med(sps[("fusebox-fused", m, 2, 16)]),
                                     med(sps[("fusebox-fused", m, 1, 16)])), 1.6))
    if rss:
        print()
        print("## peak RSS (MiB): one fused array of B vs B solo processes, each training")
        print("%4s %4s %10s %14s %12s %10s %17s %10s"
              % ("", "B", "fused", "sum fb solo", "fused/sum", "torch solo", "sum torch solo",
                 "fused/sum"))
        for m in models:
            if m not in rss:
                continue
            r = rss[m]
            B = int(r["B"])
            f, s = int(r["fused_kib"]) / 1024, int(r["solo_sum_kib"]) / 1024
            ts = rss_torch.get(m, [])
            tsum = sum(ts) / 1024 if ts else float("nan")
            print("%4s %4d %10.1f %14.1f %12.3f %10.1f %17.1f %10.3f"
                  % (m, B, f, s, f / s, med(ts) / 1024 if ts else float("nan"), tsum,
                     ratio(f, tsum)))
            checks.append(("%s peak RSS fused %d / sum of %d fusebox solo <= 0.25" % (m, B, B),
                           f / s, -0.25))
    print()
    print("## targets")
    for name, val, bound in checks:
        ok = val <= -bound if bound < 0 else val >= bound
        print("%-52s %7.3f  %s" % (name, val, "met" if ok else "MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
