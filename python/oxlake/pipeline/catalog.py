"""A catalog: one oxlake table, one timeline, its layers as partitions (docs/PIPELINE.md).

Each record is one published partition of a layer: `(layer, partition)` is its key, `payload`
its content (bytes), `checksum` the SHA-256 of the payload (hex). A structured layer (declared
when the catalog is created) keeps its content in a struct column named after the layer instead
of `payload`. A catalog version is a completed
write instant of the table, also numbered densely from 1. A record's `_hoodie_commit_time` is the
version at which that partition last changed (unchanged partitions keep their version).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from oxlake import _native
from oxlake.merge import DEFAULT_PARTITION
from oxlake.pipeline import _payload
from oxlake.table import Table, UpdateSchema, create_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from oxlake.spark import BatchMap

#: The reserved layer holding the pipeline state (docs/PIPELINE.md, "The state layer").
STATE_LAYER = "_state"

SCHEMA = pa.schema(
    [
        pa.field("layer", pa.string(), nullable=False),
        pa.field("partition", pa.string(), nullable=False),
        pa.field("payload", pa.binary()),
        pa.field("checksum", pa.string()),
    ]
)

#: What `Catalog.changes` reports per partition.
ADDED, CHANGED, REMOVED = "added", "changed", "removed"
_CHANGE_KINDS = {"insert": ADDED, "update": CHANGED, "delete": REMOVED}


@dataclass(frozen=True)
class Version:
    """One catalog version: its number, its instant, and the input versions each pipeline task
    that wrote it recorded (`{task: {catalog: instant}}`; empty for writes outside a pipeline)."""

    number: int
    instant: str
    dependencies: dict[str, dict[str, str]] = field(default_factory=dict)


class Catalog:
    """A catalog at `uri` (created with `Catalog.create`)."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self.table = Table(uri, storage_options)
        fields = set(self.table.schema.names)
        if not set(SCHEMA.names) <= fields:
            raise _native.InvalidArgumentError(f"{uri} is not a catalog (columns {sorted(fields)})")
        #: The structured layers and the struct type of their payloads.
        self.structured = _structured(self.table)

    @classmethod
    def create(
        cls,
        uri: str,
        storage_options: dict[str, str] | None = None,
        *,
        structured: Mapping[str, pa.StructType] | None = None,
    ) -> Catalog:
        """Creates an empty catalog: a merge-on-read table keyed by (layer, partition),
        partitioned by layer, compacted inline every 10 versions. `structured` declares layers
        whose payloads are Arrow structs of the given types (a column per layer)."""
        fields = list(SCHEMA)
        for layer, type in (structured or {}).items():
            if layer in SCHEMA.names or layer == STATE_LAYER or layer.startswith("_hoodie_") or not layer:
                raise _native.InvalidArgumentError(f"{layer!r} is a reserved name, not a structured layer")
            if not pa.types.is_struct(type):
                raise _native.InvalidArgumentError(f"structured layer {layer!r}: {type} is not a struct type")
            fields.append(pa.field(layer, type))
        create_table(
            uri,
            pa.schema(fields),
            record_key=["layer", "partition"],
            partition_by=["layer"],
            table_type="merge_on_read",
            storage_options=storage_options,
            inline_compaction=10,
        )
        return cls(uri, storage_options)

    @classmethod
    def open_or_create(cls, uri: str, storage_options: dict[str, str] | None = None) -> Catalog:
        try:
            return cls(uri, storage_options)
        except _native.TableNotFoundError:
            return cls.create(uri, storage_options)

    def refresh(self) -> None:
        """Reads the catalog again: its latest version and its structured layers' types."""
        self.table = Table(self.uri, self.storage_options)
        self.structured = _structured(self.table)

    def evolve(self, structured: Mapping[str, pa.StructType]) -> str | None:
        """Adds structured layers, and fields to existing ones, as one schema change of the
        catalog's table (`Table.update_schema`): a new layer's column, a new (nullable) field
        inside a layer's struct, a field widened by the promotions writes allow (int → long,
        float → double, ...). Payloads written before read the new fields as null. Anything
        else (a field dropped, renamed or narrowed) raises `SchemaMismatchError`, the catalog
        unchanged. Returns the instant of the change (`None`: nothing to change)."""
        with self.table.update_schema() as u:
            for layer, type in structured.items():
                if layer in SCHEMA.names or layer == STATE_LAYER or layer.startswith("_hoodie_") or not layer:
                    raise _native.InvalidArgumentError(
                        f"{layer!r} is a reserved name, not a structured layer"
                    )
                if not pa.types.is_struct(type):
                    raise _native.InvalidArgumentError(
                        f"structured layer {layer!r}: {type} is not a struct type"
                    )
                if layer not in self.structured:
                    u.add_column(layer, type)
                else:
                    _grow(u, (layer,), self.structured[layer], type)
        self.refresh()
        return u.instant

    # ---- versions ---------------------------------------------------------------------------

    def instants(self) -> list[str]:
        """The instants of the catalog's versions, oldest first: its deltacommits (a catalog is a
        merge-on-read table: its compactions complete as `commit`s and change no content)."""
        return [i.time for i in self.table.timeline() if i.state == "completed" and i.action == "deltacommit"]

    def _window_bound(self, instant: str) -> str:
        """What an incremental window ending at the version `instant` is bounded by: its
        requested time on a version 6 table, its completion time on versions 8 and 9."""
        for i in self.table.timeline():
            if i.time == instant and i.state == "completed" and i.action == "deltacommit":
                return i.completion or i.time
        raise _native.InvalidArgumentError(f"{instant} is not a version of {self.uri}")

    def written(self, since: str | None, until: str | None, layers: Iterable[str] | None = None) -> int:
        """How many partitions the versions after `since` (None: from the start) up to `until`
        wrote, added, changed or removed in `layers` (None: in every layer), by their commit
        metadata: an upper bound of what `changes(since, until, layers)` returns (a partition
        written twice counts twice), read without reading any data."""
        wanted = None if layers is None else set(layers)
        props = self.table.properties
        hive = props.get("hoodie.datasource.write.hive_style_partitioning", "").lower() == "true"
        encoded = props.get("hoodie.datasource.write.partitionpath.urlencode", "").lower() == "true"
        total = 0
        for c in self.table.history():
            if c.action != "deltacommit" or (since is not None and c.time <= since):
                continue
            if until is not None and c.time > until:
                continue
            for path, counts in c.partitions.items():
                # A path that names no layer (not this catalog's layout) is counted anyway.
                held = None if wanted is None else _layers_of(path, hive, encoded)
                if wanted is None or held is None or not held.isdisjoint(wanted):
                    total += sum(counts)
        return total

    def latest(self) -> str | None:
        instants = self.instants()
        return instants[-1] if instants else None

    def instant_of(self, version: int | str) -> str:
        """The instant of a version given as a number (1, 2, ...) or an instant."""
        instants = self.instants()
        if isinstance(version, int):
            if not 1 <= version <= len(instants):
                raise _native.InvalidArgumentError(
                    f"version {version} does not exist (the catalog has {len(instants)})"
                )
            return instants[version - 1]
        if version not in instants:
            raise _native.InvalidArgumentError(f"{version} is not a version of {self.uri}")
        return version

    def number_of(self, instant: str) -> int:
        return self.instants().index(instant) + 1

    def versions(self) -> list[Version]:
        """Every version with the input versions its pipeline tasks recorded."""
        out = []
        for n, instant in enumerate(self.instants(), start=1):
            state = self.table.to_arrow(
                columns=["partition", "payload"],
                filter=[("layer", "=", STATE_LAYER)],
                as_of=instant,
            )
            deps = {}
            for name, payload in zip(
                state.column("partition").to_pylist(), state.column("payload").to_pylist(), strict=True
            ):
                if "|" not in name and payload:
                    deps[name] = json.loads(payload)["inputs"]
            out.append(Version(n, instant, deps))
        return out

    # ---- reads ------------------------------------------------------------------------------

    def _layer_filter(self, layers: Sequence[str] | None, with_state: bool) -> list[tuple[str, str, object]]:
        if layers is not None:
            return [("layer", "in", list(layers))]
        return [] if with_state else [("layer", "!=", STATE_LAYER)]

    def snapshot(
        self,
        version: int | str | None = None,
        layers: Sequence[str] | None = None,
        *,
        spark: SparkSession | None = None,
        with_state: bool = False,
        columns: Sequence[str] | None = None,
        prefix: str | None = None,
        encoded: bool = False,
    ) -> pa.Table | DataFrame:
        """The published partitions at `version` (default latest), restricted to `layers`: a
        Spark DataFrame when `spark` is given, else an Arrow table. Columns: layer, partition,
        payload, checksum, the struct columns of structured layers, and `version` (the instant
        at which the partition last changed); `columns` reads only those (and `version`).
        `prefix` keeps the partitions whose name starts with it, filtered where the rows are
        read. `encoded` (with every column) gives structured values as their payload bytes
        (`_payload.encode`) in place of the struct columns, encoded where the rows are read:
        on Spark, before Spark's types (which cannot hold nanoseconds or times of day)."""
        if self.latest() is None:
            empty = self._empty(spark, [] if encoded and columns is None else layers, with_version=True)
            if columns is None:
                return empty
            kept = [*columns, "version"]
            return empty.select(kept) if isinstance(empty, pa.Table) else empty.select(*kept)
        as_of = self.instant_of(version) if version is not None else None
        filt = [*self._layer_filter(layers, with_state), *_prefix_filter(prefix)] or None
        data = [*SCHEMA.names, *self._struct_columns(layers)] if columns is None else list(columns)
        names = [*data, "_hoodie_commit_time"]
        mapped = self._encoder(layers) if encoded and columns is None else None
        if spark is not None:
            from oxlake import spark as oxspark

            df = oxspark.read(
                spark,
                self.uri,
                mapped=mapped,
                columns=names,
                filter=filt,
                as_of=as_of,
                storage_options=self.storage_options,
            )
            return df.withColumnRenamed("_hoodie_commit_time", "version")
        t = self.table.to_arrow(columns=names, filter=filt, as_of=as_of)
        if mapped is not None:
            t, data = _mapped(t, mapped), SCHEMA.names
        return t.rename_columns([*data, "version"])

    def _encoder(self, layers: Sequence[str] | None) -> BatchMap | None:
        """What encodes the structured values of `layers` as payload bytes (None: none is
        structured)."""
        structured = {x: self.structured[x] for x in self._struct_columns(layers)}
        return _encoding(structured) if structured else None

    def _struct_columns(self, layers: Sequence[str] | None) -> list[str]:
        """The struct columns of the structured layers among `layers` (all when None)."""
        return [x for x in self.structured if layers is None or x in layers]

    def changes(
        self,
        since: int | str | None,
        until: int | str | None = None,
        layers: Sequence[str] | None = None,
        *,
        spark: SparkSession | None = None,
        with_state: bool = False,
        encoded: bool = False,
    ) -> pa.Table | DataFrame:
        """The partitions added, changed and removed after version `since` (None: from the
        start) up to `until` (default latest): layer, partition, `change` (added, changed,
        removed), and the payload, checksum and struct columns at `until` (null when removed);
        `encoded` as for `snapshot`."""
        end = self.instant_of(until) if until is not None else self.latest()
        mapped = self._encoder(layers) if encoded else None
        if end is None:
            return self._empty(spark, [] if mapped else layers, with_version=False, change=True)
        if since is None:
            # Everything at `until` was added since the start.
            snap = self.snapshot(end, layers, spark=spark, with_state=with_state, encoded=encoded)
            if not isinstance(snap, pa.Table):
                from pyspark.sql import functions as F

                rest = [c for c in snap.columns if c not in ("layer", "partition", "version")]
                return snap.select("layer", "partition", F.lit(ADDED).alias("change"), *rest)
            kinds = pa.array([ADDED] * snap.num_rows, pa.string())
            return snap.drop_columns(["version"]).add_column(2, "change", kinds)
        # Windows of changes are completion times on tables of version 8 and 9.
        start, end = self._window_bound(self.instant_of(since)), self._window_bound(end)
        filt = self._layer_filter(layers, with_state) or None
        columns = [*SCHEMA.names, *self._struct_columns(layers)]
        if spark is not None:
            from pyspark.sql import functions as F

            from oxlake import spark as oxspark

            df = oxspark.read(
                spark,
                self.uri,
                mapped=mapped,
                columns=[*columns, "_change_type"],
                filter=filt,
                query="changes",
                start=start,
                end=end,
                storage_options=self.storage_options,
                with_meta_columns=False,
            )
            kind = F.create_map(*[F.lit(x) for kv in _CHANGE_KINDS.items() for x in kv])
            kept = columns[2:] if mapped is None else SCHEMA.names[2:]
            return df.select(*columns[:2], kind[F.col("_change_type")].alias("change"), *kept)
        t = self.table.to_arrow(
            columns=[*columns, "_change_type"], filter=filt, query="changes", start=start, end=end
        )
        t = _mapped(t, mapped)
        kinds = [_CHANGE_KINDS[k] for k in t.column("_change_type").to_pylist()]
        return t.drop_columns(["_change_type"]).add_column(2, "change", pa.array(kinds, pa.string()))

    def read(
        self,
        keys: Iterable[tuple[str, str]],
        version: int | str | None = None,
        columns: Sequence[str] = ("payload", "checksum"),
    ) -> pa.Table:
        """The published partitions of `keys` ((layer, partition) pairs) at `version` (default
        latest): layer, partition and `columns`. Keys not published are absent. Reads only the
        layers named, pruned by partition name; nothing else of the catalog."""
        wanted = set(keys)
        names = ["layer", "partition", *columns]
        if not wanted or self.latest() is None:
            return pa.schema([self.table.schema.field(n) for n in names]).empty_table()
        as_of = self.instant_of(version) if version is not None else None
        layers = sorted({layer for layer, _ in wanted})
        parts = sorted({p for _, p in wanted})
        t = self.table.to_arrow(
            columns=names, filter=[("layer", "in", layers), ("partition", "in", parts)], as_of=as_of
        )
        if len(layers) > 1:
            pairs = zip(t.column("layer").to_pylist(), t.column("partition").to_pylist(), strict=True)
            t = t.filter(pa.array([pair in wanted for pair in pairs], pa.bool_()))
        return t

    def holds(self, layers: Iterable[str]) -> bool:
        """Whether any of `layers` holds a published partition. Reads those layers only, and
        stops at the first partition found."""
        wanted = sorted(set(layers))
        if not wanted or self.latest() is None:
            return False
        scan = self.table.scan(columns=["layer"], filter=[("layer", "in", wanted)])
        return any(batch.num_rows for batch in scan)

    def layers(self) -> list[str]:
        """The layers holding at least one published partition (the state layer excluded)."""
        t = self.table.to_arrow(columns=["layer"], filter=[("layer", "!=", STATE_LAYER)])
        return sorted(pc.unique(t.column("layer")).to_pylist())

    def __repr__(self) -> str:
        return f"Catalog({self.uri!r})"

    def _empty(
        self,
        spark: SparkSession | None,
        layers: Sequence[str] | None,
        *,
        with_version: bool,
        change: bool = False,
    ) -> pa.Table | DataFrame:
        fields = [*SCHEMA, *(self.table.schema.field(x) for x in self._struct_columns(layers))]
        if change:
            fields.insert(2, pa.field("change", pa.string()))
        if with_version:
            fields.append(pa.field("version", pa.string()))
        schema = pa.schema(fields)
        if spark is None:
            return schema.empty_table()
        from oxlake.spark import spark_schema

        return spark.createDataFrame([], spark_schema(schema))


