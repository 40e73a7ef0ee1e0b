"""Dask over ordo's comm backend (ordo.dask) against Dask's own tcp://, in one run
(bench/README.md, "Dask"):

    PYTHONPATH=build/python /usr/bin/python3 bench/python/bench_dask.py [--runs 3]
        [--burst 100000] [--scale 1.0] [--json FILE]

Each run starts a LocalCluster of 2 worker processes (1 thread each) per protocol, the two
protocols interleaved run after run, and measures on it:
- the workload of dask_workload.py (10,000 small tasks, a shuffle of about 5 MB, a reduction tree
  of 512 leaves): its wall time;
- a burst of --burst tiny tasks (client.map(inc) then gather): its wall time, tasks/s, and the
  scheduler<->worker messages per second, counted by Dask's own BatchedSend counters at both
  ends (the scheduler's stream to each worker, each worker's stream to the scheduler).
Medians are reported with the ordo/tcp ratio of each figure.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import dask_workload  # noqa: E402

PROTOCOLS = ("tcp://", "ordo://")


def _messages(cluster, client) -> int:
    """Messages sent so far between the scheduler and its workers, both ways (BatchedSend's
    message_count: each message a batch holds counts once)."""
    to_workers = sum(bs.message_count for bs in cluster.scheduler.stream_comms.values())
    from_workers = sum(client.run(lambda dask_worker: dask_worker.batched_stream.message_count)
                       .values())
    return to_workers + from_workers


def one_run(protocol: str, burst: int, scale: float) -> dict:
    from distributed import Client, LocalCluster

    with LocalCluster(protocol=protocol, n_workers=2, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        client.gather(client.map(dask_workload.inc, range(200), pure=False))  # warm up
        t = time.perf_counter()
        result = dask_workload.run(client, scale)
        workload_s = time.perf_counter() - t
        before = _messages(cluster, client)
        t = time.perf_counter()
        total = sum(client.gather(client.map(dask_workload.inc, range(burst), pure=False)))
        burst_s = time.perf_counter() - t
        sent = _messages(cluster, client) - before
        assert total == burst * (burst + 1) // 2, total
    return {"workload_s": workload_s, "burst_s": burst_s, "tasks_per_s": burst / burst_s,
            "messages_per_s": sent / burst_s, "messages": sent, "result": result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--burst", type=int, default=100_000)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="the workload's size (meson test's smoke run: 0.01)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {p: [] for p in PROTOCOLS}
    for i in range(args.runs):
        for p in PROTOCOLS:
            r = one_run(p, args.burst, args.scale)
            runs[p].append(r)
            print(f"run {i + 1} {p:8} workload {r['workload_s']:.2f} s, burst "
                  f"{r['burst_s']:.2f} s ({r['tasks_per_s']:.0f} tasks/s, "
                  f"{r['messages_per_s']:.0f} messages/s, {r['messages']} messages)",
                  flush=True)
    first = runs[PROTOCOLS[0]][0]["result"]
    for p in PROTOCOLS:
        for r in runs[p]:
            assert r["result"] == first, f"{p} computed another result"
    out = {}
    for key in ("workload_s", "burst_s", "tasks_per_s", "messages_per_s"):
        med = {p: statistics.median(r[key] for r in runs[p]) for p in PROTOCOLS}
        out[key] = {**med, "ratio": med["ordo://"] / med["tcp://"]}
        print(f"{key:15} tcp:// {med['tcp://']:.2f}  ordo:// {med['ordo://']:.2f}  "
              f"ordo/tcp {out[key]['ratio']:.2f}x")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
