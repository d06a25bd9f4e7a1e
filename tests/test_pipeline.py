"""The incremental processing library on Spark `local[2]`: the example pipeline over several
input versions, incremental runs equal full runs, unchanged re-runs write nothing, each fallback
to a full run says why, and bad pipelines are refused before any write."""

from __future__ import annotations

import datetime
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from oxlake import CommitConflictError, InvalidArgumentError, SchemaMismatchError  # noqa: E402
from oxlake.pipeline import (  # noqa: E402
    ADDED,
    CHANGED,
    REMOVED,
    STATE_LAYER,
    Catalog,
    DirectCompiler,
    Driver,
    InputPartition,
    MapGroupCompiler,
    PipelineDefinitionError,
    _spark,
    compiler,
)
from pyspark.sql import DataFrame, SparkSession  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import roads  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    yield session
    session.stop()


TILES = [f"{x}_{y}" for x in range(12) for y in range(5)]


def publish(catalog: Catalog, payloads: dict[str, bytes | None]) -> None:
    """Writes input partitions (None: removes them) as one version."""
    ups = {k: v for k, v in payloads.items() if v is not None}
    gone = [k for k, v in payloads.items() if v is None]
    if ups:
        catalog.table.upsert(
            pa.table(
                {
                    "layer": ["segments"] * len(ups),
                    "partition": list(ups),
                    "payload": pa.array(list(ups.values()), pa.binary()),
                    "checksum": [None] * len(ups),
                }
            )
        )
    if gone:
        catalog.table.delete(pa.table({"layer": ["segments"] * len(gone), "partition": gone}))
    catalog.refresh()


def published(catalog: Catalog, layers: list[str] | None = None) -> dict[tuple[str, str], bytes]:
    catalog.refresh()
    t = catalog.snapshot(layers=layers)
    return {
        (layer, p): v
        for layer, p, v in zip(
            t.column("layer").to_pylist(),
            t.column("partition").to_pylist(),
            t.column("payload").to_pylist(),
            strict=True,
        )
    }


def oracle(inputs: Catalog) -> dict[tuple[str, str], bytes]:
    """The example's tiles13 and classes layers computed in plain Python from the inputs."""
    snap = published(inputs)
    items = sorted(InputPartition("roads", layer, p, v) for (layer, p), v in snap.items())
    tiles, by_tile = roads.Tiles(), {}
    for item in items:
        for key in tiles.output_keys("roads", item.layer, item.partition):
            by_tile.setdefault(key, []).append(item)
    out = {k: tiles.compile(*k, v) for k, v in by_tile.items()}
    classes, pieces = roads.Classes(), {}
    for item in items:
        for layer, p, value in classes.map(item):
            pieces.setdefault((layer, p), []).append(value)
    out.update({k: classes.reduce(*k, v) for k, v in pieces.items()})
    return {k: v for k, v in out.items() if v}


