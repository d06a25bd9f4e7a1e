"""Tables of version 8 and 9 (Apache Hudi 1.x), written by oxlake: timeline layout 2 as Java reads
it (every Avro file decodes with Apache Hudi's `.avsc` reader schemas), hudi-rs reads the same
rows at every instant and in every incremental window, completion times become visible in their
order, and the version 8/9 tables Apache Hudi wrote (../shared/compat) take writes and services.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import fastavro
import oxlake
import pyarrow.parquet as pq
import pytest
from conftest import (
    COMPAT,
    CORPUS_ABSENT,
    SCHEMA,
    data_paths,
    hudi_avro_schema,
    hudi_read,
    rows,
    run_paused,
    trips,
    trips_table,
)
from test_java_timeline import JAVA_RECORDS

#: Records Apache Hudi 1.x reads from the timeline files oxlake writes, by name: those of version 6
#: plus the commit metadata, Avro on layout 2.
RECORDS = ("HoodieCommitMetadata", "HoodieReplaceCommitMetadata", *JAVA_RECORDS)


def with_every_service(path: str, table_type: str, version: int) -> oxlake.Table:
    """A table of `version` that went through every write and service oxlake runs on it."""
    t = trips_table(path, table_type=table_type, table_version=version)
    t.insert(trips(list(range(8))))
    t.upsert(trips([1, 2], ts=2, name="u"))
    t.delete(trips([3]))
    if table_type == "merge_on_read":
        t.compact()
    t.upsert(trips([4], ts=3, name="v"))
    saved = t.timeline()[-1].time
    t.savepoint(saved)
    t.upsert(trips([5], ts=5, name="w"))
    t.rollback(t.timeline()[-1].time)
    t.upsert(trips([6], ts=6, name="x"))
    t.restore(saved)
    t.insert_overwrite(trips([9, 10], ts=4, city="nyc", name="o"))
    t.insert(trips([12, 15], city="sf"))  # merge-on-read: a second file group in sf
    clustered = t.cluster(sort_by=["ts"])
    assert (clustered.instant is not None) == (table_type == "merge_on_read")
    t.upsert(trips([7], ts=7, name="y"))
    t.clean(policy="keep_latest_commits", retain=1)
    return t


@pytest.mark.parametrize("version", [8, 9])
@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_every_timeline_file_is_layout_2_and_decodes_as_java_reads_it(
    table_path: str, table_type: str, version: int
) -> None:
    t = with_every_service(table_path, table_type, version)
    hoodie = Path(table_path, ".hoodie")
    props = t.properties
    assert props["hoodie.table.version"] == str(version)
    assert props["hoodie.timeline.layout.version"] == "2"
    assert props["hoodie.table.initial.version"] == str(version)
    assert props["hoodie.record.merge.mode"] == "EVENT_TIME_ORDERING"
    assert ("hoodie.table.ordering.fields" if version == 9 else "hoodie.table.precombine.field") in props
    assert not [p.name for p in hoodie.iterdir() if p.name[:1].isdigit()], "no instant outside timeline/"
    schemas = {name: hudi_avro_schema(name) for name in RECORDS}
    seen: set[str] = set()
    for f in sorted((hoodie / "timeline").iterdir()):
        if f.is_dir() or f.stat().st_size == 0:
            continue
        with f.open("rb") as fh:
            name = fastavro.reader(fh).writer_schema["name"].rsplit(".", 1)[-1]
        with f.open("rb") as fh:
            records = list(fastavro.reader(fh, reader_schema=schemas[name]))
        assert len(records) == 1, f
        seen.add(name)
        stem = f.name.split(".")[0]
        if "." in f.name and f.name.split(".")[-1] not in ("requested", "inflight"):
            requested, completion = stem.split("_")
            assert completion > requested, f.name
    expected = {
        "HoodieCommitMetadata",
        "HoodieReplaceCommitMetadata",
        "HoodieCleanerPlan",
        "HoodieCleanMetadata",
    }
    expected |= {"HoodieRollbackPlan", "HoodieRollbackMetadata", "HoodieRestorePlan", "HoodieRestoreMetadata"}
    expected.add("HoodieSavepointMetadata")
    if table_type == "merge_on_read":
        expected |= {"HoodieCompactionPlan", "HoodieRequestedReplaceMetadata"}
        # Clustering is pending as `clustering` and completes as a replacecommit.
        names = [p.name for p in (hoodie / "timeline").iterdir()]
        assert any(n.endswith(".clustering.requested") for n in names)
    assert expected <= seen
    # Completed instants in completion order are the commits in the order they landed.
    completed = [i for i in t.timeline() if i.state == "completed"]
    assert all(i.completion is not None and i.completion > i.time for i in completed)
    assert len({i.completion for i in completed}) == len(completed)


@pytest.mark.parametrize("table_version", [6, 8])
def test_a_writes_completion_is_the_checkpoint_of_incremental_reads(
    table_path: str, table_version: int
) -> None:
    """`WriteResult.completion`: the completion time on version 8 (the instant on 6), what
    incremental windows compare against; reading from a write's completion gives exactly the
    later writes, in both readers."""
    t = trips_table(table_path, table_version=table_version)
    results = [t.insert(trips(list(range(4)))), t.upsert(trips([1], ts=2, name="u")), t.insert(trips([7, 8]))]
    by_time = {i.time: i for i in t.timeline()}
    for r in results:
        assert r.instant is not None and r.completion is not None
        expected = by_time[r.instant].completion if table_version == 8 else r.instant
        assert r.completion == expected
    assert table_version == 6 or all(r.completion > r.instant for r in results)
    after_first = rows(t.scan(query="incremental", start=results[0].completion))
    assert [(r["id"], r["name"]) for r in after_first] == [(1, "u1"), (7, "n7"), (8, "n8")]
    assert after_first == rows(hudi_read(table_path, start=results[0].completion))
    assert rows(t.scan(query="incremental", start=results[-1].completion)) == []


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_merge_on_read_logs_are_named_with_their_own_deltacommit(table_path: str, table_type: str) -> None:
    t = trips_table(table_path, table_type=table_type, table_version=8)
    t.insert(trips(list(range(6))))
    first = t.upsert(trips([1], ts=2, name="u")).instant
    second = t.upsert(trips([1], ts=3, name="v")).instant
    logs = sorted(p.name for p in data_paths(table_path, ".*.log.*"))
    if table_type == "copy_on_write":
        assert logs == []
        return
    assert [n.split("_")[1].split(".")[0] for n in logs] == [first, second]
    assert all(".log.1_" in n for n in logs)
    assert rows(t.scan())[1]["name"] == "v1"
    assert rows(hudi_read(table_path))[1]["name"] == "v1"


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_hudi_rs_reads_the_same_rows_at_every_instant_and_window(table_path: str, table_type: str) -> None:
    t = trips_table(table_path, table_type=table_type, table_version=8)
    t.insert(trips(list(range(8))))
    t.upsert(trips([1, 2], ts=2, name="u"))
    t.delete(trips([3]))
    if table_type == "merge_on_read":
        t.compact()
    t.upsert(trips([4, 9], ts=3, name="v"))
    t.insert(trips([12, 15], city="sf"))
    t.cluster(sort_by=["ts"])
    t.upsert(trips([5], ts=5, name="w"))
    assert rows(t.scan()) == rows(hudi_read(table_path))
    completed = [i for i in t.timeline() if i.state == "completed" and i.action != "clean"]
    previous = None
    for i in completed:
        assert rows(t.to_arrow(as_of=i.time)) == rows(hudi_read(table_path, as_of=i.completion)), i
        window = {"start": previous} if previous else {}
        ours = t.to_arrow(query="incremental", end=i.completion, **window)
        theirs = hudi_read(table_path, end=i.completion, start=previous or "0" * 17)
        assert rows(ours) == rows(theirs), i
        previous = i.completion


def test_a_completion_waits_for_an_earlier_claimed_completion(table_path: str, tmp_path: Path) -> None:
    """A writer that claimed its completion time and was paused before completing holds back
    every later completion: a reader never sees a later completion time before an earlier one."""
    t = trips_table(table_path, table_type="merge_on_read", table_version=8)
    t.insert(trips(list(range(4))))
    code = (
        "import sys, oxlake; from conftest import trips;"
        "oxlake.Table(sys.argv[1]).upsert(trips([1], ts=5, name='held'))"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parent)}
    held = run_paused(table_path, "after-completion-claim", code, tmp_path, env=env)
    out: list[Any] = []
    worker = __import__("threading").Thread(
        target=lambda: out.append(oxlake.Table(table_path).upsert(trips([2], ts=5, name="later")))
    )
    worker.start()
    time.sleep(1.0)
    assert worker.is_alive(), "the later completion waits for the earlier claim"
    assert not any(r["name"] == "later2" for r in rows(t.scan()))
    (tmp_path / "resume").touch()
    assert held.wait(timeout=60) == 0, held.communicate()
    worker.join(timeout=60)
    assert out and out[0].instant is not None
    completed = [i for i in t.timeline() if i.state == "completed"]
    by_completion = sorted(completed, key=lambda i: i.completion)
    assert [i.time for i in by_completion][-2:] == sorted(i.time for i in completed)[-2:]
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got[1] == "held1" and got[2] == "later2"


def test_a_writer_killed_after_claiming_its_completion_does_not_block_others(table_path: str) -> None:
    t = trips_table(table_path, table_type="merge_on_read", table_version=8, heartbeat_interval=0.2)
    t.insert(trips(list(range(4))))
    code = (
        "import sys, oxlake; from conftest import trips;"
        "oxlake.Table(sys.argv[1], heartbeat_interval=0.2).upsert(trips([1], ts=5, name='dead'))"
    )
    env = {
        **__import__("os").environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "OXLAKE_FAILPOINT": "after-completion-claim",
    }
    proc = subprocess.run([sys.executable, "-c", code, table_path], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    time.sleep(1.0)
    res = oxlake.Table(table_path, heartbeat_interval=0.2).upsert(trips([2], ts=5, name="next"))
    assert res.instant is not None
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got[1] == "n1" and got[2] == "next2"
    assert rows(t.scan()) == rows(hudi_read(table_path))
    assert [i.state for i in t.timeline() if i.action in ("commit", "deltacommit")] == ["completed"] * 2


CORPUS = (
    sorted(z for z in COMPAT.rglob("v[89]_*.zip") if "lance" not in z.name and "empty" not in z.name)
    if COMPAT.exists()
    else []
)


@pytest.mark.skipif(not CORPUS, reason=CORPUS_ABSENT)
@pytest.mark.parametrize("zip_path", CORPUS, ids=lambda z: z.stem)
def test_apache_hudi_1x_tables_take_writes_and_services(zip_path: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(zip_path) as f:
        f.extractall(tmp_path, members=[m for m in f.namelist() if not m.startswith("__MACOSX")])
    path = str(tmp_path / zip_path.stem)
    t = oxlake.Table(path)
    before = t.to_arrow()
    key = t.properties["hoodie.table.recordkey.fields"].split(",")
    assert len(key) >= 1 and before.num_rows > 0
    # Upsert a row again (same values, ordering included), delete another. Keys Apache Hudi wrote
    # twice (an insert of an existing key: v9_nonpartitioned_rollback) are left alone.
    data = before.select([c for c in before.column_names if not c.startswith("_hoodie_")])
    counts: dict[str, int] = {}
    for k in data.select(key).to_pylist():
        counts[str(k)] = counts.get(str(k), 0) + 1
    unique = [i for i, k in enumerate(data.select(key).to_pylist()) if counts[str(k)] == 1]
    first, second = data.slice(unique[0], 1), data.slice(unique[1], 1)
    assert t.upsert(first).instant is not None
    assert t.delete(second).instant is not None
    if t.properties["hoodie.table.type"] == "MERGE_ON_READ":
        t.compact()
    t.clean(policy="keep_latest_commits", retain=1)
    after = t.to_arrow()
    assert after.num_rows == before.num_rows - 1
    ours = sorted(map(str, after.select(key).to_pylist()))
    assert ours == sorted(map(str, hudi_read(path).select(key).to_pylist()))
    assert str(second.select(key).to_pylist()[0]) not in ours
    assert t.timeline()[-1].completion is not None
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_archival_writes_the_lsm_timeline_and_reads_it_back(table_path: str, table_type: str) -> None:
    """Archival of a version 8 table writes `.hoodie/timeline/history` as Apache Hudi 1.x does
    (a level-0 Parquet file of `HoodieLSMTimelineInstant`, `manifest_1`, `_version_`), and every
    read as of or between archived instants gives the rows it gave before."""
    t = trips_table(table_path, metadata=False, table_type=table_type, table_version=8)
    t.set_archival(2, 4, inline=False)
    t.insert(trips(list(range(6))))
    for n in range(6):
        t.upsert(trips([n % 4, 10 + n], ts=2 + n, name=f"u{n}-"))
    if table_type == "merge_on_read":
        t.compact()
        t.upsert(trips([5], ts=20, name="late"))
    completed = [i for i in t.timeline() if i.state == "completed"]
    snapshots = {i.time: rows(t.to_arrow(as_of=i.time)) for i in completed}
    windows = {}
    previous = None
    for i in completed:
        window = {"start": previous} if previous else {}
        windows[i.time] = rows(t.to_arrow(query="incremental", end=i.completion, **window))
        previous = i.completion
    archived = t.archive()
    assert archived, "the oldest instants are archived"
    history = Path(table_path, ".hoodie/timeline/history")
    assert (history / "_version_").read_bytes() == b"1"
    manifest = json.loads((history / "manifest_1").read_text())
    [entry] = manifest["files"]
    data = history / entry["fileName"]
    assert entry["fileLen"] == data.stat().st_size
    times = sorted(i.time for i in archived)
    assert entry["fileName"] == f"{times[0]}_{times[-1]}_0.parquet"
    table = pq.read_table(data)
    assert table.column_names == ["instantTime", "completionTime", "action", "metadata", "plan", "version"]
    by_time = {i.time: i for i in completed}
    commit_schema = hudi_avro_schema("HoodieCommitMetadata")
    for row in table.to_pylist():
        assert row["completionTime"] == by_time[row["instantTime"]].completion
        assert row["version"] == 1
        if row["action"] in ("commit", "deltacommit"):
            [meta] = list(fastavro.reader(io.BytesIO(row["metadata"]), reader_schema=commit_schema))
            assert meta["partitionToWriteStats"]
    active = {p.name.split(".")[0].split("_")[0] for p in (Path(table_path) / ".hoodie/timeline").iterdir()}
    assert not active & set(times), "archived instants left the active timeline"
    full = [(i.time, i.completion) for i in t.timeline(include_archived=True) if i.state == "completed"]
    assert full == [(i.time, i.completion) for i in completed]
    for i in completed:
        assert rows(t.to_arrow(as_of=i.time)) == snapshots[i.time], i
    previous = None
    for i in completed:
        window = {"start": previous} if previous else {}
        assert rows(t.to_arrow(query="incremental", end=i.completion, **window)) == windows[i.time], i
        previous = i.completion
    assert rows(t.scan()) == rows(hudi_read(table_path))


def test_a_dead_archival_is_finished_by_the_next(table_path: str) -> None:
    """Killed after its manifest was written but before `_version_` named it: readers find that
    manifest by listing (as Apache Hudi's `LSMTimeline` does) and drop the instants still active
    from it; the next archival finishes the run (deletes the archived instants, names the
    manifest)."""
    t = trips_table(table_path, metadata=False, table_version=8)
    t.set_archival(2, 4, inline=False)
    for n in range(7):
        t.upsert(trips([n], ts=n, name="v"))
    expected = rows(t.scan())
    code = "import sys, oxlake; oxlake.Table(sys.argv[1]).archive()"
    env = {**os.environ, "OXLAKE_FAILPOINT": "archive-after-manifest"}
    proc = subprocess.run([sys.executable, "-c", code, table_path], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    history = Path(table_path, ".hoodie/timeline/history")
    assert (history / "manifest_1").exists() and not (history / "_version_").exists()
    assert rows(oxlake.Table(table_path).scan()) == expected
    t = oxlake.Table(table_path)
    assert t.archive(), "the next run archives the same instants"
    assert (history / "_version_").read_bytes() == b"1"
    assert not (history / "manifest_2").exists()
    assert rows(oxlake.Table(table_path).scan()) == expected == rows(hudi_read(table_path))


def test_archivals_compact_the_lsm_timeline_and_clean_it(table_path: str) -> None:
    """Every archival adds a level-0 file and a manifest; once a level holds 10 files they are
    merged into one file of the next level (`<min>_<max>_<level+1>.parquet`, Apache Hudi's
    `LSMTimelineWriter.compactAndClean`), manifests older than the newest 3 (plus one per merge)
    are deleted, and data files no kept manifest lists are deleted once older than ten minutes.
    Every read of the archived timeline stays as it was, in oxlake and in hudi-rs."""
    t = trips_table(table_path, metadata=False, table_version=8)
    t.set_archival(2, 3, inline=False)
    t.insert(trips(list(range(4))))
    history = Path(table_path, ".hoodie/timeline/history")
    archivals = 0
    for n in range(40):
        t.upsert(trips([n % 4], ts=2 + n, name=f"u{n}-"))
        if t.archive():
            archivals += 1
    assert archivals >= 12
    version = int((history / "_version_").read_text())
    manifest = json.loads((history / f"manifest_{version}").read_text())
    levels = sorted(int(f["fileName"].rsplit("_", 1)[1].split(".")[0]) for f in manifest["files"])
    assert levels.count(1) >= 1 and levels.count(0) < 10, levels
    for f in manifest["files"]:
        assert (history / f["fileName"]).stat().st_size == f["fileLen"]
    # Manifests older than the newest 3 (plus merges) go with the files only they list, once those
    # are older than the grace period: until then they stay, always a run of consecutive numbers.
    manifests = sorted(int(p.name.split("_")[1]) for p in history.glob("manifest_*"))
    assert manifests == list(range(manifests[0], version + 1)), manifests
    # Every instant is read back once, archived or active, in order.
    full = [(i.time, i.completion) for i in t.timeline(include_archived=True) if i.state == "completed"]
    assert full == sorted(set(full)) and len([i for i in full if i[0]]) >= 41
    # A slow run naming an older manifest after a newer one was named hides nothing: readers
    # follow the manifests written after the one named.
    (history / "_version_").write_text(str(version - 1))
    again = oxlake.Table(table_path).timeline(include_archived=True)
    assert [(i.time, i.completion) for i in again if i.state == "completed"] == full
    merged = pq.read_table(
        history / next(f["fileName"] for f in manifest["files"] if "_1.parquet" in f["fileName"])
    )
    assert merged.num_rows >= 10
    # Files no kept manifest lists go once older than the grace period.
    listed = {f["fileName"] for f in manifest["files"]}
    stale = [p for p in history.glob("*.parquet") if p.name not in listed]
    assert stale, "the merged files stay for the grace period"
    old = time.time() - 3600
    for p in stale:
        os.utime(p, (old, old))
    for n in range(10):
        t.upsert(trips([n % 4], ts=100 + n, name=f"w{n}-"))
        t.archive()
    assert int((history / "_version_").read_text()) > version, "named forward again, never back"
    left = {p.name for p in history.glob("*.parquet")}
    assert not left & {p.name for p in stale}
    before, manifests = manifests, sorted(int(p.name.split("_")[1]) for p in history.glob("manifest_*"))
    assert manifests[0] > before[0] and manifests == list(range(manifests[0], manifests[-1] + 1)), manifests
    # A file no manifest lists is never cleaned (a paused run may be about to list it).
    orphan = history / "20000101000000000_20000101000000001_0.parquet"
    orphan.write_bytes(b"not yet listed")
    os.utime(orphan, (old, old))
    t.upsert(trips([0], ts=500))
    t.archive()
    assert orphan.exists()
    assert rows(t.scan()) == rows(hudi_read(table_path))
    assert len(t.timeline(include_archived=True)) > len(full)


def test_an_unknown_table_version_is_refused(table_path: str) -> None:
    with pytest.raises(oxlake.InvalidArgumentError, match="table_version"):
        oxlake.create_table(table_path, SCHEMA, record_key="id", table_version=7)
    assert not Path(table_path, ".hoodie").exists()


def states(t: oxlake.Table) -> dict[str, Any]:
    """The rows as of every completed data instant, by requested time (`"cleaned"` where a clean
    removed what that read needs)."""
    done = [i for i in t.timeline(include_archived=True) if i.state == "completed"]
    out: dict[str, Any] = {}
    for i in done:
        if i.action not in ("commit", "deltacommit", "replacecommit"):
            continue
        try:
            out[i.time] = rows(t.to_arrow(as_of=i.time), key=tuple(key_of(t)))
        except oxlake.InvalidArgumentError as e:
            assert "no longer readable" in str(e)
            out[i.time] = "cleaned"
    return out


def key_of(t: oxlake.Table) -> list[str]:
    return t.properties["hoodie.table.recordkey.fields"].split(",")


def v6_table_with_history(path: str, table_type: str) -> oxlake.Table:
    """A version 6 table with every kind of instant and an archived timeline."""
    t = trips_table(path, metadata=False, table_type=table_type, table_version=6)
    t.set_archival(2, 4, inline=False)
    t.insert(trips(list(range(6))))
    for n in range(5):
        t.upsert(trips([n, 10 + n], ts=2 + n, name=f"u{n}-"))
        if table_type == "merge_on_read" and n in (2, 4):
            t.compact()  # deltacommits a compaction has not folded in are never archived
    t.archive()
    t.delete(trips([1]))
    t.insert(trips([20, 21], city="sf"))
    t.cluster(sort_by=["ts"])
    t.upsert(trips([2], ts=30, name="w"))
    t.rollback(t.timeline()[-1].time)
    t.clean(policy="keep_latest_commits", retain=3)
    t.upsert(trips([3], ts=31, name="x"))
    return t


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_upgrade_keeps_every_instant_and_row(table_path: str, table_type: str) -> None:
    t = v6_table_with_history(table_path, table_type)
    assert Path(table_path, ".hoodie/archived").exists()
    before = states(t)
    snapshot = rows(t.scan())
    assert oxlake.Table(table_path).upgrade(8) == (6, 8)
    t = oxlake.Table(table_path)
    props = t.properties
    assert (props["hoodie.table.version"], props["hoodie.timeline.layout.version"]) == ("8", "2")
    assert props["hoodie.table.initial.version"] == "6"
    assert props["hoodie.record.merge.mode"] == "EVENT_TIME_ORDERING"
    hoodie = Path(table_path, ".hoodie")
    assert not [p.name for p in hoodie.iterdir() if p.name[:1].isdigit()], "old instant files removed"
    assert (hoodie / "timeline/history/_version_").exists(), "the archived timeline is in the LSM timeline"
    assert states(t) == before
    assert rows(t.scan()) == snapshot == rows(hudi_read(table_path))
    completed = [i for i in t.timeline() if i.state == "completed"]
    assert all(i.completion and i.completion > i.time for i in completed)
    assert [i.time for i in sorted(completed, key=lambda i: i.completion)] == [i.time for i in completed]
    # Every commit-metadata file is Avro now; the table takes writes and services.
    schemas = {n: hudi_avro_schema(n) for n in RECORDS}
    for f in (hoodie / "timeline").iterdir():
        if f.is_file() and f.stat().st_size:
            with f.open("rb") as fh:
                name = fastavro.reader(fh).writer_schema["name"].rsplit(".", 1)[-1]
            with f.open("rb") as fh:
                assert len(list(fastavro.reader(fh, reader_schema=schemas[name]))) == 1
    t.upsert(trips([4, 5], ts=40, name="after"))
    if table_type == "merge_on_read":
        t.compact()
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got[4] == "after4" and got[5] == "after5"
    assert rows(t.scan()) == rows(hudi_read(table_path))
    assert oxlake.Table(table_path).upgrade(8) == (8, 8), "upgrading again changes nothing"


@pytest.mark.parametrize("point", ["upgrade-before-switch", "upgrade-after-switch"])
def test_an_upgrade_killed_midway_reads_as_before_and_is_finished(table_path: str, point: str) -> None:
    t = v6_table_with_history(table_path, "merge_on_read")
    before = states(t)
    code = "import sys, oxlake; oxlake.Table(sys.argv[1]).upgrade(8)"
    env = {**os.environ, "OXLAKE_FAILPOINT": point}
    proc = subprocess.run([sys.executable, "-c", code, table_path], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    t = oxlake.Table(table_path)
    assert t.properties["hoodie.table.version"] == ("6" if point == "upgrade-before-switch" else "8")
    assert states(t) == before
    assert rows(t.scan()) == rows(hudi_read(table_path))
    oxlake.Table(table_path).upgrade(8)
    t = oxlake.Table(table_path)
    assert t.properties["hoodie.table.version"] == "8"
    assert not [p.name for p in Path(table_path, ".hoodie").iterdir() if p.name[:1].isdigit()]
    assert states(t) == before
    assert rows(t.scan()) == rows(hudi_read(table_path))


def test_a_write_that_began_on_version_6_fails_after_the_upgrade(table_path: str, tmp_path: Path) -> None:
    t = trips_table(table_path, table_type="merge_on_read", table_version=6)
    t.insert(trips(list(range(4))))
    code = (
        "import sys, oxlake; from conftest import trips;"
        "oxlake.Table(sys.argv[1]).upsert(trips([1], ts=5, name='old'))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    held = run_paused(table_path, "after-inflight", code, tmp_path, env=env)
    with pytest.raises(oxlake.CommitConflictError, match="in progress"):
        oxlake.Table(table_path).upgrade(8)
    (tmp_path / "resume").touch()
    assert held.wait(timeout=60) == 0, held.communicate()
    # Paused between claiming its time and creating its requested file: the upgrade sees no
    # write and switches; the write then completes nowhere: it fails, nothing of it is read.
    (tmp_path / "resume").unlink()
    (tmp_path / "reached").unlink()
    code = code.replace("'old'", "'late'")
    held = run_paused(table_path, "after-claim", code, tmp_path, env=env)
    assert oxlake.Table(table_path).upgrade(8) == (6, 8)
    (tmp_path / "resume").touch()
    assert held.wait(timeout=60) != 0
    # It fails at its commit (the version changed) or earlier, reading the moved timeline.
    err = held.communicate()[1]
    assert "CommitConflictError" in err or ("StorageError" in err and "not found" in err), err
    t = oxlake.Table(table_path)
    got = {r["id"]: r["name"] for r in rows(t.scan())}
    assert got[1] == "old1"
    assert rows(t.scan()) == rows(hudi_read(table_path))
    t.upsert(trips([1], ts=9, name="new"))
    assert {r["id"]: r["name"] for r in rows(t.scan())}[1] == "new1"


V6_CORPUS = (
    sorted(z for z in COMPAT.rglob("v6_*.zip") if "empty" not in z.name and "no_metafields" not in z.name)
    if COMPAT.exists()
    else []
)


@pytest.mark.skipif(not V6_CORPUS, reason=CORPUS_ABSENT)
@pytest.mark.parametrize("zip_path", V6_CORPUS, ids=lambda z: f"{z.parent.name}-{z.stem}")
def test_apache_hudi_v6_tables_upgrade(zip_path: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(zip_path) as f:
        f.extractall(tmp_path, members=[m for m in f.namelist() if not m.startswith("__MACOSX")])
    path = str(tmp_path / zip_path.stem)
    t = oxlake.Table(path)
    before = states(t)
    snapshot = rows(t.scan(), key=tuple(t.properties["hoodie.table.recordkey.fields"].split(",")))
    assert t.upgrade(8) == (6, 8)
    t = oxlake.Table(path)
    assert states(t) == before
    key = tuple(t.properties["hoodie.table.recordkey.fields"].split(","))
    assert rows(t.scan(), key=key) == snapshot == rows(hudi_read(path), key=key)


def test_a_log_of_an_archived_deltacommit_joins_the_slice_of_its_completion(
    table_path: str, tmp_path: Path
) -> None:
    """A deltacommit requested before a compaction and completed after it belongs to the
    compacted slice. Once archived, its completion time comes from the archived timeline: placed by
    its requested time it would fall into the superseded slice and its rows would vanish."""
    t = trips_table(table_path, metadata=False, table_type="merge_on_read", table_version=8)
    t.set_archival(1, 2, inline=False)
    t.insert(trips(list(range(4))))
    t.upsert(trips([1], ts=2, name="u"))  # a log for the compaction to fold in
    code = (
        "import sys, oxlake; from conftest import trips;"
        "oxlake.Table(sys.argv[1]).upsert(trips([1], ts=5, name='held'))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    held = run_paused(table_path, "before-commit", code, tmp_path, env=env)
    compacted: list[Any] = []
    worker = threading.Thread(target=lambda: compacted.append(oxlake.Table(table_path).compact()))
    worker.start()
    time.sleep(0.5)
    (tmp_path / "resume").touch()
    assert held.wait(timeout=60) == 0, held.communicate()
    worker.join(timeout=60)
    by_time = {i.time: i for i in t.timeline() if i.state == "completed"}
    [c] = compacted[0].instants
    late = max(
        (i for i in by_time.values() if i.action == "deltacommit" and i.time < c), key=lambda i: i.time
    )
    expected = rows(t.scan())
    assert {r["id"]: r["name"] for r in expected}[1] == "held1"
    if late.completion < c:
        pytest.skip("the write completed before the compaction was requested (timing)")
    for n in range(3):
        t.upsert(trips([0], ts=10 + n, name=f"x{n}-"))
    expected = rows(t.scan())
    archived = {i.time for i in t.archive()}
    assert late.time in archived
    assert rows(oxlake.Table(table_path).scan()) == expected
    assert {r["id"]: r["name"] for r in expected}[1] == "held1"


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_upgrade_keeps_the_metadata_table_in_step(table_path: str, table_type: str) -> None:
    t = trips_table(table_path, table_type=table_type, table_version=6)
    t.build_metadata(files_shards=2)
    t.insert(trips(list(range(10))))
    t.upsert(trips([1, 2], ts=2, name="u"))
    if table_type == "merge_on_read":
        t.compact()
    t.delete(trips([3]))
    before = rows(t.scan())
    assert oxlake.Table(table_path).upgrade(8) == (6, 8)
    t = oxlake.Table(table_path)
    assert t.validate().ok
    assert rows(t.scan()) == before == rows(hudi_read(table_path))
    t.upsert(trips([4], ts=5, name="after"))
    if table_type == "merge_on_read":
        t.compact()
    t.clean(policy="keep_latest_commits", retain=1)
    assert t.validate().ok
    assert rows(t.scan()) == rows(hudi_read(table_path))
    assert {r["id"]: r["name"] for r in rows(t.scan())}[4] == "after4"


@pytest.mark.parametrize("metadata", [False, True], ids=["listing", "metadata-table"])
def test_a_compaction_rolled_back_runs_again_at_its_time(table_path: str, metadata: bool) -> None:
    """Found by the model test: the rolled-back compaction's completion claim stayed, so the next
    writer waited for it (30 s, until its heartbeat expired) and then took back the plan's next
    run at that time, which failed for ever with "rolled back by another process"."""
    t = trips_table(table_path, table_type="merge_on_read", table_version=8)
    if metadata:
        t.build_metadata(files_shards=2)
    t.insert(trips([0, 1, 2, 6]))
    t.delete(trips([1]))
    compaction = t.compact().instants
    t.rollback(compaction[-1])
    t.clean(policy="keep_latest_commits", retain=3)
    t.delete(trips([2]))
    assert t.compact().instants[0] == compaction[-1], "the plan ran again at its time"
    assert sorted(r["id"] for r in rows(t.scan())) == [0, 6]
    assert sorted(r["id"] for r in rows(hudi_read(table_path))) == [0, 6]
    assert [i.state for i in t.timeline()] == ["completed"] * len(t.timeline())
    assert not metadata or t.validate().ok


@pytest.mark.parametrize("version", [6, 8])
def test_a_clustering_rolled_back_leaves_no_plan_behind(table_path: str, version: int) -> None:
    """Found by the model test: on timeline layout 2 a clustering is pending as `clustering` and
    completes as a replacecommit; its rollback removed `replacecommit` files only, so the plan
    stayed inflight for ever and no clustering of those file groups ran again."""
    t = trips_table(table_path, table_type="merge_on_read", table_version=version)
    t.insert(trips([0, 1, 2]))
    t.upsert(trips([3, 4]))
    clustering = t.cluster(small_file_limit=1 << 40).instant
    assert clustering is not None
    t.rollback(clustering)
    assert [i.state for i in t.timeline()] == ["completed"] * len(t.timeline())
    t.upsert(trips([5]))
    again = t.cluster(small_file_limit=1 << 40).instant
    assert again is not None and again > clustering
    assert sorted(r["id"] for r in rows(t.scan())) == [0, 1, 2, 3, 4, 5]
    assert sorted(r["id"] for r in rows(hudi_read(table_path))) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("version", [6, 8])
def test_a_restore_past_a_compaction_removes_its_plan(table_path: str, version: int) -> None:
    """A compaction rolled back alone keeps its plan to run again; under a restore it goes with
    the writes it compacted (as Java's restore removes it), and its file slices are free for the
    next compaction, which leaves no plan pending behind it."""
    t = trips_table(table_path, table_type="merge_on_read", table_version=version)
    t.insert(trips([0, 1]))
    t.upsert(trips([0], ts=2, name="kept"))
    savepoint = t.timeline()[-1].time
    t.savepoint(savepoint)
    t.upsert(trips([1], ts=3, name="gone"))
    compaction = t.compact().instants
    t.restore(savepoint)
    assert all(i.time != compaction[-1] for i in t.timeline())
    assert t.compact().instants
    assert [i.state for i in t.timeline()] == ["completed"] * len(t.timeline())
    assert {r["id"]: r["name"] for r in rows(t.scan())} == {0: "kept0", 1: "n1"}
