"""The `oxlake` data source of Spark's Python Data Source API (Spark 4): registered by
`oxlake.spark.register(spark)`, then `spark.read.format("oxlake").load(uri)` and
`df.write.format("oxlake").save(uri)`.

Reading plans the query like `oxlake.spark.read`: one Spark partition per split of whole file
slices, read natively on the executor. Filters Spark pushes (Spark 4.1 and later) prune
partitions and files natively and are applied exactly by the native reader. The API has no
column pruning; the `columns` option selects columns.

Writing: the driver begins the instant when Spark plans the write, every task writes the files of
the rows it holds, and the driver commits them as one instant. Spark hands each task whatever rows
its input partition holds, so two tasks may rewrite the same copy-on-write file group; the commit
merges such rewrites into one file. Partition the data by the table's partition columns first
(`df.repartition(...)`) to keep the work on the executors, or use `oxlake.spark.write`, which
does that itself.

Options (all strings): reading: `columns` (comma-separated), `filter` (SQL), `as_of`, `query`,
`start`, `end`, `with_meta_columns`, `batch_size`, `split_bytes`, `min_splits` (a batch read
has at least this many splits where base files can be cut by rows; the planning
process's CPU count by default); writing: `operation` (mode
`overwrite` means `insert_overwrite_table`), `sort_mode` of a `bulk_insert` (`none`,
`global_sort`, `partition_sort`: here each task sorts the rows it holds; sort the frame first,
or use `oxlake.spark.write`, for a global order), `target_file_size`, `schema_mode` (`merge` evolves
the schema as `Table.upsert(..., schema_mode="merge")` does), and on a table's first write
`record_key`, `partition_by` (comma-separated), `ordering_field`, `table_type`, `table_version`,
`global_index` (`true`: keys unique across partitions, see `oxlake.create_table`), `meta_fields`
(`false`: a table without meta fields, Apache Hudi's virtual keys), `metadata` (`false`: no
metadata table);
both: `storage.*` (storage options, for example `storage.aws_endpoint`).

Save modes: Spark itself accepts only `append` and `overwrite` for a Python data source. `save()`
with Spark's default mode (`errorifexists`) or `ignore` fails inside Spark, before any oxlake code
runs (`UNSUPPORTED_DATA_SOURCE_SAVE_MODE`); write `.mode("append")` (every operation but
`insert_overwrite_table`), or call `oxlake.spark.write(df, uri, ...)`, which has no mode.

Streaming: `writeStream.format("oxlake")` (Spark 4.1: `OxlakeStreamWriter`, option
`checkpoint_identifier`) and `readStream.format("oxlake")` (`OxlakeStreamReader`).
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _ARROW_STREAM_WRITER = True
except ImportError:  # Spark 4.0: no Arrow stream writer
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase  # type: ignore[assignment]

    _ARROW_STREAM_WRITER = False

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # Spark 4.1: `availableNow` runs the source as `once`

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


from oxlake import _native
from oxlake._engine import DEFAULT_SPLIT_BYTES, native, read_columns, result_schema
from oxlake._spark_io import (
    arrow_schema_of,
    as_spark,
    check_sort_mode,
    from_spark,
    open_or_create,
    spark_reader,
    spark_schema,
    task_id,
)
from oxlake.spark import DEFAULT_CHECKPOINT_IDENTIFIER, SINK_CHECKPOINT_KEY, committed_batch
from oxlake.table import Split, Table, query_type, schema_mode, sort_mode


def _flag(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise _native.InvalidArgumentError(f"expected true or false, got {value!r}")


def _list(value: str | None) -> list[str] | None:
    return None if value is None else [c.strip() for c in value.split(",") if c.strip()]


@dataclass(frozen=True)
class _Options:
    """The options of one read or write, parsed once (on the driver)."""

    uri: str
    storage: dict[str, str]
    raw: Mapping[str, str]

    @staticmethod
    def of(options: Mapping[str, str]) -> _Options:
        uri = options.get("path")
        if not uri:
            raise _native.InvalidArgumentError("give the table's URI: .load(uri) or .save(uri)")
        storage = {k[len("storage.") :]: v for k, v in options.items() if k.startswith("storage.")}
        # Spark's option names are case-insensitive (it hands them over in lower case).
        return _Options(uri, storage, {k.lower(): v for k, v in options.items()})

    def get(self, key: str) -> str | None:
        return self.raw.get(key.lower())

    def int(self, key: str, default: int | None) -> int | None:
        value = self.get(key)
        try:
            return default if value is None else int(value)
        except ValueError:
            raise _native.InvalidArgumentError(f"option {key} must be an integer, got {value!r}") from None

    def table(self) -> Table:
        return Table(self.uri, self.storage or None)


def _create_options(opts: _Options) -> dict[str, Any]:
    """The options of `create_table` a write names, for a table's first write."""
    created: dict[str, Any] = {}
    for key in ("record_key", "partition_by"):
        if (names := _list(opts.get(key))) is not None:
            created[key] = names
    for key in ("ordering_field", "table_type"):
        if (value := opts.get(key)) is not None:
            created[key] = value
    if (version := opts.int("table_version", None)) is not None:
        created["table_version"] = version
    if (global_index := opts.get("global_index")) is not None:
        created["global_index"] = _flag(global_index, False)
    if (meta_fields := opts.get("meta_fields")) is not None:
        created["meta_fields"] = _flag(meta_fields, True)
    if (metadata := opts.get("metadata")) is not None:
        created["metadata"] = _flag(metadata, True)
    return created


