#!/usr/bin/env python3
"""Checks the size rules of docs/architecture.md ("Rooms").

A product source file (C, CUDA or header, under api/, base/, kernels/,
server/, sim/ or workers/) holds at most 1500 lines, and a function at most
150, unless the comment just above the function says why it "stays whole".

Functions are found the way the tree writes them: the signature starts in
column 0, the body opens with "{" alone in column 0 and closes with "}" in
column 0.  A function's size is its lines from the first signature line to
the closing brace.

Exit 0: the tree follows the rules; 1: a finding (one line each).
"""
import argparse
import os
import re
import sys

PARTS = ("api", "base", "kernels", "server", "sim", "workers")
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
MAX_FILE_LINES = 1500
MAX_FUNC_LINES = 150
WHOLE_MARK = "stays whole"
NAME_RE = re.compile(r"([A-Za-z_]\w*)\s*\(")


def source_files(root):
    for part in PARTS:
        top = os.path.join(root, part)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in ("node_modules", "__pycache__"))
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def signature_start(lines, brace):
    """Index of the first line of the signature that ends just above lines[brace]."""
    i = brace - 1
    while i > 0:
        prev = lines[i - 1]
        if not prev.strip() or prev.rstrip().endswith((";", "*/", "}")) or prev.startswith("#"):
            break
        if not prev[:1].isalpha() and not prev[:1] in "_ \t":
            break
        i -= 1
    return i


def comment_above(lines, start):
    """The block comment (or run of // lines) ending just above lines[start]."""
    i = start - 1
    if i < 0:
        return ""
    if lines[i].rstrip().endswith("*/"):
        j = i
        while j >= 0 and "/*" not in lines[j]:
            j -= 1
        return "\n".join(lines[max(j, 0) : i + 1])
    j = i
    while j >= 0 and lines[j].lstrip().startswith("//"):
        j -= 1
    return "\n".join(lines[j + 1 : i + 1])


def functions(lines):
    """Yields (name, first line index, size in lines, comment above)."""
    n = len(lines)
    i = 0
    while i < n:
        if lines[i].rstrip() == "{" and i > 0 and lines[i - 1].rstrip().endswith(")"):
            start = signature_start(lines, i)
            sig = " ".join(l.strip() for l in lines[start:i])
            m = NAME_RE.search(sig.split("(")[0] + "(")
            name = m.group(1) if m else "?"
            j = i + 1
            while j < n and not lines[j].startswith("}"):
                j += 1
            yield name, start, j - start + 1, comment_above(lines, start)
            i = j
        i += 1


def findings(root):
    """Yields (name, size, message) for every file or function over its limit."""
    for rel in source_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) > MAX_FILE_LINES:
            yield rel, len(lines), f"{rel}: {len(lines)} lines, more than {MAX_FILE_LINES}"
        for name, start, size, comment in functions(lines):
            if size > MAX_FUNC_LINES and WHOLE_MARK not in comment:
                yield (f"{rel}:{name}", size,
                       f"{rel}:{start + 1}: {name} is {size} lines, more than {MAX_FUNC_LINES}, "
                       f"and the comment above it does not say why it {WHOLE_MARK}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=".")
    args = ap.parse_args()
    bad = [message for _, _, message in findings(args.root)]
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
