"""Spark Structured Streaming: oxlake as an exactly-once sink (the `oxlake` data source's stream
writer, and `foreachBatch` with `oxlake.spark.write_batch`) and as a change-stream source
(`readStream.format("oxlake")`), on a real Spark session (`local[2]`) whose session time zone is
not UTC; and Spark's types, timestamps included, through every write path.

A batch replayed after a failure is made the way Spark makes one: the query's last entry under
`<checkpoint>/commits/` is removed (as if the driver died after the table's commit, before
Spark's), and the query restarted from its checkpoint runs that batch again."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import oxlake
import oxlake.spark
import pyarrow as pa
import pytest
from conftest import hudi_read
from seaweed import SeaweedS3

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

ZONE = "America/Los_Angeles"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("oxlake-streaming-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", ZONE)
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    if hasattr(session, "dataSource"):
        oxlake.spark.register(session)
    yield session
    session.stop()


SPARK = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
needs_data_source = pytest.mark.skipif(SPARK < (4, 0), reason="Python data sources need Spark 4")
needs_streaming_source = pytest.mark.skipif(
    SPARK < (4, 1), reason="Python streaming data sources with Arrow writers need Spark 4.1"
)

EVENT = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("city", T.StringType(), True),
        T.StructField("ts", T.LongType(), True),
        T.StructField("v", T.StringType(), True),
    ]
)


def drop(source: Path, name: str, rows: list[tuple[int, str, int, str]]) -> None:
    """A new JSON file of `rows` in the file source's directory."""
    source.mkdir(parents=True, exist_ok=True)
    tmp = source / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(dict(zip(EVENT.names, r, strict=True))) + "\n" for r in rows))
    tmp.rename(source / f"{name}.json")


def table_rows(uri: str) -> dict[int, tuple[str, int, str]]:
    t = oxlake.Table(uri).to_arrow(columns=["id", "city", "ts", "v"])
    return {r["id"]: (r["city"], r["ts"], r["v"]) for r in t.to_pylist()}


