#!/usr/bin/env python3
"""Checks that the library's layers include only downward (docs/design.md, "Layers").

Every `#include "..."` in the library's folders is read. A file may include a header of its own
layer or of a lower one; never of a higher layer, nor of a sibling at the same height (comm and
fleet know nothing of each other). Public headers (include/ordo/) may include only public
headers. Inside rpc/, the folders are a stack of their own (RPC_FOLDERS): a folder includes
only from itself and from lower ones, and two at one height know nothing of each other.
tests/rpc/'s folders are rpc/'s.

Usage: check_layers.py [SOURCE_ROOT]. Prints each violation as FILE:LINE: reason, exits 1 if
there is one, 0 otherwise.
"""
import pathlib
import re
import sys

# (name, height, the path prefixes that belong to it). A prefix is matched against a path
# relative to the source root; an include "ordo/..." is read from include/ordo/.
LAYERS = [
    ("base", 0, ["lib/", "include/ordo/detail/", "include/ordo/config.hpp",
                 "include/ordo/error.hpp", "include/ordo/address.hpp",
                 "include/ordo/identity.hpp", "include/ordo/limits.hpp",
                 "include/ordo/net.hpp", "include/ordo/run.hpp"]),
    ("comm", 1, ["comm/", "include/ordo/comm/"]),
    ("fleet", 1, ["fleet/", "include/ordo/fleet/"]),
    ("rpc", 2, ["rpc/", "include/ordo/rpc/"]),
    ("entry", 3, ["include/ordo/ordo.hpp", "include/ordo/client.hpp"]),
    ("metrics", 4, ["metrics/", "include/ordo/metrics/"]),
    ("json", 4, ["json/"]),
    ("gateway", 5, ["gateway/", "include/ordo/gateway/"]),
]
# rpc/'s folders, by height (docs/design.md, "Layers").
RPC_FOLDERS = {"wire": 0, "context": 1, "session": 1, "streams": 1, "dispatch": 2,
               "batching": 2, "connection": 3, "server": 4, "channels": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    for name, height, prefixes in LAYERS:
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes):
            return name, height
    return None


def resolve(target, root):
    """The include's path relative to the root, as the build's include directories find it."""
    if target.startswith("ordo/"):
        return "include/" + target
    if (root / target).exists():
        return target
    return None


def check_rpc(rel, n, target):
    """The order inside rpc/: `rel` (in rpc/) includes `target` (in rpc/)."""
    mine, theirs = rel.split("/")[1], target.split("/")[1]
    if mine == theirs:
        return []
    for folder in (mine, theirs):
        if folder not in RPC_FOLDERS:
            return [f"{rel}:{n}: rpc/{folder}/ has no height in RPC_FOLDERS"]
    if RPC_FOLDERS[theirs] > RPC_FOLDERS[mine]:
        return [f"{rel}:{n}: rpc/{mine} (height {RPC_FOLDERS[mine]}) includes {target} of the "
                f"higher rpc/{theirs} (height {RPC_FOLDERS[theirs]})"]
    if RPC_FOLDERS[theirs] == RPC_FOLDERS[mine]:
        return [f"{rel}:{n}: rpc/{mine} includes {target} of its sibling rpc/{theirs}"]
    return []


def check(root):
    problems = []
    files = []
    for _, _, prefixes in LAYERS:
        for p in prefixes:
            q = root / p
            if p.endswith("/"):
                files += [f for f in q.rglob("*") if f.suffix in (".hpp", ".cpp")]
            elif q.exists():
                files.append(q)
    if len(files) < 50:
        problems.append(f"{root}: only {len(files)} library files found; wrong root?")
    for f in sorted(set(files)):
        rel = f.relative_to(root).as_posix()
        mine = layer_of(rel)
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(m.group(1), root)
            if target is None:
                problems.append(f"{rel}:{n}: includes {m.group(1)}, which is not in the tree")
                continue
            theirs = layer_of(target)
            if theirs is None:
                problems.append(f"{rel}:{n}: includes {target}, outside every layer")
                continue
            if rel.startswith("include/") and not target.startswith("include/"):
                problems.append(f"{rel}:{n}: a public header includes the private {target}")
            if theirs[1] > mine[1]:
                problems.append(f"{rel}:{n}: {mine[0]} (height {mine[1]}) includes {target} "
                                f"of the higher layer {theirs[0]} (height {theirs[1]})")
            elif theirs[1] == mine[1] and theirs[0] != mine[0]:
                problems.append(f"{rel}:{n}: {mine[0]} includes {target} of its sibling "
                                f"layer {theirs[0]}")
            if rel.startswith("rpc/") and target.startswith("rpc/"):
                problems += check_rpc(rel, n, target)
    for folder in RPC_FOLDERS:
        if not (root / "rpc" / folder).is_dir():
            problems.append(f"rpc/{folder}/ is missing (docs/design.md names it)")
    for p in (root / "rpc").iterdir():
        if p.is_dir() and p.name not in RPC_FOLDERS:
            problems.append(f"rpc/{p.name}/ has no height in RPC_FOLDERS")
    tests = root / "tests" / "rpc"
    if tests.is_dir():  # tests/rpc/ mirrors rpc/: a folder of tests per folder of code
        for p in tests.iterdir():
            if p.is_dir() and p.name not in RPC_FOLDERS:
                problems.append(f"tests/rpc/{p.name}/ is no folder of rpc/")
    loose = [p.name for p in (root / "rpc").iterdir() if p.is_file()]
    if loose:
        problems.append(f"rpc/ holds files outside its folders: {', '.join(sorted(loose))}")
    return problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = check(root)
    for p in problems:
        print(p)
    print(f"{len(problems)} layering problem(s)" if problems else "layers: every include goes down")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
