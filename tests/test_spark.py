"""oxlake from PySpark: reads through `mapInArrow`, distributed writes committed by the driver,
on a real `local[2]` Spark session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import oxlake
import oxlake.spark
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SCHEMA, data_files, data_paths, hudi_read, rows, trips, trips_table

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402


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


def three_commits(path: str, table_type: str) -> tuple[oxlake.Table, str]:
    """A table after an insert, an upsert and a delete; and the insert's instant."""
    t = trips_table(path, table_type=table_type)
    t.insert(trips(list(range(300))))
    first = [i.time for i in t.timeline() if i.state == "completed"][-1]
    t.upsert(trips(list(range(0, 300, 7)), ts=2, name="u"))
    t.delete(trips([1, 2, 3]))
    return t, first


def assert_same_changes(df: object, t: oxlake.Table, start: str) -> None:
    changes = from_spark(df)
    expected = t.to_arrow(query="changes", start=start)
    assert sorted(zip(changes["id"].to_pylist(), changes["_change_type"].to_pylist(), strict=True)) == sorted(
        zip(expected["id"].to_pylist(), expected["_change_type"].to_pylist(), strict=True)
    )


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_read_equals_the_native_reader(spark: SparkSession, tmp_path: Path, table_type: str) -> None:
    path = str(tmp_path / "t")
    t, first = three_commits(path, table_type)

    df = oxlake.spark.read(spark, path, split_bytes=1)
    assert df.rdd.getNumPartitions() == len(t.splits(target_bytes=1)) > 1
    assert rows(from_spark(df)) == rows(t.to_arrow())
    assert [f.name for f in df.schema.fields][:5] == [f.name for f in t.schema][:5]

    hidden = oxlake.spark.read(spark, path, with_meta_columns=False)
    assert hidden.columns == ["id", "name", "city", "ts", "fare"]
    assert rows(from_spark(hidden)) == rows(t.to_arrow())

    old = oxlake.spark.read(spark, path, as_of=first)
    assert rows(from_spark(old)) == rows(t.to_arrow(as_of=first))
    assert_same_changes(oxlake.spark.read(spark, path, query="changes", start=first), t, first)


def test_a_table_of_one_file_is_read_by_every_core(spark: SparkSession, tmp_path: Path) -> None:
    """A 100,000-row table of one base file: Spark reads it in as many tasks as its default
    parallelism (the file cut by rows), every row once; the data source too (`min_splits`)."""
    path = str(tmp_path / "t")
    t = oxlake.create_table(path, SCHEMA, record_key="id", ordering_field="ts")
    n = 100_000
    t.insert(
        pa.table(
            {
                "id": pa.array(range(n), pa.int64()),
                "name": pa.array([f"n{i % 31}" for i in range(n)]),
                "city": pa.array(["sf"] * n),
                "ts": pa.array([1] * n, pa.int64()),
                "fare": pa.array([float(i) for i in range(n)]),
            },
            schema=SCHEMA,
        )
    )
    assert len(t.splits()) == 1
    df = oxlake.spark.read(spark, path, with_meta_columns=False)
    assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism == 2
    assert df.count() == n and df.select("id").distinct().count() == n
    assert rows(from_spark(oxlake.spark.read(spark, path))) == rows(t.to_arrow())
    if hasattr(spark, "dataSource"):
        oxlake.spark.register(spark)
        source = spark.read.format("oxlake").option("min_splits", "3").load(path)
        assert source.rdd.getNumPartitions() == 3
        assert source.select("id").distinct().count() == n


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


def check_insert_upsert_delete(path: str) -> tuple[list[dict[str, object]], list[oxlake.Instant]]:
    """After Spark wrote 0..199, upserted 150..249 (`u`, ts 2) and deleted 0..19, in three
    commits: oxlake and hudi-rs read the same rows. Returns them and the completed instants."""
    expected = rows(
        pa.concat_tables([trips(list(range(20, 150))), trips(list(range(150, 250)), ts=2, name="u")])
    )
    t = oxlake.Table(path)
    assert rows(t.to_arrow()) == expected
    assert rows(hudi_read(path)) == expected
    completed = [i for i in t.timeline() if i.state == "completed"]
    assert len(completed) == 3
    return expected, completed


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_write_round_trip(spark: SparkSession, tmp_path: Path, table_type: str) -> None:
    """Created by the first write, then upserts, deletes and an overwrite, each one commit; read
    back by oxlake and by hudi-rs."""
    path = str(tmp_path / "t")
    first = spark.createDataFrame(trips(list(range(200))).to_pandas())
    r = oxlake.spark.write(
        first,
        path,
        operation="upsert",
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=table_type,
    )
    assert r.num_inserts == 200
    t = oxlake.Table(path)
    assert rows(t.to_arrow()) == rows(trips(list(range(200))))

    changed = spark.createDataFrame(trips(list(range(150, 250)), ts=2, name="u").to_pandas())
    r = oxlake.spark.write(changed, path, operation="upsert")
    assert (r.num_inserts, r.num_updates) == (50, 50)
    gone = spark.createDataFrame(trips(list(range(0, 20))).to_pandas())
    assert oxlake.spark.write(gone, path, operation="delete").num_deletes == 20
    expected, _ = check_insert_upsert_delete(path)

    over = spark.createDataFrame(trips([1000, 1003], city="sf").to_pandas())
    oxlake.spark.write(over, path, operation="insert_overwrite")
    after = rows(oxlake.Table(path).to_arrow())
    assert [r["id"] for r in after if r["city"] == "sf"] == [1000, 1003]
    assert [r for r in after if r["city"] != "sf"] == [r for r in expected if r["city"] != "sf"]
    assert after == rows(hudi_read(path))


