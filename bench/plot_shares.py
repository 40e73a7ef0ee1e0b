#!/usr/bin/python3
"""Plots `ordo-overload-bench --tenants --json` lines: what tenant B (a tenth of capacity) keeps
beside tenant A (twice capacity), with the limit shared among callers and not, per limit.

usage: plot_shares.py RESULTS.jsonl OUT.png LABEL   (LABEL: the date and commit measured)
"""
import json
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, out, label = sys.argv[1], sys.argv[2], sys.argv[3]
    runs = {}
    for line in open(src):
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        key = (j["limit"], j["queue"])
        runs.setdefault(key, []).append(j)
    keys = sorted(runs, key=lambda k: (k[0] != "adaptive", k[0], k[1] == 0))
    names = ["limit %s\n%s" % (k[0], "shared (queue %d)" % k[1] if k[1] else "not shared")
             for k in keys]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for i, k in enumerate(keys):
        good = [100 * r["b_goodput_ratio"] for r in runs[k]]
        p99 = [r["b_p99_ratio"] for r in runs[k]]
        ax1.bar(i, sum(good) / len(good), color="tab:blue" if k[1] else "tab:gray")
        ax1.plot([i] * len(good), good, "k.")
        ax2.bar(i, sum(p99) / len(p99), color="tab:blue" if k[1] else "tab:gray")
        ax2.plot([i] * len(p99), p99, "k.")
    ax1.axhline(95, color="tab:red", linestyle="--", linewidth=1)
    ax1.set_ylabel("B's goodput beside A, % of B alone")
    ax2.axhline(2, color="tab:red", linestyle="--", linewidth=1)
    ax2.set_ylabel("B's p99 beside A / B's p99 alone")
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(names, fontsize=8)
    fig.suptitle("ordo-overload-bench --tenants: A at 2x capacity, B at 10%% (dots: runs; "
                 "dashed: issue 69's bars); %s" % label, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
