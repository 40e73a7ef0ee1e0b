#!/usr/bin/env python3
"""Checks that the docs and comments name what is there (docs/design.md, "Layout").

1. Every repository path named in a doc (README.md, docs/, bench/README.md, python/README.md)
   or in a comment of the project's sources exists. A repository path is one that begins with
   a top-level folder of the repository (`rpc/wire/read.hpp`, `tests/python/`), or, in a
   Markdown link, one relative to the document. `*` in a name matches any characters
   (`rpc/wire/read.*`). CHANGELOG.md is history and may name what has gone.
2. The docs hold no history: no figure labelled by a round of work ("eighteenth round") and
   no "issue N"; figures say their date and commit, and CHANGELOG.md holds what came before.
3. Every library file (the layers of tools/check_layers.py, the Python package, tools/)
   appears in docs/design.md's layout table, in the row of its folder: by its name, by its
   name without the extension, or by a pattern with `*`.

Usage: check_docs.py [SOURCE_ROOT]. Prints each problem as FILE:LINE: reason, exits 1 if there
is one, 0 otherwise.
"""
import fnmatch
import pathlib
import re
import sys

TOP = ["bench", "comm", "docs", "examples", "fleet", "gateway", "include", "json", "lib",
       "metrics", "python", "rpc", "tests", "tools", ".ci", "cmake"]
DOCS = ["README.md", "docs", "bench/README.md", "python/README.md"]
SOURCES = [".ci", "bench", "comm", "examples", "fleet", "gateway", "include", "json", "lib",
           "metrics", "python", "rpc", "tests", "tools", "meson.build", "meson_options.txt"]
CODE_SUFFIXES = {".hpp", ".cpp", ".h", ".py", ".pyi", ".sh", ".build", ".txt", ".cmake"}
# The files the layout table must name, by folder (a file's folder is its row).
LIBRARY = ["lib", "comm", "fleet", "rpc", "include/ordo", "metrics", "json", "gateway",
           "python/ordo", "tools"]
LIBRARY_SUFFIXES = {".hpp", ".cpp", ".py", ".pyi", ".sh"}

PATH = re.compile(r"(?<![\w./@:-])((?:" + "|".join(re.escape(t) for t in TOP) +
                  r")/[\w.*/{},-]*[\w*/}])")
EXECUTABLE = re.compile(r"executable\(\s*'([^']+)'")
ORDINAL = (r"(?:(?:twenty|thirty|forty|fifty|sixty)-)?(?:first|second|third|fourth|fifth|sixth|"
           r"seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth|[a-z]+tieth|last|same)")
HISTORY = re.compile(r"(?i:\b(?:" + ORDINAL + r"|\d+(?:st|nd|rd|th)) rounds?\b(?!\s*-?\s*trips?)"
                     r"|\bissues? #?\d+)|\bRound \d+")  # "15 rounds 1.005x" is a benchmark's
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
COMMENT = {".py": re.compile(r"#(.*)$"), ".sh": re.compile(r"#(.*)$"),
           ".build": re.compile(r"#(.*)$"), ".txt": re.compile(r"#(.*)$"),
           ".cmake": re.compile(r"#(.*)$")}
C_COMMENT = re.compile(r"//(.*)$|/\*(.*?)(?:\*/|$)|^\s*\*(.*)$")


def expand(path):
    """`a.{hpp,cpp}` -> a.hpp, a.cpp."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",")
            for x in expand(path[:m.start()] + alt + path[m.end():])]


def exists(root, path, targets):
    """Whether `path` names a file or folder of the tree (a name without its extension names
    the files with that stem, as `comm/framing` does framing.cpp and framing.hpp), a program
    the build makes (`examples/inc`), or what .gitignore keeps out of the tree."""
    for p in expand(path.rstrip("/")):
        if p in targets or any(ignored(p, g) for g in targets["gitignore"]):
            continue
        parent, _, name = p.rpartition("/")
        folder = root / parent
        if (root / p).exists():
            continue
        if not folder.is_dir():
            return False
        pattern = name if "*" in name else name + ".*"
        if not any(fnmatch.fnmatch(q.name, pattern) for q in folder.iterdir()):
            return False
    return True


def ignored(path, entry):
    """Whether .gitignore's `entry` (a folder, with its trailing /) covers `path`: one that
    starts with / from the repository's root, any other at any depth."""
    if entry.startswith("/"):
        return fnmatch.fnmatch(path + "/", entry[1:] + "*")
    return fnmatch.fnmatch("/" + path + "/", "*/" + entry + "*")


