#!/usr/bin/python3
"""Runs Dask's own tests (Debian's python3-distributed) over tcp:// and over ordo:// and
compares the outcomes: every test that passes over tcp must pass over ordo, apart from those
tcp_only.py names (skipped over ordo, each with why). Exit status 1 on any difference.

    PYTHONPATH=build/python tests/python/dask_suite/run.py [--files test_batched,test_core,...]
        [--timeout-s 1500] [--junit-dir DIR]

Each file runs in its own pytest process per scheme, one after another (Dask's tests are timed:
two at once on a 2-core machine would slow both), with ordo_dask_plugin.py as upstream's root
conftest.py. Outcomes come from pytest's JUnit XML.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import distributed

HERE = pathlib.Path(__file__).resolve().parent
DASK = pathlib.Path(distributed.__file__).resolve().parent
FILES = {"test_comms": DASK / "comm" / "tests" / "test_comms.py"}
DEFAULT = "test_comms,test_batched,test_core,test_worker"


def path_of(name: str) -> pathlib.Path:
    return FILES.get(name, DASK / "tests" / f"{name}.py")


def outcomes(xml_path: pathlib.Path) -> dict[str, str]:
    """test id (file::name) -> passed, failed, error or skipped."""
    out: dict[str, str] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                     else "skipped" if "skipped" in kinds else "passed")
    return out


def run(name: str, scheme: str, junit: pathlib.Path, timeout_s: float,
        only: list[str] | None = None) -> dict[str, str]:
    """Runs file `name` (or only the tests `only` names of it) over `scheme`."""
    env = dict(os.environ)
    env["DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME"] = scheme
    paths = [str(HERE)] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep)
                           if p]  # absolute: pytest runs in a directory of its own
    env["PYTHONPATH"] = os.pathsep.join(paths)
    xml_path = junit / f"{name}-{scheme}{'-rerun' if only else ''}.xml"
    targets = [f"{path_of(name)}::{t.split('::', 1)[1]}" for t in only] if only else \
        [str(path_of(name))]
    cmd = [sys.executable, "-m", "pytest", "-p", "ordo_dask_plugin", "-p", "no:cacheprovider",
           "-q", "--timeout", "300", "-o", "junit_family=xunit1", f"--junitxml={xml_path}",
           "-W", "ignore::DeprecationWarning", *targets]
    xml_path.unlink(missing_ok=True)  # a report left by an earlier run is not this one's
    t = time.monotonic()
    with tempfile.TemporaryDirectory() as cwd:  # no conftest or ini of ours on the way
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    took = time.monotonic() - t
    # pytest's exit status: 0 all passed, 1 some failed; anything else (interrupted, an internal
    # error, a crash) means the report is not the file's outcome.
    if p.returncode not in (0, 1) or not xml_path.exists():
        print(p.stdout[-4000:])
        raise SystemExit(f"{name} over {scheme}: pytest ended with {p.returncode}"
                         f"{'' if xml_path.exists() else ', no report'}")
    res = outcomes(xml_path)
    counts = {k: sum(1 for v in res.values() if v == k)
              for k in ("passed", "failed", "error", "skipped")}
    print(f"  {name:<16} {scheme:<5}{' rerun' if only else ''} {took:6.0f} s  " +
          "  ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", default=DEFAULT)
    ap.add_argument("--timeout-s", type=float, default=1500)
    ap.add_argument("--junit-dir")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from tcp_only import TCP_ONLY
    junit = pathlib.Path(a.junit_dir or tempfile.mkdtemp(prefix="dask-suite-"))
    junit.mkdir(parents=True, exist_ok=True)
    print(f"Dask {distributed.__version__} ({DASK}), reports in {junit}")
    worse, better, flaky, seen = [], [], [], set()
    for name in a.files.split(","):
        tcp = run(name, "tcp", junit, a.timeout_s)
        ordo = run(name, "ordo", junit, a.timeout_s)
        seen |= set(tcp)
        differ = [t for t, o in sorted(tcp.items())
                  if t not in TCP_ONLY and o == "passed" and ordo.get(t) != "passed"]
        # Dask's tests are timed, and some fail now and then over any comm (upstream reruns
        # those marked flaky): a difference counts if it shows again in a run of its own.
        again = run(name, "ordo", junit, a.timeout_s, differ) if differ else {}
        for t in differ:
            if again.get(t) == "passed":
                flaky.append(f"{t}: {ordo.get(t, 'missing')} over ordo, then passed again")
            else:
                worse.append(f"{t}: {ordo.get(t, 'missing')}, then {again.get(t, 'missing')}"
                             " again over ordo")
        better += [t for t, o in sorted(tcp.items())
                   if o in ("failed", "error") and ordo.get(t) == "passed"]
    stale = sorted(t for t in TCP_ONLY if t.split("::")[0][:-3] in a.files.split(",")
                   and t not in seen)
    for t in stale:
        print(f"note: tcp_only.py names {t}, which this Dask does not have")
    for t in better:
        print(f"passes over ordo, fails over tcp: {t}")
    for t in flaky:
        print(f"flaky: {t}")
    for t in worse:
        print(f"DIFFERENCE: passes over tcp, not over ordo: {t}")
    print(f"{len(worse)} tests pass over tcp:// and not over ordo:// "
          f"({len(TCP_ONLY)} named tcp-only)")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
