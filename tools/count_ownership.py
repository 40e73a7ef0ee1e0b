#!/usr/bin/env python3
"""Counts how the library's objects are kept alive and hinted, and fails when a count is not
at its ceiling.

Shared ownership and liveness tokens (`shared_ptr`, `weak_from_this`), coroutines nobody
awaits (`net::detached`), and hints the compiler is given by hand (`[[unlikely]]`,
`always_inline`) are counted, as text (comments too), over the library's source folders.
Each ceiling is today's count. A change that adds one takes one away elsewhere, or raises the
ceiling here, where a reviewer sees it; a change that takes one away lowers the ceiling, so
that no slack is left to use up unseen. The aims beside them are where the design is going
(one owner that joins its coroutines).

Usage: count_ownership.py [SOURCE_ROOT]. Prints each count, its ceiling and its aim; exits 1
if a count is not at its ceiling.
"""
import pathlib
import re
import sys

FOLDERS = ["lib", "comm", "fleet", "rpc", "include", "metrics", "json", "gateway"]
# name: (pattern, ceiling, aim)
COUNTS = {
    "shared_ptr": (r"\bshared_ptr\b", 355, 215),
    "weak_from_this": (r"\bweak_from_this\b", 20, 10),
    "net::detached": (r"\bnet::detached\b", 0, 0),
    "[[unlikely]]": (r"\[\[unlikely\]\]", 58, None),
    "always_inline": (r"\balways_inline\b", 28, None),
    "dynamic_cast": (r"\bdynamic_cast\b", 0, 0),
}


def count(root):
    found = {name: 0 for name in COUNTS}
    files = [f for d in FOLDERS for f in (root / d).rglob("*") if f.suffix in (".hpp", ".cpp")]
    if len(files) < 50:
        raise SystemExit(f"{root}: only {len(files)} library files found; wrong root?")
    for f in files:
        text = f.read_text(errors="replace")
        for name, (pattern, _, _) in COUNTS.items():
            found[name] += len(re.findall(pattern, text))
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    found = count(root)
    over = 0
    for name, (_, ceiling, aim) in COUNTS.items():
        n = found[name]
        mark = ("OVER" if n > ceiling else
                f"under: lower the ceiling to {n}" if n < ceiling else "ok")
        over += n != ceiling
        print(f"{name:16} {n:5}  ceiling {ceiling:5}  aim {'-' if aim is None else aim:>5}  {mark}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
