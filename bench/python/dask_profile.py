"""Where a Dask scheduler's and worker's event-loop threads spend their time during a burst of
tiny tasks, over one protocol (bench/README.md, "Dask"): what share the comm takes, and so how
much faster any comm could make Dask here.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/dask_profile.py PROTOCOL [--tasks N]
        [--out DIR] [--report FILE.prof ...]

A LocalCluster of 2 worker processes (1 thread each), as bench_dask.py makes; cProfile runs on
the scheduler's event loop (run_on_scheduler) and on each worker's (run) for the burst only.
Each function's own time is put in one group: the comm (tcp.py, tornado's streams and the
socket calls; ordo's package and extension), Dask's (de)serialisation (shared by every comm), the event loop (its
wait in epoll reported apart), the scheduler, the worker, the rest. cProfile slows Python down
about twofold: compare shares, not rates.
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import pstats
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import dask_workload  # noqa: E402


def _start() -> None:
    import builtins
    import cProfile

    builtins._ordo_bench_profile = cProfile.Profile()
    builtins._ordo_bench_profile.enable()


def _stop(path: str) -> str:
    import builtins

    builtins._ordo_bench_profile.disable()
    builtins._ordo_bench_profile.dump_stats(path)
    return path


def _stop_worker(out: str, tag: str, dask_worker=None) -> str:
    return _stop(f"{out}/{tag}-worker-{dask_worker.address.rsplit(':', 1)[-1]}.prof")


def _group(fn: str, name: str) -> str:
    if fn == "~" and "epoll" in name and "poll" in name:
        return "event loop: waiting in epoll"
    if ("/comm/tcp.py" in fn or "tornado/iostream" in fn or "tornado/netutil" in fn
            or (fn == "~" and "_socket.socket" in name)):
        return "comm: tcp (tcp.py, tornado streams)"
    if "/ordo/" in fn or (fn == "~" and "ordo" in name):
        return "comm: ordo (package and extension)"
    if "/comm/utils.py" in fn or "/protocol/" in fn or (fn == "~" and "msgpack" in name):
        return "Dask (de)serialisation"
    for part, group in (("asyncio", "event loop"), ("selectors", "event loop"),
                        ("tornado", "event loop"), ("/scheduler.py", "scheduler.py"),
                        ("/worker", "worker*.py"), ("/batched.py", "batched.py")):
        if part in fn:
            return group
    return "the rest"


def report(path: str) -> None:
    groups: collections.Counter = collections.Counter()
    for (fn, _, name), (_, _, own, _, _) in pstats.Stats(path).stats.items():
        groups[_group(fn, name)] += own
    busy = sum(v for k, v in groups.items() if "waiting" not in k)
    print(f"  {pathlib.Path(path).name}: {busy:.2f} s busy "
          f"(+{groups['event loop: waiting in epoll']:.2f} s waiting in epoll)")
    for k, v in groups.most_common():
        if "waiting" not in k:
            print(f"    {k:40} {v:6.2f} s {100 * v / busy:5.1f}% of busy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("protocol")
    ap.add_argument("--report", nargs="*", help="only report these .prof files")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--out", help="where the .prof files go (default: a new temporary folder)")
    args = ap.parse_args()
    if args.report:
        for path in args.report:
            report(path)
        return
    from distributed import Client, LocalCluster

    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="ordo-dask-profile-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tag = args.protocol.split(":")[0].replace("+", "-")
    with LocalCluster(protocol=args.protocol, n_workers=2, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        client.gather(client.map(dask_workload.inc, range(200), pure=False))  # warm up
        client.run_on_scheduler(_start)
        client.run(_start)
        t = time.perf_counter()
        total = sum(client.gather(client.map(dask_workload.inc, range(args.tasks), pure=False)))
        took = time.perf_counter() - t
        assert total == args.tasks * (args.tasks + 1) // 2, total
        sched = client.run_on_scheduler(_stop, str(out / f"{tag}-scheduler.prof"))
        workers = client.run(_stop_worker, str(out), tag)
    print(f"{args.protocol} {args.tasks} tasks in {took:.2f} s ({args.tasks / took:.0f} tasks/s,"
          " profiled)")
    print(f"profiles in {out}")
    for path in [sched, *sorted(workers.values())]:
        report(path)


if __name__ == "__main__":
    main()
