#!/usr/bin/env python3
"""What open dashboards cost fuseboxd, with and without conditional reads.

Usage: dashboards.py URL KEY JOB_ID FUSEBOXD_PID [--dashboards N] [--seconds S] [--runs R]

Each dashboard is a thread that polls the way the dashboard's jobs page and a job's page do,
every 2 seconds (web/app.js POLL_MS): GET /v1/jobs?limit=200, GET /v1/cluster and
GET /v1/jobs/{id}.  In the "plain" mode it sends no If-None-Match; in the "conditional" mode it
names the last ETag of each read, as web/app.js does, and an unchanged answer is a 304 without
a body.  The modes alternate, R runs of S seconds each; for every run it prints the requests
per second served, the bytes of response bodies per second, the share of 304s, and the CPU
fuseboxd and the PostgreSQL server spent per second (from /proc, user + system), then the
medians side by side.  Standard library only.
"""
import argparse
import http.client
import os
import statistics
import sys
import threading
import time
import urllib.parse

POLL_S = 2.0


def cpu_seconds(pids):
    """User + system CPU seconds of the given processes (those still alive)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def postgres_pids():
    """Every process whose command name is postgres (the server and its backends)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/comm") as f:
                if f.read().strip() == "postgres":
                    out.append(int(name))
        except OSError:
            pass
    return out


class Dashboard(threading.Thread):
    def __init__(self, url, key, paths, conditional, stop, start_at):
        super().__init__(daemon=True)
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.key, self.paths, self.conditional = key, paths, conditional
        self.stop, self.start_at = stop, start_at
        self.etags = {}
        self.requests = self.not_modified = self.body_bytes = self.errors = 0

    def run(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        time.sleep(max(0.0, self.start_at - time.monotonic()))
        while not self.stop.is_set():
            t0 = time.monotonic()
            for path in self.paths:
                headers = {"Authorization": f"Bearer {self.key}"}
                if self.conditional and path in self.etags:
                    headers["If-None-Match"] = self.etags[path]
                try:
                    conn.request("GET", path, headers=headers)
                    r = conn.getresponse()
                    body = r.read()
                except (OSError, http.client.HTTPException):
                    self.errors += 1
                    conn.close()
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                    continue
                self.requests += 1
                self.body_bytes += len(body)
                if r.status == 304:
                    self.not_modified += 1
                elif r.status == 200:
                    tag = r.getheader("ETag")
                    if tag:
                        self.etags[path] = tag
                else:
                    self.errors += 1
            self.stop.wait(max(0.0, POLL_S - (time.monotonic() - t0)))
        conn.close()


def one_run(args, conditional):
    paths = ["/v1/jobs?limit=200", "/v1/cluster", f"/v1/jobs/{args.job}"]
    stop = threading.Event()
    # the dashboards open over one poll interval, as people's do, not all at one instant
    t0 = time.monotonic()
    boards = [Dashboard(args.url, args.key, paths, conditional, stop,
                        t0 + POLL_S * i / args.dashboards) for i in range(args.dashboards)]
    for b in boards:
        b.start()
    time.sleep(POLL_S * 2)  # warm-up: every dashboard has its tags
    pg = postgres_pids()
    req0 = sum(b.requests for b in boards)
    nm0 = sum(b.not_modified for b in boards)
    by0 = sum(b.body_bytes for b in boards)
    c0, p0, w0 = cpu_seconds([args.pid]), cpu_seconds(pg), time.monotonic()
    time.sleep(args.seconds)
    c1, p1, w1 = cpu_seconds([args.pid]), cpu_seconds(pg), time.monotonic()
    req1 = sum(b.requests for b in boards)
    nm1 = sum(b.not_modified for b in boards)
    by1 = sum(b.body_bytes for b in boards)
    stop.set()
    for b in boards:
        b.join()
    errors = sum(b.errors for b in boards)
    if errors:
        sys.exit(f"dashboards: {errors} requests failed or were not 200/304")
    dt = w1 - w0
    n = req1 - req0
    return {"rps": n / dt, "bytes_ps": (by1 - by0) / dt, "nm": (nm1 - nm0) / n if n else 0.0,
            "cpu": (c1 - c0) / dt, "pg_cpu": (p1 - p0) / dt}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("key")
    ap.add_argument("job")
    ap.add_argument("pid", type=int)
    ap.add_argument("--dashboards", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    results = {"plain": [], "conditional": []}
    for i in range(args.runs):
        for mode in ("plain", "conditional"):
            r = one_run(args, mode == "conditional")
            results[mode].append(r)
            print(f"  run {i + 1} {mode:11s}: {r['rps']:.1f} req/s, {r['bytes_ps'] / 1024:.1f} KiB/s "
                  f"of bodies, {100 * r['nm']:.0f}% 304, fuseboxd {100 * r['cpu']:.1f}% CPU, "
                  f"PostgreSQL {100 * r['pg_cpu']:.1f}% CPU", file=sys.stderr)
    m = statistics.median
    med = {k: {f: m([r[f] for r in v]) for f in v[0]} for k, v in results.items()}
    p, c = med["plain"], med["conditional"]
    print(f"| {args.dashboards} dashboards polling every {POLL_S:g} s (median of {args.runs} x "
          f"{args.seconds:g} s) | plain | conditional | conditional / plain |")
    print("|---|---|---|---|")
    print(f"| requests per second served | {p['rps']:.1f} | {c['rps']:.1f} | {c['rps'] / p['rps']:.2f} |")
    print(f"| response body KiB per second | {p['bytes_ps'] / 1024:.1f} | {c['bytes_ps'] / 1024:.1f} "
          f"| {c['bytes_ps'] / p['bytes_ps']:.3f} |")
    print(f"| answers that were 304 | {100 * p['nm']:.0f}% | {100 * c['nm']:.0f}% | |")
    print(f"| fuseboxd CPU (% of one core) | {100 * p['cpu']:.1f} | {100 * c['cpu']:.1f} "
          f"| {c['cpu'] / p['cpu']:.2f} |" if p["cpu"] > 0 else "| fuseboxd CPU | 0 | | |")
    print(f"| PostgreSQL CPU (% of one core) | {100 * p['pg_cpu']:.1f} | {100 * c['pg_cpu']:.1f} "
          f"| {c['pg_cpu'] / p['pg_cpu']:.2f} |" if p["pg_cpu"] > 0 else "| PostgreSQL CPU | 0 | | |")


if __name__ == "__main__":
    main()