def _encoding(structured: Mapping[str, pa.StructType]) -> BatchMap:
    """Catalog rows with the struct columns of `structured` → the same rows without them, each
    structured value as the payload's bytes (`_payload.payloads`); and the schema that makes."""

    def encode(batch: pa.RecordBatch) -> pa.RecordBatch:
        payload = _payload.payloads(pa.Table.from_batches([batch]), structured)
        columns = [
            payload if n == "payload" else c for n, c in zip(batch.schema.names, batch.columns, strict=True)
        ]
        kept = [i for i, n in enumerate(batch.schema.names) if n not in structured]
        return pa.RecordBatch.from_arrays([columns[i] for i in kept], schema=schema(batch.schema))

    def schema(of: pa.Schema) -> pa.Schema:
        return pa.schema([f for f in of if f.name not in structured], metadata=of.metadata)

    return encode, schema


def _mapped(t: pa.Table, mapped: BatchMap | None) -> pa.Table:
    """An Arrow read's rows through `mapped` (see `_encoding`)."""
    if mapped is None:
        return t
    encode, schema = mapped
    return pa.Table.from_batches([encode(b) for b in t.to_batches()], schema=schema(t.schema))


def _prefix_filter(prefix: str | None) -> list[tuple[str, str, object]]:
    """The partition names starting with `prefix`, as a range filter the reader pushes down:
    from the prefix up to (not including) the prefix with its last character incremented."""
    if not prefix:
        return []
    start: list[tuple[str, str, object]] = [("partition", ">=", prefix)]
    head = prefix.rstrip(chr(0x10FFFF))  # nothing follows the last code point: drop it
    if not head:
        return start
    last = ord(head[-1]) + 1
    last = 0xE000 if 0xD800 <= last <= 0xDFFF else last  # surrogates are no characters
    return [*start, ("partition", "<", head[:-1] + chr(last))]


