#!/usr/bin/env python3
"""Checks the one vocabulary of metric names (docs/jobspec.md, "## Metrics").

The section's first table names the metrics of the series; the table after
"Reported beside them" names the others; the event table gives the metric
keys of each fusebox-train event.  Required:

- the first table's names are exactly, in order, the `fields` the metrics
  route serves (`metric_fields` in server/routes_jobs.c), the names its 400
  message lists, api/openapi.yaml's enum of MetricSeries.fields and the
  properties of its points (besides step and time);
- the sweep's metric enum and its early-stopping rule's in api/openapi.yaml
  are the first four names (the training and validation loss and accuracy:
  a test metric never decides);
- every metric key fusebox-train prints (workers/fusebox_train.c) is in the
  vocabulary, and the event table lists exactly those keys;
- every metric name the dashboard (web/*.js) reads from latest_metrics or
  the series is in the vocabulary;
- every Prometheus name the tables mention exists in server/metrics.c;
- the names used before the vocabulary (eval_loss, eval_accuracy, eval_step,
  train_accuracy, io_wait_ms) appear in none of fusebox-train's strings, the
  dashboard, the API contract, the Python package, the server's strings, the
  scripts and the benchmark programs.

Before the real check it runs the same comparison on planted inputs with
known mistakes and requires exactly those to be found, so a checker that
finds nothing cannot pass.  Exit 0: the vocabulary is one; 1: it is not.
"""
import os
import re
import sys

import yaml

