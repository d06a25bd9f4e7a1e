"""What oxlake writes under `.hoodie/` reads in Apache Hudi's Java engine: each Avro plan and
metadata decodes with `fastavro` using Apache Hudi's own `.avsc` as the reader schema (schema
resolution, as Java's `TimelineMetadataUtils.deserializeAvroMetadata` does). Issue 23: clean,
rollback, restore and savepoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fastavro
import oxlake
import pytest
from conftest import SCHEMA, data_files, hudi_avro_schema, hudi_read, rows, trips, trips_table


def hudi_schemas() -> dict[str, Any]:
    """A reader schema for each of Apache Hudi's records oxlake writes, by name."""
    return {name: hudi_avro_schema(name) for name in JAVA_RECORDS}


JAVA_RECORDS = (
    "HoodieCleanerPlan",
    "HoodieCleanMetadata",
    "HoodieRollbackPlan",
    "HoodieRollbackMetadata",
    "HoodieRestorePlan",
    "HoodieRestoreMetadata",
    "HoodieSavepointMetadata",
    "HoodieCompactionPlan",
    "HoodieRequestedReplaceMetadata",
)


@pytest.fixture(scope="module")
def hudi() -> dict[str, Any]:
    return hudi_schemas()


def decode(path: Path, reader_schema: Any | None = None) -> dict[str, Any]:
    """The one record of an Avro timeline file, read as Java reads it when given its schema."""
    with path.open("rb") as f:
        records = list(fastavro.reader(f, reader_schema=reader_schema))
    assert len(records) == 1, path
    record: dict[str, Any] = records[0]
    return record


def clean_files(t: oxlake.Table, time_: str) -> dict[str, Path]:
    hoodie = Path(t.uri, ".hoodie")
    return {
        "requested": hoodie / f"{time_}.clean.requested",
        "inflight": hoodie / f"{time_}.clean.inflight",
        "completed": hoodie / f"{time_}.clean",
    }


def check_clean(
    t: oxlake.Table, hudi: dict[str, Any], deleted: list[str], policy: str, earliest: Any
) -> None:
    """The clean instant that deleted `deleted` decodes in Java's schemas with these values."""
    cleans = [i for i in t.timeline() if i.action == "clean" and i.state == "completed"]
    files = clean_files(t, cleans[-1].time)
    commits = [i for i in t.timeline() if i.state == "completed" and i.action in ("commit", "deltacommit")]
    by_partition: dict[str, list[str]] = {}
    for f in deleted:
        partition, _, _ = f.rpartition("/")
        by_partition.setdefault(partition, []).append(f)
    for state in ("requested", "inflight"):
        plan = decode(files[state], hudi["HoodieCleanerPlan"])
        assert plan["policy"] == policy
        assert plan["version"] == 2
        assert plan["earliestInstantToRetain"] == earliest
        assert plan["partitionsToBeDeleted"] == []
        planned = {
            p: sorted(info["filePath"] for info in infos)
            for p, infos in plan["filePathsToBeDeletedPerPartition"].items()
        }
        # Full paths, as Java's CleanPlanner writes them (Java deletes `new Path(filePath)`).
        root = "file:" + str(Path(t.uri))
        assert planned == {p: sorted(f"{root}/{f}" for f in fs) for p, fs in by_partition.items()}
        assert all(
            i["isBootstrapBaseFile"] is False
            for v in plan["filePathsToBeDeletedPerPartition"].values()
            for i in v
        )
        # The field Java 0.14 reads to count commits since the last clean (not in every .avsc).
        assert decode(files[state])["lastCompletedCommitTimestamp"] == commits[-1].time
    meta = decode(files["completed"], hudi["HoodieCleanMetadata"])
    assert meta["startCleanTime"] == cleans[-1].time
    assert meta["version"] == 2
    assert meta["totalFilesDeleted"] == len(deleted)
    assert meta["earliestCommitToRetain"] == (earliest["timestamp"] if earliest else "")
    assert meta["lastCompletedCommitTimestamp"] == commits[-1].time
    assert meta["timeTakenInMillis"] >= 0
    assert set(meta["partitionMetadata"]) == set(by_partition)
    for p, m in meta["partitionMetadata"].items():
        names = sorted(f.rsplit("/", 1)[-1] for f in by_partition[p])
        assert m["partitionPath"] == p
        assert m["policy"] == policy
        # File names, not paths, as CleanActionExecutor records them.
        assert sorted(m["deletePathPatterns"]) == names
        assert sorted(m["successDeleteFiles"]) == names
        assert m["failedDeleteFiles"] == []
        assert m["isPartitionDeleted"] is False


