#!/usr/bin/env python3
"""Checks that docker/docker-compose.yml and docker/Dockerfile.* pass only
settings the programs know: every FUSEBOX_* environment variable and every
--flag given to a service built from Dockerfile.server must appear in
`fuseboxd --help`, and those of services built from Dockerfile.worker* in
`fusebox-worker --help`.  A typo there would otherwise be ignored silently
(an unknown variable) or stop the container at start (an unknown flag).
Each must also be in the program's section of the configuration reference,
docs/configuration.md, so that what the deployment sets is documented
(tests/docs checks the reference against the programs).

Before the real check it runs the same check on a small compose file with
known mistakes and requires exactly those to be reported, so a checker that
finds nothing cannot pass.  Exit 0: all known; 1: something unknown; 77: no
PyYAML (Debian's python3-yaml), so the test is skipped.
"""
import os
import re
import shlex
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML (python3-yaml) is not installed")
    sys.exit(77)

SRC = os.environ.get("FB_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
BIN = os.environ.get("FB_BINARY_DIR") or os.path.join(SRC, "build")
REFERENCE = os.path.join(SRC, "docs", "configuration.md")
PROGRAMS = {
    "fuseboxd": os.path.join(BIN, "server", "fuseboxd"),
    "fusebox-worker": os.path.join(BIN, "workers", "fusebox-worker"),
}


def help_text(program):
    path = PROGRAMS[program]
    if not os.access(path, os.X_OK):
        sys.exit(f"FAIL: {path} is not built (build the {program} target)")
    r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or not r.stdout:
        sys.exit(f"FAIL: {path} --help exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def reference_sections():
    """The text of each '## <program>' section of the configuration reference."""
    with open(REFERENCE, encoding="utf-8") as f:
        text = f.read()
    out = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = body
    missing = [p for p in PROGRAMS if p not in out]
    if missing:
        sys.exit(f"FAIL: {REFERENCE} has no section for {', '.join(missing)}")
    return out


def program_of(dockerfile):
    """The program an image runs, from its Dockerfile's name; None: not ours."""
    name = os.path.basename(dockerfile or "")
    if name == "Dockerfile.server":
        return "fuseboxd"
    if name.startswith("Dockerfile.worker"):
        return "fusebox-worker"
    return None


def known_env(text, var):
    return re.search(r"(?<![A-Z0-9_])" + re.escape(var) + r"(?![A-Z0-9_])", text) is not None


def known_flag(text, flag):
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", text) is not None


def env_names(environment):
    if isinstance(environment, dict):
        return list(environment)
    return [str(e).split("=", 1)[0] for e in environment or []]


def flags_of(command):
    if isinstance(command, str):
        command = shlex.split(command)
    return [str(a).split("=", 1)[0] for a in command or [] if str(a).startswith("--")]


def unknown(helps, refs, program, name, is_flag):
    """Why name is not a known setting of program, or None when it is."""
    known = known_flag if is_flag else known_env
    if not known(helps[program], name):
        return f"{name} is not in `{program} --help`"
    if not known(refs[program], name):
        return f"{name} is not in the {program} section of docs/configuration.md"
    return None


def check_compose(doc, helps, refs, where):
    """Problems, one string each, in the services of one compose document."""
    problems = []
    for name, svc in (doc.get("services") or {}).items():
        build = svc.get("build")
        dockerfile = build.get("dockerfile") if isinstance(build, dict) else None
        program = program_of(dockerfile)
        envs = [e for e in env_names(svc.get("environment")) if e.startswith("FUSEBOX_")]
        flags = flags_of(svc.get("command"))
        if program is None:
            for e in envs:
                problems.append(f"{where}: service {name}: {e} is set, but the service runs "
                                "no fusebox program")
            continue
        for setting, is_flag in [(e, False) for e in envs] + [(f, True) for f in flags]:
            why = unknown(helps, refs, program, setting, is_flag)
            if why:
                problems.append(f"{where}: service {name}: {why}")
    return problems


def check_dockerfile(path, helps, refs):
    program = program_of(path)
    problems = []
    with open(path, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() != "ENV":
            continue
        for w in words[1:]:
            var = w.split("=", 1)[0]
            why = unknown(helps, refs, program, var, False) if var.startswith("FUSEBOX_") else None
            if why:
                problems.append(f"{path}: ENV {why}")
    return problems


SELF_TEST = """
services:
  db:
    image: postgres:15
    environment: {FUSEBOX_PORT: "1"}
  srv:
    build: {context: .., dockerfile: docker/Dockerfile.server}
    command: ["--listen", "0.0.0.0", "--no-such-flag=1", "--worker-listen", "tcp://x:1"]
    environment: {FUSEBOX_LISTEN: x, FUSEBOX_NO_SUCH_VAR: x}
  wrk:
    build: {context: .., dockerfile: docker/Dockerfile.worker-cpu}
    command: --server tcp://x:1 --listen 0.0.0.0
    environment: ["FUSEBOX_WORKER_NAME=a", "FUSEBOX_DATABASE_URL=x"]
"""
SELF_EXPECTED = [
    "self-test: service db: FUSEBOX_PORT is set, but the service runs no fusebox program",
    "self-test: service srv: FUSEBOX_NO_SUCH_VAR is not in `fuseboxd --help`",
    "self-test: service srv: --no-such-flag is not in `fuseboxd --help`",
    "self-test: service wrk: FUSEBOX_DATABASE_URL is not in `fusebox-worker --help`",
    "self-test: service wrk: --listen is not in `fusebox-worker --help`",
    "self-test: service srv: --worker-listen is not in the fuseboxd section of "
    "docs/configuration.md",
]
# a reference that lacks one setting both programs' --help show
SELF_REFS = {
    "fuseboxd": "| `--listen` | `FUSEBOX_LISTEN` |",
    "fusebox-worker": "| `--server` | `FUSEBOX_WORKER_SERVER` |\n| `--name` | `FUSEBOX_WORKER_NAME` |",
}


def main():
    helps = {p: help_text(p) for p in PROGRAMS}
    got = check_compose(yaml.safe_load(SELF_TEST), helps, SELF_REFS, "self-test")
    if sorted(got) != sorted(SELF_EXPECTED):
        print("FAIL: the checker does not find the planted mistakes")
        print("  expected:\n    " + "\n    ".join(SELF_EXPECTED))
        print("  got:\n    " + "\n    ".join(got))
        return 1

    docker_dir = os.path.join(SRC, "docker")
    compose = os.path.join(docker_dir, "docker-compose.yml")
    with open(compose, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    refs = reference_sections()
    problems = check_compose(doc, helps, refs, compose)
    checked = 0
    for name, svc in (doc.get("services") or {}).items():
        build = svc.get("build")
        if isinstance(build, dict) and build.get("dockerfile"):
            path = os.path.normpath(os.path.join(docker_dir, build.get("context", "."),
                                                 build["dockerfile"]))
            if not os.path.isfile(path):
                problems.append(f"{compose}: service {name}: {path} does not exist")
            checked += 1
    for entry in sorted(os.listdir(docker_dir)):
        if entry.startswith("Dockerfile."):
            problems.extend(check_dockerfile(os.path.join(docker_dir, entry), helps, refs))
    if checked == 0:
        problems.append(f"{compose}: no service is built from a Dockerfile of docker/")
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        print(f"ok: {checked} services and the Dockerfiles pass only settings that exist and "
              "are in the configuration reference")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
