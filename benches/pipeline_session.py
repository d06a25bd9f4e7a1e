"""Many incremental pipeline runs in one Spark session, as a stream compiling every minute makes:
the driver JVM's heap (after a garbage collection) and the RDDs Spark holds persisted, per run.

    .venv/bin/python benches/pipeline_session.py --runs 60
    .venv/bin/python benches/pipeline_session.py --runs 60 --low-retention

An input catalog of `--partitions` road tiles and the example's two tasks (`Tiles`, `Classes`);
after a first (full) run, each run changes `--change` of the inputs at random and compiles them
incrementally on `--path`. `--low-retention` sets Spark's record of finished jobs, stages and SQL
executions (kept even with the UI off) to 5 of each, so what is left growing is not Spark's.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=3_000)
    parser.add_argument("--change", type=float, default=0.01)
    parser.add_argument("--path", choices=["auto", "driver", "spark"], default="spark")
    parser.add_argument("--low-retention", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import pyarrow as pa
    import roads
    from oxlake.pipeline import Catalog, Driver
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
    )
    if args.low_retention:
        for key in ["spark.ui.retainedJobs", "spark.ui.retainedStages", "spark.sql.ui.retainedExecutions"]:
            builder = builder.config(key, "5")
    spark = builder.getOrCreate()
    jvm, context = spark._jvm, spark.sparkContext._jsc  # type: ignore[attr-defined]

    def heap_mib() -> float:
        gc.collect()  # Python's references to JVM objects first, then the JVM's collection
        jvm.System.gc()
        time.sleep(0.5)  # the ContextCleaner releases what the collection found unreachable
        jvm.System.gc()
        runtime = jvm.java.lang.Runtime.getRuntime()
        return float(runtime.totalMemory() - runtime.freeMemory()) / 2**20

    rng = random.Random(1)
    side = 50
    tiles = [f"{i % side}_{i // side}" for i in range(args.partitions)]
    work = Path(tempfile.mkdtemp(prefix="oxlake-pipeline-session-"))
    inputs = Catalog.create(str(work / "roads"))

    def publish(keys: list[str]) -> None:
        table = pa.table(
            {
                "layer": ["segments"] * len(keys),
                "partition": keys,
                "payload": pa.array([roads.segments(rng, t, rng.randint(1, 4)) for t in keys], pa.binary()),
                "checksum": pa.nulls(len(keys), pa.string()),
            }
        )
        (inputs.table.upsert if inputs.latest() else inputs.table.insert)(table)
        inputs.refresh()

    publish(tiles)
    driver = Driver(
        spark,
        Catalog.create(str(work / "out")),
        {"roads": inputs},
        [roads.Tiles(), roads.Classes()],
        incremental_path=args.path,
    )
    driver.run()
    heaps = []
    print("| run | seconds | mode | persisted RDDs | heap MiB |")
    print("| ---: | ---: | --- | ---: | ---: |")
    for run in range(args.runs):
        publish(rng.sample(tiles, max(1, int(args.partitions * args.change))))
        start = time.perf_counter()
        report = driver.run()
        seconds = time.perf_counter() - start
        heaps.append(heap_mib())
        persisted = context.getPersistentRDDs().size()
        print(f"| {run} | {seconds:.1f} | {report.mode} | {persisted} | {heaps[-1]:.0f} |", flush=True)
    print(
        f"\nheap MiB: first {heaps[0]:.0f}, last {heaps[-1]:.0f}, median {statistics.median(heaps):.0f}, "
        f"min {min(heaps):.0f}, max {max(heaps):.0f}"
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