class OxlakeDataSource(DataSource):
    """`format("oxlake")`: Apache Hudi tables read and written by oxlake."""

    @classmethod
    def name(cls) -> str:
        return "oxlake"

    def _read_plan(self) -> tuple[_Options, list[str] | None, pa.Schema]:
        opts = _Options.of(self.options)
        table = opts.table()
        query, as_of = opts.get("query") or "snapshot", opts.get("as_of")
        meta = _flag(opts.get("with_meta_columns"), True)
        columns = read_columns(table, _list(opts.get("columns")), meta, query, as_of)
        return opts, columns, result_schema(table, columns, query, as_of)

    def schema(self) -> StructType:
        return spark_schema(self._read_plan()[2])

    def reader(self, schema: StructType) -> DataSourceReader:
        opts, columns, arrow_schema = self._read_plan()
        return OxlakeReader(opts, columns, arrow_schema)

    def writer(self, schema: StructType, overwrite: bool) -> OxlakeWriter:
        return OxlakeWriter(_Options.of(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> OxlakeStreamWriter:  # noqa: N802
        if not _ARROW_STREAM_WRITER:
            raise _native.UnsupportedError(
                "writeStream.format('oxlake') needs Spark 4.1 or later; on older versions use "
                "foreachBatch with oxlake.spark.write_batch"
            )
        return OxlakeStreamWriter(_Options.of(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> OxlakeStreamReader:  # noqa: N802
        opts, columns, arrow_schema = self._read_plan()
        return OxlakeStreamReader(opts, columns, arrow_schema)


@dataclass(frozen=True)
class _SplitPartition(InputPartition):
    data: bytes


class OxlakeReader(DataSourceReader):
    def __init__(self, opts: _Options, columns: list[str] | None, schema: pa.Schema) -> None:
        self.opts = opts
        self.columns = columns
        self.schema = schema
        self.pushed: list[str] = []

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:  # noqa: N802 (Spark's name)
        for f in filters:
            sql = _to_sql(f)
            if sql is None:
                yield f
            else:
                self.pushed.append(sql)

    def _filter(self) -> str | None:
        parts = [f"({s})" for s in [self.opts.get("filter"), *self.pushed] if s]
        return " AND ".join(parts) or None

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        splits = o.table().splits(
            columns=self.columns,
            filter=self._filter(),
            as_of=o.get("as_of"),
            query=query_type(o.get("query") or "snapshot"),
            start=o.get("start"),
            end=o.get("end"),
            target_bytes=o.int("split_bytes", DEFAULT_SPLIT_BYTES) or DEFAULT_SPLIT_BYTES,
            min_splits=o.int("min_splits", os.cpu_count() or 1) or 1,
        )
        return [_SplitPartition(s.data) for s in splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _SplitPartition)
        batch_size = self.opts.int("batch_size", 65536)
        split = Split(partition.data, 0, 0)
        scan = self.opts.table().scan_split(
            split, columns=self.columns, filter=self._filter(), batch_size=batch_size
        )
        yield from as_spark(iter(scan), self.schema)


@dataclass(frozen=True)
class _Written(WriterCommitMessage):
    files: list[bytes]


class OxlakeWriter(DataSourceArrowWriter):
    """Begins the instant where Spark plans the write (on the driver), so every task writes for
    it; `commit` and `abort` take the pending write over in whichever process Spark runs them."""

    def __init__(self, opts: _Options, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.operation = "insert_overwrite_table" if overwrite else (opts.get("operation") or "upsert")
        check_sort_mode(self.operation, opts.get("sort_mode"))
        self.arrow_schema = arrow_schema_of(schema)
        table = open_or_create(opts.uri, self.arrow_schema, opts.storage or None, self._create_options())
        pending = _native.begin_write(native(table), self.operation)
        self.instant = pending.instant
        self.token = pending.token

    def _create_options(self) -> dict[str, Any]:
        return _create_options(self.opts)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Written:
        files = _native.write_files_stream(
            native(self.opts.table()),
            self.operation,
            self.instant,
            spark_reader(iterator, self.arrow_schema),
            None,
            self.opts.int("target_file_size", None),
            task_id(TaskContext.get()),
            self.opts.get("schema_mode"),
            self.opts.get("sort_mode"),
        )
        return _Written(files)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        parts = [part for m in messages if isinstance(m, _Written) for part in m.files]
        pending = _native.resume_write(native(self.opts.table()), self.operation, self.token)
        try:
            pending.commit(parts)
        except BaseException:
            pending.abort()
            raise

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _native.resume_write(native(self.opts.table()), self.operation, self.token).abort()


# ---- streaming ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows(WriterCommitMessage):
    """A task's rows of a micro-batch, as an Arrow IPC stream."""

    ipc: bytes


class OxlakeStreamWriter(_StreamWriterBase):
    """`writeStream.format("oxlake")`: each micro-batch is one commit, exactly once. The commit
    records the batch id under the option `checkpoint_identifier` (Apache Hudi's streaming sink
    checkpoint); a batch the table already holds, replayed after a failure, is skipped.

    Spark's Python streaming sink gives the driver's commit no way to reach the tasks before
    they write, so the tasks hand their rows to the driver (Arrow IPC, one message per task:
    under 2 GiB each) and the driver writes them natively as one commit: a micro-batch must fit
    the driver's memory. For micro-batches larger than that, `foreachBatch` with
    `oxlake.spark.write_batch` writes on the executors. A write that conflicts with another
    writer is written again up to `conflict_retries` times (3). Batch ids are Spark's: a query
    restarted with a new checkpoint location numbers from 0 again, so give it a new
    `checkpoint_identifier` too (a batch id the table already holds under the identifier is
    skipped)."""

    def __init__(self, opts: _Options, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise _native.InvalidArgumentError(
                "a streaming write appends (outputMode append or update); "
                "use foreachBatch with oxlake.spark.write_batch(..., operation='insert_overwrite_table')"
            )
        self.opts = opts
        self.operation = opts.get("operation") or "upsert"
        check_sort_mode(self.operation, opts.get("sort_mode"))
        self.identifier = opts.get("checkpoint_identifier") or DEFAULT_CHECKPOINT_IDENTIFIER
        self.arrow_schema = arrow_schema_of(schema)
        # The table exists before the first batch (created here with the write's options).
        open_or_create(opts.uri, self.arrow_schema, opts.storage or None, _create_options(opts))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Rows:
        data = from_spark(iterator, self.arrow_schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, data.schema) as out:
            out.write_table(data)
        return _Rows(sink.getvalue().to_pybytes())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        table = self.opts.table()
        # An earlier attempt whose driver died after deciding to commit is completed (or rolled
        # back) first, so that the check below sees it.
        table.rollback_failed(complete_decided=True)
        done = committed_batch(table, self.identifier)
        if done is not None and batchId <= done:
            return  # committed before a failure kept Spark from recording it
        parts = [pa.ipc.open_stream(m.ipc).read_all() for m in messages if isinstance(m, _Rows)]
        data = pa.concat_tables(parts) if parts else self.arrow_schema.empty_table()
        checkpoint = {SINK_CHECKPOINT_KEY: json.dumps({self.identifier: str(batchId)})}
        table._write(
            self.operation,
            data,
            self.opts.int("target_file_size", None),
            # A conflict with another writer: the batch is planned and written again.
            (self.opts.int("conflict_retries", 3) or 0)
            if self.operation in ("insert", "bulk_insert", "upsert", "delete")
            else 0,
            schema_mode(self.opts.get("schema_mode")),
            checkpoint,
            sort_mode(self.opts.get("sort_mode")),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass  # nothing was written: the rows never left the messages


class OxlakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`readStream.format("oxlake")`: offsets are the window bounds of completed commits (the
    requested time on a version 6 table, the completion time on versions 8 and 9); each
    micro-batch is the incremental query (option `query`: `incremental`, the default, or
    `changes`) between two offsets, read natively in splits on the executors.

    Options: `starting` (`earliest`, the default: the table as it is, then each commit after;
    `latest`; or a window bound, what committed after it: a completion time on versions 8 and
    9), `maxInstantsPerTrigger` (commits per micro-batch after the first; Spark 4.2 passes it as
    its files limit), and those of the
    batch read (`columns`, `filter`, `with_meta_columns`, `batch_size`, `split_bytes`). The
    columns are those of the query's start: a column added later is not read. A window reaching
    commits whose files a clean removed is an error naming `starting`, never rows silently
    missing. Offsets name the kind of their bound, so a stream goes on across `Table.upgrade`.

    An `availableNow` trigger reads every commit completed when the query starts, in as many
    micro-batches as the limit makes, after a batch replayed from the checkpoint too. (Spark
    runs a source without `prepareForTriggerAvailableNow` as `once`: a restart that replays an
    unfinished batch would end there, the commits after it left for a later run.)"""

    def __init__(self, opts: _Options, columns: list[str] | None, schema: pa.Schema) -> None:
        self.opts = opts
        self.schema = schema
        # Always the columns of the start: a column added meanwhile would not match the schema.
        self.columns = columns if columns is not None else list(schema.names)
        self.query = opts.get("query") or "incremental"
        if self.query not in ("incremental", "changes"):
            raise _native.InvalidArgumentError(
                f"a streaming read takes query 'incremental' or 'changes', not {self.query!r}"
            )
        self.max_instants = opts.int("maxInstantsPerTrigger", None)
        if self.max_instants is not None and self.max_instants < 1:
            raise _native.InvalidArgumentError("maxInstantsPerTrigger must be at least 1")
        self._last: dict[str, Any] | None = None
        # `availableNow`: the last commit at the query's start; no offset passes it.
        self._target: dict[str, Any] | None = None

    def _state(self) -> tuple[list[tuple[str, str]], str]:
        """The completed commits a micro-batch may take, as (requested time, window bound) in
        bound order, and the kind of bound the table uses (`requested` or `completion`).

        On a version 6 table, bounds are requested times: a write still pending would complete
        below bounds already handed out and be skipped for ever, so none at or past the
        earliest pending write is offered until it settles. On versions 8 and 9 a pending write
        completes after every completion time there is."""
        timeline = self.opts.table().timeline()
        data = ("commit", "deltacommit", "replacecommit")
        done = [i for i in timeline if i.state == "completed" and i.action in data]
        by = "completion" if any(i.completion is not None for i in done) else "requested"
        commits = sorted(((i.time, i.completion or i.time) for i in done), key=lambda c: c[1])
        pending = [i.time for i in timeline if i.state != "completed" and i.action in data]
        if by == "requested" and pending:
            commits = [c for c in commits if c[1] < min(pending)]
        return commits, by

    @staticmethod
    def _bound(offset: dict[str, Any], commits: list[tuple[str, str]], by: str) -> str | None:
        """The bound of `offset` in the table's kind of bound: an offset of requested times
        taken before an upgrade to version 8 is the latest completion of the commits it covered."""
        bound = offset.get("bound")
        if bound is None or offset.get("by", by) == by:
            return bound
        if by == "completion":
            covered = [c for t, c in commits if t <= bound]
            return max(covered) if covered else bound
        raise _native.InvalidArgumentError(
            f"the stream's offset {bound} is a completion time, and the table now windows by requested time"
        )

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        commits, by = self._state()
        starting = self.opts.get("starting") or "earliest"
        if starting == "earliest":
            return {"bound": None, "by": by}
        if starting == "latest":
            return {"bound": commits[-1][1] if commits else None, "by": by}
        if not (starting.isdigit() and len(starting) in (14, 17)):
            raise _native.InvalidArgumentError(
                "option starting: expected earliest, latest or an instant time "
                f"(yyyyMMddHHmmssSSS), got {starting!r}"
            )
        return {"bound": starting, "by": by}

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 (Spark 4.2 and later)
        # Spark's limits count rows, files or bytes; its files limit carries the commits.
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

        return ReadAllAvailable() if self.max_instants is None else ReadMaxFiles(self.max_instants)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        commits, by = self._state()
        self._target = {"bound": commits[-1][1], "by": by} if commits else {"bound": None, "by": by}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:  # noqa: N802
        commits, by = self._state()
        if start is None:  # Spark 4.1 and earlier: no start, no limit
            start, most = self._last or self.initialOffset(), self.max_instants
        else:
            most = getattr(limit, "max_files", None)
        after = self._bound(start, commits, by)
        newer = [c for _, c in commits if after is None or c > after]
        if self._target is not None:
            target = self._bound(self._target, commits, by)
            newer = [c for c in newer if target is not None and c <= target]
        if not newer:
            return start
        # The first micro-batch from `earliest` is the table as it is (the window from the
        # beginning needs no older file); each later one is at most `most` commits.
        if most is not None and after is not None:
            newer = newer[: max(int(most), 1)]
        self._last = {"bound": newer[-1], "by": by}
        return self._last

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        o = self.opts
        commits, by = self._state()
        first, last = self._bound(start, commits, by), self._bound(end, commits, by)
        try:
            splits = o.table().splits(
                columns=self.columns,
                filter=o.get("filter"),
                query=query_type(self.query),
                start=first,
                end=last,
                target_bytes=o.int("split_bytes", DEFAULT_SPLIT_BYTES) or DEFAULT_SPLIT_BYTES,
            )
        except _native.InvalidArgumentError as e:
            if "no longer readable" not in str(e):
                raise
            raise _native.InvalidArgumentError(
                f"the stream's next window ({first}, {last}] reaches commits a clean removed ({e}); "
                "restart the query with a new checkpoint and option starting set to 'latest' or a "
                "later instant to skip ahead"
            ) from None
        return [_SplitPartition(s.data) for s in splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _SplitPartition)
        batch_size = self.opts.int("batch_size", 65536)
        split = Split(partition.data, 0, 0)
        scan = self.opts.table().scan_split(
            split, columns=self.columns, filter=self.opts.get("filter"), batch_size=batch_size
        )
        yield from as_spark(iter(scan), self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        pass


# ---- Spark filters as SQL for the native planner --------------------------------------------


def _ident(path: tuple[str, ...]) -> str | None:
    if len(path) != 1:
        return None  # nested fields stay with Spark
    return '"' + path[0].replace('"', '""') + '"'


def _literal(value: Any) -> str | None:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, decimal.Decimal):
        return str(value) if value.is_finite() else None
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return f"DATE '{value.isoformat()}'"
    return None  # timestamps (time zones), binary, ...: Spark evaluates them


_COMPARISONS = {
    "EqualTo": "=",
    "GreaterThan": ">",
    "GreaterThanOrEqual": ">=",
    "LessThan": "<",
    "LessThanOrEqual": "<=",
    "EqualNullSafe": "IS NOT DISTINCT FROM",
}
_STRING_FUNCTIONS = {"StringStartsWith": "starts_with", "StringEndsWith": "ends_with"}


def _to_sql(f: Any) -> str | None:
    """The SQL of a Spark filter, or None when it stays with Spark."""
    kind = type(f).__name__
    if kind == "Not":
        inner = _to_sql(f.child)
        return None if inner is None else f"NOT ({inner})"
    column = _ident(f.attribute)
    if column is None:
        return None
    if kind == "IsNull":
        return f"{column} IS NULL"
    if kind == "IsNotNull":
        return f"{column} IS NOT NULL"
    if kind == "In":
        values = [_literal(v) for v in f.value]
        return None if not values or None in values else f"{column} IN ({', '.join(v for v in values if v)})"
    value = _literal(f.value)
    if value is None:
        return None
    if kind in _COMPARISONS:
        return f"{column} {_COMPARISONS[kind]} {value}"
    if kind in _STRING_FUNCTIONS and isinstance(f.value, str):
        return f"{_STRING_FUNCTIONS[kind]}({column}, {value})"
    if kind == "StringContains" and isinstance(f.value, str):
        return f"strpos({column}, {value}) > 0"
    return None
