"""An incremental pipeline run against a full run, on Spark `local[2]`.

    .venv/bin/python benches/pipeline.py --partitions 1000000 --change 0.01

An input catalog of `--partitions` partitions (small JSON payloads), a direct M:N task (the
example's `Tiles`, with its inverse) and a map-group task (`AreaClasses`: road length per class in
each level-12 area of 16 input tiles). After a full first run, `--change` of the input partitions
change (`--spread`: anywhere at random, or one contiguous band); the same change is compiled once
incrementally and once in full (into a copy of the output catalog taken before). Bytes written
are compared with the first run, which publishes every output partition (a full republish).
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


def area_classes():  # type: ignore[no-untyped-def]
    import json

    import roads
    from oxlake.pipeline import MapGroupCompiler

    class AreaClasses(MapGroupCompiler):
        """Road length per class in each level-12 area (4 x 4 input tiles); keys from content."""

        inputs = {"roads": ["segments"]}
        outputs = ["area_classes"]

        def map(self, item):  # type: ignore[no-untyped-def]
            x, y = roads.parse_tile(item.partition)
            by_class: dict[str, float] = {}
            for s in json.loads(item.payload):
                by_class[s["class"]] = by_class.get(s["class"], 0.0) + s["length"]
            for cls, length in sorted(by_class.items()):
                yield "area_classes", f"{x // 4}_{y // 4}/{cls}", json.dumps(length).encode()

        def reduce(self, layer, partition, values):  # type: ignore[no-untyped-def]
            return json.dumps(round(sum(json.loads(v) for v in values), 3)).encode()

    return AreaClasses()


def size(path: Path, since: set[Path]) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p not in since)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--change", type=float, default=0.01)
    parser.add_argument(
        "--spread",
        choices=["random", "clustered"],
        default="random",
        help="changed input tiles anywhere, or in one contiguous band of rows (as edits of one region)",
    )
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
    tasks = [roads.Tiles(), area_classes()]
    start = time.perf_counter()
    Driver(spark, out, {"roads": inputs}, tasks).run()
    first = time.perf_counter() - start
    republish = size(work / "out", set())
    shutil.copytree(work / "out", work / "full")
    n = int(args.partitions * args.change)
    if args.spread == "random":
        publish(rng.sample(tiles, n))
    else:
        band = rng.randrange(len(tiles) - n)
        publish(tiles[band : band + n])

    results = {}
    for name, full in [("incremental", False), ("full", True)]:
        path = work / ("out" if name == "incremental" else "full")
        before = {p for p in path.rglob("*") if p.is_file()}
        start = time.perf_counter()
        report = Driver(spark, Catalog(str(path)), {"roads": inputs}, tasks).run(full=full)
        results[name] = (time.perf_counter() - start, size(path, before), report)

    changed = f"{args.change:.0%} changed ({args.spread})"
    print(f"\n{args.partitions:,} input partitions, {changed}, Spark local[2]")
    print()
    print("| run | seconds | bytes written | tiles13 compiled / written | area_classes compiled / written |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| first (full republish) | {first:.1f} | {republish:,} | | |")
    for name, (secs, written, report) in results.items():
        t, c = report.layers["tiles13"], report.layers["area_classes"]
        print(
            f"| {name} ({report.mode}) | {secs:.1f} | {written:,} | {t.compiled:,} / {t.written:,} | "
            f"{c.compiled:,} / {c.written:,} |"
        )
    (inc, inc_bytes, _), (full, full_bytes, _) = results["incremental"], results["full"]
    print(
        f"\nincremental against full: {full / inc:.1f}x faster; bytes written: "
        f"{republish / max(inc_bytes, 1):.1f}x fewer than a full republish "
        f"(the full run, which also publishes only what changed, wrote {full_bytes:,})"
    )
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
