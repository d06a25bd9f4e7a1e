"""What oxlake writes under `.hoodie/` reads in Apache Hudi's Java engine: each Avro plan and
metadata decodes with `fastavro` using Apache Hudi's own `.avsc` as the reader schema (schema
resolution, as Java's `TimelineMetadataUtils.deserializeAvroMetadata` does). Issue 23; the clean
action so far."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import fastavro
import oxlake
import pytest
from conftest import SCHEMA, SHARED, data_files, rows, trips

AVSC = SHARED / "compat" / "avro"


def hudi_schemas() -> dict[str, Any]:
    """A reader schema for each of Apache Hudi's records, by short name: each `.avsc` parsed with
    the named types the others define (strip the licence comments first, see the README)."""
    raws = [
        json.loads(re.sub(r"/\*.*?\*/", "", p.read_text(), flags=re.S)) for p in sorted(AVSC.glob("*.avsc"))
    ]

    def reader(target: dict[str, Any]) -> Any:
        named: dict[str, Any] = {}
        pending = [s for s in raws if s is not target]
        while pending:
            left = []
            for s in pending:
                try:
                    fastavro.parse_schema(s, named_schemas=named)
                except fastavro.schema.UnknownType:
                    left.append(s)  # needs a type defined later (or by `target`)
            if len(left) == len(pending):
                break
            pending = left
        return fastavro.parse_schema(target, named_schemas=named)

    return {s["name"]: reader(s) for s in raws if s["name"] in ("HoodieCleanerPlan", "HoodieCleanMetadata")}


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
        table_path, SCHEMA, record_key="id", partition_by=["city"], ordering_field="ts", table_type=table_type
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
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
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
    t = oxlake.create_table(table_path, SCHEMA, record_key="id", ordering_field="ts")
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