def test_distributed_writes_run_the_inline_services(spark: SparkSession, tmp_path: Path) -> None:
    """A merge-on-read table written through Spark compacts inline every `inline_compaction`
    deltacommits, as a write in one process does (a stream through Spark piled up logs)."""
    path = str(tmp_path / "t")
    create = {"record_key": "id", "partition_by": ["city"], "ordering_field": "ts"}
    create |= {"table_type": "merge_on_read", "inline_compaction": 2}
    for ts in range(1, 6):
        df = spark.createDataFrame(trips([1, 2, 3], ts=ts).to_pandas())
        oxlake.spark.write(df, path, operation="upsert", **create)
    t = oxlake.Table(path)
    completed = [i.action for i in t.timeline() if i.state == "completed"]
    assert completed.count("commit") == 2, completed  # compactions complete as commits
    assert rows(t.to_arrow()) == rows(trips([1, 2, 3], ts=5))
    assert rows(hudi_read(path)) == rows(trips([1, 2, 3], ts=5))


def test_spark_compacts_on_the_executors(spark: SparkSession, tmp_path: Path) -> None:
    """`oxlake.spark.compact`: the plan left pending by an aborted compaction first, its slices
    merged by Spark tasks, then nothing left to compact; the rows are the table's throughout."""
    path = str(tmp_path / "t")
    t, _ = three_commits(path, "merge_on_read")
    before = rows(t.to_arrow())
    left = oxlake._native.begin_compaction(t._t)
    assert left is not None
    left.abort()
    done = oxlake.spark.compact(spark, path)
    assert (done.instants, done.file_groups, done.records) == ([left.instant], 3, 297)
    t = oxlake.Table(path)
    assert [(i.action, i.state) for i in t.timeline() if i.time == left.instant] == [("commit", "completed")]
    assert not [f for f in t.planned_files() if ".log." in f]
    assert rows(t.to_arrow()) == before
    assert rows(hudi_read(path)) == before
    assert oxlake.spark.compact(spark, path).instants == []


def key_ranges(path: str) -> dict[str, list[tuple[str, str]]]:
    """Per partition, the (first, last) record key of each base file, checking each is sorted."""
    out: dict[str, list[tuple[str, str]]] = {}
    for f in sorted(data_files(oxlake.Table(path))):
        keys = pq.read_table(Path(path) / f, columns=["_hoodie_record_key"]).column(0).to_pylist()
        assert keys == sorted(keys), f
        out.setdefault(f.rsplit("/", 1)[0], []).append((keys[0], keys[-1]))
    return {p: sorted(r) for p, r in out.items()}


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_spark_bulk_insert_writes_new_files_sorted_by_key(
    spark: SparkSession, tmp_path: Path, table_type: str
) -> None:
    """`bulk_insert` with a global sort: every file of a partition holds its own key range,
    across tasks; a second one keeps duplicates and leaves the files there."""
    path = str(tmp_path / "t")
    ids = [(i * 7919) % 3000 for i in range(3000)]
    df = spark.createDataFrame(trips(ids).to_pandas()).repartition(3)
    create = {"record_key": "id", "partition_by": ["city"], "ordering_field": "ts", "table_type": table_type}
    r = oxlake.spark.write(
        df, path, operation="bulk_insert", sort_mode="global_sort", target_file_size=5_000, **create
    )
    assert r.num_inserts == 3000
    ranges = key_ranges(path)
    assert sum(len(r) for r in ranges.values()) > 3
    for partition, spans in ranges.items():
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False)), (partition, spans)
    expected = rows(trips(list(range(3000))))
    assert rows(oxlake.Table(path).to_arrow()) == expected
    assert rows(hudi_read(path)) == expected

    before = data_files(oxlake.Table(path))
    again = spark.createDataFrame(trips([1, 2], ts=2).to_pandas())
    oxlake.spark.write(again, path, operation="bulk_insert", sort_mode="partition_sort")
    assert before < data_files(oxlake.Table(path))
    assert oxlake.Table(path).to_arrow().num_rows == 3002
    with pytest.raises(
        oxlake.InvalidArgumentError, match="sort_mode is an option of operation='bulk_insert'"
    ):
        oxlake.spark.write(again, path, operation="upsert", sort_mode="global_sort")
    if hasattr(spark, "dataSource"):
        oxlake.spark.register(spark)
        writer = again.write.format("oxlake").option("operation", "bulk_insert").mode("append")
        writer.option("sort_mode", "partition_sort").save(path)
        assert oxlake.Table(path).to_arrow().num_rows == 3004
        with pytest.raises(Exception, match="not a bulk insert sort mode"):
            writer.option("sort_mode", "by_key").save(path)
        assert oxlake.Table(path).to_arrow().num_rows == 3004


