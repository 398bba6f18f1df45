#!/usr/bin/python3
"""Judges the skipped tests of one ctest pass (scripts/test runs it after each).

usage: skips.py [--gpus N] JUNIT.xml TESTS.json
JUNIT.xml is ctest's --output-junit report of the pass, TESTS.json what
`ctest --show-only=json-v1` prints for the same tree (the tests' labels).

scripts/test installs every prerequisite a test needs (scripts/lib/packages.txt,
the npm modules, the throwaway PostgreSQL), so a test that skips there lacks
something that should have been installed: that fails the run.  The one honest
skip is a GPU test (label `gpu`) on a machine without a GPU.  Where
`nvidia-smi -L` lists N > 0 GPUs (--gpus N says so instead), a skipped GPU test
fails the run too: the GPU is there, so the skip hides a fault (a driver the
runtime does not accept reports "no device"), unless the test says it needs
more GPUs than there are ("needs 2 GPUs" on a machine with one).  Prints each
skipped test with its labels and the reason it printed ("SKIPPED: why") and
exits 1 when any skip is not allowed, else 0.
"""
import argparse
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ALLOWED_LABEL = "gpu"
NEEDS_GPUS = re.compile(r"needs (\d+) GPUs")


def gpus_listed():
    """How many GPUs `nvidia-smi -L` lists; 0 without nvidia-smi or when it fails."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


def gpu_skip_allowed(why, gpus):
    """A GPU test's skip is honest without a GPU, or when it needs more than there are."""
    if gpus == 0:
        return True
    m = NEEDS_GPUS.search(why)
    return m is not None and int(m.group(1)) > gpus


def labels_by_test(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = {}
    for t in data.get("tests", []):
        labels = []
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels = list(p.get("value") or [])
        out[t["name"]] = labels
    return out


def reason(case):
    """The test's own words: its "SKIPPED: why" (or "SKIP: why") lines, else
    ctest's message."""
    text = case.findtext("system-out") or ""
    lines = [ln.strip() for ln in text.splitlines() if "SKIP" in ln]
    if lines:
        return " / ".join(lines)
    sk = case.find("skipped")
    msg = sk.get("message") if sk is not None else ""
    return f"(no reason printed; ctest: {msg or case.get('status')})"


def main():
    ap = argparse.ArgumentParser(usage=__doc__.split("\n\n")[1].splitlines()[0][7:])
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs on this machine (default: what nvidia-smi -L lists)")
    ap.add_argument("junit")
    ap.add_argument("tests_json")
    args = ap.parse_args()
    gpus = gpus_listed() if args.gpus is None else args.gpus
    labels = labels_by_test(args.tests_json)
    root = ET.parse(args.junit).getroot()
    bad, allowed = [], []
    for case in root.iter("testcase"):
        if case.find("skipped") is None and case.get("status") not in ("notrun", "disabled"):
            continue
        name = case.get("name")
        lab = labels.get(name, [])
        why = reason(case)
        row = f"{name} [{';'.join(lab) or 'no label'}]: {why}"
        ok = ALLOWED_LABEL in lab and gpu_skip_allowed(why, gpus)
        (allowed if ok else bad).append(row)
    here = f"{gpus} GPU(s) listed by nvidia-smi" if gpus else "no GPU here"
    for row in allowed:
        print(f"  skipped ({here}, allowed): {row}")
    for row in bad:
        print(f"  SKIPPED, which fails the run: {row}")
    if bad:
        print(f"{len(bad)} test(s) skipped for a missing prerequisite; only `{ALLOWED_LABEL}`"
              f" tests may skip, and where nvidia-smi lists a GPU ({here}) only those that"
              f" need more GPUs than that")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
