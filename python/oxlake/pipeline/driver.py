"""The driver: checks a pipeline before any work, decides per task between a full and an
incremental run, compiles on Spark, and publishes every task's output, its state and the input
versions used in ONE commit of the output catalog (DESIGN.md §7)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from oxlake import _native
from oxlake.pipeline import _payload, _spark
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
        run = _Run(self, requested)
        for task in self.tasks:
            _spark.ship(task)
            reason = self._full_reason(task, states.get(task.name), requested, since, full, reprocess, run)
            if reason is None and not (set(task.outputs) & published_layers):
                reason = "the output is empty"
            run.task(task, reason, states.get(task.name))
        return run.publish(dry_run)

    def _states(self) -> dict[str, dict[str, object]]:
        """The state record of each task (its fingerprint and input versions), read by key."""
        t = self.output.read([(STATE_LAYER, task.name) for task in self.tasks], columns=["payload"])
        return {
            p: json.loads(v)
            for p, v in zip(t.column("partition").to_pylist(), t.column("payload").to_pylist(), strict=True)
            if v
        }

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
    """One run's tasks: their candidate rows against the published state, in order.

    A full run scans its inputs and the published rows of its layers. An incremental run works
    from keys: the input partitions changed since the recorded versions, the output partitions
    they affect, the inputs feeding those (from the compiler's inverse or the recorded graph),
    and only those published rows, read by key; Spark runs the compilers over what was read."""

    def __init__(self, driver: Driver, requested: dict[str, str | None]) -> None:
        self.d, self.requested = driver, requested
        self.spark = driver.spark
        self.out_types = driver.output.structured
        self.rows: list[DataFrame] = []  # WRITE rows + task, compiled flag, action
        self.reports: dict[str, TaskReport] = {}
        self.full_layers: set[str] = set()
        self.layer_rows: dict[str, DataFrame] = {}  # output layer -> its decided rows this run
        self._changes: dict[tuple[str, tuple[str, ...], str | None, str | None], pa.Table] = {}

    def types(self, task: Compiler) -> dict[tuple[str, str], pa.StructType]:
        """The struct types of the task's structured input layers."""
        out = {}
        for catalog, layer in task.input_layers():
            c = self.d.output if catalog == self.d.output_name else self.d.inputs[catalog]
            if layer in c.structured:
                out[(catalog, layer)] = c.structured[layer]
        return out

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

    def published_keys(self, keys: Iterable[tuple[str, str]]) -> DataFrame:
        """layer, partition, `old` checksum of the published rows of `keys` (read by key)."""
        t = self.d.output.read(keys, columns=["checksum"]).rename_columns(["layer", "partition", "old"])
        return _spark.frame(self.spark, t, f"{_spark.KEY}, old string")

    def layer_changes(self, layer: str) -> DataFrame:
        """partition, payload (null: deleted) of what this run changes in an output layer."""
        from pyspark.sql import functions as F

        rows = self.layer_rows[layer]
        return rows.filter(F.col("op").isin("upsert", "delete")).select("partition", "payload")

    def layer_state(self, layer: str) -> DataFrame:
        """partition, payload of an output layer after this run."""
        from pyspark.sql import functions as F

        kept = (
            self.published([layer], payload=True)
            .select("partition", "payload")
            .join(self.layer_changes(layer).select("partition"), "partition", "left_anti")
        )
        upserts = self.layer_rows[layer].filter(F.col("op") == "upsert").select("partition", "payload")
        return kept.unionByName(upserts)

    def graph(
        self, task: Compiler, side: str, keys: Iterable[tuple[str, ...]]
    ) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
        """Recorded edges of a map-group task, read by key: for `side` "in" the outputs each
        input partition fed, for "out" the inputs each output partition was fed by."""
        by_name = {_graph_name(task, side, key): key for key in keys}
        t = self.d.output.read([(STATE_LAYER, n) for n in by_name], columns=["payload"])
        return {
            by_name[n]: [tuple(x) for x in json.loads(p)]
            for n, p in zip(t.column("partition").to_pylist(), t.column("payload").to_pylist(), strict=True)
            if p
        }

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

    def changes(self, task: Compiler, state: dict[str, object]) -> pa.Table:
        """The input partitions changed since the recorded versions (INPUT rows, payload null
        when removed), on the driver."""
        from pyspark.sql import functions as F

        recorded: dict[str, str] = state["inputs"]  # type: ignore[assignment]
        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    df = self.layer_changes(layer).select(
                        F.lit(name).alias("catalog"), F.lit(layer).alias("layer"), "partition", "payload"
                    )
                    parts.append(_spark.collect(df))
            elif recorded[name] != self.requested[name]:
                key = (name, tuple(layers), recorded[name], self.requested[name])
                if key not in self._changes:  # tasks reading the same range share one read
                    catalog = self.d.inputs[name]
                    ch = catalog.changes(recorded[name], self.requested[name], layers)
                    self._changes[key] = _input_rows(name, ch, catalog.structured)
                parts.append(self._changes[key])
        return _concat(parts)

    def fetch(self, task: Compiler, keys: Iterable[tuple[str, str, str]]) -> pa.Table:
        """The input partitions of `keys` at the requested versions (INPUT rows), read by key."""
        from pyspark.sql import functions as F

        by_catalog: dict[str, set[tuple[str, str]]] = {}
        for catalog, layer, partition in keys:
            by_catalog.setdefault(catalog, set()).add((layer, partition))
        parts = []
        for name, pairs in sorted(by_catalog.items()):
            if name == self.d.output_name:
                for layer in sorted({layer for layer, _ in pairs}):
                    wanted = pa.table({"partition": sorted(p for x, p in pairs if x == layer)})
                    df = self.layer_state(layer).join(
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
        return _concat(parts)

    # ---- compiling ----------------------------------------------------------------------------

    def task(self, task: Compiler, reason: str | None, state: dict[str, object] | None) -> None:
        from pyspark.sql import functions as F

        incremental = state is not None and reason is None
        report = TaskReport(task.name, "full" if reason else "incremental", reason)
        report.inputs = {
            c: v for c in task.inputs if c != self.d.output_name and (v := self.requested[c]) is not None
        }
        self.reports[task.name] = report
        graph: DataFrame | None = None
        keys: set[tuple[str, str]] | None = None  # incremental: every key the task may write
        if isinstance(task, DirectCompiler):
            if not incremental:
                candidates = self._direct_full(task)
            elif task.invertible:
                candidates, keys = self._direct_keyed(task, state)  # type: ignore[arg-type]
            else:
                candidates = self._direct_scanned(task, state)  # type: ignore[arg-type]
        elif isinstance(task, MapGroupCompiler):
            if not incremental:
                candidates, graph = self._map_group_full(task)
            else:
                candidates, graph, keys = self._map_group_keyed(task, state)  # type: ignore[arg-type]
        elif isinstance(task, FunctionCompiler):
            candidates = self._function(task)
        else:
            raise PipelineDefinitionError(
                f"task {task.name!r}: {type(task).__name__} is not a known compiler"
            )
        record = json.dumps({"fingerprint": task.fingerprint(), "inputs": report.inputs}, sort_keys=True)
        own = pa.table({"layer": [STATE_LAYER], "partition": [task.name], "payload": [record.encode()]})
        own_state = _spark.frame(self.spark, own, _spark.CANDIDATE)
        if graph is not None:
            own_state = own_state.unionByName(graph)
        compiled = candidates.withColumn("compiled", F.lit(True)).unionByName(
            own_state.withColumn("compiled", F.lit(False))
        )
        if incremental and keys is not None:
            rows = self._decide(task.name, compiled, self.published_keys(keys | {(STATE_LAYER, task.name)}))
        else:
            published = self.published(task.outputs, task.name)
            rows = self._decide(task.name, compiled, published, full=not incremental)
        if not incremental:
            self.full_layers |= set(task.outputs)
        self.rows.append(rows)
        for layer in task.outputs:
            self.layer_rows[layer] = rows.filter(F.col("layer") == layer)

    def _decide(self, name: str, compiled: DataFrame, published: DataFrame, full: bool = False) -> DataFrame:
        """Each candidate against what is published: upsert (new or different checksum),
        delete (empty payload of a published key; and in a full run, every published key in
        `published` not produced), unchanged, or none (empty and unpublished)."""
        from pyspark.sql import functions as F

        cand = compiled.withColumn(
            "checksum", F.when(F.length("payload") > 0, F.sha2("payload", 256))
        ).withColumn("payload", F.when(F.length("payload") > 0, F.col("payload")))
        pub = published.select("layer", "partition", "old")
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
        if full:
            gone = pub.join(cand.select("layer", "partition"), ["layer", "partition"], "left_anti").select(
                F.lit(name).alias("task"),
                F.lit("delete").alias("op"),
                "layer",
                "partition",
                F.lit(None).cast("binary").alias("payload"),
                F.lit(None).cast("string").alias("checksum"),
                F.lit(False).alias("compiled"),
            )
            rows = rows.unionByName(gone)
        return rows

    def _direct_full(self, task: DirectCompiler) -> DataFrame:
        pieces = self.snapshot(task).mapInArrow(_spark.output_keys(task, True), _spark.DIRECT_INPUT)
        return pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
            _spark.compile_direct(task, self.types(task), self.out_types), _spark.CANDIDATE
        )

    def _direct_keyed(
        self, task: DirectCompiler, state: dict[str, object]
    ) -> tuple[DataFrame, set[tuple[str, str]]]:
        """Outputs of the changed inputs' keys, compiled from the inputs the compiler's inverse
        names (read by key)."""
        changed = self.changes(task, state)
        affected = {out for key in _keys(changed) for out in task.output_keys(*key)}
        declared = set(task.input_layers())
        wanted = {key for out in affected for key in task.input_keys(*out) if key[:2] in declared}
        inputs = self.fetch(task, wanted)
        out: dict[str, list[str]] = {"out_layer": [], "out_partition": []}
        take: list[int] = []
        for i, key in enumerate(_keys(inputs)):
            for layer, partition in task.output_keys(*key):
                if (layer, partition) in affected:
                    out["out_layer"].append(layer)
                    out["out_partition"].append(partition)
                    take.append(i)
        rows = inputs.take(pa.array(take, pa.int64()))
        for n, (column, values) in enumerate(out.items()):
            rows = rows.add_column(n, column, pa.array(values, pa.string()))
        pieces = _spark.frame(self.spark, rows, _spark.DIRECT_INPUT)
        compiled = pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
            _spark.compile_direct(task, self.types(task), self.out_types), _spark.CANDIDATE
        )
        return self._with_vanished(self._key_frame(affected), compiled), affected

    def _direct_scanned(self, task: DirectCompiler, state: dict[str, object]) -> DataFrame:
        """Outputs of the changed inputs' keys, compiled from the inputs found by mapping every
        input key (the compiler has no inverse)."""
        from pyspark.sql import functions as F

        changed = _spark.frame(self.spark, self.changes(task, state), _spark.INPUT)
        affected = (
            changed.select(*_spark._IN_KEYS)
            .mapInArrow(_spark.output_keys(task, False), _spark.EDGE)
            .select(F.col("out_layer").alias("layer"), F.col("out_partition").alias("partition"))
            .distinct()
        )
        edges = self.snapshot(task, keys_only=True).mapInArrow(_spark.output_keys(task, False), _spark.EDGE)
        needed = edges.join(
            affected.select(F.col("layer").alias("out_layer"), F.col("partition").alias("out_partition")),
            _spark._OUT_KEYS,
            "left_semi",
        )
        pieces = needed.join(self.snapshot(task), _spark._IN_KEYS).select(
            *_spark._OUT_KEYS, *_spark._IN_KEYS, "payload"
        )
        compiled = pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
            _spark.compile_direct(task, self.types(task), self.out_types), _spark.CANDIDATE
        )
        return self._with_vanished(affected, compiled)

    def _key_frame(self, keys: Iterable[tuple[str, str]]) -> DataFrame:
        ordered = sorted(keys)
        t = pa.table(
            {"layer": [k[0] for k in ordered], "partition": [k[1] for k in ordered]},
            schema=pa.schema([("layer", pa.string()), ("partition", pa.string())]),
        )
        return _spark.frame(self.spark, t, _spark.KEY)

    @staticmethod
    def _with_vanished(affected: DataFrame, compiled: DataFrame) -> DataFrame:
        """The compiled outputs, plus an empty candidate for each affected output (layer,
        partition) that no input feeds any more (so that a published one is deleted)."""
        from pyspark.sql import functions as F

        vanished = affected.join(compiled.select("layer", "partition"), ["layer", "partition"], "left_anti")
        return compiled.unionByName(vanished.withColumn("payload", F.lit(None).cast("binary")))

    def _map_group_full(self, task: MapGroupCompiler) -> tuple[DataFrame, DataFrame]:

        pieces = self.snapshot(task).mapInArrow(_spark.map_pieces(task, self.types(task)), _spark.PIECE)
        pieces = pieces.localCheckpoint()  # computed once, read by the reduce and the graph
        out = pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
            _spark.reduce_pieces(task, self.out_types), _spark.CANDIDATE
        )
        return out, self._graph_rows(task, pieces, pieces)

    def _map_group_keyed(
        self, task: MapGroupCompiler, state: dict[str, object]
    ) -> tuple[DataFrame, DataFrame, set[tuple[str, str]]]:
        """Outputs the changed inputs fed before (recorded graph) or feed now (mapped), reduced
        from the changed inputs' pieces and the pieces of the unchanged inputs that fed them."""
        from pyspark.sql import functions as F

        changed = self.changes(task, state)
        changed_keys = set(_keys(changed))
        live = changed.filter(pc.is_valid(changed.column("payload")))
        new_pieces = _spark.frame(self.spark, live, _spark.INPUT).mapInArrow(
            _spark.map_pieces(task, self.types(task)), _spark.PIECE
        )
        new_pieces = new_pieces.localCheckpoint()
        now = _spark.collect(new_pieces.select(*_spark._OUT_KEYS).distinct())
        affected = set(zip(now.column(0).to_pylist(), now.column(1).to_pylist(), strict=True))
        for outs in self.graph(task, "in", changed_keys).values():
            affected.update(outs)  # type: ignore[arg-type]
        feeders = {i for ins in self.graph(task, "out", affected).values() for i in ins} - changed_keys
        affected_frame = self._key_frame(affected)
        feeder_pieces = (
            _spark.frame(self.spark, self.fetch(task, feeders), _spark.INPUT)  # type: ignore[arg-type]
            .mapInArrow(_spark.map_pieces(task, self.types(task)), _spark.PIECE)
            .join(
                affected_frame.select(
                    F.col("layer").alias("out_layer"), F.col("partition").alias("out_partition")
                ),
                _spark._OUT_KEYS,
                "left_semi",
            )
        )
        pieces = new_pieces.unionByName(feeder_pieces).localCheckpoint()
        compiled = pieces.repartition(*_spark._OUT_KEYS).mapInArrow(
            _spark.reduce_pieces(task, self.out_types), _spark.CANDIDATE
        )
        graph = self._graph_rows(task, new_pieces, pieces, changed_keys, affected)
        written = {(STATE_LAYER, _graph_name(task, "in", k)) for k in changed_keys}
        written |= {(STATE_LAYER, _graph_name(task, "out", k)) for k in affected}
        return self._with_vanished(affected_frame, compiled), graph, affected | written

    def _graph_rows(
        self,
        task: MapGroupCompiler,
        inputs_pieces: DataFrame,
        outputs_pieces: DataFrame,
        inputs: set[tuple[str, str, str]] | None = None,
        outputs: set[tuple[str, str]] | None = None,
    ) -> DataFrame:
        """State rows of the graph (CANDIDATE rows): per input partition the outputs it feeds,
        per output partition the inputs feeding it (JSON lists). In an incremental run, the
        rows of the changed `inputs` and the affected `outputs`, empty (deleted) for those
        without edges now."""
        from pyspark.sql import functions as F

        def side(pieces: DataFrame, name: str, by: list[str], to: list[str]) -> DataFrame:
            edges = pieces.select(*by, F.array(*to).alias("edge")).distinct()
            grouped = edges.groupBy(*by).agg(F.sort_array(F.collect_list("edge")).alias("edges"))
            key = F.concat_ws("|", F.lit(task.name), F.lit(name), *by)
            return grouped.select(
                F.lit(STATE_LAYER).alias("layer"),
                key.alias("partition"),
                F.to_json("edges").cast("binary").alias("payload"),
            )

        rows = side(inputs_pieces, "in", _spark._IN_KEYS, _spark._OUT_KEYS).unionByName(
            side(outputs_pieces, "out", _spark._OUT_KEYS, _spark._IN_KEYS)
        )
        if inputs is None or outputs is None:
            return rows
        names = [_graph_name(task, "in", k) for k in inputs] + [_graph_name(task, "out", k) for k in outputs]
        every = self._key_frame((STATE_LAYER, n) for n in names)
        gone = every.join(rows.select("layer", "partition"), ["layer", "partition"], "left_anti")
        return rows.unionByName(gone.withColumn("payload", F.lit(None).cast("binary")))

    def _function(self, task: FunctionCompiler) -> DataFrame:
        from pyspark.sql import functions as F

        snap = self.snapshot(task)
        types = self.types(task)
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

    # ---- publishing ---------------------------------------------------------------------------

    def publish(self, dry_run: bool) -> RunReport:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        # The union holds every part's partitions: as many tasks as cores are enough.
        rows = reduce(lambda a, b: a.unionByName(b), self.rows)
        rows = rows.coalesce(self.spark.sparkContext.defaultParallelism).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts = rows.groupBy("task", "layer", "op", "compiled").count().collect()
            for task in self.d.tasks:
                for name in task.outputs:
                    self.reports[task.name].layers.setdefault(name, LayerReport())
            for r in counts:
                if r["layer"] == STATE_LAYER:
                    continue
                layer = self.reports[r["task"]].layers.setdefault(r["layer"], LayerReport())
                if r["compiled"]:
                    layer.compiled += r["count"]
                if r["op"] == "upsert":
                    layer.written += r["count"]
                elif r["op"] == "delete":
                    layer.deleted += r["count"]
                elif r["op"] == "unchanged":
                    layer.unchanged += r["count"]
            instant = None
            if not dry_run and any(r["op"] in ("upsert", "delete") for r in counts):
                writes = rows.filter(F.col("op").isin("upsert", "delete")).select(
                    *[c.split()[0] for c in _spark.WRITE.split(", ")]
                )
                instant = _spark.write_one_commit(
                    writes, self.d.output.uri, self.d.output.storage_options, self.out_types
                )
        finally:
            rows.unpersist()
        version = None
        if instant is not None:
            self.d.output.refresh()
            version = self.d.output.number_of(instant)
        return RunReport(self.reports, instant, version, dry_run)


def _graph_name(task: Compiler, side: str, key: tuple[str, ...]) -> str:
    """The state-layer partition of a map-group task's edges of one input ("in") or output
    ("out") partition."""
    return "|".join([task.name, side, *key])


def _keys(inputs: pa.Table) -> Iterator[tuple[str, str, str]]:
    """The (catalog, layer, partition) keys of INPUT rows."""
    columns = [inputs.column(c).to_pylist() for c in _spark._IN_KEYS]
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


_INPUT_SCHEMA = pa.schema(
    [("catalog", pa.string()), ("layer", pa.string()), ("partition", pa.string()), ("payload", pa.binary())]
)


def _concat(parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables([p.cast(_INPUT_SCHEMA) for p in parts]) if parts else _INPUT_SCHEMA.empty_table()