def test_distributed_writes_keep_the_metadata_table_in_step(spark: SparkSession, tmp_path: Path) -> None:
    """Spark tasks write log files and report, with their keys, the index entries of those
    files; the driver's commit syncs the metadata table from the reports: it validates against
    a full listing after every write, and the record index routes the next upsert."""
    path = str(tmp_path / "t")
    t = trips_table(path, table_type="merge_on_read")
    t.insert(trips(list(range(300))))
    t.build_metadata()
    changed = spark.createDataFrame(trips(list(range(0, 300, 2)) + [300, 301], ts=2, name="u").to_pandas())
    r = oxlake.spark.write(changed, path, operation="upsert")
    assert (r.num_updates, r.num_inserts) == (150, 2)
    assert any(".log." in f for f in r.files)
    report = oxlake.Table(path).validate()
    assert report.ok, report.differences
    gone = spark.createDataFrame(trips([1, 3, 301], ts=2).to_pandas())  # ts: as late as the upsert
    assert oxlake.spark.write(gone, path, operation="delete").num_deletes == 3
    report = oxlake.Table(path).validate()
    assert report.ok, report.differences
    want = [i for i in range(302) if i not in (1, 3, 301)]
    assert sorted(r["id"] for r in rows(oxlake.Table(path).to_arrow())) == want
    got = rows(oxlake.Table(path).lookup(pa.table({"id": pa.array([0, 1, 2, 300], pa.int64())})))
    assert [(r["id"], r["name"]) for r in got] == [(0, "u0"), (2, "u2"), (300, "u300")]


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
        oxlake.spark.write(failing, table.uri, operation="upsert")
    t = oxlake.Table(table.uri)
    assert rows(t.to_arrow()) == before
    completed = [(i.time, i.state) for i in t.timeline() if i.action != "rollback"]
    assert [c for c in completed if c[1] == "completed"] == [c for c in timeline if c[1] == "completed"]
    names = {p.name for p in data_paths(table.uri, "*.parquet")}
    assert all(any(i in name for i, _ in timeline) for name in names), names


def test_files_of_failed_task_attempts_never_become_visible(table: oxlake.Table) -> None:
    """A task attempt that wrote its files and then died, and its retry: the commit keeps the
    retry's files only (no duplicate rows), and the attempt's files are deleted."""
    table.insert(trips(list(range(30))))
    before = {p.name for p in data_paths(table.uri, "*.parquet")}
    pending = oxlake._native.begin_write(table._t, "upsert")
    data = trips(list(range(25, 40)), ts=2, name="u")
    # A tiny target size sends the new keys to new file groups, named anew by each attempt.
    oxlake._native.write_files(table._t, "upsert", pending.instant, data, 1)
    attempt = {p.name for p in data_paths(table.uri, "*.parquet")} - before
    retry = oxlake._native.write_files(table._t, "upsert", pending.instant, data, 1)
    landed = pending.commit([retry])
    kept = {f.rsplit("/", 1)[-1] for f in landed[4]}
    t = oxlake.Table(table.uri)
    expected = rows(pa.concat_tables([trips(list(range(25))), data]))
    assert rows(t.to_arrow()) == expected
    assert rows(hudi_read(table.uri)) == expected
    left = {p.name for p in data_paths(table.uri, "*.parquet")}
    orphans = attempt - kept
    assert orphans, "the attempt wrote new file groups of its own"
    assert not orphans & left
    with pytest.raises(oxlake.InvalidArgumentError, match="already committed"):
        pending.commit([retry])
    with pytest.raises(oxlake.InvalidArgumentError, match="not a pending write"):
        oxlake._native.write_files(table._t, "upsert", pending.instant, data)


# ---- Spark's Python Data Source API: format("oxlake") ------------------------------------------

needs_data_source = pytest.mark.skipif(
    not hasattr(SparkSession, "dataSource"), reason="Python data sources need Spark 4"
)


@pytest.fixture(scope="module")
def source(spark: SparkSession) -> SparkSession:
    if not hasattr(spark, "dataSource"):
        pytest.skip("Python data sources need Spark 4")
    oxlake.spark.register(spark)
    return spark


def committed_files(path: str, instant: oxlake.Instant) -> list[str]:
    """The files a completed instant's commit metadata names (JSON on timeline layout 1, Avro
    under `.hoodie/timeline/` on layout 2)."""
    import json

    import fastavro

    if instant.completion is None:
        meta = json.loads((Path(path) / ".hoodie" / f"{instant.time}.{instant.action}").read_text())
    else:
        name = f"{instant.time}_{instant.completion}.{instant.action}"
        with open(Path(path) / ".hoodie" / "timeline" / name, "rb") as fh:
            [meta] = list(fastavro.reader(fh))
    return [s["path"] for stats in meta["partitionToWriteStats"].values() for s in stats]


def base_files_of(path: str, instant: str) -> list[str]:
    return sorted(p.name for p in data_paths(path, "*.parquet") if p.name.endswith(f"_{instant}.parquet"))


@needs_data_source
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_data_source_reads_what_the_native_reader_reads(
    source: SparkSession, tmp_path: Path, table_type: str
) -> None:
    path = str(tmp_path / "t")
    t, first = three_commits(path, table_type)

    df = source.read.format("oxlake").option("split_bytes", "1").load(path)
    assert df.rdd.getNumPartitions() == len(t.splits(target_bytes=1)) > 1
    assert rows(from_spark(df)) == rows(t.to_arrow())
    assert df.columns[:5] == [f.name for f in t.schema][:5]

    hidden = source.read.format("oxlake").option("with_meta_columns", "false").load(path)
    assert hidden.columns == ["id", "name", "city", "ts", "fare"]
    picked = source.read.format("oxlake").option("columns", "id, fare").load(path)
    assert picked.columns == ["id", "fare"]
    native = t.to_arrow(columns=["id", "fare"])
    assert sorted(tuple(r) for r in picked.collect()) == sorted(
        zip(native["id"].to_pylist(), native["fare"].to_pylist(), strict=True)
    )

    old = source.read.format("oxlake").option("as_of", first).load(path)
    assert rows(from_spark(old)) == rows(t.to_arrow(as_of=first))
    changes = source.read.format("oxlake").option("query", "changes").option("start", first).load(path)
    assert_same_changes(changes, t, first)


