"""A client of the fusebox REST API (docs/api.md) on urllib alone.

    c = Client("http://127.0.0.1:8080", key)
    job = c.submit(model, input=[1, 28, 28], dataset="fashion-mnist", batch_size=64,
                   steps=500, optimizer={"type": "adamw", "lr": 3e-3})
    job = c.wait(job["id"])              # a progress bar on a terminal
    c.metrics(job["id"])                 # [{"step": 1, "loss": ...}, ...]
    module, spec = fusebox.load(c.download(job["id"], "model.safetensors"))

Every error answer raises ApiError with the API's status, error code and the
field it names.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from . import metrics as M
from .errors import ApiError, FuseboxError

TERMINAL = ("completed", "failed", "cancelled")


def _spec_of(what, input, settings, kind):
    """A spec dict from a dict, a JSON file's path or a torch module plus settings."""
    if isinstance(what, dict):
        if input is not None:
            raise TypeError("input= goes with a torch module, not with a spec dict")
        spec = dict(what)
        spec.update(settings)
        return spec
    if isinstance(what, (str, os.PathLike)):
        try:
            with open(what, encoding="utf-8") as f:
                spec = json.load(f)
        except OSError as e:
            raise FuseboxError(f"{os.fspath(what)}: cannot read: {e.strerror or e}") from None
        except ValueError as e:
            raise FuseboxError(f"{os.fspath(what)}: not JSON ({e})") from None
        if not isinstance(spec, dict):
            raise FuseboxError(f"{os.fspath(what)}: a {kind} spec is a JSON object")
        spec.update(settings)
        return spec
    # a torch module: its model, and the training settings around it
    from .model import from_torch

    if input is None:
        raise TypeError("a torch module needs input=, the shape of one sample")
    spec = {"model": from_torch(what, input)}
    spec.update(settings)
    return spec