def build_targets(root):
    """The programs meson.build files make (folder/name), and .gitignore's paths."""
    targets = {"gitignore": []}
    for m in root.rglob("meson.build"):
        if "build" in m.relative_to(root).parts[0]:
            continue
        folder = m.parent.relative_to(root).as_posix()
        for name in EXECUTABLE.findall(m.read_text()):
            targets[f"{folder}/{name}" if folder != "." else name] = True
    for line in (root / ".gitignore").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            targets["gitignore"].append(line.strip().rstrip("/") + "/")
    return targets


def named_paths(text):
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".")
        if p.endswith(("/.", "/..")):
            continue
        yield p


def comment_text(path, line):
    if path.suffix in COMMENT:
        m = COMMENT[path.suffix].search(line)
        return m.group(1) if m else ""
    if path.suffix in (".hpp", ".cpp", ".h"):
        m = C_COMMENT.search(line)
        return next((g for g in m.groups() if g), "") if m else ""
    return ""


def check_named(root):
    problems = []
    targets = build_targets(root)
    docs = []
    for d in DOCS:
        q = root / d
        docs += sorted(q.rglob("*.md")) if q.is_dir() else [q] if q.exists() else []
    for f in docs:
        rel = f.relative_to(root).as_posix()
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for p in named_paths(line):
                here = f.parent.relative_to(root).as_posix()
                if not exists(root, p, targets) and not (
                        here != "." and exists(root, f"{here}/{p}", targets)):
                    problems.append(f"{rel}:{n}: names {p}, which is not in the repository")
            for m in HISTORY.finditer(line):
                problems.append(f"{rel}:{n}: \"{m.group(0)}\" is history: a date and commit, "
                                f"or CHANGELOG.md")
            for m in LINK.finditer(line):
                target = m.group(1)
                if "://" in target or target.startswith("mailto:"):
                    continue
                if not (f.parent / target).exists():
                    problems.append(f"{rel}:{n}: links to {target}, which is not there")
    files = []
    for s in SOURCES:
        q = root / s
        if q.is_dir():
            files += [p for p in q.rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES
                      and "corpus" not in p.parts]
        elif q.exists():
            files.append(q)
    for f in sorted(files):
        rel = f.relative_to(root).as_posix()
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for p in named_paths(comment_text(f, line)):
                if not exists(root, p, targets):
                    problems.append(f"{rel}:{n}: a comment names {p}, which is not in the "
                                    f"repository")
    return problems


def layout_rows(design):
    """folder -> the names its row of the layout table gives (backticked words)."""
    rows = {}
    text = design.read_text()
    section = text.split("## 3. Layout", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 4 or cells[1].strip() in ("folder", "---"):
            continue
        names = re.findall(r"`([^`]+)`", cells[2])
        for folder in re.findall(r"`([^`]+)`", cells[1]):
            rows.setdefault(folder.rstrip("/"), []).extend(names)
    return rows


def named_in_row(rel_in_folder, names):
    stem = rel_in_folder.rsplit(".", 1)[0]
    base = rel_in_folder.rsplit("/", 1)[-1]
    base_stem = base.rsplit(".", 1)[0]
    for entry in names:
        for word in re.split(r"[\s,;()]+", entry):
            word = word.rstrip(".:")
            if not word:
                continue
            for candidate in (rel_in_folder, stem, base, base_stem):
                if word == candidate or ("*" in word and fnmatch.fnmatch(candidate, word)):
                    return True
            # `ordo/detail/spare_buffers.hpp` names include/ordo/detail/spare_buffers.hpp
            if word.endswith("/" + rel_in_folder) or word.endswith("/" + base):
                return True
    return False


def check_layout(root):
    problems = []
    design = root / "docs" / "design.md"
    rows = layout_rows(design)
    if len(rows) < 15:
        return [f"docs/design.md: only {len(rows)} rows found in the layout table"]
    for top in LIBRARY:
        for f in sorted((root / top).rglob("*")):
            if not f.is_file() or f.suffix not in LIBRARY_SUFFIXES:
                continue
            rel = f.relative_to(root).as_posix()
            if rel.startswith("tools/") and rel.count("/") > 1:
                continue
            # The deepest row whose folder holds the file.
            folder = max((k for k in rows if rel.startswith(k + "/")), key=len, default=None)
            if folder is None:
                problems.append(f"{rel}: no row of docs/design.md's layout holds its folder")
                continue
            if not named_in_row(rel[len(folder) + 1:], rows[folder]):
                problems.append(f"{rel}: not named in docs/design.md's layout row `{folder}/`")
    return problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = check_named(root) + check_layout(root)
    for p in problems:
        print(p)
    print(f"{len(problems)} docs problem(s)" if problems
          else "docs: every named path exists and every library file is in the layout")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
