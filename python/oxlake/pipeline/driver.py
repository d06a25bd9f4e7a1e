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


class _TooLarge(Exception):
    """An incremental task would hold more input partitions on the driver than allowed."""


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
        keyed_limit: int = 2_000_000,
    ) -> None:
        self.spark, self.output, self.inputs = spark, output, dict(inputs)
        self.tasks, self.output_name = list(tasks), output_name
        #: The most input partitions an incremental task reads onto the driver; a change
        #: reaching more runs the task in full (on Spark), and the report says so.
        self.keyed_limit = keyed_limit
        if isinstance(keyed_limit, bool) or not isinstance(keyed_limit, int) or keyed_limit < 0:
            raise PipelineDefinitionError(f"keyed_limit must be a non-negative integer, not {keyed_limit!r}")
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

    A full run scans its inputs and the published rows of its layers, as Spark DataFrames. An
    incremental run works from keys, on the driver: the input partitions changed since the
    recorded versions, the output partitions they affect, the inputs feeding those (from the
    compiler's inverse or the recorded graph) and only those published rows, read by key; Spark
    runs the compilers over what was read, one stage per step without a shuffle, and the
    decided rows come back as Arrow tables (an incremental run that needs nothing else is
    written from the driver, without a Spark job)."""

    def __init__(self, driver: Driver, requested: dict[str, str | None]) -> None:
        self.d, self.requested = driver, requested
        self.spark = driver.spark
        self.out_types = driver.output.structured
        self.rows: list[DataFrame | pa.Table] = []  # ROWS of each task (Arrow: a keyed task)
        self.reports: dict[str, TaskReport] = {}
        self.full_layers: set[str] = set()
        self.layer_rows: dict[str, DataFrame | pa.Table] = {}  # output layer -> its ROWS this run
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

    def published_keys(self, keys: Iterable[tuple[str, str]]) -> pa.Table:
        """layer, partition, checksum of the published rows of `keys` (read by key)."""
        return self.d.output.read(keys, columns=["checksum"])

    def layer_frame(self, layer: str) -> DataFrame:
        """The ROWS of an output layer this run, as a DataFrame."""
        rows = self.layer_rows[layer]
        return _spark.frame(self.spark, rows, _spark.ROWS) if isinstance(rows, pa.Table) else rows

    def layer_changes(self, layer: str) -> DataFrame:
        """partition, payload (null: deleted) of what this run changes in an output layer."""
        from pyspark.sql import functions as F

        rows = self.layer_frame(layer)
        return rows.filter(F.col("op").isin("upsert", "delete")).select("partition", "payload")

    def layer_changes_here(self, layer: str) -> pa.Table:
        """`layer_changes` on the driver."""
        rows = self.layer_rows[layer]
        if not isinstance(rows, pa.Table):
            return _spark.collect(self.layer_changes(layer))
        return rows.filter(_member(rows.column("op"), pa.array(["upsert", "delete"]))).select(
            ["partition", "payload"]
        )

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

        recorded: dict[str, str] = state["inputs"]  # type: ignore[assignment]
        parts = []
        for name, layers in task.inputs.items():
            if name == self.d.output_name:
                for layer in layers:
                    ch = self.layer_changes_here(layer)
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
                    if isinstance(self.layer_rows[layer], pa.Table):
                        parts.append(_input_rows(name, self._layer_read_here(layer, wanted), {}))
                        continue
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

    def _layer_read_here(self, layer: str, wanted: pa.Table) -> pa.Table:
        """layer, partition, payload (bytes) of the `wanted` partitions of an output layer as
        this run leaves it (published, read by key, overlaid with this run's changes)."""
        structs = [layer] if layer in self.out_types else []
        read = self.d.output.read(
            [(layer, p) for p in wanted.column("partition").to_pylist()], columns=["payload", *structs]
        )
        published = pa.table(
            {"partition": read.column("partition"), "payload": _payload.payloads(read, self.out_types)}
        )
        changes = self.layer_changes_here(layer)
        changes = changes.filter(_member(changes.column("partition"), wanted.column("partition")))
        kept = published.filter(
            pc.invert(_member(published.column("partition"), changes.column("partition")))
        )
        rows = pa.concat_tables(
            [kept, changes.filter(pc.is_valid(changes.column("payload"))).cast(kept.schema)]
        )
        return rows.add_column(0, "layer", pa.array([layer] * rows.num_rows, pa.string()))

    # ---- compiling ----------------------------------------------------------------------------

    def task(self, task: Compiler, reason: str | None, state: dict[str, object] | None) -> None:
        incremental = state is not None and reason is None
        report = TaskReport(task.name, "full" if reason else "incremental", reason)
        report.inputs = {
            c: v for c in task.inputs if c != self.d.output_name and (v := self.requested[c]) is not None
        }
        self.reports[task.name] = report
        record = json.dumps({"fingerprint": task.fingerprint(), "inputs": report.inputs}, sort_keys=True)
        own = pa.table({"layer": [STATE_LAYER], "partition": [task.name], "payload": [record.encode()]})
        keyed = isinstance(task, MapGroupCompiler) or (isinstance(task, DirectCompiler) and task.invertible)
        rows: DataFrame | pa.Table | None = None
        if incremental and keyed:
            try:
                rows = self._keyed(task, state, own)  # type: ignore[arg-type]
            except _TooLarge as e:
                incremental, report.mode, report.reason = False, "full", str(e)
        if rows is None:
            rows = self._scanned(task, incremental, state, own)
        if not incremental:
            self.full_layers |= set(task.outputs)
        self.rows.append(rows)
        for layer in task.outputs:
            if isinstance(rows, pa.Table):
                self.layer_rows[layer] = rows.filter(pc.equal(rows.column("layer"), layer))
            else:
                from pyspark.sql import functions as F

                self.layer_rows[layer] = rows.filter(F.col("layer") == layer)

    def _check_size(self, n: int) -> None:
        """Refuses (`_TooLarge`) to hold more than the driver's limit of input partitions."""
        if n > self.d.keyed_limit:
            raise _TooLarge(
                f"the change reaches {n:,} input partitions, more than an incremental run holds "
                f"on the driver (keyed_limit={self.d.keyed_limit:,})"
            )

    def _keyed(self, task: Compiler, state: dict[str, object], own: pa.Table) -> pa.Table:
        """An incremental task from keys, on the driver: its ROWS."""
        graph = _STATE_ROWS.empty_table()
        if isinstance(task, MapGroupCompiler):
            compiled, graph, keys = self._map_group_keyed(task, state)
        else:
            compiled, keys = self._direct_keyed(task, state)  # type: ignore[arg-type]
        states = _spark.checksummed(pa.concat_tables([own.cast(_STATE_ROWS), graph]))
        flags = [
            pa.array([True] * compiled.num_rows, pa.bool_()),
            pa.array([False] * states.num_rows, pa.bool_()),
        ]
        candidates = pa.concat_tables([compiled, states]).append_column("compiled", pa.chunked_array(flags))
        return _decide_here(task.name, candidates, self.published_keys(keys | {(STATE_LAYER, task.name)}))

    def _scanned(
        self, task: Compiler, incremental: bool, state: dict[str, object] | None, own: pa.Table
    ) -> DataFrame:
        """A task on Spark DataFrames (a full run, or an incremental direct task without an
        inverse): its ROWS."""
        from pyspark.sql import functions as F

        graph: DataFrame | None = None
        if isinstance(task, DirectCompiler):
            if incremental:
                candidates = self._direct_scanned(task, state)  # type: ignore[arg-type]
            else:
                candidates = self._direct_full(task)
        elif isinstance(task, MapGroupCompiler):
            candidates, graph = self._map_group_full(task)
        elif isinstance(task, FunctionCompiler):
            candidates = self._function(task)
        else:
            raise PipelineDefinitionError(
                f"task {task.name!r}: {type(task).__name__} is not a known compiler"
            )
        own_state = _spark.frame(self.spark, own, _spark.CANDIDATE)
        if graph is not None:
            own_state = own_state.unionByName(graph)
        compiled = candidates.withColumn("compiled", F.lit(True)).unionByName(
            own_state.withColumn("compiled", F.lit(False))
        )
        published = self.published(task.outputs, task.name)
        return self._decide(task.name, compiled, published, full=not incremental)

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
    ) -> tuple[pa.Table, set[tuple[str, str]]]:
        """SUMMED rows of the outputs of the changed inputs' keys, compiled from the inputs the
        compiler's inverse names (read by key); and those outputs' keys."""
        changed = self.changes(task, state)
        affected = {out for key in _keys(changed) for out in task.output_keys(*key)}
        declared = set(task.input_layers())
        wanted = {key for out in affected for key in task.input_keys(*out) if key[:2] in declared}
        self._check_size(changed.num_rows + len(wanted))
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
        compile = _spark.compile_direct(task, self.types(task), self.out_types)
        fn = _spark.summed(_spark.on_table(compile, _spark.SUMMED.remove(3)))
        compiled = _spark.run_chunks(self.spark, rows, fn, _spark.SUMMED, group_by=_spark._OUT_KEYS)
        return _with_vanished_here(affected, compiled), affected

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
        return out, self._graph_rows(task, pieces)

    def _map_group_keyed(
        self, task: MapGroupCompiler, state: dict[str, object]
    ) -> tuple[pa.Table, pa.Table, set[tuple[str, str]]]:
        """SUMMED rows of the outputs the changed inputs fed before (recorded graph) or feed
        now (mapped), reduced from the changed inputs' pieces and the pieces of the unchanged
        inputs that fed them; the task's graph rows of those inputs and outputs; every key
        written."""
        changed = self.changes(task, state)
        changed_keys = set(_keys(changed))
        live = changed.filter(pc.is_valid(changed.column("payload")))
        mapper = _spark.on_table(_spark.map_pieces(task, self.types(task)), _spark.PIECES)
        new_pieces = _spark.run_chunks(self.spark, live, mapper, _spark.PIECES)
        affected = set(_out_keys(new_pieces))
        for outs in self.graph(task, "in", changed_keys).values():
            affected.update(outs)  # type: ignore[arg-type]
        feeders = {i for ins in self.graph(task, "out", affected).values() for i in ins} - changed_keys
        self._check_size(changed.num_rows + len(feeders))
        fed = _spark.run_chunks(self.spark, self.fetch(task, feeders), mapper, _spark.PIECES)  # type: ignore[arg-type]
        fed = fed.filter(pa.array([k in affected for k in _out_keys(fed)], pa.bool_()))
        pieces = pa.concat_tables([new_pieces, fed])
        reduce = _spark.reduce_pieces(task, self.out_types)
        fn = _spark.summed(_spark.on_table(reduce, _spark.SUMMED.remove(3)))
        compiled = _spark.run_chunks(self.spark, pieces, fn, _spark.SUMMED, group_by=_spark._OUT_KEYS)
        graph = _graph_here(task, new_pieces, pieces, changed_keys, affected)
        return _with_vanished_here(affected, compiled), graph, affected | set(_keys_of(graph))

    def _graph_rows(self, task: MapGroupCompiler, pieces: DataFrame) -> DataFrame:
        """State rows of the graph (CANDIDATE rows): per input partition the outputs it feeds,
        per output partition the inputs feeding it (JSON lists)."""
        from pyspark.sql import functions as F

        def side(name: str, by: list[str], to: list[str]) -> DataFrame:
            edges = pieces.select(*by, F.array(*to).alias("edge")).distinct()
            grouped = edges.groupBy(*by).agg(F.sort_array(F.collect_list("edge")).alias("edges"))
            key = F.concat_ws("|", F.lit(task.name), F.lit(name), *by)
            return grouped.select(
                F.lit(STATE_LAYER).alias("layer"),
                key.alias("partition"),
                F.to_json("edges").cast("binary").alias("payload"),
            )

        return side("in", _spark._IN_KEYS, _spark._OUT_KEYS).unionByName(
            side("out", _spark._OUT_KEYS, _spark._IN_KEYS)
        )

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
        """Counts every task's rows into its report and writes what changed as ONE commit:
        from the driver when every task ran from keys, else by Spark tasks."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        for task in self.d.tasks:
            for name in task.outputs:
                self.reports[task.name].layers.setdefault(name, LayerReport())
        here = [r for r in self.rows if isinstance(r, pa.Table)]
        frames = [r for r in self.rows if not isinstance(r, pa.Table)]
        local = pa.concat_tables(here) if here else _ROWS.empty_table()
        writes = local.filter(_member(local.column("op"), pa.array(["upsert", "delete"])))
        counts = local.group_by(["task", "layer", "op", "compiled"]).aggregate([("op", "count")])
        counted = [(r["task"], r["layer"], r["op"], r["compiled"], r["op_count"]) for r in counts.to_pylist()]
        rows = None
        if frames:
            # The union holds every part's partitions: as many tasks as cores are enough.
            rows = reduce(lambda a, b: a.unionByName(b), frames)
            rows = rows.coalesce(self.spark.sparkContext.defaultParallelism).persist(
                StorageLevel.MEMORY_AND_DISK
            )
        try:
            if rows is not None:
                for r in rows.groupBy("task", "layer", "op", "compiled").count().collect():
                    counted.append((r["task"], r["layer"], r["op"], r["compiled"], r["count"]))
            self._count(counted)
            instant = None
            if not dry_run and any(op in ("upsert", "delete") for _, _, op, _, _ in counted):
                columns = [c.split()[0] for c in _spark.WRITE.split(", ")]
                uri, options = self.d.output.uri, self.d.output.storage_options
                if rows is None:
                    instant = _spark.write_here(writes.select(columns), uri, options, self.out_types)
                else:
                    both = rows.filter(F.col("op").isin("upsert", "delete")).select(*columns)
                    if writes.num_rows:
                        both = both.unionByName(
                            _spark.frame(self.spark, writes.select(columns), _spark.WRITE)
                        )
                    instant = _spark.write_one_commit(both, uri, options, self.out_types)
        finally:
            if rows is not None:
                rows.unpersist()
        version = None
        if instant is not None:
            self.d.output.refresh()
            version = self.d.output.number_of(instant)
        return RunReport(self.reports, instant, version, dry_run)

    def _count(self, counted: list[tuple[str, str, str, bool, int]]) -> None:
        """Adds (task, layer, op, compiled, count) rows to the reports' layers."""
        for task, layer_name, op, compiled, n in counted:
            if layer_name == STATE_LAYER:
                continue
            layer = self.reports[task].layers.setdefault(layer_name, LayerReport())
            if compiled:
                layer.compiled += n
            if op == "upsert":
                layer.written += n
            elif op == "delete":
                layer.deleted += n
            elif op == "unchanged":
                layer.unchanged += n


def _graph_name(task: Compiler, side: str, key: tuple[str, ...]) -> str:
    """The state-layer partition of a map-group task's edges of one input ("in") or output
    ("out") partition."""
    return "|".join([task.name, side, *key])


#: State rows of a task (its record, its graph): CANDIDATE rows.
_STATE_ROWS = pa.schema([("layer", pa.string()), ("partition", pa.string()), ("payload", pa.binary())])

_ROWS = pa.schema(
    [
        ("task", pa.string()),
        ("op", pa.string()),
        *_spark.SUMMED,
        ("compiled", pa.bool_()),
    ]
)


def _decide_here(name: str, candidates: pa.Table, published: pa.Table) -> pa.Table:
    """`_Run._decide` of an incremental task on the driver: SUMMED candidates (with their
    `compiled` flag) against the checksums published for them → ROWS."""
    old = dict(
        zip(
            zip(
                published.column("layer").to_pylist(), published.column("partition").to_pylist(), strict=True
            ),
            published.column("checksum").to_pylist(),
            strict=True,
        )
    )
    ops = []
    for key, checksum in zip(_keys_of(candidates), candidates.column("checksum").to_pylist(), strict=True):
        was = old.get(key)
        if checksum is None:
            ops.append("delete" if was is not None else "none")
        else:
            ops.append("upsert" if was != checksum else "unchanged")
    n = candidates.num_rows
    columns = [pa.array([name] * n, pa.string()), pa.array(ops, pa.string())]
    columns += [candidates.column(c) for c in ["layer", "partition", "payload", "checksum", "compiled"]]
    return pa.table(columns, schema=_ROWS)


def _with_vanished_here(affected: set[tuple[str, str]], compiled: pa.Table) -> pa.Table:
    """The compiled SUMMED rows, plus an empty one for each affected output no input feeds any
    more (so that a published one is deleted)."""
    gone = sorted(affected - set(_keys_of(compiled)))
    empty = pa.table(
        [
            pa.array([k[0] for k in gone], pa.string()),
            pa.array([k[1] for k in gone], pa.string()),
            pa.nulls(len(gone), pa.binary()),
            pa.nulls(len(gone), pa.string()),
        ],
        schema=_spark.SUMMED,
    )
    return pa.concat_tables([compiled, empty])


def _graph_here(
    task: MapGroupCompiler,
    new_pieces: pa.Table,
    pieces: pa.Table,
    inputs: set[tuple[str, str, str]],
    outputs: set[tuple[str, str]],
) -> pa.Table:
    """The graph's state rows of the changed `inputs` (the outputs each feeds now, from their
    own pieces) and the affected `outputs` (the inputs feeding each now, from all pieces),
    encoded as `_Run._graph_rows` does; empty (deleted) for those without edges now."""
    feeds: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for out, key in zip(_out_keys(new_pieces), _keys(new_pieces), strict=True):
        feeds.setdefault(key, set()).add(out)
    fed_by: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for out, key in zip(_out_keys(pieces), _keys(pieces), strict=True):
        fed_by.setdefault(out, set()).add(key)
    names, payloads = [], []
    sides: list[tuple[str, list[tuple[str, ...]], dict[tuple[str, ...], set[tuple[str, ...]]]]] = [
        ("in", sorted(inputs), feeds),
        ("out", sorted(outputs), fed_by),
    ]
    for side, keys, edges in sides:
        for name in keys:
            names.append(_graph_name(task, side, name))
            mine = edges.get(name)
            payloads.append(
                json.dumps(sorted(mine), separators=(",", ":"), ensure_ascii=False).encode() if mine else None
            )
    return pa.table(
        [
            pa.array([STATE_LAYER] * len(names), pa.string()),
            pa.array(names, pa.string()),
            pa.array(payloads, pa.binary()),
        ],
        schema=_STATE_ROWS,
    )


def _out_keys(pieces: pa.Table) -> Iterator[tuple[str, str]]:
    """The (layer, partition) output keys of PIECES rows."""
    return zip(
        pieces.column("out_layer").to_pylist(), pieces.column("out_partition").to_pylist(), strict=True
    )


def _keys_of(rows: pa.Table) -> Iterator[tuple[str, str]]:
    """The (layer, partition) keys of catalog rows."""
    return zip(rows.column("layer").to_pylist(), rows.column("partition").to_pylist(), strict=True)


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


def _member(values: pa.Array | pa.ChunkedArray, wanted: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    """Whether each of `values` is among `wanted`."""
    if isinstance(wanted, pa.ChunkedArray):
        wanted = wanted.combine_chunks()
    return pc.is_in(values, value_set=wanted)


def _concat(parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables([p.cast(_INPUT_SCHEMA) for p in parts]) if parts else _INPUT_SCHEMA.empty_table()
