"""The Pythonic API over the native extension: `Table`, `create_table`, `Scan`."""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeAlias, cast, get_args

import pyarrow as pa

from oxlake import _native
from oxlake._engine import CHANGE_TYPE as _CHANGE_TYPE
from oxlake._engine import META_PREFIX as _META_PREFIX
from oxlake._engine import read_columns, require

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl
    import pyarrow.dataset

    from oxlake.merge import Merge

#: A filter: a SQL boolean expression, or (column, op, value) tuples that must all hold.
FilterLike = str | Sequence[tuple[str, str, Any]]
#: A point in a table's history: an instant time (`"20260201103000000"`, or any string holding
#: 8, 14 or 17 digits: `"2026-02-01"`, `"2026-02-01 10:30:00"`), or a `datetime` / `date` (a pandas
#: `Timestamp` is one).
TimeLike = str | _dt.datetime | _dt.date
#: Apache Hudi's two table types.
TableType = Literal["copy_on_write", "merge_on_read"]
#: What a scan reads (see `Table.scan`).
QueryType = Literal["snapshot", "read_optimized", "incremental", "changes"]
#: Whether a write may evolve the table's schema (see `Table.insert`).
SchemaMode = Literal["strict", "merge"]
#: How `bulk_insert` orders the records it writes.
SortMode = Literal["none", "global_sort", "partition_sort"]
#: A write operation, as Apache Hudi names them (`oxlake.spark.write`, the Spark data source).
Operation = Literal["insert", "upsert", "delete", "bulk_insert", "insert_overwrite", "insert_overwrite_table"]
#: What `write_table` does with a table that exists (see there).
WriteMode = Literal["create", "append", "upsert", "overwrite"]


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise _native.InvalidArgumentError(
            f"`{name}` is one of {', '.join(map(repr, allowed))}, not {value!r}"
        )
    return value


def query_type(value: str) -> QueryType:
    """`value` as a `QueryType` (an option given as text, e.g. Spark's), else an error naming
    the choices."""
    return _one_of("query", value, get_args(QueryType))  # type: ignore[return-value]


def schema_mode(value: str | None) -> SchemaMode | None:
    """`value` as a `SchemaMode` (None stays None)."""
    return None if value is None else _one_of("schema_mode", value, get_args(SchemaMode))  # type: ignore[return-value]


def sort_mode(value: str | None) -> SortMode | None:
    """`value` as a `SortMode` (None stays None)."""
    return None if value is None else _one_of("sort_mode", value, get_args(SortMode))  # type: ignore[return-value]


class ArrowStreamExportable(Protocol):
    """Anything exporting an Arrow C stream: pyarrow tables and readers, Polars frames, DuckDB
    relations, an oxlake `Scan`."""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...


#: What a write takes: any Arrow C stream exporter, a pyarrow `RecordBatch`, a pandas `DataFrame`.
ArrowData: TypeAlias = "ArrowStreamExportable | pa.RecordBatch | pd.DataFrame"


class Instant(NamedTuple):
    """One instant of the timeline: its requested time, action and state; on tables of version 8
    and 9 a completed instant also has its completion time (incremental queries of those tables
    take windows of completion times)."""

    time: str
    action: str
    state: str
    completion: str | None = None


class Commit(NamedTuple):
    """A completed commit as `Table.history` reports it: its instant, the operation recorded
    (`UPSERT`, `INSERT`, `DELETE`, `BULK_INSERT`, `COMPACT`, `CLUSTER`, ...), what it wrote
    (records by kind, files and bytes, file groups replaced), the `extra_metadata` it
    recorded (the table's schema, kept there too, left out) and, per partition path it wrote,
    the records it inserted, updated and deleted there."""

    time: str
    action: str
    completion: str | None
    operation: str | None
    num_inserts: int
    num_updates: int
    num_deletes: int
    files_written: int
    bytes_written: int
    file_groups_replaced: int
    extra_metadata: dict[str, str]
    partitions: dict[str, tuple[int, int, int]]  # partition path -> (inserts, updates, deletes)


class FileGroup(NamedTuple):
    """A file group at the latest instant."""

    partition: str
    file_id: str
    base_file: str
    size: int


@dataclass(frozen=True)
class CompactionResult:
    """What `Table.compact` did."""

    instants: list[str]
    """Compaction instants completed (empty when there was nothing to compact)."""
    file_groups: int
    records: int


@dataclass(frozen=True)
class ClusteringResult:
    """What `Table.cluster` did."""

    instant: str | None
    """The replacecommit (None when no partition had file groups worth rewriting)."""
    replaced_file_groups: int
    new_file_groups: int
    records: int


@dataclass(frozen=True)
class WriteResult:
    """What a write did. `instant` is None when there was nothing to write. `completion` is
    when it completed as readers order commits: its completion time on table versions 8 and 9
    (Apache Hudi 1.x orders commits by it), the instant itself on version 6. Incremental queries
    (`start=`, `end=`) compare against it: keep it as the checkpoint of a change stream
    (`scan(query="incremental", start=result.completion)` reads what committed after)."""

    instant: str | None
    num_inserts: int
    num_updates: int
    num_deletes: int
    files: list[str]
    completion: str | None = None


# An error of a scan crosses the Arrow C stream interface as text: `[oxlake.<class>] <message>`.
_ERROR_TAG = re.compile(r"\[oxlake\.(\w+)\] (.*)", re.S)


def _oxlake_error(e: BaseException) -> BaseException | None:
    """The oxlake exception an Arrow stream error carries, if it carries one."""
    m = _ERROR_TAG.search(str(e))
    cls = getattr(_native, m.group(1), None) if m else None
    if m is None or not (isinstance(cls, type) and issubclass(cls, _native.OxlakeError)):
        return None
    return cls(m.group(2))