SRC = os.environ.get("FB_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
DOC = os.path.join(SRC, "docs", "jobspec.md")
ROUTES = os.path.join(SRC, "server", "routes_jobs.c")
OPENAPI = os.path.join(SRC, "api", "openapi.yaml")
TRAIN = os.path.join(SRC, "workers", "fusebox_train.c")
# the dashboard's own modules (web/*.js; not node_modules)
APP_FILES = sorted(os.path.join("web", n) for n in os.listdir(os.path.join(SRC, "web"))
                   if n.endswith(".js"))
PROM = os.path.join(SRC, "server", "metrics.c")
OLD_NAMES = ["eval_loss", "eval_accuracy", "eval_step", "train_accuracy", "io_wait_ms"]
# where the old names must not come back: (directory or file, suffixes)
# (bench/RESULTS.md keeps the history of measurements, old names included)
OLD_NAME_PLACES = [("workers/fusebox_train.c", ()), *((f, ()) for f in APP_FILES), ("api/openapi.yaml", ()),
                   ("python/fusebox", (".py",)), ("server", (".c",)), ("scripts", ()),
                   ("bench", (".sh", ".c", ".py"))]
# fusebox-train's keys that are not metrics (docs/jobspec.md's event table, other columns)
STRUCTURAL = {"event", "job", "member", "group", "array_size", "step", "steps", "error",
              "message", "weights"}
NAME_RE = re.compile(r"`([a-z][a-z0-9_]*)`")
PROM_RE = re.compile(r"`(fusebox_[a-z0-9_]+)")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip_c_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def tables(section):
    """The tables of a section: a list of (header cells, rows of cells)."""
    out, cur = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            cur = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if cur is None:
            cur = (cells, [])
            out.append(cur)
        elif not all(set(c) <= set("-: ") for c in cells):
            cur[1].append(cells)
    return out


def doc_vocabulary(doc):
    """(series names in order, other names, {event: metric keys}, Prometheus names) of the
    Metrics section, or a problem string."""
    m = re.search(r"^## Metrics\n(.*?)(?=^## )", doc, flags=re.S | re.M)
    if not m:
        return "no '## Metrics' section"
    tabs = tables(m.group(1))
    named = [t for t in tabs if t[0][:2] == ["name", "measured on"]]
    events = [t for t in tabs if t[0][:2] == ["event", "metric keys"]]
    if len(named) != 2 or len(events) != 1:
        return "the Metrics section needs two 'name | measured on' tables and one 'event | metric keys' table"

    def first(rows):
        names = []
        for r in rows:
            got = NAME_RE.findall(r[0])
            names += got if got else [r[0]]
        return names

    series, beside = first(named[0][1]), first(named[1][1])
    by_event = {}
    for r in events[0][1]:
        ev = NAME_RE.findall(r[0])
        keys = NAME_RE.findall(r[1]) if len(r) > 1 else []
        by_event[ev[0] if ev else r[0]] = [k for k in keys if k not in ("step", "--no-eval")]
    prom = set()
    for t in named:
        for r in t[1]:
            prom |= set(PROM_RE.findall(" ".join(r)))
    return series, beside, by_event, prom


def c_string_array(text, name):
    m = re.search(r"\b" + re.escape(name) + r"\[\]\s*=\s*\{(.*?)\};", text, flags=re.S)
    return re.findall(r'"([^"]*)"', m.group(1)) if m else None


def route_names(text):
    """metric_fields and the names of the 400 message of server/routes_jobs.c."""
    text = strip_c_comments(text)
    fields = c_string_array(text, "metric_fields")
    m = re.search(r'"fields: a comma-separated list of ((?:[^;])*?)\);', text, flags=re.S)
    listed = None
    if m:
        joined = "".join(re.findall(r'"([^"]*)"', '"' + m.group(1)))
        listed = [w.strip() for w in joined.split(",") if w.strip()]
    return fields, listed


def openapi_names(spec):
    """(MetricSeries fields enum, its points' properties besides step and time, the ASHA
    metric enum, the sweep's metric enum or None)."""
    schemas = spec["components"]["schemas"]
    ms = schemas["MetricSeries"]["properties"]
    enum = ms["fields"]["items"]["enum"]
    points = [k for k in ms["points"]["items"]["properties"] if k not in ("step", "time")]
    asha = None

    def walk(node):
        nonlocal asha
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and "metric" in props and "grace_steps" in props:
                asha = props["metric"].get("enum")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    sweep = schemas.get("SweepSpec", {}).get("properties", {}).get("metric", {}).get("enum")
    return enum, points, asha, sweep


def train_keys(text):
    """The JSON keys fusebox-train prints: the key of each put_*(o, "key", ...) call that
    adds a member to an event's line."""
    text = strip_c_comments(text)
    return set(re.findall(r'\bput_[a-z]+\(\s*\w+\s*,\s*"([a-z][a-z0-9_]*)"', text))


def app_names(text):
    """Metric names the dashboard reads: metricOf(x, 'n'), .column('n'), new Series(id,
    ['n', ...]) and the step-time parts of the job view."""
    names = set(re.findall(r"metricOf\(\s*\w+\s*,\s*'([a-z_]+)'\)", text))
    names |= set(re.findall(r"\.column\('([a-z_]+)'\)", text))
    for m in re.finditer(r"new Series\([^,]+,\s*\[([^\]]*)\]", text):
        names |= set(re.findall(r"'([a-z_]+)'", m.group(1)))
    for m in re.finditer(r"const parts = \[((?:'[a-z_]+',?\s*)+)\]", text):
        names |= set(re.findall(r"'([a-z_]+)'", m.group(1)))
    return names


def check(doc, routes, spec, train, app, prom, old_hits, where):
    problems = []
    voc = doc_vocabulary(doc)
    if isinstance(voc, str):
        return [f"{where}: {voc}"]
    series, beside, by_event, doc_prom = voc
    all_names = set(series) | set(beside)
    fields, listed = route_names(routes)
    enum, points, asha, sweep = openapi_names(spec)
    for label, names in (("server/routes_jobs.c metric_fields", fields),
                         ("server/routes_jobs.c's 400 message for fields", listed),
                         ("api/openapi.yaml MetricSeries.fields enum", enum),
                         ("api/openapi.yaml MetricSeries.points properties", points)):
        if names is None:
            problems.append(f"{where}: {label}: not found")
        elif list(names) != series:
            problems.append(f"{where}: {label} is {', '.join(names)}; the Metrics table says "
                            f"{', '.join(series)}")
    if asha is None or list(asha) != series[:4]:
        problems.append(f"{where}: the ASHA metric enum is {asha}; the Metrics table's first "
                        f"four are {series[:4]}")
    if sweep is None or list(sweep) != series[:4]:
        problems.append(f"{where}: the sweep metric enum is {sweep}; the Metrics table's first "
                        f"four are {series[:4]}")
    printed = train_keys(train) - STRUCTURAL
    for k in sorted(printed - all_names):
        problems.append(f"{where}: fusebox-train prints \"{k}\", which is not in the Metrics tables")
    in_events = set(k for keys in by_event.values() for k in keys)
    for k in sorted(in_events - printed):
        problems.append(f"{where}: the event table lists {k}, which fusebox-train does not print")
    for k in sorted(printed - in_events):
        problems.append(f"{where}: fusebox-train prints \"{k}\", which the event table does not list")
    for k in sorted(app_names(app) - all_names):
        problems.append(f"{where}: the dashboard reads metric '{k}', which is not in the Metrics tables")
    for n in sorted(doc_prom - set(re.findall(r"fusebox_[a-z0-9_]+", prom))):
        problems.append(f"{where}: the Metrics tables name {n}, which server/metrics.c does not serve")
    for h in old_hits:
        problems.append(f"{where}: {h}")
    return problems


SELF_DOC = """
## Metrics

| name | measured on | reported | carried by |
|---|---|---|---|
| `loss` | a | b | c |
| `accuracy` | a | b | c |
| `val_loss` | a | b | `fusebox_gone_metric` |
| `val_accuracy` | a | b | c |

Beside:

| name | measured on | reported | carried by |
|---|---|---|---|
| `lr` | a | b | c |

| event | metric keys | other keys |
|---|---|---|
| `step` | `loss`, `accuracy`, `lr` | |
| `eval` | `val_loss`, `val_accuracy`, `val_f1` | |

## Next
"""
SELF_ROUTES = """
static const char *const metric_fields[] = {"loss", "accuracy", "val_loss", "val_accuracy",
                                            "slowdown"};
    return fb_req_fail(req, FB_ERR_BAD_QUERY, "fields", "fields: a comma-separated list of "
                       "loss, accuracy, val_loss, val_accuracy");
"""
SELF_SPEC = {"components": {"schemas": {
    "MetricSeries": {"properties": {
        "fields": {"items": {"enum": ["loss", "accuracy", "val_loss", "val_accuracy"]}},
        "points": {"items": {"properties": {"step": {}, "time": {}, "loss": {}, "accuracy": {},
                                            "val_loss": {}, "val_accuracy": {}}}}}},
    "SweepSpec": {"properties": {"metric": {"enum": ["loss", "accuracy", "val_loss",
                                                     "test_accuracy"]}}},
    "Rule": {"properties": {"metric": {"enum": ["loss", "accuracy", "val_loss", "test_acc"]},
                            "grace_steps": {}}}}}}
SELF_TRAIN = r"""
put_real(o, "loss", a, "%g");
put_real(o, "accuracy", b, "%g");
put_real(o, "lr", c, "%g");
put_int(o, "samples", d);
put_real(o, "val_loss", a, "%g");
put_real(o,
         "val_accuracy", b, "%g");
"""
SELF_APP = "fmt(metricOf(j, 'val_accuracy')); series.column('eval_accuracy');"
SELF_PROM = "fusebox_job_slowdown"
SELF_OLD = ["web/app.js: eval_accuracy"]
SELF_EXPECTED = [
    "self-test: server/routes_jobs.c metric_fields is loss, accuracy, val_loss, val_accuracy, "
    "slowdown; the Metrics table says loss, accuracy, val_loss, val_accuracy",
    "self-test: the ASHA metric enum is ['loss', 'accuracy', 'val_loss', 'test_acc']; the Metrics "
    "table's first four are ['loss', 'accuracy', 'val_loss', 'val_accuracy']",
    "self-test: the sweep metric enum is ['loss', 'accuracy', 'val_loss', 'test_accuracy']; the "
    "Metrics table's first four are ['loss', 'accuracy', 'val_loss', 'val_accuracy']",
    "self-test: fusebox-train prints \"samples\", which is not in the Metrics tables",
    "self-test: the event table lists val_f1, which fusebox-train does not print",
    "self-test: fusebox-train prints \"samples\", which the event table does not list",
    "self-test: the dashboard reads metric 'eval_accuracy', which is not in the Metrics tables",
    "self-test: the Metrics tables name fusebox_gone_metric, which server/metrics.c does not serve",
    "self-test: web/app.js: eval_accuracy",
]


def old_name_hits():
    hits = []
    pat = re.compile(r"(?<![a-z0-9_])(" + "|".join(OLD_NAMES) + r")(?![a-z0-9_])")
    for place, suffixes in OLD_NAME_PLACES:
        path = os.path.join(SRC, place)
        files = []
        if os.path.isfile(path):
            files = [path]
        else:
            for root, _, names in os.walk(path):
                files += [os.path.join(root, n) for n in names
                          if not suffixes or n.endswith(suffixes)]
        for f in sorted(files):
            try:
                text = read(f)
            except (UnicodeDecodeError, OSError):
                continue
            if f.endswith(".c"):
                # C names the fields of its structs as it likes: only its strings speak JSON
                text = " ".join(re.findall(r'"((?:[^"\\\n]|\\.)*)"', strip_c_comments(text)))
            for m in sorted(set(pat.findall(text))):
                hits.append(f"{os.path.relpath(f, SRC)}: {m}")
    return hits


def main():
    got = check(SELF_DOC, SELF_ROUTES, SELF_SPEC, SELF_TRAIN, SELF_APP, SELF_PROM, SELF_OLD,
                "self-test")
    if sorted(got) != sorted(SELF_EXPECTED):
        print("FAIL: the checker does not find the planted mistakes")
        print("  expected:\n    " + "\n    ".join(SELF_EXPECTED))
        print("  got:\n    " + "\n    ".join(got))
        return 1
    with open(OPENAPI, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    problems = check(read(DOC), read(ROUTES), spec, read(TRAIN),
                     "\n".join(read(os.path.join(SRC, f)) for f in APP_FILES), read(PROM),
                     old_name_hits(), "docs/jobspec.md")
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        series, beside, _, _ = doc_vocabulary(read(DOC))
        print(f"ok: {len(series)} series metrics and {len(beside)} beside them are one "
              f"vocabulary across the docs, the API, fusebox-train and the dashboard")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
