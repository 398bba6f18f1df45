#!/usr/bin/env python3
"""The include check (scripts/lib/check_includes.py) on a small fake tree.

A tree of four parts (low/, mid/, top/, tests/) and a document with the three
tables; each case is one file of the tree with one #include and the finding
it must cause, or none.  Then the findings about the tables themselves (a
header listed nowhere, a listed header that does not exist, a CMake
interface that disagrees with the document) and documents that cannot be
read.  Exit 0 when every case gives exactly its finding.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "lib"))
import check_includes  # noqa: E402

DOC = """# fake

| folder | part | may include |
|---|---|---|
| `low/` | the bottom | nothing of ours |
| `mid/` | in between | `low/` |
| `top/` | the top | `mid/`, `low/one.h` |
| `tests/` | tests | anything, private headers too |
| `bench/` | benchmarks | anything |

| part | public headers | private headers |
|---|---|---|
| `low/` | `one.h`, `two.h` | `low_impl.h` |
| `mid/` | every header | — |
| `top/` | `top.h` | `top_impl.h` |
| `tests/` | every header | — |
| `bench/` | every header | — |

| file | may include | why |
|---|---|---|
| `mid/hook.c` | `low/low_impl.h` | a wrapper that fills the table |
"""

# (file, its text, the finding it must cause: None or a substring)
CASES = [
    # allowed: a part below, by bare name and by a path
    ("mid/a.c", '#include "one.h"\n', None),
    ("mid/b.c", '#include "../low/two.h"\n', None),
    # the part's own private header, from inside the part
    ("low/x.c", '#include "low_impl.h"\n', None),
    # system headers, in angle brackets or in quotes, are not ours
    ("low/sys.c", "#include <stdio.h>\n#include \"stdlib.h\"\n", None),
    # a header named in the cell, when its part is not
    ("top/c.c", '#include "one.h"\n', None),
    # forbidden: upward, and a part the cell does not name
    ("low/up.c", '#include "mid.h"\n', "low/up.c:1: includes \"mid.h\" (mid/mid.h): low/ may not include mid/"),
    ("top/d.c", '\n#include "two.h"\n', "top/d.c:2: includes \"two.h\" (low/two.h): top/ may not include low/"),
    # another part's private header, by name and by a relative path
    ("mid/e.c", '#include "low_impl.h"\n', "mid/e.c:1: includes \"low_impl.h\" (low/low_impl.h), a private header of low/"),
    ("mid/f.h", '#include "../low/low_impl.h"\n', "mid/f.h:1: includes \"../low/low_impl.h\" (low/low_impl.h), a private header of low/"),
    # an exception allows one file, and only that one
    ("mid/hook.c", '#include "low_impl.h"\n', None),
    # tests may reach internals; benchmarks may not
    ("tests/t.c", '#include "top_impl.h"\n#include "low_impl.h"\n', None),
    ("bench/b.c", '#include "top.h"\n#include "top_impl.h"\n',
     "bench/b.c:2: includes \"top_impl.h\" (top/top_impl.h), a private header of top/"),
    # a file outside every part is not checked
    ("tools/z.c", '#include "top_impl.h"\n', None),
]

BASE_FILES = {
    "low/one.h": "", "low/two.h": "", "low/low_impl.h": "",
    "low/CMakeLists.txt": "fb_part_interface(fb_low one.h two.h)\nfb_part_interface(fb_low_impl\n  low_impl.h)\n",
    "mid/mid.h": "",
    "top/top.h": "", "top/top_impl.h": "",
    "top/CMakeLists.txt": "fb_part_interface(fb_top top.h)\n",
}


def write_tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)


def findings(files, doc=DOC):
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, files)
        return check_includes.check_tree(root, doc)


failures = []


def expect(name, got, want):
    """want: the exact list of findings (substrings, in order)."""
    ok = len(got) == len(want) and all(w in g for g, w in zip(got, want))
    print("%-40s %s" % (name, "ok" if ok else "FAILED"))
    if not ok:
        failures.append(name)
        print("   want: %r\n   got:  %r" % (want, got))


# the tree of every case at once must give exactly the cases' findings
files = dict(BASE_FILES)
for path, text, _ in CASES:
    files[path] = text
expect("all cases together", sorted(findings(files)), sorted(w for _, _, w in CASES if w))
# and each case alone, so one case cannot hide another
for path, text, want in CASES:
    expect(path, findings(dict(BASE_FILES, **{path: text})), [want] if want else [])

# the interface table against the tree and CMake
expect("header listed nowhere", findings(dict(BASE_FILES, **{"top/new.h": ""})),
       ["top/new.h: not in the interface table"])
gone = dict(BASE_FILES)
del gone["low/two.h"]
expect("listed header missing", findings(gone),
       ["docs: low/two.h is listed in the interface table but does not exist"])
expect("public header CMake lacks",
       findings(dict(BASE_FILES, **{"top/CMakeLists.txt": "fb_part_interface(fb_top)\n"})),
       ["top/CMakeLists.txt: declares no fb_part_interface()"])
expect("CMake publishes a private one",
       findings(dict(BASE_FILES, **{"top/CMakeLists.txt": "fb_part_interface(fb_top top.h top_impl.h)\n"})),
       ["top/CMakeLists.txt: fb_part_interface() publishes top_impl.h"])
expect("CMake interface in an all-public part",
       findings(dict(BASE_FILES, **{"mid/CMakeLists.txt": "fb_part_interface(fb_mid mid.h)\n"})),
       ["mid/CMakeLists.txt: fb_part_interface() in a part whose every header is public"])

# documents that cannot be read are refused, not passed
for name, doc in [
    ("no parts table", DOC.replace("| folder | part | may include |", "| dir | what |")),
    ("no interface table", DOC.replace("| part | public headers |", "| part | headers |")),
    ("a dependency that is no part", DOC.replace("| `mid/`, `low/one.h` |", "| `nowhere/` |")),
    ("interface of no part", DOC.replace("| `bench/` | every header | — |", "| `web/` | every header | — |")),
]:
    try:
        findings({}, doc)
        got = "accepted"
    except check_includes.DocError:
        got = "refused"
    expect("doc: " + name, [got], ["refused"])

sys.exit(1 if failures else 0)