class Client:
    """The fusebox API at url (http://host:port) as the tenant of key.

    Every method raises ApiError (status, code, message, field) on an error
    answer and FuseboxError when the server cannot be reached.
    """

    def __init__(self, url=None, key=None, timeout=30.0):
        url = url or os.environ.get("FUSEBOX_URL")
        key = key or os.environ.get("FUSEBOX_KEY")
        if not url:
            raise FuseboxError("no server: pass url or set FUSEBOX_URL")
        if not key:
            raise FuseboxError("no API key: pass key or set FUSEBOX_KEY")
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = timeout

    # -- transport

    def _request(self, method, path, body=None, query=None, headers=None, raw=False):
        url = self.url + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                url += "?" + urllib.parse.urlencode(q)
        h = {"Authorization": f"Bearer {self.key}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        req = urllib.request.Request(url, data=data, headers=h, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                payload = r.read()
        except urllib.error.HTTPError as e:
            raise self._error(e, method, url) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise FuseboxError(f"{method} {url}: {reason}") from None
        if raw:
            return payload
        try:
            return json.loads(payload) if payload else None
        except ValueError:
            raise FuseboxError(f"{method} {url}: the answer is not JSON") from None

    @staticmethod
    def _error(e, method, url):
        try:
            err = json.loads(e.read() or b"{}")["error"]
            return ApiError(e.code, err.get("code"), err.get("message", ""), err.get("field"),
                            method, url)
        except (ValueError, KeyError, TypeError, AttributeError):
            return ApiError(e.code, None, e.reason or "no JSON error body", None, method, url)

    def _pages(self, path, key, query):
        """Every item of a paged list (next_cursor)."""
        out, cursor = [], None
        while True:
            page = self._request("GET", path, query=dict(query, cursor=cursor))
            out.extend(page[key])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    # -- jobs

    def submit(self, spec, input=None, idempotency_key=None, **settings):
        """Submits a job; returns it as the server answers (201: committed).

        spec is a job spec dict, the path of a JSON file holding one, or a
        torch nn.Sequential with input= (the shape of one sample) and the
        training settings as keywords (dataset=, batch_size=, steps=,
        optimizer=, ...); keywords also override a dict's or file's fields.
        """
        body = _spec_of(spec, input, settings, "job")
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._request("POST", "/v1/jobs", body, headers=headers)

    def get(self, job_id):
        """The job: state, step, latest_metrics, slowdown, the canonical spec, ..."""
        return self._request("GET", f"/v1/jobs/{_id(job_id)}")

    def list(self, state=None, sweep_id=None, name=None):
        """The tenant's jobs (newest first), every page, filtered like GET /v1/jobs."""
        return self._pages("/v1/jobs", "jobs", {"state": state, "sweep_id": sweep_id,
                                                "name": name, "limit": 200})

    def cancel(self, job_id):
        """Cancels a queued, scheduled or running job; returns the job."""
        return self._request("POST", f"/v1/jobs/{_id(job_id)}/cancel")

    def metrics(self, job_id, fields=None, since_step=None):
        """The job's metric series as a list of dicts in step order ({"step", "time",
        and the fields}); fields a list of names of fusebox.metrics.SERIES
        (None: all)."""
        out = []
        q = {"fields": ",".join(fields) if fields else None, "since_step": since_step,
             "limit": 10000}
        while True:
            page = self._request("GET", f"/v1/jobs/{_id(job_id)}/metrics", query=q)
            out.extend(page["points"])
            if page.get("next_since_step") is None:
                return out
            q["since_step"] = page["next_since_step"]

    def download(self, job_id, path):
        """Writes the job's model (the final one, else its latest checkpoint's) to
        path; returns path."""
        data = self._request("GET", f"/v1/jobs/{_id(job_id)}/model", raw=True,
                             headers={"Accept": "application/octet-stream"})
        tmp = f"{os.fspath(path)}.part"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return path

    def wait(self, job_id, timeout=None, poll=1.0, progress=None, out=None):
        """Polls the job until it is completed, failed or cancelled; returns it.

        progress (default: whether out is a terminal) draws a progress bar on
        out (default sys.stderr); without one, a line is written when the
        state changes.  Raises FuseboxError after timeout seconds (None: no
        limit).
        """
        out = out or sys.stderr
        if progress is None:
            progress = hasattr(out, "isatty") and out.isatty()
        t_end = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            job = self.get(job_id)
            line = progress_line(job)
            if progress:
                out.write("\r" + line.ljust(79)[:120])
                out.flush()
            elif job["state"] != last:
                out.write(line + "\n")
                out.flush()
            last = job["state"]
            if job["state"] in TERMINAL:
                if progress:
                    out.write("\n")
                return job
            if t_end is not None and time.monotonic() > t_end:
                if progress:
                    out.write("\n")
                raise FuseboxError(f"job {job_id} is still {job['state']} after {timeout} s")
            time.sleep(poll)

    # -- sweeps

    def sweep(self, spec, input=None, search=None, early_stopping=None, name=None,
              idempotency_key=None, **base):
        """Submits a sweep; returns it with its trials (201).

        spec is a sweep spec dict ({"name", "base", "search", "early_stopping"}),
        the path of a JSON file holding one, or a torch nn.Sequential with
        input=, search= (and early_stopping=, name=) and the base job's
        settings as keywords.
        """
        if isinstance(spec, (dict, str, os.PathLike)):
            extra = {k: v for k, v in (("search", search), ("early_stopping", early_stopping),
                                       ("name", name)) if v is not None}
            if base:
                raise TypeError("base settings as keywords go with a torch module; put them "
                                "in the spec's base")
            body = _spec_of(spec, input, extra, "sweep")
        else:
            body = {"base": _spec_of(spec, input, base, "job"), "search": search}
            if name is not None:
                body["name"] = name
            if early_stopping is not None:
                body["early_stopping"] = early_stopping
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._request("POST", "/v1/sweeps", body, headers=headers)

    def get_sweep(self, sweep_id):
        """The sweep with its trials and best trial."""
        return self._request("GET", f"/v1/sweeps/{_id(sweep_id)}")

    def list_sweeps(self):
        """The tenant's sweeps, newest first, every page."""
        return self._pages("/v1/sweeps", "sweeps", {"limit": 200})

    def cancel_sweep(self, sweep_id):
        """Cancels the sweep and its unfinished trials."""
        return self._request("POST", f"/v1/sweeps/{_id(sweep_id)}/cancel")


def _id(v):
    """An id for a URL path: job and sweep dicts give theirs."""
    if isinstance(v, dict):
        v = v["id"]
    return urllib.parse.quote(str(v), safe="")


def _fmt(v):
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def progress_line(job):
    """One line about a job: name, state, a bar of step / steps, its latest metrics."""
    steps = job.get("steps") or 0
    step = job.get("step") or 0
    if steps:
        n = min(20, 20 * step // steps)
        bar = f"[{'#' * n}{'.' * (20 - n)}] {step}/{steps}"
    else:
        bar = f"step {step}"
    latest = job.get("latest_metrics") or {}
    shown = " ".join(f"{k} {_fmt(latest[k])}" for k in M.PROGRESS if k in latest)
    state = job["state"]
    if state == "queued" and (job.get("queue") or {}).get("reason"):
        state += f" ({job['queue']['reason']})"
    if state == "failed" and job.get("error"):
        state += f": {job['error']}"
    return f"{job.get('name', job['id'])} {state} {bar} {shown}".rstrip()
