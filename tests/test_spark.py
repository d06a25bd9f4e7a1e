"""oxlake from PySpark: reads through `mapInArrow`, distributed writes committed by the driver,
on a real `local[2]` Spark session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import oxlake
import oxlake.spark
import pyarrow as pa
import pytest
from conftest import SCHEMA, hudi_read, rows, trips

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("oxlake-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    yield session
    session.stop()


def from_spark(df: object) -> pa.Table:
    return pa.Table.from_pandas(df.toPandas(), preserve_index=False)  # type: ignore[attr-defined]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_read_equals_the_native_reader(spark: SparkSession, tmp_path: Path, table_type: str) -> None:
    path = str(tmp_path / "t")
    t = oxlake.create_table(
        path, SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts", table_type=table_type
    )
    t.insert(trips(list(range(300))))
    first = [i.time for i in t.timeline() if i.state == "completed"][-1]
    t.upsert(trips(list(range(0, 300, 7)), ts=2, name="u"))
    t.delete(trips([1, 2, 3]))

    df = oxlake.spark.read(spark, path, split_bytes=1)
    assert df.rdd.getNumPartitions() == len(t.splits(target_bytes=1)) > 1
    assert rows(from_spark(df)) == rows(t.to_arrow())
    assert [f.name for f in df.schema.fields][:5] == [f.name for f in t.schema][:5]

    hidden = oxlake.spark.read(spark, path, with_meta_columns=False)
    assert hidden.columns == ["id", "name", "city", "ts", "fare"]
    assert rows(from_spark(hidden)) == rows(t.to_arrow())

    old = oxlake.spark.read(spark, path, as_of=first)
    assert rows(from_spark(old)) == rows(t.to_arrow(as_of=first))
    changes = from_spark(oxlake.spark.read(spark, path, query="changes", start=first))
    expected = t.to_arrow(query="changes", start=first)
    assert sorted(zip(changes["id"].to_pylist(), changes["_change_type"].to_pylist(), strict=True)) == sorted(
        zip(expected["id"].to_pylist(), expected["_change_type"].to_pylist(), strict=True)
    )


def test_filter_and_columns_are_pushed_to_the_native_reader(spark: SparkSession, table: oxlake.Table) -> None:
    table.insert(trips(list(range(90))))
    every = table.splits(target_bytes=1)
    sf = table.splits(filter="city = 'sf'", target_bytes=1)
    assert sum(s.files for s in sf) < sum(s.files for s in every)
    assert sum(s.size for s in sf) < sum(s.size for s in every)
    df = oxlake.spark.read(spark, table.uri, columns=["id", "fare"], filter="city = 'sf'", split_bytes=1)
    assert df.rdd.getNumPartitions() == len(sf)
    assert df.columns == ["id", "fare"]
    got = sorted(r.id for r in df.collect())
    assert got == [i for i in range(90) if i % 3 == 0]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_write_round_trip(spark: SparkSession, tmp_path: Path, table_type: str) -> None:
    """Created by the first write, then upserts, deletes and an overwrite, each one commit; read
    back by oxlake and by hudi-rs."""
    path = str(tmp_path / "t")
    first = spark.createDataFrame(trips(list(range(200))).to_pandas())
    r = oxlake.spark.write(
        first,
        path,
        "upsert",
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=table_type,
    )
    assert r.num_inserts == 200
    t = oxlake.Table(path)
    assert rows(t.to_arrow()) == rows(trips(list(range(200))))

    changed = spark.createDataFrame(trips(list(range(150, 250)), ts=2, name="u").to_pandas())
    r = oxlake.spark.write(changed, path, "upsert")
    assert (r.num_inserts, r.num_updates) == (50, 50)
    gone = spark.createDataFrame(trips(list(range(0, 20))).to_pandas())
    assert oxlake.spark.write(gone, path, "delete").num_deletes == 20
    expected = rows(
        pa.concat_tables([trips(list(range(20, 150))), trips(list(range(150, 250)), ts=2, name="u")])
    )
    t = oxlake.Table(path)
    assert rows(t.to_arrow()) == expected
    assert rows(hudi_read(path)) == expected
    instants = [i for i in t.timeline() if i.state == "completed"]
    assert len(instants) == 3

    over = spark.createDataFrame(trips([1000, 1003], city="sf").to_pandas())
    oxlake.spark.write(over, path, "insert_overwrite")
    after = rows(oxlake.Table(path).to_arrow())
    assert [r["id"] for r in after if r["city"] == "sf"] == [1000, 1003]
    assert [r for r in after if r["city"] != "sf"] == [r for r in expected if r["city"] != "sf"]
    assert after == rows(hudi_read(path))


def test_failed_job_leaves_the_table_unchanged(spark: SparkSession, table: oxlake.Table) -> None:
    table.insert(trips(list(range(30))))
    before = rows(table.to_arrow())
    timeline = [(i.time, i.state) for i in table.timeline()]

    from pyspark.sql.functions import udf

    @udf("bigint")
    def explode_on_nyc(city: str, id: int) -> int:
        if city == "nyc":
            raise RuntimeError("task failure")
        return id

    data = spark.createDataFrame(trips(list(range(100, 160))).to_pandas())
    failing = data.withColumn("id", explode_on_nyc("city", "id"))
    with pytest.raises(Exception, match="task failure"):
        oxlake.spark.write(failing, table.uri, "upsert")
    t = oxlake.Table(table.uri)
    assert rows(t.to_arrow()) == before
    completed = [(i.time, i.state) for i in t.timeline() if i.action != "rollback"]
    assert [c for c in completed if c[1] == "completed"] == [c for c in timeline if c[1] == "completed"]
    data_files = {p.name for p in Path(table.uri).rglob("*.parquet")}
    assert all(any(i in name for i, _ in timeline) for name in data_files), data_files


def test_files_of_failed_task_attempts_never_become_visible(table: oxlake.Table) -> None:
    """A task attempt that wrote its files and then died, and its retry: the commit keeps the
    retry's files only (no duplicate rows), and the attempt's files are deleted."""
    table.insert(trips(list(range(30))))
    before = {p.name for p in Path(table.uri).rglob("*.parquet")}
    pending = oxlake._native.begin_write(table._t, "upsert")
    data = trips(list(range(25, 40)), ts=2, name="u")
    # A tiny target size sends the new keys to new file groups, named anew by each attempt.
    oxlake._native.write_files(table._t, "upsert", pending.instant, data, 1)
    attempt = {p.name for p in Path(table.uri).rglob("*.parquet")} - before
    retry = oxlake._native.write_files(table._t, "upsert", pending.instant, data, 1)
    landed = pending.commit([retry])
    kept = {f.rsplit("/", 1)[-1] for f in landed[4]}
    t = oxlake.Table(table.uri)
    expected = rows(pa.concat_tables([trips(list(range(25))), data]))
    assert rows(t.to_arrow()) == expected
    assert rows(hudi_read(table.uri)) == expected
    left = {p.name for p in Path(table.uri).rglob("*.parquet")}
    orphans = attempt - kept
    assert orphans, "the attempt wrote new file groups of its own"
    assert not orphans & left
    with pytest.raises(oxlake.InvalidArgumentError, match="already committed"):
        pending.commit([retry])
    with pytest.raises(oxlake.InvalidArgumentError, match="not a pending write"):
        oxlake._native.write_files(table._t, "upsert", pending.instant, data)