@needs_data_source
def test_data_source_pushes_filters_to_the_native_planner(source: SparkSession, table: oxlake.Table) -> None:
    from pyspark.sql.functions import col

    table.insert(trips(list(range(90))))
    table.upsert(pa.table({**trips([4]).to_pydict(), "name": ["O'Brien"]}, schema=SCHEMA))
    every = table.splits(target_bytes=1)
    sf = table.splits(filter="city = 'sf'", target_bytes=1)
    assert len(sf) < len(every)
    df = source.read.format("oxlake").option("split_bytes", "1").load(table.uri)

    pruned = df.filter("city = 'sf' AND fare > 40.5")
    # Partition pruning: only the splits of `city=sf` become tasks; the rest of the filter runs
    # natively on each row (Spark keeps no filter of its own).
    assert pruned.rdd.getNumPartitions() == len(sf)
    assert "Filter (" not in pruned._jdf.queryExecution().executedPlan().toString()
    assert sorted(r.id for r in pruned.collect()) == [i for i in range(90) if i % 3 == 0 and i + 10.0 > 40.5]

    mixed = df.filter(
        col("city").isin("sf", "nyc")
        & col("name").startswith("n1")
        & ~(col("id") == 13)
        & col("fare").isNotNull()
        & (col("name") != "O'Brien")
    )
    expected = [
        r["id"]
        for r in rows(table.to_arrow())
        if r["city"] in ("sf", "nyc") and r["name"].startswith("n1") and r["id"] != 13
    ]
    assert sorted(r.id for r in mixed.collect()) == expected
    assert [r.id for r in df.filter(col("name") == "O'Brien").collect()] == [4]
    assert [r.id for r in df.filter(col("name").contains("Bri")).collect()] == [4]
    assert [r.id for r in df.filter(col("name").endswith("89")).collect()] == [89]


def test_spark_filters_become_sql_the_native_reader_understands() -> None:
    ds = pytest.importorskip("pyspark.sql.datasource")
    if not hasattr(ds, "EqualTo"):
        pytest.skip("filter pushdown to Python data sources needs Spark 4.1")
    import datetime
    import decimal

    from oxlake.spark_source import _to_sql

    cases = [
        (ds.EqualTo(("a",), 1), '"a" = 1'),
        (ds.EqualTo(("a b",), "it's"), "\"a b\" = 'it''s'"),
        (ds.GreaterThan(("a",), 1.5), '"a" > 1.5'),
        (ds.GreaterThanOrEqual(("a",), decimal.Decimal("2.50")), '"a" >= 2.50'),
        (ds.LessThan(("d",), datetime.date(2024, 2, 29)), "\"d\" < DATE '2024-02-29'"),
        (ds.LessThanOrEqual(("b",), True), '"b" <= TRUE'),
        (ds.EqualNullSafe(("a",), None), '"a" IS NOT DISTINCT FROM NULL'),
        (ds.In(("a",), (1, 2)), '"a" IN (1, 2)'),
        (ds.IsNull(("a",)), '"a" IS NULL'),
        (ds.IsNotNull(("a",)), '"a" IS NOT NULL'),
        (ds.Not(ds.EqualTo(("a",), 1)), 'NOT ("a" = 1)'),
        (ds.StringStartsWith(("s",), "x%"), "starts_with(\"s\", 'x%')"),
        (ds.StringEndsWith(("s",), "y"), "ends_with(\"s\", 'y')"),
        (ds.StringContains(("s",), "z"), "strpos(\"s\", 'z') > 0"),
    ]
    for f, sql in cases:
        assert _to_sql(f) == sql, f
    # What the native reader would not evaluate exactly as Spark does stays with Spark.
    kept = [
        ds.EqualTo(("a", "nested"), 1),
        ds.EqualTo(("t",), datetime.datetime(2024, 1, 1, 12)),
        ds.EqualTo(("f",), float("nan")),
        ds.In(("a",), ()),
        ds.Not(ds.EqualTo(("b",), b"bytes")),
    ]
    assert [_to_sql(f) for f in kept] == [None] * len(kept)


@needs_data_source
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_data_source_write_round_trip(source: SparkSession, tmp_path: Path, table_type: str) -> None:
    """Rows of one table partition spread over several tasks (the data source cannot repartition):
    the commit still holds one file per file group and exactly the written rows."""
    path = str(tmp_path / "t")

    def frame(data: pa.Table) -> object:
        return source.createDataFrame(data.to_pandas()).repartition(3)

    (
        frame(trips(list(range(200))))
        .write.format("oxlake")
        .option("record_key", "id")
        .option("partition_by", "city")
        .option("ordering_field", "ts")
        .option("table_type", table_type)
        .mode("append")
        .save(path)
    )
    t = oxlake.Table(path)
    assert t.properties["hoodie.table.type"] == table_type.upper()
    assert rows(t.to_arrow()) == rows(trips(list(range(200))))

    frame(trips(list(range(150, 250)), ts=2, name="u")).write.format("oxlake").mode("append").save(path)
    frame(trips(list(range(0, 20)))).write.format("oxlake").option("operation", "delete").mode("append").save(
        path
    )
    expected, completed = check_insert_upsert_delete(path)
    t = oxlake.Table(path)
    for instant in completed:
        names = base_files_of(path, instant.time)
        file_ids = [n.split("_", 1)[0] for n in names]
        assert len(file_ids) == len(set(file_ids)), names  # merged: one base file per group
    # Nothing but the committed files is left behind.
    committed = {f.rsplit("/", 1)[-1] for i in completed for f in committed_files(path, i)}
    on_disk = {
        p.name for p in Path(path).rglob("*") if p.is_file() and "_" in p.name and ".hoodie" not in str(p)
    }
    assert on_disk - {".hoodie_partition_metadata"} <= committed

    frame(trips([500, 501])).write.format("oxlake").option("operation", "insert").mode("append").save(path)
    expected = sorted(expected + rows(trips([500, 501])), key=lambda r: r["id"])
    assert rows(oxlake.Table(path).to_arrow()) == expected

    frame(trips([1000, 1001])).write.format("oxlake").mode("overwrite").save(path)
    assert rows(oxlake.Table(path).to_arrow()) == rows(trips([1000, 1001]))
    assert rows(hudi_read(path)) == rows(trips([1000, 1001]))