@pytest.mark.parametrize("metadata", [False, True], ids=["plain", "metadata_table"])
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_clean_files_decode_as_java_reads_them(
    table_path: str, hudi: dict[str, Any], table_type: str, metadata: bool
) -> None:
    t = oxlake.create_table(
        table_path,
        SCHEMA,
        record_key="id",
        partition_by=["city"],
        ordering_field="ts",
        table_type=table_type,
        table_version=6,
    )
    if metadata:
        t.build_metadata()
    t.insert(trips(list(range(6))))
    for ts in range(2, 5):
        t.upsert(trips([0, 1, 2], ts=ts, name=f"v{ts}"))
        if table_type == "merge_on_read":
            t.compact()
    expected = rows(t.scan())
    commits = [i for i in t.timeline() if i.state == "completed" and i.action in ("commit", "deltacommit")]
    before = data_files(t)
    deleted = t.clean(policy="keep_latest_commits", retain=2)
    assert deleted and set(deleted) <= before
    assert not any(Path(t.uri, f).exists() for f in deleted)
    earliest = commits[-2]
    check_clean(
        t,
        hudi,
        deleted,
        "KEEP_LATEST_COMMITS",
        {"timestamp": earliest.time, "action": earliest.action, "state": "COMPLETED"},
    )
    assert rows(t.scan()) == expected
    assert rows(oxlake.Table(table_path).scan()) == expected
    if metadata:
        report = t.validate()
        assert report.ok, report
    # Nothing more to clean, then a second clean of the other policy: Avro again.
    assert t.clean(policy="keep_latest_commits", retain=2) == []
    t.upsert(trips([3, 4], ts=9, name="late"))
    if table_type == "merge_on_read":
        t.compact()
    expected = rows(t.scan())
    deleted = t.clean(policy="keep_latest_file_versions", retain=1)
    assert deleted
    check_clean(t, hudi, deleted, "KEEP_LATEST_FILE_VERSIONS", None)
    assert len([i for i in t.timeline() if i.action == "clean"]) == 2
    assert rows(oxlake.Table(table_path).scan()) == expected


def test_a_pending_clean_of_an_earlier_oxlake_json_plan_is_resumed(
    table_path: str, hudi: dict[str, Any]
) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts", table_version=6)
    for ts in range(3):
        t.upsert(trips([1, 2], ts=ts))
    expected = rows(t.scan())
    files = sorted(data_files(t), key=lambda f: f.rsplit("_", 1)[-1])
    old, latest = files[:-1], files[-1]
    last = max(i.time for i in t.timeline())
    pending = str(int(last) + 1)
    # The plan as oxlake wrote it before issue 23: pretty-printed JSON (serde_json), an empty
    # inflight file beside it, the cleaner gone (the files are an hour old, no heartbeat).
    plan = {"policy": "keep_latest_commits", "earliestInstantToRetain": last, "filesToDelete": old}
    hoodie = Path(table_path, ".hoodie")
    requested = hoodie / f"{pending}.clean.requested"
    requested.write_text(json.dumps(plan, indent=2))
    inflight = hoodie / f"{pending}.clean.inflight"
    inflight.write_bytes(b"")
    hour_ago = time.time() - 3600
    for p in (requested, inflight):
        os.utime(p, (hour_ago, hour_ago))
    t = oxlake.Table(table_path)
    assert [(i.time, i.state) for i in t.timeline() if i.action == "clean"] == [(pending, "inflight")]
    # The next clean finishes it (retaining all three commits, it plans nothing of its own).
    assert sorted(t.clean(policy="keep_latest_commits", retain=3)) == old
    assert data_files(t) == {latest}
    assert [(i.time, i.state) for i in t.timeline() if i.action == "clean"] == [(pending, "completed")]
    assert json.loads(requested.read_text()) == plan
    meta = decode(hoodie / f"{pending}.clean", hudi["HoodieCleanMetadata"])
    assert meta["earliestCommitToRetain"] == last
    assert sorted(meta["partitionMetadata"][""]["successDeleteFiles"]) == old
    assert meta["partitionMetadata"][""]["policy"] == "KEEP_LATEST_COMMITS"
    assert rows(oxlake.Table(table_path).scan()) == expected
    # Reads as of the commits it removed are refused, as for any clean.
    first = min(i.time for i in t.timeline() if i.action == "commit")
    with pytest.raises(oxlake.InvalidArgumentError, match="no longer readable"):
        t.to_arrow(as_of=first)


