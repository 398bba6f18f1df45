#!/usr/bin/env bash
# The simulator's scenarios, each under four variants side by side: fusion
# off/on x rebalancing (the fair-share controller) off/on, with every figure's
# ratio to the baseline (neither), then one summary table of what
# rebalancing and fusion each gain.  Scenario 1 (paper*.jsonl) is the
# setting of Kim & Kim (J. IEIE 2022), whose rebalancing reported max
# slowdown -53% and GPU utilization +25%; Scenario 2 (scale*.jsonl) is 1,000
# GPUs and 20,000 jobs, which must run in under 60 s of wall time.
#
# The simulated figures are deterministic (same scenario, same numbers);
# only the wall times vary, and each is the median of REPS runs.
#
# usage: bench/sim/run.sh [BUILD_DIR]
#   env: REPS (3), SCENARIOS ("paper-minimal paper paper-crowded paper-3gpus paper-5gpus
#        paper-widths paper-mixed paper-wide scale scale-busy"),
#        MIGRATE=1 (also act on the controller's migration suggestions)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
sim=$build/sim/fusebox-sim
[ -x "$sim" ] || { echo "run.sh: $sim is not built (make -C $build fusebox-sim)" >&2; exit 1; }
reps=${REPS:-3}
scenarios=${SCENARIOS:-paper-minimal paper paper-crowded paper-3gpus paper-5gpus paper-widths paper-mixed paper-wide scale scale-busy}
flags=()
[ "${MIGRATE:-0}" = 1 ] && flags+=(--migrate)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for s in $scenarios; do
    file=$root/sim/scenarios/$s.jsonl
    echo "== $s ($(date -u +%Y-%m-%d), $sim --compare ${flags[*]} sim/scenarios/$s.jsonl)"
    "$sim" --compare "${flags[@]}" "$file"
    for r in $(seq 1 "$reps"); do
        "$sim" --compare --json "${flags[@]}" "$file" > "$tmp/$s.$r.json"
    done
    echo
done

/usr/bin/python3 - "$tmp" "$reps" $scenarios <<'PY'
import json, statistics, sys
tmp, reps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def pct(new, old):
    return "%+.0f%%" % ((new / old - 1) * 100) if old > 0 else "-"

print("What each policy gains (ratios of the same scenario run side by side):")
hdr = ("scenario", "rebal: max slow", "rebal: util", "rebal: p95 slow",
       "fusion: makespan", "fusion: mean JCT", "fusion: max slow", "wall s (max)")
print("%-14s %16s %12s %16s %17s %17s %17s %13s" % hdr)
for n in names:
    runs = [json.load(open("%s/%s.%d.json" % (tmp, n, r)))["runs"] for r in range(1, reps + 1)]
    v = {x["label"]: x for x in runs[0]}
    base, fus, reb, both = v["baseline"], v["+fusion"], v["+rebalance"], v["fusebox"]
    # rebalancing with fusion on (fusebox against +fusion); fusion with
    # rebalancing on (fusebox against +rebalance); the other pairs are in
    # the tables above
    wall = max(statistics.median(r[k]["wall_s"] for r in runs) for k in range(4))
    print("%-14s %16s %12s %16s %17s %17s %17s %13.2f" % (
        n, pct(both["slowdown_max"], fus["slowdown_max"]),
        pct(both["utilization"], fus["utilization"]),
        pct(both["slowdown_p95"], fus["slowdown_p95"]),
        pct(both["makespan_s"], reb["makespan_s"]), pct(both["jct_mean_s"], reb["jct_mean_s"]),
        pct(both["slowdown_max"], reb["slowdown_max"]), wall))
print("paper's rebalancing (Scenario 1): max slowdown -53%, utilization +25%")
PY
