"""The incremental processing library on Spark `local[2]`: the example pipeline over several
input versions, incremental runs equal full runs, unchanged re-runs write nothing, each fallback
to a full run says why, and bad pipelines are refused before any write."""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from oxlake.pipeline import (  # noqa: E402
    ADDED,
    CHANGED,
    REMOVED,
    Catalog,
    DirectCompiler,
    Driver,
    InputPartition,
    PipelineDefinitionError,
)
from pyspark.sql import SparkSession  # noqa: E402

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


class ScannedTiles(DirectCompiler):
    """The example's `Tiles` without its inverse: incremental runs map every input key."""

    inputs, outputs = roads.Tiles.inputs, roads.Tiles.outputs
    output_keys = roads.Tiles.output_keys
    compile = roads.Tiles.compile


@pytest.mark.parametrize("seed, tiles", [(1, roads.Tiles), (2, ScannedTiles)])
def test_incremental_runs_equal_full_runs_and_write_only_what_changed(
    spark: SparkSession, tmp_path: Path, seed: int, tiles: type[DirectCompiler]
) -> None:
    rng = random.Random(seed)
    inputs = Catalog.create(str(tmp_path / "roads"))
    incremental, full = Catalog.create(str(tmp_path / "inc")), Catalog.create(str(tmp_path / "full"))
    live = set(rng.sample(TILES, 40))
    publish(inputs, {t: roads.segments(rng, t, rng.randint(1, 4)) for t in live})
    tasks = [tiles(), roads.Classes()]
    assert tasks[0].invertible == (tiles is roads.Tiles)  # type: ignore[attr-defined]
    inc_driver = Driver(spark, incremental, {"roads": inputs}, tasks)
    full_driver = Driver(spark, full, {"roads": inputs}, tasks)
    layers = ["tiles13", "classes"]
    for step in range(3):
        before = checksums(incremental, layers)
        report = inc_driver.run()
        full_driver.run(full=True)
        after = checksums(incremental, layers)
        assert after == checksums(full, layers), f"step {step}"
        written = {k for k in after if before.get(k) != after[k]}
        deleted = set(before) - set(after)
        for layer in layers:
            assert report.layers[layer].written == sum(1 for k in written if k[0] == layer)
            assert report.layers[layer].deleted == sum(1 for k in deleted if k[0] == layer)
        if step:
            assert report.mode == "incremental"
            assert report.layers["tiles13"].compiled < len(after) // 2 + 6
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


def test_an_unchanged_rerun_writes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(5)
    inputs, output = Catalog.create(str(tmp_path / "roads")), Catalog.create(str(tmp_path / "out"))
    publish(inputs, {t: roads.segments(rng, t, 2) for t in TILES[:20]})
    driver = Driver(spark, output, {"roads": inputs}, [roads.Tiles(), roads.Classes()])
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
