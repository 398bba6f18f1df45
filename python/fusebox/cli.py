"""The fusebox command line: python -m fusebox VERB ... (or `fusebox` once installed).

    submit SPEC.json [--wait]     submit a job; prints its id (with --wait, waits and prints
                                  its final metrics)
    sweep SWEEP.json              submit a sweep; prints its id and its trials' job ids
    ls [--state S] [--sweep ID]   the tenant's jobs, one a line (--sweeps: the sweeps)
    watch JOB                     follow a job to its end (a progress bar on a terminal)
    download JOB [-o FILE]        the job's model (default JOB.safetensors)
    cancel ID [--sweep]           cancel a job (or a sweep)

The server and the key come from FUSEBOX_URL and FUSEBOX_KEY (or --url, --key).
Add --json to print the API's answers as JSON.  Exit status: 0, 1 on an error
(the API's code, field and message on stderr), 2 on bad usage.
"""

import argparse
import json
import os
import sys

from . import metrics as M
from .client import TERMINAL, Client, progress_line
from .errors import ApiError, FuseboxError


def _print_json(v):
    print(json.dumps(v, indent=2, sort_keys=True))


def _final_metrics(job):
    latest = job.get("latest_metrics") or {}
    return " ".join(f"{k} {latest[k]:.6g}" for k in M.TRAINING + M.VALIDATION + M.TEST
                    if isinstance(latest.get(k), (int, float)))


def _watch(c, job_id, args):
    job = c.wait(job_id, timeout=args.timeout)
    if args.json:
        _print_json(job)
    else:
        print(f"{job['id']} {job['state']} step {job['step']} {_final_metrics(job)}".rstrip())
    return 0 if job["state"] == "completed" else 1


def _cmd_submit(c, args):
    job = c.submit(args.spec, idempotency_key=args.idempotency_key)
    if args.wait:
        if not args.json:
            print(job["id"], flush=True)
        return _watch(c, job["id"], args)
    if args.json:
        _print_json(job)
    else:
        print(job["id"])
    return 0


def _cmd_sweep(c, args):
    sw = c.sweep(args.spec, idempotency_key=args.idempotency_key)
    if args.json:
        _print_json(sw)
        return 0
    print(sw["id"])
    for t in sw.get("trials", []):
        print(f"  trial {t['index']} {t['job_id']} {t['name']} {json.dumps(t['params'])}")
    return 0


def _cmd_ls(c, args):
    if args.sweeps:
        rows = c.list_sweeps()
        if args.json:
            _print_json(rows)
        for s in [] if args.json else rows:
            print(f"{s['id']}  {s['state']:<9} {s['n_trials']:>4} trials  {s['name']}")
        return 0
    rows = c.list(state=args.state, sweep_id=args.sweep, name=args.name)
    if args.json:
        _print_json(rows)
        return 0
    for j in rows:
        total = j.get("steps") or j.get("epochs")
        print(f"{j['id']}  {j['state']:<9} {j['step']:>7}/{total:<7} {j['name']}  "
              f"{_final_metrics(j)}".rstrip())
    return 0


def _cmd_watch(c, args):
    return _watch(c, args.job, args)


def _cmd_download(c, args):
    path = args.output or f"{args.job}.safetensors"
    c.download(args.job, path)
    print(path)
    return 0


def _cmd_cancel(c, args):
    r = c.cancel_sweep(args.id) if args.sweep else c.cancel(args.id)
    if args.json:
        _print_json(r)
    else:
        print(f"{r['id']} {r['state']}")
    return 0


def parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="the server (default $FUSEBOX_URL)")
    common.add_argument("--key", help="the tenant's API key (default $FUSEBOX_KEY)")
    common.add_argument("--json", action="store_true", help="print the API's answers as JSON")
    # the options go after the verb (one parser defines them, so they cannot shadow)
    p = argparse.ArgumentParser(prog="fusebox", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    s = sub.add_parser("submit", parents=[common], help="submit a job from a JSON file")
    s.add_argument("spec", help="the job spec, a JSON file")
    s.add_argument("--wait", action="store_true", help="wait for the job to end")
    s.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")
    s.add_argument("--idempotency-key", help="the Idempotency-Key header")
    s.set_defaults(run=_cmd_submit)
    s = sub.add_parser("sweep", parents=[common], help="submit a sweep from a JSON file")
    s.add_argument("spec", help="the sweep spec, a JSON file")
    s.add_argument("--idempotency-key", help="the Idempotency-Key header")
    s.set_defaults(run=_cmd_sweep)
    s = sub.add_parser("ls", parents=[common], help="list jobs (or sweeps)")
    s.add_argument("--state", help="only jobs in this state")
    s.add_argument("--sweep", help="only the trials of this sweep")
    s.add_argument("--name", help="only jobs of this name")
    s.add_argument("--sweeps", action="store_true", help="list the sweeps instead")
    s.set_defaults(run=_cmd_ls)
    s = sub.add_parser("watch", parents=[common], help="follow a job to its end")
    s.add_argument("job", help="the job's id")
    s.add_argument("--timeout", type=float, help="give up after this many seconds")
    s.set_defaults(run=_cmd_watch)
    s = sub.add_parser("download", parents=[common], help="download a job's model")
    s.add_argument("job", help="the job's id")
    s.add_argument("-o", "--output", help="the file (default JOB.safetensors)")
    s.set_defaults(run=_cmd_download)
    s = sub.add_parser("cancel", parents=[common], help="cancel a job or a sweep")
    s.add_argument("id", help="the job's (or with --sweep the sweep's) id")
    s.add_argument("--sweep", action="store_true", help="the id is a sweep's")
    s.set_defaults(run=_cmd_cancel)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        c = Client(args.url or os.environ.get("FUSEBOX_URL"),
                   args.key or os.environ.get("FUSEBOX_KEY"))
    except FuseboxError as e:
        print(f"fusebox: {e}", file=sys.stderr)
        return 2
    try:
        return args.run(c, args)
    except ApiError as e:
        where = f" ({e.field})" if e.field else ""
        print(f"fusebox: {e.code or e.status}{where}: {e.message}", file=sys.stderr)
        return 1
    except FuseboxError as e:
        print(f"fusebox: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
