#!/usr/bin/env python3
"""Checks docs/configuration.md against the programs it describes.

For each of fuseboxd, fusebox-worker, fusebox-train and fusebox-data it
collects the flags and FUSEBOX_* variables the program knows, from two
places: its `--help` text (run from the build) and the option tables of its
source (fuseboxd's table in server/config.c, the `struct option` arrays and
flag/variable pairs of the other mains, and the literal flags they compare
arguments with).  It then requires:

- every flag and variable the program knows to be listed in the program's
  section of docs/configuration.md (flags in the tables' first column,
  variables anywhere in the section);
- every flag of a table's first column and every variable of its
  environment column to be one the program knows;
- every "FUSEBOX_*" string in the programs' sources (server/, workers/,
  api/, kernels/) to be mentioned somewhere in the reference, so a variable
  read deep inside a library is not forgotten either.

Before the real check it runs the same comparison on a planted reference with
known mistakes and requires exactly those to be found, so a checker that
finds nothing cannot pass.  Exit 0: the reference matches; 1: it does not.
"""
import os
import re
import subprocess
import sys

SRC = os.environ.get("FB_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
BIN = os.environ.get("FB_BINARY_DIR") or os.path.join(SRC, "build")
DOC = os.path.join(SRC, "docs", "configuration.md")

# program -> (binary relative to the build, its --help arguments, its sources)
PROGRAMS = {
    "fuseboxd": ("server/fuseboxd", ["--help"], ["server/config.c", "server/fuseboxd.c"]),
    "fusebox-worker": ("workers/fusebox-worker", ["--help"], ["workers/fusebox_worker.c"]),
    "fusebox-train": ("workers/fusebox-train", ["--help"], ["workers/fusebox_train.c"]),
    "fusebox-data": ("workers/data/fusebox-data", ["--help"], ["workers/data/fusebox_data.c"]),
}
# where a variable read by any program may be defined
SOURCE_DIRS = ["server", "workers", "api", "kernels"]

# fuseboxd's usage line writes "--flag value" for any flag: a placeholder
PLACEHOLDERS = {"--flag"}
# every program answers these; whether its --help says so is not worth a failure
ALWAYS = {"--help", "-h"}
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-h)(?![\w-])")
ENV_RE = re.compile(r"(?<![A-Z0-9_])(FUSEBOX_[A-Z0-9_]*[A-Z0-9])(?![A-Z0-9_])")


