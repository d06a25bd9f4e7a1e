"""Arrow data between Spark and oxlake: the schemas and batches Spark takes and hands over, the
task ids files are named with, the table a first write creates. Shared by `oxlake.spark` and
`oxlake.spark_source` (internal: the public names are re-exported by `oxlake.spark`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from oxlake import _native
from oxlake._engine import native
from oxlake.table import CompactionResult, Table, create_table

if TYPE_CHECKING:
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

_log = logging.getLogger("oxlake.spark")


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of a table's Arrow schema (see `spark_arrow_schema`), every field nullable
    (a change query's deleted rows carry nulls in columns the table declares non-null)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructField, StructType

    # Timestamps without a time zone stay without one (Spark 3.5 would read them as local time).
    converted = from_arrow_schema(spark_arrow_schema(schema), prefer_timestamp_ntz=True)
    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in converted.fields])


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The Arrow schema Spark takes for data of `schema`, every column nullable: Spark has no
    unsigned integers (they widen to the next signed type) and no 64-bit dates, keeps timestamps
    in microseconds, and reads times of day as microseconds since midnight (a long, as Spark's
    Avro reader does; its Arrow reader has no time type); fixed-size binary is binary."""
    return _spark_schema(schema, pa.int64())


def _spark_schema(schema: pa.Schema, time: pa.DataType) -> pa.Schema:
    return pa.schema([_spark_field(f, time).with_nullable(True) for f in schema])


def _spark_field(f: pa.Field, time: pa.DataType) -> pa.Field:
    return f.with_type(_spark_type(f.type, time))


_WIDENED = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.date64(): pa.date32(),
}


