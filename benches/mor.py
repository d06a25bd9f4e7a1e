"""Merge-on-read side by side: a 10,000,000-row table with 1,000,000 updated rows in its log files.

    python benches/mor.py --rows 10000000 --updates 1000000      # or: make bench-mor

Two layouts of the same updates: one deltacommit of all of them (`one`), and 100 small
deltacommits (`many`). Measured, each in its own process (peak memory is its own):

- the snapshot read of the merge-on-read table (every row, every column, streamed) against pyarrow
  reading the table's base files alone (the physical floor: the same rows without the merge);
- hudi-rs reading the same tables;
- the upsert itself against deltalake's merge of the same rows into the same 10,000,000-row table;
- a lookup: the rows of 2 updated keys, read with a filter on the record key field from the
  `many` layout (its logs hold 100 deltacommits), against pyarrow filtering the base files alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from compare import best_runs, generate, peak_bytes  # noqa: E402

BATCHES = 100


def updates(work: Path, rows: int, count: int) -> None:
    """`count` distinct keys spread over the whole table, with new fares and later timestamps."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rng = np.random.default_rng(11)
    keys = np.sort(rng.choice(rows, size=count, replace=False))
    base = pq.read_table(work / "input.parquet")
    picked = base.take(keys)
    picked = picked.set_column(picked.schema.get_field_index("fare"), "fare", pc.add(picked["fare"], 1.0))
    picked = picked.set_column(picked.schema.get_field_index("ts"), "ts", pc.add(picked["ts"], 1))
    pq.write_table(picked.take(rng.permutation(count)), work / "updates.parquet")


def setup(work: Path, rows: int, count: int) -> None:
    import oxlake
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    generate(rows, work / "input.parquet")
    updates(work, rows, count)
    data = pq.read_table(work / "input.parquet")
    t = oxlake.create_table(
        str(work / "base"),
        data.schema,
        record_key="trip_id",
        partition_by=["city"],
        ordering_field="ts",
        table_type="merge_on_read",
    )
    t.insert(data)
    write_deltalake(str(work / "delta_base"), data, partition_by=["city"])
    # The many-small-commits layout, built once (it is read, not timed as a write).
    shutil.copytree(work / "base", work / "many")
    many = oxlake.Table(str(work / "many"))
    up = pq.read_table(work / "updates.parquet")
    step = -(-up.num_rows // BATCHES)
    for lo in range(0, up.num_rows, step):
        many.upsert(up.slice(lo, step))


def run_one(task: str, work: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    rows = 0
    if task == "upsert_oxlake":
        import oxlake

        shutil.rmtree(work / "one", ignore_errors=True)
        shutil.copytree(work / "base", work / "one")
        up = pq.read_table(work / "updates.parquet")
        t = oxlake.Table(str(work / "one"))
        start = time.perf_counter()
        rows = t.upsert(up).num_updates
    elif task == "merge_deltalake":
        from deltalake import DeltaTable

        shutil.rmtree(work / "delta", ignore_errors=True)
        shutil.copytree(work / "delta_base", work / "delta")
        up = pq.read_table(work / "updates.parquet")
        start = time.perf_counter()
        metrics = (
            DeltaTable(str(work / "delta"))
            .merge(source=up, predicate="t.trip_id = s.trip_id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        rows = metrics["num_target_rows_updated"]
    elif task.startswith("read_pyarrow_base"):
        import pyarrow.dataset as ds

        files = [str(p) for p in (work / "base").rglob("*.parquet")]
        start = time.perf_counter()
        rows = sum(b.num_rows for b in ds.dataset(files, format="parquet").to_batches())
    elif task.startswith("read_oxlake"):
        import oxlake

        layout = task.rsplit("_", 1)[1]
        start = time.perf_counter()
        rows = sum(b.num_rows for b in oxlake.Table(str(work / layout)).scan())
    elif task.startswith("lookup"):
        # Two keys the logs update, each in one file group.
        keys = pq.read_table(work / "updates.parquet", columns=["trip_id"])["trip_id"].to_pylist()[:2]
        if task == "lookup_pyarrow_base":
            import pyarrow.compute as pc
            import pyarrow.dataset as ds

            files = [str(p) for p in (work / "base").rglob("*.parquet")]
            start = time.perf_counter()
            rows = (
                ds.dataset(files, format="parquet").to_table(filter=pc.field("trip_id").isin(keys)).num_rows
            )
        else:
            import oxlake

            layout = task.rsplit("_", 1)[1]
            start = time.perf_counter()
            rows = oxlake.Table(str(work / layout)).to_arrow(filter=[("trip_id", "in", keys)]).num_rows
        if rows != len(keys):
            raise SystemExit(f"{task}: {rows} rows for {len(keys)} keys")
    elif task.startswith("read_hudi_rs"):
        from hudi import HudiReadOptions, HudiTableBuilder

        layout = task.rsplit("_", 1)[1]
        start = time.perf_counter()
        table = HudiTableBuilder.from_base_uri(str(work / layout)).build()
        rows = sum(b.num_rows for b in table.read_stream(HudiReadOptions()))
    else:
        raise SystemExit(f"unknown task {task}")
    seconds = time.perf_counter() - start
    return {"task": task, "rows": rows, "seconds": seconds, "peak_bytes": peak_bytes()}


# `upsert_oxlake` leaves the `one` table that the reads after it use.
TASKS = [
    "upsert_oxlake",
    "merge_deltalake",
    "read_pyarrow_base",
    "read_oxlake_one",
    "read_hudi_rs_one",
    "read_oxlake_many",
    "read_hudi_rs_many",
    "lookup_pyarrow_base",
    "lookup_oxlake_many",
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="runs per task; the best is reported")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.work))))
        return 0

    work = Path(tempfile.mkdtemp(prefix="oxlake-bench-mor-"))
    try:
        began = time.perf_counter()
        setup(work, args.rows, args.updates)
        print(f"setup: {time.perf_counter() - began:.0f}s", file=sys.stderr)
        results = best_runs(__file__, TASKS, work, args.repeat)
        print(f"{args.rows:,} rows, {args.updates:,} updates, best of {args.repeat}\n")
        print(f"{'task':<22}{'rows':>12}{'seconds':>10}{'peak MB':>10}{'ratio':>10}  against")
        for task, r in results.items():
            floor_name = {
                "upsert": "merge_deltalake",
                "merge": "merge_deltalake",
                "lookup": "lookup_pyarrow_base",
            }.get(task.split("_", 1)[0], "read_pyarrow_base")
            floor = results.get(floor_name)
            ratio = f"{r['seconds'] / floor['seconds']:.2f}x" if floor else "-"
            peak = r["peak_bytes"] / 1e6
            print(f"{task:<22}{r['rows']:>12,}{r['seconds']:>10.2f}{peak:>10.0f}{ratio:>10}  {floor_name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
