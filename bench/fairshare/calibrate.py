"""Turns the calibration jobs of bench/fairshare (lib.sh, fair_calibrate) into
the simulator's cost model, written as scenario records (sim/README.md).

usage: calibrate.py JOBS PROGRESS PROFILES CORES OUT PLAIN_OUT

JOBS: name|steps|created|scheduled|started|finished|worker|state per job (epoch
seconds); PROGRESS: name|step|recorded per progress report; PROFILES:
model|seconds, the step time alone fuseboxd's profiles table holds per model
(measured once, by fuseboxd, in its own way; its fair-share controller acts on
it, so the simulator's controller is given it as the profile's isolated_s).  A job's steady
reports are all but its first (which holds the first step's warm-up) and its
last (which holds the final evaluation and export).  Lines t = a + b * step
fitted through its first three steady reports and through its last three (or
as many as it has, at least two) say
when its steady stepping would have begun and when its last step would have
ended at the pace it had then; so, per job:

  dispatch = scheduled - created                  (the control loop places it)
  start    = a_first - scheduled                  (assignment, data load, warm-up)
  end      = finished - (a_last + b_last * steps) (final evaluation, export, record)

Phase A (each model alone) gives each model's step time (the slope through
all its steady reports; alone, its pace does not change), start and end cost.
Phase B (two models at once, one array per device) gives g(2), the step-time
inflation of two busy devices on one host (sim/README.md): each job's step
time over the span both step, over its step time alone; the interference
written is g(2) - 1 (on two cores or more).  Phases C and D (two and three
arrays on each device, both devices busy) give what taking turns on a device
costs beyond that: a device's work rate E_k while its k arrays all step (the
sum of their step times alone over their step times shared) is
(1 - loss_k) / g(2), so loss_k = 1 - E_k g(2).  switch_overhead is loss_2
and switch_overhead_step is loss_3 - loss_2 (each at least 0: a device that
shares at no cost in this calibration is not credited with a gain).
dispatch is the median over every calibration job.

OUT gets every measured term; PLAIN_OUT the same profiles with their step times
only (the model without the new terms), for comparison.  Both start with
comments that list each job's figures.
"""
import statistics
import sys

def fit(pts):
    """Least-squares line t = a + b * step through pts [(step, t)]."""
    n = len(pts)
    sx = sum(p[0] for p in pts)
    st = sum(p[1] for p in pts)
    sxx = sum(p[0] * p[0] for p in pts)
    sxt = sum(p[0] * p[1] for p in pts)
    d = n * sxx - sx * sx
    b = (n * sxt - sx * st) / d
    return (st - b * sx) / n, b


