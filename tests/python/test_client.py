"""fusebox.Client and python -m fusebox against a real fuseboxd and worker.

tests/python/test_python.c starts them (a fresh database, a CPU worker, the
datasets "synth" and fashion-mnist) and sets FUSEBOX_URL and FUSEBOX_KEY;
without those this module is skipped.

- round trip: an nn.Sequential written in PyTorch -> from_torch -> submitted
  with training settings -> trained by fusebox on fashion-mnist -> waited for
  -> its metric series as dicts -> downloaded -> fusebox.load -> the final
  evaluation fusebox reported (the job's latest_metrics and the file's
  metrics), recomputed in torch on the test split with the file's
  preprocessing;
- a sweep from a torch module: its trials listed by sweep, cancelled;
- errors carry the API's code and field: an unknown spec field, an unknown
  job, a wrong key; an unsupported module fails before any request;
- the command line: submit --wait, ls, watch, download, sweep, cancel, with
  the API's code and field on stderr and the documented exit statuses.
"""

import gzip
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import fusebox
from fusebox import metrics as M

URL = os.environ.get("FUSEBOX_URL")
KEY = os.environ.get("FUSEBOX_KEY")
FASHION = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
WAIT_S = 300  # a bound against a hang, not a timing: the jobs take seconds
NO_JOB = "00000000-0000-4000-8000-000000000000"