def test_the_example_pipeline_over_several_input_versions(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(3)
    inputs, output = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    publish(inputs, {t: roads.segments(rng, t, rng.randint(1, 4)) for t in TILES})
    driver = roads.pipeline(spark, inputs, output)
    for step in range(3):
        report = driver.run()
        assert report.tasks["Tiles"].mode == ("full" if step == 0 else "incremental")
        assert report.tasks["Classes"].mode == ("full" if step == 0 else "incremental")
        assert report.tasks["summary"].reason == "a non-incremental compiler"
        assert report.version == step + 1
        got = published(output)
        tiles13 = {k: v for k, v in got.items() if k[0] in ("tiles13", "classes")}
        assert tiles13 == oracle(inputs)
        assert json.loads(got[("summary", "all")]) == {"tiles": sum(1 for k in tiles13 if k[0] == "tiles13")}
        changed = rng.sample(TILES, 4)
        publish(inputs, {t: roads.segments(rng, t, rng.randint(1, 4)) for t in changed})
    # The versions record the input versions each task read.
    versions = output.versions()
    assert [v.number for v in versions] == [1, 2, 3]
    assert versions[-1].dependencies["Tiles"] == {"roads": inputs.instants()[-2]}


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_the_output_catalog_is_compacted_by_tasks(spark: SparkSession, tmp_path: Path, path: str) -> None:
    """The tenth version makes the output catalog's compaction due: Spark tasks write its base
    files (their task attempt ids are in the files' names; a compaction in the driver's process
    names attempt 1), after a run on either path; the content stays the oracle's."""
    rng = random.Random(5)
    inputs, output = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    publish(inputs, {t: roads.segments(rng, t, 2) for t in TILES})
    tasks = [roads.Tiles(), roads.Classes()]
    for step in range(10):
        if step:
            publish(inputs, {t: roads.segments(rng, t, 2) for t in rng.sample(TILES, 3)})
        Driver(spark, output, {"roads": inputs}, tasks, incremental_path="driver" if step < 9 else path).run()
    completed = [i for i in output.table.timeline() if i.state == "completed"]
    assert [i.action for i in completed] == ["deltacommit"] * 10 + ["commit"]
    assert [v.number for v in output.versions()] == list(range(1, 11))
    files = [p.name for p in (tmp_path / "out").rglob(f"*_{completed[-1].time}.parquet")]
    assert files and all(name.split("_")[1].split("-")[2] != "1" for name in files), files
    assert published(output) == oracle(inputs)


def checksums(catalog: Catalog, layers: list[str]) -> dict[tuple[str, str], str]:
    catalog.refresh()
    t = catalog.snapshot(layers=layers)
    return dict(
        zip(
            zip(t.column("layer").to_pylist(), t.column("partition").to_pylist(), strict=True),
            t.column("checksum").to_pylist(),
            strict=True,
        )
    )


def graphs(catalog: Catalog) -> dict[str, bytes]:
    """The map-group tasks' graph rows of the state layer (for an incremental run, what a full
    run records: the next incremental run starts from them)."""
    t = catalog.snapshot(layers=[STATE_LAYER], with_state=True)
    rows = zip(t.column("partition").to_pylist(), t.column("payload").to_pylist(), strict=True)
    return {p: v for p, v in rows if "|" in p}


class ScannedTiles(DirectCompiler):
    """The example's `Tiles` without its inverse: incremental runs map every input key."""

    inputs, outputs = roads.Tiles.inputs, roads.Tiles.outputs
    output_keys = roads.Tiles.output_keys
    compile = roads.Tiles.compile


@pytest.mark.parametrize("path", ["driver", "spark"])
@pytest.mark.parametrize("seed, tiles", [(1, roads.Tiles), (2, ScannedTiles)])
def test_incremental_runs_equal_full_runs_and_write_only_what_changed(
    spark: SparkSession, tmp_path: Path, seed: int, tiles: type[DirectCompiler], path: str
) -> None:
    """On either path (forced) an incremental run publishes what a full run does."""
    rng = random.Random(seed)
    inputs = Catalog.create(str(tmp_path / "roads"))
    incremental, full = Catalog.create(str(tmp_path / "inc")), Catalog.create(str(tmp_path / "full"))
    live = set(rng.sample(TILES, 40))
    publish(inputs, {t: roads.segments(rng, t, rng.randint(1, 4)) for t in live})
    tasks = [tiles(), roads.Classes()]
    assert tasks[0].invertible == (tiles is roads.Tiles)  # type: ignore[attr-defined]
    inc_driver = Driver(spark, incremental, {"roads": inputs}, tasks, incremental_path=path)
    full_driver = Driver(spark, full, {"roads": inputs}, tasks)
    layers = ["tiles13", "classes"]
    for step in range(3):
        before = checksums(incremental, layers)
        report = inc_driver.run()
        full_driver.run(full=True)
        after = checksums(incremental, layers)
        assert after == checksums(full, layers), f"step {step}"
        assert graphs(incremental) == graphs(full), f"step {step}"
        written = {k for k in after if before.get(k) != after[k]}
        deleted = set(before) - set(after)
        for layer in layers:
            assert report.layers[layer].written == sum(1 for k in written if k[0] == layer)
            assert report.layers[layer].deleted == sum(1 for k in deleted if k[0] == layer)
        if step:
            assert report.mode == "incremental"
            assert report.layers["tiles13"].compiled < len(after) // 2 + 6
            # A direct task without an inverse maps every input key: only on Spark.
            keyed = {"Tiles": path, "ScannedTiles": "spark", "Classes": path}
            assert {n: t.path for n, t in report.tasks.items()} == {t.name: keyed[t.name] for t in tasks}
        # Random changes: new tiles, changed tiles, removed tiles (some emptied of every road).
        change: dict[str, bytes | None] = {}
        for t in rng.sample(sorted(set(TILES) - live), 3):
            change[t] = roads.segments(rng, t, 2)
        for t in rng.sample(sorted(live), 4):
            change[t] = roads.segments(rng, t, rng.randint(1, 3))
        for t in rng.sample(sorted(live - set(change)), 3):
            change[t] = None
        live = (live | {t for t, v in change.items() if v}) - {t for t, v in change.items() if v is None}
        publish(inputs, change)


class Parents(DirectCompiler):
    """tiles13 → level-12 parents (direct, with its inverse), reading what `Tiles` wrote."""

    inputs = {"output": ["tiles13"]}
    outputs = ["tiles12"]

    def output_keys(self, catalog: str, layer: str, partition: str) -> Iterator[tuple[str, str]]:
        x, y = roads.parse_tile(partition)
        yield "tiles12", f"{x // 2}_{y // 2}"

    def input_keys(self, layer: str, partition: str) -> Iterator[tuple[str, str, str]]:
        x, y = roads.parse_tile(partition)
        for cx in (2 * x, 2 * x + 1):
            for cy in (2 * y, 2 * y + 1):
                yield "output", "tiles13", f"{cx}_{cy}"

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> bytes | None:
        return json.dumps(sum(json.loads(i.payload)["segments"] for i in inputs)).encode()


class Sizes(MapGroupCompiler):
    """tiles13 grouped by their segment count (map-group), reading what `Tiles` wrote."""

    inputs = {"output": ["tiles13"]}
    outputs = ["sizes"]

    def map(self, item: InputPartition) -> Iterator[tuple[str, str, bytes]]:
        yield "sizes", str(json.loads(item.payload)["segments"]), item.partition.encode()

    def reduce(self, layer: str, partition: str, values: list[bytes]) -> bytes | None:
        return b",".join(sorted(values))


class Neighbours(roads.Tiles):
    """`Tiles` whose `output_keys` names an output twice for some inputs (its own tile, and a
    clamped neighbour that is the same tile at the edge); `compile` counts what it is given."""

    outputs = ["neighbours"]

    def output_keys(self, catalog: str, layer: str, partition: str) -> Iterator[tuple[str, str]]:
        x, y = roads.parse_tile(partition)
        yield "neighbours", f"{x // 2}_{y // 2}"
        yield "neighbours", f"{max(x // 2 - 1, 0)}_{y // 2}"

    def input_keys(self, layer: str, partition: str) -> Iterator[tuple[str, str, str]]:
        x, y = roads.parse_tile(partition)
        for cx in range(2 * x, 2 * x + 4):
            for cy in (2 * y, 2 * y + 1):
                yield "roads", "segments", f"{cx}_{cy}"

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> bytes | None:
        return json.dumps([i.partition for i in inputs]).encode()


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_an_output_named_twice_by_one_input_is_compiled_as_a_full_run_does(
    spark: SparkSession, tmp_path: Path, path: str
) -> None:
    rng = random.Random(8)
    inputs = Catalog.create(str(tmp_path / "roads"))
    incremental, full = Catalog.create(str(tmp_path / "inc")), Catalog.create(str(tmp_path / "full"))
    publish(inputs, {t: roads.segments(rng, t, 1) for t in TILES[:30]})
    tasks = [Neighbours(), roads.Classes()]
    for step in range(2):
        report = Driver(spark, incremental, {"roads": inputs}, tasks, incremental_path=path).run()
        Driver(spark, full, {"roads": inputs}, tasks).run(full=True)
        assert checksums(incremental, ["neighbours"]) == checksums(full, ["neighbours"]), step
        assert report.mode == ("incremental" if step else "full")
        publish(inputs, {t: roads.segments(rng, t, 2) for t in ["0_0", "1_2", "3_1"]})
    twice = published(full, ["neighbours"])[("neighbours", "0_0")]
    assert json.loads(twice).count("0_0") == 2  # the edge tile fed its output twice


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_chained_incremental_tasks_read_what_earlier_tasks_wrote(
    spark: SparkSession, tmp_path: Path, path: str
) -> None:
    """Incremental tasks reading the output catalog see the upstream task's changes of the same
    run (on the driver path read by key, on the Spark path joined), and equal full runs."""
    rng = random.Random(5)
    inputs = Catalog.create(str(tmp_path / "roads"))
    incremental, full = Catalog.create(str(tmp_path / "inc")), Catalog.create(str(tmp_path / "full"))
    live = set(rng.sample(TILES, 40))
    publish(inputs, {t: roads.segments(rng, t, rng.randint(1, 4)) for t in live})
    tasks = [roads.Tiles(), Parents(), Sizes()]
    layers = ["tiles13", "tiles12", "sizes"]
    for step in range(3):
        report = Driver(spark, incremental, {"roads": inputs}, tasks, incremental_path=path).run()
        Driver(spark, full, {"roads": inputs}, tasks).run(full=True)
        assert checksums(incremental, layers) == checksums(full, layers), f"step {step}"
        assert graphs(incremental) == graphs(full), f"step {step}"
        if step:
            assert {t.mode for t in report.tasks.values()} == {"incremental"}
            assert {t.path for t in report.tasks.values()} == {path}
            assert report.layers["tiles12"].compiled < 10
        change: dict[str, bytes | None] = {
            t: roads.segments(rng, t, rng.randint(1, 3)) for t in rng.sample(sorted(live), 3)
        }
        for t in rng.sample(sorted(live - set(change)), 2):
            change[t] = None
        live -= {t for t, v in change.items() if v is None}
        publish(inputs, change)


def test_the_path_is_chosen_by_the_size_of_the_change(spark: SparkSession, tmp_path: Path) -> None:
    """A change estimated (from the inputs' commit metadata) or found to reach more than the
    driver holds runs incrementally on Spark, never in full for its size; the report says why."""
    rng = random.Random(6)
    inputs = Catalog.create(str(tmp_path / "roads"))
    incremental, full = Catalog.create(str(tmp_path / "inc")), Catalog.create(str(tmp_path / "full"))
    publish(inputs, {t: roads.segments(rng, t, 2) for t in TILES[:30]})
    tasks = [roads.Tiles(), Parents(), Sizes()]
    layers = ["tiles13", "tiles12", "sizes"]
    Driver(spark, incremental, {"roads": inputs}, tasks).run()
    # Small: on the driver.
    publish(inputs, {t: roads.segments(rng, t, 3) for t in TILES[:2]})
    report = Driver(spark, incremental, {"roads": inputs}, tasks, keyed_limit=10).run()
    assert {n: (t.mode, t.path) for n, t in report.tasks.items()} == {
        n: ("incremental", "driver") for n in ["Tiles", "Parents", "Sizes"]
    }
    assert report.tasks["Tiles"].path_reason == "a small change (the inputs' versions wrote 2 partitions)"
    # A version writing 40 partitions of a layer no task reads (a name the path escapes), and 2
    # of the one they read: the estimate counts the 2.
    other = "élévation %2F=x"
    before = inputs.latest()
    inputs.table.upsert(
        pa.table(
            {
                "layer": [other] * 40,
                "partition": [f"p{i}" for i in range(40)],
                "payload": pa.array([b"{}"] * 40, pa.binary()),
                "checksum": [None] * 40,
            }
        )
    )
    publish(inputs, {t: roads.segments(rng, t, 2) for t in TILES[2:4]})
    assert inputs.written(before, inputs.latest(), [other]) == 40
    assert inputs.written(before, inputs.latest(), ["segments"]) == 2
    assert inputs.written(before, inputs.latest()) == 42
    report = Driver(spark, incremental, {"roads": inputs}, tasks, keyed_limit=10).run()
    assert {t.path for t in report.tasks.values()} == {"driver"}
    assert report.tasks["Tiles"].path_reason == "a small change (the inputs' versions wrote 2 partitions)"
    # Estimated too large: on Spark, and so is every task reading its output.
    publish(inputs, {t: roads.segments(rng, t, 1) for t in TILES[5:20]})
    report = Driver(spark, incremental, {"roads": inputs}, tasks, keyed_limit=10).run()
    assert {n: (t.mode, t.path) for n, t in report.tasks.items()} == {
        n: ("incremental", "spark") for n in ["Tiles", "Parents", "Sizes"]
    }
    assert "wrote 15 partitions, more than the driver holds (keyed_limit=10)" in str(
        report.tasks["Tiles"].path_reason
    )
    assert report.tasks["Parents"].path_reason == "upstream layer tiles13 was computed on Spark"
    # Found too large on the driver (4 changed tiles reach more than 6 inputs): on Spark.
    publish(inputs, {t: roads.segments(rng, t, 1) for t in TILES[20:24]})
    report = Driver(spark, incremental, {"roads": inputs}, tasks, keyed_limit=6).run()
    assert (report.tasks["Tiles"].mode, report.tasks["Tiles"].path) == ("incremental", "spark")
    assert "more than the driver holds (keyed_limit=6)" in str(report.tasks["Tiles"].path_reason)
    Driver(spark, full, {"roads": inputs}, tasks).run(full=True)
    assert checksums(incremental, layers) == checksums(full, layers)
    assert report.reasons == {}
    # The empty layer's partitions sit in Apache Hudi's default partition: counted for it too.
    empty = inputs.latest()
    inputs.table.upsert(
        pa.table(
            {
                "layer": [""] * 3,
                "partition": ["e0", "e1", "e2"],
                "payload": pa.array([b"{}"] * 3, pa.binary()),
                "checksum": [None] * 3,
            }
        )
    )
    assert inputs.written(empty, inputs.latest(), [""]) == 3
    assert inputs.written(empty, inputs.latest(), ["segments"]) == 0


def test_kept_pieces_past_the_limit_move_the_task_to_spark_before_they_are_decoded(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A one-tile change of a map-group task whose outputs are fed by every tile (`Classes`):
    small by its change, but the pieces kept for its outputs pass the driver's limit; they are
    counted from the state rows' bytes before being decoded, and the task runs on Spark."""
    rng = random.Random(12)
    inputs = Catalog.create(str(tmp_path / "roads"))
    incremental, full = Catalog.create(str(tmp_path / "inc")), Catalog.create(str(tmp_path / "full"))
    publish(inputs, {t: roads.segments(rng, t, 3) for t in TILES[:40]})
    tasks = [roads.Classes()]
    Driver(spark, incremental, {"roads": inputs}, tasks).run()
    publish(inputs, {TILES[3]: roads.segments(rng, TILES[3], 2)})
    report = Driver(spark, incremental, {"roads": inputs}, tasks, keyed_limit=20).run()
    task = report.tasks["Classes"]
    assert (task.mode, task.path) == ("incremental", "spark")
    assert "input partitions and pieces, more than the driver holds (keyed_limit=20)" in str(task.path_reason)
    Driver(spark, full, {"roads": inputs}, tasks).run(full=True)
    assert checksums(incremental, ["classes"]) == checksums(full, ["classes"])
    assert graphs(incremental) == graphs(full)


@pytest.mark.parametrize("path", ["auto", "spark"])
def test_an_unchanged_rerun_writes_nothing(spark: SparkSession, tmp_path: Path, path: str) -> None:
    rng = random.Random(5)
    inputs, output = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    publish(inputs, {t: roads.segments(rng, t, 2) for t in TILES[:20]})
    driver = Driver(spark, output, {"roads": inputs}, [roads.Tiles(), roads.Classes()], incremental_path=path)
    first = driver.run()
    assert first.instant is not None
    files = sorted(p for p in Path(tmp_path / "out").rglob("*") if p.is_file())
    again = driver.run()
    assert again.mode == "incremental" and again.instant is None and again.version is None
    assert all(r.written == r.deleted == r.compiled == 0 for r in again.layers.values())
    assert sorted(p for p in Path(tmp_path / "out").rglob("*") if p.is_file()) == files
    # A change that leaves every output as it was: only the state (input versions) is written.
    t = TILES[0]
    payload = published(inputs)[("segments", t)]
    publish(inputs, {t: payload})
    same = driver.run()
    assert same.instant is not None and same.mode == "incremental"
    assert same.layers["tiles13"].written == 0 and same.layers["tiles13"].unchanged >= 1
    output.refresh()
    assert published(output, ["tiles13", "classes"]) == published(
        Catalog(str(tmp_path / "out")), ["tiles13", "classes"]
    )


def run_elsewhere(out: str, inputs: str, path: str, **env: str) -> subprocess.Popen[str]:
    """`Driver.run` of the example's tasks over `inputs` into `out` in another process (its own
    Spark session), with `env` (a fail or pause point)."""
    code = "\n".join(
        [
            "import sys",
            f"sys.path.insert(0, {str(Path(__file__).resolve().parent.parent / 'examples')!r})",
            "import roads",
            "from oxlake.pipeline import Catalog, Driver",
            "from pyspark.sql import SparkSession",
            'spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")'
            '.config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")'
            '.config("spark.driver.memory", "512m").getOrCreate()',
            "tasks = [roads.Tiles(), roads.Classes()]",
            f"output, roads_in = Catalog({out!r}), Catalog({inputs!r})",
            f"Driver(spark, output, {{'roads': roads_in}}, tasks, incremental_path={path!r}).run()",
        ]
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=dict(os.environ, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_held_before_commit(out: str, inputs: str, path: str, pause: Path) -> subprocess.Popen[str]:
    """`run_elsewhere`, held at the pause point `before-commit` of its publish (`pause/resume`
    lets it commit)."""
    pause.mkdir()
    proc = run_elsewhere(out, inputs, path, OXLAKE_PAUSEPOINT="before-commit", OXLAKE_PAUSE_DIR=str(pause))
    deadline = time.monotonic() + 300
    while not (pause / "reached").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the other run never reached its commit"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_two_runs_at_once_never_both_land_decisions_made_against_each_others_reads(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Run O compiles a change and commits after run L has read the catalog (states, published
    checksums) and before L commits. L compiled the inputs after the change was undone: its
    outputs equal what it read, so it writes only its state, recording the undone version.
    Both landing would leave O's outputs under L's state, and no later run would look at them
    again (what happened: both commits landed). L's commit conflicts instead; the next run
    ends equal to a full run."""
    rng = random.Random(11)
    inputs, out = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    live = rng.sample(TILES, 40)
    first = {t: roads.segments(rng, t, 2) for t in live}
    publish(inputs, first)
    driver = Driver(spark, out, {"roads": inputs}, [roads.Tiles(), roads.Classes()], incremental_path=path)
    driver.run()
    changed = rng.sample(live, 5)
    publish(inputs, {t: roads.segments(rng, t, 3) for t in changed})
    other = run_held_before_commit(str(tmp_path / "out"), str(tmp_path / "roads"), path, tmp_path / "pause")
    publish(inputs, {t: first[t] for t in changed})  # the change undone

    def once_the_other_run_landed(write: Any) -> Any:
        def held(*args: Any, **kwargs: Any) -> Any:
            (tmp_path / "pause" / "resume").touch()
            _, err = other.communicate(timeout=300)
            assert other.returncode == 0, err
            return write(*args, **kwargs)

        return held

    for name in ["write_here", "write_one_commit"]:
        monkeypatch.setattr(_spark, name, once_the_other_run_landed(getattr(_spark, name)))
    with pytest.raises(CommitConflictError):
        driver.run()
    monkeypatch.undo()
    assert other.returncode == 0
    driver.run()
    full = Catalog.create(str(tmp_path / "full"))
    Driver(spark, full, {"roads": inputs}, [roads.Tiles(), roads.Classes()]).run(full=True)
    layers = ["tiles13", "classes"]
    assert checksums(out, layers) == checksums(full, layers)
    assert graphs(out) == graphs(full)


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_the_first_run_after_a_killed_run_lands(spark: SparkSession, tmp_path: Path, path: str) -> None:
    """A run killed before its commit leaves its instant pending. The next run lists it when it
    starts, and its write's beginning rolls it back (its heartbeat expired): a write no read saw
    anything of is no conflict, so that run lands, equal to a full run."""
    rng = random.Random(12)
    inputs, out = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    live = rng.sample(TILES, 40)
    publish(inputs, {t: roads.segments(rng, t, 2) for t in live})
    driver = Driver(spark, out, {"roads": inputs}, [roads.Tiles(), roads.Classes()], incremental_path=path)
    driver.run()
    publish(inputs, {t: roads.segments(rng, t, 3) for t in rng.sample(live, 5)})
    killed = run_elsewhere(
        str(tmp_path / "out"), str(tmp_path / "roads"), path, OXLAKE_FAILPOINT="before-commit"
    )
    _, err = killed.communicate(timeout=300)
    assert killed.returncode != 0, err
    out.refresh()
    [pending] = [i for i in out.table.timeline() if i.state != "completed"]
    (tmp_path / "out" / ".hoodie" / ".heartbeat" / pending.time).write_text("0")  # long expired
    report = driver.run()
    assert report.instant is not None and report.mode == "incremental"
    assert all(i.time != pending.time for i in out.table.timeline())
    full = Catalog.create(str(tmp_path / "full"))
    Driver(spark, full, {"roads": inputs}, [roads.Tiles(), roads.Classes()]).run(full=True)
    layers = ["tiles13", "classes"]
    assert checksums(out, layers) == checksums(full, layers)
    assert graphs(out) == graphs(full)


class Empty(DirectCompiler):
    """Produces nothing the first time (`config["empty"]`)."""

    inputs = {"roads": ["segments"]}
    outputs = ["copy"]

    def output_keys(self, catalog: str, layer: str, partition: str) -> list[tuple[str, str]]:
        return [("copy", partition)]

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> bytes | None:
        return None if self.config.get("empty") else inputs[0].payload


def test_each_fallback_runs_in_full_and_says_why(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(9)
    inputs, output = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    publish(inputs, {t: roads.segments(rng, t, 1) for t in TILES[:10]})

    def run(config: dict[str, object], **kwargs: object) -> object:
        return Driver(spark, output, {"roads": inputs}, [Empty(config=config)]).run(**kwargs)  # type: ignore[arg-type]

    assert run({"empty": True}).reasons == {"Empty": "no recorded state (first run)"}
    assert published(output, ["copy"]) == {}
    # State recorded, output empty.
    report = run({"empty": True})
    assert report.reasons == {"Empty": "the output is empty"}
    # Fingerprint: configuration.
    report = run({"empty": False})
    assert report.reasons == {"Empty": "the fingerprint changed (configuration)"}
    assert len(published(output, ["copy"])) == 10
    assert run({"empty": False}).mode == "incremental"
    # Reprocessing.
    report = run({"empty": False}, reprocess=["roads"])
    assert report.reasons == {"Empty": "input roads is marked for reprocessing"}
    assert report.layers["copy"].compiled == 10 and report.layers["copy"].written == 0
    # The requested range does not start at the recorded versions (1).
    publish(inputs, {TILES[0]: b"[]"})
    publish(inputs, {TILES[2]: b"[2]"})
    assert run({"empty": False}, since={"roads": 1}, versions={"roads": 2}).mode == "incremental"
    report = run({"empty": False}, since={"roads": 1})
    assert report.reasons == {"Empty": "the recorded input versions do not match the requested range (roads)"}
    # Dry run: planned and counted, nothing written.
    publish(inputs, {TILES[1]: b"[1]"})
    instants = output.instants()
    dry = run({"empty": False}, dry_run=True)
    assert dry.mode == "incremental" and dry.layers["copy"].written == 1 and dry.instant is None
    output.refresh()
    assert output.instants() == instants


def test_bad_pipelines_are_refused_before_any_write(spark: SparkSession, tmp_path: Path) -> None:
    inputs, output = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    publish(inputs, {"0_0": b"[]"})

    class Other(roads.Tiles):
        pass

    with pytest.raises(PipelineDefinitionError, match="'Tiles' and 'Other' both produce layer 'tiles13'"):
        Driver(spark, output, {"roads": inputs}, [roads.Tiles(), Other()])
    with pytest.raises(PipelineDefinitionError, match="reads layer 'tiles13' of the output catalog"):
        Driver(spark, output, {"roads": inputs}, [roads.summary, roads.Tiles()])
    with pytest.raises(PipelineDefinitionError, match="unknown catalog 'roads'"):
        Driver(spark, output, {}, [roads.Tiles()])
    with pytest.raises(PipelineDefinitionError, match="keyed_limit must be a non-negative integer"):
        Driver(spark, output, {"roads": inputs}, [roads.Tiles()], keyed_limit=-1)
    with pytest.raises(PipelineDefinitionError, match="incremental_path must be one of auto, driver, spark"):
        Driver(spark, output, {"roads": inputs}, [roads.Tiles()], incremental_path="executors")
    # '|' separates the parts of the state layer's graph row names: names with it could collide.
    with pytest.raises(PipelineDefinitionError, match="catalog name 'ro|ads' must not contain '|'"):
        Driver(spark, output, {"ro|ads": inputs}, [roads.Tiles()])

    class Piped(roads.Classes):
        inputs = {"roads": ["seg|ments"]}

    with pytest.raises(PipelineDefinitionError, match="layer 'seg|ments' must not contain '|'"):
        Driver(spark, output, {"roads": inputs}, [Piped()])

    class PipedOut(roads.Classes):
        outputs = ["cl|asses"]

    with pytest.raises(PipelineDefinitionError, match="'cl|asses' is not a valid output layer"):
        Driver(spark, output, {"roads": inputs}, [PipedOut()])

    class Twice(roads.Classes):
        inputs = {"roads": ["segments", "segments"]}

    with pytest.raises(PipelineDefinitionError, match="reads layer 'segments' of 'roads' twice"):
        Driver(spark, output, {"roads": inputs}, [Twice()])
    assert output.instants() == []
    assert issubclass(PipelineDefinitionError, Exception)


def test_catalog_versions_snapshots_and_changes(tmp_path: Path) -> None:
    c = Catalog.create(str(tmp_path / "c"))
    publish(c, {"a": b"1", "b": b"2"})
    publish(c, {"a": b"3", "c": b"4"})
    publish(c, {"b": None})
    assert [v.number for v in c.versions()] == [1, 2, 3]
    assert published(c) == {("segments", "a"): b"3", ("segments", "c"): b"4"}
    v1 = c.snapshot(1)
    assert sorted(zip(v1.column("partition").to_pylist(), v1.column("payload").to_pylist(), strict=True)) == [
        ("a", b"1"),
        ("b", b"2"),
    ]
    ch = c.changes(1, 3)
    kinds = dict(zip(ch.column("partition").to_pylist(), ch.column("change").to_pylist(), strict=True))
    assert kinds == {"a": CHANGED, "b": REMOVED, "c": ADDED}
    assert c.changes(None, 1).column("change").to_pylist() == [ADDED, ADDED]
    with pytest.raises(Exception, match="version 9 does not exist"):
        c.snapshot(9)
    # Inline compaction (every 10 deltacommits) is not a version and changes no content.
    for i in range(10):
        publish(c, {"a": str(i).encode()})
    assert any(i.action == "commit" for i in c.table.timeline())
    assert [v.number for v in c.versions()][-1] == 13
    assert published(c) == {("segments", "a"): b"9", ("segments", "c"): b"4"}


def test_a_read_by_key_returns_the_keys_asked_for_in_each_layer_and_no_other(tmp_path: Path) -> None:
    """`Catalog.read` of keys in several layers: a partition asked for in one layer is not
    returned from another that holds it too, whatever its name holds."""
    c = Catalog.create(str(tmp_path / "c"))
    names = ["a", "b/é", "100%|x", "😀,[", "null"]
    rows = [(layer, name) for layer in ["one", "two", "_state"] for name in names]
    c.table.upsert(
        pa.table(
            {
                "layer": [layer for layer, _ in rows],
                "partition": [name for _, name in rows],
                "payload": pa.array([f"{layer}:{name}".encode() for layer, name in rows], pa.binary()),
                "checksum": [None] * len(rows),
            }
        )
    )
    c.refresh()
    wanted = [("one", "a"), ("two", "b/é"), ("two", "100%|x"), ("_state", "😀,["), ("one", "missing")]
    got = c.read(wanted, columns=["payload"])
    assert sorted(
        zip(*(got.column(x).to_pylist() for x in ["layer", "partition", "payload"]), strict=True)
    ) == [
        ("_state", "😀,[", "_state:😀,[".encode()),
        ("one", "a", b"one:a"),
        ("two", "100%|x", b"two:100%|x"),
        ("two", "b/é", "two:b/é".encode()),
    ]
    assert got.schema.names == ["layer", "partition", "payload"]
    assert c.read([], columns=["payload"]).num_rows == 0


STATS = pa.struct([("segments", pa.int64()), ("length", pa.float64())])
TOTALS = pa.struct([("segments", pa.int64()), ("length", pa.float64()), ("tiles", pa.list_(pa.string()))])


class StructTiles(roads.Tiles):
    """Level-13 totals of a structured input layer, as a structured output layer."""

    inputs = {"stats": ["stats"]}
    outputs = ["totals"]

    def output_keys(self, catalog: str, layer: str, partition: str) -> Iterator[tuple[str, str]]:
        for _, p in super().output_keys(catalog, layer, partition):
            yield "totals", p

    def input_keys(self, layer: str, partition: str) -> Iterator[tuple[str, str, str]]:
        for _, _, p in super().input_keys(layer, partition):
            yield "stats", "stats", p

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> dict[str, object] | None:  # type: ignore[override]
        assert all(isinstance(i.payload, dict) for i in inputs)
        return {
            "segments": sum(i.payload["segments"] for i in inputs),
            "length": round(sum(i.payload["length"] for i in inputs), 3),
            "tiles": [i.partition for i in inputs],
        }


class LongRoads(MapGroupCompiler):
    """Tiles by segment count (keys from content) into a structured layer."""

    inputs = {"stats": ["stats"]}
    outputs = ["by_count"]

    def map(self, item: InputPartition) -> Iterator[tuple[str, str, bytes]]:
        yield "by_count", str(item.payload["segments"]), json.dumps(item.payload["length"]).encode()

    def reduce(self, layer: str, partition: str, values: list[bytes]) -> dict[str, object]:
        return {"segments": len(values), "length": round(sum(json.loads(v) for v in values), 3), "tiles": []}


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_structured_layers_in_and_out(spark: SparkSession, tmp_path: Path, path: str) -> None:
    rng = random.Random(11)
    inputs = Catalog.create(str(tmp_path / "stats"), structured={"stats": STATS})
    output = Catalog.create(str(tmp_path / "out"), structured={"totals": TOTALS, "by_count": TOTALS})
    assert inputs.structured == {"stats": STATS} and set(output.structured) == {"totals", "by_count"}

    def put(values: dict[str, dict[str, object] | None]) -> None:
        ups = {k: v for k, v in values.items() if v is not None}
        if ups:
            inputs.table.upsert(
                pa.table(
                    {
                        "layer": ["stats"] * len(ups),
                        "partition": list(ups),
                        "payload": pa.nulls(len(ups), pa.binary()),
                        "checksum": pa.nulls(len(ups), pa.string()),
                        "stats": pa.array(list(ups.values()), STATS),
                    }
                )
            )
        gone = [k for k, v in values.items() if v is None]
        if gone:
            inputs.table.delete(pa.table({"layer": ["stats"] * len(gone), "partition": gone}))
        inputs.refresh()

    def stat() -> dict[str, object]:
        return {"segments": rng.randint(1, 3), "length": round(rng.uniform(5, 500), 1)}

    def expected() -> dict[tuple[str, str], object]:
        snap = inputs.snapshot()
        values = zip(snap.column("partition").to_pylist(), snap.column("stats").to_pylist(), strict=True)
        items = sorted(InputPartition("stats", "stats", p, v) for p, v in values)
        tiles, longs = StructTiles(), LongRoads()
        groups: dict[tuple[str, str], list[object]] = {}
        for item in items:
            for key in tiles.output_keys("stats", "stats", item.partition):
                groups.setdefault(key, []).append(item)
            for layer, p, value in longs.map(item):
                groups.setdefault((layer, p), []).append(value)
        return {
            k: tiles.compile(*k, v) if k[0] == "totals" else longs.reduce(*k, v) for k, v in groups.items()
        }

    def got() -> dict[tuple[str, str], object]:
        output.refresh()
        snap = output.snapshot(layers=["totals", "by_count"])
        assert snap.column("payload").null_count == snap.num_rows  # the struct columns hold the content
        columns = [snap.column(x).to_pylist() for x in ["layer", "partition", "totals", "by_count"]]
        return {(layer, p): t if layer == "totals" else c for layer, p, t, c in zip(*columns, strict=True)}

    put({t: stat() for t in TILES[:30]})
    driver = Driver(spark, output, {"stats": inputs}, [StructTiles(), LongRoads()], incremental_path=path)
    assert driver.run().mode == "full"
    assert got() == expected()
    for step in range(2):
        change: dict[str, dict[str, object] | None] = {t: stat() for t in rng.sample(TILES[:40], 4)}
        change[rng.choice(sorted(set(TILES[:30]) - set(change)))] = None
        put(change)
        report = driver.run()
        assert report.mode == "incremental", step
        assert {t.path for t in report.tasks.values()} == {path}
        assert got() == expected(), step
        assert 0 < report.layers["totals"].compiled < 20
    # Canonical encoding: an unchanged re-run finds every checksum equal and writes nothing.
    again = driver.run()
    assert again.instant is None and again.layers["totals"].written == 0
    # The catalog's change query carries the struct column too.
    versions = output.instants()
    changes = output.changes(versions[-2], versions[-1], layers=["totals"])
    assert "totals" in changes.column_names and changes.num_rows > 0


def test_snapshots_by_partition_prefix_with_hostile_names(tmp_path: Path) -> None:
    """`Catalog.snapshot(prefix=)` (the Spark path reads a task's graph rows with it) keeps
    exactly the partitions starting with the prefix, whatever characters follow or end it."""
    catalog = Catalog.create(str(tmp_path / "c"))
    names = [
        "T|in|a",
        "T|in|",
        "T|in}",
        "T|in",
        "T|inn",
        "T|out|a",
        "T|in|%2F/ü",
        "T|in|\U0010ffff",
        "ü|\ud7ff",
        "ü|\ue000",
        "ü|",
        "ü",
        "\U0010ffff",
        "\U0010ffff|x",
        "%",
        "%|a/b",
        "\ud7ffa",
        "\ue000",
    ]
    publish(catalog, {n: n.encode("utf-8", "surrogatepass") for n in names})
    for prefix in ["T|in|", "T|in", "ü|", "\ud7ff", "\U0010ffff", "%", "%|a", "T|out|a"]:
        got = catalog.snapshot(layers=["segments"], prefix=prefix).column("partition").to_pylist()
        assert sorted(got) == sorted(n for n in names if n.startswith(prefix)), prefix


class Stray(DirectCompiler):
    """Names an output it did not declare, `config["key"]`, for the input partition "stray"."""

    inputs = {"roads": ["segments"]}
    outputs = ["copy"]

    def output_keys(self, catalog: str, layer: str, partition: str) -> list[tuple[str, str]]:
        return [("copy", partition), *([tuple(self.config["key"])] if partition == "stray" else [])]

    def input_keys(self, layer: str, partition: str) -> list[tuple[str, str, str]]:
        return [("roads", "segments", partition)]

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> bytes | None:
        return inputs[0].payload


class StrayPieces(MapGroupCompiler):
    """Maps input tile 0_0 to `config["key"]`, every other tile to its own output."""

    inputs = {"roads": ["segments"]}
    outputs = ["sizes"]

    def map(self, item: InputPartition) -> Iterator[tuple[object, object, bytes]]:
        layer, partition = self.config["key"] if item.partition == "0_0" else ("sizes", item.partition)
        yield layer, partition, str(len(item.payload)).encode()

    def reduce(self, layer: str, partition: str, values: list[bytes]) -> bytes:
        return values[0]


@pytest.mark.parametrize("key", [["_state", "Stray"], ["tiles13", "12/1/1"], ["copy", 7], [None, "x"]])
def test_an_output_key_outside_the_declared_outputs_fails_the_run(
    spark: SparkSession, tmp_path: Path, key: list[object]
) -> None:
    """A key naming the state layer, another layer or a partition that is not a str would be
    written where no task owns it: the run fails naming the task and the key, on either path,
    and the output catalog is left as it was."""
    inputs, output = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    publish(inputs, {t: roads.segments(random.Random(1), t, 1) for t in TILES[:6]})
    tasks = [Stray(config={"key": key})]
    Driver(spark, output, {"roads": inputs}, tasks).run()
    instants = output.instants()
    publish(inputs, {"stray": b"[]"})
    message = r"named the output .* which is not a partition \(str\) of its declared outputs"
    with pytest.raises(PipelineDefinitionError, match=message):  # raised on the driver
        Driver(spark, output, {"roads": inputs}, tasks, incremental_path="driver").run()
    with pytest.raises(Exception, match=message):  # raised in a Spark task
        Driver(spark, output, {"roads": inputs}, tasks, incremental_path="spark").run()
    with pytest.raises(Exception, match=message):
        Driver(spark, output, {"roads": inputs}, [StrayPieces(config={"key": key})]).run()
    output.refresh()
    assert output.instants() == instants
    assert not [i for i in output.table.timeline() if i.state != "completed"]


def test_structured_layer_errors(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="reserved name"):
        Catalog.create(str(tmp_path / "a"), structured={"payload": STATS})
    with pytest.raises(InvalidArgumentError, match="is not a struct type"):
        Catalog.create(str(tmp_path / "b"), structured={"x": pa.int64()})
    # A compiler returning bytes for a structured layer fails the run; the catalog is unchanged.
    inputs = Catalog.create(str(tmp_path / "in"))
    publish(inputs, {t: roads.segments(random.Random(1), t, 1) for t in TILES[:6]})
    output = Catalog.create(str(tmp_path / "out"), structured={"tiles13": TOTALS})
    with pytest.raises(Exception, match="not a dict"):
        Driver(spark, output, {"roads": inputs}, [roads.Tiles()]).run()
    output.refresh()
    assert output.instants() == [] and not [i for i in output.table.timeline() if i.state != "completed"]


def test_structured_layers_grow_fields_and_layers(tmp_path: Path) -> None:
    """`Catalog.evolve` adds a field to a structured layer (and widens one, and adds a layer) as
    one schema change: payloads written before read the new field as null; dropping a field is
    refused, the catalog unchanged."""
    c = Catalog.create(str(tmp_path / "c"), structured={"stats": STATS})

    def put(partition: str, value: dict[str, object], type: pa.StructType) -> None:
        row = {"layer": ["stats"], "partition": [partition], "payload": pa.nulls(1, pa.binary())}
        row |= {"checksum": pa.nulls(1, pa.string()), "stats": pa.array([value], type)}
        c.table.upsert(pa.table(row), schema_mode="merge")

    put("a", {"segments": 1, "length": 2.5}, STATS)
    grown = pa.struct([("segments", pa.int64()), ("length", pa.float64()), ("note", pa.string())])
    assert c.evolve({"stats": grown, "totals": TOTALS}) is not None
    assert c.structured == {"stats": grown, "totals": TOTALS}
    put("b", {"segments": 2, "length": 1.0, "note": "new"}, grown)
    snap = Catalog(c.uri).snapshot(layers=["stats"])
    values = dict(zip(snap.column("partition").to_pylist(), snap.column("stats").to_pylist(), strict=True))
    assert values == {
        "a": {"segments": 1, "length": 2.5, "note": None},
        "b": {"segments": 2, "length": 1.0, "note": "new"},
    }
    assert c.evolve({"stats": grown}) is None
    before = [i.time for i in c.table.timeline()]
    with pytest.raises(SchemaMismatchError, match="stats.note"):
        c.evolve({"stats": STATS})
    with pytest.raises(InvalidArgumentError, match="reserved name"):
        c.evolve({"payload": STATS})
    assert [i.time for i in Catalog(c.uri).table.timeline()] == before


#: Struct fields Spark's types cannot hold as they are: nanoseconds and times of day.
EVENTS = pa.struct([("at", pa.timestamp("ns")), ("clock", pa.time64("ns")), ("ms", pa.time32("ms"))])
EVENTS_GROWN = pa.struct([*EVENTS, ("note", pa.string())])


def shown(value: object) -> str:
    """A payload as the compilers below show it: every value by its type and text."""
    if isinstance(value, dict):
        return json.dumps({k: f"{type(v).__name__}:{v}" for k, v in sorted(value.items())})
    return repr(value)


class ShowEvents(MapGroupCompiler):
    """Each input partition's payload, as the compiler is given it, grouped by its first
    character: what reaches `map` must not depend on the path or the size of the change."""

    inputs = {"in": ["events", "raw"]}
    outputs = ["shown"]

    def map(self, item: InputPartition) -> Iterator[tuple[str, str, bytes]]:
        yield "shown", item.partition[0], f"{item.layer}/{item.partition}={shown(item.payload)}".encode()

    def reduce(self, layer: str, partition: str, values: list[bytes]) -> bytes | None:
        return b"\n".join(values)


class ShowByKey(DirectCompiler):
    """The same, by key (direct, with its inverse)."""

    inputs = {"in": ["events", "raw"]}
    outputs = ["by_key"]

    def output_keys(self, catalog: str, layer: str, partition: str) -> Iterator[tuple[str, str]]:
        yield "by_key", partition[0]

    def input_keys(self, layer: str, partition: str) -> Iterator[tuple[str, str, str]]:
        for n in range(10):
            yield "in", "events", f"{partition}{n}"
            yield "in", "raw", f"{partition}{n}"

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> bytes | None:
        return "\n".join(f"{i.layer}/{i.partition}={shown(i.payload)}" for i in inputs).encode()


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_inputs_reach_compilers_alike_on_every_path(spark: SparkSession, tmp_path: Path, path: str) -> None:
    """What a compiler is given does not depend on the path or the change's size: structured
    values Spark's types cannot hold (nanoseconds, times of day) reach it as the catalog holds
    them on both paths; an input partition without a payload is not there, in a full run as in
    an incremental one; a structured layer that grows (`Catalog.evolve`) makes the next run a
    full one, as the pieces and outputs kept from before were made from the older type. Each
    step equals a full run and a plain-Python oracle of the inputs as Arrow reads them."""
    rng = random.Random(13)
    inputs = Catalog.create(str(tmp_path / "in"), structured={"events": EVENTS})
    incremental, full = Catalog.create(str(tmp_path / "inc")), Catalog.create(str(tmp_path / "full"))
    tasks = [ShowEvents(), ShowByKey()]

    def event(type: pa.StructType) -> dict[str, object]:
        ns = rng.randrange(10**18)
        value = {"at": ns, "clock": rng.randrange(86_400 * 10**9), "ms": rng.randrange(86_400_000)}
        if "note" in type.names:
            value["note"] = rng.choice([None, "ü/%|"])
        return value

    def put(events: dict[str, bool], raw: dict[str, bytes | None | bool], type: pa.StructType) -> None:
        """Upserts events (True) or deletes them (False); raw: bytes, None (a row whose
        payload is null) or False (deleted)."""
        ups = [p for p, keep in events.items() if keep]
        rows = [
            pa.table(
                {
                    "layer": pa.array(["events"] * len(ups), pa.string()),
                    "partition": pa.array(ups, pa.string()),
                    "payload": pa.nulls(len(ups), pa.binary()),
                    "checksum": pa.nulls(len(ups), pa.string()),
                    "events": pa.array([event(type) for _ in ups], type),
                }
            )
        ]
        kept = [p for p, v in raw.items() if v is not False]
        rows.append(
            pa.table(
                {
                    "layer": pa.array(["raw"] * len(kept), pa.string()),
                    "partition": pa.array(kept, pa.string()),
                    "payload": pa.array([raw[p] for p in kept], pa.binary()),
                    "checksum": pa.nulls(len(kept), pa.string()),
                    "events": pa.nulls(len(kept), type),
                }
            )
        )
        inputs.table.upsert(pa.concat_tables(rows))
        gone = [("events", p) for p, keep in events.items() if not keep]
        gone += [("raw", p) for p, v in raw.items() if v is False]
        if gone:
            inputs.table.delete(pa.table({"layer": [g[0] for g in gone], "partition": [g[1] for g in gone]}))
        inputs.refresh()

    def oracle() -> dict[tuple[str, str], bytes]:
        snap = inputs.snapshot()
        rows = zip(
            *(snap.column(c).to_pylist() for c in ["layer", "partition", "payload", "events"]), strict=True
        )
        items = sorted(
            InputPartition("in", layer, p, value if layer == "events" else payload)
            for layer, p, payload, value in rows
            if (value if layer == "events" else payload) is not None
        )
        groups: dict[str, list[InputPartition]] = {}
        for item in items:
            groups.setdefault(item.partition[0], []).append(item)
        out = {}
        for first, group in groups.items():
            shown_items = [f"{i.layer}/{i.partition}={shown(i.payload)}" for i in group]
            out[("shown", first)] = "\n".join(shown_items).encode()
            out[("by_key", first)] = "\n".join(shown_items).encode()
        return out

    names = [f"{c}{n}" for c in "abcd" for n in range(10)]
    put(
        {p: True for p in names[:30]},
        {p: (None if n % 3 == 0 else p.encode()) for n, p in enumerate(names[5:35])},
        EVENTS,
    )
    type = EVENTS
    for step in range(4):
        if step == 3:  # the structured layer grows by a field
            type = EVENTS_GROWN
            inputs.evolve({"events": type})
            put({p: True for p in rng.sample(names, 3)}, {}, type)
        report = Driver(spark, incremental, {"in": inputs}, tasks, incremental_path=path).run()
        Driver(spark, full, {"in": inputs}, tasks).run(full=True)
        layers = ["shown", "by_key"]
        assert published(incremental, layers) == oracle(), step
        assert checksums(incremental, layers) == checksums(full, layers), step
        assert graphs(incremental) == graphs(full), step
        if step == 3:
            assert report.reasons == {
                t.name: "the fingerprint changed (the struct types of its structured layers)" for t in tasks
            }
        elif step:
            assert report.mode == "incremental" and {t.path for t in report.tasks.values()} == {path}, step
        events = {p: rng.random() < 0.8 for p in rng.sample(names, 4)}
        raw: dict[str, bytes | None | bool] = {
            p: rng.choice([None, False, p.encode() * 2]) for p in rng.sample(names, 4)
        }
        put(events, raw, type)


def test_a_dataframe_function_takes_and_gives_structured_values_in_sparks_types(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A non-incremental DataFrame function sees a structured layer as Spark holds it (times of
    day as counts of microseconds, timestamps in microseconds) and may return it so; values
    Spark can hold come back exactly in the layer's types. A returned value the layer's type
    cannot hold exactly (a time of day finer than its milliseconds) fails the run, nothing
    published."""
    inputs = Catalog.create(str(tmp_path / "in"), structured={"events": EVENTS})
    output = Catalog.create(str(tmp_path / "out"), structured={"copy": EVENTS})
    values = {
        "a": {"at": 1_000_001_000, "clock": 3_600_000_002_000, "ms": 5},
        "b/ü%": {"at": -86_400_000_000_000, "clock": 86_399_999_999_000, "ms": 86_399_999},
        "c": {"at": None, "clock": None, "ms": None},
    }
    inputs.table.upsert(
        pa.table(
            {
                "layer": ["events"] * 3,
                "partition": list(values),
                "payload": pa.nulls(3, pa.binary()),
                "checksum": pa.nulls(3, pa.string()),
                "events": pa.array(list(values.values()), EVENTS),
            }
        )
    )
    inputs.refresh()
    seen: dict[str, object] = {}
    shift = {"micros": 0}

    @compiler(inputs={"in": ["events"]}, outputs=["copy"])
    def copy(frames: dict[tuple[str, str], DataFrame]) -> dict[str, DataFrame]:
        from pyspark.sql import functions as F

        df = frames[("in", "events")]
        seen["types"] = {f.name: f.dataType.simpleString() for f in df.schema["payload"].dataType.fields}
        seen["rows"] = {r.partition: r.payload.asDict() for r in df.collect()}
        ms = F.col("payload.ms") + F.lit(shift["micros"])
        return {
            "copy": df.select(
                "partition", F.struct("payload.at", "payload.clock", ms.alias("ms")).alias("payload")
            )
        }

    Driver(spark, output, {"in": inputs}, [copy]).run()
    assert seen["types"] == {"at": "timestamp_ntz", "clock": "bigint", "ms": "bigint"}
    assert seen["rows"]["a"]["clock"] == 3_600_000_002 and seen["rows"]["a"]["ms"] == 5_000
    output.refresh()
    snap = output.snapshot(layers=["copy"])
    got = dict(zip(snap.column("partition").to_pylist(), snap.column("copy").to_pylist(), strict=True))
    assert got == {p: pa.scalar(v, EVENTS).as_py() for p, v in values.items()}
    before = output.instants()
    shift["micros"] = 1  # 5 ms and 1 µs: a time32[ms] cannot hold it
    with pytest.raises(Exception, match="would lose data"):
        Driver(spark, output, {"in": inputs}, [copy]).run(full=True)
    output.refresh()
    assert output.instants() == before


@pytest.mark.parametrize("record_index", [False, True])
def test_a_write_task_hands_the_driver_its_layers_not_each_key(tmp_path: Path, record_index: bool) -> None:
    """What each write task of a run sends the driver for the commit names the layers it wrote,
    not each key (a 30% change of 1,000,000 inputs sent about 1,000,000 keys, some 400 MB held
    at once on the driver): a task writes whole layers and the catalog is partitioned by layer.
    A catalog keeping a record index still gets every key (the index needs them). The commit
    lands the rows either way, and a concurrent writer of one of the keys is still a conflict."""
    import json

    from oxlake import CommitConflictError, _native
    from oxlake._engine import native
    from oxlake.pipeline import _spark

    catalog = Catalog.create(str(tmp_path / "c"))
    publish(catalog, {"a": b"1"})
    if record_index:
        catalog.table.build_metadata()
    rows = pa.table(
        {
            "op": ["upsert", "upsert", "delete"],
            "layer": ["segments", "other", "segments"],
            "partition": ["b/ü%", "c", "a"],
            "payload": pa.array([b"2", b"3", None], pa.binary()),
            "checksum": pa.array([None, None, None], pa.string()),
        }
    )
    pending = _native.begin_write(native(catalog.table), "upsert")
    parts = _spark._write(catalog.table, pending.instant, rows.to_batches(), {}, (1, 1))
    assert len(parts) == 1, "deletes and upserts: one upsert, its deletes flagged"
    keys = [json.loads(p)["keys"] for p in parts]
    if record_index:
        assert sorted(k for part in keys for _, _, ks in part["written"] for k in ks) == [
            "layer:other,partition:c",
            "layer:segments,partition:b/ü%",
        ]
    else:
        assert [part["written"] for part in keys] == [[]] and [part["deleted"] for part in keys] == [[]]
        assert sorted(p for part in keys for p in part["unlisted"]) == ["layer=other", "layer=segments"]
    # Another writer commits one of the keys meanwhile: the run's commit loses, as with listed keys.
    publish(catalog, {"b/ü%": b"other"})
    with pytest.raises(CommitConflictError):
        pending.commit(parts)
    catalog.refresh()
    assert published(catalog) == {("segments", "a"): b"1", ("segments", "b/ü%"): b"other"}
    pending = _native.begin_write(native(catalog.table), "upsert")
    pending.commit(_spark._write(catalog.table, pending.instant, rows.to_batches(), {}, (1, 1)))
    assert published(catalog) == {("segments", "b/ü%"): b"2", ("other", "c"): b"3"}


def test_spark_values_come_back_exactly_or_not_at_all() -> None:
    """`from_spark_values`: Spark's struct values (times as microseconds) back in a layer's type.
    A null struct, whose fields Spark nulls, stays null though a field is non-nullable; a time
    beyond a day, before midnight or finer than the field's unit, and a field of another kind,
    missing or extra, are refused with a typed error naming the layer and the field; a field
    Spark's arithmetic widened is taken back value by value."""
    from oxlake._spark_io import from_spark_values

    layer = pa.struct([pa.field("at", pa.time32("ms"), nullable=False), ("n", pa.uint8())])
    spark = pa.struct([("at", pa.int64()), ("n", pa.int16())])

    def values(at: list[int | None], n: list[int | None], mask: list[bool] | None = None) -> pa.Array:
        m = None if mask is None else pa.array(mask)
        return pa.StructArray.from_arrays(
            [pa.array(at, pa.int64()), pa.array(n, pa.int16())], fields=list(spark), mask=m
        )

    got = from_spark_values(
        values([5_000, None, 86_399_999_000], [1, None, 255], [False, True, False]), layer, "x"
    )
    assert got.type == layer
    assert got.to_pylist() == [
        {"at": datetime.time(0, 0, 0, 5_000), "n": 1},
        None,
        {"at": datetime.time(23, 59, 59, 999_000), "n": 255},
    ]
    for bad in [
        values([86_400_000_000], [1]),
        values([-1_000], [1]),
        values([5_001], [1]),
        values([0], [256]),
    ]:
        with pytest.raises(SchemaMismatchError, match="structured layer 'x'"):
            from_spark_values(bad, layer, "structured layer 'x'")
    # A function's arithmetic widens (short + 1 is an int): taken back, each value checked.
    wider = pa.StructArray.from_arrays([pa.array([7], pa.int32()), pa.array([1_000])], names=["n", "at"])
    assert from_spark_values(wider, layer, "x").to_pylist() == [{"at": datetime.time(0, 0, 0, 1_000), "n": 7}]
    # Where a cast would convert silently, nothing is taken.
    for other, named in [
        ([pa.array(["1000"]), pa.array([1], pa.int16())], "at is string"),  # "1000" → 1 s
        ([pa.array([1_000]), pa.array([1.0])], "n is double"),
        ([pa.array([1_000])], "missing \\['n'\\]"),
    ]:
        names = ["at", "n"][: len(other)]
        with pytest.raises(SchemaMismatchError, match=f"structured layer 'x'.*{named}"):
            from_spark_values(pa.StructArray.from_arrays(other, names=names), layer, "structured layer 'x'")
    extra = pa.StructArray.from_arrays(
        [pa.array([1_000]), pa.array([1]), pa.array([2])], names=["at", "n", "m"]
    )
    with pytest.raises(SchemaMismatchError, match="extra \\['m'\\]"):
        from_spark_values(extra, layer, "x")
    nested = pa.struct([("tags", pa.list_(pa.float32())), ("label", pa.string())])
    doubles = pa.StructArray.from_arrays([pa.array([[0.1]]), pa.array(["a"])], names=["tags", "label"])
    with pytest.raises(SchemaMismatchError, match="tags\\[\\] is double, not float"):
        from_spark_values(doubles, nested, "x")
    numbers = pa.StructArray.from_arrays(
        [pa.array([[0.5]], pa.list_(pa.float32())), pa.array([3])], names=["tags", "label"]
    )
    with pytest.raises(SchemaMismatchError, match="label is int64, not string"):
        from_spark_values(numbers, nested, "x")


def test_a_catalog_holds_a_layer_while_one_of_its_partitions_is_published(tmp_path: Path) -> None:
    """`Catalog.holds` (the driver's "is the output empty" check, which reads the layers asked
    for only): a layer whose every partition was removed holds none; names with separators and
    `%` are layers like others."""
    c = Catalog.create(str(tmp_path / "c"))
    assert not c.holds(["a/b%ü"])

    def write(rows: dict[tuple[str, str], bytes]) -> None:
        c.table.upsert(
            pa.table(
                {
                    "layer": [layer for layer, _ in rows],
                    "partition": [p for _, p in rows],
                    "payload": pa.array(list(rows.values()), pa.binary()),
                    "checksum": [None] * len(rows),
                }
            )
        )

    write({("a/b%ü", "x=1"): b"1", ("a/b%ü", "y"): b"2", ("kept", "z"): b"3"})
    c.refresh()
    assert c.holds(["a/b%ü"]) and c.holds(["nope", "kept"]) and not c.holds(["nope"]) and not c.holds([])
    c.table.delete(pa.table({"layer": ["a/b%ü", "a/b%ü"], "partition": ["x=1", "y"]}))
    c.refresh()
    assert not c.holds(["a/b%ü"]) and c.holds(["kept"])
    assert c.layers() == ["kept"]


def test_encoded_reads_give_structured_values_as_payload_bytes(tmp_path: Path) -> None:
    """`snapshot(encoded=True)` and `changes(encoded=True)` without Spark: the struct columns
    give way to their values' payload bytes, other layers keep theirs; an empty catalog and
    `columns=` keep their shapes."""
    from oxlake.pipeline import _payload

    c = Catalog.create(str(tmp_path / "c"), structured={"events": EVENTS})
    assert c.snapshot(encoded=True).column_names == ["layer", "partition", "payload", "checksum", "version"]
    assert c.snapshot(columns=["layer", "events"], encoded=True).column_names == [
        "layer",
        "events",
        "version",
    ]
    assert c.changes(None, encoded=True).column_names == [
        "layer",
        "partition",
        "change",
        "payload",
        "checksum",
    ]
    value = {"at": 1_700_000_000_123_456_789, "clock": 86_399_999_999_999, "ms": 1}
    c.table.upsert(
        pa.table(
            {
                "layer": ["events", "raw", "events"],
                "partition": ["a", "b", "c"],
                "payload": pa.array([None, b"raw", None], pa.binary()),
                "checksum": pa.nulls(3, pa.string()),
                "events": pa.array([value, None, None], EVENTS),
            }
        )
    )
    c.refresh()
    first = c.instants()[-1]
    plain = c.snapshot()
    stored = dict(zip(plain.column("partition").to_pylist(), plain.column("events").to_pylist(), strict=True))
    want = {
        ("events", "a"): _payload.encode(stored["a"], EVENTS),
        ("raw", "b"): b"raw",
        ("events", "c"): None,
    }
    snap = c.snapshot(encoded=True)
    assert snap.column_names == ["layer", "partition", "payload", "checksum", "version"]
    keys = zip(snap.column("layer").to_pylist(), snap.column("partition").to_pylist(), strict=True)
    got = dict(zip(keys, snap.column("payload").to_pylist(), strict=True))
    assert got == want
    c.table.delete(pa.table({"layer": ["events"], "partition": ["a"]}))
    c.refresh()
    ch = c.changes(first, encoded=True)
    assert ch.column_names == ["layer", "partition", "change", "payload", "checksum"]
    assert ch.to_pylist() == [
        {"layer": "events", "partition": "a", "change": REMOVED, "payload": None, "checksum": None}
    ]
    everything = c.changes(None, encoded=True)
    assert sorted(everything.column("partition").to_pylist()) == ["b", "c"]
