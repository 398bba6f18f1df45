#!/usr/bin/env python3
"""The size check (scripts/lib/check_sizes.py) on small fake trees.

Each case is a tree (files under the product folders and some outside them)
and the findings the check must print: none, or lines holding the given
substrings, in order.  Exit 0 when every case gives
exactly its findings.
"""
import contextlib
import io
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "lib"))
import check_sizes  # noqa: E402


def func(name, body_lines, comment=None):
    """A C function in the tree's style with body_lines lines between its braces."""
    head = f"/* {comment} */\n" if comment else ""
    body = "".join(f"    x += {i};\n" for i in range(body_lines))
    return f"{head}static int {name}(int x,\n        int y)\n{{\n{body}    return x;\n}}\n"


FILLER = "int filler;\n"

# (name, {path: text}, [expected substrings])
CASES = [
    ("a small tree is clean", {"api/a.c": func("ok", 10)}, []),
    # a function of 2 signature lines + braces + return: 146 + 5 = 151 lines
    ("a function over 150 lines", {"server/s.c": "\n" + func("big", 146)},
     ["server/s.c:2: big is 151 lines, more than 150"]),
    ("exactly 150 lines passes", {"server/s.c": func("fits", 145)}, []),
    ("a comment that says why it stays whole",
     {"workers/w.c": func("whole", 300, "one state machine: it stays whole because ...")}, []),
    ("a comment that says something else", {"workers/w.c": func("long", 300, "does a thing")},
     ["workers/w.c:2: long is 305 lines"]),
    ("a file over 1500 lines", {"kernels/k.h": FILLER * 1501},
     ["kernels/k.h: 1501 lines, more than 1500"]),
    ("1500 lines pass", {"kernels/k.h": FILLER * 1500}, []),
    ("outside the product folders nothing counts",
     {"tests/t.c": FILLER * 4000 + func("huge", 900), "bench/b.c": FILLER * 2000}, []),
    ("two long functions, two findings in order",
     {"base/b.c": func("big", 200) + func("other", 200)},
     ["base/b.c:1: big is 205 lines", "base/b.c:206: other is 205 lines"]),
    ("a CUDA file counts", {"kernels/cuda/x.cu": FILLER * 1600},
     ["kernels/cuda/x.cu: 1600 lines"]),
]


def run_case(files):
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        argv = ["check_sizes.py", "--root", root]
        out = io.StringIO()
        saved = sys.argv
        sys.argv = argv
        try:
            with contextlib.redirect_stdout(out):
                rc = check_sizes.main()
        finally:
            sys.argv = saved
        return rc, [line for line in out.getvalue().split("\n") if line]


def main():
    failed = 0
    for name, files, expected in CASES:
        rc, lines = run_case(files)
        ok = rc == (1 if expected else 0) and len(lines) == len(expected) and all(
            want in got for want, got in zip(expected, lines))
        if not ok:
            failed += 1
            print(f"FAIL {name}: rc {rc}, printed {lines}, expected {expected}")
    print(f"{len(CASES) - failed} of {len(CASES)} cases pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
