"""What the metadata table a new table gets by default (the `files` index) adds to writes.

    python benches/default_metadata.py --small-rows 10 --large-rows 10000000 --repeat 3

Two tables of the same rows, one created as `create_table` does by default (`metadata=True`: the
`files` index in one shard, kept in step by every write) and one with `metadata=False`. Each
timing is the best of `--repeat` on a new table:
- a large write: `insert` of `--large-rows` rows into an empty table (`--partitions` partitions);
- small writes: `--small-writes` upserts of `--small-rows` rows each into a table of
  `--partitions` partitions holding one file each, timed together (per write in the report);
- planning on a newly opened table (`Table.splits()`): the files index against a listing.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--large-rows", type=int, default=10_000_000)
    parser.add_argument("--small-rows", type=int, default=10)
    parser.add_argument("--small-writes", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = {}
    for metadata in (False, True):
        rows[metadata] = bench(args, metadata)
    print("| write | metadata=False (s) | metadata=True (s) | added |")
    print("| --- | ---: | ---: | ---: |")
    for what in rows[False]:
        off, on = rows[False][what], rows[True][what]
        print(f"| {what} | {off:.3f} | {on:.3f} | {on / off - 1:+.1%} |")
    return 0


def data(n: int, partitions: int, start: int = 0):  # noqa: ANN201
    import numpy as np
    import pyarrow as pa

    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "part": pa.array((ids % partitions).astype(np.int32)),
            "ts": np.full(n, 1, dtype=np.int64),
            "value": ids.astype(np.float64) * 0.5,
            "name": pa.array(np.char.mod("n%d", ids)),
        }
    )


def bench(args: argparse.Namespace, metadata: bool) -> dict[str, float]:
    import oxlake

    large = data(args.large_rows, args.partitions)
    seed = data(args.partitions * 10, args.partitions)
    small = [
        data(args.small_rows, args.partitions, start=i * args.small_rows) for i in range(args.small_writes)
    ]
    best: dict[str, float] = {}

    def keep(what: str, seconds: float) -> None:
        best[what] = min(best.get(what, float("inf")), seconds)

    for _ in range(args.repeat):
        work = Path(tempfile.mkdtemp(prefix="oxlake-default-mdt-"))
        try:
            kw = dict(record_key="id", partition_by=["part"], ordering_field="ts", metadata=metadata)
            t = oxlake.create_table(str(work / "large"), large.schema, **kw)
            start = time.perf_counter()
            t.insert(large)
            keep(f"insert of {args.large_rows:,} rows", time.perf_counter() - start)
            t = oxlake.create_table(str(work / "small"), seed.schema, **kw)
            t.insert(seed)
            start = time.perf_counter()
            for batch in small:
                t.upsert(batch)
            keep(
                f"upsert of {args.small_rows} rows (each of {args.small_writes})",
                (time.perf_counter() - start) / len(small),
            )
            start = time.perf_counter()
            oxlake.Table(str(work / "small")).splits()
            keep(f"planning {args.partitions} partitions, newly opened", time.perf_counter() - start)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return best


if __name__ == "__main__":
    raise SystemExit(main())
