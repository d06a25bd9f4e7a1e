"""The driver: checks a pipeline before any work, decides per task between a full and an
incremental run, compiles on Spark, and publishes every task's output, its state and the input
versions used in ONE commit of the output catalog (DESIGN.md §7)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING

from oxlake import _native
from oxlake.pipeline import _spark
from oxlake.pipeline.catalog import STATE_LAYER, Catalog
from oxlake.pipeline.compilers import Compiler, DirectCompiler, FunctionCompiler, MapGroupCompiler

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


class PipelineDefinitionError(_native.InvalidArgumentError):
    """A pipeline that cannot run: two tasks produce one layer, a task reads an output layer no
    earlier task produces, an unknown catalog, a reserved layer."""


@dataclass
class LayerReport:
    """What a run did to one output layer."""

    compiled: int = 0
    written: int = 0
    unchanged: int = 0
    deleted: int = 0


@dataclass
class TaskReport:
    name: str
    mode: str  # "full" or "incremental"
    reason: str | None  # why full, else None
    layers: dict[str, LayerReport] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)  # catalog -> instant read


@dataclass
class RunReport:
    """The outcome of `Driver.run`."""

    tasks: dict[str, TaskReport]
    instant: str | None  # the commit, None when nothing changed or dry run
    version: int | None  # its dense number
    dry_run: bool

    @property
    def mode(self) -> str:
        """ "full" when any task ran in full, else "incremental"."""
        return "full" if any(t.mode == "full" for t in self.tasks.values()) else "incremental"

    @property
    def reasons(self) -> dict[str, str]:
        return {n: t.reason for n, t in self.tasks.items() if t.reason}

    @property
    def layers(self) -> dict[str, LayerReport]:
        return {layer: r for t in self.tasks.values() for layer, r in t.layers.items()}


class Driver:
    """Runs `tasks` in order, reading the catalogs `inputs` (by name) and publishing into
    `output` (tasks read its layers under `output_name`)."""

    def __init__(
        self,
        spark: SparkSession,
        output: Catalog,
        inputs: Mapping[str, Catalog],
        tasks: Sequence[Compiler],
        *,
        output_name: str = "output",
    ) -> None:
        self.spark, self.output, self.inputs = spark, output, dict(inputs)
        self.tasks, self.output_name = list(tasks), output_name
        self.producers = check(self.tasks, set(self.inputs), output_name)

    def run(
        self,
        versions: Mapping[str, int | str] | None = None,
        *,
        since: Mapping[str, int | str] | None = None,
        full: bool = False,
        reprocess: Sequence[str] = (),
        dry_run: bool = False,
    ) -> RunReport:
        """Compiles every task at the input `versions` (default latest) and publishes.

        A task runs incrementally from the input versions it recorded, unless `full`, it has
        no state or output yet, its fingerprint changed, one of its inputs is in `reprocess`,
        `since` names input versions other than the recorded ones, or an upstream task ran in
        full; the report says which. `dry_run` plans and counts without writing.
        """
        self.output.refresh()
        for c in self.inputs.values():
            c.refresh()
        requested = {
            name: (c.instant_of(versions[name]) if versions and name in versions else c.latest())
            for name, c in self.inputs.items()
        }
        states = self._states()
        published_layers = set(self.output.layers()) if self.output.latest() else set()
        published = self._published()
        run = _Run(self, requested, published)
        for task in self.tasks:
            _spark.ship(task)
            reason = self._full_reason(task, states.get(task.name), requested, since, full, reprocess, run)
            if reason is None and not (set(task.outputs) & published_layers):
                reason = "the output is empty"
            run.task(task, reason, states.get(task.name))
        return run.publish(dry_run)

    def _states(self) -> dict[str, dict[str, object]]:
        if self.output.latest() is None:
            return {}
        t = self.output.table.to_arrow(
            columns=["partition", "payload"],
            filter=[("layer", "=", STATE_LAYER), ("partition", "in", [t.name for t in self.tasks])],
        )
        return {
            p: json.loads(v)
            for p, v in zip(t.column("partition").to_pylist(), t.column("payload").to_pylist(), strict=True)
            if v
        }

    def _published(self) -> DataFrame:
        """layer, partition, payload, old checksum of the output catalog now (state included)."""
        snap = self.output.snapshot(spark=self.spark, with_state=True)
        return snap.select("layer", "partition", "payload", snap.checksum.alias("old"))

    def _full_reason(
        self,
        task: Compiler,
        state: dict[str, object] | None,
        requested: dict[str, str | None],
        since: Mapping[str, int | str] | None,
        full: bool,
        reprocess: Sequence[str],
        run: _Run,
    ) -> str | None:
        if not task.incremental:
            return "a non-incremental compiler"
        if full:
            return "a full run was requested"
        if state is None:
            return "no recorded state (first run)"
        recorded: dict[str, str] = state.get("fingerprint", {})  # type: ignore[assignment]
        for part, value in task.fingerprint().items():
            if recorded.get(part) != value:
                what = {"library": "library version", "code": "compiler code", "config": "configuration"}[
                    part
                ]
                return f"the fingerprint changed ({what})"
        inputs = {c for c, _ in task.input_layers()}
        marked = sorted(inputs & set(reprocess))
        if marked:
            return f"input {marked[0]} is marked for reprocessing"
        recorded_inputs: dict[str, str] = state.get("inputs", {})  # type: ignore[assignment]
        for name in sorted(inputs - {self.output_name}):
            had, want = recorded_inputs.get(name), requested[name]
            if since and name in since and self.inputs[name].instant_of(since[name]) != had:
                return f"the recorded input versions do not match the requested range ({name})"
            if had is None or (want is not None and had > want) or had not in self.inputs[name].instants():
                return f"the recorded input versions do not match the requested range ({name})"
        upstream = sorted(
            run.full_layers & {layer for c, layer in task.input_layers() if c == self.output_name}
        )
        if upstream:
            return f"upstream layer {upstream[0]} was compiled in full"
        return None


def check(tasks: Sequence[Compiler], inputs: set[str], output_name: str) -> dict[str, str]:
    """The producing task of every output layer; raises PipelineDefinitionError before any work."""
    producers: dict[str, str] = {}
    names = [t.name for t in tasks]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineDefinitionError(f"two tasks are named {duplicates[0]!r}")
    for task in tasks:
        for catalog, layer in task.input_layers():
            if catalog == output_name:
                if layer not in producers:
                    raise PipelineDefinitionError(
                        f"task {task.name!r} reads layer {layer!r} of the output catalog, "
                        "which no earlier task produces"
                    )
            elif catalog not in inputs:
                raise PipelineDefinitionError(f"task {task.name!r} reads unknown catalog {catalog!r}")
        if not task.outputs:
            raise PipelineDefinitionError(f"task {task.name!r} declares no output layer")
        for layer in task.outputs:
            if layer == STATE_LAYER or not layer or "/" in layer:
                raise PipelineDefinitionError(f"task {task.name!r}: {layer!r} is not a valid output layer")
            if layer in producers:
                raise PipelineDefinitionError(
                    f"tasks {producers[layer]!r} and {task.name!r} both produce layer {layer!r}"
                )
            producers[layer] = task.name
    return producers


class _Run:
    """One run's tasks: their candidate rows against the published state, in order."""

    def __init__(self, driver: Driver, requested: dict[str, str | None], published: DataFrame) -> None:
        self.d, self.requested, self.published = driver, requested, published
        self.rows: list[DataFrame] = []  # WRITE rows + task, compiled flag, action
        self.reports: dict[str, TaskReport] = {}
        self.full_layers: set[str] = set()
        self.new_state: dict[str, DataFrame] = {}  # layer -> (partition, payload) after this run
        self.changed: dict[str, DataFrame] = {}  # layer -> (partition, payload|null) changed now

    # ---- inputs -------------------------------------------------------------------------------

    def snapshot(self, task: Compiler, keys_only: bool = False) -> DataFrame:
        """Every input partition of the task at the requested versions (INPUT rows)."""
        from pyspark.sql import functions as F

        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    df = self.new_state[layer].select(F.lit(layer).alias("layer"), "partition", "payload")
                    parts.append(df.select(F.lit(name).alias("catalog"), "*"))
            elif self.requested[name] is not None:
                snap = self.d.inputs[name].snapshot(self.requested[name], layers, spark=self.d.spark)
                parts.append(snap.select(F.lit(name).alias("catalog"), "layer", "partition", "payload"))
        if not parts:
            return self.d.spark.createDataFrame([], _spark.INPUT)
        df = reduce(lambda a, b: a.unionByName(b), parts)
        return df.select("catalog", "layer", "partition", *([] if keys_only else ["payload"]))

    def changes(self, task: Compiler, state: dict[str, object]) -> DataFrame:
        """The input partitions changed since the recorded versions (INPUT rows, payload null
        when removed)."""
        from pyspark.sql import functions as F

        recorded: dict[str, str] = state["inputs"]  # type: ignore[assignment]
        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    df = self.changed[layer]
                    parts.append(
                        df.select(
                            F.lit(name).alias("catalog"), F.lit(layer).alias("layer"), "partition", "payload"
                        )
                    )
            elif recorded[name] != self.requested[name]:
                ch = self.d.inputs[name].changes(
                    recorded[name], self.requested[name], layers, spark=self.d.spark
                )
                parts.append(ch.select(F.lit(name).alias("catalog"), "layer", "partition", "payload"))
        if not parts:
            return self.d.spark.createDataFrame([], _spark.INPUT)
        return reduce(lambda a, b: a.unionByName(b), parts)

    # ---- compiling ----------------------------------------------------------------------------

    def task(self, task: Compiler, reason: str | None, state: dict[str, object] | None) -> None:
        from pyspark.sql import functions as F

        incremental = reason is None
        report = TaskReport(task.name, "incremental" if incremental else "full", reason)
        report.inputs = {
            c: v for c in task.inputs if c != self.d.output_name and (v := self.requested[c]) is not None
        }
        self.reports[task.name] = report
        graph: DataFrame | None = None
        if isinstance(task, DirectCompiler):
            candidates = self._direct(task, state if incremental else None)
        elif isinstance(task, MapGroupCompiler):
            candidates, graph = self._map_group(task, state if incremental else None)
        elif isinstance(task, FunctionCompiler):
            candidates = self._function(task)
        else:
            raise PipelineDefinitionError(
                f"task {task.name!r}: {type(task).__name__} is not a known compiler"
            )
        record = json.dumps({"fingerprint": task.fingerprint(), "inputs": report.inputs}, sort_keys=True)
        own_state = self.d.spark.createDataFrame(
            [(STATE_LAYER, task.name, record.encode())], _spark.CANDIDATE
        )
        if graph is not None:
            own_state = own_state.unionByName(graph)
        compiled = candidates.withColumn("compiled", F.lit(True)).unionByName(
            own_state.withColumn("compiled", F.lit(False))
        )
        scope = None
        if not incremental:
            self.full_layers |= set(task.outputs)
            prefix = f"{task.name}|"
            scope = F.col("layer").isin(list(task.outputs))
            if isinstance(task, MapGroupCompiler):
                scope = scope | ((F.col("layer") == STATE_LAYER) & F.col("partition").startswith(prefix))
        rows = self._decide(task.name, compiled, scope)
        self.rows.append(rows)
        for layer in task.outputs:
            mine = rows.filter(F.col("layer") == layer)
            changed = mine.filter(F.col("op").isin("upsert", "delete")).select("partition", "payload")
            kept = (
                self.published.filter(F.col("layer") == layer)
                .select("partition", "payload")
                .join(changed.select("partition"), "partition", "left_anti")
            )
            self.new_state[layer] = kept.unionByName(
                mine.filter(F.col("op") == "upsert").select("partition", "payload")
            )
            self.changed[layer] = changed

    def _decide(self, name: str, compiled: DataFrame, scope: Column | None) -> DataFrame:
        """Each candidate against what is published: upsert (new or different checksum),
        delete (empty payload of a published key; and in full-snapshot scope, every published
        key not produced), unchanged, or none (empty and unpublished)."""
        from pyspark.sql import functions as F

        cand = compiled.withColumn(
            "checksum", F.when(F.length("payload") > 0, F.sha2("payload", 256))
        ).withColumn("payload", F.when(F.length("payload") > 0, F.col("payload")))
        pub = self.published.select("layer", "partition", "old")
        joined = cand.join(pub, ["layer", "partition"], "left")
        op = (
            F.when(F.col("checksum").isNull() & F.col("old").isNotNull(), "delete")
            .when(F.col("checksum").isNull(), "none")
            .when(F.col("old").isNull() | (F.col("checksum") != F.col("old")), "upsert")
            .otherwise("unchanged")
        )
        rows = joined.select(
            F.lit(name).alias("task"), op.alias("op"), "layer", "partition", "payload", "checksum", "compiled"
        )
        if scope is not None:
            gone = (
                pub.filter(scope)
                .join(cand.select("layer", "partition"), ["layer", "partition"], "left_anti")
                .select(
                    F.lit(name).alias("task"),
                    F.lit("delete").alias("op"),
                    "layer",
                    "partition",
                    F.lit(None).cast("binary").alias("payload"),
                    F.lit(None).cast("string").alias("checksum"),
                    F.lit(False).alias("compiled"),
                )
            )
            rows = rows.unionByName(gone)
        return rows

    def _direct(self, task: DirectCompiler, state: dict[str, object] | None) -> DataFrame:
        spark = self.d.spark
        if state is None:
            pieces = self.snapshot(task).mapInArrow(_spark.output_keys(task, True), _spark.DIRECT_INPUT)
            return pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
                _spark.compile_direct(task), _spark.CANDIDATE
            )
        affected = (
            self.changes(task, state)
            .select(*_spark._IN_KEYS)
            .mapInArrow(_spark.output_keys(task, False), _spark.EDGE)
            .select(*_spark._OUT_KEYS)
            .distinct()
        )
        edges = self.snapshot(task, keys_only=True).mapInArrow(_spark.output_keys(task, False), _spark.EDGE)
        needed = edges.join(affected, _spark._OUT_KEYS, "left_semi")
        pieces = needed.join(self.snapshot(task), _spark._IN_KEYS).select(
            *_spark._OUT_KEYS, *_spark._IN_KEYS, "payload"
        )
        compiled = pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
            _spark.compile_direct(task), _spark.CANDIDATE
        )
        return self._with_vanished(affected, compiled, spark)

    @staticmethod
    def _with_vanished(affected: DataFrame, compiled: DataFrame, spark: SparkSession) -> DataFrame:
        """The compiled outputs, plus an empty candidate for each affected output that no input
        feeds any more (so that a published one is deleted)."""
        from pyspark.sql import functions as F

        keys = affected.select(F.col("out_layer").alias("layer"), F.col("out_partition").alias("partition"))
        vanished = keys.join(compiled.select("layer", "partition"), ["layer", "partition"], "left_anti")
        return compiled.unionByName(vanished.withColumn("payload", F.lit(None).cast("binary")))

    def _map_group(
        self, task: MapGroupCompiler, state: dict[str, object] | None
    ) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F

        spark, keys = self.d.spark, _spark._IN_KEYS
        if state is None:
            pieces = self.snapshot(task).mapInArrow(_spark.map_pieces(task), _spark.PIECE)
            pieces = pieces.persist()
            out = pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
                _spark.reduce_pieces(task), _spark.CANDIDATE
            )
            return out, self._graph_rows(task, pieces, None)
        changed = self.changes(task, state).persist()
        new_pieces = changed.filter(F.col("payload").isNotNull()).mapInArrow(
            _spark.map_pieces(task), _spark.PIECE
        )
        old = self._old_graph(task)
        old_affected = old.join(changed.select(*keys), keys, "left_semi").select(*_spark._OUT_KEYS)
        affected = old_affected.unionByName(new_pieces.select(*_spark._OUT_KEYS)).distinct()
        feeders = (
            old.join(affected, _spark._OUT_KEYS, "left_semi")
            .select(*keys)
            .distinct()
            .join(changed.select(*keys), keys, "left_anti")
        )
        feeder_pieces = (
            self.snapshot(task)
            .join(feeders, keys, "left_semi")
            .mapInArrow(_spark.map_pieces(task), _spark.PIECE)
            .join(affected, _spark._OUT_KEYS, "left_semi")
        )
        pieces = new_pieces.unionByName(feeder_pieces)
        compiled = pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
            _spark.reduce_pieces(task), _spark.CANDIDATE
        )
        return self._with_vanished(affected, compiled, spark), self._graph_rows(task, new_pieces, changed)

    def _graph_key(self, task: Compiler) -> Column:
        from pyspark.sql import functions as F

        return F.concat_ws("|", F.lit(task.name), "catalog", "layer", "partition")

    def _graph_rows(self, task: MapGroupCompiler, pieces: DataFrame, changed: DataFrame | None) -> DataFrame:
        """State rows: per input partition, the output partitions it feeds (JSON). In an
        incremental run, changed inputs that feed nothing get an empty row (deleted)."""
        from pyspark.sql import functions as F

        edges = pieces.select(*_spark._IN_KEYS, F.array("out_layer", "out_partition").alias("out")).distinct()
        by_input = edges.groupBy(*_spark._IN_KEYS).agg(F.sort_array(F.collect_list("out")).alias("outputs"))
        payload = F.to_json(F.struct(F.array("catalog", "layer", "partition").alias("input"), "outputs"))
        rows = by_input.select(
            F.lit(STATE_LAYER).alias("layer"),
            self._graph_key(task).alias("partition"),
            payload.cast("binary").alias("payload"),
        )
        if changed is not None:
            gone = changed.select(*_spark._IN_KEYS).join(by_input, _spark._IN_KEYS, "left_anti")
            rows = rows.unionByName(
                gone.select(
                    F.lit(STATE_LAYER).alias("layer"),
                    self._graph_key(task).alias("partition"),
                    F.lit(None).cast("binary").alias("payload"),
                )
            )
        return rows

    def _old_graph(self, task: MapGroupCompiler) -> DataFrame:
        """The recorded edges of the task: input key → output key (EDGE rows)."""
        from pyspark.sql import functions as F

        schema = "struct<input: array<string>, outputs: array<array<string>>>"
        rows = self.published.filter(
            (F.col("layer") == STATE_LAYER) & F.col("partition").startswith(f"{task.name}|")
        ).select(F.from_json(F.col("payload").cast("string"), schema).alias("g"))
        out = rows.select(F.col("g.input").alias("i"), F.explode("g.outputs").alias("o"))
        return out.select(
            F.col("o")[0].alias("out_layer"),
            F.col("o")[1].alias("out_partition"),
            F.col("i")[0].alias("catalog"),
            F.col("i")[1].alias("layer"),
            F.col("i")[2].alias("partition"),
        )

    def _function(self, task: FunctionCompiler) -> DataFrame:
        from pyspark.sql import functions as F

        snap = self.snapshot(task)
        inputs = {
            (c, layer): snap.filter((F.col("catalog") == c) & (F.col("layer") == layer)).select(
                "partition", "payload"
            )
            for c, layer in task.input_layers()
        }
        outputs = task.fn(inputs)
        unknown = set(outputs) - set(task.outputs)
        if unknown:
            raise PipelineDefinitionError(f"task {task.name!r} returned undeclared layers {sorted(unknown)}")
        parts = [
            df.select(
                F.lit(layer).alias("layer"),
                F.col("partition").cast("string"),
                F.col("payload").cast("binary"),
            )
            for layer, df in outputs.items()
        ]
        if not parts:
            return self.d.spark.createDataFrame([], _spark.CANDIDATE)
        return reduce(lambda a, b: a.unionByName(b), parts)

    # ---- publishing ---------------------------------------------------------------------------

    def publish(self, dry_run: bool) -> RunReport:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        rows = reduce(lambda a, b: a.unionByName(b), self.rows).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts = (
                rows.filter(F.col("layer") != STATE_LAYER)
                .groupBy("task", "layer", "op", "compiled")
                .count()
                .collect()
            )
            for task in self.d.tasks:
                for name in task.outputs:
                    self.reports[task.name].layers.setdefault(name, LayerReport())
            for r in counts:
                layer = self.reports[r["task"]].layers.setdefault(r["layer"], LayerReport())
                if r["compiled"]:
                    layer.compiled += r["count"]
                if r["op"] == "upsert":
                    layer.written += r["count"]
                elif r["op"] == "delete":
                    layer.deleted += r["count"]
                elif r["op"] == "unchanged":
                    layer.unchanged += r["count"]
            writes = rows.filter(F.col("op").isin("upsert", "delete")).select(
                *[c.split()[0] for c in _spark.WRITE.split(", ")]
            )
            instant = None
            if not dry_run and writes.limit(1).count():
                instant = _spark.write_one_commit(writes, self.d.output.uri, self.d.output.storage_options)
        finally:
            rows.unpersist()
        version = None
        if instant is not None:
            self.d.output.refresh()
            version = self.d.output.number_of(instant)
        return RunReport(self.reports, instant, version, dry_run)
