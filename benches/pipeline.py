"""An incremental pipeline run against a full run, on Spark `local[2]`.

    .venv/bin/python benches/pipeline.py --partitions 1000000 --change 0.01

An input catalog of `--partitions` partitions (small JSON payloads), a direct M:N task (the
example's `Tiles`) and a map-group task (`Classes`). After a full first run, `--change` of the
input partitions change; the same change is compiled once incrementally and once in full (into a
copy of the output catalog taken before), and the bytes each wrote are compared.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def size(path: Path, since: set[Path]) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p not in since)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--change", type=float, default=0.01)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import pyarrow as pa
    import roads
    from oxlake.pipeline import Catalog, Driver
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", "6g")
        .getOrCreate()
    )
    work = Path(tempfile.mkdtemp(prefix="oxlake-pipeline-bench-"))
    rng = random.Random(1)
    side = int(args.partitions**0.5) + 1
    tiles = [f"{i % side}_{i // side}" for i in range(args.partitions)]
    inputs = Catalog.create(str(work / "roads"))

    def publish(keys: list[str]) -> None:
        payloads = [roads.segments(rng, t, rng.randint(1, 3)) for t in keys]
        inputs.table.upsert(
            pa.table(
                {
                    "layer": ["segments"] * len(keys),
                    "partition": keys,
                    "payload": pa.array(payloads, pa.binary()),
                    "checksum": pa.nulls(len(keys), pa.string()),
                }
            )
        )
        inputs.refresh()

    publish(tiles)
    out = Catalog.create(str(work / "out"))
    tasks = [roads.Tiles(), roads.Classes()]
    start = time.perf_counter()
    Driver(spark, out, {"roads": inputs}, tasks).run()
    first = time.perf_counter() - start
    shutil.copytree(work / "out", work / "full")
    publish(rng.sample(tiles, int(args.partitions * args.change)))

    results = {}
    for name, full in [("incremental", False), ("full", True)]:
        path = work / ("out" if name == "incremental" else "full")
        before = {p for p in path.rglob("*") if p.is_file()}
        start = time.perf_counter()
        report = Driver(spark, Catalog(str(path)), {"roads": inputs}, tasks).run(full=full)
        results[name] = (time.perf_counter() - start, size(path, before), report)

    print(f"\n{args.partitions:,} input partitions, {args.change:.0%} changed, Spark local[2]")
    print(f"first (full) run: {first:.1f} s\n")
    print("| run | seconds | bytes written | tiles13 compiled / written | classes compiled / written |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (secs, written, report) in results.items():
        t, c = report.layers["tiles13"], report.layers["classes"]
        print(
            f"| {name} ({report.mode}) | {secs:.1f} | {written:,} | {t.compiled:,} / {t.written:,} | "
            f"{c.compiled:,} / {c.written:,} |"
        )
    (inc, inc_bytes, _), (full, full_bytes, _) = results["incremental"], results["full"]
    ratio = full_bytes / max(inc_bytes, 1)
    print(f"\nincremental / full: {full / inc:.1f}x faster, {ratio:.1f}x fewer bytes")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
