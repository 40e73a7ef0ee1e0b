"""The Dask workload that tests/python/test_dask.py checks over ordo:// against tcp:// and that
bench_dask.py times: small tasks, a shuffle of a few MB, a graph with dependencies. Each part
returns plain Python values, so that two runs can be compared with ==."""
from __future__ import annotations

import operator


def inc(x: int) -> int:
    return x + 1


def small_tasks(client, n: int = 10_000) -> int:
    """n tasks of one call each, gathered and summed."""
    futures = client.map(inc, range(n), pure=False)
    return sum(client.gather(futures))


def shuffle(client, rows: int = 200_000, partitions: int = 8) -> list:
    """A shuffle of about rows x 24 bytes (4.8 MB at the default): a dataframe set on a column
    whose values are spread over every partition, then summed per key."""
    import dask.dataframe as dd
    import pandas as pd

    pdf = pd.DataFrame({"key": [(i * 7919) % 1000 for i in range(rows)],
                        "value": range(rows), "other": [float(i) / 3 for i in range(rows)]})
    ddf = dd.from_pandas(pdf, npartitions=partitions)
    shuffled = ddf.shuffle("key", shuffle="tasks")
    sums = shuffled.groupby("key")["value"].sum().compute(scheduler=client.get)
    return sorted(sums.items())


def tree(client, leaves: int = 512) -> int:
    """A binary reduction tree over `leaves` delayed values: every level depends on the one
    below."""
    import dask

    level = [dask.delayed(inc)(i) for i in range(leaves)]
    while len(level) > 1:
        level = [dask.delayed(operator.add)(level[i], level[i + 1])
                 for i in range(0, len(level), 2)]
    return level[0].compute(scheduler=client.get)


def run(client, scale: float = 1.0) -> dict:
    """The three parts; `scale` < 1 shrinks them (the smoke test's 0.01: 100 tasks, 2,000 rows,
    a tree of 8 leaves)."""
    leaves = 8
    while leaves * 2 <= 512 * scale:
        leaves *= 2
    return {"small_tasks": small_tasks(client, max(1, int(10_000 * scale))),
            "shuffle": shuffle(client, max(100, int(200_000 * scale))),
            "tree": tree(client, leaves)}
