"""The driver path of a run: an incremental task whose compiler names its inputs by key (a
map-group task through its recorded graph, a direct task through its inverse), worked from keys
on the driver as Arrow tables. It reads the input partitions changed since the recorded
versions, the outputs they affect, the inputs feeding those and only those published rows, by
key; Spark runs the compilers over what was read (`_spark.run_chunks`: one stage, no shuffle);
Arrow joins, and the decision rules (`rules`) decide."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from oxlake.pipeline import _payload, _spark, rules
from oxlake.pipeline.catalog import STATE_LAYER
from oxlake.pipeline.compilers import Compiler, DirectCompiler, MapGroupCompiler

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from oxlake.pipeline.driver import Driver
    from oxlake.pipeline.spark_path import SparkPath


class TooLarge(Exception):
    """An incremental task would hold more input partitions on the driver than allowed."""


class DriverPath:
    """The driver path of one run: its inputs at the `requested` versions and the output layers
    as `layer_rows` (the ROWS of each this run) leave them, read by key; the output layers this
    run computed on Spark are read through `on_spark`."""

    def __init__(
        self,
        driver: Driver,
        requested: Mapping[str, str | None],
        layer_rows: Mapping[str, DataFrame | pa.Table],
        on_spark: SparkPath,
        published: Mapping[tuple[str, str], str | None],
    ) -> None:
        self.d, self.requested, self.layer_rows, self.on_spark = driver, requested, layer_rows, on_spark
        self.spark = driver.spark
        self.out_types = driver.output.structured
        self._changes: dict[tuple[str, tuple[str, ...], str | None, str | None], pa.Table] = {}
        #: The published checksums (None: not published) of the output catalog's keys this run
        #: has read already (the tasks' state records, the graph rows): not read again to decide.
        self._published = dict(published)

    def keyed(
        self, task: Compiler, types: _spark.InputTypes, state: dict[str, object], own: pa.Table
    ) -> pa.Table:
        """The ROWS of an incremental task, from keys. `own` is the task's state record; raises
        `TooLarge` when the change reaches more input partitions than the driver may hold."""
        graph = rules.CANDIDATES.empty_table()
        if isinstance(task, MapGroupCompiler):
            compiled, graph = self._map_group(task, types, state)
        else:
            compiled = self._direct(task, types, state)  # type: ignore[arg-type]
        states = rules.checksummed(pa.concat_tables([own.cast(rules.CANDIDATES), graph]))
        flags = pa.chunked_array([pa.repeat(True, compiled.num_rows), pa.repeat(False, states.num_rows)])
        candidates = pa.concat_tables([compiled, states]).append_column("compiled", flags)
        keys = set(_keys_of(candidates))
        read = self.d.output.read(keys - self._published.keys(), columns=["checksum"])
        known = [(*k, v) for k in keys & self._published.keys() if (v := self._published[k]) is not None]
        columns = [list(c) for c in zip(*known, strict=True)] if known else [[], [], []]
        old = pa.concat_tables(
            [
                read.rename_columns([*rules.KEYS, "old"]).cast(_OLD),
                pa.table([pa.array(c, pa.string()) for c in columns], schema=_OLD),
            ]
        )
        return rules.decide(task.name, _join(candidates, old, "left outer"))

    def changes(self, task: Compiler, state: dict[str, object]) -> pa.Table:
        """The input partitions changed since the recorded versions (INPUT rows, payload null
        when removed)."""
        recorded: dict[str, str] = state["inputs"]  # type: ignore[assignment]
        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    ch = self.layer_changes(layer)
                    parts.append(
                        _input_rows(name, ch.add_column(0, "layer", pa.array([layer] * ch.num_rows)), {})
                    )
            elif recorded[name] != self.requested[name]:
                key = (name, tuple(layers), recorded[name], self.requested[name])
                if key not in self._changes:  # tasks reading the same range share one read
                    catalog = self.d.inputs[name]
                    ch = catalog.changes(recorded[name], self.requested[name], layers)
                    self._changes[key] = _input_rows(name, ch, catalog.structured)
                parts.append(self._changes[key])
        return _concat(parts)

    # ---- the output catalog, as this run leaves it, by key ------------------------------------

    def layer_changes(self, layer: str) -> pa.Table:
        """partition, payload (null: deleted) of what this run changes in an output layer."""
        rows = self.layer_rows[layer]
        if not isinstance(rows, pa.Table):
            return _spark.collect(self.on_spark.layer_changes(layer))
        return rules.written(rows).select(["partition", "payload"])

    def _layer_read(self, layer: str, wanted: pa.Table) -> pa.Table:
        """layer, partition, payload (bytes) of the `wanted` partitions of an output layer as
        this run leaves it (published, read by key, overlaid with this run's changes)."""
        structs = [layer] if layer in self.out_types else []
        read = self.d.output.read(
            [(layer, p) for p in wanted.column("partition").to_pylist()], columns=["payload", *structs]
        )
        published = pa.table(
            {"partition": read.column("partition"), "payload": _payload.payloads(read, self.out_types)}
        )
        changes = self.layer_changes(layer)
        changes = changes.filter(_member(changes.column("partition"), wanted.column("partition")))
        kept = published.filter(
            pc.invert(_member(published.column("partition"), changes.column("partition")))
        )
        rows = pa.concat_tables(
            [kept, changes.filter(pc.is_valid(changes.column("payload"))).cast(kept.schema)]
        )
        return rows.add_column(0, "layer", pa.array([layer] * rows.num_rows, pa.string()))

    def _graph_rows(self, task: Compiler, side: str, keys: Iterable[tuple[str, ...]]) -> pa.Table:
        """The recorded graph rows of a map-group task for the input ("in") or output ("out")
        `keys`, read by key: the keys' columns and `payload`, for the keys that have one."""
        by_name = {rules.graph_name(task.name, side, key): key for key in keys}
        t = self.d.output.read([(STATE_LAYER, n) for n in by_name], columns=["payload", "checksum"])
        self._published.update(dict.fromkeys((STATE_LAYER, n) for n in by_name))
        self._published.update(zip(_keys_of(t), t.column("checksum").to_pylist(), strict=True))
        t = t.filter(pc.is_valid(t.column("payload")))
        found = [by_name[n] for n in t.column("partition").to_pylist()]
        by, _ = rules.SIDES[side]
        columns = [pa.array([k[i] for k in found], pa.string()) for i in range(len(by))]
        return pa.table([*columns, t.column("payload")], names=[*by, "payload"])

    def _recorded(
        self, task: Compiler, keys: Iterable[tuple[str, ...]]
    ) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
        """The outputs each of the input partitions `keys` fed (recorded graph), read by key."""
        t = self._graph_rows(task, "in", keys)
        return dict(zip(_keys(t), rules.edge_lists(t.column("payload")), strict=True))

    def _stored_pieces(self, task: Compiler, outputs: Iterable[tuple[str, str]], held: int) -> pa.Table:
        """The PIECES the `outputs` were reduced from when last compiled (their "out" graph
        rows), read by key; `TooLarge` before they are decoded when they and the `held` input
        partitions pass the driver's limit (an output fed by most of a catalog keeps a piece of
        each input: decoded, they would fill the driver)."""
        rows = self._graph_rows(task, "out", outputs)
        self._check_size(held + rules.pieces_at_most(rows))
        return rules.unpacked(rows)

    # ---- inputs, by key ------------------------------------------------------------------------

    def _fetch(self, keys: Iterable[tuple[str, str, str]]) -> pa.Table:
        """The input partitions of `keys` at the requested versions (INPUT rows), read by key;
        one without a payload is not there (as in a change, where a null payload is a removal)."""
        from pyspark.sql import functions as F

        by_catalog: dict[str, set[tuple[str, str]]] = {}
        for catalog, layer, partition in keys:
            by_catalog.setdefault(catalog, set()).add((layer, partition))
        parts = []
        for name, pairs in sorted(by_catalog.items()):
            if name == self.d.output_name:
                for layer in sorted({layer for layer, _ in pairs}):
                    wanted = pa.table({"partition": sorted(p for x, p in pairs if x == layer)})
                    if isinstance(self.layer_rows[layer], pa.Table):
                        parts.append(_input_rows(name, self._layer_read(layer, wanted), {}))
                        continue
                    df = self.on_spark.layer_state(layer).join(
                        _spark.frame(self.spark, wanted, "partition string"), "partition", "left_semi"
                    )
                    df = df.select(
                        F.lit(name).alias("catalog"), F.lit(layer).alias("layer"), "partition", "payload"
                    )
                    parts.append(_spark.collect(df))
            elif self.requested[name] is not None:
                source = self.d.inputs[name]
                structs = sorted({layer for layer, _ in pairs} & set(source.structured))
                read = source.read(pairs, self.requested[name], columns=["payload", *structs])
                parts.append(_input_rows(name, read, source.structured))
        rows = _concat(parts)
        return rows.filter(pc.is_valid(rows.column("payload")))

    def _check_size(self, n: int) -> None:
        """Refuses (`TooLarge`) to hold more than the driver's limit of input partitions."""
        if n > self.d.keyed_limit:
            raise TooLarge(
                f"the change reaches {n:,} input partitions and pieces, more than the driver holds "
                f"(keyed_limit={self.d.keyed_limit:,})"
            )

    # ---- compiling ----------------------------------------------------------------------------

    def _direct(self, task: DirectCompiler, types: _spark.InputTypes, state: dict[str, object]) -> pa.Table:
        """SUMMED rows of the outputs of the changed inputs' keys, compiled from the inputs the
        compiler's inverse names (read by key), and vanished ones of those no input feeds."""
        changed = self.changes(task, state)
        affected = {task.output_key(*out) for key in _keys(changed) for out in task.output_keys(*key)}
        declared = set(task.input_layers())
        wanted = {key for out in affected for key in task.input_keys(*out) if key[:2] in declared}
        self._check_size(changed.num_rows + len(wanted))
        inputs = self._fetch(wanted)
        out: dict[str, list[str]] = {"out_layer": [], "out_partition": []}
        take: list[int] = []
        for i, key in enumerate(_keys(inputs)):
            for layer, partition in (task.output_key(*out) for out in task.output_keys(*key)):
                if (layer, partition) in affected:
                    out["out_layer"].append(layer)
                    out["out_partition"].append(partition)
                    take.append(i)
        rows = inputs.take(pa.array(take, pa.int64()))
        for n, (column, values) in enumerate(out.items()):
            rows = rows.add_column(n, column, pa.array(values, pa.string()))
        compile = _spark.compile_direct(task, types, self.out_types)
        fn = _spark.summed(_spark.on_table(compile, rules.CANDIDATES))
        compiled = _spark.run_chunks(self.spark, rows, fn, rules.SUMMED, group_by=rules.OUT_KEYS)
        return _with_vanished(_key_table(affected), compiled)

    def _map_group(
        self, task: MapGroupCompiler, types: _spark.InputTypes, state: dict[str, object]
    ) -> tuple[pa.Table, pa.Table]:
        """SUMMED rows of the outputs the changed inputs fed before (recorded graph) or feed
        now (mapped), reduced from the changed inputs' new pieces and the pieces the unchanged
        inputs gave them before (kept in the outputs' graph rows: only the changed inputs are
        mapped); and the graph's state rows of those inputs and outputs (vanished for those
        without pieces now)."""
        changed = self.changes(task, state)
        self._check_size(changed.num_rows)
        changed_keys = set(_keys(changed))
        live = changed.filter(pc.is_valid(changed.column("payload")))
        mapper = _spark.on_table(_spark.map_pieces(task, types), rules.PIECES)
        new_pieces = _spark.run_chunks(self.spark, live, mapper, rules.PIECES)
        affected = set(_out_keys(new_pieces))
        for outs in self._recorded(task, changed_keys).values():
            affected.update(outs)  # type: ignore[arg-type]
        kept = self._stored_pieces(task, affected, changed.num_rows)
        kept = kept.filter(pa.array([k not in changed_keys for k in _keys(kept)], pa.bool_()))
        self._check_size(changed.num_rows + kept.num_rows)
        pieces = pa.concat_tables([new_pieces, kept])
        reduce = _spark.reduce_pieces(task, self.out_types)
        fn = _spark.summed(_spark.on_table(reduce, rules.CANDIDATES))
        compiled = _spark.run_chunks(self.spark, pieces, fn, rules.SUMMED, group_by=rules.OUT_KEYS)
        # Each changed input's pieces are all in new_pieces, each affected output's in pieces.
        graph = pa.concat_tables(
            [rules.graph_rows(task.name, "in", new_pieces), rules.graph_rows(task.name, "out", pieces)]
        )
        sides: list[tuple[str, Iterable[tuple[str, ...]]]] = [("in", changed_keys), ("out", affected)]
        names = [
            (STATE_LAYER, rules.graph_name(task.name, side, key)) for side, keys in sides for key in keys
        ]
        return _with_vanished(_key_table(affected), compiled), _with_vanished(_key_table(names), graph)


def _with_vanished(affected: pa.Table, compiled: pa.Table) -> pa.Table:
    """The `compiled` rows, plus a `rules.vanished` one for each `affected` key (layer,
    partition) none of them has (so that a published one is deleted)."""
    gone = _join(affected, compiled.select(rules.KEYS), "left anti")
    return pa.concat_tables([compiled, rules.vanished(gone, compiled.schema)])


def _join(left: pa.Table, right: pa.Table, how: str) -> pa.Table:
    """`left` joined to `right` on (layer, partition). Acero's threads are used for large tables
    only: for tens of thousands of rows, starting them costs several times the join (80,000
    rows: 0.03 s on one thread, 0.08 to 0.45 s on this box's two; 1,500,000 rows: 0.8 s
    against 0.6 s)."""
    large = max(left.num_rows, right.num_rows) >= 500_000
    return left.join(right, rules.KEYS, join_type=how, use_threads=large)


def _key_table(keys: Iterable[tuple[str, str]]) -> pa.Table:
    """The (layer, partition) `keys` as a table."""
    pairs = list(keys)
    return pa.table([pa.array([k[i] for k in pairs], pa.string()) for i in (0, 1)], names=rules.KEYS)


def _out_keys(pieces: pa.Table) -> Iterator[tuple[str, str]]:
    """The (layer, partition) output keys of PIECE rows."""
    return zip(
        pieces.column("out_layer").to_pylist(), pieces.column("out_partition").to_pylist(), strict=True
    )


def _keys_of(rows: pa.Table) -> Iterator[tuple[str, str]]:
    """The (layer, partition) keys of catalog rows."""
    return zip(rows.column("layer").to_pylist(), rows.column("partition").to_pylist(), strict=True)


def _keys(inputs: pa.Table) -> Iterator[tuple[str, str, str]]:
    """The (catalog, layer, partition) keys of INPUT rows."""
    columns = [inputs.column(c).to_pylist() for c in rules.IN_KEYS]
    return zip(*columns, strict=True)


def _input_rows(catalog: str, t: pa.Table, structured: Mapping[str, pa.StructType]) -> pa.Table:
    """INPUT rows (catalog, layer, partition, payload as bytes) of a catalog's rows."""
    return pa.table(
        {
            "catalog": pa.array([catalog] * t.num_rows, pa.string()),
            "layer": t.column("layer"),
            "partition": t.column("partition"),
            "payload": _payload.payloads(t, structured),
        }
    )


#: The published checksums of candidates' keys.
_OLD = pa.schema([("layer", pa.string()), ("partition", pa.string()), ("old", pa.string())])

_INPUT_SCHEMA = pa.schema(
    [("catalog", pa.string()), ("layer", pa.string()), ("partition", pa.string()), ("payload", pa.binary())]
)


def _member(values: pa.Array | pa.ChunkedArray, wanted: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    """Whether each of `values` is among `wanted`."""
    if isinstance(wanted, pa.ChunkedArray):
        wanted = wanted.combine_chunks()
    return pc.is_in(values, value_set=wanted)


def _concat(parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables([p.cast(_INPUT_SCHEMA) for p in parts]) if parts else _INPUT_SCHEMA.empty_table()