def idx(path):
    """An IDX file (gzip) as a uint8 tensor."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def synth_settings(name, steps):
    # "synth" (tests/dispatch/e2e.c): float32 [16] samples, 4 classes
    return dict(name=name, dataset="synth", batch_size=32, steps=steps,
                optimizer={"type": "adam", "lr": 0.01})


def synth_module():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@unittest.skipUnless(URL and KEY, "needs FUSEBOX_URL and FUSEBOX_KEY (tests/python/test_python.c)")
class Client(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = fusebox.Client(URL, KEY)
        cls.tmp = tempfile.TemporaryDirectory(prefix="fb-py-client-")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_round_trip(self):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
        job = self.c.submit(net, input=[1, 28, 28], name="py-round-trip",
                            dataset="fashion-mnist", batch_size=64, steps=120,
                            optimizer={"type": "adam", "lr": 3e-3})
        self.assertEqual(job["state"], "queued")
        job = self.c.wait(job["id"], timeout=WAIT_S, poll=0.2, progress=False,
                          out=io.StringIO())
        self.assertEqual(job["state"], "completed", job.get("error"))
        self.assertEqual(job["step"], 120)

        series = self.c.metrics(job["id"])
        self.assertTrue(series and all(isinstance(p, dict) and "step" in p for p in series))
        self.assertEqual([p["step"] for p in series], sorted(p["step"] for p in series))
        self.assertTrue(any(M.LOSS in p for p in series))
        only = self.c.metrics(job["id"], fields=[M.VAL_ACCURACY])
        self.assertTrue(all(set(p) <= {"step", "time", M.VAL_ACCURACY} for p in only))

        path = os.path.join(self.tmp.name, "round-trip.safetensors")
        self.assertEqual(self.c.download(job["id"], path), path)
        module, spec = fusebox.load(path)
        self.assertEqual(spec["name"], "py-round-trip")
        self.assertEqual(spec["model"], fusebox.from_torch(net, [1, 28, 28]))
        self.assertEqual(spec, job_spec(self.c.get(job["id"])))
        self.assertEqual(spec.step, 120)
        self.assertTrue(spec.fusebox_version)
        # the weights trained: not the ones submitted from
        self.assertFalse(torch.equal(module[1].weight, net[1].weight))

        reported = job["latest_metrics"]
        self.assertEqual(spec.metrics[M.VAL_STEP], 120)
        for k in M.VALIDATION + M.TEST:
            self.assertAlmostEqual(spec.metrics[k], reported[k], places=6, msg=k)

        # the test split: what the job's test evaluation measured (its validation measured
        # records held out of train)
        x = spec.preprocess(idx(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")))
        y = idx(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")).to(torch.int64)
        with torch.no_grad():
            logits = module(x)
        acc = (logits.argmax(dim=1) == y).double().mean().item()
        loss = F.cross_entropy(logits, y).item()
        print(f"\n  round trip: fusebox test_accuracy {reported[M.TEST_ACCURACY]:.4f}, torch "
              f"{acc:.4f}; test_loss {reported[M.TEST_LOSS]:.6f}, torch {loss:.6f}",
              file=sys.stderr)
        self.assertGreater(acc, 0.5)  # it learnt: chance is 0.1
        # summation order may move a sample across a tie: at most 2 of 10000
        self.assertLessEqual(abs(acc - reported[M.TEST_ACCURACY]), 2e-4)
        self.assertLessEqual(abs(loss - reported[M.TEST_LOSS]), 1e-4 * abs(loss))

    def test_sweep_list_cancel(self):
        base = synth_settings("py-sweep", 1000000)
        del base["name"]  # name= is the sweep's
        sw = self.c.sweep(synth_module(), input=[16], name="py-sweep",
                          search={"type": "grid",
                                  "params": {"optimizer.lr": {"values": [0.01, 0.03]}}},
                          **base)
        self.assertEqual(len(sw["trials"]), 2)
        trials = self.c.list(sweep_id=sw["id"])
        self.assertEqual(sorted(j["id"] for j in trials), sorted(t["job_id"] for t in sw["trials"]))
        self.assertIn(sw["id"], [s["id"] for s in self.c.list_sweeps()])
        self.c.cancel_sweep(sw["id"])
        for t in sw["trials"]:
            j = self.c.wait(t["job_id"], timeout=WAIT_S, poll=0.2, progress=False,
                            out=io.StringIO())
            self.assertEqual(j["state"], "cancelled")
        self.assertEqual(self.c.get_sweep(sw["id"])["state"], "cancelled")

    def test_errors(self):
        bad = dict(synth_settings("py-bad", 10), model={"input": [16], "layers": [
            {"type": "linear", "outs": 4}]})
        with self.assertRaises(fusebox.ApiError) as cm:
            self.c.submit(bad)
        e = cm.exception
        self.assertEqual((e.status, e.code), (400, "unknown_field"))
        self.assertIn("outs", e.field or e.message)
        print(f"\n  unknown field: {e}", file=sys.stderr)
        with self.assertRaises(fusebox.ApiError) as cm:
            self.c.get(NO_JOB)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(fusebox.ApiError) as cm:
            fusebox.Client(URL, "fbk_" + "0" * 16 + "_" + "0" * 64).list()
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
        # an unsupported module never reaches the server
        with self.assertRaises(fusebox.UnsupportedModule) as cm:
            self.c.submit(nn.Sequential(nn.Linear(16, 4), nn.LSTM(4, 4)), input=[16],
                          **synth_settings("py-lstm", 10))
        self.assertEqual(cm.exception.path, "module[1]")
        self.assertEqual(self.c.list(name="py-lstm"), [])
        with self.assertRaises(fusebox.FuseboxError):
            fusebox.Client("http://127.0.0.1:1", KEY).list()


def job_spec(job):
    """The canonical spec of GET /v1/jobs/{id}, as a plain dict."""
    return dict(job["spec"])


@unittest.skipUnless(URL and KEY, "needs FUSEBOX_URL and FUSEBOX_KEY (tests/python/test_python.c)")
class Cli(unittest.TestCase):
    def run_cli(self, *args, env=None):
        e = dict(os.environ, **(env or {}))
        return subprocess.run([sys.executable, "-m", "fusebox", *args], capture_output=True,
                              text=True, env=e, timeout=WAIT_S)

    def test_verbs(self):
        with tempfile.TemporaryDirectory(prefix="fb-py-cli-") as d:
            spec = os.path.join(d, "job.json")
            with open(spec, "w") as f:
                json.dump(dict(synth_settings("py-cli", 30), model=fusebox.from_torch(
                    synth_module(), [16]), eval_every=10), f)
            r = self.run_cli("submit", spec, "--wait", "--timeout", str(WAIT_S))
            self.assertEqual(r.returncode, 0, r.stderr)
            job_id, final = r.stdout.splitlines()[:2]
            self.assertIn("completed step 30", final)
            self.assertIn(M.VAL_ACCURACY, final)

            r = self.run_cli("ls", "--name", "py-cli")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(job_id, r.stdout)
            self.assertIn("completed", r.stdout)
            r = self.run_cli("ls", "--json", "--state", "completed")
            self.assertIn(job_id, [j["id"] for j in json.loads(r.stdout)])

            r = self.run_cli("watch", job_id)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(f"{job_id} completed step 30"), r.stdout)

            out = os.path.join(d, "cli.safetensors")
            r = self.run_cli("download", job_id, "-o", out)
            self.assertEqual((r.returncode, r.stdout.strip()), (0, out), r.stderr)
            self.assertEqual(fusebox.read_spec(out)["name"], "py-cli")

            # cancelling a completed job: the API's 409, its code on stderr, status 1
            r = self.run_cli("cancel", job_id)
            self.assertEqual(r.returncode, 1)
            self.assertIn("state_conflict", r.stderr)

            sweep = os.path.join(d, "sweep.json")
            with open(sweep, "w") as f:
                json.dump({"name": "py-cli-sweep",
                           "base": dict(synth_settings("py-cli-sweep", 1000000),
                                        model=fusebox.from_torch(synth_module(), [16])),
                           "search": {"type": "grid", "params": {"seed": {"values": [1, 2]}}}}, f)
            r = self.run_cli("sweep", sweep)
            self.assertEqual(r.returncode, 0, r.stderr)
            sweep_id = r.stdout.split()[0]
            self.assertEqual(r.stdout.count("  trial "), 2)
            r = self.run_cli("cancel", "--sweep", sweep_id)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("cancelled", r.stdout)

            # bad input: the API's code and field; no key; a file that is not JSON
            with open(spec, "w") as f:
                json.dump(dict(synth_settings("py-cli-bad", 5), model={
                    "input": [16], "layers": [{"type": "linear", "outs": 4}]}), f)
            r = self.run_cli("submit", spec)
            self.assertEqual(r.returncode, 1)
            self.assertIn("unknown_field", r.stderr)
            self.assertIn("outs", r.stderr)
            r = self.run_cli("ls", env={"FUSEBOX_KEY": ""})
            self.assertEqual(r.returncode, 2)
            self.assertIn("FUSEBOX_KEY", r.stderr)
            with open(spec, "w") as f:
                f.write("{not json")
            r = self.run_cli("submit", spec)
            self.assertEqual(r.returncode, 1)
            self.assertIn("not JSON", r.stderr)
            r = self.run_cli("watch", NO_JOB)
            self.assertEqual(r.returncode, 1)
            self.assertIn("not_found", r.stderr)


if __name__ == "__main__":
    unittest.main()