def test_a_completed_json_clean_of_an_earlier_oxlake_still_guards_reads(table_path: str) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts", table_version=6)
    for ts in range(3):
        t.upsert(trips([1, 2], ts=ts))
    files = sorted(data_files(t), key=lambda f: f.rsplit("_", 1)[-1])
    first = min(i.time for i in t.timeline() if i.action == "commit")
    last = max(i.time for i in t.timeline())
    done = str(int(last) + 1)
    plan = {"policy": "keep_latest_commits", "earliestInstantToRetain": last, "filesToDelete": files[:1]}
    hoodie = Path(table_path, ".hoodie")
    (hoodie / f"{done}.clean.requested").write_text(json.dumps(plan, indent=2))
    (hoodie / f"{done}.clean.inflight").write_bytes(b"")
    (hoodie / f"{done}.clean").write_text(json.dumps(plan, indent=2))
    Path(table_path, files[0]).unlink()
    t = oxlake.Table(table_path)
    with pytest.raises(oxlake.InvalidArgumentError, match="no longer readable"):
        t.to_arrow(as_of=first)
    assert rows(t.scan()) == rows(trips([1, 2], ts=2))


def timeline_file(t: oxlake.Table, time_: str, suffix: str) -> Path:
    return Path(t.uri, ".hoodie", f"{time_}.{suffix}")


def full_path(t: oxlake.Table, rel: str) -> str:
    """A file as Java's plans name it: qualified with the file system (`file:/...`)."""
    return "file:" + str(Path(t.uri, rel))


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_rollback_files_decode_as_java_reads_them(
    table_path: str, hudi: dict[str, Any], table_type: str
) -> None:
    t = trips_table(table_path, table_type=table_type, table_version=6)
    t.insert(trips(list(range(6))))
    before_rows = rows(t.scan())
    before = data_files(t)
    written = t.upsert(trips([0, 1, 3], ts=2, name="late")).instant
    assert written is not None
    new_files = data_files(t) - before
    r = t.rollback(written)
    assert rows(t.scan()) == before_rows
    assert data_files(t) == before
    action = "deltacommit" if table_type == "merge_on_read" else "commit"
    for state, suffix in (("requested", "rollback.requested"), ("completed", "rollback")):
        assert timeline_file(t, r, suffix).exists(), state
    assert timeline_file(t, r, "rollback.inflight").read_bytes() == b""
    plan = decode(timeline_file(t, r, "rollback.requested"), hudi["HoodieRollbackPlan"])
    assert plan["instantToRollback"] == {"commitTime": written, "action": action}
    assert plan["version"] == 1
    requests = plan["RollbackRequests"]
    # One request per file group the commit wrote: base files of the commit to delete, logs to
    # mark (by full path, as Java's plans name them).
    planned = {f for req in requests for f in req["filesToBeDeleted"]} | {
        f for req in requests for f in (req["logBlocksToBeDeleted"] or {})
    }
    assert planned == {full_path(t, f) for f in new_files}
    assert {(req["partitionPath"], bool(req["fileId"])) for req in requests} == {
        ("city=sf", True),
        ("city=nyc", True),
    }
    # oxlake's own field rides along in the writer schema; Java's reader skips it.
    assert decode(timeline_file(t, r, "rollback.requested"))["oxlakeWasCompleted"] is True
    meta = decode(timeline_file(t, r, "rollback"), hudi["HoodieRollbackMetadata"])
    assert meta["startRollbackTime"] == r
    assert meta["commitsRollback"] == [written]
    assert meta["instantsRollback"] == [{"commitTime": written, "action": action}]
    assert meta["version"] == 1
    assert meta["totalFilesDeleted"] == len(new_files)
    deleted = {f for m in meta["partitionMetadata"].values() for f in m["successDeleteFiles"]}
    assert deleted == {full_path(t, f) for f in new_files}
    for partition, m in meta["partitionMetadata"].items():
        assert m["partitionPath"] == partition
        assert m["failedDeleteFiles"] == []
        assert all(f.startswith(full_path(t, partition) + "/") for f in m["successDeleteFiles"])