@needs_data_source
def test_failed_data_source_write_leaves_the_table_unchanged(
    source: SparkSession, table: oxlake.Table
) -> None:
    from pyspark.sql.functions import udf

    table.insert(trips(list(range(30))))
    before = rows(table.to_arrow())
    files = {p.name for p in data_paths(table.uri, "*.parquet")}

    @udf("bigint")
    def fail_on_nyc(city: str, id: int) -> int:
        if city == "nyc":
            raise RuntimeError("task failure")
        return id

    data = source.createDataFrame(trips(list(range(100, 160))).to_pandas()).repartition(3)
    with pytest.raises(Exception, match="task failure"):
        data.withColumn("id", fail_on_nyc("city", "id")).write.format("oxlake").mode("append").save(table.uri)
    t = oxlake.Table(table.uri)
    assert rows(t.to_arrow()) == before
    assert {p.name for p in data_paths(table.uri, "*.parquet")} == files
    assert not [i for i in t.timeline() if i.state != "completed"]


@needs_data_source
def test_a_data_source_write_whose_tasks_share_a_key_is_reconciled_or_refused(
    source: SparkSession, table: oxlake.Table
) -> None:
    """Spark hands each task the rows its input partition holds, so two tasks may carry one key.
    Both updating an existing key write its file group: the commit merges their rewrites, the
    greater ordering value winning, as one process would. Both inserting a new key into new file
    groups (a new partition) would land it twice, and one deleting a key another writes would
    decide by task placement: the commit refuses those, naming the key, and the table is as it
    was."""
    table.insert(trips(list(range(10))))

    def frame(*halves: pa.Table) -> Any:
        data = pa.concat_tables(halves)
        records = source.sparkContext.parallelize([tuple(r.values()) for r in data.to_pylist()], 2)
        columns = "id bigint, name string, city string, ts bigint, fare double"
        if "_hoodie_is_deleted" in data.column_names:
            columns += ", _hoodie_is_deleted boolean"
        df = source.createDataFrame(records, columns)
        assert len(df.rdd.glom().collect()) == 2
        return df

    # Existing key 5 in both input partitions: reconciled, the greater ts wins.
    df = frame(trips([5, 100], ts=3, name="a"), trips([5, 101], ts=2, name="b"))
    df.write.format("oxlake").option("operation", "upsert").mode("append").save(table.uri)
    got = {r["id"]: r for r in rows(oxlake.Table(table.uri).to_arrow())}
    assert sorted(got) == [*range(10), 100, 101]
    assert got[5]["name"] == "a5"
    before = rows(oxlake.Table(table.uri).to_arrow())

    # A new key in a new partition in both: two new file groups would each hold it.
    df = frame(trips([300], ts=2, city="la", name="a"), trips([300], ts=3, city="la", name="b"))
    with pytest.raises(Exception, match="record key `300` was written into two file groups by two tasks"):
        df.write.format("oxlake").option("operation", "upsert").mode("append").save(table.uri)
    assert rows(oxlake.Table(table.uri).to_arrow()) == before

    # Key 7 deleted in one input partition and updated in the other.
    deleted = trips([7, 102], ts=4).append_column("_hoodie_is_deleted", pa.array([True, False]))
    updated = trips([7], ts=5, name="u").append_column("_hoodie_is_deleted", pa.array([False]))
    with pytest.raises(Exception, match="record key `7` was deleted and written by two tasks"):
        frame(deleted, updated).write.format("oxlake").option("operation", "upsert").mode("append").save(
            table.uri
        )
    t = oxlake.Table(table.uri)
    assert rows(t.to_arrow()) == before
    assert not [i for i in t.timeline() if i.state != "completed"]


@needs_data_source
def test_two_tasks_rewriting_one_group_of_a_table_without_meta_fields_are_merged(
    source: SparkSession, tmp_path: Path
) -> None:
    """Without meta fields no row carries the instant that wrote it: the commit tells a task's new
    rows from the old ones it kept by the keys the task reported, and merges the two rewrites of
    one copy-on-write group (the greater ordering value winning for a key both wrote)."""
    path = str(tmp_path / "t")
    t = trips_table(path, meta_fields=False)
    t.insert(trips(list(range(12))))
    columns = "id bigint, name string, city string, ts bigint, fare double"
    # Keys 2, 5, 8 and 11 are all in "chennai": each task rewrites its one file group.
    halves = [trips([2, 5], ts=3, name="a"), trips([5, 8], ts=2, name="b")]
    records = [tuple(r.values()) for r in pa.concat_tables(halves).to_pylist()]
    df = source.createDataFrame(source.sparkContext.parallelize(records, 2), columns)
    assert len(df.rdd.glom().collect()) == 2
    df.write.format("oxlake").option("operation", "upsert").mode("append").save(path)
    got = {r["id"]: r["name"] for r in rows(oxlake.Table(path).to_arrow())}
    assert sorted(got) == list(range(12))
    assert (got[2], got[5], got[8], got[11]) == ("a2", "a5", "b8", "n11")
    assert rows(hudi_read(path).select(["id", "name"])) == [{"id": i, "name": got[i]} for i in range(12)]


