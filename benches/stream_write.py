"""Writes of inputs far larger than memory, streamed: peak resident memory against the bytes
written. The input is generated batch by batch (nothing holds it), as a job reading a large
source hands it over; pyarrow writing the same stream to a plain Parquet dataset is the floor.

    python benches/stream_write.py --gigabytes 50      # bulk_insert, GB of Arrow input
    python benches/stream_write.py --gigabytes 5 --virtual-keys
    python benches/stream_write.py --op insert --gigabytes 5
    python benches/stream_write.py --op upsert --gigabytes 2 --table-gigabytes 5

`--op upsert` first bulk-inserts a table of `--table-gigabytes` (not measured), then upserts a
stream whose rows are half updates of random keys of the table (duplicates among them) and half
new keys.

Each run is its own process; peak memory is its `VmHWM`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CITIES = ["san_francisco", "new_york", "chicago", "sao_paulo", "chennai", "amsterdam"]
ROWS_PER_BATCH = 100_000


def stream(gigabytes: float, existing_rows: int = 0) -> Any:
    """Batches of trips until `gigabytes` of Arrow data were made; with `existing_rows`, half the
    rows update random keys below it and half are new keys above it."""
    import numpy as np
    import pyarrow as pa

    schema = pa.schema(
        [
            ("trip_id", pa.int64()),
            ("ts", pa.int64()),
            ("rider", pa.string()),
            ("fare", pa.float64()),
            ("city", pa.string()),
        ]
    )
    riders = np.array([f"rider-{i:06d}" for i in range(50_000)])

    def gen():  # type: ignore[no-untyped-def]
        rng = np.random.default_rng(7)
        made, lo = 0, existing_rows
        while made < gigabytes * 1e9:
            n = ROWS_PER_BATCH
            ids = np.arange(lo, lo + n)
            if existing_rows:
                ids = np.where(rng.random(n) < 0.5, rng.integers(0, existing_rows, n), ids)
            batch = pa.record_batch(
                [
                    pa.array(ids, pa.int64()),
                    pa.array(rng.integers(1_700_000_000_000, 1_700_100_000_000, n), pa.int64()),
                    pa.array(riders[rng.integers(0, len(riders), n)]),
                    pa.array(np.round(rng.uniform(3, 120, n), 2)),
                    pa.array(np.array(CITIES)[ids % len(CITIES)]),
                ],
                schema=schema,
            )
            made += batch.nbytes
            lo += n
            yield batch

    return pa.RecordBatchReader.from_batches(schema, gen())


def peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def create(path: Path, schema: Any, virtual_keys: bool = False) -> Any:
    import oxlake

    return oxlake.create_table(
        str(path),
        schema,
        record_key="trip_id",
        partition_by=["city"],
        ordering_field="ts",
        meta_fields=not virtual_keys,
    )


def run_one(task: str, work: Path, gigabytes: float, chunk: int | None, table_gb: float) -> dict[str, Any]:
    start = time.perf_counter()
    counts = {}
    if task == "pyarrow":
        import pyarrow.dataset as ds

        ds.write_dataset(
            stream(gigabytes),
            work / "pyarrow",
            format="parquet",
            partitioning=["city"],
            partitioning_flavor="hive",
            existing_data_behavior="delete_matching",
        )
        rows = sum(f.count_rows() for f in [ds.dataset(work / "pyarrow", format="parquet")])
    elif task == "prepare":
        source = stream(table_gb)
        rows = create(work / "oxlake", source.schema).bulk_insert(source, chunk_bytes=chunk).num_inserts
        (work / "rows").write_text(str(rows))
    elif task == "oxlake_upsert":
        import oxlake

        existing = int((work / "rows").read_text())
        result = oxlake.Table(str(work / "oxlake")).upsert(stream(gigabytes, existing), chunk_bytes=chunk)
        rows = result.num_inserts + result.num_updates
        counts = {"inserts": result.num_inserts, "updates": result.num_updates}
    else:
        source = stream(gigabytes)
        t = create(work / "oxlake", source.schema, task == "oxlake_virtual_keys")
        write = t.insert if task == "oxlake_insert" else t.bulk_insert
        rows = write(source, chunk_bytes=chunk).num_inserts
    seconds = time.perf_counter() - start
    written = sum(p.stat().st_size for p in work.rglob("*.parquet"))
    return {
        "task": task,
        "rows": rows,
        "seconds": seconds,
        "peak_bytes": peak_bytes(),
        "written": written,
        **counts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gigabytes", type=float, default=5.0)
    parser.add_argument("--op", choices=["bulk_insert", "insert", "upsert"], default="bulk_insert")
    parser.add_argument("--table-gigabytes", type=float, default=5.0, help="--op upsert: the table's size")
    parser.add_argument("--virtual-keys", action="store_true", help="also a table without meta fields")
    parser.add_argument(
        "--chunk-mb", type=int, default=None, help="bulk_insert's chunk_bytes (default: oxlake's)"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        chunk = args.chunk_mb << 20 if args.chunk_mb else None
        print(json.dumps(run_one(args.one, Path(args.work), args.gigabytes, chunk, args.table_gigabytes)))
        return 0
    tasks = {
        "bulk_insert": ["pyarrow", "oxlake"] + (["oxlake_virtual_keys"] if args.virtual_keys else []),
        "insert": ["pyarrow", "oxlake_insert"],
        "upsert": ["oxlake_upsert"],
    }[args.op]
    print(f"{args.op}: {args.gigabytes:g} GB of Arrow input, generated as it is written")
    if args.op == "upsert":
        print(f"into a table bulk-inserted from {args.table_gigabytes:g} GB")
    print()
    print("| writer | rows | seconds | peak resident MB | Parquet written (GB) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for task in tasks:
        work = Path(tempfile.mkdtemp(prefix="oxlake-stream-bench-"))

        def one(task: str, work: Path = work) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, __file__, "--one", task, "--work", str(work)]
            command += ["--gigabytes", str(args.gigabytes), "--table-gigabytes", str(args.table_gigabytes)]
            if args.chunk_mb:
                command += ["--chunk-mb", str(args.chunk_mb)]
            return subprocess.run(command, capture_output=True, text=True)

        try:
            if task == "oxlake_upsert":
                prepared = one("prepare")
                if prepared.returncode != 0:
                    print(f"prepare: failed\n{prepared.stderr[-2000:]}", file=sys.stderr)
                    continue
            out = one(task)
            if out.returncode != 0:
                print(f"{task}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            split = f" ({r['updates']:,} updates, {r['inserts']:,} inserts)" if "updates" in r else ""
            print(
                f"| {task} | {r['rows']:,}{split} | {r['seconds']:.1f} | {r['peak_bytes'] / 1e6:,.0f} | "
                f"{r['written'] / 1e9:.2f} |"
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
