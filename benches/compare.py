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
from collections.abc import Callable
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


def meta_columns(data: Any) -> Any:
    """`data` with the five Hudi meta fields in front, as oxlake's base files hold them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = data.num_rows
    instant = "20260101000000000"
    file_name = f"00000000-0000-0000-0000-000000000000-0_0-0-1_{instant}.parquet"
    meta = {
        "_hoodie_commit_time": pa.array([instant] * n),
        "_hoodie_commit_seqno": pa.array([f"{instant}_0_{i}" for i in range(n)]),
        "_hoodie_record_key": pc.cast(data["trip_id"], pa.string()),
        "_hoodie_partition_path": pc.binary_join_element_wise("city=", data["city"], ""),
        "_hoodie_file_name": pa.array([file_name] * n),
    }
    return pa.table({**meta, **{c: data[c] for c in data.column_names}})


def run_one(task: str, work: Path) -> dict[str, Any]:
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    data = pq.read_table(work / "input.parquet") if task.startswith("write") else None
    if task == "write_pyarrow_same_columns":
        # The floor for files of this shape: pyarrow writing exactly the columns of oxlake's base
        # files (data and meta fields, built before the clock starts).
        data = meta_columns(data)
    hive = {"format": "parquet", "partitioning": ["city"], "partitioning_flavor": "hive"}
    start, used = time.perf_counter(), cpu_seconds()
    rows = 0
    if task in ("write_pyarrow", "write_pyarrow_same_columns"):
        ds.write_dataset(data, work / OUTPUT[task], existing_data_behavior="delete_matching", **hive)
        rows = data.num_rows
    elif task.startswith("write_oxlake"):
        import oxlake

        t = oxlake.create_table(
            str(work / OUTPUT[task]),
            data.schema,
            record_key="trip_id",
            partition_by=["city"],
            ordering_field="ts",
            # Without meta fields (Apache Hudi's virtual keys): the meta columns are written null.
            meta_fields="virtual_keys" not in task,
        )
        # `bulk_insert` combines no duplicate keys and looks none up (Apache Hudi's load).
        write = t.bulk_insert if task.endswith("bulk_insert") else t.insert
        rows = write(data).num_inserts
    elif task == "write_deltalake":
        from deltalake import write_deltalake

        write_deltalake(str(work / "delta"), data, partition_by=["city"])
        rows = data.num_rows
    elif task == "read_pyarrow":
        # The same Parquet files oxlake wrote, streamed as a plain dataset: the physical floor.
        files = [str(p) for p in (work / "oxlake").rglob("*.parquet")]
        rows = sum(b.num_rows for b in ds.dataset(files, format="parquet").to_batches())
    elif task == "read_oxlake":
        import oxlake

        rows = sum(b.num_rows for b in oxlake.Table(str(work / "oxlake")).scan())
    elif task == "read_oxlake_data_columns":
        # Only the data columns, as deltalake's files hold them (no Hudi meta fields).
        import oxlake

        t = oxlake.Table(str(work / "oxlake"))
        columns = [f.name for f in t.schema if not f.name.startswith("_hoodie_")]
        rows = sum(b.num_rows for b in t.scan(columns=columns))
    elif task == "read_hudi_rs":
        from hudi import HudiReadOptions, HudiTableBuilder

        table = HudiTableBuilder.from_base_uri(str(work / "oxlake")).build()
        rows = sum(b.num_rows for b in table.read_stream(HudiReadOptions()))
    elif task == "read_deltalake":
        from deltalake import DeltaTable

        rows = sum(b.num_rows for b in DeltaTable(str(work / "delta")).to_pyarrow_dataset().to_batches())
    else:
        raise SystemExit(f"unknown task {task}")
    seconds, used = time.perf_counter() - start, cpu_seconds() - used
    return {"task": task, "rows": rows, "seconds": seconds, "cpu_seconds": used, "peak_bytes": peak_bytes()}


def cpu_seconds() -> float:
    """The CPU time (user and system, every thread) this process has taken: steadier than wall
    time on a shared machine, where another tenant's load stretches a run's seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_bytes() -> int:
    """This process's peak resident memory. `VmHWM` belongs to the address space, which `exec`
    replaces; `ru_maxrss` would carry over the parent's peak (Linux keeps it across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def best_runs(
    script: str,
    tasks: list[str],
    work: Path,
    repeat: int,
    before: dict[str, Callable[[], None]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Runs each task `repeat` times, each run in its own process (`script --one TASK --work DIR`,
    which prints one JSON result), `before[task]()` ahead of each run; keeps the fastest run."""
    results: dict[str, dict[str, Any]] = {}
    for task in tasks:
        best = None
        for _ in range(repeat):
            if before and task in before:
                before[task]()
            out = subprocess.run(
                [sys.executable, script, "--one", task, "--work", str(work)], capture_output=True, text=True
            )
            if out.returncode != 0:
                print(f"{task}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                break
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if best is None or r["seconds"] < best["seconds"]:
                best = r
        if best:
            results[task] = best
    return results


OUTPUT = {
    "write_pyarrow": "pyarrow",
    "write_pyarrow_same_columns": "pyarrow_meta",
    "write_oxlake": "oxlake",
    "write_oxlake_virtual_keys": "oxlake_virtual",
    "write_oxlake_bulk_insert": "oxlake_bulk",
    "write_oxlake_virtual_keys_bulk_insert": "oxlake_virtual_bulk",
    "write_deltalake": "delta",
}
TASKS = [
    "write_pyarrow",
    "write_pyarrow_same_columns",
    "write_oxlake",
    "write_oxlake_virtual_keys",
    "write_oxlake_bulk_insert",
    "write_oxlake_virtual_keys_bulk_insert",
    "write_deltalake",
    "read_pyarrow",
    "read_oxlake",
    "read_oxlake_data_columns",
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
        cleanup = {
            task: (lambda out=out: shutil.rmtree(work / out, ignore_errors=True))
            for task, out in OUTPUT.items()
        }
        results = best_runs(__file__, TASKS, work, args.repeat, cleanup)
        print(f"{args.rows:,} rows, best of {args.repeat}; ratios are seconds over the pyarrow floor\n")
        print(
            f"{'task':<40}{'rows/s':>14}{'seconds':>10}{'peak MB':>10}{'vs pyarrow':>12}{'vs same cols':>14}"
            f"{'vs deltalake':>14}"
        )
        for task, r in results.items():
            write = task.startswith("write")
            floor = results.get("write_pyarrow" if write else "read_pyarrow")
            same = results.get("write_pyarrow_same_columns") if write else None
            delta = results.get("write_deltalake" if write else "read_deltalake")
            ratio = f"{r['seconds'] / floor['seconds']:.2f}x" if floor else "-"
            ratio_same = f"{r['seconds'] / same['seconds']:.2f}x" if same else "-"
            ratio_delta = f"{r['seconds'] / delta['seconds']:.2f}x" if delta else "-"
            rate = r["rows"] / r["seconds"]
            peak = r["peak_bytes"] / 1e6
            print(
                f"{task:<40}{rate:>14,.0f}{r['seconds']:>10.2f}{peak:>10.0f}{ratio:>12}{ratio_same:>14}"
                f"{ratio_delta:>14}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
