"""The Spark side of the pipeline: the functions that run in tasks (`mapInArrow`), grouping of
rows by key inside a task, the adapters running table functions (`rules`) there, and the
one-commit writer of a catalog."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from oxlake import _native
from oxlake._engine import IS_DELETED, native
from oxlake._spark_io import compact_if_due
from oxlake.pipeline import _payload, rules
from oxlake.pipeline.catalog import STATE_LAYER
from oxlake.pipeline.compilers import Compiler, DirectCompiler, InputPartition, MapGroupCompiler
from oxlake.table import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

INPUT = "catalog string, layer string, partition string, payload binary"
CANDIDATE = "layer string, partition string, payload binary"
KEY = "layer string, partition string"
OUT_KEY = "out_layer string, out_partition string"
IN_KEY = "catalog string, layer string, partition string"
EDGE = f"{OUT_KEY}, {IN_KEY}"
PIECE = f"{OUT_KEY}, {IN_KEY}, seq int, value binary"
DIRECT_INPUT = f"{OUT_KEY}, {INPUT}"
WRITE = "op string, layer string, partition string, payload binary, checksum string"
ROWS = f"task string, {WRITE}, compiled boolean"

#: The Arrow schema of PIECE rows.
PIECES = rules.PIECES

#: A catalog's timeline as listed: (time, action, state) of each instant.
Listed = list[tuple[str, str, str]]

#: Struct types of structured layers: of a task's inputs by (catalog, layer), of the output by layer.
InputTypes = Mapping[tuple[str, str], pa.StructType]
OutputTypes = Mapping[str, pa.StructType]


def ship(task: Compiler) -> None:
    """Pickles the compiler's own module (and its bases' modules) by value, so that Spark's
    workers need not import them (compilers live in scripts, notebooks and test modules)."""
    from pyspark import cloudpickle

    for cls in type(task).__mro__:  # its base classes' modules too (a script's own bases)
        module = sys.modules.get(cls.__module__)
        if module is not None and not cls.__module__.startswith(("oxlake", "builtins")):
            cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def frame(spark: SparkSession, table: pa.Table, schema: str) -> DataFrame:
    """An Arrow table built on the driver as a DataFrame of `schema`."""
    return spark.createDataFrame(table, schema)


def collect(df: DataFrame) -> pa.Table:
    """A (small) DataFrame on the driver, as Arrow."""
    return df.toArrow()


def run_chunks(
    spark: SparkSession,
    table: pa.Table,
    fn: Callable[[pa.Table], pa.Table],
    schema: pa.Schema,
    group_by: list[str] | None = None,
) -> pa.Table:
    """`fn` (an Arrow table → a table of `schema`) over the rows of `table` on Spark's
    executors, in one stage without a shuffle, the results back on the driver. The driver cuts
    the table into a few chunks per core (each holding whole groups of rows equal on
    `group_by`), one Arrow IPC message each."""
    from oxlake.spark import spark_schema

    if table.num_rows == 0:
        return schema.empty_table()
    if group_by:
        table = table.sort_by([(c, "ascending") for c in group_by])
    blobs = [_ipc(chunk) for chunk in _chunks(table, 4 * spark.sparkContext.defaultParallelism, group_by)]
    chunks = pa.Table.from_batches([pa.record_batch({"chunk": pa.array([b], pa.binary())}) for b in blobs])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for blob in batch.column(0).to_pylist():
                yield from fn(pa.ipc.open_stream(blob).read_all()).to_batches()

    out = spark.createDataFrame(chunks, "chunk binary").mapInArrow(run, spark_schema(schema))
    return collect(out).cast(schema)


def _chunks(table: pa.Table, n: int, group_by: list[str] | None) -> Iterator[pa.Table]:
    """About `n` slices of `table`; with `group_by`, cut only between rows that differ on it
    (the table is sorted by it)."""
    columns = [table.column(c) for c in group_by or []]

    def same_group(a: int, b: int) -> bool:
        return bool(columns) and all(c[a] == c[b] for c in columns)

    rows, start = table.num_rows, 0
    for i in range(1, n + 1):
        end = rows * i // n
        while 0 < end < rows and same_group(end, end - 1):  # only at the cuts: groups are small
            end += 1
        if end > start:
            yield table.slice(start, end - start)
            start = end


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def on_table(
    fn: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], schema: pa.Schema
) -> Callable[[pa.Table], pa.Table]:
    """A `mapInArrow` function as a function of one Arrow table."""

    def run(table: pa.Table) -> pa.Table:
        return pa.Table.from_batches(list(fn(iter(table.to_batches()))), schema)

    return run


def per_batch(
    fn: Callable[[pa.Table], pa.Table],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function of an Arrow table as a `mapInArrow` function, applied to each batch."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from fn(pa.Table.from_batches([batch])).to_batches()

    return run


def per_task(
    fn: Callable[[pa.Table], pa.Table],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function of an Arrow table as a `mapInArrow` function, applied once to all of a task's
    rows (whole groups, after a repartition by their key)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = _rows(batches)
        if table is not None:
            yield from fn(table).to_batches()

    return run


def summed(fn: Callable[[pa.Table], pa.Table]) -> Callable[[pa.Table], pa.Table]:
    """`fn` (returning CANDIDATES rows) with its rows checksummed where it runs (SUMMED rows)."""

    def run(table: pa.Table) -> pa.Table:
        return rules.checksummed(fn(table))

    return run


def converted(
    type: pa.StructType, to_struct: bool, layer: str = "payload"
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """(partition, payload) rows of one structured layer for a DataFrame function: encoded
    bytes → struct values in Spark's types (`to_struct`; as `oxlake.spark.read` gives them:
    times of day as microseconds, sub-microsecond parts dropped), or the function's struct
    values in Spark's types → encoded bytes of `type` (a value it cannot hold exactly raises)."""
    from oxlake._spark_io import as_spark, from_spark_values

    schema = pa.schema([("partition", pa.string()), ("payload", type)])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            payload = batch.column("payload")
            if to_struct:
                rows = pa.RecordBatch.from_arrays(
                    [batch.column("partition"), _payload.to_struct(payload, type)], schema=schema
                )
                yield from as_spark(iter([rows]), schema)
            else:
                out = _payload.to_bytes(from_spark_values(payload, type, f"structured layer {layer!r}"), type)
                yield pa.RecordBatch.from_arrays(
                    [batch.column("partition"), out], names=["partition", "payload"]
                )

    return run