def forget_last_batch(checkpoint: Path) -> int:
    """Removes Spark's record that its last batch committed; returns that batch id."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(commits[-1])).unlink()
    (checkpoint / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)
    return commits[-1]


def checkpoints_of(uri: str) -> list[int]:
    t = oxlake.Table(uri)
    out = []
    for i in t.timeline():
        if i.state == "completed" and i.action in ("commit", "deltacommit"):
            recorded = t.extra_metadata(i.time).get(oxlake.spark.SINK_CHECKPOINT_KEY)
            if recorded:
                out.append(int(json.loads(recorded)[oxlake.spark.DEFAULT_CHECKPOINT_IDENTIFIER]))
    return out


def run_foreach_batch(spark: SparkSession, source: Path, uri: str, checkpoint: Path, **options: Any) -> None:
    """Runs the file source's new files into `uri` through `write_batch` (merge-on-read unless
    `options` say otherwise)."""

    def sink(df: DataFrame, batch_id: int) -> None:
        written = {"table_type": "merge_on_read", **options}
        oxlake.spark.write_batch(
            df, batch_id, uri, record_key="id", partition_by=["city"], ordering_field="ts", **written
        )

    query = (
        spark.readStream.schema(EVENT)
        .json(str(source))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_foreach_batch_writes_each_micro_batch_once(spark: SparkSession, tmp_path: Path) -> None:
    source, uri, checkpoint = tmp_path / "in", str(tmp_path / "t"), tmp_path / "cp"
    drop(source, "a", [(1, "sf", 1, "a1"), (2, "nyc", 1, "a2")])
    run_foreach_batch(spark, source, uri, checkpoint)
    drop(source, "b", [(2, "nyc", 2, "b2"), (3, "sf", 1, "b3")])
    run_foreach_batch(spark, source, uri, checkpoint)
    assert checkpoints_of(uri) == [0, 1]
    # The driver died after the table's commit of batch 1, before Spark's: batch 1 runs again.
    assert forget_last_batch(checkpoint) == 1
    run_foreach_batch(spark, source, uri, checkpoint)
    assert checkpoints_of(uri) == [0, 1], "the replayed batch is not committed twice"
    expected = {1: ("sf", 1, "a1"), 2: ("nyc", 2, "b2"), 3: ("sf", 1, "b3")}
    assert table_rows(uri) == expected
    assert {r["id"]: r["v"] for r in hudi_read(uri).to_pylist()} == {k: v[2] for k, v in expected.items()}


def test_write_batch_skips_a_batch_the_table_holds(spark: SparkSession, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    df = spark.createDataFrame([(1, "sf", 1, "x")], EVENT)
    first = oxlake.spark.write_batch(df, 7, uri, operation="insert", record_key="id", ordering_field="ts")
    assert first is not None and first.instant is not None
    assert oxlake.spark.write_batch(df, 7, uri, operation="insert") is None
    assert oxlake.spark.write_batch(df, 3, uri, operation="insert") is None
    # Another query, named apart, writes its own batch 7.
    other = oxlake.spark.write_batch(df, 7, uri, operation="upsert", checkpoint_identifier="other")
    assert other is not None
    t = oxlake.Table(uri)
    assert (
        t.extra_metadata(first.instant)[oxlake.spark.SINK_CHECKPOINT_KEY] == '{"default_single_writer": "7"}'
    )
    assert oxlake.spark.committed_batch(t) == 7 and oxlake.spark.committed_batch(t, "other") == 7
    assert oxlake.spark.committed_batch(t, "nobody") is None
    assert t.to_arrow().num_rows == 1


def test_extra_metadata_cannot_replace_the_schema(tmp_path: Path) -> None:
    t = oxlake.create_table(str(tmp_path / "t"), pa.schema([("id", pa.int64())]), record_key="id")
    with pytest.raises(oxlake.InvalidArgumentError, match="schema"):
        t.insert(pa.table({"id": [1]}), extra_metadata={"schema": "{}"})
    assert t.timeline() == [] or all(i.state == "completed" for i in t.timeline())
    assert t.to_arrow().num_rows == 0
    r = t.insert(pa.table({"id": [1]}), extra_metadata={"job": "nightly", "√ %/": "ünï"})
    assert r.instant is not None
    meta = t.extra_metadata(r.instant)
    assert meta["job"] == "nightly" and meta["√ %/"] == "ünï" and "schema" in meta


@pytest.mark.parametrize("version", [6, 8])
def test_a_batch_whose_driver_died_after_deciding_to_commit_is_seen_committed(
    tmp_path: Path, version: int
) -> None:
    """A driver killed after it decided to commit a batch (its fate recorded, the completed file
    not yet written), and the query restarted before its heartbeat expired: the sinks' check
    completes the decided write first, so the batch is seen as committed and not written again
    (the stream stress test wrote such a batch twice). A plain `rollback_failed` leaves a write
    whose writer may be alive to it."""
    import subprocess

    path = str(tmp_path / "t")
    t = oxlake.create_table(path, pa.schema([("id", pa.int64())]), record_key="id", table_version=version)
    t.insert(pa.table({"id": [0]}))
    checkpoint = json.dumps({oxlake.spark.SINK_CHECKPOINT_KEY: json.dumps({"default": "41"})})
    code = (
        "import json, sys, oxlake, pyarrow as pa\n"
        "t = oxlake.Table(sys.argv[1], heartbeat_interval=60)\n"
        "t.insert(pa.table({'id': [1, 2]}), extra_metadata=json.loads(sys.argv[2]))\n"
    )
    env = {**os.environ, "OXLAKE_FAILPOINT": "after-fate"}
    proc = subprocess.run([sys.executable, "-c", code, path, checkpoint], env=env, capture_output=True)
    assert proc.returncode != 0
    t = oxlake.Table(path, heartbeat_interval=60)
    assert [i.state for i in t.timeline()][-1] != "completed"
    assert t.rollback_failed() == []
    assert oxlake.spark.committed_batch(t, "default") is None, "still pending: its writer may be alive"
    assert t.rollback_failed(complete_decided=True) == []
    t = oxlake.Table(path)
    assert [i.state for i in t.timeline()] == ["completed", "completed"]
    assert oxlake.spark.committed_batch(t, "default") == 41
    assert sorted(t.to_arrow()["id"].to_pylist()) == [0, 1, 2]
    assert t.validate().ok


@pytest.mark.parametrize("version", [6, 8])
def test_a_checkpoint_archived_by_other_writers_is_still_found(tmp_path: Path, version: int) -> None:
    """A stream's last commit archived (other writers and services committed more than archival
    keeps since): its batch is still known, so a replay of it is skipped, not written again."""
    t = oxlake.create_table(
        str(tmp_path / "t"),
        pa.schema([("id", pa.int64())]),
        record_key="id",
        table_version=version,
        metadata=False,
    )
    t.set_archival(2, 3)
    checkpoint = {
        oxlake.spark.SINK_CHECKPOINT_KEY: json.dumps({oxlake.spark.DEFAULT_CHECKPOINT_IDENTIFIER: "41"})
    }
    streamed = t.insert(pa.table({"id": [0]}), extra_metadata=checkpoint).instant
    assert streamed is not None
    for i in range(1, 8):
        t.upsert(pa.table({"id": [i]}))
    assert streamed not in [i.time for i in t.timeline()], "the stream's commit is archived"
    assert streamed in [i.time for i in t.timeline(include_archived=True)]
    assert (
        t.extra_metadata(streamed)[oxlake.spark.SINK_CHECKPOINT_KEY]
        == checkpoint[oxlake.spark.SINK_CHECKPOINT_KEY]
    )
    assert oxlake.spark.committed_batch(oxlake.Table(str(tmp_path / "t"))) == 41
    assert oxlake.spark.committed_batch(t, "another query") is None
    with pytest.raises(oxlake.InvalidArgumentError, match="not a completed commit"):
        t.extra_metadata("20000101000000000")


def run_sink(spark: SparkSession, source: Path, uri: str, checkpoint: Path) -> None:
    query = (
        spark.readStream.schema(EVENT)
        .json(str(source))
        .writeStream.format("oxlake")
        .option("record_key", "id")
        .option("partition_by", "city")
        .option("ordering_field", "ts")
        .option("operation", "upsert")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(uri)
    )
    query.awaitTermination(120)
    assert query.exception() is None


@needs_streaming_source
def test_the_stream_sink_commits_each_micro_batch_once(spark: SparkSession, tmp_path: Path) -> None:
    source, uri, checkpoint = tmp_path / "in", str(tmp_path / "t"), tmp_path / "cp"
    drop(source, "a", [(1, "sf", 1, "a1"), (2, "nyc", 1, "a2")])
    run_sink(spark, source, uri, checkpoint)
    drop(source, "b", [(2, "nyc", 2, "b2"), (3, "sf", 1, "b3"), (1, "sf", 0, "stale")])
    run_sink(spark, source, uri, checkpoint)
    assert checkpoints_of(uri) == [0, 1]
    assert forget_last_batch(checkpoint) == 1
    run_sink(spark, source, uri, checkpoint)
    assert checkpoints_of(uri) == [0, 1]
    expected = {1: ("sf", 1, "a1"), 2: ("nyc", 2, "b2"), 3: ("sf", 1, "b3")}
    assert table_rows(uri) == expected
    assert {r["id"]: r["v"] for r in hudi_read(uri).to_pylist()} == {k: v[2] for k, v in expected.items()}


COPIED = pa.schema([("id", pa.int64()), ("city", pa.string()), ("ts", pa.int64()), ("v", pa.string())])


def changing_table(uri: str) -> Callable[[list[tuple[int, str, int, str]]], None]:
    """A new table of `COPIED` rows at `uri`, and a function upserting (id, city, ts, v) rows."""
    t = oxlake.create_table(uri, COPIED, record_key="id", partition_by=["city"], ordering_field="ts")

    def write(rows: list[tuple[int, str, int, str]]) -> None:
        t.upsert(pa.Table.from_pylist([dict(zip(COPIED.names, r, strict=True)) for r in rows], schema=COPIED))

    return write


def copy_batch(df: DataFrame, batch_id: int, copy: str) -> None:
    """A micro-batch of the change stream upserted into the table at `copy`."""
    oxlake.spark.write_batch(
        df.drop("_change_type"), batch_id, copy, record_key="id", partition_by=["city"], ordering_field="ts"
    )


@needs_streaming_source
def test_the_stream_source_reads_each_commit_once(spark: SparkSession, tmp_path: Path) -> None:
    """A downstream query copies the change stream of one table into another: after each run
    the copy equals the table; `maxInstantsPerTrigger` bounds each micro-batch."""
    uri, copy, checkpoint = str(tmp_path / "t"), str(tmp_path / "copy"), tmp_path / "cp"
    write = changing_table(uri)
    batches: list[int] = []

    def sink(df: DataFrame, batch_id: int) -> None:
        batches.append(df.count())
        copy_batch(df, batch_id, copy)

    def run(**options: str) -> None:
        reader = spark.readStream.format("oxlake").option("with_meta_columns", "false")
        for k, v in options.items():
            reader = reader.option(k, v)
        # Not `availableNow`: Spark reads everything available in one batch then, whatever the
        # source's read limit.
        query = (
            reader.load(uri)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="10 milliseconds")
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        assert query.exception() is None

    write([(1, "sf", 1, "a"), (2, "nyc", 1, "a")])
    write([(2, "nyc", 2, "b")])
    write([(3, "sf", 1, "c")])
    run(maxInstantsPerTrigger="1")
    assert table_rows(copy) == table_rows(uri)
    write([(1, "sf", 5, "d")])
    write([(4, "la", 1, "d"), (5, "la", 1, "e")])
    run(maxInstantsPerTrigger="1")
    assert table_rows(copy) == table_rows(uri)
    run(maxInstantsPerTrigger="1")  # nothing new: no batch
    # The table as it was (three keys), then one commit per micro-batch.
    expected = [3, 1, 2] if SPARK >= (4, 2) else [3, 3]
    assert [b for b in batches if b] == expected


@needs_streaming_source
def test_an_available_now_run_goes_on_past_a_replayed_batch(spark: SparkSession, tmp_path: Path) -> None:
    """`availableNow` reads every commit there is at the start, in micro-batches of
    `maxInstantsPerTrigger`, also when the run begins by replaying a batch the last run planned
    but did not finish (killed between Spark's offset and commit logs). Spark runs a source that
    cannot prepare for `availableNow` as `once`: that run ended after the replay, the newer commits
    left out of the copy (found by the streaming stress suite)."""
    uri, copy, checkpoint = str(tmp_path / "t"), str(tmp_path / "copy"), tmp_path / "cp"
    write = changing_table(uri)
    batches: list[int] = []

    def sink(df: DataFrame, batch_id: int) -> None:
        batches.append(batch_id)
        copy_batch(df, batch_id, copy)

    def run() -> None:
        query = (
            spark.readStream.format("oxlake")
            .option("with_meta_columns", "false")
            .option("maxInstantsPerTrigger", "1")
            .load(uri)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    write([(1, "sf", 1, "a"), (2, "nyc", 1, "a")])
    write([(2, "nyc", 2, "b")])
    run()  # the table as it is: one batch
    write([(3, "sf", 1, "c")])
    write([(1, "sf", 5, "d")])
    run()  # two commits, one per batch
    assert table_rows(copy) == table_rows(uri)
    assert batches == [0, 1, 2]
    # The last run "killed" after its offset log entry for batch 2 and before its commit log one.
    for done in (checkpoint / "commits" / "2", checkpoint / "commits" / ".2.crc"):
        done.unlink(missing_ok=True)
    write([(4, "la", 1, "e")])
    run()  # batch 2 replayed (already in the copy: skipped), then the new commit
    assert batches == [0, 1, 2, 2, 3]
    assert table_rows(copy) == table_rows(uri)
    assert oxlake.Table(copy).to_arrow().num_rows == 4


@needs_streaming_source
def test_the_stream_source_refuses_a_window_a_clean_removed(spark: SparkSession, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64())])
    t = oxlake.create_table(uri, schema, record_key="id", ordering_field="ts")
    first = t.upsert(pa.table({"id": [1], "ts": [0]}, schema=schema))
    for i in range(1, 4):
        t.upsert(pa.table({"id": [1], "ts": [i]}, schema=schema))
    t.clean(policy="keep_latest_commits", retain=1)
    # The window after the first commit needs the second commit's file, which the clean removed.
    query = (
        spark.readStream.format("oxlake")
        .option("starting", first.completion or first.instant)
        .option("maxInstantsPerTrigger", "1")
        .load(uri)
        .writeStream.format("memory")
        .queryName("cleaned")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        with pytest.raises(Exception, match="starting"):
            query.processAllAvailable()
    finally:
        query.stop()


@needs_streaming_source
@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("maxInstantsPerTrigger", "0", "maxInstantsPerTrigger must be at least 1"),
        ("maxInstantsPerTrigger", "many", "option maxInstantsPerTrigger must be an integer"),
        ("starting", "yesterday", "option starting: expected earliest, latest or an instant time"),
        ("query", "snapshot", "a streaming read takes query 'incremental' or 'changes'"),
        ("split_bytes", "1MB", "option split_bytes must be an integer"),
    ],
)
def test_a_bad_stream_option_fails_the_query_naming_it(
    spark: SparkSession, tmp_path: Path, option: str, value: str, says: str
) -> None:
    """A bad option of the stream source fails the query with a message naming the option; the
    table is left as it was."""
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64())])
    t = oxlake.create_table(uri, schema, record_key="id", ordering_field="ts")
    t.upsert(pa.table({"id": [1], "ts": [0]}, schema=schema))
    before = [(i.time, i.state) for i in t.timeline()]

    def start() -> Any:
        return (
            spark.readStream.format("oxlake")
            .option(option, value)
            .load(uri)
            .writeStream.format("memory")
            .queryName(f"bad_{option}_{abs(hash(value))}")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .start()
        )

    with pytest.raises(Exception, match=says):  # noqa: PT012 (Spark raises at start or in the run)
        query = start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    assert [(i.time, i.state) for i in oxlake.Table(uri).timeline()] == before


# ---- Spark's types through every write path ------------------------------------------------

TYPES = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("flag", T.BooleanType()),
        T.StructField("i32", T.IntegerType()),
        T.StructField("f32", T.FloatType()),
        T.StructField("f64", T.DoubleType()),
        T.StructField("dec", T.DecimalType(12, 3)),
        T.StructField("s", T.StringType()),
        T.StructField("bin", T.BinaryType()),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("local", T.TimestampNTZType()),
        T.StructField("tags", T.ArrayType(T.IntegerType())),
        T.StructField(
            "inner",
            T.StructType([T.StructField("n", T.IntegerType()), T.StructField("at", T.TimestampType())]),
        ),
    ]
)


def typed_rows() -> list[tuple]:
    # Wall-clock values in the session's zone, one of them in the hour daylight saving repeats.
    at = datetime.datetime(2026, 11, 1, 1, 30, 15, 123456)
    local = datetime.datetime(2026, 3, 8, 2, 30, 0, 1)
    return [
        (
            i,
            i % 2 == 0,
            i,
            1.5,
            2.25,
            decimal.Decimal("123456789.125"),
            f"s√{i}",
            b"\x00\xff",
            datetime.date(2026, 2, 28),
            at + datetime.timedelta(hours=i),
            local,
            [1, None, 3],
            (i, at),
        )
        for i in range(3)
    ]


@pytest.mark.parametrize("path", ["write", "data_source"])
def test_every_spark_type_round_trips_in_the_session_time_zone(
    spark: SparkSession, tmp_path: Path, path: str
) -> None:
    """`oxlake.spark.write` and `df.write.format("oxlake")` took no timestamp column (PySpark's
    `to_arrow_schema` asserted a time zone); timestamps are the instants Spark holds."""
    uri = str(tmp_path / "t")
    df = spark.createDataFrame(typed_rows(), TYPES)
    if path == "write":
        oxlake.spark.write(df, uri, operation="insert", record_key="id")
    else:
        if not hasattr(spark, "dataSource"):
            pytest.skip("Python data sources need Spark 4")
        df.write.format("oxlake").option("record_key", "id").option("operation", "insert").mode(
            "append"
        ).save(uri)
    back = oxlake.spark.read(spark, uri, with_meta_columns=False)
    assert sorted(back.collect(), key=lambda r: r["id"]) == sorted(df.collect(), key=lambda r: r["id"])
    # The stored values are the instants Spark holds (microseconds since the epoch), and the
    # wall-clock values of timestamps without a zone.
    stored = oxlake.Table(uri).to_arrow(columns=["id", "at", "local"]).sort_by("id")
    held = df.selectExpr("unix_micros(at) AS at", "CAST(local AS STRING) AS local").orderBy("id").collect()
    assert stored.column("at").type == pa.timestamp("us", "UTC")
    assert stored.column("at").cast(pa.int64()).to_pylist() == [r["at"] for r in held]
    assert [str(v) for v in stored.column("local").to_pylist()] == [r["local"] for r in held]
    # Read back by Spark in another session time zone: the same instants.
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        again = oxlake.spark.read(spark, uri, with_meta_columns=False).selectExpr("unix_micros(at) AS at")
        assert sorted(r["at"] for r in again.collect()) == sorted(r["at"] for r in held)
    finally:
        spark.conf.set("spark.sql.session.timeZone", ZONE)
    shutil.rmtree(uri)


@needs_data_source
@pytest.mark.parametrize("version", [6, 8])
def test_the_stream_source_never_passes_a_write_that_completes_late(tmp_path: Path, version: int) -> None:
    """A write that began before another and commits after it: on version 6 its window bound
    (its requested time) is older than the other's, so the source offers nothing past it while it
    is pending; on version 8 it completes after every bound already offered. Either way each
    micro-batch of the stream sees it exactly once."""
    from conftest import run_paused, trips, trips_table
    from oxlake.spark_source import OxlakeStreamReader, _Options

    uri = str(tmp_path / "t")
    t = trips_table(uri, table_version=version)
    t.insert(trips([0]))
    here = str(Path(__file__).parent)
    code = f"import sys, oxlake\nsys.path.insert(0, {here!r})\nfrom conftest import trips\n"
    code += "oxlake.Table(sys.argv[1]).upsert(trips([1], name='late'))\n"
    held = run_paused(uri, "before-commit", code, tmp_path)
    t.upsert(trips([2], name="early"))
    opts = _Options.of({"path": uri, "with_meta_columns": "false"})
    reader = OxlakeStreamReader(opts, None, oxlake.Table(uri).schema)

    def batch(start: dict, end: dict) -> list[int]:
        return sorted(
            i
            for p in reader.partitions(start, end)
            for b in reader.read(p)
            for i in b.column("id").to_pylist()
        )

    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    seen = batch(start, first) if first != start else []
    (tmp_path / "resume").touch()
    held.communicate(timeout=60)
    assert held.returncode == 0
    second = reader.latestOffset(first, None)
    seen += batch(first, second)
    assert sorted(seen) == [0, 1, 2], "every write once, the late one included"
    assert reader.latestOffset(second, None) == second


@needs_data_source
def test_the_stream_source_goes_on_across_an_upgrade_to_version_8(tmp_path: Path) -> None:
    """An offset taken on a version 6 table (a requested time) stays valid after `upgrade(8)`,
    whose windows are completion times: nothing is read twice, nothing skipped."""
    from conftest import trips, trips_table
    from oxlake.spark_source import OxlakeStreamReader, _Options

    uri = str(tmp_path / "t")
    t = trips_table(uri, table_version=6)
    t.insert(trips([0, 1]))
    t.upsert(trips([1], ts=2, name="b"))
    reader = OxlakeStreamReader(_Options.of({"path": uri, "with_meta_columns": "false"}), None, t.schema)

    def batch(start: dict, end: dict) -> list[tuple[int, str]]:
        return sorted(
            (r["id"], r["name"])
            for p in reader.partitions(start, end)
            for b in reader.read(p)
            for r in b.to_pylist()
        )

    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    assert first["by"] == "requested"
    assert batch(start, first) == [(0, "n0"), (1, "b1")]
    t.upgrade(8)
    t.upsert(trips([2], name="c"))
    second = reader.latestOffset(first, None)
    assert second["by"] == "completion"
    assert batch(first, second) == [(2, "c2")]
    assert reader.latestOffset(second, None) == second


@pytest.fixture(scope="module")
def s3() -> Iterator[SeaweedS3]:
    with SeaweedS3() as server:
        server.create_bucket("lake")
        yield server


@needs_streaming_source
def test_a_stream_into_and_out_of_s3(spark: SparkSession, s3: SeaweedS3, tmp_path: Path) -> None:
    """The sink (foreachBatch with `write_batch`) and the source on the S3 server: a replayed
    batch is skipped, and a downstream query copying the table's commits ends equal to it."""
    opts = s3.storage_options()
    source, checkpoint, uri = tmp_path / "in", tmp_path / "cp", "s3://lake/stream"

    def run() -> None:
        run_foreach_batch(spark, source, uri, checkpoint, table_type="copy_on_write", storage_options=opts)

    def rows_of(uri: str, storage_options: dict[str, str] | None) -> dict[int, tuple[str, int, str]]:
        data = oxlake.Table(uri, storage_options=storage_options).to_arrow(columns=["id", "city", "ts", "v"])
        return {r["id"]: (r["city"], r["ts"], r["v"]) for r in data.to_pylist()}

    drop(source, "a", [(1, "sf", 1, "a1"), (2, "nyc", 1, "a2")])
    run()
    drop(source, "b", [(2, "nyc", 2, "b2"), (3, "sf", 1, "b3")])
    run()
    assert forget_last_batch(checkpoint) == 1
    run()
    t = oxlake.Table(uri, storage_options=opts)
    recorded = [t.extra_metadata(i.time).get(oxlake.spark.SINK_CHECKPOINT_KEY) for i in t.timeline()]
    assert [json.loads(r)[oxlake.spark.DEFAULT_CHECKPOINT_IDENTIFIER] for r in recorded if r] == ["0", "1"]
    expected = {1: ("sf", 1, "a1"), 2: ("nyc", 2, "b2"), 3: ("sf", 1, "b3")}
    assert rows_of(uri, opts) == expected

    copy = str(tmp_path / "copy")

    def copy_sink(df: DataFrame, batch_id: int) -> None:
        oxlake.spark.write_batch(
            df, batch_id, copy, record_key="id", partition_by=["city"], ordering_field="ts"
        )

    reader = spark.readStream.format("oxlake").option("with_meta_columns", "false")
    for k, v in opts.items():
        reader = reader.option(f"storage.{k}", v)
    query = (
        reader.load(uri)
        .writeStream.foreachBatch(copy_sink)
        .option("checkpointLocation", str(tmp_path / "cp2"))
        .trigger(processingTime="10 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert rows_of(copy, None) == expected