def test_a_rollback_of_a_failed_write_decodes_and_a_json_one_still_resumes(
    table_path: str, hudi: dict[str, Any]
) -> None:
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts", table_version=6)
    t.insert(trips([1, 2]))
    expected = rows(t.scan())
    last = max(i.time for i in t.timeline())
    hoodie = Path(table_path, ".hoodie")
    hour_ago = time.time() - 3600
    # A write that crashed (requested and inflight, a data file, no heartbeat), and a rollback of
    # it that an earlier oxlake started and never finished, its plan in that version's JSON.
    failed = str(int(last) + 1)
    (hoodie / f"{failed}.commit.requested").write_bytes(b"")
    (hoodie / f"{failed}.inflight").write_bytes(b"")
    stray = Path(table_path, f"00000000-0000-0000-0000-000000000000-0_0-0-1_{failed}.parquet")
    stray.write_bytes(b"not parquet: never read, only deleted")
    rollback = str(int(last) + 2)
    legacy = {"instantToRollback": {"commitTime": failed, "action": "commit"}}
    (hoodie / f"{rollback}.rollback.requested").write_text(json.dumps(legacy))
    for p in hoodie.glob(f"{failed}*"):
        os.utime(p, (hour_ago, hour_ago))
    os.utime(hoodie / f"{rollback}.rollback.requested", (hour_ago, hour_ago))
    t = oxlake.Table(table_path)
    t.upsert(trips([2], ts=5))
    assert not stray.exists()
    assert [i.state for i in t.timeline() if i.time == failed] == []
    meta = decode(hoodie / f"{rollback}.rollback", hudi["HoodieRollbackMetadata"])
    assert meta["commitsRollback"] == [failed]
    assert meta["partitionMetadata"][""]["successDeleteFiles"] == [full_path(t, stray.name)]
    # The plan stays as that version wrote it; the completed metadata is Java's.
    assert json.loads((hoodie / f"{rollback}.rollback.requested").read_text()) == legacy
    assert rows(t.scan()) == [expected[0], rows(trips([2], ts=5))[0]]


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_savepoint_and_restore_files_decode_as_java_reads_them(
    table_path: str, hudi: dict[str, Any], table_type: str
) -> None:
    t = trips_table(table_path, table_type=table_type, table_version=6)
    t.insert(trips(list(range(6))))
    t.upsert(trips([0, 4], ts=2, name="second"))
    saved = max(i.time for i in t.timeline() if i.state == "completed")
    expected = rows(t.scan())
    snapshot_files = data_files(t)
    t.savepoint(saved)
    sp = decode(timeline_file(t, saved, "savepoint"), hudi["HoodieSavepointMetadata"])
    assert sp["savepointedBy"] == "oxlake"
    # Milliseconds, as Java records them.
    assert abs(sp["savepointedAt"] - time.time() * 1000) < 600_000
    named = {(p, f) for p, m in sp["partitionMetadata"].items() for f in m["savepointDataFile"]}
    assert all(m["partitionPath"] == p for p, m in sp["partitionMetadata"].items())
    # File names (not paths) per partition: the files of the savepointed snapshot, the latest
    # slice of every file group (copy-on-write: its newest base file).
    saved_files = {f"{p}/{f}" for p, f in named}
    assert saved_files <= snapshot_files

    def group(f: str) -> tuple[str, str]:
        partition, name = f.rsplit("/", 1)
        return partition, name.lstrip(".").split("_")[0]

    assert {group(f) for f in saved_files} == {group(f) for f in snapshot_files}
    if table_type == "copy_on_write":
        newest = {}
        for f in sorted(snapshot_files, key=lambda f: f.rsplit("_", 1)[-1]):
            newest[group(f)] = f
        assert saved_files == set(newest.values())
    later = []
    for ts in (3, 4):
        later.append(t.upsert(trips([1, 5], ts=ts, name=f"v{ts}")).instant)
    r = t.restore(saved)
    assert rows(t.scan()) == expected
    plan = decode(timeline_file(t, r, "restore.requested"), hudi["HoodieRestorePlan"])
    action = "deltacommit" if table_type == "merge_on_read" else "commit"
    assert plan["instantsToRollback"] == [{"commitTime": c, "action": action} for c in reversed(later)]
    assert plan["savepointToRestoreTimestamp"] == saved
    assert plan["version"] == 2
    meta = decode(timeline_file(t, r, "restore"), hudi["HoodieRestoreMetadata"])
    assert meta["startRestoreTime"] == r
    assert meta["instantsToRollback"] == list(reversed(later))
    assert meta["restoreInstantInfo"] == [{"commitTime": c, "action": action} for c in reversed(later)]
    assert set(meta["hoodieRestoreMetadata"]) == set(later)
    for c, nested in meta["hoodieRestoreMetadata"].items():
        assert [m["commitsRollback"] for m in nested] == [[c]]
        assert nested[0]["totalFilesDeleted"] >= 1
    assert rows(oxlake.Table(table_path).scan()) == expected


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_a_non_partitioned_table_has_its_root_partition_marker(table_path: str, table_type: str) -> None:
    """Apache Hudi finds a partition by its `.hoodie_partition_metadata`, the root of a
    non-partitioned table too (depth 0); a table written without one gets it from its next write."""
    t = oxlake.create_table(
        table_path, SCHEMA, record_key="id", ordering_field="ts", table_type=table_type, table_version=6
    )
    marker = Path(table_path, ".hoodie_partition_metadata")
    assert not marker.exists()
    first = t.insert(trips([1, 2])).instant
    text = marker.read_text()
    assert f"commitTime={first}\n" in text and "partitionDepth=0\n" in text
    assert text.startswith("#partition metadata\n")
    marker.unlink()
    t.upsert(trips([2, 3], ts=2))
    assert "partitionDepth=0\n" in marker.read_text()
    assert not list(Path(table_path).glob("*/.hoodie_partition_metadata"))
    expected = rows(trips([1])) + rows(trips([2, 3], ts=2))
    assert rows(t.scan()) == expected
    assert rows(hudi_read(table_path)) == expected


