#!/usr/bin/python3
"""Head-of-line blocking against the size of the big calls: ordered, pooled and lanes.

    bench/hol_lanes.py [--repeats 3] [--sizes 1024,65536,...] [--publish]

For each big-call size (1 KiB to 64 MiB) and mode, runs `ordo-bench --workload hol`: two big
echo calls always in flight on one channel (--mode lanes: on its lane "bulk", with the default
lane_window, and lanes-64k with lane_window 65536; pooled: each on a connection of its own) and
16-byte echo calls one at a time beside them, over tcp on loopback.
Runs are interleaved over the repeats; the figures are the medians. Also times a 64 MiB echo
one at a time on an ordered channel, on lanes, and on bench's raw TCP baseline (a plain socket
echo of the same bytes).

Writes bench/results/hol_lanes-DATE.jsonl and, with --publish, bench/plots/hol_lanes.png and
bench/plots/hol_lanes.md (the table), each labelled with the date and the commit.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH = os.path.join(ROOT, "build", "bench", "ordo-bench")
MODES = ["ordered", "pooled", "lanes", "lanes-64k"]
# ordo-bench's flags for each mode: lanes-64k is lanes with lane_window at its smallest.
MODE_FLAGS = {"ordered": ["--mode", "ordered"], "pooled": ["--mode", "pooled"],
              "lanes": ["--mode", "lanes"],
              "lanes-64k": ["--mode", "lanes", "--lane-window", "65536"]}
SIZES = [1024, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def small_calls(mode, size):
    """Small calls per run: a run takes a few seconds whatever the mode."""
    if mode.startswith("lanes") or size <= 64 << 10:
        return 400
    if mode == "pooled":
        return 200 if size <= 1 << 20 else 40 if size <= 16 << 20 else 15
    return 100 if size <= 1 << 20 else 20 if size <= 16 << 20 else 10


def run(flags):
    out = subprocess.run([BENCH, "--json"] + flags, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("ordo-bench %s failed: %s" % (" ".join(flags), out.stderr.strip()))
    return json.loads(out.stdout.strip().splitlines()[-1])


def commit():
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--publish", action="store_true")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    date = datetime.date.today().isoformat()
    rev = commit()
    runs = {}
    for r in range(a.repeats):
        for size in sizes:
            for mode in MODES:
                res = run(["--workload", "hol", "--transport", "tcp"] + MODE_FLAGS[mode] +
                          ["--size", str(size), "--count", str(small_calls(mode, size)),
                           "--big-inflight", "2"])
                runs.setdefault(("hol", mode, size), []).append(res)
                print("%-8s %9d: p50 %8.1f us  p99 %9.1f us  big %6.0f MB/s" %
                      (mode, size, res["p50_us"], res["p99_us"], res["big_mb_s"]), flush=True)
        for label, flags in [("ordered", ["--transport", "tcp"]),
                             ("raw-tcp", ["--transport", "raw-tcp"])]:
            res = run(["--workload", "seq", "--size", str(64 << 20), "--count", "8"] + flags)
            runs.setdefault(("echo64", label, 64 << 20), []).append(res)
            print("64 MiB echo %-8s: p50 %8.1f ms" % (label, res["p50_us"] / 1000), flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "hol_lanes-%s.jsonl" % date), "a") as f:
        for (kind, mode, size), rs in runs.items():
            for res in rs:
                f.write(json.dumps(dict(res, kind=kind, label=mode, date=date, commit=rev)) + "\n")

    def med(kind, mode, size, field):
        return statistics.median(r[field] for r in runs[(kind, mode, size)])

    lines = ["Small calls (16 B, one at a time) beside 2 big echo calls in flight, tcp loopback; "
             "medians of %d runs, %s, commit %s." % (a.repeats, date, rev), "",
             "| big calls | mode | small p50 | small p99 | big MB/s (each way) |",
             "| ---: | --- | ---: | ---: | ---: |"]
    for size in sizes:
        for mode in MODES:
            lines.append("| %s | %s | %.2f ms | %.2f ms | %.0f |" % (
                human(size), mode, med("hol", mode, size, "p50_us") / 1000,
                med("hol", mode, size, "p99_us") / 1000, med("hol", mode, size, "big_mb_s")))
    lines += ["", "A 64 MiB echo, one at a time: ordered %.1f ms, raw TCP %.1f ms (medians)." % (
        med("echo64", "ordered", 64 << 20, "p50_us") / 1000,
        med("echo64", "raw-tcp", 64 << 20, "p50_us") / 1000)]
    table = "\n".join(lines) + "\n"
    print(table)
    if not a.publish:
        return
    with open(os.path.join(HERE, "plots", "hol_lanes.md"), "w") as f:
        f.write(table)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode, style in zip(MODES, ["o-", "s--", "^-", "v:"]):
        ax.plot(sizes, [med("hol", mode, s, "p50_us") for s in sizes], style, label=mode + " p50")
        ax.plot(sizes, [med("hol", mode, s, "p99_us") for s in sizes], style, alpha=0.4,
                label=mode + " p99")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(s) for s in sizes])
    ax.set_xlabel("big call size (2 in flight)")
    ax.set_ylabel("small-call latency (us)")
    ax.set_title("Small calls beside big calls, tcp loopback\n%s, commit %s" % (date, rev),
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "plots", "hol_lanes.png"), dpi=110)


def human(n):
    for unit, k in [("MiB", 1 << 20), ("KiB", 1 << 10)]:
        if n >= k:
            return "%d %s" % (n // k, unit)
    return "%d B" % n


if __name__ == "__main__":
    main()
