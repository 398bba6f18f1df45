#!/usr/bin/env python3
"""Checks that every #include follows the part table of docs/architecture.md.

The document is the one source of truth; this script reads three of its
tables, recognised by their header rows:

  | folder | part | may include |            "Parts": who may depend on whom
  | part | public headers | private headers |  "Private headers": each interface
  | file | may include | why |               "Exceptions": the known leaks

and then every quoted #include of every C, CUDA and header file under a part's
folder.  An include names another part's header when it resolves (relative
to the including file first, then by the path it names, as the compiler's -I
search finds it) to a header of the tree in another part.  It is refused
when the including part may not include that part or that header, or when
the header is not in that part's public headers; the "may include" cell
"anything" means every part, and "private headers too" lifts the second rule
(tests/ only).  An exception row allows one file, or every file under a
folder, one named header or part.  Angle-bracket includes are system
headers and are not checked.

It also checks that the interface table is complete (every header of a part
is listed as public or private, every listed header exists) and that it
agrees with CMake: in a part whose CMakeLists.txt declares its interface
with fb_part_interface(), the declared headers are exactly the public ones
(plus any an exception names).

Exit 0: every include is allowed; 1: a rule is broken (each finding is one
line "file:line: ..." or "file: ..."); 2: the document cannot be read.
"""
import argparse
import os
import re
import sys

SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
SKIP_DIRS = {".git", "node_modules", "__pycache__"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
TICK_RE = re.compile(r"`([^`]+)`")
INTERFACE_RE = re.compile(r"fb_part_interface\(\s*(\w+)((?:\s+[^\s)]+)*)\s*\)", re.S)


class DocError(Exception):
    pass


def table_rows(lines, header):
    """The data rows of the first markdown table whose header row starts with
    the cells `header` (case-insensitive), as lists of cell strings."""
    want = [h.lower() for h in header]
    for i, line in enumerate(lines):
        cells = split_row(line)
        if cells is None or [c.lower() for c in cells[: len(want)]] != want:
            continue
        rows = []
        for row in lines[i + 2:]:
            cells = split_row(row)
            if cells is None:
                break
            rows.append(cells)
        return rows
    raise DocError("no table with the header | %s |" % " | ".join(header))


def split_row(line):
    line = line.strip()
    if not line.startswith("|") or not line.endswith("|"):
        return None
    return [c.strip() for c in line[1:-1].split("|")]


def is_header(name):
    return name.endswith((".h", ".cuh"))


def headers_in(cell):
    """The backticked header names of a cell (other backticked words, such as
    a library's name, are commentary)."""
    return {n for n in TICK_RE.findall(cell) if is_header(n)}


def folder_of(cell, what):
    names = TICK_RE.findall(cell)
    if len(names) != 1 or not names[0].endswith("/"):
        raise DocError("%s cell %r: want one `folder/`" % (what, cell))
    return names[0]


class Rules:
    """The three tables of the document, read."""

    def __init__(self, text):
        lines = text.splitlines()
        self.parts = {}  # folder -> {"parts", "headers", "anything", "private"}
        for cells in table_rows(lines, ["folder", "part", "may include"]):
            folder = folder_of(cells[0], "parts table folder")
            cell = cells[2]
            names = TICK_RE.findall(cell)
            plain = TICK_RE.sub("", cell).lower()
            self.parts[folder] = {
                "parts": {n for n in names if n.endswith("/")},
                "headers": {n for n in names if is_header(n) and "/" in n},
                "anything": "anything" in plain,
                "private": "private headers too" in plain,
            }
        self.public = {}  # folder -> set of headers relative to it, or None: every one
        self.private = {}
        for cells in table_rows(lines, ["part", "public headers", "private headers"]):
            folder = folder_of(cells[0], "interface table part")
            if folder not in self.parts:
                raise DocError("interface table names %s, which is not a part" % folder)
            every = "every header" in TICK_RE.sub("", cells[1]).lower()
            self.public[folder] = None if every else headers_in(cells[1])
            self.private[folder] = headers_in(cells[2])
        self.exceptions = []  # (file or folder/, header or folder/)
        for cells in table_rows(lines, ["file", "may include", "why"]):
            for src in TICK_RE.findall(cells[0]):
                for dst in TICK_RE.findall(cells[1]):
                    self.exceptions.append((src, dst))
        for folder, rule in self.parts.items():
            for dep in rule["parts"]:
                if dep not in self.parts:
                    raise DocError("%s may include %s, which is not a part" % (folder, dep))

    def part_of(self, path):
        """The part a tree path belongs to: the longest folder that holds it."""
        best = None
        for folder in self.parts:
            if path.startswith(folder) and (best is None or len(folder) > len(best)):
                best = folder
        return best

    def is_public(self, header, part):
        pub = self.public.get(part)
        return pub is None or header[len(part):] in pub

    def excepted(self, src, header):
        for esrc, edst in self.exceptions:
            src_ok = src == esrc or (esrc.endswith("/") and src.startswith(esrc))
            dst_ok = header == edst or (edst.endswith("/") and header.startswith(edst))
            if src_ok and dst_ok:
                return True
        return False


def tree_files(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("build"))
        for f in sorted(files):
            if f.endswith(SOURCE_EXT):
                out.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return out


def resolve(path, name, headers, rules):
    """The tree header that `#include "name"` in `path` reaches, or None
    (a system or generated header), or a list when it is ambiguous."""
    rel = os.path.normpath(os.path.join(os.path.dirname(path), name)).replace(os.sep, "/")
    if rel in headers:
        return rel
    found = [h for h in headers if h == name or h.endswith("/" + name)]
    if len(found) > 1:
        mine = [h for h in found if rules.part_of(h) == rules.part_of(path)]
        found = mine if len(mine) == 1 else found
    if not found:
        return None
    return found[0] if len(found) == 1 else found


def check_include(path, line, name, target, rules):
    src_part = rules.part_of(path)
    if isinstance(target, list):
        return "%s:%d: \"%s\" is ambiguous: %s" % (path, line, name, ", ".join(target))
    dst_part = rules.part_of(target)
    if dst_part is None or dst_part == src_part or rules.excepted(path, target):
        return None
    rule = rules.parts[src_part]
    allowed = rule["anything"] or dst_part in rule["parts"] or target in rule["headers"]
    if not allowed:
        return "%s:%d: includes \"%s\" (%s): %s may not include %s" % (
            path, line, name, target, src_part, dst_part)
    if not rule["private"] and not rules.is_public(target, dst_part):
        return "%s:%d: includes \"%s\" (%s), a private header of %s" % (
            path, line, name, target, dst_part)
    return None


def check_interfaces(root, files, rules):
    """The interface table against the tree and against CMake."""
    found = []
    headers_of = {}
    for f in files:
        part = rules.part_of(f)
        if f.endswith((".h", ".cuh")) and part is not None:
            headers_of.setdefault(part, set()).add(f[len(part):])
    for part, pub in sorted(rules.public.items()):
        have = headers_of.get(part, set())
        listed = (pub or set()) | rules.private[part]
        for h in sorted(listed - have):
            found.append("docs: %s%s is listed in the interface table but does not exist" % (part, h))
        if pub is not None:
            for h in sorted(have - listed):
                found.append("%s%s: not in the interface table (list it as public or private)" % (part, h))
        cmake = os.path.join(root, part, "CMakeLists.txt")
        if not os.path.exists(cmake):
            continue
        with open(cmake, encoding="utf-8") as fh:
            declared = set()
            for m in INTERFACE_RE.finditer(fh.read()):
                declared |= set(m.group(2).split())
        if not declared:
            if pub is not None:
                found.append("%sCMakeLists.txt: declares no fb_part_interface() but the "
                             "interface table lists public headers of %s" % (part, part))
            continue
        if pub is None:
            found.append("%sCMakeLists.txt: fb_part_interface() in a part whose every "
                         "header is public" % part)
            continue
        named = {d[len(part):] for _, d in rules.exceptions if d.startswith(part)}
        for h in sorted(pub - declared):
            found.append("%sCMakeLists.txt: public %s is not in fb_part_interface()" % (part, h))
        for h in sorted(declared - pub - named):
            found.append("%sCMakeLists.txt: fb_part_interface() publishes %s, which the "
                         "interface table calls private" % (part, h))
    return found


def check_tree(root, doc_text):
    """Every finding for the tree at `root`, as sorted lines."""
    rules = Rules(doc_text)
    files = tree_files(root)
    headers = {f for f in files if f.endswith((".h", ".cuh"))}
    found = []
    for path in files:
        if rules.part_of(path) is None:
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
            for n, text in enumerate(fh, 1):
                m = INCLUDE_RE.match(text)
                if not m:
                    continue
                target = resolve(path, m.group(1), headers, rules)
                if target is None:
                    continue
                msg = check_include(path, n, m.group(1), target, rules)
                if msg:
                    found.append(msg)
    found += check_interfaces(root, files, rules)
    return found


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")))
    ap.add_argument("--doc", help="default: ROOT/docs/architecture.md")
    args = ap.parse_args()
    doc = args.doc or os.path.join(args.root, "docs", "architecture.md")
    try:
        with open(doc, encoding="utf-8") as fh:
            found = check_tree(args.root, fh.read())
    except (OSError, DocError) as e:
        print("check_includes: %s: %s" % (doc, e), file=sys.stderr)
        return 2
    for f in found:
        print(f)
    if found:
        print("check_includes: %d finding(s); the rules are docs/architecture.md's "
              "\"Parts\", \"Private headers\" and \"Exceptions\"" % len(found), file=sys.stderr)
        return 1
    print("check_includes: every #include follows docs/architecture.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