def _spark_type(t: pa.DataType, time: pa.DataType) -> pa.DataType:
    if t in _WIDENED:
        return _WIDENED[t]
    if pa.types.is_time(t):
        return time
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", t.tz)
    if pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_list(t):
        return pa.list_(_spark_field(t.value_field, time))
    if pa.types.is_struct(t):
        return pa.struct([_spark_field(t.field(i), time) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_spark_field(t.key_field, time), _spark_field(t.item_field, time))
    return t


def as_spark(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Batches of `schema` in `spark_arrow_schema(schema)`; values are cast only where a type
    differs (sub-microsecond parts of times and timestamps are dropped, Spark cannot hold them)."""
    target = spark_arrow_schema(schema)
    # Times become microseconds first, then their count.
    in_micros = _spark_schema(schema, pa.time64("us"))
    same_types = target.types == schema.types
    for batch in batches:
        if same_types:
            yield pa.RecordBatch.from_arrays(batch.columns, schema=target)
        else:
            yield batch.cast(in_micros, safe=False).cast(target)


def from_spark_values(values: pa.Array, type: pa.DataType, column: str) -> pa.Array:
    """Values Spark handed over for `column` of `type` (in `spark_arrow_schema`'s types) back in
    `type`: times of day from their count of microseconds, widened integers narrowed. A value
    `type` cannot hold exactly (a time finer than its unit or beyond a day, an integer out of
    range) or a field of another shape raises `SchemaMismatchError` naming the column, rather
    than being cut. Null values stay null (Spark nulls the fields of a null struct, which a
    non-nullable field of `type` could not take)."""
    if values.type == type:
        return values
    wrong = _unlike(values.type, _spark_type(type, pa.int64()), "")
    if wrong is not None:
        raise _native.SchemaMismatchError(
            f"{column}: cannot take Spark's {values.type} as {type}: {wrong} (cast it in the function)"
        )
    present = values.is_valid()
    some = values.filter(present) if values.null_count else values
    try:
        cast = some.cast(_spark_type(type, pa.time64("us"))).cast(type)
        cast.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise _native.SchemaMismatchError(
            f"{column}: cannot take Spark's {values.type} as {type}: {e}"
        ) from None
    if not values.null_count:
        return cast
    # Back in place: row i takes the next present value, or null.
    at = pc.subtract(pc.cumulative_sum(present.cast(pa.int64())), 1)
    return cast.take(pc.if_else(present, at, pa.scalar(None, pa.int64())))


def _unlike(got: pa.DataType, want: pa.DataType, at: str) -> str | None:
    """Where Spark's `got` differs in kind from `want` (a layer's type in Spark's types), or None.
    Alike: the same type up to field order, nullability, large offsets and a timestamp's zone
    label (the same instants); integers or decimals of another width (the cast checks every
    value); a float widened to a double. A number as a string, a double into a float, a field
    missing or extra: unlike, where a cast would convert silently."""
    name = at or "the value"
    if pa.types.is_struct(got) and pa.types.is_struct(want):
        theirs = {got.field(i).name: got.field(i).type for i in range(got.num_fields)}
        ours = {want.field(i).name: want.field(i).type for i in range(want.num_fields)}
        if theirs.keys() != ours.keys():
            missing, extra = sorted(ours.keys() - theirs.keys()), sorted(theirs.keys() - ours.keys())
            return f"{name} has fields {sorted(theirs)}, missing {missing}, extra {extra}"
        for field, t in ours.items():
            wrong = _unlike(theirs[field], t, f"{at}.{field}" if at else field)
            if wrong is not None:
                return wrong
        return None
    if _is_list(got) and _is_list(want):
        return _unlike(got.value_type, want.value_type, f"{at}[]")
    if pa.types.is_map(got) and pa.types.is_map(want):
        return _unlike(got.key_type, want.key_type, f"{at}{{key}}") or _unlike(
            got.item_type, want.item_type, f"{at}{{value}}"
        )
    if pa.types.is_timestamp(got) and pa.types.is_timestamp(want):
        alike = got.unit == want.unit and (got.tz is None) == (want.tz is None)
    else:
        alike = _kind(got) == _kind(want) and not (
            pa.types.is_floating(got) and got.bit_width > want.bit_width
        )
    return None if alike else f"{name} is {got}, not {want}"


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _kind(t: pa.DataType) -> Any:
    """Types whose values a checked cast takes exactly share a kind; others are their own."""
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return t


SORT_MODES = ("none", "global_sort", "partition_sort")


def check_sort_mode(operation: str, sort_mode: str | None) -> None:
    """Refuses a sort mode for another operation than a bulk insert, or one Hudi does not name,
    before any instant begins."""
    if sort_mode is None:
        return
    if operation != "bulk_insert":
        raise _native.InvalidArgumentError(
            f"sort_mode is an option of operation='bulk_insert', not of '{operation}'"
        )
    if sort_mode.lower() not in SORT_MODES:
        raise _native.InvalidArgumentError(
            f"sort_mode `{sort_mode}` is not a bulk insert sort mode: {', '.join(SORT_MODES)}"
        )


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema, timestamps with a time zone in UTC (the instants
    they are; Spark hands them over in its session time zone, converted by `from_spark`)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark 4.2 asks for the time zone of timestamps; earlier versions take UTC themselves.
    takes_zone = "timezone" in inspect.signature(to_arrow_schema).parameters
    try:
        converted = to_arrow_schema(schema, timezone="UTC") if takes_zone else to_arrow_schema(schema)
    except (TypeError, ValueError) as e:  # a Spark type Arrow cannot hold (intervals, ...)
        raise _native.SchemaMismatchError(f"cannot write Spark schema {schema.simpleString()}: {e}") from None
    return pa.schema([f.with_type(_normal(f.type)) for f in converted])


def from_spark(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """Spark's Arrow batches as one table of `schema` (see `spark_batches`)."""
    return pa.Table.from_batches(spark_batches(batches, schema), schema=schema)


def spark_reader(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatchReader:
    """Spark's Arrow batches as a stream of `schema` (see `spark_batches`), read as it is asked
    for: a task's write holds a bounded part of its rows."""
    return pa.RecordBatchReader.from_batches(schema, spark_batches(batches, schema))


def spark_batches(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Spark's Arrow batches in `schema` (from `arrow_schema_of`): the time zone of timestamps
    is the session's, relabelled UTC (the same instants), and large types become regular ones
    (`_normal`); nothing else changes."""
    for batch in batches:
        if batch.schema != schema:
            if [_normal(t) for t in batch.schema.types] != schema.types or batch.schema.names != schema.names:
                raise _native.SchemaMismatchError(f"Spark handed over {batch.schema}, expected {schema}")
            batch = pa.RecordBatch.from_arrays(
                [c.cast(t) if c.type != t else c for c, t in zip(batch.columns, schema.types, strict=True)],
                schema=schema,
            )
        yield batch


def _normal(t: pa.DataType) -> pa.DataType:
    """`t` as oxlake takes it from Spark, nested types too: timestamps with a time zone in UTC
    (the same instants), large strings, binaries and lists as regular ones (Spark's
    `useLargeVarTypes`; the values are the same)."""
    if pa.types.is_timestamp(t) and t.tz is not None:
        return pa.timestamp(t.unit, "UTC")
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_normal(f.type)) for f in t])
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_normal(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(_normal(t.key_type)), t.item_field.with_type(_normal(t.item_type))
        )
    return t


def task_id(ctx: TaskContext | None) -> tuple[int, int] | None:
    """(task, attempt) of the running Spark task, attempts numbered from 1: part of the names
    of the files it writes, so that no two attempts write the same file."""
    if ctx is None:
        return None
    return ctx.partitionId(), ctx.taskAttemptId() + 1


def open_or_create(
    uri: str, schema: pa.Schema, storage_options: dict[str, str] | None, create_options: dict[str, Any]
) -> Table:
    try:
        return Table(uri, storage_options)
    except _native.TableNotFoundError:
        if "record_key" not in create_options:
            raise _native.InvalidArgumentError(
                f"no table at {uri}: give record_key (and partition_by, ordering_field, ...) to create it"
            ) from None
        try:
            return create_table(uri, schema, storage_options=storage_options, **create_options)
        except _native.TableExistsError:
            return Table(uri, storage_options)  # another writer created it meanwhile


def compact_on_executors(
    spark: SparkSession, uri: str, storage_options: dict[str, str] | None, min_log_files: int = 1
) -> CompactionResult:
    """Compacts the merge-on-read table at `uri` with the merging on Spark's executors: the
    driver plans (plans left pending first, then one new plan over the slices with at least
    `min_log_files` log files), tasks write one base file per planned slice, the driver commits
    each plan, or rolls it back (its plan kept for the next run) when a task failed."""
    table = Table(uri, storage_options)
    instants: list[str] = []
    groups = records = 0
    while (pending := _native.begin_compaction(native(table), min_log_files)) is not None:
        try:
            instant, n, r = pending.commit(_compact_slices(spark, pending, uri, storage_options))
        except BaseException:
            pending.abort()
            raise
        instants.append(instant)
        groups, records = groups + n, records + r
        if pending.is_new:
            break
    return CompactionResult(instants, groups, records)


def _compact_slices(
    spark: SparkSession, pending: _native.PendingCompaction, uri: str, storage_options: dict[str, str] | None
) -> list[bytes]:
    """Every planned slice of `pending` compacted by a Spark task (up to
    `spark.sql.shuffle.partitions` tasks, 200 when it is not a number, the slices dealt round
    robin); their results."""
    operations = list(enumerate(pending.operations))
    if not operations:
        return []
    instant, epoch = pending.instant, pending.epoch

    def compact(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        mine = [
            (index, operation)
            for batch in batches
            for index, operation in zip(
                batch.column("index").to_pylist(), batch.column("operation").to_pylist(), strict=True
            )
        ]
        if mine:
            stats = _native.compact_slices(
                native(Table(uri, storage_options)), instant, epoch, mine, task_id(TaskContext.get())
            )
            yield pa.RecordBatch.from_pydict({"stats": pa.array([stats], pa.binary())})

    shuffle = str(spark.conf.get("spark.sql.shuffle.partitions", "200"))
    tasks = max(1, min(len(operations), int(shuffle) if shuffle.isdigit() else 200))
    slices = spark.createDataFrame(operations, "index long, operation binary").repartition(tasks)
    return [bytes(r["stats"]) for r in slices.mapInArrow(compact, "stats binary").collect()]


def compact_if_due(spark: SparkSession, uri: str, storage_options: dict[str, str] | None) -> None:
    """After a distributed write landed (committed with `compact_inline=False`): compacts on the
    executors when the table's `inline_compaction` setting says a compaction is due. The write has
    landed: a failed compaction is logged, not raised, and its plan runs next time, as an inline
    compaction's would."""
    try:
        since = _native.compaction_due(native(Table(uri, storage_options)))
        if since is None:
            return
        done = compact_on_executors(spark, uri, storage_options)
        _log.info("compaction on the executors after %d deltacommits: %s", since, done.instants)
    except Exception as e:  # the write landed; a plan made stays for the next run
        _log.warning("compaction on the executors failed (the write landed): %s", e)
