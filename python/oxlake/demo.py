"""The main job (`make demo`): a trips pipeline on local disk.

Generates a trips-like dataset, creates a copy-on-write table, inserts it, upserts a tenth of the
rows, deletes some, reads back with filters, and prints what happened.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

import oxlake
from oxlake._engine import require

CITIES = ["san_francisco", "new_york", "chicago", "sao_paulo", "chennai", "amsterdam"]
T = TypeVar("T")


def progress(items: list[T], label: str) -> Iterator[T]:
    """A one-line progress bar on stderr."""
    n = len(items)
    start = time.perf_counter()
    for i, item in enumerate(items, 1):
        yield item
        done = int(30 * i / n)
        sys.stderr.write(
            f"\r  {label:<22}[{'#' * done}{'.' * (30 - done)}] {i}/{n} {time.perf_counter() - start:5.1f}s"
        )
        sys.stderr.flush()
    sys.stderr.write("\n")


def timed(label: str, fn: Callable[[], T]) -> T:
    start = time.perf_counter()
    out = fn()
    print(f"  {label:<40} {time.perf_counter() - start:7.2f}s")
    return out


def trips(rows: int, seed: int, start_id: int = 0, chunks: int = 10) -> pa.Table:
    import numpy as np

    rng = np.random.default_rng(seed)
    parts = []
    per = -(-rows // chunks)
    for c in progress(list(range(chunks)), "generating trips"):
        lo, hi = start_id + c * per, start_id + min(rows, (c + 1) * per)
        n = hi - lo
        if n <= 0:
            continue
        parts.append(
            pa.table(
                {
                    "trip_id": pa.array(np.arange(lo, hi), pa.int64()),
                    "ts": pa.array(rng.integers(1_700_000_000_000, 1_700_100_000_000, n), pa.int64()),
                    "rider": pa.array([f"rider-{x}" for x in rng.integers(0, 50_000, n)]),
                    "driver": pa.array([f"driver-{x}" for x in rng.integers(0, 5_000, n)]),
                    "fare": pa.array(np.round(rng.uniform(3, 120, n), 2)),
                    "distance_km": pa.array(np.round(rng.exponential(6, n), 3)),
                    "city": pa.array(np.array(CITIES)[rng.integers(0, len(CITIES), n)]),
                }
            )
        )
    return pa.concat_tables(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--path", default="demo-data/trips")
    args = parser.parse_args()
    require("numpy", needed_by="the demo")  # its data generator and its sample printout
    require("pandas", needed_by="the demo")
    import numpy as np

    path = Path(args.path).resolve()
    shutil.rmtree(path, ignore_errors=True)
    print(f"oxlake {oxlake.__version__} demo: {args.rows:,} trips into {path}")

    data = trips(args.rows, seed=7)
    table = oxlake.create_table(
        str(path), data.schema, record_key="trip_id", partition_by=["city"], ordering_field="ts", name="trips"
    )

    print("\nwrites")
    r = timed(f"insert {data.num_rows:,} rows", lambda: table.insert(data))
    print(f"    -> instant {r.instant}: {r.num_inserts:,} inserts, {len(r.files)} files")

    rng = np.random.default_rng(11)
    picked = np.sort(rng.choice(args.rows, args.rows // 10, replace=False))
    changes = data.take(pa.array(picked))
    changes = changes.set_column(
        changes.schema.get_field_index("fare"), "fare", pc.multiply(changes["fare"], pa.scalar(1.1))
    )
    changes = changes.set_column(
        changes.schema.get_field_index("ts"), "ts", pc.add(changes["ts"], pa.scalar(1))
    )
    r = timed(f"upsert {changes.num_rows:,} rows (10%)", lambda: table.upsert(changes))
    print(f"    -> instant {r.instant}: {r.num_updates:,} updates, {r.num_inserts:,} inserts")
    print(f"       {len(r.files)} files rewritten")

    doomed = data.filter(pc.equal(pc.bit_wise_and(data["trip_id"], pa.scalar(1023)), pa.scalar(0)))
    r = timed(f"delete {doomed.num_rows:,} rows", lambda: table.delete(doomed.select(["trip_id", "city"])))
    print(f"    -> instant {r.instant}: {r.num_deletes:,} deletes")

    print("\nreads")
    full = table.scan(columns=["trip_id", "fare", "city"])
    rows = 0
    for batch in full:
        rows += batch.num_rows
    print(f"  snapshot rows                            {rows:,} (expected {args.rows - doomed.num_rows:,})")
    sf = timed(
        "filter city = 'san_francisco' AND fare > 100",
        lambda: table.to_arrow(
            filter="city = 'san_francisco' AND fare > 100", columns=["trip_id", "fare", "ts"]
        ),
    )
    print(f"    -> {sf.num_rows:,} rows")
    first_instant = table.timeline()[0]
    first = first_instant.time
    # Windows of incremental reads are completion times on version 8 and 9 tables.
    checkpoint = first_instant.completion or first
    old = timed("time travel to the first commit", lambda: table.to_arrow(as_of=first, columns=["trip_id"]))
    print(f"    -> {old.num_rows:,} rows as of {first}")
    inc = timed(
        "incremental after the first commit", lambda: table.to_arrow(query="incremental", start=checkpoint)
    )
    print(f"    -> {inc.num_rows:,} rows changed since {first}")

    print("\ntimeline")
    for i in table.timeline():
        print(f"  {i.time}  {i.action:<14} {i.state}")
    groups = table.file_groups()
    print(f"\nfiles: {len(groups)} file groups, {sum(g.size for g in groups) / 1e6:.1f} MB")
    print("\nsample (san_francisco, fare > 100):")
    print(sf.slice(0, 5).to_pandas().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
