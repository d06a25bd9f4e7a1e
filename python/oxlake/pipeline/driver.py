"""The driver: checks a pipeline before any work, decides per task between a full and an
incremental run and between the driver path (`driver_path`) and the Spark path (`spark_path`),
and publishes every task's output, its state and the input versions used in ONE commit of the
output catalog (docs/PIPELINE.md); the reports of a run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from oxlake.pipeline import _spark, rules
from oxlake.pipeline.catalog import STATE_LAYER, Catalog
from oxlake.pipeline.compilers import Compiler, DirectCompiler, MapGroupCompiler, PipelineDefinitionError
from oxlake.pipeline.driver_path import DriverPath, TooLarge
from oxlake.pipeline.spark_path import SparkPath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
    path: str = "spark"  # "driver" (from keys, on the driver) or "spark" (plans on the executors)
    path_reason: str | None = None  # why this path


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


#: The choices of `Driver(incremental_path=...)`.
PATHS = ("auto", "driver", "spark")


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
        incremental_path: str = "auto",
    ) -> None:
        self.spark, self.output, self.inputs = spark, output, dict(inputs)
        self.tasks, self.output_name = list(tasks), output_name
        #: The most input partitions (or pieces) an incremental task holds on the driver; a
        #: change estimated or found to reach more runs incrementally on Spark's executors.
        self.keyed_limit = keyed_limit
        if isinstance(keyed_limit, bool) or not isinstance(keyed_limit, int) or keyed_limit < 0:
            raise PipelineDefinitionError(f"keyed_limit must be a non-negative integer, not {keyed_limit!r}")
        #: "auto" (by the change's estimated size), or "driver" / "spark" for every incremental
        #: task that names its inputs by key.
        self.incremental_path = incremental_path
        if incremental_path not in PATHS:
            raise PipelineDefinitionError(
                f"incremental_path must be one of {', '.join(PATHS)}, not {incremental_path!r}"
            )
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
        if not dry_run:
            # A crashed run's write goes before the listing below, not after it: gone after it
            # (another process rolling it back), it would be a conflict.
            self.output.table.rollback_failed()
        # Everything the run reads of the output catalog (its struct types, states, graph rows,
        # published checksums) is read after this listing: its commit conflicts with any commit
        # completed since (another run publishing meanwhile), where it would otherwise overwrite
        # it unseen.
        listed = [(i.time, i.action, i.state) for i in self.output.table.timeline()]
        self.output.refresh()
        for c in self.inputs.values():
            c.refresh()
        requested = {
            name: (c.instant_of(versions[name]) if versions and name in versions else c.latest())
            for name, c in self.inputs.items()
        }
        states, published = self._states()
        run = _Run(self, requested, listed, published)
        for task in self.tasks:
            _spark.ship(task)
            reason = self._full_reason(task, states.get(task.name), requested, since, full, reprocess, run)
            if reason is None and not self.output.holds(task.outputs):
                reason = "the output is empty"
            run.task(task, reason, states.get(task.name))
        return run.publish(dry_run)

    def fingerprint(self, task: Compiler) -> dict[str, str]:
        """The task's fingerprint (`Compiler.fingerprint`), with the struct types of the
        structured layers it reads and writes when it has any: a type that grows (`Catalog.evolve`)
        changes what its compiler is given or how its payloads are encoded, so the outputs
        and pieces kept from before are not what a full run would make."""
        types = [
            (c, layer, str(t))
            for (c, layer), t in sorted(self.structured(task).items(), key=lambda kv: kv[0])
        ]
        out = [
            (self.output_name, layer, str(self.output.structured[layer]))
            for layer in task.outputs
            if layer in self.output.structured
        ]
        if not types and not out:
            return task.fingerprint()
        digest = hashlib.sha256(json.dumps([*types, *out]).encode()).hexdigest()
        return task.fingerprint() | {"types": digest}

    def structured(self, task: Compiler) -> dict[tuple[str, str], pa.StructType]:
        """The struct types of the task's structured input layers."""
        out = {}
        for catalog, layer in task.input_layers():
            c = self.output if catalog == self.output_name else self.inputs[catalog]
            if layer in c.structured:
                out[(catalog, layer)] = c.structured[layer]
        return out

    def _states(self) -> tuple[dict[str, dict[str, object]], dict[tuple[str, str], str | None]]:
        """The state record of each task (its fingerprint and input versions), read by key; and
        the published checksum of each record's key (None: none published)."""
        keys = [(STATE_LAYER, task.name) for task in self.tasks]
        t = self.output.read(keys, columns=["payload", "checksum"])
        rows = zip(*(t.column(c).to_pylist() for c in ["partition", "payload", "checksum"]), strict=True)
        published: dict[tuple[str, str], str | None] = dict.fromkeys(keys)
        states = {}
        for partition, payload, checksum in rows:
            published[(STATE_LAYER, partition)] = checksum
            if payload:
                states[partition] = json.loads(payload)
        return states, published

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
        for part, value in self.fingerprint(task).items():
            if recorded.get(part) != value:
                what = {
                    "library": "library version",
                    "code": "compiler code",
                    "config": "configuration",
                    "types": "the struct types of its structured layers",
                }[part]
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
    for name in sorted(inputs | {output_name}):
        if "|" in name:
            raise PipelineDefinitionError(f"catalog name {name!r} must not contain '|'")
    for task in tasks:
        read = task.input_layers()
        for catalog, layer in read:
            # '|' separates the parts of the state layer's graph row names (rules.graph_name).
            if "|" in layer:
                raise PipelineDefinitionError(f"task {task.name!r}: layer {layer!r} must not contain '|'")
            if read.count((catalog, layer)) > 1:
                raise PipelineDefinitionError(
                    f"task {task.name!r} reads layer {layer!r} of {catalog!r} twice"
                )
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
            if layer == STATE_LAYER or not layer or "/" in layer or "|" in layer:
                raise PipelineDefinitionError(f"task {task.name!r}: {layer!r} is not a valid output layer")
            if layer in producers:
                raise PipelineDefinitionError(
                    f"tasks {producers[layer]!r} and {task.name!r} both produce layer {layer!r}"
                )
            producers[layer] = task.name
    return producers


