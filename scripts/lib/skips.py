#!/usr/bin/python3
"""Judges the skipped tests of one ctest pass (scripts/test runs it after each).

usage: skips.py JUNIT.xml TESTS.json
JUNIT.xml is ctest's --output-junit report of the pass, TESTS.json what
`ctest --show-only=json-v1` prints for the same tree (the tests' labels).

scripts/test installs every prerequisite a test needs (scripts/lib/packages.txt,
the npm modules, the throwaway PostgreSQL), so a test that skips there lacks
something that should have been installed: that fails the run.  The one honest
skip is a GPU test on a machine without a usable GPU (label `gpu`).  Prints each
skipped test with its labels and the reason it printed ("SKIPPED: why") and
exits 1 when any of them is not a GPU test, else 0.
"""
import json
import sys
import xml.etree.ElementTree as ET

ALLOWED_LABEL = "gpu"


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
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1].splitlines()[0], file=sys.stderr)
        return 2
    labels = labels_by_test(sys.argv[2])
    root = ET.parse(sys.argv[1]).getroot()
    bad, allowed = [], []
    for case in root.iter("testcase"):
        if case.find("skipped") is None and case.get("status") not in ("notrun", "disabled"):
            continue
        name = case.get("name")
        lab = labels.get(name, [])
        row = f"{name} [{';'.join(lab) or 'no label'}]: {reason(case)}"
        (allowed if ALLOWED_LABEL in lab else bad).append(row)
    for row in allowed:
        print(f"  skipped (no GPU here, allowed): {row}")
    for row in bad:
        print(f"  SKIPPED, which fails the run: {row}")
    if bad:
        print(f"{len(bad)} test(s) skipped for a missing prerequisite that scripts/test installs;"
              f" only `{ALLOWED_LABEL}` tests may skip")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