def _typed_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches`, raising a failure of the scan as its `OxlakeError` subclass."""
    try:
        yield from batches
    except pa.ArrowException as e:
        typed = _oxlake_error(e)
        if typed is None:
            raise
        raise typed from None


class Scan:
    """The result of a read: an Arrow stream, consumed once.

    Exports `__arrow_c_stream__` (pandas, Polars, DuckDB and pyarrow take it without copies),
    iterates `pyarrow.RecordBatch`, and has `to_arrow()` and `to_pandas()`.
    """

    def __init__(self, native: _native.RecordBatchStream) -> None:
        self._native = native
        self._schema = pa.schema(native.schema)

    @property
    def schema(self) -> pa.Schema:
        """The schema of the stream's batches."""
        return self._schema

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self._native.__arrow_c_stream__(requested_schema)

    def reader(self) -> pa.RecordBatchReader:
        """The stream as a `pyarrow.RecordBatchReader` (failures raise `OxlakeError` subclasses)."""
        native = pa.RecordBatchReader.from_stream(self._native)
        return pa.RecordBatchReader.from_batches(native.schema, _typed_batches(native))

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self.reader())

    def to_arrow(self) -> pa.Table:
        return self.reader().read_all()

    def to_pandas(self) -> pd.DataFrame:
        require("pandas", needed_by="to_pandas")
        return self.to_arrow().to_pandas()

    def to_polars(self) -> pl.DataFrame:
        """The stream as a Polars `DataFrame` (`pl.from_arrow` of a stream gives a Series of
        structs; this gives the table)."""
        require("polars", needed_by="to_polars")
        import polars as pl

        return pl.DataFrame(self.to_arrow())


_WHOLE = 1 << 62
"""A chunk size no input reaches: the input is written in one piece."""


def _arrow_stream(data: Any) -> Any:
    """Anything tabular as an object exporting `__arrow_c_stream__`."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return _unsliced_nested(data)
    if type(data).__module__.startswith("pandas"):
        return pa.Table.from_pandas(data, preserve_index=False)
    if hasattr(data, "__arrow_c_stream__"):
        return data
    raise _native.InvalidArgumentError(
        f"cannot write {type(data).__name__}: pass a pyarrow Table, RecordBatch or RecordBatchReader, "
        "a pandas DataFrame, or any object with __arrow_c_stream__"
    )


def _nested(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t)
    )


def _unsliced_nested(table: pa.Table) -> pa.Table:
    """`table` with nested columns sliced at an offset copied: arrow-rs mis-imports such slices
    (its import asserts), so they are copied here, where it costs only for sliced nested data."""
    sliced = [i for i, c in enumerate(table.columns) if _nested(c.type) and any(ch.offset for ch in c.chunks)]
    for i in sliced:
        column = table.column(i)
        chunks = [pa.concat_arrays([ch, ch.slice(0, 0)]) if ch.offset else ch for ch in column.chunks]
        table = table.set_column(i, table.field(i), pa.chunked_array(chunks, column.type))
    return table


def _filter(filter: FilterLike | None) -> str | list[tuple[str, str, Any]] | None:
    if filter is None or isinstance(filter, str):
        return filter
    import pyarrow.compute as pc

    if isinstance(filter, pc.Expression):
        raise _native.InvalidArgumentError(
            f"`filter` takes a SQL expression or (column, op, value) tuples, not a pyarrow "
            f"Expression ({filter}): write it as SQL, e.g. \"city = 'sf' AND fare > 10\", "
            f'or as [("city", "=", "sf"), ("fare", ">", 10)]'
        )
    try:
        clauses = [tuple(f) for f in filter]
    except TypeError:
        raise _native.InvalidArgumentError(
            f"`filter` takes a SQL expression or (column, op, value) tuples, not {type(filter).__name__}"
        ) from None
    for c in clauses:
        if len(c) != 3:
            raise _native.InvalidArgumentError(f"`filter`: {c!r} is not a (column, op, value) tuple")
    return clauses


def _set_columns(rows: pa.Table, values: Mapping[str, Any], schema: pa.Schema) -> pa.Table:
    """`rows` with the columns of `values` set: each a literal, or a `pyarrow.compute`
    expression over the columns of `rows` (evaluated on `rows` as they were read)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    expressions = {n: v for n, v in values.items() if isinstance(v, pc.Expression)}
    computed = ds.dataset(rows).to_table(columns=expressions) if expressions and rows.num_rows else None
    for name, value in values.items():
        if computed is not None and name in expressions:
            column: pa.Array | pa.ChunkedArray = computed.column(name)
        elif isinstance(value, pc.Expression):
            column = pa.nulls(0, schema.field(name).type)
        elif value is None:
            column = pa.nulls(rows.num_rows, schema.field(name).type)
        else:
            try:
                column = pa.array([value] * rows.num_rows)
            except (pa.ArrowException, TypeError) as e:
                raise _native.SchemaMismatchError(f"update: the value {value!r} for `{name}`: {e}") from None
        rows = rows.set_column(rows.schema.get_field_index(name), name, column)
    return rows


def _key_column(field: pa.Field, values: list[Any]) -> pa.Array:
    """Keys given as Python values, for the column `field`: typed as pyarrow infers them, and held
    to the column's type by the write, as keys given as Arrow data are (stored only where each
    fits exactly: `"5"` or `5.5` is no key of an integer column, though pyarrow would convert
    `5.5` to the stored key 5). A `SchemaMismatchError` names the column otherwise."""
    try:
        keys = pa.array(values)
    except (pa.ArrowException, TypeError, OverflowError) as e:
        raise _native.SchemaMismatchError(
            f"the keys given for column `{field.name}` ({field.type}) are not values of one Arrow type: {e}"
        ) from None
    if pa.types.is_null(keys.type):  # none given, or only nulls (refused by the write)
        return pa.nulls(len(keys), field.type)
    naive = pa.types.is_timestamp(keys.type) and keys.type.tz is None
    if naive and pa.types.is_timestamp(field.type) and field.type.tz:
        # Naive datetimes name instants in UTC for a column with a time zone, as pyarrow takes them.
        return keys.cast(pa.timestamp(keys.type.unit, tz=field.type.tz))
    return keys


def _columns(columns: Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str):
        raise _native.InvalidArgumentError(
            f"`columns` takes a list of column names, not one string: did you mean columns=[{columns!r}]?"
        )
    return list(columns)


def _time(value: TimeLike | None, name: str, utc: bool) -> str | None:
    """An instant time from `value`. A `datetime` with a time zone is converted to the table's
    timeline zone (UTC, or the local zone for `hoodie.table.timeline.timezone=LOCAL`); one without
    is taken in that zone. A `date` is its midnight."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(_dt.UTC if utc else None).replace(tzinfo=None)
        return value.strftime("%Y%m%d%H%M%S") + f"{value.microsecond // 1000:03d}"
    if isinstance(value, _dt.date):
        return value.strftime("%Y%m%d") + "000000000"
    raise _native.InvalidArgumentError(
        f"`{name}` takes an instant time (a string such as '20260201103000000' or "
        f"'2026-02-01 10:30:00') or a datetime, not {type(value).__name__}"
    )


@dataclass(frozen=True)
class ValidationReport:
    """What `Table.validate` found."""

    present: bool
    """Whether the table has a metadata table."""
    missing_instants: list[str]
    """Instants that changed the table's files and that the metadata table lacks: it is stale,
    and readers list storage instead."""
    differences: list[str]
    """One line per file on which the metadata table and storage disagree."""

    @property
    def ok(self) -> bool:
        """Whether the metadata table is there and agrees with the listing."""
        return self.present and not self.missing_instants and not self.differences


@dataclass(frozen=True)
class Split:
    """A piece of a planned query (whole file slices), read by `Table.scan_split`; picklable."""

    data: bytes
    #: Bytes of the files it reads.
    size: int
    #: Number of files it reads.
    files: int


class Table:
    """An Apache Hudi table. Operations are synchronous and release the GIL while they run."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        *,
        heartbeat_interval: float = 10.0,
    ) -> None:
        self._t = _native.Table(uri, storage_options, heartbeat_interval)

    @classmethod
    def _wrap(cls, native: _native.Table) -> Table:
        t = cls.__new__(cls)
        t._t = native
        return t

    # -- metadata ---------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        """The table's location, as it was opened."""
        return str(self._t.uri)

    @property
    def schema(self) -> pa.Schema:
        """Schema of reads: the five `_hoodie_*` meta fields, then the data columns."""
        return pa.schema(self._t.schema)

    def schema_as_of(self, as_of: TimeLike) -> pa.Schema:
        """Schema of reads as of the commit at `as_of`: time travel returns the columns the
        table had then, under the names it gave them (see `update_schema`)."""
        return pa.schema(self._t.schema_as_of(self._time(as_of, "as_of") or ""))

    @property
    def properties(self) -> dict[str, str]:
        """`hoodie.properties`."""
        return dict(self._t.properties)

    @property
    def global_index(self) -> bool:
        """Whether record keys are unique across partitions (`create_table(..., global_index=True)`):
        upserts move a key to the partition it names, deletes find a key in any partition."""
        return self.properties.get("oxlake.index.global", "").lower() == "true"

    def extra_metadata(self, instant: str) -> dict[str, str]:
        """The `extraMetadata` the completed commit at `instant` recorded: the writer's schema,
        a streaming sink's checkpoint (`_hudi_streaming_sink_checkpoint`), a write's
        `extra_metadata`."""
        return dict(self._t.extra_metadata(instant))

    def timeline(self, *, include_archived: bool = False) -> list[Instant]:
        """Every instant of the active timeline, oldest first; with `include_archived=True` also
        those archival moved to `.hoodie/archived` (see `archive`)."""
        return [Instant(*i) for i in self._t.timeline(include_archived)]

    def file_groups(self) -> list[FileGroup]:
        """The live file groups at the latest instant."""
        return [FileGroup(*g) for g in self._t.file_groups()]

    def rollback_failed(self, *, complete_decided: bool = False) -> list[str]:
        """Rolls back writes whose writer is gone (expired heartbeat); returns their instants.
        With `complete_decided`, a pending write whose writer already decided to commit it is
        completed now, whether its writer is alive or not (a streaming sink that restarts after
        its driver died there sees the batch as committed, not to be written again)."""
        return list(self._t.rollback_failed(complete_decided))

    # -- the metadata table -----------------------------------------------------------------

    def build_metadata(
        self,
        files_shards: int = 4,
        *,
        column_stats_shards: int = 2,
        bloom_filters_shards: int = 2,
        record_index_shards: int | None = None,
    ) -> str:
        """Builds the table's metadata table (`.hoodie/oxlake/metadata`), replacing any earlier
        one, and returns the `indexing` instant that records it. Every later write keeps it in
        step. While it is fresh:

        - planning takes the table's files from its `files` index instead of listing directories;
        - filters prune file slices by `column_stats` (min/max/nulls of every file) and, for
          equality on the record key, by `bloom_filters`;
        - upserts and deletes find the file group of each key in the `record_index` without
          reading a data file, and `lookup` reads only the groups holding the keys.

        Each index is sharded into the given number of file groups; 0 leaves an index out
        (`files` needs at least one). By default the record index is sized from the table: a
        shard per 2,000,000 keys of its latest file slices, at least 8 (up to 10,000), since a
        build and `validate` hold one shard's keys at a time; it is left out (0) in a table
        without meta fields, whose rows store no key to index (asking for it there is an
        `UnsupportedError`)."""
        sized = record_index_shards is None
        if record_index_shards is None:
            virtual = self.properties.get("hoodie.populate.meta.fields", "true").lower() == "false"
            record_index_shards = 0 if virtual else 8
        return self._t.build_metadata(
            files_shards, column_stats_shards, bloom_filters_shards, record_index_shards, sized
        )

    def lookup(self, keys: Any, *, columns: list[str] | None = None) -> pa.Table:
        """The current rows of the records whose keys `keys` holds: any Arrow data (pyarrow,
        pandas, `__arrow_c_stream__`) with at least the record key columns. Keys the table does
        not hold are absent from the result. With a record index only the file groups holding the
        keys are read."""
        return Scan(self._t.lookup(_arrow_stream(keys), columns)).to_arrow()

    def validate(self) -> ValidationReport:
        """Compares the metadata table with a full listing of storage and with the data: every
        file in the files index, the statistics and bloom filter of every file, the file group of
        every record in the record index."""
        present, missing, differences = self._t.validate()
        return ValidationReport(present, missing, differences)

    # -- table services ---------------------------------------------------------------------

    def compact(
        self, min_log_files: int = 1, *, progress: _native.Progress | None = None
    ) -> CompactionResult:
        """Compacts merge-on-read file groups: runs pending compaction plans, then plans and runs
        one over every file slice with at least `min_log_files` log files. Writers may keep
        writing meanwhile; their logs land in the compacted slices. `progress` (an
        `oxlake.Progress`) counts the file groups done, for another thread to show."""
        instants, groups, records = _native.compact(self._t, min_log_files, progress)
        return CompactionResult(list(instants), groups, records)

    def rollback(self, instant: str) -> str:
        """Rolls back the latest completed commit (`instant` must be it); returns the rollback
        instant. Its files are removed and readers stop seeing it at once."""
        return _native.rollback(self._t, instant)

    def update_schema(self) -> UpdateSchema:
        """Explicit schema changes, in pyiceberg's shape, committed together when the `with`
        block ends (nothing is committed if it raises)::

            with t.update_schema() as u:
                u.add_column("note", pa.string())
                u.rename_column("amount", "total")
                u.delete_column("legacy")
                u.update_column("qty", pa.int64())
                u.move_first("total")

        Columns are then known by id, as Apache Hudi's schema-on-read evolution knows them
        (`.hoodie/.schema`, each commit's `latestSchema`): every file, whenever it was written,
        is read under the current names; a dropped column is gone from reads, and a column added
        again under a dropped one's name starts empty. Renames, drops and moves apply to
        top-level columns; `add_column` and `update_column` also take a struct path (a tuple).
        Record key, partition and ordering columns cannot be renamed, dropped or retyped.
        Refusals raise `SchemaMismatchError` and change nothing; a schema change racing a
        write makes the later of the two fail with `CommitConflictError`."""
        return UpdateSchema(self)

    def savepoint(self, instant: str) -> None:
        """Savepoints a completed commit: the cleaner keeps what reading as of it needs, and
        `restore` can bring the table back to it."""
        _native.savepoint(self._t, instant)

    def outcome(self, instant: str) -> Literal["committed", "rolled_back", "pending"]:
        """What became of the write at `instant`: the question a `CommitUnknownError` leaves
        (its `instant`). A write whose writer is gone is settled first, as the next writer
        would settle it (completed when it was decided committed, else rolled back), so
        `committed` and `rolled_back` are final; `pending`: its writer is still at work."""
        return cast(Literal["committed", "rolled_back", "pending"], _native.outcome(self._t, instant))

    def delete_savepoint(self, instant: str) -> None:
        """Deletes the savepoint `instant`: the cleaner may then remove the files only it kept,
        and a restore may go past it."""
        _native.delete_savepoint(self._t, instant)

    def restore(self, instant: str, *, progress: _native.Progress | None = None) -> str:
        """Rolls back every commit after the savepoint `instant`; returns the restore instant.
        A newer savepoint is refused (`InvalidArgumentError` naming it, the table untouched):
        delete it first (`delete_savepoint`)."""
        return _native.restore(self._t, instant, progress)

    def archive(self, *, min_commits: int | None = None, max_commits: int | None = None) -> list[Instant]:
        """Moves the oldest instants of the active timeline into `.hoodie/archived`, as Apache
        Hudi does: once more than `max_commits` commits are active, the oldest go until
        `min_commits` remain (the table's settings, 20 and 30 by default: `set_archival`), with
        the cleans and rollbacks before them, never past a pending instant, a savepoint, what
        the latest clean retains, or what a compaction has yet to fold in, and nothing while a
        write, compaction or clustering is pending. Reads as of or from archived commits give the
        same rows as before. Returns the archived instants."""
        archived = _native.archive(self._t, min_commits, max_commits)
        return [Instant(time, action, "completed") for time, action in archived]

    def upgrade(self, to: int = 8) -> tuple[int, int]:
        """Upgrades a version 6 table to version `to` (8 or 9), as Apache Hudi 1.x does on its first
        write: failed writes rolled back, every instant moved into `.hoodie/timeline/` (completed
        ones named with their completion time, commit metadata as Avro), the archived timeline
        copied into the LSM timeline, then `hoodie.properties`. Pending compactions and clusterings
        are carried over; any other write in progress fails it with a `CommitConflictError`.
        Killed at any point, the table reads as before or as upgraded, and `upgrade` again
        finishes. Returns `(from, to)`."""
        from_version, to_version, _, _ = _native.upgrade(self._t, to)
        return from_version, to_version

    def set_archival(self, min_commits: int, max_commits: int, *, inline: bool = True) -> None:
        """How many commits the active timeline keeps (`hoodie.keep.min.commits` /
        `hoodie.keep.max.commits` in `hoodie.properties`), and whether every commit of a write
        archives inline, as Apache Hudi's writers do (the default; with `inline=False`, stored as
        `oxlake.archive.inline=false`, only `archive()` does)."""
        _native.set_archival(self._t, min_commits, max_commits, inline)

    def set_cleaning(
        self, retain: int | None, *, policy: str = "keep_latest_commits", every: int = 1
    ) -> None:
        """Whether every write cleans once it landed, as Apache Hudi's writers do with
        `hoodie.clean.automatic`: with `retain`, a write runs `clean(policy, retain)` when `every`
        commits landed since the last clean (for a table written every few seconds, what keeps
        its files and timeline from growing); `retain=None` turns it off (the default for a new
        table). Stored in `hoodie.properties` under Apache Hudi's names
        (`hoodie.cleaner.policy`, `hoodie.cleaner.commits.retained` /
        `hoodie.cleaner.fileversions.retained`, `hoodie.clean.max.commits`), so every writer of
        the table follows it. Reads older than the retained commits fail with a clear error."""
        _native.set_cleaning(self._t, retain, policy, every)

    def clean(
        self,
        policy: str = "keep_latest_commits",
        retain: int = 10,
        *,
        progress: _native.Progress | None = None,
    ) -> list[str]:
        """Deletes file slices no longer needed: `policy="keep_latest_commits"` keeps what reading
        as of each of the latest `retain` commits needs, `"keep_latest_file_versions"` the latest
        `retain` slices of each file group. Savepoints are always kept. Returns the files deleted."""
        _, deleted = _native.clean(self._t, policy, retain, progress)
        return list(deleted)

    def cluster(
        self,
        sort_by: Sequence[str] = (),
        *,
        small_file_limit: int | None = None,
        target_file_size: int | None = None,
        memory_limit: int | None = None,
        progress: _native.Progress | None = None,
    ) -> ClusteringResult:
        """Rewrites the small file groups of each partition (latest slice under
        `small_file_limit` bytes, default 100 MiB) into new ones of about `target_file_size`
        (default 120 MiB), sorted by `sort_by`, as one replacecommit. Reads return the same rows
        before and after. Sorting spills to disk past `memory_limit` (default 1 GiB)."""
        instant, replaced, written, records = _native.cluster(
            self._t, list(sort_by), small_file_limit, target_file_size, memory_limit, progress
        )
        return ClusteringResult(instant, replaced, written, records)

    # -- writes -----------------------------------------------------------------------------

    def _write(
        self,
        operation: str,
        data: ArrowData,
        target_file_size: int | None,
        conflict_retries: int = 0,
        schema_mode: SchemaMode | None = None,
        extra_metadata: Mapping[str, str] | None = None,
        sort_mode: SortMode | None = None,
        read_from: list[tuple[str, str, str]] | None = None,
        chunk_bytes: int | None = None,
    ) -> WriteResult:
        if chunk_bytes is not None and (
            not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes < 1
        ):
            raise _native.InvalidArgumentError(
                f"chunk_bytes must be a positive number of bytes, not {chunk_bytes!r}"
            )
        stream = _arrow_stream(data)
        if chunk_bytes is None and isinstance(stream, pa.Table):
            # In memory already (a pyarrow Table or RecordBatch, a pandas DataFrame): written
            # whole, as spilling it would only add the disk's time.
            chunk_bytes = _WHOLE
        extra = dict(extra_metadata) if extra_metadata is not None else None
        instant, ins, upd, dels, files, completion = self._t.write(
            operation,
            stream,
            target_file_size,
            conflict_retries,
            schema_mode or "strict",
            extra,
            sort_mode,
            read_from,
            chunk_bytes,
        )
        return WriteResult(instant, ins, upd, dels, list(files), completion)

    # `conflict_retries`: a write that loses a conflict with another writer (CommitConflictError:
    # the same file groups or keys committed first) is planned and written again, against the
    # table as it is then, up to this many times before the error is raised.
    #
    # `schema_mode`: "strict" (the default) keeps the table's schema: a column the table
    # lacks, or a table column missing from `data`, is a SchemaMismatchError, and values are
    # stored in the table's types only where each fits exactly. "merge" evolves the schema by
    # Apache Hudi's rules: new nullable columns (nested ones too) are added, types widened
    # (int -> long/float/double/string, long -> float/double/string, float -> double/string,
    # double -> string, bytes <-> string, date -> string, wider decimals), and table columns
    # missing from `data` are null in its rows. Anything else is a SchemaMismatchError naming
    # the column and both types; the table is left as it was.
    #
    # `extra_metadata`: string pairs recorded in the commit's `extraMetadata` (read back with
    # `Table.extra_metadata`), as Apache Hudi records a streaming sink's checkpoint or a job's
    # own keys; the keys of the commit's schema (`schema`, `latestSchema`) are refused.
    #
    # Inputs larger than memory: `insert`, `upsert` and `delete` take any Arrow stream (a
    # `RecordBatchReader`, a generator through `pa.RecordBatchReader.from_batches`, any
    # `__arrow_c_stream__`) and read it `chunk_bytes` of Arrow data at a time (default 512 MiB).
    # An input of one chunk is written from memory; a larger one is spilled to local disk
    # (`TMPDIR`) by key, combined, looked up and written a file group at a time, in one commit,
    # with peak memory a few chunks whatever its size. New keys of such an input go to new files
    # (no small file is topped up). A failing input leaves the table as it was. Data already in
    # memory (a pyarrow Table or RecordBatch, a pandas DataFrame) is written whole unless
    # `chunk_bytes` is given.

    def insert(
        self,
        data: ArrowData,
        *,
        target_file_size: int | None = None,
        conflict_retries: int = 0,
        schema_mode: SchemaMode = "strict",
        extra_metadata: Mapping[str, str] | None = None,
        chunk_bytes: int | None = None,
    ) -> WriteResult:
        """Adds records (duplicate keys in `data` are combined by the ordering field first).
        `schema_mode="merge"` evolves the table's schema to take `data`'s (see above).
        `data` of any size streams (see "Inputs larger than memory" above)."""
        return self._write(
            "insert",
            data,
            target_file_size,
            conflict_retries,
            schema_mode,
            extra_metadata,
            chunk_bytes=chunk_bytes,
        )

    def upsert(
        self,
        data: ArrowData,
        *,
        target_file_size: int | None = None,
        conflict_retries: int = 0,
        schema_mode: SchemaMode = "strict",
        extra_metadata: Mapping[str, str] | None = None,
        chunk_bytes: int | None = None,
    ) -> WriteResult:
        """Updates records whose key exists and inserts the others. `schema_mode="merge"`
        evolves the table's schema to take `data`'s; the columns `data` lacks are then null in
        the rows written (also in updated ones: not a partial update).

        A boolean column `_hoodie_is_deleted` (Apache Hudi's delete marker) makes the rows where
        it is true deletes of their keys, in the same commit as the other rows' upserts (null is
        false; the column is not stored). Under an `ordering_field` such a delete loses to a
        stored record with a greater ordering value, as a delete does; one of a key the table
        lacks deletes nothing.

        `data` of any size streams (see "Inputs larger than memory" above)."""
        return self._write(
            "upsert",
            data,
            target_file_size,
            conflict_retries,
            schema_mode,
            extra_metadata,
            chunk_bytes=chunk_bytes,
        )

    def delete(
        self,
        data: ArrowData | list[Any] | None = None,
        *,
        predicate: FilterLike | None = None,
        conflict_retries: int = 0,
        extra_metadata: Mapping[str, str] | None = None,
        chunk_bytes: int | None = None,
    ) -> WriteResult:
        """Deletes records, by key or by predicate (exactly one of the two).

        `data`: rows with the record key and partition columns (the record key columns alone on
        a table with a global index; any Arrow data, or a list of dicts), or, on a table keyed by
        one field without partitions or with a global index, a plain list of keys
        (`t.delete([1, 2, 3])`). Keys not in the table are ignored; when none is, nothing is
        written and `instant` is None. Keys given as Python values are held to the key columns'
        types as Arrow data is (`"5"` or `5.5` for an integer key is a `SchemaMismatchError`
        naming the column). Rows of any size stream (see "Inputs larger than memory" above).

        `predicate`: a filter as `scan` takes it (`t.delete(predicate="fare < 5")`): the rows it
        matches in the latest snapshot are deleted. The snapshot read and the delete are one
        transaction: a commit that lands in between on the same file groups or keys makes it
        read and delete again (up to `conflict_retries` times, then `CommitConflictError`), so
        a row written meanwhile is never deleted unseen."""
        if (data is None) == (predicate is None):
            raise _native.InvalidArgumentError(
                "delete takes the rows to delete (`data`) or a `predicate`, exactly one of them"
            )
        if predicate is not None:
            keys = self._key_columns()
            return self._by_predicate(
                "delete",
                lambda: self.to_arrow(columns=keys, filter=predicate),
                conflict_retries,
                extra_metadata,
            )
        if isinstance(data, list | tuple):
            data = self._key_rows(list(data))
        assert data is not None
        return self._write(
            "delete", data, None, conflict_retries, None, extra_metadata, chunk_bytes=chunk_bytes
        )

    def update(
        self,
        set: Mapping[str, Any],
        *,
        predicate: FilterLike | None = None,
        conflict_retries: int = 0,
        extra_metadata: Mapping[str, str] | None = None,
    ) -> WriteResult:
        """Sets columns of the rows `predicate` matches (every row without one), as one upsert
        of those rows: `t.update({"status": "closed"}, predicate="ts < 100")`,
        `t.update({"fare": pc.field("fare") * 1.1}, predicate="city = 'sf'")`.

        Each value of `set` is a literal (stored in the column's type only where it fits
        exactly, as every write) or a `pyarrow.compute` expression over the row's columns. The
        record key and partition columns cannot be set (that is a delete and an insert), nor the
        ordering field (a lower value would lose to the stored row). Read and write are one
        transaction, as for `delete(predicate=...)`; `instant` is None when no row matched."""
        if not set:
            raise _native.InvalidArgumentError("update needs at least one column to set")
        fixed = self._fixed_columns()
        schema = self.schema
        for name in set:
            if name not in schema.names or name.startswith(_META_PREFIX):
                raise _native.SchemaMismatchError(
                    f"update sets `{name}`, which the table lacks: {schema.names}"
                )
            if name in fixed:
                raise _native.InvalidArgumentError(
                    f"update cannot set `{name}`: it is a record key, partition or ordering field"
                )

        def rows() -> pa.Table:
            matched = self.to_arrow(filter=predicate, with_meta_columns=False)
            return _set_columns(matched, set, schema)

        return self._by_predicate("upsert", rows, conflict_retries, extra_metadata)

    def merge(self, source: ArrowData, *, on: str | Sequence[str] | None = None) -> Merge:
        """Starts a merge of `source` into the table: its rows are matched with the table's by
        record key (and partition columns: `on`, default those), then the `when_*` clauses of
        the returned `oxlake.merge.Merge` decide what each row does, and `execute()` writes it
        as one commit:

            t.merge(changes).when_matched_update(
                {"fare": pc.field("source", "fare")},
                condition=pc.field("source", "ts") > pc.field("target", "ts"),
            ).when_not_matched_insert_all().execute()

        Conditions and values are `pyarrow.compute` expressions over `source` (the source row)
        and `target` (the stored row). An update sets only the columns it names (a partial
        update: the others keep the stored values)."""
        from oxlake import merge

        keys = self._key_columns()
        table = pa.table(_arrow_stream(source)) if not isinstance(source, pa.Table) else source
        return merge.start(
            self.properties,
            self.schema,
            table,
            keys if on is None else ([on] if isinstance(on, str) else list(on)),
            keys,
            self._fixed_columns(),
            lambda k: self.lookup(k),
            self._by_predicate,
        )

    def _fixed_columns(self) -> list[str]:
        """The columns an update cannot set: record key, partition and ordering fields."""
        props = self.properties
        ordering = props.get("hoodie.table.ordering.fields") or props.get("hoodie.table.precombine.field")
        return self._key_columns() + [o for o in (ordering or "").split(",") if o]

    def _key_columns(self) -> list[str]:
        props = self.properties
        keys = [k for k in props.get("hoodie.table.recordkey.fields", "").split(",") if k]
        parts = [p.split(":")[0] for p in props.get("hoodie.table.partition.fields", "").split(",") if p]
        return list(dict.fromkeys(keys + parts))

    def _by_predicate(
        self,
        operation: str,
        read: Callable[[], pa.Table],
        conflict_retries: int,
        extra_metadata: Mapping[str, str] | None,
    ) -> WriteResult:
        """Writes what `read` reads from the table, as one transaction with that read: the
        timeline is listed before the read, and the write conflicts with any commit completed
        since; then the read and the write run again."""
        for attempt in range(conflict_retries + 1):
            listed = [(i.time, i.action, i.state) for i in self.timeline()]
            data = read()
            if data.num_rows == 0:
                return WriteResult(None, 0, 0, 0, [])
            try:
                return self._write(operation, data, None, 0, None, extra_metadata, read_from=listed)
            except _native.CommitConflictError:
                if attempt == conflict_retries:
                    raise
        raise AssertionError("unreachable")

    def _key_rows(self, items: list[Any]) -> pa.Table:
        """Rows of the key and partition columns (the key columns alone with a global index)
        from a list of dicts or of plain keys."""
        columns = self._key_columns()
        if self.global_index:
            keys = self.properties.get("hoodie.table.recordkey.fields", "")
            columns = [k for k in keys.split(",") if k]
        schema = self.schema
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise _native.InvalidArgumentError(
                f"the key columns {missing} are not in the table's schema: give the rows to delete as a table"
            )
        if all(isinstance(i, dict) for i in items):
            absent = sorted({c for i in items for c in columns if c not in i})
            if absent:
                raise _native.InvalidArgumentError(
                    f"rows to delete lack the key or partition columns {absent}"
                )
            return pa.table({c: _key_column(schema.field(c), [i[c] for i in items]) for c in columns})
        if len(columns) != 1:
            raise _native.InvalidArgumentError(
                "a plain list of keys deletes only from a table keyed by one field without partitions "
                f"or with a global index; "
                f"this one needs {columns} for each row: give rows, e.g. [{dict.fromkeys(columns, '...')}]"
            )
        return pa.table({columns[0]: _key_column(schema.field(columns[0]), items)})

    def bulk_insert(
        self,
        data: ArrowData,
        *,
        sort_mode: SortMode = "none",
        target_file_size: int | None = None,
        conflict_retries: int = 0,
        schema_mode: SchemaMode = "strict",
        extra_metadata: Mapping[str, str] | None = None,
        chunk_bytes: int | None = None,
    ) -> WriteResult:
        """Loads records as Apache Hudi's `bulk_insert` does, the fastest way to add data: no key
        is looked up and every record goes to new files (no small file is topped up). Duplicate
        keys in `data` are **not** combined (Hudi's `hoodie.combine.before.insert=false`): each
        row is written, so load data whose keys are unique, and use `upsert` for the rest.

        `sort_mode` (Hudi's `hoodie.bulkinsert.sort.mode`): `"none"` writes rows as they come;
        `"global_sort"` and `"partition_sort"` order each partition's rows by record key before
        they are cut into files, so that every file holds a narrow key range and later key
        lookups (upserts, deletes) read fewer files. In one process both sorts are the same; a
        Spark write (`oxlake.spark.write`) sorts the whole frame for `global_sort` and each task's
        rows for `partition_sort`.

        A stream is written in bounded memory, whatever its size (a `RecordBatchReader`, a
        generator of batches through `pa.RecordBatchReader.from_batches`, any
        `__arrow_c_stream__`): it is taken `chunk_bytes` of Arrow data at a time (default
        512 MiB; peak memory is a few times that) and each chunk is written to files of its own
        before the next is read, all in one commit. Data already in memory (a pyarrow Table or
        RecordBatch, a pandas DataFrame) is written whole, as `insert` writes it, unless
        `chunk_bytes` is given. A failure of the input midway rolls the whole
        write back. `partition_sort` then orders each chunk's rows. `global_sort`, and
        `conflict_retries > 0` (a stream cannot be read twice), hold the whole input instead."""
        return self._write(
            "bulk_insert",
            data,
            target_file_size,
            conflict_retries,
            schema_mode,
            extra_metadata,
            sort_mode,
            chunk_bytes=chunk_bytes,
        )

    def insert_overwrite(
        self,
        data: ArrowData,
        *,
        target_file_size: int | None = None,
        schema_mode: SchemaMode = "strict",
        extra_metadata: Mapping[str, str] | None = None,
    ) -> WriteResult:
        """Replaces every partition present in `data` with `data`."""
        return self._write("insert_overwrite", data, target_file_size, 0, schema_mode, extra_metadata)

    def insert_overwrite_table(
        self,
        data: ArrowData,
        *,
        target_file_size: int | None = None,
        schema_mode: SchemaMode = "strict",
        extra_metadata: Mapping[str, str] | None = None,
    ) -> WriteResult:
        """Replaces the whole table with `data`."""
        return self._write("insert_overwrite_table", data, target_file_size, 0, schema_mode, extra_metadata)

    def history(self, *, include_archived: bool = False) -> list[Commit]:
        """The completed commits (commits, deltacommits, replacecommits), oldest first, with
        their operation, what they wrote and the `extra_metadata` they recorded; with
        `include_archived=True` also those archival moved."""
        return [
            Commit(time, action, completion, operation, *counts, *files, dict(extra), dict(partitions))
            for time, action, completion, operation, counts, files, extra, partitions in self._t.commits(
                include_archived
            )
        ]

    # -- reads ------------------------------------------------------------------------------

    def scan(
        self,
        *,
        columns: Sequence[str] | None = None,
        filter: FilterLike | None = None,
        as_of: TimeLike | None = None,
        query: QueryType = "snapshot",
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        batch_size: int | None = None,
        memory_limit: int | None = None,
        with_meta_columns: bool = True,
    ) -> Scan:
        """Reads the table.

        `query="snapshot"` reads the table as of `as_of` (an instant time, default latest);
        `query="read_optimized"` reads base files only (merge-on-read tables: the state as of each
        file group's last compaction); `query="incremental"` reads the records changed by the
        commits in `(start, end]`; `query="changes"` returns every key whose state differs
        between `start` and `end`, with its state at `end` and a `_change_type` column
        (`insert`, `update` or `delete`; a deleted row carries its key and partition columns,
        the others null).
        `columns` the columns to read (all by default; `with_meta_columns=False` leaves out
        Apache Hudi's `_hoodie_*` meta columns).
        `filter` is a SQL expression (`"city = 'sf' AND fare > 10"`) or `[(col, op, value), ...]`.
        `as_of`, `start` and `end` are instant times (`"20260201103000000"`, or a string of 8, 14
        or 17 digits with any separators: `"2026-02-01"`, `"2026-02-01T10:30:00"`) or a
        `datetime`/`date`/pandas `Timestamp`: one with a time zone is converted to the table's
        timeline zone (UTC unless `hoodie.table.timeline.timezone=LOCAL`), one without is taken
        in it. `as_of` a time between commits reads the table as of the last commit before it;
        one before the table's first commit is an error. Windows (`start`, `end`) of
        incremental and change queries bound requested times on table version 6 and completion
        times on versions 8 and 9 (`WriteResult.completion`, `Instant.completion`), as Apache
        Hudi's own: continue after a write from its `completion` there.
        `memory_limit` bounds the bytes a scan holds (merge-on-read log records included); a
        slice whose logs exceed it is merged in several passes. Default: 1 GiB.
        """
        as_of_time = self._time(as_of, "as_of")
        cols = _columns(columns)
        if cols is None and not with_meta_columns:
            cols = read_columns(self, None, False, query, as_of_time) or []
            if query == "changes":
                cols.append(_CHANGE_TYPE)
        native = self._t.scan(
            cols,
            _filter(filter),
            as_of_time,
            query,
            self._time(start, "start"),
            self._time(end, "end"),
            batch_size,
            memory_limit,
        )
        return Scan(native)

    def to_arrow(
        self,
        *,
        columns: Sequence[str] | None = None,
        filter: FilterLike | None = None,
        as_of: TimeLike | None = None,
        query: QueryType = "snapshot",
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        batch_size: int | None = None,
        memory_limit: int | None = None,
        with_meta_columns: bool = True,
    ) -> pa.Table:
        """The result of `scan` (same arguments) as one `pyarrow.Table`."""
        return self.scan(
            columns=columns,
            filter=filter,
            as_of=as_of,
            query=query,
            start=start,
            end=end,
            batch_size=batch_size,
            memory_limit=memory_limit,
            with_meta_columns=with_meta_columns,
        ).to_arrow()

    def to_pandas(
        self,
        *,
        columns: Sequence[str] | None = None,
        filter: FilterLike | None = None,
        as_of: TimeLike | None = None,
        query: QueryType = "snapshot",
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        batch_size: int | None = None,
        memory_limit: int | None = None,
        with_meta_columns: bool = True,
    ) -> pd.DataFrame:
        """The result of `scan` (same arguments) as a pandas `DataFrame`."""
        require("pandas", needed_by="to_pandas")
        return self.to_arrow(
            columns=columns,
            filter=filter,
            as_of=as_of,
            query=query,
            start=start,
            end=end,
            batch_size=batch_size,
            memory_limit=memory_limit,
            with_meta_columns=with_meta_columns,
        ).to_pandas()

    def splits(
        self,
        *,
        columns: Sequence[str] | None = None,
        filter: FilterLike | None = None,
        as_of: TimeLike | None = None,
        query: QueryType = "snapshot",
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        target_bytes: int = 128 * 1024 * 1024,
        min_splits: int = 1,
    ) -> list[Split]:
        """Plans a query once and cuts it into `Split`s of about `target_bytes` (whole file
        slices; partitions the filter rules out are dropped) for workers to read with
        `scan_split`: every worker reads the table state planned here. When that gives fewer than
        `min_splits` (the workers' cores, say), base files are cut by rows so that each worker
        has a part (pieces of at least 10,000 rows). A part of a merge-on-read slice merges the
        slice's logs over its rows, so such a slice is cut into no more parts than twice the
        times its logs fit in its base file."""
        times = self._time(as_of, "as_of"), self._time(start, "start"), self._time(end, "end")
        planned = self._t.splits(
            _columns(columns), _filter(filter), times[0], query, *times[1:], target_bytes, min_splits
        )
        return [Split(bytes(data), size, files) for data, size, files in planned]

    def scan_split(
        self,
        split: Split,
        *,
        columns: Sequence[str] | None = None,
        filter: FilterLike | None = None,
        batch_size: int | None = None,
        memory_limit: int | None = None,
    ) -> Scan:
        """Reads one split of `splits` (give the same columns and filter)."""
        return Scan(
            self._t.scan_split(split.data, _columns(columns), _filter(filter), batch_size, memory_limit)
        )

    def to_pyarrow_dataset(
        self,
        *,
        as_of: TimeLike | None = None,
        query: Literal["snapshot", "read_optimized"] = "snapshot",
        with_meta_columns: bool = True,
    ) -> pyarrow.dataset.Dataset:
        """The table as of `as_of` (default: now) as a `pyarrow.dataset.Dataset`: a source that
        can be queried again and again, and that DuckDB (`duckdb.sql("... from ds where ...")`),
        Polars (`pl.scan_pyarrow_dataset(ds)`) and pyarrow (`ds.to_table(columns=, filter=)`)
        push their projections and filters into.

        Base files that hold their rows as they are (no merge-on-read log over them, columns
        under the table's names and types) are read by pyarrow itself: their footers are read
        once here, so a filter skips row groups and whole files by their statistics and only
        the projected columns are read. The rest (file slices with logs, files written before a
        column was renamed, stores pyarrow has no file system for: anything but local disk and
        S3) is merged by oxlake here and held in memory; compact a merge-on-read table first to
        keep that small. Commits after the call are not seen: call it again for a newer
        snapshot (a `Table` itself, as an Arrow stream, is read anew at every use). pyarrow's
        pruning by Parquet statistics does not see NaN (the statistics leave it out): a filter
        that holds for NaN (`x > 5` in DuckDB's and DataFusion's order, `is_nan`) may miss NaN
        rows of files pyarrow reads; `t.to_arrow(filter=...)` does not prune by statistics on
        float columns."""
        from oxlake._dataset import to_dataset

        return to_dataset(
            self,
            self._time(as_of, "as_of"),
            _one_of("query", query, ("snapshot", "read_optimized")),
            with_meta_columns,
        )

    def planned_files(
        self,
        *,
        as_of: TimeLike | None = None,
        query: QueryType = "snapshot",
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        filter: FilterLike | None = None,
    ) -> list[str]:
        """The files (base and log files) a scan would read, after pruning by the metadata
        table's `column_stats` and `bloom_filters` (with a filter), before partition pruning."""
        times = self._time(as_of, "as_of"), self._time(start, "start"), self._time(end, "end")
        return list(self._t.planned_files(times[0], query, *times[1:], _filter(filter)))

    def to_polars(
        self,
        *,
        columns: Sequence[str] | None = None,
        filter: FilterLike | None = None,
        as_of: TimeLike | None = None,
        query: QueryType = "snapshot",
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        with_meta_columns: bool = True,
    ) -> pl.DataFrame:
        """The result of `scan` (same arguments) as a Polars `DataFrame`; `oxlake.polars.scan`
        gives a lazy frame that pushes a Polars query's projection and filters into the scan."""
        return self.scan(
            columns=columns,
            filter=filter,
            as_of=as_of,
            query=query,
            start=start,
            end=end,
            with_meta_columns=with_meta_columns,
        ).to_polars()

    def __datafusion_table_provider__(self, session: object | None = None) -> object:
        """The latest snapshot as a table provider for datafusion-python 55 (the DataFusion
        version of oxlake's core): `ctx.register_table("trips", t)` then SQL over it, with
        DataFusion's projection, filters and limit pushed into oxlake's scan (partition and
        row-group pruning, the merge-on-read merge). Planned at registration: register again to
        see later commits."""
        if session is None:  # datafusion-python before 52 asks without its session
            raise _native.UnsupportedError(
                "registering an oxlake table needs datafusion-python 55 (the DataFusion version of oxlake's "
                "core): pip install 'oxlake[datafusion]'"
            )
        return self._t.__datafusion_table_provider__(session)

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The table's latest snapshot as an Arrow stream, read anew at every call: a `Table` is
        a reusable source for engines that take Arrow streams (`duckdb.sql("from t")` as often
        as wanted, `pl.DataFrame(t)`, `pa.table(t)`), each seeing the table as it is then."""
        return self.scan().__arrow_c_stream__(requested_schema)

    def _time(self, value: TimeLike | None, name: str) -> str | None:
        if value is None or isinstance(value, str):
            return value
        zone = self.properties.get("hoodie.table.timeline.timezone", "UTC")
        return _time(value, name, utc=zone.upper() != "LOCAL")

    def __repr__(self) -> str:
        return f"oxlake.Table({self.uri!r})"


def table_name_of(uri: str) -> str:
    """The `hoodie.table.name` of a table created at `uri` without `name=`: its last path segment
    with every character outside ASCII letters, digits and `_` made `_`, so that it is also a valid
    Avro name (Hudi names the schema's record `<name>_record` in namespace `hoodie.<name>`)."""
    last = uri.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_]", "_", last)
    if not name.strip("_"):
        return "table"
    return "_" + name if name[0].isdigit() else name


def create_table(
    uri: str,
    schema: pa.Schema,
    *,
    record_key: str | Sequence[str],
    partition_by: Sequence[str] | None = None,
    ordering_field: str | None = None,
    table_type: TableType = "copy_on_write",
    storage_options: dict[str, str] | None = None,
    name: str | None = None,
    hive_style: bool = True,
    heartbeat_interval: float = 10.0,
    inline_compaction: int | None = None,
    table_version: int = 8,
    key_generator_options: Mapping[str, str] | None = None,
    url_encode: bool = True,
    global_index: bool = False,
    meta_fields: bool = True,
    metadata: bool = True,
) -> Table:
    """Creates an Apache Hudi table and returns it open.

    `table_version` is the Hudi table format: 8 (the default; Apache Hudi 1.0: the timeline under
    `.hoodie/timeline/`, instants named with their completion times, commit metadata in Avro), 9
    (Apache Hudi 1.1) or 6 (read and written by Apache Hudi 0.14 and 0.15). Choose 6 while any
    job on the table still runs Hudi 0.x; 8 once all run Hudi 1.x (`Table.upgrade` moves a
    version 6 table there later). Their archived timeline is Hudi 1.x's LSM timeline
    (`.hoodie/timeline/history`).

    `record_key` names one field (simple keys) or several (complex keys `f1:v1,f2:v2`);
    `partition_by` the partition fields (`field=value` directories when `hive_style`; values are
    escaped as Hive and Hudi do, `hoodie.datasource.write.partitionpath.urlencode=true`, so that
    any string is a directory name: `a/b:c` is `a%2Fb%3Ac`; null and `""` go to
    `__HIVE_DEFAULT_PARTITION__`);
    A partition field written `field:timestamp` is partitioned by time, as Apache Hudi's
    timestamp-based and custom key generators do: its value (seconds, milliseconds or
    microseconds since the epoch, a date string, or an Arrow timestamp) is printed with a date
    pattern, configured by Apache Hudi's options in `key_generator_options`, e.g.
    `{"hoodie.keygen.timebased.timestamp.type": "EPOCHMILLISECONDS",
    "hoodie.keygen.timebased.output.dateformat": "yyyy/MM/dd"}` (Joda patterns; time zones in
    `hoodie.keygen.timebased.timezone`, UTC when unset). With `url_encode=False` (Hudi's
    default) a `/` in the pattern makes nested directories; with `True` (oxlake's default) every
    partition value is escaped into one directory name, `/` as `%2F`.
    `ordering_field` the event-time field that decides which version of a record wins.
    `inline_compaction=N` (merge-on-read) makes every writer compact the table after N
    deltacommits since the last compaction (a table property, so all writers agree).
    `global_index=True` makes record keys unique across partitions, as Apache Hudi's global
    indexes (`GLOBAL_SIMPLE`, `RECORD_INDEX`) with `update.partition.path` do: writes look keys up
    in every partition, an upsert giving a key another partition value moves its record there
    (the older version is deleted from its old partition in the same commit; under an
    `ordering_field` only when the incoming version wins), an insert looks its keys up as an
    upsert does, and a delete finds a key wherever it is (its partition columns may be left
    out). `bulk_insert` and `insert_overwrite` do not look keys up: loading a key that is
    already in another partition leaves it in both (an upsert then updates the copy in the
    partition it names). A lookup then reads every partition's keys, so
    build the record index (`build_metadata(record_index=True)`) on large tables. Without it
    (the default, as Apache Hudi's default indexes) a key is unique within its partition: the
    same key in two partitions is two records. A table property (`oxlake.index.global`), so
    every oxlake writer agrees; Apache Hudi writers must be given a global index themselves.
    `meta_fields=False` makes a table without meta fields (Apache Hudi's virtual keys,
    `hoodie.populate.meta.fields=false`): data files keep the five `_hoodie_*` columns, all null,
    and every reader and writer makes a row's key from its record key fields. Writes are cheaper
    (no per-row key, sequence number or file name is stored); what is given up: the meta columns
    read null, incremental queries admit whole files of the commits in their window (not single
    rows), change queries are refused, and the record index is not kept (`lookup`, `merge` and a
    global index read the key fields instead).
    `metadata` (on by default, as Apache Hudi's metadata table is since 0.11) gives the table its
    metadata table at creation, with the `files` index alone: planning reads the table's files
    from it instead of listing directories, and every write keeps it in step (no instant of its
    own on the timeline). `metadata=False` leaves it out; `Table.build_metadata` adds it, or the
    column-stats, bloom-filter and record indexes, later.
    `name` (`hoodie.table.name`) defaults to the last segment of `uri` made a valid name
    (`table_name_of`).
    """
    keys = [record_key] if isinstance(record_key, str) else list(record_key)
    table_name = name if name is not None else table_name_of(uri)
    native = _native.create_table(
        uri,
        schema,
        keys,
        list(partition_by or []),
        ordering_field,
        table_type,
        table_name,
        hive_style,
        storage_options,
        heartbeat_interval,
        inline_compaction,
        table_version,
        dict(key_generator_options or {}),
        url_encode,
        global_index,
        meta_fields,
        metadata,
    )
    return Table._wrap(native)


class UpdateSchema:
    """Schema changes collected by `Table.update_schema`, committed as one schema version."""

    def __init__(self, table: Table) -> None:
        self._table = table
        self._changes: list[tuple[str, list[str], str | None, int | None]] = []
        self._types: list[pa.DataType] = []
        #: The instant of the commit, once committed (`None` if nothing changed).
        self.instant: str | None = None

    @staticmethod
    def _path(path: str | Sequence[str]) -> list[str]:
        return [path] if isinstance(path, str) else list(path)

    def _typed(
        self, kind: str, path: str | Sequence[str], field_type: pa.DataType, arg: str | None
    ) -> UpdateSchema:
        if not isinstance(field_type, pa.DataType):
            raise _native.InvalidArgumentError(
                f"{kind}: `field_type` must be a pyarrow DataType, not {field_type!r}"
            )
        self._types.append(field_type)
        self._changes.append((kind, self._path(path), arg, len(self._types) - 1))
        return self

    def add_column(
        self, path: str | Sequence[str], field_type: pa.DataType, doc: str | None = None
    ) -> UpdateSchema:
        """Adds a nullable column (a tuple path adds a field to a struct column)."""
        return self._typed("add", path, field_type, doc)

    def rename_column(self, path_from: str, new_name: str) -> UpdateSchema:
        """Renames a top-level column; files written before are read by its id."""
        self._changes.append(("rename", self._path(path_from), new_name, None))
        return self

    def delete_column(self, path: str) -> UpdateSchema:
        """Drops a top-level column from the schema (its data stays in older files, unread)."""
        self._changes.append(("delete", self._path(path), None, None))
        return self

    def update_column(self, path: str | Sequence[str], field_type: pa.DataType) -> UpdateSchema:
        """Widens a column's type by the promotions writes allow (int → long, float → double...)."""
        return self._typed("update", path, field_type, None)

    def move_first(self, path: str) -> UpdateSchema:
        """Makes a top-level column the first data column."""
        self._changes.append(("first", self._path(path), None, None))
        return self

    def move_before(self, path: str, before_path: str) -> UpdateSchema:
        """Moves a top-level column right before another."""
        self._changes.append(("before", self._path(path), before_path, None))
        return self

    def move_after(self, path: str, after_path: str) -> UpdateSchema:
        """Moves a top-level column right after another."""
        self._changes.append(("after", self._path(path), after_path, None))
        return self

    def commit(self) -> str | None:
        """Commits the changes collected so far; returns the instant (`None`: nothing changed)."""
        types = pa.schema([pa.field(str(i), t) for i, t in enumerate(self._types)])
        self.instant = _native.alter_schema(self._table._t, self._changes, types)
        self._changes, self._types = [], []
        return self.instant

    def __enter__(self) -> UpdateSchema:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.commit()


def write_table(
    uri: str,
    data: ArrowData,
    *,
    mode: WriteMode = "create",
    record_key: str | Sequence[str] | None = None,
    partition_by: Sequence[str] | None = None,
    ordering_field: str | None = None,
    table_type: TableType | None = None,
    storage_options: dict[str, str] | None = None,
    schema_mode: SchemaMode = "strict",
    extra_metadata: Mapping[str, str] | None = None,
    **create_options: Any,
) -> Table:
    """Writes `data` to the table at `uri` in one call, creating the table from `data`'s schema
    when there is none (as `deltalake.write_deltalake` does), and returns it open.

    `mode`: `"create"` makes a new table and fails with `TableExistsError` when one is there;
    `"append"` inserts into the table (creating it when absent); `"upsert"` upserts into it
    (creating it when absent); `"overwrite"` replaces the whole table's rows with `data`
    (creating it when absent). A new table needs `record_key`; `partition_by`,
    `ordering_field`, `table_type` (default copy-on-write) and any other `create_table` option
    (`create_options`: `table_version=`, `name=`, `inline_compaction=`, ...) apply only when it
    is created, and
    are refused when it exists and they differ from its own."""
    if mode not in ("create", "append", "upsert", "overwrite"):
        raise _native.InvalidArgumentError(
            f"`mode` is one of 'create', 'append', 'upsert', 'overwrite', not {mode!r}"
        )
    stream = _arrow_stream(data)
    try:
        table = None if mode == "create" else Table(uri, storage_options=storage_options)
    except _native.TableNotFoundError:
        table = None
    if table is None:
        if record_key is None:
            raise _native.InvalidArgumentError(
                f"there is no table at {uri}: `record_key` is needed to create one"
            )
        schema = pa.schema(stream.schema) if isinstance(stream, pa.Table) else None
        if schema is None:
            # A stream is read once: take it whole to learn its schema (pass a pyarrow Table to
            # avoid the copy).
            stream = pa.RecordBatchReader.from_stream(stream).read_all()
            schema = stream.schema
        table = create_table(
            uri,
            schema,
            record_key=record_key,
            partition_by=partition_by,
            ordering_field=ordering_field,
            table_type=table_type or "copy_on_write",
            storage_options=storage_options,
            **create_options,
        )
    else:
        _check_same_layout(table, record_key, partition_by, ordering_field, table_type, create_options)
    operation = {
        "create": "insert",
        "append": "insert",
        "upsert": "upsert",
        "overwrite": "insert_overwrite_table",
    }
    table._write(operation[mode], stream, None, 0, schema_mode, extra_metadata)
    return table


def _check_same_layout(
    table: Table,
    record_key: str | Sequence[str] | None,
    partition_by: Sequence[str] | None,
    ordering_field: str | None,
    table_type: TableType | None,
    create_options: Mapping[str, Any],
) -> None:
    """Refuses `write_table` options that describe a table other than the one at its URI."""
    props = table.properties
    given: list[tuple[str, object, object]] = []
    if record_key is not None:
        keys = [record_key] if isinstance(record_key, str) else list(record_key)
        given.append(("record_key", keys, props.get("hoodie.table.recordkey.fields", "").split(",")))
    if partition_by is not None:
        parts = [p.split(":")[0] for p in props.get("hoodie.table.partition.fields", "").split(",") if p]
        given.append(("partition_by", [p.split(":")[0] for p in partition_by], parts))
    if ordering_field is not None:
        ordering = props.get("hoodie.table.ordering.fields") or props.get("hoodie.table.precombine.field")
        given.append(("ordering_field", ordering_field, ordering))
    if table_type is not None:
        given.append(("table_type", table_type.upper(), props.get("hoodie.table.type", "COPY_ON_WRITE")))
    for name, wanted, actual in given:
        if wanted != actual:
            raise _native.InvalidArgumentError(
                f"write_table: the table at {table.uri} has {name} {actual!r}, not {wanted!r}"
            )
    if create_options:
        raise _native.InvalidArgumentError(
            f"write_table: {sorted(create_options)} apply when a table is created; "
            f"the one at {table.uri} exists"
        )