class _Run:
    """One run's tasks: their candidate rows decided against the published state, in order,
    then published in ONE commit.

    An incremental task whose compiler names its inputs by key (a map-group task, a direct task
    with an inverse) runs on the driver path, from keys (`DriverPath`); any other task, or one
    whose change reaches more input partitions than the driver may hold, runs on the Spark path
    (`SparkPath`). The decided rows of the driver path are Arrow tables: a run of only those
    writes its commit from the driver, without a Spark job."""

    def __init__(
        self,
        driver: Driver,
        requested: dict[str, str | None],
        listed: _spark.Listed,
        published: dict[tuple[str, str], str | None],
    ) -> None:
        self.d, self.requested = driver, requested
        self.listed = listed  # the output catalog's timeline before the run read it
        self.spark = driver.spark
        self.out_types = driver.output.structured
        self.rows: list[DataFrame | pa.Table] = []  # ROWS of each task (Arrow: from the driver path)
        self.reports: dict[str, TaskReport] = {}
        self.full_layers: set[str] = set()
        self.layer_rows: dict[str, DataFrame | pa.Table] = {}  # output layer -> its ROWS this run
        self.on_spark = SparkPath(driver, requested, self.layer_rows)
        self.here = DriverPath(driver, requested, self.layer_rows, self.on_spark, published)

    def task(self, task: Compiler, reason: str | None, state: dict[str, object] | None) -> None:
        incremental = state is not None and reason is None
        report = TaskReport(task.name, "full" if reason else "incremental", reason)
        report.inputs = {
            c: v for c in task.inputs if c != self.d.output_name and (v := self.requested[c]) is not None
        }
        self.reports[task.name] = report
        record = json.dumps(
            {"fingerprint": self.d.fingerprint(task), "inputs": report.inputs}, sort_keys=True
        )
        own = pa.table({"layer": [STATE_LAYER], "partition": [task.name], "payload": [record.encode()]})
        types = self.d.structured(task)
        rows: DataFrame | pa.Table | None = None
        report.path, report.path_reason = self._path(task, state) if incremental else ("spark", "a full run")
        if report.path == "driver":
            try:
                rows = self.here.keyed(task, types, state, own)  # type: ignore[arg-type]
            except TooLarge as e:
                report.path, report.path_reason = "spark", str(e)
        if rows is None:
            rows = self.on_spark.rows(task, types, own, state if incremental else None)
        if not incremental:
            self.full_layers |= set(task.outputs)
        self.rows.append(rows)
        for layer in task.outputs:
            if isinstance(rows, pa.Table):
                self.layer_rows[layer] = rows.filter(pc.equal(rows.column("layer"), layer))
            else:
                from pyspark.sql import functions as F

                self.layer_rows[layer] = rows.filter(F.col("layer") == layer)

    def _path(self, task: Compiler, state: dict[str, object] | None) -> tuple[str, str]:
        """Where an incremental task runs, and why: on the driver when its compiler names its
        inputs by key and the change is small enough to hold there, else on Spark."""
        if not (isinstance(task, MapGroupCompiler) or (isinstance(task, DirectCompiler) and task.invertible)):
            return "spark", "the compiler names no inputs by key (no input_keys): every input key is mapped"
        if self.d.incremental_path != "auto":
            return self.d.incremental_path, f"incremental_path={self.d.incremental_path!r} was asked"
        recorded: dict[str, str] = state["inputs"]  # type: ignore[index, assignment]
        estimate = 0
        for name, layers in task.inputs.items():
            if name != self.d.output_name:
                estimate += self.d.inputs[name].written(recorded[name], self.requested[name], layers)
                continue
            for layer in layers:
                rows = self.layer_rows[layer]
                if not isinstance(rows, pa.Table):
                    return "spark", f"upstream layer {layer} was computed on Spark"
                estimate += rules.written(rows).num_rows
        if estimate > self.d.keyed_limit:
            return "spark", (
                f"the inputs' versions since the recorded ones wrote {estimate:,} partitions, more than "
                f"the driver holds (keyed_limit={self.d.keyed_limit:,})"
            )
        return "driver", f"a small change (the inputs' versions wrote {estimate:,} partitions)"

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
        local = pa.concat_tables(here) if here else rules.ROWS.empty_table()
        writes = rules.written(local)
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
            if not dry_run and any(op in rules.WRITES for _, _, op, _, _ in counted):
                columns = [c.split()[0] for c in _spark.WRITE.split(", ")]
                uri, options = self.d.output.uri, self.d.output.storage_options
                if rows is None:
                    instant = _spark.write_here(
                        self.spark, writes.select(columns), uri, options, self.out_types, self.listed
                    )
                else:
                    both = rows.filter(F.col("op").isin(*rules.WRITES)).select(*columns)
                    if writes.num_rows:
                        both = both.unionByName(
                            _spark.frame(self.spark, writes.select(columns), _spark.WRITE)
                        )
                    instant = _spark.write_one_commit(both, uri, options, self.out_types, self.listed)
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