def test_compaction_and_clustering_plans_decode_as_java_reads_them(
    table_path: str, hudi: dict[str, Any]
) -> None:
    t = trips_table(table_path, table_type="merge_on_read", table_version=6)
    t.insert(trips(list(range(6))))
    t.upsert(trips([0, 3], ts=2, name="v2"))
    slices_before = data_files(t)
    compacted = t.compact()
    assert len(compacted.instants) == 1
    c = compacted.instants[0]
    plan = decode(timeline_file(t, c, "compaction.requested"), hudi["HoodieCompactionPlan"])
    # Version 2: files by name, as CompactionUtils writes them.
    assert plan["version"] == 2
    [op] = plan["operations"]
    logs = {f for f in slices_before if f.rsplit("/", 1)[-1].startswith(".")}
    assert op["partitionPath"] == "city=sf"
    assert op["deltaFilePaths"] == [f.rsplit("/", 1)[-1] for f in sorted(logs)]
    assert f"city=sf/{op['dataFilePath']}" in slices_before
    assert op["dataFilePath"].startswith(op["fileId"] + "_")
    assert op["baseInstantTime"] < c
    # Clustering of a partition with two small file groups (inserts go to a new group).
    t.insert(trips([9, 12], city="sf"))
    expected = rows(t.scan())
    clustered = t.cluster(sort_by=["ts"])
    assert clustered.instant is not None
    request = decode(
        timeline_file(t, clustered.instant, "replacecommit.requested"), hudi["HoodieRequestedReplaceMetadata"]
    )
    assert request["operationType"] == "CLUSTER"
    groups = request["clusteringPlan"]["inputGroups"]
    slices = [s for g in groups for s in g["slices"]]
    assert len(slices) == clustered.replaced_file_groups
    for s in slices:
        assert s["dataFilePath"] == "" or s["dataFilePath"].startswith(full_path(t, s["partitionPath"]) + "/")
        assert all(d.startswith(full_path(t, s["partitionPath"]) + "/") for d in s["deltaFilePaths"])
    strategy = request["clusteringPlan"]["strategy"]
    assert strategy["strategyParams"] == {"hoodie.clustering.plan.strategy.sort.columns": "ts"}
    assert rows(oxlake.Table(table_path).scan()) == expected


def test_a_restore_removes_compaction_plans_made_after_the_savepoint(table_path: str) -> None:
    """Java's restore rolls back every instant of the write timeline after the savepoint; a plan
    left pending would fail each time it ran (its slices' logs are gone)."""
    t = trips_table(table_path, table_type="merge_on_read", table_version=6)
    t.insert(trips(list(range(6))))
    t.upsert(trips([0, 3], ts=2, name="v2"))
    saved = max(i.time for i in t.timeline() if i.state == "completed")
    expected = rows(t.scan())
    t.savepoint(saved)
    t.upsert(trips([0, 1], ts=3, name="v3"))
    code = "import sys, oxlake; oxlake.Table(sys.argv[1]).compact()"
    env = dict(os.environ, OXLAKE_FAILPOINT="after-inflight")
    proc = subprocess.run([sys.executable, "-c", code, table_path], env=env, capture_output=True, text=True)
    assert proc.returncode != 0, proc.stderr
    t = oxlake.Table(table_path)
    [plan] = [i for i in t.timeline() if i.action == "compaction"]
    assert plan.state == "inflight"
    r = t.restore(saved)
    assert rows(t.scan()) == expected
    assert not [i for i in t.timeline() if i.state != "completed"], "no plan left pending"
    meta = decode(timeline_file(t, r, "restore"))
    assert plan.time in meta["instantsToRollback"]
    t.compact()
    assert rows(oxlake.Table(table_path).scan()) == expected
