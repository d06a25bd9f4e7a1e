"""oxlake tables from PySpark: reads planned on the driver and read natively by the executors
(`mapInArrow`), and writes whose files the executors write and whose one commit the driver makes.

Reading: the driver plans the query once (metadata only, no data file is opened) and cuts it into
splits of whole file slices, about `split_bytes` each; one Spark task reads each split with the
native reader, streaming Arrow batches. Every task reads the table state the driver planned.

Writing: the driver begins the instant; the rows are repartitioned by the table's partition
columns, so that each task owns whole partitions (and so disjoint file groups); a table without
partition columns is routed instead: the tasks look their keys up, and a shuffle by file group
(new keys by key) gives each task whole file groups. Each task writes its base files and log
blocks natively and returns what it wrote; the driver commits everything as one instant. A
failed job rolls back every file it wrote, and files left by failed task attempts never become
visible.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from oxlake import _native
from oxlake._engine import DEFAULT_SPLIT_BYTES, native, read_columns, require, result_schema
from oxlake._spark_io import (
    arrow_schema_of,
    as_spark,
    check_sort_mode,
    compact_if_due,
    compact_on_executors,
    from_spark,
    open_or_create,
    spark_reader,
    task_id,
)
from oxlake._spark_io import spark_arrow_schema as spark_arrow_schema  # re-exported: public
from oxlake._spark_io import spark_schema as spark_schema
from oxlake.table import (
    CompactionResult,
    FilterLike,
    Instant,
    Operation,
    QueryType,
    SchemaMode,
    SortMode,
    Split,
    Table,
    WriteResult,
    _filter,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

require("pyspark", needed_by="oxlake.spark")


#: A function of the batches a read task reads, as the native reader gives them, and the
#: schema it gives them in, from the read's (`read(mapped=)`).
BatchMap = tuple[Callable[[pa.RecordBatch], pa.RecordBatch], Callable[[pa.Schema], pa.Schema]]


def read(
    spark: SparkSession,
    uri: str,
    *,
    columns: Sequence[str] | None = None,
    filter: FilterLike | None = None,
    as_of: str | None = None,
    query: QueryType = "snapshot",
    start: str | None = None,
    end: str | None = None,
    storage_options: dict[str, str] | None = None,
    with_meta_columns: bool = True,
    batch_size: int = 65536,
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    mapped: BatchMap | None = None,
) -> DataFrame:
    """The table as a Spark DataFrame (queries as `Table.scan`). Partition and statistics
    pruning run natively: partitions the filter rules out get no task, and each task reads only
    the columns asked for. A table of fewer files than Spark's default parallelism has its
    files cut by rows, so that every core reads a part.

    `mapped` = (function, its schema from the read's): each batch passes through the function
    in the reading task, before Spark's types, so a value Spark cannot hold (nanoseconds, times
    of day, unsigned integers) reaches it as the table holds it."""
    table = Table(uri, storage_options)
    cols = read_columns(table, columns, with_meta_columns, query, as_of)
    parallelism = spark.sparkContext.defaultParallelism
    splits = table.splits(
        columns=cols,
        filter=filter,
        as_of=as_of,
        query=query,
        start=start,
        end=end,
        target_bytes=split_bytes,
        min_splits=parallelism,
    )
    schema = result_schema(table, cols, query, as_of)
    fn, out = (None, schema) if mapped is None else (mapped[0], mapped[1](schema))
    rows = [(i, s.data) for i, s in enumerate(splits)]
    descriptors = spark.sparkContext.parallelize(rows, len(rows)).toDF("split_id int, split binary")
    filt = _filter(filter)

    def read_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reader = Table(uri, storage_options)
        for batch in batches:
            for data in batch.column("split").to_pylist():
                read = reader.scan_split(Split(data, 0, 0), columns=cols, filter=filt, batch_size=batch_size)
                yield from as_spark(iter(read) if fn is None else map(fn, read), out)

    return descriptors.mapInArrow(read_splits, spark_schema(out))


def write(
    df: DataFrame,
    uri: str,
    *,
    operation: Operation = "upsert",
    storage_options: dict[str, str] | None = None,
    target_file_size: int | None = None,
    schema_mode: SchemaMode | None = None,
    extra_metadata: Mapping[str, str] | None = None,
    sort_mode: SortMode | None = None,
    **create_options: Any,
) -> WriteResult:
    """Writes a Spark DataFrame into the table at `uri` as one commit (`operation`: upsert,
    insert, bulk_insert, delete, insert_overwrite or insert_overwrite_table). A `bulk_insert`
    (see `Table.bulk_insert`) is not shuffled: each task writes new files of the rows it holds;
    with `sort_mode="global_sort"` the frame is sorted by partition and record key first (each
    file then holds a narrow key range), with `"partition_sort"` each task sorts its own rows.
    The table is created on first
    write with `create_options` (those of `oxlake.create_table`: `record_key`, `partition_by`,
    `ordering_field`, `table_type`, ...). `schema_mode` as for `Table.upsert`: strict by default,
    `"merge"` evolves the table's schema (new nullable columns, wider types, missing columns
    null). `extra_metadata` is recorded in the commit (see `Table.upsert`). On any failure the
    write is rolled back and the table stays as it was."""
    check_sort_mode(operation, sort_mode)
    arrow_schema = arrow_schema_of(df.schema)
    table = open_or_create(uri, arrow_schema, storage_options, create_options)
    partition_by = _shuffle_columns(table.properties)
    pending = _native.begin_write(native(table), operation)
    instant = pending.instant
    try:
        # Each task owns whole partitions, or (no partition columns) whole file groups and new
        # keys: the file groups tasks write are disjoint. A bulk insert makes new file groups
        # only: tasks write whatever rows they hold.
        if operation == "bulk_insert":
            data = _bulk_ordered(df, table.properties, partition_by, sort_mode)
        elif partition_by:
            data = df.repartition(*partition_by)
        else:
            data = _routed(df, uri, operation, storage_options, arrow_schema)

        def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            # Streamed: a task's rows past a chunk are spilled (or, bulk inserted, written a
            # chunk at a time), never held whole.
            rows = spark_reader(batches, arrow_schema)
            writer = Table(uri, storage_options)
            task = task_id(TaskContext.get())
            written = _native.write_files_stream(
                native(writer), operation, instant, rows, None, target_file_size, task, schema_mode, sort_mode
            )
            yield pa.RecordBatch.from_pydict({"written": pa.array(written, pa.binary())})

        parts = [r["written"] for r in data.mapInArrow(write_partition, "written binary").collect()]
        extra = dict(extra_metadata) if extra_metadata is not None else None
        # A compaction that is due runs on the executors, below, not on the driver.
        landed, inserts, updates, deletes, files, completion = pending.commit(
            [bytes(p) for p in parts], extra, compact_inline=False
        )
    except BaseException:
        pending.abort()
        raise
    compact_if_due(df.sparkSession, uri, storage_options)
    return WriteResult(landed, inserts, updates, deletes, list(files), completion)


_ROUTE = "_oxlake_route"


def _bulk_ordered(
    df: DataFrame, properties: Mapping[str, str], partition_by: Sequence[str], sort_mode: str | None
) -> DataFrame:
    """The rows of a bulk insert as its tasks take them: as they are, or (`global_sort`) sorted
    by partition columns and record key across the frame, so each task holds a key range."""
    from pyspark.sql import functions as F

    if (sort_mode or "none").lower() != "global_sort":
        return df
    # Keys compare as the strings they are stored as (Hudi sorts `partition path + key`).
    keys = [
        F.col(k).cast("string") for k in properties.get("hoodie.table.recordkey.fields", "").split(",") if k
    ]
    return df.sort(*partition_by, *keys)


#: The commit's extra-metadata key of a streaming writer's checkpoint, as Apache Hudi's
#: `HoodieStreamingSink` records it: a JSON object of writer identifier to its last batch id.
SINK_CHECKPOINT_KEY = "_hudi_streaming_sink_checkpoint"
#: The identifier of a streaming writer that names none (Apache Hudi's default).
DEFAULT_CHECKPOINT_IDENTIFIER = "default_single_writer"


def write_batch(
    df: DataFrame,
    batch_id: int,
    uri: str,
    *,
    operation: Operation = "upsert",
    checkpoint_identifier: str = DEFAULT_CHECKPOINT_IDENTIFIER,
    storage_options: dict[str, str] | None = None,
    **options: Any,
) -> WriteResult | None:
    """Writes one micro-batch of a streaming query (`foreachBatch`) as one commit, exactly once:
    the commit records `batch_id` under `checkpoint_identifier` (Apache Hudi's streaming sink
    checkpoint, `_hudi_streaming_sink_checkpoint`), and a batch the table already holds (replayed
    after a failure between the commit and Spark's own checkpoint) is skipped: returns None.
    Tasks write natively on the executors, as `write` (whose `options` it takes)::

        stream.writeStream.foreachBatch(
            lambda df, batch_id: oxlake.spark.write_batch(df, batch_id, uri, record_key="id")
        ).option("checkpointLocation", ...).start()

    Give each streaming query writing the table its own `checkpoint_identifier`."""
    try:
        table: Table | None = Table(uri, storage_options)
    except _native.TableNotFoundError:
        table = None
    if table is not None:
        # An earlier attempt at this batch whose driver died after deciding to commit is
        # completed (or rolled back) first, so that it is seen below.
        table.rollback_failed(complete_decided=True)
        done = committed_batch(table, checkpoint_identifier)
        if done is not None and batch_id <= done:
            return None
    checkpoint = {SINK_CHECKPOINT_KEY: json.dumps({checkpoint_identifier: str(batch_id)})}
    return write(
        df, uri, operation=operation, storage_options=storage_options, extra_metadata=checkpoint, **options
    )


def compact(
    spark: SparkSession,
    uri: str,
    *,
    min_log_files: int = 1,
    storage_options: dict[str, str] | None = None,
) -> CompactionResult:
    """Compacts a merge-on-read table as `Table.compact` does, with the merging on the
    executors: the driver plans (and takes up plans left pending), one Spark task per group of
    file slices writes their new base files natively, the driver commits each plan. Writers may
    keep writing meanwhile. A failed task fails the job and rolls the compaction back; its plan
    runs at the next compaction. `write` and `write_batch` compact this way when the table's
    `inline_compaction` setting says a compaction is due."""
    return compact_on_executors(spark, uri, storage_options, min_log_files)


def committed_batch(table: Table, identifier: str = DEFAULT_CHECKPOINT_IDENTIFIER) -> int | None:
    """The last batch id the streaming writer `identifier` committed to `table`: from the newest
    commit recording one, as Apache Hudi's `CommitUtils.getValidCheckpointForCurrentWriter` finds
    it in the active timeline; when none there does (other writers and services committed more
    than archival keeps since), in the archived timeline. None when no commit does."""
    active = table.timeline()
    found = _newest_checkpoint(table, active, identifier)
    if found is None and any(i.state == "completed" for i in active):
        start = active[0].time
        archived = [i for i in table.timeline(include_archived=True) if i.time < start]
        found = _newest_checkpoint(table, archived, identifier)
    return found


def _newest_checkpoint(table: Table, instants: list[Instant], identifier: str) -> int | None:
    for instant in reversed(instants):
        if instant.state != "completed" or instant.action not in ("commit", "deltacommit", "replacecommit"):
            continue
        recorded = table.extra_metadata(instant.time).get(SINK_CHECKPOINT_KEY)
        if not recorded:
            continue
        try:
            batches = json.loads(recorded)
            if isinstance(batches, dict) and identifier in batches:
                return int(batches[identifier])
        except (ValueError, TypeError):
            raise _native.CorruptTableError(
                f"commit {instant.time}: {SINK_CHECKPOINT_KEY} is not a JSON object of batch ids: "
                f"{recorded[:80]!r}"
            ) from None
    return None


def _shuffle_columns(properties: Mapping[str, str]) -> list[str]:
    """The partition columns whose values name the partition path, one directory value per
    distinct value (a shuffle by them gives each task whole partitions); none when a field is
    partitioned by time (many values print as one partition), or keys are unique across
    partitions (a global index): such writes are routed by file group and key instead."""
    keygen = properties.get("hoodie.table.keygenerator.type") or properties.get(
        "hoodie.table.keygenerator.class", ""
    )
    if "TIMESTAMP" in keygen.upper() or "CUSTOM" in keygen.upper():
        return []
    if properties.get("oxlake.index.global", "").lower() == "true":
        # A key may move between partitions: its old group and its new partition meet by route.
        return []
    return [c for c in properties.get("hoodie.table.partition.fields", "").split(",") if c]


def _routed(
    df: DataFrame, uri: str, operation: str, storage_options: dict[str, str] | None, schema: pa.Schema
) -> DataFrame:
    """`df` shuffled so that every task gets whole file groups (all changes of the keys a group
    holds) and every occurrence of each new key. The index lookup runs in the tasks, before the
    shuffle, each task looking up the keys it holds."""
    from pyspark.sql.types import StringType, StructField, StructType

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = from_spark(batches, schema)
        routes = pa.table(_native.route(native(Table(uri, storage_options)), operation, rows)).column("route")
        yield from rows.append_column(_ROUTE, routes).to_batches()

    tagged = StructType([*df.schema.fields, StructField(_ROUTE, StringType(), False)])
    return df.mapInArrow(tag, tagged).repartition(_ROUTE).drop(_ROUTE)


def register(spark: SparkSession) -> None:
    """Registers the `oxlake` data source (Spark 4): `spark.read.format("oxlake").load(uri)` and
    `df.write.format("oxlake").option("operation", "upsert").mode("append").save(uri)`; see
    `oxlake.spark_source` for the options. Enables Spark's filter pushdown to Python data
    sources (`spark.sql.python.filterPushdown.enabled`, Spark 4.1 and later)."""
    from oxlake.spark_source import OxlakeDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(OxlakeDataSource)
