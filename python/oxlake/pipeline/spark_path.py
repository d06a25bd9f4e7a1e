"""The Spark path of a run: the plans, over DataFrames, of a task run in full or incrementally,
and the output catalog as the run leaves it. Spark joins and groups; the decision rules
(`rules`) run in its tasks through `mapInArrow`. An incremental task here follows the same logic
as on the driver path (`driver_path`), with joins by key against the catalogs in place of the
driver's Arrow tables: nothing proportional to the change or the catalogs reaches the driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial, reduce
from typing import TYPE_CHECKING

import pyarrow as pa

from oxlake.pipeline import _spark, rules
from oxlake.pipeline.catalog import STATE_LAYER
from oxlake.pipeline.compilers import (
    Compiler,
    DirectCompiler,
    FunctionCompiler,
    MapGroupCompiler,
    PipelineDefinitionError,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from oxlake.pipeline.driver import Driver


class SparkPath:
    """The Spark plans of one run: its inputs at the `requested` versions and the output layers
    as `layer_rows` (the ROWS of each this run, filled in as tasks run) leave them."""

    def __init__(
        self,
        driver: Driver,
        requested: Mapping[str, str | None],
        layer_rows: Mapping[str, DataFrame | pa.Table],
    ) -> None:
        self.d, self.requested, self.layer_rows = driver, requested, layer_rows
        self.spark = driver.spark
        self.out_types = driver.output.structured
        self._changes: dict[tuple[str, tuple[str, ...], str, str | None], DataFrame] = {}

    def rows(
        self, task: Compiler, types: _spark.InputTypes, own: pa.Table, state: Mapping[str, object] | None
    ) -> DataFrame:
        """The ROWS of a task: in full (no `state`), or incrementally from the input partitions
        changed since the versions its `state` recorded. `own` is the task's state record."""
        from pyspark.sql import functions as F

        changed = None if state is None else self.changes(task, state)
        graph: DataFrame | None = None
        if state is not None and self._unchanged(task, state):
            candidates = self.spark.createDataFrame([], _spark.CANDIDATE)  # no need to scan
        elif isinstance(task, DirectCompiler):
            candidates = (
                self._direct_full(task, types) if changed is None else self._direct(task, types, changed)
            )
        elif isinstance(task, MapGroupCompiler):
            candidates, graph = (
                self._map_group(task, types)
                if changed is None
                else self._map_group_changed(task, types, changed)
            )
        elif isinstance(task, FunctionCompiler):
            candidates = self._function(task, types)
        else:
            raise PipelineDefinitionError(
                f"task {task.name!r}: {type(task).__name__} is not a known compiler"
            )
        record = _spark.frame(self.spark, own, _spark.CANDIDATE)
        if graph is not None:
            record = record.unionByName(graph)
        # A map-group task's reduce gives its outputs' graph rows with them: state rows are not
        # counted as compiled.
        compiled = candidates.withColumn("compiled", F.col("layer") != F.lit(STATE_LAYER)).unionByName(
            record.withColumn("compiled", F.lit(False))
        )
        return _decide(task.name, compiled, self.published(task.outputs, task.name), full=changed is None)

    def _unchanged(self, task: Compiler, state: Mapping[str, object]) -> bool:
        """Whether the task's inputs are known not to have changed since its `state` without
        reading them: it reads no output layer of this run, and each input catalog is requested
        at the version recorded."""
        recorded: Mapping[str, str] = state["inputs"]  # type: ignore[assignment]
        return self.d.output_name not in task.inputs and all(
            recorded[name] == self.requested[name] for name in task.inputs
        )

    def changes(self, task: Compiler, state: Mapping[str, object]) -> DataFrame:
        """The input partitions changed since the recorded versions (INPUT rows, payload null
        when removed), from the catalogs' change queries and this run's changes of output
        layers."""
        from pyspark.sql import functions as F

        recorded: Mapping[str, str] = state["inputs"]  # type: ignore[assignment]
        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    parts.append(
                        self.layer_changes(layer).select(
                            F.lit(name).alias("catalog"), F.lit(layer).alias("layer"), "partition", "payload"
                        )
                    )
            elif recorded[name] != self.requested[name]:
                key = (name, tuple(layers), recorded[name], self.requested[name])
                if key not in self._changes:  # tasks reading the same range share one read
                    df = self.d.inputs[name].changes(
                        recorded[name], self.requested[name], layers, spark=self.spark, encoded=True
                    )
                    df = df.select(F.lit(name).alias("catalog"), "layer", "partition", "payload")
                    self._changes[key] = df.localCheckpoint()
                parts.append(self._changes[key])
        if not parts:
            return self.spark.createDataFrame([], _spark.INPUT)
        return reduce(lambda a, b: a.unionByName(b), parts)

    # ---- the output catalog, as published and as this run leaves it -------------------------

    def published(self, layers: Sequence[str], task: str | None = None, payload: bool = False) -> DataFrame:
        """layer, partition, `old` checksum (and with `payload` the payload as bytes) of the
        published rows of `layers`, and of the state rows of `task` (scanned)."""
        from pyspark.sql import functions as F

        snap = self.d.output.snapshot(
            layers=[*layers, STATE_LAYER] if task else list(layers),
            spark=self.spark,
            with_state=True,
            columns=None if payload else ["layer", "partition", "checksum"],
            encoded=True,
        )
        scope = F.col("layer").isin(list(layers))
        if task:
            mine = (F.col("partition") == task) | F.col("partition").startswith(f"{task}|")
            scope = scope | ((F.col("layer") == STATE_LAYER) & mine)
        old = F.col("checksum").alias("old")
        columns: list[Column | str] = ["layer", "partition", *(["payload"] if payload else []), old]
        return snap.filter(scope).select(*columns)

    def layer_frame(self, layer: str) -> DataFrame:
        """The ROWS of an output layer this run, as a DataFrame."""
        rows = self.layer_rows[layer]
        return _spark.frame(self.spark, rows, _spark.ROWS) if isinstance(rows, pa.Table) else rows

    def layer_changes(self, layer: str) -> DataFrame:
        """partition, payload (null: deleted) of what this run changes in an output layer."""
        from pyspark.sql import functions as F

        rows = self.layer_frame(layer)
        return rows.filter(F.col("op").isin(*rules.WRITES)).select("partition", "payload")

    def layer_state(self, layer: str) -> DataFrame:
        """partition, payload of an output layer after this run."""
        from pyspark.sql import functions as F

        kept = (
            self.published([layer], payload=True)
            .select("partition", "payload")
            .join(self.layer_changes(layer).select("partition"), "partition", "left_anti")
        )
        upserts = self.layer_frame(layer).filter(F.col("op") == "upsert").select("partition", "payload")
        return kept.unionByName(upserts)

    # ---- inputs -------------------------------------------------------------------------------

    def snapshot(self, task: Compiler) -> DataFrame:
        """Every input partition of the task at the requested versions (INPUT rows, scanned);
        one without a payload is not there (as in a change, where a null payload is a removal)."""
        from pyspark.sql import functions as F

        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    df = self.layer_state(layer).select(F.lit(layer).alias("layer"), "partition", "payload")
                    parts.append(df.select(F.lit(name).alias("catalog"), "*"))
            elif self.requested[name] is not None:
                snap = self.d.inputs[name].snapshot(
                    self.requested[name], layers, spark=self.spark, encoded=True
                )
                parts.append(snap.select(F.lit(name).alias("catalog"), "layer", "partition", "payload"))
        if not parts:
            return self.spark.createDataFrame([], _spark.INPUT)
        return reduce(lambda a, b: a.unionByName(b), parts).filter(F.col("payload").isNotNull())

    # ---- compiling ----------------------------------------------------------------------------

    def _direct_full(self, task: DirectCompiler, types: _spark.InputTypes) -> DataFrame:
        return (
            self._pieces(task)
            .repartition(*rules.OUT_KEYS)
            .mapInArrow(_spark.compile_direct(task, types, self.out_types), _spark.CANDIDATE)
        )

    def _direct(self, task: DirectCompiler, types: _spark.InputTypes, changed: DataFrame) -> DataFrame:
        """Outputs of the changed inputs' keys, compiled as a full run compiles them, in its one
        shuffle: every input goes to the outputs it feeds (`output_keys`), and so does a mark
        for each output a changed input fed or feeds; the compile tasks build only the marked
        outputs, and give a marked one no input feeds any more an empty candidate (a published
        one is deleted).

        This plan scans and maps every input whatever the size of the change, and shuffles
        them once. A plan reading only the inputs the inverse names would shuffle every input
        as well (to join them to the names), then the joined pieces again by output; small
        changes run on the driver path, by key, instead."""
        affected = changed.select(*rules.IN_KEYS).mapInArrow(_spark.output_keys(task, False), _spark.EDGE)
        marks = _spark.marks(affected.select(*rules.OUT_KEYS), "out", _spark.DIRECT_INPUT)
        return (
            self._pieces(task)
            .unionByName(marks)
            .repartition(*rules.OUT_KEYS)
            .mapInArrow(
                _spark.compile_direct(task, types, self.out_types, only_marked=True), _spark.CANDIDATE
            )
        )

    def _pieces(self, task: DirectCompiler) -> DataFrame:
        """DIRECT_INPUT rows: every input partition, once for each output key it feeds."""
        return self.snapshot(task).mapInArrow(_spark.output_keys(task, True), _spark.DIRECT_INPUT)

    def _map_group_changed(
        self, task: MapGroupCompiler, types: _spark.InputTypes, changed: DataFrame
    ) -> tuple[DataFrame, DataFrame]:
        """The outputs the changed inputs fed before (recorded graph) or feed now (mapped),
        reduced from the changed inputs' new pieces and the pieces the unchanged inputs gave
        them before (kept in the outputs' graph rows), with their "out" graph rows; and the "in"
        graph rows of the changed inputs. An output or input without pieces now gets empty
        rows (marked: `_spark.marks`), so its published ones are deleted."""
        from pyspark.sql import functions as F

        changed = changed.localCheckpoint()  # mapped, joined, marked
        keys = changed.select(*rules.IN_KEYS)
        new = (
            changed.filter(F.col("payload").isNotNull())
            .mapInArrow(_spark.map_pieces(task, types), _spark.PIECE)
            .localCheckpoint()  # read for the affected outputs, their reduce and the graph
        )
        fed = self._graph_rows(task, "in", keys).mapInArrow(
            _spark.per_batch(rules.fed_outputs), _spark.OUT_KEY
        )
        affected = new.select(*rules.OUT_KEYS).unionByName(fed).distinct().localCheckpoint()
        kept = (
            self._graph_rows(task, "out", affected)
            .mapInArrow(_spark.per_batch(rules.unpacked), _spark.PIECE)
            .join(keys, rules.IN_KEYS, "left_anti")
        )
        pieces = new.unionByName(kept).unionByName(_spark.marks(affected, "out", _spark.PIECE))
        outputs = pieces.repartition(*rules.OUT_KEYS).mapInArrow(
            _spark.reduce_pieces(task, self.out_types, graph=True, only_marked=True), _spark.CANDIDATE
        )
        inputs = new.unionByName(_spark.marks(keys, "in", _spark.PIECE))
        graph = inputs.repartition(*rules.IN_KEYS).mapInArrow(
            _spark.graph_task(task.name, "in", only_marked=True), _spark.CANDIDATE
        )
        return outputs, graph

    def _graph_rows(self, task: Compiler, side: str, keys: DataFrame) -> DataFrame:
        """The recorded graph rows of a map-group task for the input ("in") or output ("out")
        `keys` (a DataFrame of that side's key columns): those columns and `payload`."""
        from pyspark.sql import functions as F

        by, _ = rules.SIDES[side]
        state = self.d.output.snapshot(
            layers=[STATE_LAYER],
            spark=self.spark,
            with_state=True,
            columns=["partition", "payload"],
            prefix=f"{task.name}|{side}|",
        )
        return (
            _graph_key(task.name, side, keys)
            .join(state.select(F.col("partition").alias("name"), "payload"), "name")
            .select(*by, "payload")
        )

    def _map_group(self, task: MapGroupCompiler, types: _spark.InputTypes) -> tuple[DataFrame, DataFrame]:
        """The compiled outputs with their "out" graph rows, and the "in" graph rows of every
        input."""
        pieces = self.snapshot(task).mapInArrow(_spark.map_pieces(task, types), _spark.PIECE)
        pieces = pieces.localCheckpoint()  # computed once, read by the reduce and the graph
        outputs = pieces.repartition(*rules.OUT_KEYS).mapInArrow(
            _spark.reduce_pieces(task, self.out_types, graph=True), _spark.CANDIDATE
        )
        graph = pieces.repartition(*rules.IN_KEYS).mapInArrow(
            _spark.graph_task(task.name, "in"), _spark.CANDIDATE
        )
        return outputs, graph

    def _function(self, task: FunctionCompiler, types: _spark.InputTypes) -> DataFrame:
        from pyspark.sql import functions as F

        snap = self.snapshot(task)
        inputs = {}
        for c, layer in task.input_layers():
            df = snap.filter((F.col("catalog") == c) & (F.col("layer") == layer)).select(
                "partition", "payload"
            )
            if (c, layer) in types:  # the function sees structured payloads as structs
                df = df.mapInArrow(
                    _spark.converted(types[(c, layer)], True), _spark.struct_rows(types[(c, layer)])
                )
            inputs[(c, layer)] = df
        outputs = task.fn(inputs)
        unknown = set(outputs) - set(task.outputs)
        if unknown:
            raise PipelineDefinitionError(f"task {task.name!r} returned undeclared layers {sorted(unknown)}")
        parts = []
        for layer, df in outputs.items():
            if layer in self.out_types:
                df = df.select(F.col("partition").cast("string"), "payload").mapInArrow(
                    _spark.converted(self.out_types[layer], False, layer), "partition string, payload binary"
                )
            parts.append(
                df.select(
                    F.lit(layer).alias("layer"),
                    F.col("partition").cast("string"),
                    F.col("payload").cast("binary"),
                )
            )
        if not parts:
            return self.spark.createDataFrame([], _spark.CANDIDATE)
        return reduce(lambda a, b: a.unionByName(b), parts)


def _graph_key(task: str, side: str, keys: DataFrame) -> DataFrame:
    """`keys` (a DataFrame of one side's key columns) with the `name` of their graph rows in
    the state layer (`rules.graph_name`)."""
    from pyspark.sql import functions as F

    by, _ = rules.SIDES[side]
    return keys.select(*by, F.concat_ws("|", F.lit(task), F.lit(side), *(F.col(c) for c in by)).alias("name"))


def _decide(name: str, candidates: DataFrame, published: DataFrame, full: bool) -> DataFrame:
    """ROWS of the candidates (with their `compiled` flag) against the `published` checksums
    (`rules.decide`); in a full run also of every published key in `published` no candidate
    names (deleted)."""
    joined = candidates.join(published, rules.KEYS, "full" if full else "left")
    return joined.mapInArrow(_spark.per_batch(partial(_checksummed_decision, name)), _spark.ROWS)


def _checksummed_decision(name: str, rows: pa.Table) -> pa.Table:
    """`rules.decide` of joined rows whose checksums are computed here, in the task."""
    return rules.decide(name, rules.checksummed(rows))
