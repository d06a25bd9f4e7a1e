"""PySpark side by side: a copy-on-write table read and written through oxlake on Spark
`local[2]`, against Spark's own Parquet reader and writer on the same data.

    python benches/spark.py --rows 10000000          # or: make bench-spark

Reads run every row of every column through Spark into the `noop` sink (nothing is collected):
`oxlake.spark.read` and the `oxlake` data source against `spark.read.parquet` of the table's own
base files (the same bytes, without the table). Writes take one DataFrame read from a Parquet
file and write it partitioned by `city`: `oxlake.spark.write` (insert, one commit) and the data
source against `df.write.partitionBy("city").parquet`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compare import generate  # noqa: E402


def best(repeat: int, run: Callable[[], object], reset: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if reset:
            reset()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args()

    import oxlake
    import oxlake.spark
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = args.work or Path(tempfile.mkdtemp(prefix="oxlake-spark-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    source = work / "input.parquet"
    if not source.exists():
        generate(args.rows, source)
    table_uri = str(work / "table")
    if not Path(table_uri).exists():
        data = pq.read_table(source)
        oxlake.create_table(table_uri, data.schema, record_key="trip_id", partition_by=["city"]).insert(data)
    base_files = sorted(str(p) for p in Path(table_uri).rglob("*.parquet"))

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("oxlake-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "6g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    oxlake.spark.register(spark)

    def sink(df: object) -> None:
        df.write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]

    results: list[tuple[str, float, str]] = []
    parquet_read = best(args.repeat, lambda: sink(spark.read.parquet(*base_files)))
    results.append(("read: spark.read.parquet (the table's base files)", parquet_read, "read"))
    mapped = best(args.repeat, lambda: sink(oxlake.spark.read(spark, table_uri)))
    results.append(("read: oxlake.spark.read", mapped, "read"))
    results.append(
        (
            'read: spark.read.format("oxlake")',
            best(args.repeat, lambda: sink(spark.read.format("oxlake").load(table_uri))),
            "read",
        )
    )

    frame = spark.read.parquet(str(source))
    out = work / "out"

    def fresh() -> None:
        shutil.rmtree(out, ignore_errors=True)

    parquet_write = best(
        args.repeat, lambda: frame.write.mode("overwrite").partitionBy("city").parquet(str(out)), fresh
    )
    results.append(('write: df.write.partitionBy("city").parquet', parquet_write, "write"))
    results.append(
        (
            "write: oxlake.spark.write (insert)",
            best(
                args.repeat,
                lambda: oxlake.spark.write(
                    frame, str(out), operation="insert", record_key="trip_id", partition_by=["city"]
                ),
                fresh,
            ),
            "write",
        )
    )
    results.append(
        (
            'write: df.write.format("oxlake") (insert)',
            best(
                args.repeat,
                lambda: (
                    frame.write.format("oxlake")
                    .option("operation", "insert")
                    .option("record_key", "trip_id")
                    .option("partition_by", "city")
                    .mode("append")
                    .save(str(out))
                ),
                fresh,
            ),
            "write",
        )
    )
    spark.stop()

    floor = {"read": parquet_read, "write": parquet_write}
    print(f"\n{args.rows:,} rows, best of {args.repeat}, Spark local[2]\n")
    print("| task | seconds | vs Spark's Parquet |")
    print("| --- | ---: | ---: |")
    for name, seconds, kind in results:
        print(f"| {name} | {seconds:.2f} | {seconds / floor[kind]:.2f}x |")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
