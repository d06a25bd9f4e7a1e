"""Side-by-side: oxlake against pyarrow (plain Parquet, the floor), deltalake and hudi-rs.

Each measurement runs in its own process, so its peak memory (max RSS) is its own.

    python benches/compare.py --rows 10000000          # or: make bench
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CITIES = ["san_francisco", "new_york", "chicago", "sao_paulo", "chennai", "amsterdam"]


def generate(rows: int, path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    writer = None
    step = 1_000_000
    for lo in range(0, rows, step):
        n = min(step, rows - lo)
        t = pa.table(
            {
                "trip_id": pa.array(np.arange(lo, lo + n), pa.int64()),
                "ts": pa.array(rng.integers(1_700_000_000_000, 1_700_100_000_000, n), pa.int64()),
                "rider": pa.array([f"rider-{x}" for x in rng.integers(0, 50_000, n)]),
                "fare": pa.array(np.round(rng.uniform(3, 120, n), 2)),
                "distance_km": pa.array(np.round(rng.exponential(6, n), 3)),
                "city": pa.array(np.array(CITIES)[rng.integers(0, len(CITIES), n)]),
            }
        )
        writer = writer or pq.ParquetWriter(path, t.schema)
        writer.write_table(t)
    if writer:
        writer.close()


def run_one(task: str, work: Path) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    data = pq.read_table(work / "input.parquet") if task.startswith("write") else None
    start = time.perf_counter()
    rows = 0
    if task == "write_pyarrow":
        ds.write_dataset(
            data,
            work / "pyarrow",
            format="parquet",
            partitioning=["city"],
            partitioning_flavor="hive",
            existing_data_behavior="delete_matching",
        )
        rows = data.num_rows
    elif task == "write_oxlake":
        import oxlake

        t = oxlake.create_table(
            str(work / "oxlake"),
            data.schema,
            record_key="trip_id",
            partition_by=["city"],
            ordering_field="ts",
        )
        rows = t.insert(data).num_inserts
    elif task == "write_deltalake":
        from deltalake import write_deltalake

        write_deltalake(str(work / "delta"), data, partition_by=["city"])
        rows = data.num_rows
    elif task == "read_pyarrow":
        # The same Parquet files oxlake wrote, read as a plain dataset: the physical floor.
        files = [str(p) for p in (work / "oxlake").rglob("*.parquet")]
        rows = ds.dataset(files, format="parquet").to_table().num_rows
    elif task == "read_oxlake":
        import oxlake

        rows = sum(b.num_rows for b in oxlake.Table(str(work / "oxlake")).scan())
    elif task == "read_hudi_rs":
        from hudi import HudiReadOptions, HudiTableBuilder

        batches = HudiTableBuilder.from_base_uri(str(work / "oxlake")).build().read(HudiReadOptions())
        rows = sum(b.num_rows for b in batches)
    elif task == "read_deltalake":
        from deltalake import DeltaTable

        rows = DeltaTable(str(work / "delta")).to_pyarrow_table().num_rows
    else:
        raise SystemExit(f"unknown task {task}")
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _ = pa
    return {"task": task, "rows": rows, "seconds": seconds, "peak_bytes": peak}


OUTPUT = {"write_pyarrow": "pyarrow", "write_oxlake": "oxlake", "write_deltalake": "delta"}
TASKS = [
    "write_pyarrow",
    "write_oxlake",
    "write_deltalake",
    "read_pyarrow",
    "read_oxlake",
    "read_hudi_rs",
    "read_deltalake",
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=3, help="runs per task; the best is reported")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.work))))
        return 0

    work = Path(tempfile.mkdtemp(prefix="oxlake-bench-"))
    try:
        generate(args.rows, work / "input.parquet")
        results: dict[str, dict[str, Any]] = {}
        for task in TASKS:
            best = None
            for _ in range(args.repeat):
                if task in OUTPUT:
                    shutil.rmtree(work / OUTPUT[task], ignore_errors=True)
                out = subprocess.run(
                    [sys.executable, __file__, "--one", task, "--work", str(work)],
                    capture_output=True,
                    text=True,
                )
                if out.returncode != 0:
                    print(f"{task}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                    break
                r = json.loads(out.stdout.strip().splitlines()[-1])
                if best is None or r["seconds"] < best["seconds"]:
                    best = r
            if best:
                results[task] = best
        print(f"{args.rows:,} rows, best of {args.repeat}\n")
        print(f"{'task':<18}{'rows/s':>14}{'seconds':>10}{'peak MB':>10}{'vs pyarrow':>12}")
        for task, r in results.items():
            floor = results.get("write_pyarrow" if task.startswith("write") else "read_pyarrow")
            ratio = f"{r['seconds'] / floor['seconds']:.2f}x" if floor else "-"
            rate = r["rows"] / r["seconds"]
            print(f"{task:<18}{rate:>14,.0f}{r['seconds']:>10.2f}{r['peak_bytes'] / 1e6:>10.0f}{ratio:>12}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
