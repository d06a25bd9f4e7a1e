"""The README's Python blocks run as written (issues 30 and 31): in order, in one namespace,
with `/data/` pointing into a temporary folder and the variables a reader brings (`data`,
`changes`, ...) defined here, never in the README."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

#: Blocks that are fragments of a user's program, not run here, and where what they show runs.
FRAGMENTS = {
    "events.writeStream": "a streaming query of the user's `events`: tests/test_streaming.py",
    "from oxlake.pipeline import": "the user's compilers (examples/roads.py): tests/test_pipeline.py",
}


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


RIDER = pa.struct([("tier", pa.string())])


def trips(ids: range | list[int], *, ts: int, extra: dict[str, pa.Array] | None = None) -> pa.Table:
    cities = ["sf", "nyc", "chennai"]
    columns: dict[str, Any] = {
        "trip_id": pa.array(list(ids), pa.int64()),
        "city": pa.array([cities[i % 3] for i in ids], pa.string()),
        "ts": pa.array([ts] * len(ids), pa.int64()),
        "fare": pa.array([float(i) for i in ids], pa.float64()),
        "rider": pa.array([{"tier": ["gold", "silver"][i % 2]} for i in ids], RIDER),
    }
    return pa.table({**columns, **(extra or {})})


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pyspark = pytest.importorskip("pyspark")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        pyspark.sql.SparkSession.builder.master("local[2]")
        .appName("oxlake-readme")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_the_readme_python_blocks_run(tmp_path: Path, spark: Any) -> None:
    if not hasattr(spark, "dataSource"):
        pytest.skip("the README's Spark block registers the Spark 4 data source")
    n = 12
    three = {
        "legacy": pa.array(["old"] * 3),
        "qty": pa.array([1, 2, 3], pa.int32()),
        "n": pa.array([1, 2, 3], pa.int32()),
    }
    namespace: dict[str, Any] = {
        "data": trips(range(n), ts=1),
        "schema": trips(range(0), ts=1).schema,
        "changes": trips(range(0, n, 2), ts=2),
        "more_changes": trips(range(1, n, 2), ts=3),
        "keys": trips([0], ts=1).select(["trip_id", "city"]),
        "day": trips([100, 101], ts=1),
        "history": trips(range(200, 210), ts=1),
        "spark": spark,
        "data_with_a_new_column": trips([1, 2, 3], ts=4, extra=three),
        "rows_with_wider_types": trips(
            [4], ts=4, extra={**{k: v.slice(0, 1) for k, v in three.items()}, "n": pa.array([7], pa.int64())}
        ),
        "rows_lacking_a_column": trips(
            [5], ts=4, extra={k: v.slice(0, 1) for k, v in three.items() if k != "legacy"}
        ),
    }
    ran, skipped = 0, []
    for i, block in enumerate(blocks()):
        fragment = next((why for marker, why in FRAGMENTS.items() if marker in block), None)
        if fragment is not None:
            skipped.append(fragment)
            continue
        code = block.replace('"/data/', f'"{tmp_path}/')
        try:
            exec(compile(code, f"README.md block {i + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"README.md's Python block {i + 1} fails as written: {e!r}\n{block}") from e
        ran += 1
    assert len(skipped) == len(FRAGMENTS), "a fragment marker matches no block: update FRAGMENTS"
    assert ran >= 5
    # What the blocks did, as they say: the trips table was written to and evolved.
    t = namespace["t"]
    assert "price" in t.schema.names and "fare" not in t.schema.names
    assert t.schema.field("qty").type == pa.int64()