def main():
    if len(sys.argv) != 7:
        sys.exit(__doc__.split('\n\n')[1])
    jobs, prog = {}, {}
    for line in open(sys.argv[1]):
        f = line.strip().split('|')
        if len(f) != 8:
            continue
        name, steps, created, sched, started, finished, worker, state = f
        if state != 'completed':
            continue
        jobs[name] = dict(steps=int(steps), created=float(created), sched=float(sched),
                          started=float(started), finished=float(finished), worker=worker)
    for line in open(sys.argv[2]):
        f = line.strip().split('|')
        if len(f) == 3 and f[0] in jobs:
            prog.setdefault(f[0], []).append((int(f[1]), float(f[2])))
    stored = {}
    for line in open(sys.argv[3]):
        f = line.strip().split('|')
        if len(f) == 2:
            stored[f[0]] = float(f[1])
    cores = int(sys.argv[4])
    t0 = min(j['created'] for j in jobs.values())
    notes = []
    for name, j in jobs.items():
        pts = [p for p in prog.get(name, []) if 1 < p[0] < j['steps']]
        if len(pts) < 2:
            sys.exit('calibrate.py: job %s has %d progress reports inside its run; '
                     'make the calibration jobs longer' % (name, len(pts)))
        a_first, _ = fit(pts[:3])
        a_last, b_last = fit(pts[-3:])
        _, b = fit(pts)
        j.update(pts=pts, b=b, dispatch=j['sched'] - j['created'], start=a_first - j['sched'],
                 end=j['finished'] - (a_last + b_last * j['steps']))
        notes.append('# %-8s %-7s steps %5d  dispatch %.3f s  first step %.3f s  start %.3f s  '
                     'step %.3f ms  end %.3f s  (submitted at %.1f s, %d reports)'
                     % (name, j['worker'], j['steps'], j['dispatch'], j['started'] - j['sched'],
                        j['start'], 1e3 * b, j['end'], j['created'] - t0, len(pts)))

    def get(name):
        if name not in jobs:
            sys.exit('calibrate.py: calibration job %s did not complete' % name)
        return jobs[name]

    models = range(4)
    alone = {m: get('calA-m%d' % m) for m in models}

    def overlap(group):
        """Each job's step time over the span in which every job of group steps."""
        lo = max(c['pts'][0][1] for c in group)
        hi = min(c['pts'][-1][1] for c in group)
        out = []
        for c in group:
            pts = [p for p in c['pts'] if lo <= p[1] <= hi]
            if len(pts) < 2:
                return None, hi - lo
            out.append(fit(pts)[1])
        return out, hi - lo

    # phase B: two busy devices on the host
    ratios = {}
    for pair in ((0, 3), (1, 2)):
        group = [get('calB-m%d' % m) for m in pair]
        if group[0]['worker'] == group[1]['worker']:
            sys.exit('calibrate.py: phase B placed m%d and m%d on one worker' % pair)
        slopes, span = overlap(group)
        if not slopes:
            sys.exit('calibrate.py: phase B: m%d and m%d stepped together for only %.1f s'
                     % (pair + (span,)))
        for m, b in zip(pair, slopes):
            ratios[m] = b / alone[m]['b']
    g_b = statistics.mean(ratios.values())
    notes.append('# phase B: step time beside another busy device / alone: %s; g(2) = %.3f'
                 % (', '.join('m%d %.3f' % (m, ratios[m]) for m in models), g_b))
    g2 = g_b
    interference = max(0.0, g2 - 1.0) if cores >= 2 else 0.0

    def sharing(phase, models_of, k):
        """Each device's loss while its k arrays of phase all step: 1 - E_k g(2)."""
        by_worker = {}
        for name in models_of:
            c = get(name)
            by_worker.setdefault(c['worker'], []).append((int(name[-1]), c))
        losses = []
        for w, arrays in sorted(by_worker.items()):
            if len(arrays) != k:
                notes.append('# phase %s: worker %s holds %d arrays; skipped'
                             % (phase, w, len(arrays)))
                continue
            slopes, span = overlap([c for _, c in arrays])
            if slopes:
                rate = sum(alone[m]['b'] / b for (m, _), b in zip(arrays, slopes))
                losses.append(1.0 - rate * g2)
                notes.append('# phase %s: worker %s (%s) shared for %.1f s: work rate %.3f, '
                             'loss %.3f' % (phase, w, ', '.join('m%d' % m for m, _ in arrays), span,
                                             rate, losses[-1]))
        if not losses:
            sys.exit('calibrate.py: phase %s had no device with %d arrays stepping at once'
                     % (phase, k))
        return statistics.mean(losses)
    # phases C and D: two and three arrays on each device, over the time all of them step
    loss2 = sharing('C', ['calC-m%d' % m for m in models], 2)
    loss3 = sharing('D', ['cal%s-m%d' % (x, m) for x in 'DE' for m in range(3)], 3)
    switch = min(0.5, max(0.0, loss2))
    switch_step = min(0.5, max(0.0, loss3 - switch))
    notes.append('# host: g(2) = %.3f, interference %.4g on %d cores; taking turns: loss %.3f '
                 '(two arrays), %.3f (three): switch_overhead %.4g, switch_overhead_step %.4g'
                 % (g2, interference, cores, loss2, loss3, switch, switch_step))
    dispatch = statistics.median(j['dispatch'] for j in jobs.values())
    for label, phase in (('alone', 'A'), ('beside another busy device', 'B'),
                         ('two arrays to a device', 'C'), ('three arrays to a device', 'D')):
        js = [get('cal%s-m%d' % (phase, m)) for m in (range(3) if phase == 'D' else models)]
        notes.append('# %s: start %.3f s, end %.3f s on average'
                     % (label, statistics.mean(j['start'] for j in js),
                        statistics.mean(j['end'] for j in js)))

    def profile(m, costs):
        p = ('{"type": "profile", "name": "m%d", "step_s": %.6g, "batch": 128, "kind": "cpu", '
             '"member_gib": 0.05, "shared_gib": 0.01' % (m, alone[m]['b']))
        if costs:
            p += ', "start_s": %.4g, "end_s": %.4g' % (max(0.0, alone[m]['start']),
                                                       max(0.0, alone[m]['end']))
            if 'm%d' % m in stored:
                p += ', "isolated_s": %.6g' % stored['m%d' % m]
        return p + '}'

    head = ['# the cost model of a fusebox cluster, measured by bench/fairshare (calibrate.py)',
            '# per calibration job:'] + notes
    with open(sys.argv[5], 'w') as f:
        f.write('\n'.join(head) + '\n')
        f.write('{"type": "sim", "dispatch_s": %.4g, "switch_overhead": %.4g, '
                '"switch_overhead_step": %.4g}\n' % (max(0.0, dispatch), switch, switch_step))
        f.write('{"type": "host", "name": "local", "cores": %d, "interference": %.4g}\n'
                % (cores, interference))
        for m in models:
            f.write(profile(m, True) + '\n')
    with open(sys.argv[6], 'w') as f:
        f.write('# the step times of the same calibration, without the other terms\n')
        f.write('{"type": "host", "name": "local", "cores": %d}\n' % cores)
        for m in models:
            f.write(profile(m, False) + '\n')


if __name__ == '__main__':
    main()