# ---- schemas --------------------------------------------------------------------------------


def test_every_stored_type_maps_to_its_spark_type(spark: SparkSession, tmp_path: Path) -> None:
    import datetime
    import decimal

    from pyspark.sql import types as T

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("b", pa.bool_()),
            ("i8", pa.int8()),
            ("i16", pa.int16()),
            ("i32", pa.int32()),
            ("u8", pa.uint8()),
            ("u16", pa.uint16()),
            ("u32", pa.uint32()),
            ("f32", pa.float32()),
            ("f64", pa.float64()),
            ("s", pa.large_string()),
            ("bin", pa.binary()),
            ("fixed", pa.binary(3)),
            ("d32", pa.date32()),
            ("d64", pa.date64()),
            ("ts_utc", pa.timestamp("us", "UTC")),
            ("ts_ns", pa.timestamp("ns", "UTC")),
            ("ts_local", pa.timestamp("ms")),
            ("dec", pa.decimal128(12, 3)),
            ("t64", pa.time64("us")),
            ("t32", pa.time32("ms")),
            ("tags", pa.list_(pa.string())),
            ("point", pa.struct([("x", pa.float64()), ("at", pa.timestamp("ns", "UTC"))])),
            ("attrs", pa.map_(pa.string(), pa.uint16())),
        ]
    )
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    data = pa.table(
        {
            "id": [1, 2],
            "b": [True, None],
            "i8": [-8, None],
            "i16": [-16, None],
            "i32": [-32, None],
            "u8": [255, None],
            "u16": [65535, None],
            "u32": [4294967295, None],
            "f32": [1.5, None],
            "f64": [2.25, None],
            "s": ["é", None],
            "bin": [b"\x00\x01", None],
            "fixed": [b"abc", None],
            "d32": [datetime.date(2024, 2, 29), None],
            "d64": [datetime.date(1970, 1, 2), None],
            "ts_utc": [when, None],
            "ts_ns": [when, None],
            "ts_local": [datetime.datetime(2024, 1, 1, 0, 0, 1, 5000), None],
            "dec": [decimal.Decimal("123456789.123"), None],
            "t64": [datetime.time(23, 59, 59, 999999), None],
            "t32": [datetime.time(1, 2, 3, 4000), None],
            "tags": [["a", None], None],
            "point": [{"x": 1.0, "at": when}, None],
            "attrs": [[("k", 7)], None],
        },
        schema=schema,
    )
    path = str(tmp_path / "types")
    t = oxlake.create_table(path, schema, record_key="id")
    t.insert(data)

    df = oxlake.spark.read(spark, path, with_meta_columns=False)
    got = {f.name: f.dataType for f in df.schema.fields}
    expected_types = {
        "id": T.LongType(),
        "b": T.BooleanType(),
        "i8": T.ByteType(),
        "i16": T.ShortType(),
        "i32": T.IntegerType(),
        "u8": T.ShortType(),
        "u16": T.IntegerType(),
        "u32": T.LongType(),
        "f32": T.FloatType(),
        "f64": T.DoubleType(),
        "s": T.StringType(),
        "bin": T.BinaryType(),
        "fixed": T.BinaryType(),
        "d32": T.DateType(),
        "d64": T.DateType(),
        "ts_utc": T.TimestampType(),
        "ts_ns": T.TimestampType(),
        "ts_local": T.TimestampNTZType(),
        "dec": T.DecimalType(12, 3),
        "tags": T.ArrayType(T.StringType()),
        "point": T.StructType([T.StructField("x", T.DoubleType()), T.StructField("at", T.TimestampType())]),
        "attrs": T.MapType(T.StringType(), T.IntegerType()),
        # Microseconds since midnight, as Spark's Avro reader reads Avro's times.
        "t64": T.LongType(),
        "t32": T.LongType(),
    }
    assert {k: v for k, v in got.items() if k in expected_types} == expected_types

    spark_rows = {r["id"]: r.asDict(recursive=True) for r in df.collect()}
    one = spark_rows[1]
    assert one["u8"] == 255 and one["u16"] == 65535 and one["u32"] == 4294967295
    assert one["s"] == "é" and one["bin"] == b"\x00\x01" and one["fixed"] == b"abc"
    assert one["d32"] == datetime.date(2024, 2, 29) and one["d64"] == datetime.date(1970, 1, 2)
    assert one["ts_utc"].replace(tzinfo=datetime.UTC) == when.replace(tzinfo=None).replace(
        tzinfo=datetime.UTC
    )
    assert one["ts_ns"] == one["ts_utc"]
    assert one["ts_local"] == datetime.datetime(2024, 1, 1, 0, 0, 1, 5000)
    assert one["dec"] == decimal.Decimal("123456789.123")
    assert one["t64"] == 86_399_999_999 and one["t32"] == 3_723_004_000
    assert one["tags"] == ["a", None] and one["point"]["x"] == 1.0 and one["attrs"] == {"k": 7}
    assert all(v is None for k, v in spark_rows[2].items() if k != "id")


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_tables_without_partition_columns_are_written_by_many_tasks(
    spark: SparkSession, tmp_path: Path, table_type: str
) -> None:
    """The tasks look their keys up, a shuffle by file group gives each task whole groups: several
    tasks write, no two write the same group, and duplicates of a key meet in one task."""
    path = str(tmp_path / "t")
    t = oxlake.create_table(path, SCHEMA, record_key="id", ordering_field="ts", table_type=table_type)
    t.insert(trips(list(range(0, 400, 2))), target_file_size=300)
    assert len(t.file_groups()) > 4

    changes = pa.concat_tables(
        [
            trips(list(range(0, 600, 3)), ts=2, name="u"),
            trips([3, 9], ts=5, name="late"),
            trips([3], ts=4, name="old"),
        ]
    )
    df = spark.createDataFrame(changes.to_pandas()).repartition(4)
    # Adaptive execution would coalesce this little data into one task.
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    try:
        result = oxlake.spark.write(df, path, operation="upsert", target_file_size=300)
    finally:
        spark.conf.unset("spark.sql.adaptive.coalescePartitions.enabled")
    expected = {r["id"]: r for r in rows(t.to_arrow())}
    for r in rows(changes):
        if r["id"] not in expected or expected[r["id"]]["ts"] <= r["ts"]:
            expected[r["id"]] = r
    t = oxlake.Table(path)
    assert rows(t.to_arrow()) == sorted(expected.values(), key=lambda r: r["id"])
    assert rows(hudi_read(path)) == rows(t.to_arrow())
    assert result.num_updates + result.num_inserts == len({r["id"] for r in rows(changes)})

    written = [f.rsplit("/", 1)[-1] for f in result.files]
    file_ids = [n.lstrip(".").split("_", 1)[0] for n in written]
    assert len(file_ids) == len(set(file_ids)), written  # no group written twice, nothing merged
    tasks = {n.rsplit("_", 2)[-2 if n.endswith(".parquet") else -1].split("-")[1] for n in written}
    assert len(tasks) > 1, written