def help_text(program):
    rel, args, _ = PROGRAMS[program]
    path = os.path.join(BIN, rel)
    if not os.access(path, os.X_OK):
        sys.exit(f"FAIL: {path} is not built (build the {program} target)")
    r = subprocess.run([path] + args, capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or not r.stdout:
        sys.exit(f"FAIL: {path} --help exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip_c_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def code_names(program):
    """Flags and variables from the program's option tables."""
    flags, envs = set(), set()
    for rel in PROGRAMS[program][2]:
        text = strip_c_comments(read(os.path.join(SRC, rel)))
        # fuseboxd's table: STR("flag", "ENV", ...), INT(...), {"flag", "ENV", OPT_...}
        for m in re.finditer(r'(?:STR|INT)\(\s*"([a-z][a-z0-9-]*)",\s*"(FUSEBOX_[A-Z0-9_]+)"', text):
            flags.add("--" + m.group(1))
            envs.add(m.group(2))
        # {"flag", "ENV"...}: fuseboxd's other rows and fusebox-worker's pairs
        for m in re.finditer(r'\{\s*"([a-z][a-z0-9-]*)",\s*"(FUSEBOX_[A-Z0-9_]+)"', text):
            flags.add("--" + m.group(1))
            envs.add(m.group(2))
        # getopt_long tables
        for m in re.finditer(r'\{\s*"([a-z][a-z0-9-]*)",\s*(?:no|required|optional)_argument', text):
            flags.add("--" + m.group(1))
        # arguments compared by hand: strcmp(arg, "--help")
        for m in re.finditer(r'strn?cmp\([^,()]+,\s*"(--?[a-z][a-z0-9-]*)"', text):
            flags.add(m.group(1))
    return flags, envs


def help_names(text):
    return set(FLAG_RE.findall(text)) - PLACEHOLDERS, set(ENV_RE.findall(text))


def sections(doc):
    """The text under each '## program' heading of the reference."""
    out = {}
    cur = None
    for line in doc.splitlines():
        m = re.match(r"^## (\S+)\s*$", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        if line.startswith("## "):
            cur = None
        if cur is not None:
            out[cur].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def table_cells(section):
    """(first column, environment column) of every table row of a section
    whose header names an 'environment' column."""
    rows = []
    env_col = None
    for line in section.splitlines():
        if not line.startswith("|"):
            env_col = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if env_col is None:
            env_col = cells.index("environment") if "environment" in cells else -1
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue
        rows.append((cells[0], cells[env_col] if 0 <= env_col < len(cells) else ""))
    return rows


def check(doc, known, global_envs, where):
    """Problems, one string each, of the reference doc against known
    ({program: (flags, envs)}) and the variables of the sources."""
    problems = []
    secs = sections(doc)
    for program, (flags, envs) in known.items():
        sec = secs.get(program)
        if sec is None:
            problems.append(f"{where}: no '## {program}' section")
            continue
        rows = table_cells(sec)
        doc_flags = set()
        doc_envs = set()
        for first, env in rows:
            doc_flags |= set(FLAG_RE.findall(first))
            doc_envs |= set(ENV_RE.findall(env))
        mentioned_envs = set(ENV_RE.findall(sec))
        for f in sorted(flags - doc_flags):
            problems.append(f"{where}: {program}: {f} is not documented")
        for e in sorted(envs - mentioned_envs):
            problems.append(f"{where}: {program}: {e} is not documented")
        for f in sorted(doc_flags - flags):
            problems.append(f"{where}: {program}: {f} is documented but {program} has no such flag")
        for e in sorted(doc_envs - envs):
            problems.append(f"{where}: {program}: {e} is documented but {program} does not read it")
    all_doc_envs = set(ENV_RE.findall(doc))
    for e in sorted(global_envs - all_doc_envs):
        problems.append(f"{where}: {e} appears in the sources but nowhere in the reference")
    return problems


SELF_DOC = """
# planted reference
## fuseboxd
| flag | environment | default |
|---|---|---|
| `--port` | `FUSEBOX_PORT` | 8080 |
| `--gone` | `FUSEBOX_GONE` | 1 |
## fusebox-worker
| flag | environment |
|---|---|
| `--server`, `-h` | `FUSEBOX_WORKER_SERVER` |
"""
SELF_KNOWN = {
    "fuseboxd": ({"--port", "--listen"}, {"FUSEBOX_PORT", "FUSEBOX_LISTEN"}),
    "fusebox-worker": ({"--server", "-h"}, {"FUSEBOX_WORKER_SERVER"}),
    "fusebox-train": ({"--out"}, set()),
}
SELF_GLOBAL = {"FUSEBOX_PORT", "FUSEBOX_DEEP_INSIDE"}
SELF_EXPECTED = [
    "self-test: fuseboxd: --listen is not documented",
    "self-test: fuseboxd: FUSEBOX_LISTEN is not documented",
    "self-test: fuseboxd: --gone is documented but fuseboxd has no such flag",
    "self-test: fuseboxd: FUSEBOX_GONE is documented but fuseboxd does not read it",
    "self-test: no '## fusebox-train' section",
    "self-test: FUSEBOX_DEEP_INSIDE appears in the sources but nowhere in the reference",
]


def source_envs():
    names = set()
    for d in SOURCE_DIRS:
        for root, _, files in os.walk(os.path.join(SRC, d)):
            for name in files:
                if name.endswith((".c", ".h", ".cu")):
                    text = strip_c_comments(read(os.path.join(root, name)))
                    names |= set(re.findall(r'"(FUSEBOX_[A-Z0-9_]*[A-Z0-9])"', text))
    return names


def main():
    got = check(SELF_DOC, SELF_KNOWN, SELF_GLOBAL, "self-test")
    if sorted(got) != sorted(SELF_EXPECTED):
        print("FAIL: the checker does not find the planted mistakes")
        print("  expected:\n    " + "\n    ".join(SELF_EXPECTED))
        print("  got:\n    " + "\n    ".join(got))
        return 1

    known = {}
    problems = []
    for program in PROGRAMS:
        hf, he = help_names(help_text(program))
        cf, ce = code_names(program)
        # the help must show what the code accepts, or users never learn of it
        for f in sorted(cf - hf - ALWAYS):
            problems.append(f"{program} --help does not show {f}, which its source accepts")
        for e in sorted(ce - he):
            problems.append(f"{program} --help does not show {e}, which its source reads")
        known[program] = (hf | cf, he | ce)
    if not known["fuseboxd"][0] or not known["fusebox-worker"][1]:
        problems.append("found no flags in fuseboxd or no variables in fusebox-worker: "
                        "the source patterns of this checker are out of date")
    problems += check(read(DOC), known, source_envs(), DOC)
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        n = sum(len(f) + len(e) for f, e in known.values())
        print(f"ok: {n} flags and variables of {len(known)} programs match {DOC}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