def _structured(table: Table) -> dict[str, pa.StructType]:
    """The structured layers of a catalog's table and the struct type of their payloads."""
    return {
        f.name: f.type
        for f in table.schema
        if f.name not in SCHEMA.names and not f.name.startswith("_hoodie_") and pa.types.is_struct(f.type)
    }


def _grow(u: UpdateSchema, path: tuple[str, ...], old: pa.StructType, new: pa.StructType) -> None:
    """The changes that take a struct of type `old` at `path` to `new`: fields added, nested
    structs grown, types widened; a field of `old` missing from `new` is refused."""
    names = {new.field(i).name for i in range(new.num_fields)}
    for i in range(old.num_fields):
        if old.field(i).name not in names:
            dotted = ".".join((*path, old.field(i).name))
            raise _native.SchemaMismatchError(
                f"structured layer field `{dotted}` is missing from the new type "
                "(fields are only added or widened)"
            )
    for i in range(new.num_fields):
        field = new.field(i)
        at = (*path, field.name)
        index = old.get_field_index(field.name)
        if index < 0:
            u.add_column(at, field.type)
        elif pa.types.is_struct(field.type) and pa.types.is_struct(old.field(index).type):
            _grow(u, at, old.field(index).type, field.type)
        elif field.type != old.field(index).type:
            u.update_column(at, field.type)


def _layers_of(path: str, hive: bool, encoded: bool) -> set[str] | None:
    """The layers a partition path of a catalog's table may hold (None: it names no layer), for a
    table with hive-style and url-encoded paths as `hive` and `encoded` say. Apache Hudi's default
    partition holds the empty layer too (and before Hudi 0.12 it was named `default`)."""
    if hive:
        if not path.startswith("layer="):
            return None
        path = path[len("layer=") :]
    if encoded:
        try:
            path = urllib.parse.unquote(path, errors="strict")
        except UnicodeDecodeError:
            return None
    if path in (DEFAULT_PARTITION, "default"):
        return {path, ""}
    return {path}