@needs_data_source
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_spark_reads_renamed_dropped_and_moved_columns_by_id_at_every_instant(
    spark: SparkSession, source: SparkSession, tmp_path: Path, table_type: str
) -> None:
    """After `update_schema` renames `fare`, drops `name`, adds a `name` of another type and
    moves `price` first, Spark reads every file under the current names and order; time travel
    to each instant reads the columns of then, as the native reader does (both Spark APIs)."""
    path = str(tmp_path / "t")
    t = trips_table(path, table_type=table_type)
    instants = [t.insert(trips(list(range(20)))).instant]
    instants.append(t.upsert(trips([3, 4], ts=2, fare=50.0)).instant)
    with t.update_schema() as u:
        u.rename_column("fare", "price")
        u.delete_column("name")
        u.add_column("name", pa.int64())
        u.move_first("price")
    instants.append(u.instant)
    later = pa.table(
        {
            "price": [99.0, 98.0],
            "id": pa.array([1, 25], pa.int64()),
            "city": ["nyc", "sf"],
            "ts": pa.array([3, 3], pa.int64()),
            "name": pa.array([7, 8], pa.int64()),
        }
    )
    instants.append(t.upsert(later).instant)
    t = oxlake.Table(path)
    data = [f.name for f in t.schema][5:]
    assert data == ["price", "id", "city", "ts", "name"]
    now = from_spark(oxlake.spark.read(spark, path, columns=data))
    assert rows(now) == rows(t.to_arrow(columns=data))
    df = source.read.format("oxlake").option("with_meta_columns", "false").load(path)
    assert df.columns == data
    assert rows(from_spark(df)) == rows(t.to_arrow(columns=data))
    for instant in instants:
        then = [f.name for f in t.schema_as_of(instant)][5:]
        native = t.to_arrow(as_of=instant, columns=then)
        old = (
            source.read.format("oxlake")
            .option("as_of", instant)
            .option("with_meta_columns", "false")
            .load(path)
        )
        assert old.columns == then, instant
        assert rows(from_spark(old)) == rows(native), instant
        mapped = from_spark(oxlake.spark.read(spark, path, as_of=instant, columns=then))
        assert rows(mapped) == rows(native), instant
    # The renamed column's values survive in every file, the new `name` is null in older ones.
    got = {r["id"]: (r["price"], r["name"]) for r in from_spark(df).to_pylist()}
    assert got[1] == (99.0, 7) and got[3] == (53.0, None) and got[0] == (10.0, None)