def struct_rows(type: pa.StructType) -> Any:
    """The Spark schema of (partition, payload) rows of a structured layer."""
    from oxlake.spark import spark_schema

    return spark_schema(pa.schema([("partition", pa.string()), ("payload", type)]))


def _inputs(rows: pa.Table, types: InputTypes) -> list[InputPartition]:
    """INPUT rows as the compiler sees them: structured payloads decoded."""
    items = []
    for cat, layer, part, payload in zip(
        *(rows.column(x).to_pylist() for x in [*rules.IN_KEYS, "payload"]), strict=True
    ):
        type = types.get((cat, layer))
        value = _payload.decode(payload, type) if type is not None and payload is not None else payload
        items.append(InputPartition(cat, layer, part, value))
    return items


def _rows(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    kept = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(kept) if kept else None


def groups(table: pa.Table, keys: list[str], order: list[str]) -> Iterator[tuple[tuple[Any, ...], pa.Table]]:
    """The rows of `table` grouped by `keys`, each group sorted by `order`."""
    table = table.take(pc.sort_indices(table, [(c, "ascending") for c in keys + order]))
    columns = [table.column(k).to_pylist() for k in keys]
    start = 0
    for i in range(1, table.num_rows + 1):
        if i == table.num_rows or any(col[i] != col[start] for col in columns):
            yield tuple(col[start] for col in columns), table.slice(start, i - start)
            start = i


def output_keys(
    task: DirectCompiler, with_payload: bool
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Input rows → one row per output key they contribute to (payload carried when asked)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            cols = {c: batch.column(c).to_pylist() for c in rules.IN_KEYS}
            out: dict[str, list[Any]] = {c: [] for c in rules.OUT_KEYS + rules.IN_KEYS}
            take: list[int] = []
            for i, (cat, layer, part) in enumerate(
                zip(cols["catalog"], cols["layer"], cols["partition"], strict=True)
            ):
                for key in task.output_keys(cat, layer, part):
                    out_layer, out_part = task.output_key(*key)
                    out["out_layer"].append(out_layer)
                    out["out_partition"].append(out_part)
                    out["catalog"].append(cat)
                    out["layer"].append(layer)
                    out["partition"].append(part)
                    take.append(i)
            arrays = {c: pa.array(v, pa.string()) for c, v in out.items()}
            if with_payload:
                arrays["payload"] = batch.column("payload").take(pa.array(take, pa.int64()))
            yield pa.RecordBatch.from_pydict(arrays)

    return run


Build = Callable[[str, str, pa.Table], Any]


#: Keys (of outputs, or of inputs) marked for a task to build.
Keys = set[tuple[str, ...]]


def _per_output(
    order: list[str], build: Build, out_types: OutputTypes, rows: pa.Table, wanted: Keys
) -> pa.Table:
    """CANDIDATES rows of `rows` (holding every row of each of their output keys): one per
    output key, built by `build(layer, partition, rows sorted by order)`, and an empty one for
    each key of `wanted` without rows (`rules.vanished`: no input feeds it any more)."""
    layers, parts, payloads = [], [], []
    for (out_layer, out_part), group in groups(rows, rules.OUT_KEYS, order):
        layers.append(out_layer)
        parts.append(out_part)
        payloads.append(build(out_layer, out_part, group))
    for out_layer, out_part in sorted(wanted - set(zip(layers, parts, strict=True))):
        layers.append(out_layer)
        parts.append(out_part)
        payloads.append(None)
    return pa.Table.from_batches([_candidates(layers, parts, payloads, out_types)], rules.CANDIDATES)


def marks(keys: DataFrame, side: str, columns: str) -> DataFrame:
    """Marks of the `side` ("out": outputs, "in": inputs) `keys` (a DataFrame of that side's key
    columns) as rows of `columns`, which hold both sides' key columns: every column but the keys
    null. Sent with the rows they mark (repartitioned by the side's key), they ask the task
    there to build those keys only (`marked`)."""
    from pyspark.sql import functions as F

    by, _ = rules.SIDES[side]
    fields = [c.split() for c in columns.split(", ")]
    return keys.select(
        *(F.col(name) if name in by else F.lit(None).cast(kind).alias(name) for name, kind in fields)
    )


def marked(table: pa.Table, side: str) -> tuple[pa.Table, Keys]:
    """The rows of `table` whose `side` key is marked (`marks`; the marks left out), and the
    marked keys. A mark is the row whose first key column of the other side is null."""
    by, other = rules.SIDES[side]
    is_mark = pc.is_null(table.column(other[0]))
    keys = table.filter(is_mark).select(by).group_by(by).aggregate([])
    rows = table.filter(pc.invert(is_mark)).join(keys, by, join_type="left semi")
    return rows, set(zip(*(keys.column(c).to_pylist() for c in by), strict=True))


def _marked_or_all(table: pa.Table, side: str, only_marked: bool) -> tuple[pa.Table, Keys]:
    return marked(table, side) if only_marked else (table, set())


def compile_direct(
    task: DirectCompiler, types: InputTypes, out_types: OutputTypes, only_marked: bool = False
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Rows of DIRECT_INPUT (all of an output key in one task) → compiled CANDIDATE rows; with
    `only_marked`, of the marked outputs only (`marks`), empty for those no input feeds."""

    def build(layer: str, partition: str, rows: pa.Table) -> Any:
        return task.compile(layer, partition, _inputs(rows, types))

    def run(table: pa.Table) -> pa.Table:
        rows, wanted = _marked_or_all(table, "out", only_marked)
        return _per_output(rules.IN_KEYS, build, out_types, rows, wanted)

    return per_task(run)


def map_pieces(
    task: MapGroupCompiler, types: InputTypes
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """INPUT rows → PIECE rows (`map` of each input partition)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out: dict[str, list[Any]] = {c: [] for c in [*rules.OUT_KEYS, *rules.IN_KEYS, "seq", "value"]}
            for item in _inputs(pa.Table.from_batches([batch]), types):
                for seq, (layer, partition, value) in enumerate(task.map(item)):
                    out_layer, out_part = task.output_key(layer, partition)
                    keys = (out_layer, out_part, item.catalog, item.layer, item.partition, seq, value)
                    for c, v in zip(out, keys, strict=True):
                        out[c].append(v)
            kinds = [pa.string()] * 5 + [pa.int32(), pa.binary()]
            yield pa.RecordBatch.from_pydict(
                {c: pa.array(v, t) for (c, v), t in zip(out.items(), kinds, strict=True)}
            )

    return run


def reduce_pieces(
    task: MapGroupCompiler, out_types: OutputTypes, graph: bool = False, only_marked: bool = False
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """PIECE rows (all of an output key in one task) → CANDIDATE rows: each output `reduce`d,
    and with `graph` its "out" graph row too (its pieces, `rules.graph_rows`), built from the
    same rows rather than after another shuffle of them. With `only_marked`, of the marked
    outputs only (`marks`): those without pieces get empty rows (a published one is deleted)."""

    def build(layer: str, partition: str, rows: pa.Table) -> Any:
        return task.reduce(layer, partition, rows.column("value").to_pylist())

    def run(table: pa.Table) -> pa.Table:
        rows, wanted = _marked_or_all(table, "out", only_marked)
        outputs = _per_output([*rules.IN_KEYS, "seq"], build, out_types, rows, wanted)
        return pa.concat_tables([outputs, graph_side(task.name, "out", rows, wanted)]) if graph else outputs

    return per_task(run)


def graph_task(
    task: str, side: str, only_marked: bool = False
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """PIECE rows (all of a `side` key in one task) → the graph's CANDIDATE rows of that side
    (`graph_side`); with `only_marked`, of the marked keys only."""

    def run(table: pa.Table) -> pa.Table:
        return graph_side(task, side, *_marked_or_all(table, side, only_marked))

    return per_task(run)


def graph_side(task: str, side: str, pieces: pa.Table, wanted: Keys) -> pa.Table:
    """`rules.graph_rows` of `pieces`, and an empty row for each key of `wanted` without pieces."""
    rows = rules.graph_rows(task, side, pieces)
    by, _ = rules.SIDES[side]
    gone = wanted - set(zip(*(pieces.column(c).to_pylist() for c in by), strict=True))
    names = sorted(rules.graph_name(task, side, key) for key in gone)
    if not names:
        return rows
    keys = pa.table({"layer": [STATE_LAYER] * len(names), "partition": names}, schema=_KEY_SCHEMA)
    return pa.concat_tables([rows, rules.vanished(keys)])


_KEY_SCHEMA = pa.schema([("layer", pa.string()), ("partition", pa.string())])


def _candidates(
    layers: list[str], parts: list[str], values: list[Any], out_types: OutputTypes
) -> pa.RecordBatch:
    """CANDIDATE rows of compiled values: bytes (or None) for a binary layer, a mapping of the
    layer's struct type (or None) for a structured one, encoded."""
    payloads: list[bytes | None] = []
    for layer, value in zip(layers, values, strict=True):
        type = out_types.get(layer)
        if value is None:
            payloads.append(None)
        elif type is not None:
            if not isinstance(value, dict):
                raise TypeError(
                    f"a compiler returned {type_name(value)} for structured layer {layer!r}, not a dict"
                )
            payloads.append(_payload.encode(value, type))
        elif isinstance(value, bytes | bytearray):
            payloads.append(bytes(value))
        else:
            raise TypeError(f"a compiler returned {type_name(value)} for layer {layer!r}, not bytes or None")
    return pa.RecordBatch.from_pydict(
        {
            "layer": pa.array(layers, pa.string()),
            "partition": pa.array(parts, pa.string()),
            "payload": pa.array(payloads, pa.binary()),
        }
    )


def type_name(value: object) -> str:
    return type(value).__name__


def _with_structs(upserts: pa.Table, structured: OutputTypes) -> pa.Table:
    """Rows to write: each structured layer's payloads decoded into its own column (the
    `payload` of those rows null), every struct column present."""
    if not structured:
        return upserts
    layers = upserts.column("layer").to_pylist()
    payloads = upserts.column("payload").to_pylist()
    for layer, type in structured.items():
        values = [
            _payload.decode(p, type) if x == layer and p is not None else None
            for x, p in zip(layers, payloads, strict=True)
        ]
        upserts = upserts.append_column(layer, pa.array(values, type))
    kept = [None if x in structured else p for x, p in zip(layers, payloads, strict=True)]
    return upserts.set_column(
        upserts.schema.get_field_index("payload"), "payload", pa.array(kept, pa.binary())
    )


def _write(
    table: Table,
    instant: str,
    batches: Iterable[pa.RecordBatch],
    structured: OutputTypes,
    task: tuple[int, int] | None,
) -> list[bytes]:
    """Writes WRITE rows as files of the pending `instant`, as ONE upsert whose delete rows are
    flagged `_hoodie_is_deleted`, streamed: the rows are shaped a batch at a time and the write
    spills what is larger than a chunk, so a task never holds all of its rows. Returns what the
    commit needs of the files: the layers written, not each key (a task writes whole layers, and
    the catalog is partitioned by layer; a catalog keeping a record index still lists them)."""
    shaped = (_shaped(b, structured) for b in batches if b.num_rows)
    first = next(shaped, None)
    if first is None:
        return []
    reader = pa.RecordBatchReader.from_batches(first.schema, itertools.chain([first], shaped))
    written = _native.write_files_stream(
        native(table), "upsert", instant, reader, task=task, own_partitions=True
    )
    return [bytes(w) for w in written]


def _shaped(batch: pa.RecordBatch, structured: OutputTypes) -> pa.RecordBatch:
    """Rows of WRITE as the catalog takes them: structured layers' payloads as their struct
    columns, deletes flagged."""
    rows = pa.Table.from_batches([batch]).select(["layer", "partition", "payload", "checksum"])
    rows = _with_structs(rows, structured)
    rows = rows.append_column(IS_DELETED, pc.equal(batch.column("op"), "delete"))
    return rows.combine_chunks().to_batches()[0]


def write_here(
    spark: SparkSession,
    rows: pa.Table,
    uri: str,
    storage_options: dict[str, str] | None,
    structured: OutputTypes,
    read_from: Listed,
) -> str | None:
    """Writes rows of WRITE held by the driver into the catalog at `uri` as ONE commit,
    from the driver (an incremental run's few rows need no Spark job); a compaction that is
    then due runs on the executors, as after `write_one_commit`. `read_from`: the catalog's
    timeline listed before the rows were compiled from it (see `write_one_commit`)."""
    table = Table(uri, storage_options)
    pending = _native.begin_write(native(table), "upsert", read_from)
    try:
        written = _write(table, pending.instant, rows.to_batches(), structured, None)
        landed, *_ = pending.commit(written, compact_inline=False)
    except BaseException:
        pending.abort()
        raise
    compact_if_due(spark, uri, storage_options)
    return landed


def write_one_commit(
    rows: DataFrame,
    uri: str,
    storage_options: dict[str, str] | None,
    structured: OutputTypes,
    read_from: Listed,
) -> str | None:
    """Writes rows of WRITE (`op` upsert or delete) into the catalog at `uri` as ONE commit:
    the driver opens the instant, each Spark task writes whole layers (deletes, then upserts, as
    log files of the pending instant), the driver commits every task's files, or aborts. A
    compaction that is then due runs on the executors (`compact_if_due`), not on the driver.

    `read_from` is the catalog's timeline `(time, action, state)` listed before the rows were
    compiled from what it held (states, graph rows, published checksums): a commit completed
    since (another run of the pipeline) is checked for conflicts, so that the two runs'
    decisions, each made against what the other overwrites, cannot both land
    (`CommitConflictError`; run again)."""
    from oxlake._spark_io import task_id

    table = Table(uri, storage_options)
    pending = _native.begin_write(native(table), "upsert", read_from)
    instant = pending.instant

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        out = _write(Table(uri, storage_options), instant, batches, structured, task_id(TaskContext.get()))
        if out:
            yield pa.RecordBatch.from_pydict({"written": pa.array(out, pa.binary())})

    try:
        parts = [
            r["written"] for r in rows.repartition("layer").mapInArrow(write, "written binary").collect()
        ]
        landed, *_ = pending.commit([bytes(p) for p in parts], compact_inline=False)
    except BaseException:
        pending.abort()
        raise
    compact_if_due(rows.sparkSession, uri, storage_options)
    return landed
