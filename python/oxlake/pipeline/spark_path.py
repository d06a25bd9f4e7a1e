"""The Spark path of a run: the plans, over DataFrames, of a task run in full and of an
incremental direct task without an inverse (which scans every input key), and the output
catalog as the run leaves it. Spark joins and groups; the decision rules (`rules`) run in its
tasks through `mapInArrow`."""

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

    def scanned(
        self, task: Compiler, types: _spark.InputTypes, own: pa.Table, changed: pa.Table | None
    ) -> DataFrame:
        """The ROWS of a task: in full, or incrementally from the `changed` input partitions
        (INPUT rows) for a direct task without an inverse. `own` is the task's state record."""
        from pyspark.sql import functions as F

        graph: DataFrame | None = None
        if isinstance(task, DirectCompiler):
            candidates = (
                self._direct_full(task, types) if changed is None else self._direct(task, types, changed)
            )
        elif isinstance(task, MapGroupCompiler):
            candidates, graph = self._map_group(task, types)
        elif isinstance(task, FunctionCompiler):
            candidates = self._function(task, types)
        else:
            raise PipelineDefinitionError(
                f"task {task.name!r}: {type(task).__name__} is not a known compiler"
            )
        state = _spark.frame(self.spark, own, _spark.CANDIDATE)
        if graph is not None:
            state = state.unionByName(graph)
        compiled = candidates.withColumn("compiled", F.lit(True)).unionByName(
            state.withColumn("compiled", F.lit(False))
        )
        return _decide(task.name, compiled, self.published(task.outputs, task.name), full=changed is None)

    # ---- the output catalog, as published and as this run leaves it -------------------------

    def published(self, layers: Sequence[str], task: str | None = None, payload: bool = False) -> DataFrame:
        """layer, partition, `old` checksum (and with `payload` the payload as bytes) of the
        published rows of `layers`, and of the state rows of `task` (scanned)."""
        from pyspark.sql import functions as F

        snap = self.d.output.snapshot(
            layers=[*layers, STATE_LAYER] if task else list(layers), spark=self.spark, with_state=True
        )
        if payload and set(self.out_types) & set(layers):
            snap = snap.mapInArrow(_spark.encoded(self.out_types), _spark.ROW)
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

    def snapshot(self, task: Compiler, keys_only: bool = False) -> DataFrame:
        """Every input partition of the task at the requested versions (INPUT rows, scanned)."""
        from pyspark.sql import functions as F

        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    df = self.layer_state(layer).select(F.lit(layer).alias("layer"), "partition", "payload")
                    parts.append(df.select(F.lit(name).alias("catalog"), "*"))
            elif self.requested[name] is not None:
                catalog = self.d.inputs[name]
                snap = catalog.snapshot(self.requested[name], layers, spark=self.spark)
                if set(catalog.structured) & set(layers):
                    snap = snap.mapInArrow(_spark.encoded(catalog.structured), _spark.ROW)
                parts.append(snap.select(F.lit(name).alias("catalog"), "layer", "partition", "payload"))
        if not parts:
            return self.spark.createDataFrame([], _spark.INPUT)
        df = reduce(lambda a, b: a.unionByName(b), parts)
        return df.select("catalog", "layer", "partition", *([] if keys_only else ["payload"]))

    # ---- compiling ----------------------------------------------------------------------------

    def _direct_full(self, task: DirectCompiler, types: _spark.InputTypes) -> DataFrame:
        pieces = self.snapshot(task).mapInArrow(_spark.output_keys(task, True), _spark.DIRECT_INPUT)
        return pieces.repartition(*rules.OUT_KEYS).mapInArrow(
            _spark.compile_direct(task, types, self.out_types), _spark.CANDIDATE
        )

    def _direct(self, task: DirectCompiler, types: _spark.InputTypes, changed: pa.Table) -> DataFrame:
        """Outputs of the changed inputs' keys, compiled from the inputs found by mapping every
        input key (the compiler has no inverse), and a `rules.vanished` one for each of those
        outputs no input feeds any more."""
        from pyspark.sql import functions as F

        affected = (
            _spark.frame(self.spark, changed, _spark.INPUT)
            .select(*rules.IN_KEYS)
            .mapInArrow(_spark.output_keys(task, False), _spark.EDGE)
            .select(F.col("out_layer").alias("layer"), F.col("out_partition").alias("partition"))
            .distinct()
        )
        edges = self.snapshot(task, keys_only=True).mapInArrow(_spark.output_keys(task, False), _spark.EDGE)
        needed = edges.join(
            affected.select(F.col("layer").alias("out_layer"), F.col("partition").alias("out_partition")),
            rules.OUT_KEYS,
            "left_semi",
        )
        pieces = needed.join(self.snapshot(task), rules.IN_KEYS).select(
            *rules.OUT_KEYS, *rules.IN_KEYS, "payload"
        )
        compiled = pieces.repartition(*rules.OUT_KEYS).mapInArrow(
            _spark.compile_direct(task, types, self.out_types), _spark.CANDIDATE
        )
        gone = affected.join(compiled.select(*rules.KEYS), rules.KEYS, "left_anti")
        return compiled.unionByName(gone.mapInArrow(_spark.per_batch(rules.vanished), _spark.CANDIDATE))

    def _map_group(self, task: MapGroupCompiler, types: _spark.InputTypes) -> tuple[DataFrame, DataFrame]:
        """The compiled outputs, and the graph's state rows (`rules.graph_rows` of each side, its
        pieces repartitioned by its key: every piece of a key in one task)."""
        pieces = self.snapshot(task).mapInArrow(_spark.map_pieces(task, types), _spark.PIECE)
        pieces = pieces.localCheckpoint()  # computed once, read by the reduce and the graph
        out = pieces.repartition(*rules.OUT_KEYS).mapInArrow(
            _spark.reduce_pieces(task, self.out_types), _spark.CANDIDATE
        )
        sides = []
        for side, (by, to) in rules.SIDES.items():
            fn = _spark.per_task(partial(rules.graph_rows, task.name, side))
            sides.append(pieces.select(*by, *to).repartition(*by).mapInArrow(fn, _spark.CANDIDATE))
        return out, sides[0].unionByName(sides[1])

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
                    _spark.converted(self.out_types[layer], False), "partition string, payload binary"
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


def _decide(name: str, candidates: DataFrame, published: DataFrame, full: bool) -> DataFrame:
    """ROWS of the candidates (with their `compiled` flag) against the `published` checksums
    (`rules.decide`); in a full run also of every published key in `published` no candidate
    names (deleted)."""
    joined = candidates.join(published, rules.KEYS, "full" if full else "left")
    return joined.mapInArrow(_spark.per_batch(partial(_checksummed_decision, name)), _spark.ROWS)


def _checksummed_decision(name: str, rows: pa.Table) -> pa.Table:
    """`rules.decide` of joined rows whose checksums are computed here, in the task."""
    return rules.decide(name, rules.checksummed(rows))