@needs_data_source
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_distributed_writes_evolve_the_schema_with_schema_mode_merge(
    spark: SparkSession, source: SparkSession, tmp_path: Path, table_type: str
) -> None:
    """Both Spark write paths: strict by default (a new column is refused, the table unchanged);
    with `schema_mode="merge"` the tasks write the evolved schema (a new column, `fare` missing
    and so null) and the commit records it."""
    path = str(tmp_path / "t")
    t = trips_table(path, table_type=table_type)
    t.insert(trips(list(range(10))))
    grown = trips([1, 20], ts=2).append_column("note", pa.array(["n1", "n20"]))
    frame = spark.createDataFrame(grown.to_pandas()).repartition(2)
    with pytest.raises(Exception, match="schema_mode"):
        oxlake.spark.write(frame, path, operation="upsert")
    assert "note" not in oxlake.Table(path).schema.names
    oxlake.spark.write(frame, path, operation="upsert", schema_mode="merge")
    t = oxlake.Table(path)
    assert t.schema.field("note").type == pa.string()
    notes = {r["id"]: r["note"] for r in t.to_arrow(columns=["id", "note"]).to_pylist()}
    assert notes == {**dict.fromkeys(range(10)), 1: "n1", 20: "n20"}

    lean = trips([2, 30], ts=3).drop_columns(["fare"]).append_column("score", pa.array([0.5, 1.5]))
    (
        source.createDataFrame(lean.to_pandas())
        .repartition(2)
        .write.format("oxlake")
        .option("schema_mode", "merge")
        .mode("append")
        .save(path)
    )
    got = {r["id"]: (r["fare"], r["score"]) for r in oxlake.Table(path).to_arrow().to_pylist()}
    assert got[2] == (None, 0.5) and got[30] == (None, 1.5) and got[3] == (13.0, None)


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_spark_writes_a_version_8_table(spark: SparkSession, tmp_path: Path, table_type: str) -> None:
    """Distributed writes (tasks write, the driver commits) on a table of Apache Hudi 1.x's
    version 8: completion-time names, logs named by their deltacommit, Avro commit metadata."""
    path = str(tmp_path / "t")
    trips_table(path, table_type=table_type, table_version=8)
    oxlake.spark.write(spark.createDataFrame(trips(list(range(200))).to_pandas()), path, operation="upsert")
    changed = spark.createDataFrame(trips(list(range(150, 250)), ts=2, name="u").to_pandas())
    r = oxlake.spark.write(changed, path, operation="upsert")
    assert (r.num_inserts, r.num_updates) == (50, 50)
    gone = spark.createDataFrame(trips(list(range(0, 20))).to_pandas())
    assert oxlake.spark.write(gone, path, operation="delete").num_deletes == 20
    expected = rows(trips(list(range(20, 150)))) + rows(trips(list(range(150, 250)), ts=2, name="u"))
    t = oxlake.Table(path)
    assert rows(t.to_arrow()) == sorted(expected, key=lambda r: r["id"]) == rows(hudi_read(path))
    completed = [i for i in t.timeline() if i.state == "completed"]
    assert len(completed) == 3 and all(i.completion and i.completion > i.time for i in completed)
    assert all("_" in p.name for p in Path(path, ".hoodie/timeline").glob("*.*commit"))


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_spark_writes_a_table_partitioned_by_time(
    spark: SparkSession, tmp_path: Path, table_type: str
) -> None:
    """Many `ts` values print as one partition (the hour): the tasks must still own whole file
    groups and every copy of a key, or two would update one group or insert one key twice. The
    write routes rows by file group and key instead of shuffling by the partition column."""
    path = str(tmp_path / "t")
    oxlake.create_table(
        path,
        SCHEMA,
        record_key="id",
        partition_by=["ts:timestamp"],
        ordering_field="fare",
        table_type=table_type,
        key_generator_options={
            "hoodie.keygen.timebased.timestamp.type": "EPOCHMILLISECONDS",
            "hoodie.keygen.timebased.output.dateformat": "yyyy-MM-dd HH",
        },
    )
    hour = 1_705_311_000_000

    def batch(ids: list[int], fare: float, shift: int = 0) -> pa.Table:
        data = trips(ids, fare=fare)
        return data.set_column(3, "ts", pa.array([hour + i * 1000 + shift for i in ids], pa.int64()))

    def frame(data: pa.Table) -> DataFrame:
        return spark.createDataFrame(data.to_pandas()).repartition(8)

    # New keys twice in one input, the copies at other instants of the same hour.
    first = pa.concat_tables([batch(list(range(300)), 5.0, 1), batch(list(range(300)), 10.0)])
    assert oxlake.spark.write(frame(first), path, operation="upsert").num_inserts == 300
    assert oxlake.Table(path).to_arrow().num_rows == 300
    # Every key again, twice, at yet other instants of that hour.
    twice = pa.concat_tables([batch(list(range(300)), 20.0, 2), batch(list(range(300)), 30.0, 3)])
    r = oxlake.spark.write(frame(twice), path, operation="upsert")
    assert (r.num_inserts, r.num_updates) == (0, 300)
    t = oxlake.Table(path)
    got = t.to_arrow()
    assert got.num_rows == 300 and sorted(got["id"].to_pylist()) == list(range(300))
    assert set(got["_hoodie_partition_path"].to_pylist()) == {"ts=2024-01-15 09"}
    assert set(got["fare"].to_pylist()) == {30.0 + i for i in range(300)}
    assert rows(got) == rows(hudi_read(path))


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_write_to_a_table_with_a_global_index_moves_records_between_partitions(
    spark: SparkSession, table_path: str, table_type: str
) -> None:
    """Rows are routed by the file group holding their key, not shuffled by partition columns:
    a key moving from `nyc` to `chennai` is deleted from its old group and inserted in the new
    partition by one task, and a new key given twice with two partitions is one record."""
    t = trips_table(table_path, table_type=table_type, global_index=True)
    t.insert(trips(list(range(10))))
    moved = trips(list(range(10)), ts=5, city="chennai", name="s")
    twice = pa.concat_tables([trips([20], ts=5, city="sf"), trips([20], ts=6, city="nyc", name="late")])
    df = spark.createDataFrame(pa.concat_tables([moved, twice]).to_pandas())
    oxlake.spark.write(df, table_path, operation="upsert")
    got = rows(oxlake.Table(table_path).scan())
    assert [(r["id"], r["city"], r["name"]) for r in got] == [
        *[(i, "chennai", f"s{i}") for i in range(10)],
        (20, "nyc", "late20"),
    ]
