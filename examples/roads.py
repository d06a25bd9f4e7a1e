"""An example pipeline: road segments by map tile → coarser tiles, road classes, a summary.

    make develop && .venv/bin/python examples/roads.py /tmp/roads-demo

Input catalog `roads`, layer `segments`: one partition per level-14 tile (`x_y`), its payload
the JSON list of the road segments in the tile (`id`, `class`, `length` in metres).
Output catalog, three tasks:
- `Tiles` (direct, M:N): level-13 tiles, each the segment count and length of its four children
  plus the children of its east neighbour's western edge (a one-tile buffer, so an input tile
  feeds one or two outputs);
- `Classes` (map-group): one partition per road class found in the segments (keys from content);
- `summary` (non-incremental, reads the `tiles13` layer the first task produced this run).
The script runs the pipeline over several versions of the input and prints each report.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Iterable

from oxlake.pipeline import Catalog, DirectCompiler, Driver, InputPartition, MapGroupCompiler, compiler
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

CLASSES = ["motorway", "primary", "secondary", "residential", "track"]


def parse_tile(partition: str) -> tuple[int, int]:
    x, y = partition.split("_")
    return int(x), int(y)


class Tiles(DirectCompiler):
    """Level-14 tiles → level-13 tiles with a one-tile eastern buffer (M:N)."""

    inputs = {"roads": ["segments"]}
    outputs = ["tiles13"]

    def output_keys(self, catalog: str, layer: str, partition: str) -> Iterable[tuple[str, str]]:
        x, y = parse_tile(partition)
        yield "tiles13", f"{x // 2}_{y // 2}"
        if x % 2 == 0 and x > 0:  # western edge of its parent: also in the western neighbour's buffer
            yield "tiles13", f"{x // 2 - 1}_{y // 2}"

    def input_keys(self, layer: str, partition: str) -> Iterable[tuple[str, str, str]]:
        """The inverse: the four children and the two western children of the east neighbour
        (lets an incremental run read only these inputs)."""
        x, y = parse_tile(partition)
        for cx in (2 * x, 2 * x + 1, 2 * x + 2):
            for cy in (2 * y, 2 * y + 1):
                yield "roads", "segments", f"{cx}_{cy}"

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> bytes | None:
        segments = [s for i in inputs for s in json.loads(i.payload)]
        if not segments:
            return None
        length = round(sum(s["length"] for s in segments), 3)
        return json.dumps({"segments": len(segments), "length": length, "inputs": len(inputs)}).encode()


class Classes(MapGroupCompiler):
    """Segments grouped by road class (output keys from content)."""

    inputs = {"roads": ["segments"]}
    outputs = ["classes"]

    def map(self, item: InputPartition) -> Iterable[tuple[str, str, bytes]]:
        by_class: dict[str, list[float]] = {}
        for s in json.loads(item.payload):
            by_class.setdefault(s["class"], []).append(s["length"])
        for cls, lengths in sorted(by_class.items()):
            yield "classes", cls, json.dumps([len(lengths), sum(lengths)]).encode()

    def reduce(self, layer: str, partition: str, values: list[bytes]) -> bytes | None:
        pairs = [json.loads(v) for v in values]
        count = sum(n for n, _ in pairs)
        return json.dumps(
            {"segments": count, "length": round(sum(length for _, length in pairs), 3)}
        ).encode()


@compiler(inputs={"output": ["tiles13"]}, outputs=["summary"])
def summary(inputs: dict[tuple[str, str], DataFrame]) -> dict[str, DataFrame]:
    """One partition `all`: how many level-13 tiles hold roads."""
    tiles = inputs[("output", "tiles13")]
    total = tiles.agg(F.count("*").alias("tiles"))
    return {
        "summary": total.select(
            F.lit("all").alias("partition"), F.to_json(F.struct("tiles")).cast("binary").alias("payload")
        )
    }


def segments(rng: random.Random, tile: str, n: int) -> bytes:
    return json.dumps(
        [
            {"id": f"{tile}-{i}", "class": rng.choice(CLASSES), "length": round(rng.uniform(5, 500), 1)}
            for i in range(n)
        ]
    ).encode()


def pipeline(spark, inputs: Catalog, output: Catalog) -> Driver:  # type: ignore[no-untyped-def]
    return Driver(spark, output, {"roads": inputs}, [Tiles(), Classes(), summary])


def main(work: str) -> None:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's pyarrow
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    rng = random.Random(1)
    roads = Catalog.create(f"{work}/roads")
    out = Catalog.create(f"{work}/out")
    tiles = [f"{x}_{y}" for x in range(40) for y in range(25)]
    inputs = roads.table
    import pyarrow as pa

    def publish(keys: list[str], payloads: list[bytes]) -> None:
        inputs.upsert(
            pa.table(
                {
                    "layer": ["segments"] * len(keys),
                    "partition": keys,
                    "payload": pa.array(payloads, pa.binary()),
                    "checksum": [None] * len(keys),
                }
            )
        )

    publish(tiles, [segments(rng, t, rng.randint(1, 6)) for t in tiles])
    driver = pipeline(spark, roads, out)
    for version in range(1, 5):
        report = driver.run()
        print(
            f"input version {version}: {report.mode} {report.reasons or ''} → output version {report.version}"
        )
        for layer, r in sorted(report.layers.items()):
            print(
                f"  {layer:8s} compiled {r.compiled:5d}  written {r.written:5d}  "
                f"unchanged {r.unchanged:5d}  deleted {r.deleted:4d}"
            )
        changed = rng.sample(tiles, 20)
        publish(changed, [segments(rng, t, rng.randint(1, 6)) for t in changed])
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/oxlake-roads")
